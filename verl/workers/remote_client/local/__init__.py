"""The ``local`` reference backend's engine: a PyTorch/transformers RL engine on one device.

Modules: :mod:`.config` (typed settings), :mod:`.forward` (packed log-probs),
:mod:`.objective` (verl's PPO update), :mod:`.sampler` (batched KV-cache
sampling), :mod:`.checkpoint` (atomic checkpoints), :mod:`.engine`
(``LocalEngine``, the Ray-free engine), :mod:`.actor` (its async Ray actor).
The client is :mod:`verl.workers.remote_client.local_backend`.
"""

from .config import EngineSettings, LocalBackendConfig

__all__ = ["EngineSettings", "LocalBackendConfig"]
