"""Resource growth of a running job's processes, for soak runs (``benchmarks/bench_soak.py``) and
their CI version (``tests/e2e/test_soak_e2e.py``).

A :class:`ProcessSampler` is pointed at the pid of a job's root process (the driver of
``python -m verl.remote_backend.main_ppo``). Each :meth:`~ProcessSampler.sample` walks the root's
process tree and records, per process, its RSS, its PSS (``/proc/<pid>/smaps_rollup``; shared
pages such as torch's libraries divided among their users), its open file descriptors and its
thread count, plus the bytes in Ray's object store (asked of the job's own raylet, found through
the ``--gcs-address`` its daemons were started with). Processes are named by role: the Ray class a worker hosts,
from the process title Ray gives it (``ray::EngineActor.generate`` -> ``EngineActor``), the
daemon's executable (``raylet``, ``gcs_server``), or ``driver`` for the root.

:meth:`~ProcessSampler.report` fits, per process, a least-squares line of each measure against
the training step over the samples taken after a warm-up, and gives the slope per 100 steps with
the first and last values: growth that noise does not explain shows as a slope, whatever the
absolute level. Needs ``psutil`` (a dependency of this package) and, for the object store, Ray.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

__all__ = [
    "MEASURES",
    "ProcessSample",
    "Trend",
    "ProcessReport",
    "ProcessSampler",
    "role_of",
    "least_squares_slope",
    "format_report",
    "StepSampler",
]

#: What each sample records per process; ``*_mb`` in MiB.
MEASURES = ("rss_mb", "pss_mb", "fds", "threads")
#: The pseudo-process that carries Ray's object-store usage in a report.
OBJECT_STORE = "ray object store"
_MB = float(2**20)


def role_of(cmdline: Sequence[str], *, is_root: bool = False) -> str:
    """A process's role in a Ray job, from its command line (as ``ps`` shows it).

    Ray rewrites a worker's title to ``ray::<Class>.<method>`` while it runs a method and
    ``ray::<Class>`` between calls (``ray::IDLE`` for a pooled worker with no actor), so the class
    is the role. Other processes are named by their executable or, for ``python -m``/script
    processes, by the module or script (Ray's agents, the entry point's reaper)."""
    if is_root:
        return "driver"
    if not cmdline:
        return "?"
    head = cmdline[0]
    if head.startswith("ray::"):
        return head[len("ray::") :].split(".", 1)[0].split(" ", 1)[0] or "?"
    exe = os.path.basename(head)
    if exe.startswith("python"):
        args = list(cmdline[1:])
        if "-m" in args and args.index("-m") + 1 < len(args):
            return args[args.index("-m") + 1].rsplit(".", 1)[-1]
        scripts = [a for a in args if a.endswith(".py")]
        return os.path.basename(scripts[0])[:-3] if scripts else exe
    return exe


@dataclass(frozen=True)
class ProcessSample:
    """One process at one step. ``pss_mb`` is ``None`` where the kernel gives no PSS."""

    step: int
    pid: int
    role: str
    rss_mb: float
    pss_mb: Optional[float]
    fds: Optional[int]
    threads: int


def least_squares_slope(xs: Sequence[float], ys: Sequence[float]) -> Optional[float]:
    """Slope of the least-squares line through ``(xs, ys)``; ``None`` with fewer than 2 distinct xs."""
    n = len(xs)
    if n < 2:
        return None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return None
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx


@dataclass(frozen=True)
class Trend:
    """One measure of one process after the warm-up: first and last sampled values, the
    least-squares slope per 100 steps, the largest rise over the first value (``max - first``)
    and the spread of the values (max - min), so a slope can be read against its noise."""

    first: float
    last: float
    per_100_steps: Optional[float]
    max_rise: float
    spread: float

    @classmethod
    def of(cls, steps: Sequence[int], values: Sequence[float]) -> "Trend":
        slope = least_squares_slope(steps, values)
        return cls(
            first=values[0],
            last=values[-1],
            per_100_steps=None if slope is None else 100.0 * slope,
            max_rise=max(values) - values[0],
            spread=max(values) - min(values),
        )


@dataclass(frozen=True)
class ProcessReport:
    """The trends of one process (``role``, ``pid``) over the samples from ``first_step`` to
    ``last_step``, plus what it was at the very first sample (before the warm-up was cut)."""

    role: str
    pid: int
    first_step: int
    last_step: int
    samples: int
    trends: dict[str, Trend]
    start: dict[str, Optional[float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "trends": {k: asdict(v) for k, v in self.trends.items()}}


def _memory(proc: Any) -> tuple[float, Optional[float]]:
    """(RSS, PSS) in MiB; PSS from ``smaps_rollup`` (cheap) where the kernel has it."""
    rss = proc.memory_info().rss / _MB
    try:
        with open(f"/proc/{proc.pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return rss, int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return rss, None


class ProcessSampler:
    """Samples the process tree under ``root_pid`` (see the module docstring).

    Args:
        root_pid: the job's root process (its driver); the root itself is reported as ``driver``.
        object_store: also record Ray's object-store bytes (needs Ray importable here).
    """

    def __init__(self, root_pid: int, *, object_store: bool = True) -> None:
        self.root_pid = root_pid
        self.object_store = object_store
        self.samples: list[ProcessSample] = []
        self.roles: dict[int, str] = {}
        self._gcs_address: Optional[str] = None

    # ------------------------------------------------------------ sampling
    def _tree(self) -> list[Any]:
        import psutil

        try:
            root = psutil.Process(self.root_pid)
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return []

    def sample(self, step: int) -> list[ProcessSample]:
        """Record every live process of the tree (and the object store) as of training step ``step``."""
        import psutil

        taken: list[ProcessSample] = []
        for proc in self._tree():
            try:
                with proc.oneshot():
                    role = role_of(proc.cmdline(), is_root=proc.pid == self.root_pid)
                    if role == "IDLE" and proc.pid in self.roles:
                        role = self.roles[proc.pid]  # an actor's worker between Ray's title updates
                    self.roles[proc.pid] = role
                    rss, pss = _memory(proc)
                    try:
                        fds: Optional[int] = proc.num_fds()
                    except (psutil.AccessDenied, AttributeError):
                        fds = None
                    taken.append(ProcessSample(step, proc.pid, role, rss, pss, fds, proc.num_threads()))
                    if self._gcs_address is None:
                        self._gcs_address = _gcs_address(proc.cmdline())
            except psutil.Error:
                continue  # exited between listing and reading
        if self.object_store:
            used = self.object_store_mb()
            if used is not None:
                taken.append(ProcessSample(step, 0, OBJECT_STORE, used, None, None, 0))
        self.samples.extend(taken)
        return taken

    def object_store_mb(self) -> Optional[float]:
        """MiB in the job's Ray object store (the raylet's store stats), ``None`` if not reachable."""
        if self._gcs_address is None:
            return None
        try:
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address

            _use_ray_token()
            reply = get_memory_info_reply(get_state_from_address(self._gcs_address), timeout_seconds=10)
            return reply.store_stats.object_store_bytes_used / _MB
        except Exception:  # noqa: BLE001 - the cluster may be starting or gone; the sample goes without it
            return None

    # ------------------------------------------------------------ analysis
    def report(self, *, warmup_steps: int) -> list[ProcessReport]:
        """Per process that was sampled after step ``warmup_steps``: the trend of every measure over
        those samples, and its values at its first sample overall. Sorted by role, then pid."""
        by_pid: dict[tuple[str, int], list[ProcessSample]] = {}
        for s in self.samples:
            by_pid.setdefault((s.role if s.pid == 0 else self.roles.get(s.pid, s.role), s.pid), []).append(s)
        reports = []
        for (role, pid), series in sorted(by_pid.items()):
            after = [s for s in series if s.step > warmup_steps]
            if not after:
                continue
            steps = [s.step for s in after]
            trends = {}
            for measure in MEASURES:
                values = [getattr(s, measure) for s in after]
                if all(v is not None for v in values):
                    trends[measure] = Trend.of(steps, [float(v) for v in values])
            start = {m: getattr(series[0], m) for m in MEASURES}
            reports.append(ProcessReport(role, pid, steps[0], steps[-1], len(after), trends, start))
        return reports


def _use_ray_token() -> None:
    """Let this process talk to a local cluster that uses Ray's token authentication (the default
    since Ray 2.5x for a cluster ``ray.init`` starts, with the token in ``~/.ray/auth_token``).

    Ray switches a process to token mode by setting ``RAY_AUTH_MODE=token`` in its environment;
    the variable is put back as it was afterwards, so processes this one starts later (the next
    test's run) still choose for themselves."""
    try:
        from ray._private.authentication.authentication_token_setup import (
            AUTH_MODE_ENV_VAR,
            maybe_enable_token_auth_if_token_available,
        )
    except ImportError:  # a Ray without token authentication
        return
    before = os.environ.get(AUTH_MODE_ENV_VAR)
    ray_logger = logging.getLogger(maybe_enable_token_auth_if_token_available.__module__)
    level = ray_logger.level
    ray_logger.setLevel(logging.ERROR)  # its "token authentication is enabled" warning, once per sample
    try:
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    finally:
        ray_logger.setLevel(level)
        if before is None:
            os.environ.pop(AUTH_MODE_ENV_VAR, None)
        else:
            os.environ[AUTH_MODE_ENV_VAR] = before


def _gcs_address(cmdline: Sequence[str]) -> Optional[str]:
    """The GCS ``ip:port`` a Ray daemon was started with (its ``--gcs-address`` flag; the raylet and
    Ray's agents have one), or ``None``. (``gcs_server`` itself is usually started on port 0.)"""
    found = re.search(r"--gcs-address=(\S+:\d+)", " ".join(cmdline))
    return found.group(1) if found else None


def format_report(reports: Sequence[ProcessReport], *, include: Optional[Sequence[str]] = None) -> str:
    """A Markdown table: one line per process, per measure ``start -> end (slope per 100 steps)``.

    ``start`` is the process's first sample (before the warm-up), ``end`` its last; the slope is
    fitted after the warm-up. ``include`` limits the roles shown (all by default)."""

    def cell(report: ProcessReport, measure: str, unit: str) -> str:
        trend = report.trends.get(measure)
        if trend is None:
            return "-"
        start = report.start.get(measure)
        slope = "n/a" if trend.per_100_steps is None else f"{trend.per_100_steps:+.2f}"
        fmt = "{:.1f}" if unit else "{:.0f}"
        head = fmt.format(start) if start is not None else "?"
        return f"{head} -> {fmt.format(trend.last)} ({slope}{unit}/100 steps)"

    lines = [
        "| process | pid | samples (steps) | RSS MiB | PSS MiB | fds | threads |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        if include is not None and r.role not in include:
            continue
        steps = f"{r.samples} ({r.first_step}-{r.last_step})"
        if r.role == OBJECT_STORE:
            lines.append(f"| {r.role} | - | {steps} | {cell(r, 'rss_mb', ' MiB')} (used) | - | - | - |")
            continue
        lines.append(
            f"| {r.role} | {r.pid} | {steps} | {cell(r, 'rss_mb', ' MiB')} | {cell(r, 'pss_mb', ' MiB')} | "
            f"{cell(r, 'fds', '')} | {cell(r, 'threads', '')} |"
        )
    return "\n".join(lines)


class StepSampler:
    """Samples a :class:`ProcessSampler` at training-step boundaries read from verl's ``file`` logger.

    Call it (``sampler(child_pid, metrics_path)``) often, e.g. once a second: it reads the lines
    verl's file logger (``VERL_FILE_LOGGER_PATH``) appended since the last call and, once the
    highest finished step reaches the next multiple of ``every``, samples the tree under
    ``child_pid`` as of that step. verl writes a step's line when the step ends, so every sample is
    taken at the same point of the loop (the start of the next step's generation), within the
    polling interval.
    """

    def __init__(self, every: int, *, object_store: bool = True) -> None:
        if every < 1:
            raise ValueError(f"every={every!r}: sample at least every step (every >= 1)")
        self.every = every
        self.object_store = object_store
        self.sampler: Optional[ProcessSampler] = None
        self.last_step = 0
        self._next = every
        self._offset = 0

    def __call__(self, child_pid: int, metrics_path: Any) -> None:
        import json

        if self.sampler is None:
            self.sampler = ProcessSampler(child_pid, object_store=self.object_store)
        try:
            with open(metrics_path) as fh:
                fh.seek(self._offset)
                chunk = fh.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind("\n") + 1]  # a line being written is read next time
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            if line.strip():
                self.last_step = max(self.last_step, int(json.loads(line).get("step", 0)))
        if self.last_step >= self._next:
            self.sampler.sample(self.last_step)
            self._next = (self.last_step // self.every + 1) * self.every

    def report(self, *, warmup_steps: int) -> list[ProcessReport]:
        """:meth:`ProcessSampler.report` of what was sampled (empty before the first sample)."""
        return [] if self.sampler is None else self.sampler.report(warmup_steps=warmup_steps)
