"""The ``local`` reference backend: a PyTorch/transformers RL engine on one device, and its client.

It trains, scores and samples verl's batches with verl's own objective, so verl's remote path
can run and be checked end to end without an external server. The Ray-free engine is
:class:`~.engine.LocalEngine`, served by the Ray actor in :mod:`.actor`; the client that verl's
trainer talks to is :mod:`verl.workers.remote_client.local.backend`.
"""

from .config import EngineSettings, LocalBackendConfig

__all__ = ["EngineSettings", "LocalBackendConfig"]
