"""verl-remote-backend: drive verl's PPO/GRPO trainer with an out-of-process RL engine.

Importing this package is cheap: the contract, its result types and the registry. Backends
(and their heavy dependencies) are imported on first ``RemoteBackendRegistry.get(name)``.
"""

from verl.remote_backend.verl_versions import require_supported_verl

require_supported_verl()  # an unsupported verl fails here, naming the supported releases

from verl.remote_backend.base import RemoteBackend, supports_resume  # noqa: E402
from verl.remote_backend.errors import BackendImportError, UnknownBackendError  # noqa: E402
from verl.remote_backend.registry import ENTRY_POINT_GROUP, RemoteBackendRegistry  # noqa: E402
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult  # noqa: E402

__all__ = [
    "RemoteBackend",
    "RemoteBackendRegistry",
    "BackendDevice",
    "LogProbResult",
    "UpdateResult",
    "GenerateResult",
    "BackendImportError",
    "UnknownBackendError",
    "ENTRY_POINT_GROUP",
    "supports_resume",
]
