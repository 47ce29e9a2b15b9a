"""The ``RemoteBackend`` contract: what verl needs from an out-of-process RL engine.

A backend owns the heavy compute (training, log-probs, sampling, weight sync);
verl keeps the algorithm (data, rewards, advantages, the fit loop). The verl side
talks to a backend only through the nine abstract methods below, plus
*optional capabilities* detected at start-up or at run time:

* ``check_config(main_config) -> None`` (classmethod) - the backend's own
  settings rules, run by config validation on the driver *before Ray starts*
  (see :func:`check_backend_config`); raise ``ValueError`` naming the key, the
  value and the fix. Use it for what the engine cannot do (an objective it
  computes differently, a transport it does not support), so the run stops in
  seconds instead of after a rollout.
* ``checkpoint_problem(actor_dir, step) -> Optional[str]`` (classmethod) - what
  is wrong with the backend's checkpoint in verl's ``global_step_<step>/actor``
  folder (``None``: loadable). Resume validation calls it before Ray starts, so
  a run that would resume from a checkpoint the backend cannot load stops with
  :class:`~verl.remote_backend.reliability.ResumeCheckpointError`.

* ``async load_checkpoint(path, step) -> None`` - resume support (see
  :func:`supports_resume`). A backend without it fails at start-up when
  ``trainer.resume_mode`` asks to resume; it never starts from scratch silently.
* a ``"device"`` entry in the results of ``compute_log_prob`` / ``update_actor``
  (see :class:`BackendDevice`) so the forwarder computes MFU against the
  backend's accelerators, not against the forwarder's own CPU.
* a ``"timing": {"compute_s": float}`` entry in the same results: the seconds
  the backend spent computing the op (excluding its own transport). The
  forwarder subtracts it from the call's wall time and logs what remains as
  the plugin's overhead (``perf/remote/*`` metrics, see ``trainer.py``).
* ``accepts_batch_refs = True`` (class attribute, see :func:`accepts_batch_refs`):
  ``compute_log_prob`` / ``update_actor`` may then receive ``data`` as a
  :class:`~verl.remote_backend.batch_ref.BatchRef` - the batch left in Ray's
  object store - instead of a ``TensorDict``. A backend whose engine is a Ray
  actor passes ``data.ref`` as a top-level argument of its actor call and Ray
  resolves it to the ``TensorDict`` in the engine's process, so the batch is
  never deserialised and re-serialised by the forwarder.
* ``async health() -> None`` and ``log_location() -> str`` - liveness (see
  :mod:`verl.remote_backend.guard`): ``health`` returns when the engine answers
  and raises when it does not (probed while calls are in flight, and after a
  failed call); ``log_location`` says where the engine's logs are, quoted when
  it is found dead. Raise ``ConnectionError`` for transport failures: only
  those are re-sent, and only for idempotent reads.

Token layout shared by ``compute_log_prob`` and ``update_actor``
-----------------------------------------------------------------
verl (``trainer.use_legacy_worker_impl=disable``) sends a ``TensorDict`` of
batch size ``B`` whose ``input_ids`` and ``position_ids`` are nested-jagged
tensors (NJT, ``layout=torch.jagged``): row ``i`` holds the ``L_i`` real tokens
of sample ``i`` (prompt then response, no padding). ``T = sum(L_i)`` is the
number of *packed* tokens. Dense, padded fields travel alongside:
``prompts [B, P]`` (left-padded), ``responses [B, R]`` / ``response_mask [B, R]``
(right-padded), ``attention_mask [B, P + R]`` and, for updates,
``advantages``, ``old_log_probs``, ``ref_log_prob`` (all ``[B, R]``).

Per-token outputs (``log_probs``, ``entropy``) are returned *packed*: a 1-D
float tensor of shape ``[T]`` in the order of ``input_ids.values()`` (an NJT
with the same offsets is accepted too). Slot ``t`` of a row holds
``log p(token[t + 1] | token[: t + 1])`` - the predict-next alignment used by
verl and Arctic - and the last slot of each row is unused (write ``0``). The
forwarder turns packed outputs back into NJTs; backends never need to.
"""

from __future__ import annotations

import abc
import inspect
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Awaitable, ClassVar, Optional

if TYPE_CHECKING:  # keep `import verl.remote_backend` light
    from omegaconf import DictConfig
    from tensordict import TensorDict

__all__ = [
    "RemoteBackend",
    "BackendDevice",
    "supports_resume",
    "accepts_batch_refs",
    "backend_compute_seconds",
    "check_backend_config",
    "backend_checkpoint_problem",
]


