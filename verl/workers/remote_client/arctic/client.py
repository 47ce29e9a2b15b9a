"""The ``arctic`` remote backend: verl's ``RemoteBackend`` on the published Arctic RL client.

Arctic RL (``arctic-platform`` 0.1.4) trains with DeepSpeed and samples with vLLM behind an
HTTP server (``protocol=http``, :mod:`.arctic.server_http`) or an in-process Ray server
(``protocol=ray``, :mod:`.arctic.server_ray`). :class:`ArcticBackend` maps verl's training,
sampling, weight-sync and checkpoint calls onto that client, the same way for both transports;
it is the only module that imports ``arctic_platform`` at import time.
Payload mapping, request bodies, config and the checkpoint format live in :mod:`.arctic`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Optional

import arctic_platform.client as arctic_client  # noqa: F401  (fails early with the registry's install hint)
import torch

from verl.remote_backend.base import RemoteBackend
from verl.remote_backend.errors import BackendClosedError, BackendDiedError, ConfigError, ResumeCheckpointError
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.results import BackendDevice, GenerateResult, LogProbResult, UpdateResult
from verl.remote_backend.settings.loader import select
from verl.remote_backend.transport.batch_ref import batch_field
from verl.remote_backend.update_schedule import read_update_schedule
from verl.workers.remote_client.arctic import bodies, server_ray
from verl.workers.remote_client.arctic import checkpoint as arctic_checkpoint
from verl.workers.remote_client.arctic.config import ArcticConfig, load_arctic_config
from verl.workers.remote_client.arctic.derive import (
    build_client_config,
    check_loss_compatibility,
    derive_ds_config,
    derive_vllm_config,
    log_prob_rows_per_request,
    optimizer_steps_per_global_step,
    resolved_log_prob_gpus,
)
from verl.workers.remote_client.arctic.errors import ArcticResponseError, ArcticServerError
from verl.workers.remote_client.arctic.generation import load_tokenizer, parse_result, prompt_text
from verl.workers.remote_client.arctic.launcher import ServerProcess, launch_server
from verl.workers.remote_client.arctic.metrics import aggregate_update_metrics, map_step_metrics, reduce_metric
from verl.workers.remote_client.arctic.payload import dense_to_packed, token_aligned_to_predict_next
from verl.workers.remote_client.arctic.responses import require, require_tensor
from verl.workers.remote_client.arctic.server_checks import server_problems
from verl.workers.remote_client.arctic.server_http import jobs_problem, probe_health, translate_error

if TYPE_CHECKING:
    from omegaconf import DictConfig
    from tensordict import TensorDict

logger = logging.getLogger(__name__)

__all__ = ["ArcticBackend"]

# Per-request limit of the /destroy calls made while tearing down.
_TEARDOWN_TIMEOUT_S = 30.0


@RemoteBackendRegistry.register("arctic")
class ArcticBackend(RemoteBackend):
    """verl <-> Arctic RL server. Build with :meth:`from_config` only.

    ``protocol=http``: the client's blocking ``ArcticRLClient`` run on private thread pools: its
    ``requests`` transport keeps the server's error ``detail`` (the async frontend's ``aiohttp``
    one drops it) and the event loop never blocks. ``protocol=ray``: the client's
    ``AsyncArcticRLClient`` on Arctic's own Ray transport (:mod:`.arctic.server_ray`), each op
    awaited on a worker thread's loop. Everything else (payloads, response checks, metrics,
    checkpoints) is shared. No call is retried (``fwd_bwd`` and ``step`` change the model): a
    transport error surfaces at once as an ``ArcticBackendError`` naming the op, the server and
    its detail. Only the start-up ``/health`` probe (HTTP) retries, within ``connect_timeout_s``.
    Over HTTP a server that restarted has lost this run's jobs (and may hand their ids to new
    ones): before each op on the model, after a 404/500 and in :meth:`health`, one ``GET /status``
    proves the jobs are still ours, else ``BackendDiedError``. Over Ray the jobs live in the state
    actor, which does not restart: its death is the actor's death.
    """

    def __init__(
        self,
        main_config: "DictConfig",
        cfg: ArcticConfig,
        client: Any,
        *,
        owner: bool,
        server: Optional[ServerProcess] = None,
        server_log: Optional[str] = None,
        ray_state: Any = None,
        ray_placement_groups: Optional[list[str]] = None,
    ) -> None:
        self._main = main_config
        self.cfg = cfg
        self._client = client
        self._owner = owner
        self._server = server
        # Log file of a server this backend launched (travels in the handle, for liveness errors).
        self._server_log = server_log or (server.log_path if server is not None else None)
        # protocol=ray: the server state actor's handle (None over HTTP), and the placement groups an owner frees
        self._ray_state = ray_state
        self._ray_placement_groups = list(ray_placement_groups or [])
        self._address = server_ray.describe(ray_state) if ray_state is not None else f"{cfg.host}:{cfg.port}"
        # The limit in force is the client's (a re-attached handle may carry its own).
        self._timeout_s = float(getattr(getattr(client, "config", None), "request_timeout", cfg.request_timeout_s))
        self._executor: Optional[ThreadPoolExecutor] = None  # training/control calls (one at a time)
        self._gen_executor: Optional[ThreadPoolExecutor] = None  # generate calls (many at a time)
        self._gen_concurrency = int(
            cfg.generate.max_concurrency or derive_vllm_config(main_config, cfg)["max_num_seqs"]
        )
        train_ds = derive_ds_config(main_config, cfg, n_gpus=int(cfg.training_gpus))
        self._mini_batch_rows = int(train_ds["train_batch_size"])
        self._train_gas = int(train_ds["gradient_accumulation_steps"])
        # rows of one /forward for the actor (training job) and the reference (log-prob job); None: the whole batch
        self._log_prob_rows = {ref: log_prob_rows_per_request(main_config, cfg, ref=ref) for ref in (False, True)}
        self._tokenizer = None
        # None: unknown. Arctic's pool keeps its sleep state across jobs (a sampling job destroyed asleep leaves
        # the next one asleep), so the first generate wakes it (a no-op when awake) and the first training call
        # sleeps it.
        self._sampler_awake: Optional[bool] = None
        self._wake_lock: Optional[asyncio.Lock] = None  # one wake-up for a burst of generate calls
        self._policy_version = 0
        self._log_prob_gpus = resolved_log_prob_gpus(main_config, cfg)

    # ------------------------------------------------------------ lifecycle
    @classmethod
    def from_config(cls, main_config: "DictConfig", *, handle: Optional[dict[str, Any]] = None) -> "ArcticBackend":
        """Create Arctic's jobs (driver) or re-attach to them (``handle`` from :meth:`reconnect_handle`).

        Creating: validates the config and the loss, launches the server when
        ``launch_server`` (HTTP), checks ``/health`` within ``connect_timeout_s``
        and creates the training, sampling and (when needed) log-prob jobs.
        Re-attaching reuses the job ids in the handle and creates nothing.
        """
        from arctic_platform.client import ArcticClientConfig, ArcticRLClient

        cfg = load_arctic_config(main_config)
        if (handle is None and cfg.protocol == "ray") or (isinstance(handle, dict) and "server_state" in handle):
            return cls._from_config_ray(main_config, cfg, handle)
        server: Optional[ServerProcess] = None
        if handle is None:
            cls.check_config(main_config)
            client_cfg = build_client_config(main_config, cfg)
            if cfg.launch_server:
                server = launch_server(
                    host=cfg.host,
                    port=cfg.port,
                    training_gpus=client_cfg.training_gpus,
                    sampling_gpus=client_cfg.sampling_gpus,
                    log_prob_gpus=client_cfg.log_prob_gpus,
                    colocate=cfg.colocate,
                    command=cfg.launch_command,
                    startup_timeout_s=cfg.startup_timeout_s,
                    log_dir=client_cfg.training.checkpoint_path,
                )
            server_log = None  # taken from the launched server, if any
        else:
            if not isinstance(handle, dict) or handle.get("backend") != "arctic" or "client_config" not in handle:
                raise ValueError(
                    "handle is not an arctic-backend handle (expected the dict from ArcticBackend.reconnect_handle())"
                )
            client_cfg = ArcticClientConfig.model_validate(handle["client_config"])
            server_log = handle.get("server_log")
        try:
            probe_health(cfg.host, cfg.port, cfg.connect_timeout_s)
            client = ArcticRLClient(client_cfg)
        except Exception as exc:
            if server is not None:
                server.stop()
            raise translate_error(exc, op="initialize", address=f"{cfg.host}:{cfg.port}") from exc
        return cls(main_config, cfg, client, owner=handle is None, server=server, server_log=server_log)

    @classmethod
    def _from_config_ray(
        cls, main_config: "DictConfig", cfg: ArcticConfig, handle: Optional[dict[str, Any]]
    ) -> "ArcticBackend":
        """``protocol=ray``: start Arctic's in-process Ray server and its jobs through arctic-platform's own
        Ray transport (owner), or re-attach to them with the handle's state actor and job ids."""
        from arctic_platform.client import ArcticClientConfig

        where = "Arctic's in-process Ray server"
        if handle is None:
            cls.check_config(main_config)
            client_cfg = build_client_config(main_config, cfg)
            try:
                client = server_ray.start_client(client_cfg)
                state = server_ray.server_state(client)
                groups = server_ray.placement_group_ids(state)
            except Exception as exc:
                raise server_ray.translate_error(exc, op="initialize", address=where) from exc
            return cls(main_config, cfg, client, owner=True, ray_state=state, ray_placement_groups=groups)
        if handle.get("backend") != "arctic" or "client_config" not in handle:
            raise ValueError(
                "handle is not an arctic-backend handle (expected the dict from ArcticBackend.reconnect_handle())"
            )
        client_cfg = ArcticClientConfig.model_validate(handle["client_config"])
        state = handle["server_state"]
        try:
            client = server_ray.attach_client(client_cfg, state)
        except Exception as exc:
            raise server_ray.translate_error(exc, op="initialize", address=server_ray.describe(state)) from exc
        return cls(main_config, cfg, client, owner=False, ray_state=state)

    @classmethod
    def check_config(cls, main_config: "DictConfig") -> None:
        """Refuse, before Ray starts, what Arctic's server cannot train as verl would (optional capability).

        Raises:
            ConfigError: an invalid ``remote_backend.arctic`` key, a derived DeepSpeed batch layout
                that does not divide or a ZeRO stage / dtype mix DeepSpeed refuses, a setting the server
                fails on or silently changes (:mod:`.arctic.server_checks`), or (with ``strict_loss_check``) an
                actor setting whose objective Arctic's ``verl_grpo`` loss computes differently - naming the key, the
                value and the fix.
        """
        cfg = load_arctic_config(main_config)
        derive_ds_config(main_config, cfg, n_gpus=int(cfg.training_gpus))
        unrunnable = server_problems(main_config, cfg)
        if unrunnable:  # not governed by strict_loss_check: the server fails or trains something else
            raise ConfigError(
                "Arctic RL's server cannot run these settings as verl means them: " + "; ".join(unrunnable)
            )
        problems = check_loss_compatibility(main_config, cfg)
        if problems:
            msg = "verl's actor objective differs from Arctic's server loss: " + "; ".join(problems)
            if cfg.strict_loss_check:
                raise ConfigError(msg + ". Fix the actor config or set remote_backend.arctic.strict_loss_check=false.")
            logger.warning(msg)

    @classmethod
    def checkpoint_problem(cls, actor_dir: str, step: Optional[int]) -> Optional[str]:
        """Resume validation: is verl's step ``step`` an Arctic checkpoint the server can load? (optional capability)"""
        return arctic_checkpoint.checkpoint_problem(actor_dir, step)

    def reconnect_handle(self) -> dict[str, Any]:
        """Job ids + connection settings (JSON) and the launched server's log file; with ``protocol=ray``
        also the server state actor's handle (Ray pickles it), which is all another process needs."""
        handle = {
            "backend": "arctic",
            "client_config": self._live_client().reconnect_config().model_dump(mode="json"),
            "server_log": self._server_log,
        }
        if self._ray_state is not None:
            handle["server_state"] = self._ray_state
        return handle

    async def destroy(self) -> None:
        """Owner: destroy Arctic's jobs and stop a launched server. Re-attached: close the connection only."""
        client, self._client = self._client, None
        if self._ray_state is not None:
            await self._destroy_ray(client)
            client = None
        if client is not None:
            transport = getattr(client, "transport", None)
            if hasattr(transport, "timeout"):  # teardown must not wait request_timeout_s on a hung server
                transport.timeout = min(float(transport.timeout), _TEARDOWN_TIMEOUT_S)
            try:
                if self._owner:
                    await asyncio.get_running_loop().run_in_executor(None, client.shutdown)
                else:
                    client.transport.session.close()
            except Exception as exc:  # destroy runs in `finally` blocks: report, do not mask the first error
                logger.warning(
                    "arctic: tearing down the client failed: %s",
                    translate_error(exc, op="destroy", address=self._address),
                )
        if self._server is not None:
            self._server.stop()
            self._server = None
        for executor in (self._executor, self._gen_executor):
            if executor is not None:
                executor.shutdown(wait=False, cancel_futures=True)
        self._executor = self._gen_executor = None

    async def _destroy_ray(self, client: Any) -> None:
        """Owner: Arctic's transport destroys the jobs, then the state actor and its placement groups go.
        Re-attached: Arctic's transport only closes its loop (it never destroys the jobs); nothing is killed."""
        if client is not None:
            try:
                # Arctic's transport runs the job teardown on its own loop: call it from a thread without one
                await asyncio.wait_for(
                    asyncio.get_running_loop().run_in_executor(None, client.transport.shutdown), _TEARDOWN_TIMEOUT_S
                )
            except Exception as exc:  # destroy runs in `finally` blocks: report, do not mask the first error
                logger.warning(
                    "arctic: tearing down the client failed: %s",
                    server_ray.translate_error(exc, op="destroy", address=self._address, timeout_s=_TEARDOWN_TIMEOUT_S),
                )
        if self._owner and self._ray_state is not None:
            groups, self._ray_placement_groups = self._ray_placement_groups, []
            await asyncio.get_running_loop().run_in_executor(None, server_ray.stop_server, self._ray_state, groups)

    @classmethod
    def requires_single_forwarder(cls) -> bool:
        return True  # Arctic owns training/sampling parallelism; verl runs one CPU forwarder

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
        """``fwd_no_grad`` on the training job (actor) or the log-prob job (``ref``); packed ``[T]`` back."""
        op = "compute_ref_log_prob" if ref else "compute_log_prob"
        if ref and self._log_prob_gpus == 0:
            raise ConfigError("reference log-probs were requested but remote_backend.arctic.log_prob_gpus=0")
        batch = bodies.dense_batch(data, pad_token_id=pad_token_id, drop_position_ids=self.cfg.drop_position_ids)
        mask = batch["attention_mask"]
        meta = self._meta(data, rollout_n, temperature, calculate_entropy, pad_token_id)
        count = self._log_prob_gpus if ref else self.cfg.training_gpus
        await self._ensure_jobs(op)
        # smallest request the job can split: one row per DeepSpeed rank and accumulation step
        min_rows = count if ref else self._train_gas * int(self.cfg.training_gpus)
        await self._sleep_sampler()
        outs, per_request = [], []
        for rows in bodies.row_chunks(mask.shape[0], self._log_prob_rows[ref], min_rows=max(1, min_rows)):
            chunk = {k: v[rows] for k, v in batch.items()}
            resp = await self._call(
                "fwd_no_grad",
                {"batch": chunk, "meta": meta},
                processing=bodies.forward_processing(),
                reference_model=ref,
                op=op,
            )
            outs.append(require(resp, "batch", op=op))
            per_request.append(map_step_metrics({k: v for k, v in (resp.get("metrics") or {}).items() if k != "loss"}))
        out = {k: torch.cat([o[k] for o in outs]) for k in ("logprobs", "entropy") if all(k in o for o in outs)}
        if self.cfg.zorro.train:  # ZoRRo answers token-aligned (column t = log p(token t)); verl wants predict-next
            out = {k: token_aligned_to_predict_next(v) for k, v in out.items()}
        metrics = {
            k: float(sum(v) / len(v)) for k, v in aggregate_update_metrics(per_request).items() if isinstance(v, list)
        }
        return LogProbResult(
            log_probs=self._packed(out, "logprobs", mask, op),
            entropy=self._packed(out, "entropy", mask, op) if calculate_entropy else None,
            metrics=metrics,
            device=self._device(count),
        )

    async def update_actor(
        self, data: "TensorDict", *, actor_config: Any, pad_token_id: int, rollout_n: int, temperature: float
    ) -> UpdateResult:
        """verl's PPO loop on Arctic: one ``fwd_bwd`` + ``step`` per optimizer step of the shared
        update schedule (:mod:`verl.remote_backend.update_schedule`), epochs x mini-batches."""
        op = "update_actor"
        get = functools.partial(select, actor_config)
        schedule = read_update_schedule(data, actor_config=actor_config, rollout_n=rollout_n)
        entropy = batch_field(data, "calculate_entropy")
        entropy = bool(float(get("entropy_coeff", 0.0) or 0.0) != 0.0 if entropy is None else entropy)
        meta = self._meta(data, rollout_n, temperature, entropy, pad_token_id)
        if schedule.mini_batch_size != self._mini_batch_rows:
            raise ConfigError(
                f"verl sent PPO mini-batches of {schedule.mini_batch_size} samples, "
                "but Arctic's DeepSpeed job was created for "
                f"{self._mini_batch_rows} samples per optimizer step (actor_rollout_ref.actor.ppo_mini_batch_size x "
                "rollout.n); the server would split them into the wrong micro-batches. Fix: keep "
                "ppo_mini_batch_size and rollout.n as they were when the backend started"
            )
        minibatches = bodies.update_minibatches(
            data,
            arctic=self.cfg,
            actor_config=actor_config,
            meta=meta,
            pad_token_id=pad_token_id,
            use_kl_loss=bool(get("use_kl_loss", False)),
            schedule=schedule,
        )
        await self._ensure_jobs(op)
        await self._sleep_sampler()
        losses, per_mb = [], []
        processing = bodies.update_processing(self.cfg.loss_fn)
        for mb in minibatches:
            fb = await self._call("fwd_bwd", mb.body, processing=processing, op=f"{op} (forward-backward)")
            st = await self._call("step", op=f"{op} (optimizer step)")
            fb_metrics = require(fb, "metrics", op=op, where="forward-backward response", kind=dict)
            loss = reduce_metric(fb_metrics.get("loss", fb.get("avg_loss")))
            if loss is None:
                raise ArcticResponseError(
                    f"Arctic {op}: forward-backward response has neither metrics.loss nor avg_loss"
                )
            losses.append(loss)
            step_metrics = require(st, "metrics", op=op, where="step response", kind=dict)
            per_mb.append({**map_step_metrics(fb_metrics), **map_step_metrics(step_metrics)})
        return UpdateResult(
            metrics=aggregate_update_metrics(per_mb),
            loss=float(sum(losses)),
            global_token_num=data["input_ids"].offsets().diff().tolist(),
            device=self._device(self.cfg.training_gpus),
        )

    async def generate(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenerateResult:
        """One sample through Arctic's text-prompt ``/generate``; token ids in, token ids out.

        The prompt is decoded to text and the decode is proven to re-tokenize to
        the same ids (as the server tokenizes it) before sending; otherwise
        :class:`PromptRoundTripError`. The completion comes back as the sampler's
        own ``token_ids``, never re-tokenized.
        """
        if sampling_params.get("max_tokens") is None:
            raise ValueError(
                "generate: sampling_params['max_tokens'] is required "
                "(the rollout server caps it at rollout.response_length)"
            )
        ids = [int(t) for t in prompt_ids]
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._main)
        text = prompt_text(self._tokenizer, ids, add_special_tokens=self.cfg.generate.add_special_tokens)
        want_logprobs = bool(sampling_params.get("logprobs", False))
        params = {
            "max_tokens": int(sampling_params["max_tokens"]),
            "temperature": float(sampling_params.get("temperature", 1.0)),
            "top_p": float(sampling_params.get("top_p", 1.0)),
            "top_k": int(sampling_params.get("top_k", -1) or -1),
            "logprobs": 0 if want_logprobs else None,
        }
        if sampling_params.get("repetition_penalty") is not None:
            params["repetition_penalty"] = float(sampling_params["repetition_penalty"])
        if sampling_params.get("seed") is not None:
            params["seed"] = int(sampling_params["seed"])  # vLLM's per-request random stream
        await self._wake_sampler()
        results = await self._call("generate", [text], params, op="generate", concurrent=True)
        if not isinstance(results, list) or len(results) != 1:
            raise ArcticResponseError(
                f"Arctic generate: expected a list with 1 result, got {type(results).__name__} {results!r:.200}"
            )
        result = results[0]
        return parse_result(result, want_logprobs=want_logprobs, wire="ray" if self._ray_state is not None else "http")

    async def update_weights(self) -> dict[str, Any]:
        """``sync_weights``: wakes the sampler, pushes the trained weights, resets its prefix cache."""
        await self._ensure_jobs("update_weights")
        await self._empty_training_cache("update_weights")
        await self._call("sync_weights", op="update_weights")
        self._sampler_awake = True
        self._policy_version += 1
        return {"policy_version": self._policy_version}

    async def save_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> Optional[str]:
        """DeepSpeed checkpoint (weights, optimizer, scheduler, step) in ``<path>/checkpoint-<step>``; the
        server's reported ``global_step`` is recorded beside it (:mod:`.arctic.checkpoint`) for resume."""
        await self._ensure_jobs("save_checkpoint")
        resp = await self._call(
            "save_checkpoint", path=path, step=step, export_hf=self.cfg.export_hf, op="save_checkpoint"
        )
        if path is not None:
            arctic_checkpoint.write_record(path, step, resp)
        return resp.get("path") if isinstance(resp, dict) else None

    async def load_checkpoint(self, path: Optional[str] = None, step: Optional[int] = None) -> None:
        """Restore ``<path>/checkpoint-<step>``, prove the server restored it, then sync the sampler.

        Raises:
            ResumeCheckpointError: the server reports a DeepSpeed ``global_step`` other than the one
                recorded when verl's ``step`` was saved (or, without a record, ``step`` x optimizer
                steps per verl step) - including its HTTP 200 with ``global_step: 0`` when DeepSpeed
                found nothing to load.
        """
        resp = await self._call("load_checkpoint", path, step=step, op="load_checkpoint")
        got = resp.get("global_step") if isinstance(resp, dict) else None
        if step is not None:
            expected = arctic_checkpoint.recorded_engine_step(path, step) if path is not None else None
            if expected is None:
                expected = int(step) * optimizer_steps_per_global_step(self._main)
            if got is None or int(got) != expected:
                where = resp.get("path") if isinstance(resp, dict) else None
                raise ResumeCheckpointError(
                    f"Arctic RL server at {self._address} did not restore verl's step {step} from {where or path}: it "
                    f"reports DeepSpeed global_step={got}, expected {expected} (global_step 0 means DeepSpeed found "
                    "nothing to load and the model kept its initial weights). Check that the server sees "
                    "trainer.default_local_dir, or resume from another checkpoint with trainer.resume_mode=resume_path "
                    "trainer.resume_from_path=<global_step_N folder>, or start over with trainer.resume_mode=disable"
                )
        logger.info(
            "arctic: restored %s (DeepSpeed global_step %s)", resp.get("path") if isinstance(resp, dict) else path, got
        )
        await self.update_weights()

    # ------------------------------------------------------------ liveness (optional capabilities)
    async def health(self) -> None:
        """One call on the server state actor (Ray), or one ``GET /status`` (HTTP), no retry: the caller's
        watchdog decides. Raises when the server does not answer, or (HTTP) answers without this run's jobs
        (it restarted: :meth:`_jobs_problem`)."""
        if self._ray_state is not None:
            limit = self._probe_limit()
            try:
                await asyncio.to_thread(server_ray.probe_health, self._ray_state, limit)
            except Exception as exc:
                raise server_ray.translate_error(exc, op="health", address=self._address, timeout_s=limit) from exc
            return
        try:
            problem = await asyncio.to_thread(self._jobs_problem)
        except BackendClosedError:
            raise
        except Exception as exc:
            raise translate_error(
                exc,
                op="health",
                address=self._address,
                timeout_s=self._probe_limit(),
                timeout_key="remote_backend.arctic.connect_timeout_s",
            ) from exc
        if problem is not None:
            raise self._lost_state("health", problem)

    def log_location(self) -> str:
        """The launched server's log file, or where an attached server's logs are."""
        if self._ray_state is not None:
            return server_ray.log_location(self._ray_state)
        if self._server_log:
            return f"{self._server_log} (Arctic RL server at {self._address})"
        return f"the Arctic RL server's own logs at {self._address} (it was started outside verl)"

    # ------------------------------------------------------------ helpers
    def _live_client(self) -> Any:
        if self._client is None:
            raise BackendClosedError("the arctic backend was destroyed")
        return self._client

    async def _call(self, method: str, *args: Any, op: str, concurrent: bool = False, **kwargs: Any) -> Any:
        """Run ``client.<method>`` on a worker thread (the generate pool when ``concurrent``); translate failures.
        Ray: the async client's coroutine, awaited on that thread's own loop, within ``request_timeout_s``."""
        client = self._live_client()
        if self._ray_state is not None:
            call = functools.partial(server_ray.run_op, client, method, *args, **kwargs)
        else:
            call = functools.partial(getattr(client, method), *args, **kwargs)
        return await self._run(call, op=op, concurrent=concurrent)

    async def _run(self, call: Any, *, op: str, concurrent: bool = False) -> Any:
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool(concurrent), call)
            if self._ray_state is None:  # HTTP: requests enforces request_timeout_s itself
                return await future
            return await asyncio.wait_for(future, self._timeout_s)
        except Exception as exc:
            if self._ray_state is not None:
                raise server_ray.translate_error(exc, op=op, address=self._address, timeout_s=self._timeout_s) from exc
            error = translate_error(exc, op=op, address=self._address, timeout_s=self._timeout_s)
            # a fresh server answers a job it does not hold with 404 ("Job N not found"), or 500 from /forward
            if isinstance(error, ArcticServerError) and error.status in (404, 500):
                await self._ensure_jobs(op)
            raise error from exc

    def _probe_limit(self) -> float:
        return min(float(self.cfg.connect_timeout_s), _TEARDOWN_TIMEOUT_S)

    def _jobs_problem(self) -> Optional[str]:
        """One ``GET /status``: what is missing or foreign among this client's jobs (``None``: all there).
        Raises when the server does not answer."""
        import requests

        client = self._live_client()
        resp = requests.get(f"http://{self._address}/status", timeout=self._probe_limit())
        resp.raise_for_status()
        jobs = {t: getattr(client.transport.jobs, t, None) for t in ("training", "sampling", "log_prob")}
        training_root = getattr(getattr(client.config, "training", None), "checkpoint_path", None)
        return jobs_problem(resp.json(), jobs, training_root)

    async def _ensure_jobs(self, op: str) -> None:
        """Before an op on the model, and after a 404/500: a server that restarted (a fresh process on the
        same address) has lost this run's jobs and state; nothing may be sent to it as if it were ours.
        A server that does not answer here is left to the op's own call and time limit. Ray: nothing to check
        (the jobs live in the state actor; the actor's death surfaces as itself)."""
        if self._ray_state is not None:
            return
        try:  # on the op's own pool, like its calls (a thread left blocked by a silent server is the pool's)
            problem = await asyncio.get_running_loop().run_in_executor(self._pool(False), self._jobs_problem)
        except BackendClosedError:
            raise
        except Exception as exc:  # noqa: BLE001 - not the check's to report: the op itself will
            logger.debug("arctic: job check before %s skipped: %s", op, exc)
            return
        if problem is not None:
            raise self._lost_state(op, problem)

    def _lost_state(self, op: str, problem: str) -> BackendDiedError:
        return BackendDiedError(
            op=op,
            backend="arctic",
            logs=self.log_location(),
            cause=(
                f"the Arctic RL server at {self._address} no longer holds this run's jobs ({problem}): it has "
                "restarted (or the jobs were destroyed), and this run's weights, optimizer and sampler state went "
                "with it; nothing is sent to the fresh server"
            ),
        )

    async def _empty_training_cache(self, op: str) -> None:
        """Colocated: release the training job's cached accelerator memory before vLLM wakes on the same GPUs.

        Arctic's Ray server does this inside its ``wake_inference`` (so nothing is added for ``protocol=ray``);
        over HTTP ``/wake-inference`` and ``/weight-sync`` do not, and the client has no call for
        ``/empty-training-cache``, so it is posted here.
        """
        if not self.cfg.colocate or self._ray_state is not None:
            return
        transport = self._live_client().transport
        url, job_id = f"{transport.base_url}/empty-training-cache", getattr(transport.jobs, "training", None)

        def post() -> None:
            transport.session.post(url, params={"job_id": job_id}, timeout=transport.timeout).raise_for_status()

        await self._run(post, op=f"{op} (emptying the training job's cache)")

    def _pool(self, concurrent: bool) -> ThreadPoolExecutor:
        """Training/control calls share a small pool; ``generate`` gets one (and as many pooled HTTP
        connections) as large as ``generate.max_concurrency``, by default the sampler's
        ``max_num_seqs``, so concurrent rollouts reach vLLM as one batch."""
        if not concurrent:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(2, thread_name_prefix="arctic")
            return self._executor
        if self._gen_executor is None:
            if self._ray_state is None:
                import requests.adapters

                # as many pooled HTTP connections as requests in flight (requests' default keeps 10)
                adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=self._gen_concurrency)
                self._live_client().transport.session.mount("http://", adapter)
            self._gen_executor = ThreadPoolExecutor(self._gen_concurrency, thread_name_prefix="arctic-generate")
        return self._gen_executor

    async def _wake_sampler(self) -> None:
        """Wake a sampler this instance put to sleep: a generate may follow a training call
        without an update_weights between them (the weights have not changed)."""
        if self._sampler_awake is True:
            return
        if self._wake_lock is None:
            self._wake_lock = asyncio.Lock()
        async with self._wake_lock:
            if self._sampler_awake is not True:
                await self._empty_training_cache("generate")
                await self._call("wake_inference", op="generate (waking the sampler)")
                self._sampler_awake = True

    async def _sleep_sampler(self) -> None:
        """Colocated: free the sampler's GPU memory before training work (update_weights wakes it)."""
        if (
            self.cfg.colocate
            and self.cfg.weight_sync.sleep_sampler_during_training
            and self._sampler_awake is not False
        ):
            await self._call("sleep_inference", level=1, op="sleep_inference")
            self._sampler_awake = False

    def _meta(self, data: "TensorDict", rollout_n: int, temperature: float, entropy: bool, pad_token_id: int) -> dict:
        prompts, mask = data["prompts"], data["attention_mask"]
        response_width = mask.shape[1] - prompts.shape[1]
        built = float(select(self._main, "actor_rollout_ref.rollout.temperature", 1.0))
        if self.cfg.zorro.train and abs(float(temperature) - built) > 1e-12:
            # ZoRRo's patched model applies the temperature it was built with (derive_ds_worker_config), not the call's
            raise ConfigError(
                f"remote_backend.arctic.zorro.train=true: this call asks for temperature={temperature}, but ZoRRo's "
                f"model on the server was built with actor_rollout_ref.rollout.temperature={built} and ignores a "
                "per-call temperature. "
                "Fix: keep the call's temperature equal to rollout.temperature, or set zorro.train=false"
            )
        zorro_width = int(select(self._main, "data.max_response_length", response_width))
        if self.cfg.zorro.train and response_width != zorro_width:
            # ZoRRo's model was built for response_len = data.max_response_length (derive_ds_worker_config)
            raise ConfigError(
                f"remote_backend.arctic.zorro.train=true needs batches whose response width equals "
                f"data.max_response_length={zorro_width}, got {response_width}; keep rollout.response_length "
                "equal to data.max_response_length, or set zorro.train=false"
            )
        return bodies.base_meta(
            self.cfg,
            rollout_n=rollout_n,
            temperature=temperature,
            calculate_entropy=entropy,
            pad_token_id=pad_token_id,
            max_prompt_len=prompts.shape[1],
            max_response_len=mask.shape[1] - prompts.shape[1],
            max_token_len_per_gpu=int(select(self._main, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", 16384)),
        )

    def _packed(self, out: dict, key: str, mask: Any, op: str) -> Any:
        dense = require_tensor(out, key, tuple(mask.shape), op=op)
        try:
            return dense_to_packed(dense, mask, name=f"response.batch.{key}")
        except ValueError as exc:
            raise ArcticResponseError(f"Arctic {op}: {exc}") from exc

    def _device(self, count: int) -> BackendDevice:
        d = self.cfg.device
        return BackendDevice(type=d.type, count=max(1, int(count)), peak_flops=d.peak_flops, name=d.name)
