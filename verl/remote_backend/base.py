"""The ``RemoteBackend`` contract: what verl needs from an out-of-process RL engine.

A backend owns training, log-probs, sampling and weight sync; verl keeps the algorithm.
Nine abstract methods are required; the optional capabilities are declared here too, with
defaults that mean "not supported", and are detected only through the helpers below.
"""

from __future__ import annotations

import abc
import inspect
import warnings
from typing import TYPE_CHECKING, Any, ClassVar, Optional

from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult

if TYPE_CHECKING:  # keep `import verl.remote_backend` light
    from omegaconf import DictConfig
    from tensordict import TensorDict

__all__ = [
    "RemoteBackend",
    "BackendDevice",
    "LogProbResult",
    "UpdateResult",
    "GenerateResult",
    "implements",
    "supports_resume",
    "supports_health",
    "log_location",
    "accepts_batch_refs",
    "requires_single_forwarder",
    "destroy_backend",
]


def __getattr__(name: str) -> Any:
    """``from verl.remote_backend.base import RemoteBackendRegistry`` (the seed contract's path).

    The registry lives in :mod:`verl.remote_backend.registry`, which imports this module, so it
    is resolved on first access rather than at import time."""
    if name == "RemoteBackendRegistry":
        from verl.remote_backend.registry import RemoteBackendRegistry

        return RemoteBackendRegistry
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RemoteBackend(abc.ABC):
    """An out-of-process RL engine driven by verl's PPO/GRPO trainer.

    Lifecycle: the trainer calls ``from_config(cfg)`` once on the Ray driver, sends
    ``reconnect_handle()`` to every forwarder worker and rollout server, which call
    ``from_config(cfg, handle=...)`` to re-attach, and finally awaits ``destroy()`` on the
    driver's instance (also when training fails). Data-path methods are ``async`` so the
    forwarder's event loop stays responsive: wrap a blocking client in ``asyncio.to_thread``.

    Token layout of ``compute_log_prob`` / ``update_actor`` batches: a ``TensorDict`` of
    batch size ``B`` whose ``input_ids`` / ``position_ids`` are nested-jagged tensors (row
    ``i`` = the ``L_i`` real tokens of sample ``i``, prompt then response; ``T = sum(L_i)``),
    with dense ``prompts [B, P]`` (left-padded), ``responses`` / ``response_mask [B, R]``
    (right-padded), ``attention_mask [B, P + R]`` and, for updates, ``advantages``,
    ``old_log_probs``, ``ref_log_prob`` ``[B, R]``. Per-token outputs go back packed ``[T]``
    in the order of ``input_ids.values()``: slot ``t`` of a row holds
    ``log p(token[t + 1] | token[: t + 1])`` and the row's last slot is 0.
    """

    #: Registry name, set by :meth:`RemoteBackendRegistry.register`.
    name: ClassVar[str] = ""
    #: Capability: ``compute_log_prob`` / ``update_actor`` may receive ``data`` as a
    #: :class:`~verl.remote_backend.transport.batch_ref.BatchRef` (the batch left in Ray's object
    #: store). A backend whose engine is a Ray actor passes ``data.ref`` as a top-level actor
    #: argument so Ray resolves it in the engine's process, skipping the forwarder's copy.
    accepts_batch_refs: ClassVar[bool] = False

    # ------------------------------------------------------------ lifecycle
    @classmethod
    @abc.abstractmethod
    def from_config(cls, main_config: "DictConfig", *, handle: Optional[dict[str, Any]] = None) -> "RemoteBackend":
        """Create the backend (``handle=None``, on the driver) or re-attach to it (``handle``
        from :meth:`reconnect_handle`, in forwarders and rollout servers). Re-attaching never
        starts a second engine. Read only ``remote_backend.<name>`` and verl's standard keys."""

    @abc.abstractmethod
    def reconnect_handle(self) -> dict[str, Any]:
        """A small picklable dict (Ray actor handle, address, ...) that re-attaches to *this*
        backend through ``from_config(cfg, handle=...)`` in another process."""

    @abc.abstractmethod
    async def destroy(self) -> None:
        """Release the backend; idempotent. The creating instance shuts the engine down; a
        re-attached instance only drops its own connection. Calls made afterwards raise
        :class:`~verl.remote_backend.errors.BackendClosedError` (reported as our own teardown)."""

    @classmethod
    @abc.abstractmethod
    def requires_single_forwarder(cls) -> bool:
        """True when the engine owns all parallelism: verl then runs one forwarder
        (``trainer.n_gpus_per_node * trainer.nnodes == 1``) and one rollout replica, and
        derives those settings itself. Asked on the class, before anything starts."""

    # ------------------------------------------------------------ data path
    @abc.abstractmethod
    async def compute_log_prob(
        self,
        data: "TensorDict",
        *,
        ref: bool,
        calculate_entropy: bool,
        rollout_n: int,
        temperature: float,
        pad_token_id: int,
    ) -> LogProbResult:
        """Forward-only pass of the actor (``ref=False``) or the frozen reference model over
        ``data`` (layout in the class docstring), logits divided by ``temperature`` before the
        softmax. ``entropy`` is required when ``calculate_entropy``. ``rollout_n`` = samples per
        prompt; ``pad_token_id`` for backends that re-pad. Called by the forwarder."""

    @abc.abstractmethod
    async def update_actor(
        self,
        data: "TensorDict",
        *,
        actor_config: Any,
        pad_token_id: int,
        rollout_n: int,
        temperature: float,
    ) -> UpdateResult:
        """One PPO/GRPO policy update on the global batch with verl's policy loss: the
        mini-batches, epochs and optimizer steps that ``actor_config`` (verl's
        ``actor_rollout_ref.actor``) and ``data``'s non-tensor fields (``mini_batch_size``,
        ``epochs``, ``seed``) ask for, in verl's order: read them with
        :mod:`verl.remote_backend.update_schedule`. Called by the forwarder."""

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenerateResult:
        """Sample one continuation of ``prompt_ids``. Called by the rollout server once per
        sample, concurrently (batch concurrent calls). ``sampling_params``: ``max_tokens``
        (already capped at ``rollout.response_length``), ``temperature`` (0 = greedy),
        ``top_p``, ``top_k`` (-1 = off), ``logprobs`` (bool), optional ``repetition_penalty``
        and ``seed`` (the sample's own random stream)."""

    @abc.abstractmethod
    async def update_weights(self) -> Optional[dict[str, Any]]:
        """Make the sampler use the latest trained weights from the next ``generate`` on (a
        no-op when they share memory). Called after each update; may return
        ``{"policy_version": int}``."""

    @abc.abstractmethod
    async def save_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> Optional[str]:
        """Persist model, optimizer, scheduler, RNG and step under verl's actor checkpoint
        directory ``path`` (``.../global_step_<step>/actor``). Returns the directory written."""

    # ------------------------------------------------------------ optional capabilities
    @classmethod
    def check_config(cls, main_config: "DictConfig") -> None:
        """The backend's own settings rules, run on the driver before Ray starts. Raise
        :class:`~verl.remote_backend.errors.ConfigError` naming the key, the value and the fix
        for what the engine cannot do. Default: nothing to check."""

    @classmethod
    def rollout_log_prob_problem(cls, main_config: "DictConfig") -> Optional[str]:
        """Why the log-probs ``generate`` returns may differ from what ``compute_log_prob`` gives
        for the same tokens in this run, or ``None`` when they are the same computation (same
        weights version, temperature scaling and full-vocabulary softmax, float32 noise at most).
        ``None`` lets verl's bypass mode (``algorithm.rollout_correction.bypass_mode=true``) use
        the sampler's log-probs as old log-probs and skip the recompute. Called on the driver
        before Ray starts. Default: not declared, so bypass mode is refused."""
        return f"{cls.__qualname__} does not declare that its sampler's log-probs equal its trainer's"

    @classmethod
    def secret_settings(cls) -> dict[str, str]:
        """The backend's credential settings: ``{dotted key: environment variable}``, e.g.
        ``{"remote_backend.tinker.api_key": "TINKER_API_KEY"}``. The entry point moves a value
        set there into that variable (on the driver, before Hydra records the command line and
        before verl prints the config) and leaves the key null, so the backend must read the
        variable when the key is null. Called on the driver before Ray starts; a constant.
        Default: none."""
        return {}

    @classmethod
    def checkpoint_problem(cls, actor_dir: str, step: Optional[int]) -> Optional[str]:
        """What is wrong with this backend's checkpoint in ``actor_dir`` (``None``: loadable).
        Resume validation asks before Ray starts. Default: no format to verify."""
        return None

    async def load_checkpoint(self, path: str, step: int) -> None:
        """Restore what :meth:`save_checkpoint` wrote; the engine must then be at ``step``
        (else raise :class:`~verl.remote_backend.errors.ResumeCheckpointError`). Optional: a
        backend without it fails at start-up when ``trainer.resume_mode`` asks to resume."""
        raise NotImplementedError(f"{type(self).__name__} cannot resume (no load_checkpoint)")

    async def health(self) -> None:
        """Return when the engine answers; raise when it does not (``ConnectionError`` for
        transport failures: only those are retried). Probed while calls are in flight and
        after a failed call. Optional: without it a death is seen only through failed calls."""
        raise NotImplementedError

    def log_location(self) -> Optional[str]:
        """Where the engine's logs are, quoted when it is found dead. Optional (``None``)."""
        return None

    async def sleep(self) -> None:
        """Free sampler memory between rollouts (optional; default: nothing to free)."""

    async def wake_up(self) -> None:
        """Undo :meth:`sleep` before the next rollout (optional)."""

    async def clear_kv_cache(self) -> None:
        """Drop cached prefixes after a weight update (optional)."""


