"""The short block a failed run prints before any traceback: what failed, why, the fix, the logs.

A failure inside Ray arrives at the driver wrapped (``RayTaskError`` around the runner's error,
around a worker's error ...), and Hydra prints its multi-KB "Error executing job with overrides"
line and the traceback before the message that matters. :func:`failure_report` digs out the
innermost cause and puts its message - which for this project's errors names the setting, the
value and the fix - first; ``main_ppo.main`` prints it, then lets the traceback follow.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["failure_report", "ray_log_dir", "root_cause"]

_MAX_DETAIL_LINES = 12


def root_cause(exc: BaseException) -> BaseException:
    """The innermost error behind Ray's wrappers (``RayTaskError.cause``, repeatedly)."""
    seen = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException):
            break
        exc = cause
    return exc


def ray_log_dir() -> Optional[str]:
    """This Ray session's log directory, or ``None`` (Ray not started; private Ray API, best effort)."""
    try:
        from ray._private import worker as ray_worker

        return ray_worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - only used in messages
        return None


def failure_report(exc: BaseException, *, run_dir: Optional[str] = None) -> str:
    """Lines to print first when the run fails with ``exc``.

    The first line is ``[remote_backend] run failed: <ErrorType>: <first line of the cause>``;
    the cause's further lines (the fix, for this project's errors) follow, then where the logs are.
    """
    cause = root_cause(exc)
    message = str(cause).strip() or "(no message)"
    first, *rest = message.splitlines()
    if type(cause).__name__.startswith("RayTaskError") or first.startswith("ray::"):
        # A wrapper without a usable cause: its first lines are Ray's task header and traceback.
        first = next((line for line in reversed(message.splitlines()) if line.strip()), first)
        rest = []
    lines = [f"[remote_backend] run failed: {type(cause).__name__}: {first}"]
    detail = [line for line in rest if line.strip()]
    lines += [f"  {line}" for line in detail[:_MAX_DETAIL_LINES]]
    if len(detail) > _MAX_DETAIL_LINES:
        lines.append(f"  ... ({len(detail) - _MAX_DETAIL_LINES} more lines in the traceback below)")
    logs = [path for path in (run_dir, ray_log_dir()) if path]
    if logs:
        lines.append("  logs: " + ", ".join(logs))
    lines.append("  (the full traceback follows)")
    return "\n".join(lines)