@dataclass(frozen=True)
class BackendDevice:
    """The accelerators a backend computes on, as reported for MFU.

    Attributes:
        type: device kind, e.g. ``"cuda"`` or ``"cpu"``.
        count: number of devices that took part in the op (>= 1).
        peak_flops: peak dense FLOP/s of *one* device for the model's dtype,
            or ``None`` when unknown (the forwarder then uses verl's table for
            ``type``).
        name: optional model name of the device (``"NVIDIA H100 80GB HBM3"``).
    """

    type: str
    count: int = 1
    peak_flops: Optional[float] = None
    name: Optional[str] = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "BackendDevice":
        unknown = set(raw) - {"type", "count", "peak_flops", "name"}
        if unknown:
            raise ValueError(f"Backend device report has unknown keys {sorted(unknown)}; expected type/count/peak_flops/name")
        if int(raw.get("count", 1)) < 1:
            raise ValueError(f"Backend device report has count={raw.get('count')}; it must be >= 1")
        return cls(
            type=str(raw["type"]),
            count=int(raw.get("count", 1)),
            peak_flops=None if raw.get("peak_flops") is None else float(raw["peak_flops"]),
            name=raw.get("name"),
        )


class RemoteBackend(abc.ABC):
    """An out-of-process RL engine driven by verl's PPO/GRPO trainer.

    Lifecycle: the trainer calls ``from_config(cfg)`` once on the Ray driver,
    sends ``reconnect_handle()`` to every forwarder worker and rollout server,
    which call ``from_config(cfg, handle=...)`` to re-attach, and finally calls
    ``destroy()`` on the driver's instance (also when training fails).

    All data-path methods are ``async``: the forwarder's Ray event loop must
    stay responsive while a backend call runs, so an adapter wrapping a
    blocking client must use ``asyncio.to_thread`` (or an async client).
    """

    #: Registry name, set by :meth:`RemoteBackendRegistry.register`.
    name: ClassVar[str] = ""

    # ------------------------------------------------------------ lifecycle
    @classmethod
    @abc.abstractmethod
    def from_config(cls, main_config: "DictConfig", *, handle: Optional[dict[str, Any]] = None) -> "RemoteBackend":
        """Create the backend (``handle=None``) or re-attach to an existing one.

        Called by the trainer on the Ray driver without a handle, and by each
        forwarder worker and rollout server with the dict returned by
        :meth:`reconnect_handle`. Re-attaching must never start a second engine.

        Args:
            main_config: verl's full composed config. Read only
                ``remote_backend.<name>`` plus standard fields of ``trainer``,
                ``data`` and ``actor_rollout_ref``.
            handle: ``None`` to create; otherwise a handle from ``reconnect_handle``.
        """

    @abc.abstractmethod
    def reconnect_handle(self) -> dict[str, Any]:
        """A picklable dict (Ray actor handle, address, small config) that
        re-attaches to *this* backend through ``from_config(cfg, handle=...)``."""

    @abc.abstractmethod
    def destroy(self) -> Optional[Awaitable[None]]:
        """Release the backend. Sync or async; idempotent (safe to call twice).

        The creating instance shuts the engine down; an instance that merely
        re-attached through a handle must only drop its own connection. Calls made
        afterwards raise :class:`~verl.remote_backend.reliability.BackendClosedError`,
        which the trainer reports as its own teardown, not as a backend death."""

    @abc.abstractmethod
    def requires_single_forwarder(self) -> bool:
        """True when the backend owns all parallelism itself.

        The trainer then insists on ``trainer.n_gpus_per_node * trainer.nnodes == 1``
        (one forwarder worker) and on exactly one rollout replica."""

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
    ) -> dict[str, Any]:
        """Forward-only pass of the actor (``ref=False``) or the reference model.

        Called by the forwarder's ``compute_log_prob`` / ``compute_ref_log_prob``.

        Args:
            data: the batch in the layout described in the module docstring.
            ref: use the frozen reference model instead of the actor.
            calculate_entropy: also return the per-token entropy.
            rollout_n: samples per prompt (``actor_rollout_ref.rollout.n``).
            temperature: logits are divided by it before the softmax.
            pad_token_id: the tokenizer's pad id, for backends that re-pad.

        Returns:
            ``{"model_output": {"log_probs": Tensor[T], "entropy": Tensor[T]
            (only when asked)}, "metrics": {name: float}, "device"?:
            BackendDevice dict, "timing"?: {"compute_s": float}}``; per-token
            values packed as described above. ``data`` is a ``BatchRef``
            instead of a ``TensorDict`` only for backends with
            ``accepts_batch_refs = True``.
        """

    @abc.abstractmethod
    async def update_actor(
        self,
        data: "TensorDict",
        *,
        actor_config: Any,
        pad_token_id: int,
        rollout_n: int,
        temperature: float,
    ) -> dict[str, Any]:
        """One PPO/GRPO policy update on the global batch.

        Called by the forwarder's ``update_actor``. The backend runs the
        mini-batches, epochs and optimizer steps that ``actor_config`` (verl's
        ``actor_rollout_ref.actor`` block) and the non-tensor fields of
        ``data`` (``mini_batch_size``, ``epochs``, ``seed``, ``dataloader_kwargs``)
        ask for, with verl's policy loss.

        Returns:
            ``{"loss": float (sum over mini-batches of the mean loss),
            "metrics": {name: float | list[float]} - verl's actor metric names
            without the ``actor/`` prefix (``pg_loss``, ``pg_clipfrac``,
            ``ppo_kl``, ``grad_norm``, ``lr``, ``entropy``, ...),
            "global_token_num": list[int] (tokens per sample, for MFU),
            "device"?: BackendDevice dict, "timing"?: {"compute_s": float}}``.
            ``data`` may be a ``BatchRef`` as for ``compute_log_prob``.
        """

    @abc.abstractmethod
    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
        """Sample one continuation of ``prompt_ids``.

        Called by the rollout server, once per sample and concurrently; an
        engine should batch concurrent calls.

        Args:
            prompt_ids: prompt token ids.
            sampling_params: ``max_tokens`` (int, already capped at
                ``rollout.response_length``), ``temperature`` (0 = greedy),
                ``top_p``, ``top_k`` (-1 or 0 = off), ``logprobs`` (bool),
                optionally ``repetition_penalty``.

        Returns:
            ``{"token_ids": list[int] (<= max_tokens, ends with EOS when it
            stopped there), "log_probs": list[float] | None (one per token,
            sampling distribution), "stop_reason": "completed" | "aborted"}``.
        """

    @abc.abstractmethod
    async def update_weights(self) -> Optional[dict[str, Any]]:
        """Make the sampler use the latest trained weights from the next
        ``generate`` on (a no-op when trainer and sampler share memory).
        Called by the forwarder after each update. May return
        ``{"policy_version": int, ...}``."""

    @abc.abstractmethod
    async def save_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> Optional[str]:
        """Persist model, optimizer, scheduler, RNG and step.

        Called by the forwarder's ``save_checkpoint`` with verl's actor
        checkpoint directory (``<default_local_dir>/global_step_<step>/actor``)
        and the global step. Returns the directory written, when known."""


