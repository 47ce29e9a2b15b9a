"""The fault ledger of the suite and its one-line summary.

Each test injects faults through the ``fault`` fixture::

    with fault.expect(BackendDiedError, match="died during update_actor", within_s=30):
        ...  # code that must fail that way

which counts the fault as injected, then as *surfaced correctly* when the
expected error type and message arrived within the bound, or as a *hang* when
it took longer (callers bound their waits with :func:`support.aio.bounded`, so a hang ends
as :class:`Hang` instead of blocking the suite). ``fault.protect(path)``
registers a saved checkpoint; at the end of the test every protected
checkpoint is verified against its manifest (sha256 of every file) and each
one that no longer verifies counts as *lost*. At the end of the session the
suite prints::

    faults injected: N / surfaced correctly: N / hangs: N / checkpoints lost: N

(the ledger itself, and the summary, are ``support.fault_ledger`` and the root conftest's: under
pytest-xdist only the controller prints, and it loads no sub-folder's conftest).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from typing import Iterator, Optional

import pytest
from support.aio import Hang
from support.fault_ledger import LEDGER


@dataclass
class Outcome:
    error: Optional[BaseException] = None
    seconds: float = 0.0


class FaultRecorder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.protected: list[str] = []

    @contextlib.contextmanager
    def expect(self, error: type, *, match: str, within_s: float) -> Iterator[Outcome]:
        """Count one injected fault; require ``error`` matching ``match`` within ``within_s``."""
        LEDGER.injected += 1
        outcome = Outcome()
        start = time.monotonic()
        try:
            yield outcome
        except BaseException as exc:  # noqa: BLE001 - judged below
            outcome.error, outcome.seconds = exc, time.monotonic() - start
        else:
            outcome.seconds = time.monotonic() - start
        exc = outcome.error
        if isinstance(exc, Hang) or outcome.seconds > within_s:
            LEDGER.hangs += 1
            LEDGER.cases.append((self.name, "hang", outcome.seconds))
            raise AssertionError(
                f"{self.name}: no {error.__name__} within {within_s}s ({outcome.seconds:.1f}s; {exc!r})"
            )
        if exc is None:
            LEDGER.cases.append((self.name, "no error", outcome.seconds))
            raise AssertionError(f"{self.name}: expected {error.__name__} matching {match!r}, but nothing was raised")
        if not isinstance(exc, error) or not re.search(match, str(exc), re.S):
            LEDGER.cases.append((self.name, f"wrong error {type(exc).__name__}", outcome.seconds))
            raise AssertionError(
                f"{self.name}: expected {error.__name__} matching {match!r}, got {type(exc).__name__}: {exc}"
            ) from exc
        LEDGER.surfaced += 1
        LEDGER.cases.append((self.name, "ok", outcome.seconds))

    def observed(self, what: str, *, surfaced: bool, seconds: float, within_s: float, detail: str = "") -> None:
        """Count a fault judged from outside (e.g. a full run's log): surfaced, and within the bound?"""
        LEDGER.injected += 1
        if seconds > within_s:
            LEDGER.hangs += 1
            LEDGER.cases.append((f"{self.name}: {what}", "hang", seconds))
            raise AssertionError(f"{self.name}: {what} took {seconds:.1f}s > {within_s}s\n{detail}")
        if not surfaced:
            LEDGER.cases.append((f"{self.name}: {what}", "not surfaced", seconds))
            raise AssertionError(f"{self.name}: {what} did not surface as expected\n{detail}")
        LEDGER.surfaced += 1
        LEDGER.cases.append((f"{self.name}: {what}", "ok", seconds))

    def protect(self, path: str) -> str:
        """Verify ``path`` now and again when the test ends; a failed final check counts as lost.

        A local-backend checkpoint is verified against its manifest; any other format (Arctic's
        DeepSpeed folders) by the sha256 of every file in it, taken now.
        """
        self.protected.append((path, _fingerprint(path)))
        return path

    def verify_protected(self) -> list[str]:
        lost = []
        for path, before in self.protected:
            try:
                after = _fingerprint(path)
            except Exception as exc:  # CheckpointError, or a file that vanished
                lost.append(f"{path}: {exc}")
                continue
            if after != before:
                lost.append(
                    f"{path}: files changed since it was saved ({sorted(set(before.items()) ^ set(after.items()))[:3]})"
                )
        LEDGER.checkpoints_lost += len(lost)
        return lost


def _fingerprint(path: str) -> dict:
    """Manifest-verified step of a local checkpoint, or {relative file: sha256} of any other checkpoint folder."""
    import hashlib

    from verl.workers.remote_client.local.checkpoint import verify_checkpoint_dir

    if os.path.isfile(os.path.join(path, "manifest.json")):
        return {"manifest step": verify_checkpoint_dir(path)["step"]}
    digests = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as fh:
                digests[os.path.relpath(full, path)] = hashlib.sha256(fh.read()).hexdigest()
    if not digests:
        raise FileNotFoundError(f"{path} holds no files")
    return digests


@pytest.fixture
def fault(request) -> Iterator[FaultRecorder]:
    recorder = FaultRecorder(request.node.name)
    yield recorder
    lost = recorder.verify_protected()
    assert not lost, "previously saved checkpoints were damaged:\n" + "\n".join(lost)
