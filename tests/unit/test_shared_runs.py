"""support/shared_runs.py: a run several test files need is built once per session, whichever
pytest-xdist worker asks first; the others wait for it and read its result."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path

import pytest
from support.shared_runs import once_per_session, session_root


class _Factory:
    """The one method of pytest's ``tmp_path_factory`` the helper uses."""

    def __init__(self, base: Path) -> None:
        self.base = base

    def getbasetemp(self) -> Path:
        return self.base


def _build_and_log(base: str, log: str, result: str) -> None:
    def build() -> dict:
        with open(log, "a") as fh:
            fh.write("built\n")
        time.sleep(1.0)  # the other worker asks meanwhile
        return {"value": 42}

    value = once_per_session(_Factory(Path(base)), "scenario", build)
    Path(result).write_text(str(value))


def test_two_workers_asking_for_the_same_run_build_it_once(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    log = tmp_path / "builds.log"
    ctx = multiprocessing.get_context("fork")
    workers = [
        ctx.Process(target=_build_and_log, args=(str(tmp_path), str(log), str(tmp_path / f"result{i}")))
        for i in range(2)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert log.read_text() == "built\n"
    assert [(tmp_path / f"result{i}").read_text() for i in range(2)] == ["{'value': 42}"] * 2


def test_a_failed_build_leaves_nothing_and_the_next_caller_builds_again(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    factory = _Factory(tmp_path)

    def failing() -> int:
        raise RuntimeError("the run broke")

    with pytest.raises(RuntimeError, match="the run broke"):
        once_per_session(factory, "scenario", failing)
    assert once_per_session(factory, "scenario", lambda: 7) == 7
    assert once_per_session(factory, "scenario", failing) == 7  # read back, not built


def test_under_xdist_the_workers_share_the_sessions_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert session_root(_Factory(tmp_path / "popen-gw1")) == tmp_path
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert session_root(_Factory(tmp_path / "pytest-3")) == tmp_path / "pytest-3"
