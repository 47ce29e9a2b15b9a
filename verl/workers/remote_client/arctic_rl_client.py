"""The seed contract's module path of the ``arctic`` backend; it lives in
:mod:`verl.workers.remote_client.arctic.client`."""

from verl.workers.remote_client.arctic.client import ArcticBackend

__all__ = ["ArcticBackend"]
