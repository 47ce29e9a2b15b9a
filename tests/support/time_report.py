"""Where a test run's time goes: a pytest plugin (``tests/conftest.py`` loads it).

At the end of the run it prints the seconds spent per tier (set-up, call and tear-down of every
test, added up; module- and session-scoped fixtures count in the first test that used them) and
the files that took longest, next to the run's wall time. Under pytest-xdist the controller adds
up its workers' reports, so the tiers' sum exceeds the wall time by the parallelism.
"""

from __future__ import annotations

import time
from collections import defaultdict

_TIERS = ("unit", "integration", "e2e")
_seconds_by_tier: dict[str, float] = defaultdict(float)
_tests_by_tier: dict[str, set] = defaultdict(set)
_seconds_by_file: dict[str, float] = defaultdict(float)
_started = time.monotonic()

#: How many of the longest files the summary lists.
SLOWEST_FILES = 20


def pytest_runtest_logreport(report) -> None:
    tier = next((t for t in _TIERS if t in getattr(report, "keywords", {})), "untiered")
    _seconds_by_tier[tier] += report.duration
    _tests_by_tier[tier].add(report.nodeid)
    _seconds_by_file[report.nodeid.split("::", 1)[0]] += report.duration


def pytest_terminal_summary(terminalreporter) -> None:
    if not _seconds_by_file or hasattr(terminalreporter.config, "workerinput"):
        return
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", f"time per tier (wall time of the run {time.monotonic() - _started:.0f} s)")
    for tier in (*_TIERS, "untiered"):
        if tier in _tests_by_tier:
            write(f"  {tier:<12} {len(_tests_by_tier[tier]):4d} tests {_seconds_by_tier[tier]:8.1f} s")
    write(f"  longest {SLOWEST_FILES} files:")
    for path, seconds in sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:SLOWEST_FILES]:
        write(f"  {seconds:8.1f} s  {path}")
