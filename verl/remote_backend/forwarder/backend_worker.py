"""A backend's own forwarder worker class (``RemoteBackendRegistry.register_worker``), made
runnable by stock verl's trainer.

Two differences from the patched verl the seed contract's workers were written for: verl builds
the actor worker with ``config`` and ``role`` only, while such a worker also expects
``main_config`` and ``backend_handle``; and verl 0.7.1's ``DistProfiler.annotate`` wraps an
``async def`` method in a plain function, so verl's dispatch calls it synchronously and Ray is
handed an un-awaited coroutine. :func:`backend_worker_class` fixes both in a subclass.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

__all__ = ["backend_worker_class"]


def _returns_coroutine(fn: Callable) -> bool:
    """A plain function that wraps (``__wrapped__`` chain) an ``async def``."""
    seen = fn
    while seen is not None:
        if inspect.iscoroutinefunction(seen):
            return True
        seen = getattr(seen, "__wrapped__", None)
    return False


def _awaiting(method: Callable) -> Callable:
    @functools.wraps(method)  # keeps verl's dispatch attributes (the @register magic attribute)
    async def awaited(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await method(self, *args, **kwargs)

    return awaited


def backend_worker_class(worker_cls: type, **init_kwargs: Any) -> type:
    """``worker_cls`` whose constructor also receives ``init_kwargs`` and whose verl-dispatched
    methods that hide an ``async def`` behind a plain wrapper are ``async`` again (so verl's
    worker group awaits them). Name, docstring and dispatch modes are kept; Ray ships the
    subclass to the worker process by value.

    Called by the trainer with ``main_config=<whole config>, backend_handle=<reconnect handle>``.
    """
    from verl.single_controller.base.decorator import MAGIC_ATTR

    namespace: dict[str, Any] = {"__doc__": worker_cls.__doc__}
    for name in dir(worker_cls):
        method = inspect.getattr_static(worker_cls, name, None)
        if (
            callable(method)
            and hasattr(method, MAGIC_ATTR)
            and not inspect.iscoroutinefunction(method)
            and _returns_coroutine(method)
        ):
            namespace[name] = _awaiting(method)

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        worker_cls.__init__(self, *args, **{**init_kwargs, **kwargs})

    namespace["__init__"] = __init__
    return type(worker_cls.__name__, (worker_cls,), namespace)
