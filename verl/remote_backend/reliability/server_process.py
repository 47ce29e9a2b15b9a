"""A server process that a backend (or a test) starts itself: its own process session and log file.

The session matters because engine servers spawn workers (skyrl's API starts its engine, Arctic
its Ray workers): stopping the leader alone would leave them running, so :meth:`ServerProcess.stop`
signals the whole group and then empties it.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
from typing import Mapping, Optional, Sequence

__all__ = ["ServerProcess"]


class ServerProcess:
    """A launched server: its ``Popen``, the address it serves and its log file.

    Build with :meth:`start`. :meth:`stop` is idempotent and also runs at interpreter exit.
    """

    def __init__(self, proc: subprocess.Popen, address: str, log_path: str) -> None:
        self.proc = proc
        self.address = address
        self.log_path = log_path
        self._stopped = False  # once stopped, never signal that process group id again (it may be reused)
        atexit.register(self.stop)

    @classmethod
    def start(
        cls,
        argv: Sequence[str],
        *,
        log_path: str,
        address: str = "",
        env: Optional[Mapping[str, str]] = None,
        cwd: Optional[str] = None,
    ) -> "ServerProcess":
        """Start ``argv`` in a new process session, stdout and stderr appended to ``log_path``.

        Returns at once; waiting until the server answers is the caller's (each protocol has
        its own readiness probe)."""
        os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [str(a) for a in argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        return cls(proc, address, log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL after ``timeout_s``; then SIGKILL what is left of the
        group (workers can outlive their leader)."""
        if self._stopped:
            return
        self._stopped = True
        for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 5.0)):
            if not self._signal_group(sig):
                return
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        self._signal_group(signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the whole session at once (a crash, as fault tests need) and reap the leader."""
        if not self._stopped:
            self._stopped = True
            self._signal_group(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def tail(self, n: int = 20) -> str:
        """The last ``n`` lines of the log ("" when unreadable)."""
        try:
            with open(self.log_path, errors="replace") as fh:
                return "".join(fh.readlines()[-n:])
        except OSError:
            return ""

    def _signal_group(self, sig: int) -> bool:
        """Signal the session; False when it no longer exists (or is not ours to signal)."""
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
