"""verl-remote-backend: drive verl's PPO/GRPO trainer with an out-of-process RL engine.

Importing this package is cheap: it exposes the contract and the registry only.
Backends (and their heavy dependencies) are imported on first
``RemoteBackendRegistry.get(name)``.
"""

from verl.remote_backend.base import BackendDevice, RemoteBackend, supports_resume
from verl.remote_backend.errors import BackendImportError, UnknownBackendError
from verl.remote_backend.registry import ENTRY_POINT_GROUP, RemoteBackendRegistry

__all__ = [
    "RemoteBackend",
    "RemoteBackendRegistry",
    "BackendDevice",
    "BackendImportError",
    "UnknownBackendError",
    "ENTRY_POINT_GROUP",
    "supports_resume",
]