def implements(backend: Any, method: str) -> bool:
    """True when ``backend`` (instance or class) has its own callable ``method``, not the
    contract's "not supported" default."""
    fn, default = getattr(backend, method, None), getattr(RemoteBackend, method)
    return callable(fn) and getattr(fn, "__func__", fn) is not getattr(default, "__func__", default)


def supports_resume(backend: RemoteBackend | type[RemoteBackend]) -> bool:
    """True when the backend implements ``async load_checkpoint``."""
    return implements(backend, "load_checkpoint") and inspect.iscoroutinefunction(backend.load_checkpoint)


def supports_health(backend: RemoteBackend | type[RemoteBackend]) -> bool:
    """True when the backend implements ``async health``."""
    return implements(backend, "health") and inspect.iscoroutinefunction(backend.health)


def log_location(backend: RemoteBackend) -> str:
    """Where the backend's logs are, or a note that it reports none (never raises)."""
    fn = getattr(backend, "log_location", None)
    try:
        where = fn() if callable(fn) else None
    except Exception as exc:  # noqa: BLE001 - a failing hint must not mask the death it explains
        return f"unknown (log_location() failed: {exc})"
    return str(where) if where is not None else f"not reported ({type(backend).__name__} has no log_location())"


def accepts_batch_refs(backend: RemoteBackend | type[RemoteBackend]) -> bool:
    """True when the backend declares ``accepts_batch_refs = True``."""
    return getattr(backend, "accepts_batch_refs", False) is True


