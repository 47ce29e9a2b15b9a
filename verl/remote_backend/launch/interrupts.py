"""Ctrl-C: the run stops within seconds, tears the backend down and says how to resume.

Ray blocks SIGINT in its worker processes, so a Ctrl-C reaches only the driver, while the task
runner (and the backend it owns) would keep going until Ray shuts down under it. This module
carries the interrupt to the runner, lets its teardown run and destroy the backend, and gives
the driver what it prints before exiting with 130 (step reached, last checkpoint, resume command).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Callable, Optional

from verl.remote_backend.errors import RunInterruptedError

__all__ = [
    "EXIT_CODE_INTERRUPTED",
    "InterruptibleRunner",
    "RunnerLauncher",
    "interrupt_report",
    "raise_if_interrupted",
    "resume_command",
    "sigint_raises_keyboard_interrupt",
]

#: The shell's code for "ended by SIGINT" (128 + 2).
EXIT_CODE_INTERRUPTED = 130


@contextlib.contextmanager
def sigint_raises_keyboard_interrupt() -> Iterator[None]:
    """Inside: the first SIGINT raises ``KeyboardInterrupt`` in this (main) thread; later ones are
    ignored, so a second Ctrl-C (or the driver's forwarded one) cannot cut the teardown short.
    A no-op outside the main thread, where Python cannot take signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _SIGINT_SEEN.set()
        raise KeyboardInterrupt

    _SIGINT_SEEN.clear()
    previous = signal.signal(signal.SIGINT, on_sigint)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # Ray blocks it in workers
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)
        _SIGINT_SEEN.clear()


# Set by the handler above. The KeyboardInterrupt it raises can land inside code that swallows it
# (a library's `except BaseException`); the trainer then calls `raise_if_interrupted` at its
# next forwarded call, so the run still stops within one step.
_SIGINT_SEEN = threading.Event()


def raise_if_interrupted() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT arrived inside :func:`sigint_raises_keyboard_interrupt`."""
    if _SIGINT_SEEN.is_set():
        raise KeyboardInterrupt


@dataclass
class _RunnerRecord:
    handle: Any = None
    pid: Optional[int] = None
    node_id: Optional[str] = None
    run_ref: Any = None


class RunnerLauncher:
    """Stands in for the ``task_runner_class`` that verl's ``run_ppo`` instantiates.

    ``run_ppo`` calls ``.remote()`` (or ``.options(...).remote()``) and then
    ``runner.run.remote(config)``; this records the runner's pid, node and that call's ref so
    :meth:`interrupt` can reach them. The runner class must offer ``process_identity()``
    returning ``(pid, node_id)``.
    """

    def __init__(self, actor_class: Any, options: Optional[dict] = None, record: Optional[_RunnerRecord] = None):
        self.actor_class = actor_class
        self._options = dict(options or {})
        self.record = record if record is not None else _RunnerRecord()

    def options(self, **options: Any) -> "RunnerLauncher":
        return RunnerLauncher(self.actor_class, {**self._options, **options}, self.record)

    def remote(self) -> "RunnerLauncher":
        import ray

        actor_class = self.actor_class.options(**self._options) if self._options else self.actor_class
        self.record.handle = actor_class.remote()
        self.record.pid, self.record.node_id = ray.get(self.record.handle.process_identity.remote())
        return self

    @property
    def run(self) -> "_RecordedRun":
        return _RecordedRun(self.record)

    def interrupt(self, wait_s: float) -> Optional[RunInterruptedError]:
        """Forward SIGINT to the runner (when it runs on this node) and wait up to ``wait_s`` for
        its teardown. Returns the runner's :class:`RunInterruptedError`, or ``None`` if it did not
        end that way in time (Ray's shutdown then stops it)."""
        import ray

        record = self.record
        if record.run_ref is None:
            return None
        if record.pid is not None and record.node_id == ray.get_runtime_context().get_node_id():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(record.pid, signal.SIGINT)
        try:
            ray.get(record.run_ref, timeout=wait_s)
        except KeyboardInterrupt:  # a further Ctrl-C: stop waiting
            return None
        except Exception as exc:  # noqa: BLE001 - inspected below
            for candidate in (exc, getattr(exc, "cause", None)):
                if isinstance(candidate, RunInterruptedError):
                    return candidate
        return None


class InterruptibleRunner:
    """The task-runner side of :class:`RunnerLauncher`, mixed into the remote path's runners."""

    def process_identity(self) -> tuple[int, str]:
        """``(pid, Ray node id)`` of this runner, for the driver's Ctrl-C forwarding."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    @staticmethod
    def run_interruptibly(run: Callable[[], None]) -> None:
        """``run()``, which a SIGINT ends with :class:`RunInterruptedError` after teardown (the
        trainer's own ``fit`` reports the step it reached; before or after it, ``step`` is None)."""
        try:
            with sigint_raises_keyboard_interrupt():
                run()
        except KeyboardInterrupt:  # before or after fit(): whatever was built has been torn down
            raise RunInterruptedError(step=None) from None


class _RecordedRun:
    def __init__(self, record: _RunnerRecord) -> None:
        self._record = record

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        self._record.run_ref = self._record.handle.run.remote(*args, **kwargs)
        return self._record.run_ref


def resume_command(argv: Optional[list[str]] = None) -> str:
    """This run's command line with ``trainer.resume_mode=auto`` (replacing any other mode)."""
    argv = list(sys.argv if argv is None else argv)
    program = "python -m verl.remote_backend.main_ppo" if argv and argv[0].endswith("main_ppo.py") else None
    args = [a for a in argv[1:] if not a.lstrip("+").startswith("trainer.resume_mode=")]
    args.append("trainer.resume_mode=auto")
    head = program or shlex.quote(argv[0] if argv else "python -m verl.remote_backend.main_ppo")
    return " ".join([head, *(shlex.quote(a) for a in args)])


def interrupt_report(config: Any, backend: str, interrupted: Optional[RunInterruptedError]) -> str:
    """The lines printed after Ctrl-C: step reached, backend teardown, last checkpoint, resume."""
    from verl.remote_backend.checkpoints import tracker_step

    root = str(config.trainer.default_local_dir)
    saved = tracker_step(root)
    step = interrupted.step if interrupted is not None else None
    lines = [
        "[remote_backend] interrupted (Ctrl-C)"
        + (f" after step {step}" if step is not None else " (step reached unknown: the trainer did not answer)"),
        f"  backend {backend!r}: "
        + (
            "destroyed"
            if interrupted is not None and interrupted.backend_destroyed
            else "not confirmed destroyed; it stops with this run's Ray cluster"
        ),
    ]
    if saved is None:
        lines.append(f"  last complete checkpoint: none under {root} (trainer.save_freq sets how often one is saved)")
    else:
        lines.append(f"  last complete checkpoint: {os.path.join(root, f'global_step_{saved}')} (step {saved})")
        lines.append(f"  resume with: {resume_command()}")
    return "\n".join(lines)