_CAPABILITY_LOAD = "load_checkpoint"


def supports_resume(backend: RemoteBackend | type[RemoteBackend]) -> bool:
    """True when ``backend`` implements the optional ``async load_checkpoint(path, step)``."""
    fn = getattr(backend, _CAPABILITY_LOAD, None)
    return fn is not None and inspect.iscoroutinefunction(fn)


def check_backend_config(backend_cls: type[RemoteBackend], main_config: "DictConfig") -> None:
    """Run the backend's optional ``check_config(main_config)`` classmethod (no-op without one)."""
    fn = getattr(backend_cls, "check_config", None)
    if fn is not None:
        fn(main_config)


def backend_checkpoint_problem(backend_cls: type[RemoteBackend], actor_dir: str, step: Optional[int]) -> Optional[str]:
    """The backend's optional ``checkpoint_problem(actor_dir, step)`` verdict (``None`` without one)."""
    fn = getattr(backend_cls, "checkpoint_problem", None)
    return None if fn is None else fn(actor_dir, step)


_CAPABILITY_BATCH_REFS = "accepts_batch_refs"


def accepts_batch_refs(backend: RemoteBackend | type[RemoteBackend]) -> bool:
    """True when ``backend`` sets ``accepts_batch_refs = True``: its data-path ops take a
    :class:`~verl.remote_backend.batch_ref.BatchRef` as ``data`` (see the module docstring)."""
    return getattr(backend, _CAPABILITY_BATCH_REFS, False) is True


def backend_compute_seconds(result: Any) -> Optional[float]:
    """The optional ``result["timing"]["compute_s"]`` of an op result, or ``None`` when absent.

    Raises:
        ValueError: ``timing`` is present but is not ``{"compute_s": finite float >= 0}``.
    """
    if not isinstance(result, dict) or result.get("timing") is None:
        return None
    timing = result["timing"]
    value = timing.get("compute_s") if isinstance(timing, dict) else None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (seconds >= 0 and seconds != float("inf")):
        raise ValueError(f"backend result 'timing' must be {{'compute_s': seconds >= 0}}, got {timing!r}")
    return seconds