def requires_single_forwarder(backend_cls: type[RemoteBackend]) -> bool:
    """The class's ``requires_single_forwarder()`` without creating an engine.

    An adapter still declaring it as an instance method (the previous contract) is asked on
    a bare instance, with a ``DeprecationWarning``; it must then not read instance state."""
    fn = inspect.getattr_static(backend_cls, "requires_single_forwarder")
    if isinstance(fn, (classmethod, staticmethod)):
        return bool(backend_cls.requires_single_forwarder())
    warnings.warn(
        f"{backend_cls.__name__}.requires_single_forwarder is an instance method; declare it a "
        "@classmethod (the previous form stops working in the next release)",
        DeprecationWarning,
        stacklevel=2,
    )
    try:
        return bool(backend_cls.requires_single_forwarder(object.__new__(backend_cls)))
    except Exception as exc:  # the old form read instance state that does not exist yet
        raise TypeError(
            f"{backend_cls.__name__}.requires_single_forwarder() cannot be asked before the engine exists "
            f"({type(exc).__name__}: {exc}); declare it a @classmethod returning a constant"
        ) from None


async def destroy_backend(backend: RemoteBackend) -> None:
    """Await ``backend.destroy()``; a legacy synchronous ``destroy`` still works, with a
    ``DeprecationWarning``. Every teardown in the package goes through here."""
    result = backend.destroy()
    if inspect.isawaitable(result):
        await result
    else:
        warnings.warn(
            f"{type(backend).__name__}.destroy is synchronous; declare it `async def destroy(self)` "
            "(the previous form stops working in the next release)",
            DeprecationWarning,
            stacklevel=2,
        )
