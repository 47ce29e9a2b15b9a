"""Name -> backend class registry, imported lazily.

``trainer.remote_backend`` names a backend; this module turns that name into a ``RemoteBackend``
subclass, from a registered class, a built-in module, ``VERL_USE_EXTERNAL_MODULES`` or an
installed distribution's entry point. Nothing is imported before a backend is asked for, so
importing ``verl.remote_backend`` never pulls in arctic-platform, deepspeed or vllm.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional, TypeVar

from verl.remote_backend.base import RemoteBackend
from verl.remote_backend.errors import BackendImportError, UnknownBackendError

if TYPE_CHECKING:
    from omegaconf import DictConfig

__all__ = ["RemoteBackendRegistry", "ENTRY_POINT_GROUP"]

ENTRY_POINT_GROUP = "verl.remote_backends"
_EXTERNAL_MODULES_ENV = "VERL_USE_EXTERNAL_MODULES"

logger = logging.getLogger(__name__)

B = TypeVar("B", bound=type[RemoteBackend])


class RemoteBackendRegistry:
    """Process-wide map from backend name to ``RemoteBackend`` subclass."""

    #: Built-in backends: name -> module that registers it when imported.
    MODULES: dict[str, str] = {
        "local": "verl.workers.remote_client.local.backend",
        "arctic": "verl.workers.remote_client.arctic.client",
        "tinker": "verl.workers.remote_client.tinker.client",
    }
    #: pip extra that provides a built-in backend's dependencies.
    INSTALL_HINTS: dict[str, str] = {
        "arctic": "pip install 'verl-remote-backend[arctic]'",
        "tinker": "pip install 'verl-remote-backend[tinker]'",
    }

    _classes: dict[str, type[RemoteBackend]] = {}
    #: name -> the backend's own forwarder worker class, or a zero-argument loader returning it.
    _workers: dict[str, "type | Callable[[], type]"] = {}
    _lock = threading.RLock()

    # ------------------------------------------------------------ registration
    @classmethod
    def register(cls, name: str) -> Callable[[B], B]:
        """Class decorator: make ``backend_cls`` available as ``name``.

        Registering the same class twice is a no-op (modules may be re-imported); a *different*
        class under a taken name raises ``ValueError``, except for the built-in names: a
        plugin's class takes a built-in name over (Snowflake's plugin registers ``arctic``), and
        the built-in class imported after it leaves the plugin's in place.
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"Backend name must be a non-empty string, got {name!r}")

        def decorator(backend_cls: B) -> B:
            if not (isinstance(backend_cls, type) and issubclass(backend_cls, RemoteBackend)):
                raise TypeError(
                    f"@RemoteBackendRegistry.register({name!r}) expects a RemoteBackend subclass, got {backend_cls!r}"
                )
            with cls._lock:
                backend_cls.name = name
                existing = cls._classes.get(name)
                if existing is not None and _qualname(existing) != _qualname(backend_cls):
                    if cls.is_builtin(backend_cls, name):
                        return backend_cls  # a plugin took this built-in name first: it keeps it
                    if not cls.is_builtin(existing, name):
                        raise ValueError(
                            f"Remote backend name {name!r} is already registered to {_qualname(existing)}; "
                            f"refusing to register {_qualname(backend_cls)} under the same name. Pick another name."
                        )
                    logger.warning(
                        "remote backend %r is now served by %s (registered by a plugin) instead of the built-in %s",
                        name,
                        _qualname(backend_cls),
                        _qualname(existing),
                    )
                cls._classes[name] = backend_cls
            return backend_cls

        return decorator

    @classmethod
    def register_worker(cls, name: str, worker: "type | Callable[[], type]") -> None:
        """Give backend ``name`` a forwarder worker class of its own, in place of the generic one.

        ``worker`` is the class or a zero-argument loader returning it (so registering stays
        cheap; the loader runs when a run with that backend builds its workers). The class is
        a verl ``Worker`` whose ``@register``-ed methods are the ones verl's trainer calls on
        the actor role (``init_model``, ``compute_log_prob``, ``compute_ref_log_prob``,
        ``update_actor``, ``update_weights``, ``save_checkpoint``, ...), built as
        ``worker(config=<actor_rollout_ref>, role=<role>, main_config=<whole config>,
        backend_handle=<the driver backend's reconnect_handle()>)``. Registering again replaces
        the previous entry (plugins may be re-imported).
        """
        if not name or not isinstance(name, str):
            raise ValueError(f"Backend name must be a non-empty string, got {name!r}")
        if not callable(worker):
            raise TypeError(f"register_worker({name!r}, ...) expects a Worker class or a loader, got {worker!r}")
        with cls._lock:
            cls._workers[name] = worker

    @classmethod
    def get_worker(cls, name: str) -> Optional[type]:
        """The forwarder worker class registered for ``name``, or ``None`` (use the generic one).

        Honours ``VERL_USE_EXTERNAL_MODULES`` like :meth:`get`; a loader is called once and its
        class remembered.

        Raises:
            BackendImportError: the loader failed to import the worker's module.
            TypeError: the loader returned something that is not a class.
        """
        with cls._lock:
            if name not in cls._workers:
                _import_external_modules()
            entry = cls._workers.get(name)
            if entry is None or isinstance(entry, type):
                return entry
            try:
                worker_cls = entry()
            except ImportError as exc:
                raise BackendImportError(
                    f"The forwarder worker registered for remote backend {name!r} failed to import: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            if not isinstance(worker_cls, type):
                raise TypeError(
                    f"The worker loader registered for remote backend {name!r} returned {worker_cls!r}, not a class"
                )
            cls._workers[name] = worker_cls
            return worker_cls

    @classmethod
    def unregister(cls, name: str) -> None:
        """Forget ``name`` and its worker (tests and plugin reloads)."""
        with cls._lock:
            cls._classes.pop(name, None)
            cls._workers.pop(name, None)

    # ------------------------------------------------------------ lookup
    @classmethod
    def list(cls) -> list[str]:
        """Every name ``get`` can resolve: registered, built-in and entry points."""
        names = set(cls._classes) | set(cls.MODULES) | {ep.name for ep in _entry_points()}
        return sorted(names)

    @classmethod
    def get(cls, name: str) -> type[RemoteBackend]:
        """Return the class registered as ``name``, importing its module if needed.

        Tried in order: a class already registered with :meth:`register`; the modules listed in
        ``VERL_USE_EXTERNAL_MODULES`` (imported, then looked up again); the built-in
        :attr:`MODULES` entry, whose module must register ``name``; an entry point ``name`` in
        the ``verl.remote_backends`` group (``"pkg.module:Class"``, or ``"pkg.module"`` when the
        module registers itself).

        Raises:
            UnknownBackendError: nothing provides ``name`` (lists the known names).
            BackendImportError: the providing module failed to import (chains the
                cause and gives the install command).
        """
        with cls._lock:
            if name in cls._classes:
                return cls._classes[name]
            _import_external_modules()
            if name in cls._classes:
                return cls._classes[name]
            if name in cls.MODULES:
                cls._import(name, cls.MODULES[name])
            else:
                for ep in _entry_points():
                    if ep.name == name:
                        cls._load_entry_point(ep)
                        break
                else:
                    raise UnknownBackendError(
                        f"Unknown remote backend {name!r} (trainer.remote_backend={name}). "
                        f"Known backends: {cls.list()}. To add one, decorate a RemoteBackend subclass with "
                        f"@RemoteBackendRegistry.register({name!r}) and make its module importable via "
                        f"VERL_USE_EXTERNAL_MODULES=<module> or an entry point in the {ENTRY_POINT_GROUP!r} group."
                    )
            if name not in cls._classes:
                raise UnknownBackendError(
                    f"Importing the provider of remote backend {name!r} did not register it: "
                    f"the module must decorate its class with @RemoteBackendRegistry.register({name!r})."
                )
            return cls._classes[name]

    @classmethod
    def create(cls, name: str, main_config: "DictConfig", **kwargs: Any) -> RemoteBackend:
        """``get(name).from_config(main_config, **kwargs)``."""
        return cls.get(name).from_config(main_config, **kwargs)

    # ------------------------------------------------------------ helpers
    @classmethod
    def is_builtin(cls, backend_cls: type, name: str) -> bool:
        """Whether ``backend_cls`` is this package's own class for the built-in ``name``."""
        return cls.MODULES.get(name) == backend_cls.__module__

    @classmethod
    def _import(cls, name: str, module: str) -> None:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            hint = cls.INSTALL_HINTS.get(name)
            raise BackendImportError(
                f"Remote backend {name!r} is provided by module {module!r}, which failed to import: "
                f"{type(exc).__name__}: {exc}." + (f" Install its dependencies with: {hint}" if hint else "")
            ) from exc

    @classmethod
    def _load_entry_point(cls, ep: importlib.metadata.EntryPoint) -> None:
        try:
            obj = ep.load()
        except ImportError as exc:
            dist = getattr(ep, "dist", None)
            hint = f" (installed by distribution {dist.name!r})" if dist is not None else ""
            raise BackendImportError(
                f"Remote backend {ep.name!r} comes from entry point {ep.value!r}{hint}, which failed to import: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        if isinstance(obj, type) and issubclass(obj, RemoteBackend) and ep.name not in cls._classes:
            cls.register(ep.name)(obj)


def _qualname(obj: type) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _import_external_modules() -> None:
    """Honour ``VERL_USE_EXTERNAL_MODULES`` even when set after ``import verl``."""
    for module in filter(None, (m.strip() for m in os.environ.get(_EXTERNAL_MODULES_ENV, "").split(","))):
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BackendImportError(
                f"{_EXTERNAL_MODULES_ENV} lists {module!r}, which failed to import: {type(exc).__name__}: {exc}"
            ) from exc
