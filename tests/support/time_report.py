"""Where a test run's time goes, and what it proved: a pytest plugin (``tests/conftest.py`` loads it).

At the end of the run it prints the seconds spent per tier (set-up, call and tear-down of every
test, added up; module- and session-scoped fixtures count in the first test that used them) and
the files that took longest, next to the run's wall time; then the outcomes per area of the suite
that a release must prove (the Arctic adapter over each transport, Snowflake's plugin, Tinker, the
faults), under the installed verl's version. Under pytest-xdist the controller adds up its
workers' reports, so the tiers' sum exceeds the wall time by the parallelism.
"""

from __future__ import annotations

import time
from collections import defaultdict

#: The suite's tiers, lightest first (``tests/conftest.py`` gives every test one of them).
TIERS = ("unit", "integration", "e2e")
_seconds_by_tier: dict[str, float] = defaultdict(float)
_tests_by_tier: dict[str, set] = defaultdict(set)
_seconds_by_file: dict[str, float] = defaultdict(float)
_started = time.monotonic()
#: area -> outcome -> test ids. An area is a pattern of test paths (a test may be in several areas).
_outcomes: dict[str, dict[str, set]] = defaultdict(lambda: defaultdict(set))


#: The areas the summary counts: name -> a predicate on the test id.
def _arctic_over_ray(nodeid: str) -> bool:
    """An Arctic test over ``protocol=ray``: its file is about the Ray transport, or its parameter says so."""
    return "arctic" in nodeid and ("arctic_ray" in nodeid.split("::")[0] or nodeid.endswith("[ray]"))


AREAS = {
    "arctic (http)": lambda nodeid: "arctic" in nodeid and not _arctic_over_ray(nodeid) and "plugin" not in nodeid,
    "arctic (protocol=ray)": _arctic_over_ray,
    "snowflake's plugin": lambda nodeid: "arctic_plugin" in nodeid,
    "tinker": lambda nodeid: "tinker" in nodeid,
    "faults": lambda nodeid: nodeid.startswith("tests/faults/"),
}

#: How many of the longest files the summary lists.
SLOWEST_FILES = 20


def pytest_runtest_logreport(report) -> None:
    tier = next((t for t in TIERS if t in getattr(report, "keywords", {})), "untiered")
    _seconds_by_tier[tier] += report.duration
    _tests_by_tier[tier].add(report.nodeid)
    _seconds_by_file[report.nodeid.split("::", 1)[0]] += report.duration
    if report.when == "call" or report.outcome != "passed":  # a test's verdict, once
        for area, matches in AREAS.items():
            if matches(report.nodeid):
                _outcomes[area][report.outcome].add(report.nodeid)


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds_by_file or hasattr(terminalreporter.config, "workerinput"):
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", f"time per tier (wall time of the run {time.monotonic() - _started:.0f} s)")
    for tier in (*TIERS, "untiered"):
        if tier in _tests_by_tier:
            write(f"  {tier:<12} {len(_tests_by_tier[tier]):4d} tests {_seconds_by_tier[tier]:8.1f} s")
    write(f"  longest {SLOWEST_FILES} files:")
    for path, seconds in sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]:
        write(f"  {seconds:8.1f} s  {path}")
    from verl.remote_backend.verl_versions import installed_verl_version

    terminalreporter.write_sep("=", f"areas on verl {installed_verl_version()}")
    for area in AREAS:
        counts = {outcome: len(ids) for outcome, ids in _outcomes[area].items()}
        failed = set().union(*(_outcomes[area][o] for o in ("failed", "error") if o in _outcomes[area]))
        passed = len(_outcomes[area]["passed"] - failed)
        write(f"  {area:<22} {passed} passed, {len(failed)} failed, {counts.get('skipped', 0)} skipped")
