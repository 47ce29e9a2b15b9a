"""The local backend, plus a dump of the state it holds right after a resume.

Registered as ``local-resume-probe`` (through ``VERL_USE_EXTERNAL_MODULES``).
After ``load_checkpoint(path, step)`` it immediately saves the engine's state to
``<path>_restored`` with the same step, so a test can compare, file by file
(model weights, optimizer + LR schedule, counters, RNG), what was saved before
the restart with what the restarted engine actually holds.
"""

from __future__ import annotations

from typing import Optional

from verl.remote_backend import RemoteBackendRegistry
from verl.workers.remote_client.local.backend import LocalBackend


@RemoteBackendRegistry.register("local-resume-probe")
class ResumeProbeBackend(LocalBackend):
    async def load_checkpoint(self, path: str, step: Optional[int] = None) -> None:
        await super().load_checkpoint(path, step)
        await super().save_checkpoint(path.rstrip("/") + "_restored", step)
