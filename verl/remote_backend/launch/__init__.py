"""Start-up, on the Ray driver before anything runs: the one switch and its rule table, validation,
the data checks, the failure report, Ctrl-C and the reaper of a killed driver's processes."""
