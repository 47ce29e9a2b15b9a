"""The seed contract's module path of the forwarder worker; it lives in
:mod:`verl.remote_backend.forwarder.worker`."""

from verl.remote_backend.forwarder.worker import RemoteBackendWorker

__all__ = ["RemoteBackendWorker"]
