"""verl-remote-backend: drive verl's PPO/GRPO trainer with an out-of-process RL engine.

Importing this package is cheap: the contract, its result types and the registry. Backends
(and their heavy dependencies) are imported on first ``RemoteBackendRegistry.get(name)``.
"""

from verl.remote_backend.base import RemoteBackend, supports_resume
from verl.remote_backend.errors import BackendImportError, UnknownBackendError
from verl.remote_backend.registry import ENTRY_POINT_GROUP, RemoteBackendRegistry
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult

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
