"""Nothing a test run starts outlives it: a pytest plugin (``tests/conftest.py`` loads it).

Every pytest process (the controller and each pytest-xdist worker) starts the package's reaper
(``verl/remote_backend/launch/reaper.py``) when it configures: a small process in its own session
that records the pytest process's descendants every second and, once pytest has exited however it
exited (normally, SIGTERM, SIGKILL, pytest-timeout's ``os._exit``), stops the ones still running.
That covers what a test starts in a session of its own (the Arctic stand-in, the skyrl server and
its engine, a test's Ray cluster), which neither a terminal's Ctrl-C nor a killed pytest reaches.

``scripts/run_tests.sh`` also tags the run (``VRB_TEST_RUN`` in the environment every descendant
inherits) so that ``scripts/leftover_processes.py`` can list whatever still carries the tag after
the run: CI fails on any.
"""

from __future__ import annotations

import subprocess
from typing import Optional

_reaper: Optional[subprocess.Popen] = None


def pytest_configure(config) -> None:
    global _reaper
    if _reaper is None:
        from verl.remote_backend.launch.reaper import start_reaper

        _reaper = start_reaper()
