"""``LocalBackend``: the client of the ``local`` engine (``trainer.remote_backend=local``).

The engine (:mod:`.local`) is one Ray actor owning the actor model, its optimizer, an
optional frozen reference and a batched KV-cache sampler on one device. This client awaits
the matching actor method for each contract call and turns the actor's transport dicts into
the contract's typed results. The creating client kills the actor in ``destroy``; a
re-attached one only drops its reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from verl.remote_backend.base import RemoteBackend
from verl.remote_backend.errors import BackendClosedError, ConfigError
from verl.remote_backend.launch.failure_report import ray_log_dir
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.results import GenerateResult, LogProbResult, UpdateResult
from verl.remote_backend.settings.loader import load_settings, select
from verl.remote_backend.transport.batch_ref import BatchRef
from verl.remote_backend.transport.wire import to_wire
from verl.workers.remote_client.local import checkpoint as local_checkpoint
from verl.workers.remote_client.local.config import CONFIG_KEY, EngineSettings, LocalBackendConfig
from verl.workers.remote_client.local.malloc import engine_malloc_env

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from tensordict import TensorDict

__all__ = ["LocalBackend"]

_HANDLE_KIND = "local"
# Tensor fields the forward pass needs; compute_log_prob ships only these to the engine.
_FORWARD_KEYS = ("input_ids", "position_ids")


@RemoteBackendRegistry.register("local")
class LocalBackend(RemoteBackend):
    """Client of one local engine actor. Build with :meth:`from_config`, never directly."""

    #: The forwarder may hand over a BatchRef, whose object reference goes to the engine
    #: actor as is - the batch is deserialised only there.
    accepts_batch_refs = True

    def __init__(self, actor: Any, *, owner: bool, info: dict[str, Any]) -> None:
        self._actor = actor
        self._owner = owner
        self._info = dict(info)
        self._destroyed = False
        # (actor block, its ActorConfig): building the dataclass through hydra takes ~0.1 s, and
        # the forwarder passes the same (never mutated) actor block on every update.
        self._actor_config_cache: Optional[tuple[Any, Any]] = None

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def check_config(cls, main_config: "DictConfig") -> None:
        """Before Ray starts (optional capability): ``remote_backend.local.*``, and a GPU for ``device=cuda``.

        A run that starts its own Ray cluster (no ``ray_kwargs.ray_init.address``) on a machine
        without a visible CUDA device would otherwise wait for Ray's autoscaler to find a GPU
        that does not exist. A joined cluster (its GPUs are elsewhere) is checked by
        :meth:`from_config`, as soon as Ray is up.

        Raises:
            ConfigError: naming the key, the value and the fix.
        """
        if (
            load_settings(LocalBackendConfig, main_config, CONFIG_KEY).device != "cuda"
        ):  # the model path is the engine's to check
            return
        if select(main_config, "ray_kwargs.ray_init.address"):
            return
        import torch

        if torch.cuda.device_count() == 0:
            raise ConfigError(
                "remote_backend.local.device='cuda': this machine has no visible CUDA GPU (torch.cuda.device_count() "
                "is 0) and the run starts its own Ray cluster here, so the engine would wait for a GPU that never "
                "comes. Fix: set remote_backend.local.device=cpu, or run where a GPU is visible (CUDA_VISIBLE_DEVICES)"
            )

    @classmethod
    def rollout_log_prob_problem(cls, main_config: "DictConfig") -> Optional[str]:
        """The sampler decodes with the trainer's weights (shared, or copied at every
        ``update_weights``) and returns ``log_softmax(logits / T)`` of the full vocabulary before
        top-k/top-p, which is what ``compute_log_prob`` computes at ``T``: the same computation
        (a KV-cache decode against one packed forward: float32 noise, 4.8e-7 measured by the
        conformance kit) unless the two run in different precisions."""
        cfg = load_settings(LocalBackendConfig, main_config, CONFIG_KEY)
        if cfg.sampler_dtype not in (None, cfg.dtype):
            return (
                f"{CONFIG_KEY}.sampler_dtype={cfg.sampler_dtype} samples in another precision than the trainer's "
                f"{CONFIG_KEY}.dtype={cfg.dtype}"
            )
        if cfg.autocast_dtype is not None:
            return (
                f"{CONFIG_KEY}.autocast_dtype={cfg.autocast_dtype} runs the trainer's forward under autocast, "
                "the sampler's not"
            )
        return None

    @classmethod
    def checkpoint_problem(cls, actor_dir: str, step: Optional[int]) -> Optional[str]:
        """Resume validation (optional capability): does ``actor_dir`` match its manifest, file by file?"""
        return local_checkpoint.checkpoint_problem(actor_dir, step)

    @classmethod
    def from_config(cls, main_config: "DictConfig", *, handle: Optional[dict[str, Any]] = None) -> "LocalBackend":
        """Start the engine actor (``handle=None``) or attach to the one ``handle`` names.

        Raises:
            ConfigError: invalid ``remote_backend.local.*`` keys or a missing/invalid
                ``actor_rollout_ref.model.path`` (checked before the actor starts),
                or a model the engine cannot load.
            RuntimeError: Ray is not initialised (the trainer calls ``ray.init`` first).
            ValueError: ``handle`` is not a local-backend handle.
        """
        if handle is not None:
            if not isinstance(handle, dict) or handle.get("backend") != _HANDLE_KIND or "actor" not in handle:
                raise ValueError(
                    "handle is not a local-backend handle (expected the dict from LocalBackend.reconnect_handle())"
                )
            return cls(handle["actor"], owner=False, info=handle.get("info", {}))

        settings = EngineSettings.from_main_config(main_config)
        import ray

        from verl.workers.remote_client.local.actor import remote_engine_class

        if not ray.is_initialized():
            raise RuntimeError("LocalBackend.from_config needs a running Ray session: call ray.init() first")
        cfg = settings.backend
        options: dict[str, Any] = {"num_cpus": cfg.num_cpus, "max_concurrency": 1000}
        if cfg.device == "cuda":
            options["num_gpus"] = 1
            # A joined cluster is only known now: refuse rather than wait for a GPU it lacks.
            gpus = ray.cluster_resources().get("GPU", 0)
            if gpus < 1:
                raise ConfigError(
                    "remote_backend.local.device='cuda': the engine would be waiting for 1 GPU that the Ray cluster "
                    f"does not have (cluster resources: {_resource_summary(ray.cluster_resources())}). Fix: set "
                    "remote_backend.local.device=cpu, or join a cluster with a GPU node (ray_kwargs.ray_init.address)"
                )
        options["runtime_env"] = {"env_vars": engine_malloc_env(cfg.heap_keep_free_bytes)}
        actor = remote_engine_class().options(**options).remote(settings)
        try:
            info = ray.get(actor.info.remote())
        except ray.exceptions.RayError as exc:
            ray.kill(actor, no_restart=True)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None  # e.g. ConfigError naming actor_rollout_ref.model.path
            raise RuntimeError(f"the local backend engine failed to start: {exc}") from exc
        return cls(actor, owner=True, info={**info, "ray_log_dir": ray_log_dir()})

    def reconnect_handle(self) -> dict[str, Any]:
        """``{"backend": "local", "actor": <Ray actor handle>, "info": {...}}`` - picklable."""
        if self._destroyed:
            raise RuntimeError("this LocalBackend was destroyed; it has no engine to reconnect to")
        return {"backend": _HANDLE_KIND, "actor": self._actor, "info": dict(self._info)}

    async def destroy(self) -> None:
        """Kill the engine if this client created it; otherwise only forget it. Idempotent."""
        if self._destroyed:
            return
        self._destroyed = True
        actor, self._actor = self._actor, None
        if self._owner and actor is not None:
            import ray

            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # already dead, or Ray shut down: nothing left to release
                pass

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        return True

    @property
    def info(self) -> dict[str, Any]:
        """Engine facts captured at start: model path, device, max_model_len, eos/pad ids, ..."""
        return dict(self._info)

    # ------------------------------------------------------------ data path
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
        if isinstance(data, BatchRef):
            payload = data.ref  # a top-level argument: Ray resolves it in the engine's process
        else:
            # the wire format sends each tensor's own elements (the selected fields may be views
            # into a larger received batch, whose whole storage a torch pickle would drag along)
            payload = to_wire(data.select(*[k for k in _FORWARD_KEYS if k in data.keys()]))
        result = await _unwrap(
            self._live().compute_log_prob.remote(
                payload, ref=ref, calculate_entropy=calculate_entropy, temperature=temperature
            )
        )
        return result.to_result()  # the engine sends numpy (local/transport.py)

    async def update_actor(
        self,
        data: "TensorDict",
        *,
        actor_config: Any,
        pad_token_id: int,
        rollout_n: int,
        temperature: float,
    ) -> UpdateResult:
        cfg = self._actor_config(actor_config)  # config errors surface here, before data travels
        payload = data.ref if isinstance(data, BatchRef) else to_wire(data)
        return await _unwrap(self._live().update_actor.remote(payload, actor_config=cfg, temperature=temperature))

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenerateResult:
        return await _unwrap(self._live().generate.remote(list(prompt_ids), dict(sampling_params or {})))

    async def update_weights(self) -> dict[str, Any]:
        return await _unwrap(self._live().update_weights.remote())

    async def save_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> Optional[str]:
        if path is None:
            raise ValueError("the local backend needs a checkpoint directory: save_checkpoint(path, step)")
        return await _unwrap(self._live().save_checkpoint.remote(path, step))

    async def load_checkpoint(self, path: str, step: Optional[int] = None) -> None:
        """Resume: restore model, optimizer, LR schedule, RNG and counters from ``path``."""
        await _unwrap(self._live().load_checkpoint.remote(path, step))

    async def health(self) -> None:
        """Liveness probe: returns when the engine actor answers, raises when it is gone."""
        await _unwrap(self._live().info.remote())

    def log_location(self) -> str:
        """Where the engine actor's output goes (its Ray worker log files)."""
        pid = self._info.get("pid", "?")
        log_dir = self._info.get("ray_log_dir") or "<ray session dir>/logs"
        return f"the engine actor's Ray worker logs (pid {pid}): {log_dir}/worker-*-{pid}.out and .err"

    def _actor_config(self, actor_config: Any) -> Any:
        """verl's ``ActorConfig`` for ``actor_config``, converted once per distinct block object."""
        from verl.workers.remote_client.local.objective import to_actor_config

        cached = self._actor_config_cache
        if cached is None or cached[0] is not actor_config:
            cached = self._actor_config_cache = (actor_config, to_actor_config(actor_config))
        return cached[1]

    def _live(self) -> Any:
        if self._destroyed or self._actor is None:
            raise BackendClosedError("this LocalBackend was destroyed; create or re-attach a new one")
        return self._actor


def _resource_summary(resources: dict[str, float]) -> str:
    shown = {k: v for k, v in resources.items() if k in ("CPU", "GPU", "memory") or k.endswith("GPU")}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(shown.items())) or "none"


async def _unwrap(ref: Any) -> Any:
    """Await a Ray call; re-raise the engine's own user-facing error (bad input, config,
    checkpoint) instead of Ray's wrapper, so callers see e.g. a plain ``ValueError``."""
    import ray

    try:
        return await ref
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, (ValueError, KeyError, TypeError, RuntimeError)) and not isinstance(
            cause, ray.exceptions.RayError
        ):
            raise cause from None
        raise
