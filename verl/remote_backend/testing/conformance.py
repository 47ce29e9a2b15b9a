"""The adapter conformance kit: does a registered backend honour the ``RemoteBackend`` contract?

It builds the backend as the trainer does (``from_config`` on the driver, re-attached copies in
other Ray processes), drives it with verl-shaped batches on a small model, and reports one
:class:`CheckResult` per check: the measured value next to what the contract says. A check
that needs an earlier one which failed is skipped, so a broken adapter fails the check meant
to catch it, not a cascade. Run it with ``python -m verl.remote_backend.testing``.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

import torch

from verl.remote_backend.base import (
    RemoteBackend,
    accepts_batch_refs,
    implements,
    supports_health,
    supports_resume,
)
from verl.remote_backend.errors import BackendClosedError
from verl.remote_backend.forwarder.metrics import metric_scalar
from verl.remote_backend.forwarder.output_checks import check_log_prob_output
from verl.remote_backend.launch.secrets import declared_secrets
from verl.remote_backend.registry import RemoteBackendRegistry
from verl.remote_backend.reliability.policy import is_retryable
from verl.remote_backend.results import GenerateResult, LogProbResult, UpdateResult
from verl.remote_backend.testing.batches import dense_rollout_batch, to_no_padding

__all__ = ["KitOptions", "CheckResult", "ConformanceReport", "run_conformance", "kit_config", "CHECKS"]

#: the kit's defaults, before the user's overrides: two responses per prompt in one mini-batch
#: (an update = one optimizer step on 2 rows) and a learning rate at which one step is measurable
KIT_DEFAULTS = (
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=1",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "data.max_prompt_length=64",
    "data.max_response_length=32",
    "actor_rollout_ref.rollout.response_length=32",
)

PASS, FAIL, SKIP, UNSUPPORTED = "pass", "fail", "skip", "unsupported"

#: every check, in report order: name -> (what the contract says, checks it needs)
CHECKS: dict[str, tuple[str, tuple[str, ...]]] = {
    "1.methods": (
        "all nine methods implemented; the data path, update_weights, save_checkpoint and destroy async; "
        "from_config and requires_single_forwarder classmethods",
        (),
    ),
    "1.handle": ("reconnect_handle() pickles and is small (< 64 KiB)", ()),
    "1.reattach": (
        "an instance re-attached in another Ray process reaches the same engine (same log-probs)",
        ("3.repeat",),
    ),
    "1.attached-destroy": (
        "destroy() of a re-attached instance leaves the engine running and closes that instance "
        "(its later calls raise BackendClosedError); calling it twice is fine",
        (),
    ),
    "1.destroy": ("destroy() is idempotent; later calls raise BackendClosedError", ()),
    "1.owner-destroy": (
        "destroy() of the creating instance shuts the engine down: "
        "a client re-attached before it can no longer compute",
        (),
    ),
    "2.layout": ("LogProbResult of float tensors, packed [T] (or NJT), finite, last slot of each row 0", ()),
    "2.entropy": ("entropy returned when asked, finite and >= 0 on response slots", ("2.layout",)),
    "2.alignment": (
        "compute_log_prob at temperature t equals generate's log-probs of the same tokens at t "
        "(slot i = log p(token i+1 | <= i))",
        ("2.layout", "5.logprobs"),
    ),
    "3.repeat": ("the same batch twice gives the same log-probs", ("2.layout",)),
    "3.reorder": ("rows in another order give the same per-row log-probs", ("3.repeat",)),
    "3.split": ("the batch sent in two halves gives the same per-row log-probs", ("3.repeat",)),
    "4.metrics": ("UpdateResult with finite metrics including pg_loss and grad_norm", ("2.layout",)),
    "4.direction": (
        "one update raises the log-probs of the positive-advantage response and lowers the negative one",
        ("2.layout", "4.metrics"),
    ),
    "4.sampler-follows": (
        "after update_weights the sampler's log-probs change and equal the trainer's",
        ("4.metrics", "2.alignment"),
    ),
    "5.max-tokens": ("generate never returns more than max_tokens tokens", ()),
    "5.vocab": ("generated ids are ints inside the model's vocabulary", ()),
    "5.logprobs": ("one finite log-prob per token when asked", ()),
    "5.eos": ("generation stops at EOS: EOS only as the last token", ()),
    "5.concurrent": ("concurrent generate calls all complete", ()),
    "6.resume": (
        "save -> new engine -> load restores log-probs and the next update",
        ("2.layout", "4.metrics", "3.repeat"),
    ),
    "7.missing-key": (
        "a batch without a required key raises a plain exception that survives pickling, not retried",
        (),
    ),
    "7.wrong-dtype": ("a batch with float token ids raises a plain exception that survives pickling, not retried", ()),
    "8.capabilities": (
        "optional capabilities that are present work (health, log_location, batch refs, sleep/wake, device, timing, "
        "secret_settings)",
        ("2.layout",),
    ),
}


@dataclass
class KitOptions:
    """Tolerances and sizes of the kit (defaults suit float32 engines; loosen for bf16)."""

    alignment_tolerance: float = 1e-3  # max |sampler - trainer| log-prob, same tokens and temperature
    batch_tolerance: float = 1e-5  # max |difference| between two batchings of the same rows
    temperature: float = 1.0  # of the alignment and follow-the-update checks
    max_tokens: int = 8  # per generate call
    concurrent_requests: int = 16
    call_timeout_s: float = 120.0  # per backend call; a call past it fails its check
    checks: Optional[Sequence[str]] = None  # run only these (and report the rest as skipped)


@dataclass
class CheckResult:
    """One line of the report."""

    check: str
    status: str  # pass | fail | skip | unsupported
    detail: str

    @property
    def contract(self) -> str:
        return CHECKS[self.check][0]

    def line(self) -> str:
        text = f"{self.status.upper():<11} {self.check:<19} {self.detail}"
        return text if self.status != FAIL else f"{text}\n{'':<31} contract: {self.contract}"


@dataclass
class ConformanceReport:
    """All results of one run; ``ok`` when nothing failed."""

    backend: str
    results: list[CheckResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.status != FAIL for r in self.results)

    def get(self, check: str) -> CheckResult:
        return next(r for r in self.results if r.check == check)

    def summary(self) -> str:
        counts = {s: sum(r.status == s for r in self.results) for s in (PASS, FAIL, SKIP, UNSUPPORTED)}
        return (
            f"backend {self.backend!r}: {counts[PASS]} passed, {counts[FAIL]} failed, "
            f"{counts[UNSUPPORTED]} unsupported, {counts[SKIP]} skipped in {self.seconds:.0f}s"
        )

    def text(self) -> str:
        return "\n".join([*(r.line() for r in self.results), self.summary()])


class CheckFailed(AssertionError):
    """A check's verdict: the measured value did not meet the contract."""


class _Unsupported(Exception):
    """The backend lacks an optional capability the check needs."""


def kit_config(backend: str, overrides: Sequence[str] = (), *, model_path: Optional[str] = None) -> Any:
    """verl's composed config for the kit, as the entry point builds it: ``remote_ppo_trainer``
    with :data:`KIT_DEFAULTS` then ``overrides``, the derived settings applied, validated.
    Without ``actor_rollout_ref.model.path`` in ``overrides``, ``model_path`` or a freshly built
    tiny model is used."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from verl.remote_backend.launch.derive import derive_remote_settings, explicit_override_keys
    from verl.remote_backend.launch.validation import validate_remote_backend_config

    user = list(overrides)
    if not any(o.split("=", 1)[0].lstrip("+") == "actor_rollout_ref.model.path" for o in user):
        if model_path is None:
            from verl.remote_backend.testing.tiny_model import build_tiny_model

            model_path = build_tiny_model(tempfile.mkdtemp(prefix="vrb_conformance_model_"))
        user.insert(0, f"actor_rollout_ref.model.path={model_path}")
    everything = [f"trainer.remote_backend={backend}", *KIT_DEFAULTS, *user]
    GlobalHydra.instance().clear()  # a caller's own Hydra session must not shadow the entry config
    with initialize_config_module("verl.remote_backend.config", version_base=None):
        cfg = compose("remote_ppo_trainer", overrides=everything)
    derive_remote_settings(cfg, explicit_override_keys(user))
    validate_remote_backend_config(cfg, check_resume=False)
    return cfg


def run_conformance(backend: str, main_config: Any, options: Optional[KitOptions] = None) -> ConformanceReport:
    """Run every check against ``backend`` configured by ``main_config`` (verl's composed config,
    see :func:`verl.remote_backend.testing.kit_config`). Starts a local Ray cluster unless one
    is running; destroys every engine it created."""
    kit = _Kit(backend, main_config, options or KitOptions())
    return kit.run()


# ---------------------------------------------------------------------------------------------
class _Kit:
    def __init__(self, name: str, cfg: Any, options: KitOptions) -> None:
        self.name, self.cfg, self.opt = name, cfg, options
        self.cls: type[RemoteBackend] = RemoteBackendRegistry.get(name)
        self.report = ConformanceReport(name)
        self.owner: Optional[RemoteBackend] = None
        self.vocab, self.eos = _model_vocab(cfg)
        self.prompts = _prompts(cfg, self.vocab)
        self.seen: dict[str, Any] = {}  # values measured by one check and used by a later one
        self.workdir = tempfile.mkdtemp(prefix="vrb_conformance_")

    # ------------------------------------------------------------ driver
    def run(self) -> ConformanceReport:
        import ray

        start = time.perf_counter()
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(num_cpus=max(4, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False)
        try:
            self._check("1.methods", self._methods)
            self.owner = self._create()
            order = [
                ("1.handle", self._handle), ("2.layout", self._layout), ("2.entropy", self._entropy),
                ("5.max-tokens", self._max_tokens), ("5.vocab", self._vocab), ("5.logprobs", self._gen_logprobs),
                ("5.eos", self._eos), ("5.concurrent", self._concurrent), ("2.alignment", self._alignment),
                ("3.repeat", self._repeat), ("3.reorder", self._reorder), ("3.split", self._split),
                ("1.reattach", self._reattach), ("1.attached-destroy", self._attached_destroy),
                ("8.capabilities", self._capabilities), ("4.metrics", self._update_metrics),
                ("4.direction", self._direction), ("4.sampler-follows", self._sampler_follows),
                ("6.resume", self._resume), ("7.missing-key", self._missing_key), ("7.wrong-dtype", self._wrong_dtype),
                ("1.destroy", self._destroy), ("1.owner-destroy", self._owner_destroy),
            ]  # fmt: skip
            for check, fn in order:
                self._check(check, fn)
        finally:
            if self.owner is not None:
                self._run_quietly(self.owner.destroy())
            if started_ray:
                ray.shutdown()
        order_index = list(CHECKS)
        self.report.results.sort(key=lambda r: order_index.index(r.check))
        self.report.seconds = time.perf_counter() - start
        return self.report

    def _check(self, check: str, fn: Callable[[], str]) -> None:
        if self.opt.checks is not None and check not in self.opt.checks:
            self.report.results.append(CheckResult(check, SKIP, "not selected"))
            return
        failed_needs = [n for n in CHECKS[check][1] if self._status(n) in (FAIL, SKIP, UNSUPPORTED)]
        if failed_needs:
            self.report.results.append(CheckResult(check, SKIP, f"needs {', '.join(failed_needs)}"))
            return
        try:
            detail = fn()
            result = CheckResult(check, PASS, detail)
        except _Unsupported as exc:
            result = CheckResult(check, UNSUPPORTED, str(exc))
        except CheckFailed as exc:
            result = CheckResult(check, FAIL, str(exc))
        except Exception as exc:  # noqa: BLE001 - the backend's own failure is the measured value
            result = CheckResult(check, FAIL, f"raised {type(exc).__name__}: {_first_line(exc)}")
        self.report.results.append(result)
        if result.status == FAIL and not self._engine_alive():
            self.owner = self._create()  # a check killed the engine: later checks get a fresh one

    def _status(self, check: str) -> Optional[str]:
        return next((r.status for r in self.report.results if r.check == check), None)

    def _create(self) -> RemoteBackend:
        return RemoteBackendRegistry.create(self.name, self.cfg)

    def _engine_alive(self) -> bool:
        if self.owner is None:
            return False
        try:
            self._call(self._log_probs(self.owner, self._batch([0])))
            return True
        except Exception:  # noqa: BLE001
            self._run_quietly(self.owner.destroy())
            return False

    def _call(self, awaitable: Awaitable[Any]) -> Any:
        return asyncio.run(asyncio.wait_for(_awaited(awaitable), timeout=self.opt.call_timeout_s))

    def _run_quietly(self, awaitable: Any) -> None:
        try:
            if inspect.isawaitable(awaitable):
                self._call(awaitable)
        except Exception:  # noqa: BLE001 - teardown of a backend that may be broken
            pass

    # ------------------------------------------------------------ batches
    def _batch(self, rows: Sequence[int], responses: Optional[Sequence[Sequence[int]]] = None, **non_tensor: Any):
        prompts = [self.prompts[i % len(self.prompts)] for i in rows]
        if responses is None:
            responses = [_response(self.vocab, seed=i) for i in rows]
        dense = dense_rollout_batch(prompts, responses)
        fields = {"calculate_entropy": False, "temperature": self.opt.temperature, **non_tensor}
        return to_no_padding(dense, **fields)

    async def _log_probs(self, backend: RemoteBackend, data: Any, *, entropy: bool = False, ref: bool = False,
                         temperature: Optional[float] = None) -> LogProbResult:  # fmt: skip
        return await backend.compute_log_prob(
            data, ref=ref, calculate_entropy=entropy, rollout_n=1,
            temperature=self.opt.temperature if temperature is None else temperature, pad_token_id=0,
        )  # fmt: skip

    def _rows(self, data: Any, result: LogProbResult) -> list[torch.Tensor]:
        values = result.log_probs.values() if result.log_probs.is_nested else result.log_probs
        lengths = data["input_ids"].offsets().diff().tolist()
        return list(torch.split(values.detach().float().cpu(), lengths))

    def _response_slots(self, data: Any, result: LogProbResult) -> list[torch.Tensor]:
        """Per row, the log-probs verl reads: slot of each response token's predecessor."""
        out = []
        prompt_lens = data["attention_mask"][:, : data["prompts"].shape[1]].sum(-1).tolist()
        for row, values in enumerate(self._rows(data, result)):
            n_prompt = int(prompt_lens[row])
            out.append(values[n_prompt - 1 : values.shape[0] - 1])
        return out

    def _generate(self, backend: RemoteBackend, prompt: list[int], **params: Any) -> GenerateResult:
        base = {"max_tokens": self.opt.max_tokens, "temperature": self.opt.temperature, "top_p": 1.0, "top_k": -1,
                "logprobs": True}  # fmt: skip
        result = self._call(backend.generate(list(prompt), {**base, **params}))
        if not isinstance(result, GenerateResult):
            raise CheckFailed(f"generate returned a {type(result).__name__}, expected a GenerateResult")
        return result

    def _update_batch(
        self, responses: Sequence[Sequence[int]], advantages: Sequence[float], old: Optional[list] = None
    ):
        """Two or more responses to the first prompt with per-sequence advantages, as verl sends an update."""
        rows = list(range(len(responses)))
        prompts = [self.prompts[0]] * len(rows)
        dense = dense_rollout_batch(prompts, responses)
        width = dense["responses"].shape[1]
        mask = dense["response_mask"].float()
        adv = torch.tensor(advantages, dtype=torch.float32)[:, None] * mask
        old_lp = torch.zeros((len(rows), width)) if old is None else _pad_rows(old, width)
        dense.update(
            {"advantages": adv, "old_log_probs": old_lp, "ref_log_prob": old_lp.clone(), "returns": adv.clone()}
        )
        return to_no_padding(
            dense, calculate_entropy=False, temperature=self.opt.temperature, mini_batch_size=len(rows), epochs=1,
            seed=1, dataloader_kwargs={"shuffle": False},
        )  # fmt: skip

    async def _update(self, backend: RemoteBackend, data: Any) -> UpdateResult:
        return await backend.update_actor(
            data, actor_config=self.cfg.actor_rollout_ref.actor, pad_token_id=0,
            rollout_n=int(self.cfg.actor_rollout_ref.rollout.n),
            temperature=self.opt.temperature,
        )  # fmt: skip

    # ------------------------------------------------------------ 1. surface
    def _methods(self) -> str:
        problems = []
        for method in RemoteBackend.__abstractmethods__:
            if getattr(getattr(self.cls, method), "__isabstractmethod__", False):
                problems.append(f"{method} not implemented")
        for method in ("compute_log_prob", "update_actor", "generate", "update_weights", "save_checkpoint", "destroy"):
            if not inspect.iscoroutinefunction(getattr(self.cls, method)):
                problems.append(f"{method} is not async")
        for method in ("from_config", "requires_single_forwarder"):
            if not isinstance(inspect.getattr_static(self.cls, method), classmethod):
                problems.append(f"{method} is not a classmethod")
        if problems:
            raise CheckFailed("; ".join(problems))
        return "nine methods; async and classmethods as declared"

    def _handle(self) -> str:
        handle = self.owner.reconnect_handle()
        if not isinstance(handle, dict):
            raise CheckFailed(f"reconnect_handle() returned a {type(handle).__name__}, expected a dict")
        size = len(pickle.dumps(handle))
        if size >= 64 * 1024:
            raise CheckFailed(f"the pickled handle is {size} bytes (>= 64 KiB)")
        return f"pickled handle: {size} bytes"

    def _reattach(self) -> str:
        import ray

        data = self._batch([0, 1])
        mine = self._rows(data, self._call(self._log_probs(self.owner, data)))
        theirs = ray.get(
            _attached_log_probs.remote(self.name, self.cfg, self.owner.reconnect_handle(), data, self.opt.temperature),
            timeout=self.opt.call_timeout_s,
        )
        diff = max(float((a - torch.as_tensor(b)).abs().max()) for a, b in zip(mine, theirs))
        if diff > self.opt.batch_tolerance:
            raise CheckFailed(
                f"a re-attached instance in pid != {os.getpid()} gave log-probs {diff:.3g} away from the owner's"
            )
        return f"re-attached in another Ray process: max |diff| = {diff:.2g}"

    def _attached_destroy(self) -> str:
        import ray

        after = ray.get(
            _attached_destroy_twice.remote(
                self.name, self.cfg, self.owner.reconnect_handle(), self._batch([0]), self.opt.temperature
            ),
            timeout=self.opt.call_timeout_s,
        )
        try:
            self._call(self._log_probs(self.owner, self._batch([0])))
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(f"after a re-attached instance's destroy() the owner's call raised {type(exc).__name__}: "
                              f"{_first_line(exc)}") from None  # fmt: skip
        closed, raised = after
        if not closed:
            did = "succeeded" if raised is None else f"raised {raised}"
            raise CheckFailed(
                f"a call on a re-attached instance after its own destroy() {did}, expected BackendClosedError"
            )
        return (
            "engine still answers after a re-attached destroy() (called twice); "
            "that instance then raises BackendClosedError"
        )

    def _destroy(self) -> str:
        owner, self.owner = self.owner, None
        self._attach_before_owner_destroy(owner)
        self._call(owner.destroy())
        self._call(owner.destroy())
        try:
            self._call(self._log_probs(owner, self._batch([0])))
        except BackendClosedError:
            return "destroy() twice; then BackendClosedError"
        except Exception as exc:  # noqa: BLE001
            raise CheckFailed(
                f"a call after destroy() raised {type(exc).__name__}, expected BackendClosedError"
            ) from None
        raise CheckFailed("a call after destroy() succeeded")

    def _attach_before_owner_destroy(self, owner: RemoteBackend) -> None:
        """Re-attach a client (in this process) that 1.owner-destroy calls once ``owner`` is destroyed."""
        try:
            self.seen["attached_before_destroy"] = self.cls.from_config(self.cfg, handle=owner.reconnect_handle())
        except Exception as exc:  # noqa: BLE001 - reported by 1.owner-destroy, not by the destroy being measured
            self.seen["attached_before_destroy"] = exc

    def _owner_destroy(self) -> str:
        if "attached_before_destroy" not in self.seen:  # 1.destroy did not run: destroy the owner here
            owner, self.owner = self.owner, None
            self._attach_before_owner_destroy(owner)
            self._call(owner.destroy())
        attached = self.seen.pop("attached_before_destroy")
        if isinstance(attached, Exception):
            raise CheckFailed(
                f"re-attaching from reconnect_handle() raised {type(attached).__name__}: {_first_line(attached)}"
            )
        try:
            self._call(self._log_probs(attached, self._batch([0])))
        except asyncio.TimeoutError:
            raise CheckFailed(f"after the owner's destroy() a re-attached client's call did not answer within "
                              f"{self.opt.call_timeout_s:g}s (it must fail)") from None  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the measured value: any failure means the engine is gone
            return (
                f"after the owner's destroy() a re-attached client's call raised {type(exc).__name__}: "
                f"{_first_line(exc)[:100]}"
            )
        finally:
            self._run_quietly(attached.destroy())
        raise CheckFailed(
            "after the owner's destroy() a re-attached client still computes log-probs: the engine was left running"
        )

    # ------------------------------------------------------------ 2. log-prob layout
    def _layout(self) -> str:
        data = self._batch([0, 1, 2, 3])
        result = self._call(self._log_probs(self.owner, data))
        if not isinstance(result, LogProbResult):
            raise CheckFailed(f"compute_log_prob returned a {type(result).__name__}, expected a LogProbResult")
        check_log_prob_output(result, data["input_ids"], calculate_entropy=False)
        last = [float(row[-1]) for row in self._rows(data, result)]
        if any(v != 0.0 for v in last):
            raise CheckFailed(f"last slot of each row must be 0 (unused), got {last}")
        self.seen["device"], self.seen["compute_s"] = result.device, result.compute_s
        return f"[T]={int(data['input_ids'].offsets()[-1])} packed {result.log_probs.dtype}, finite, last slots 0"

    def _entropy(self) -> str:
        data = self._batch([0, 1])
        result = self._call(self._log_probs(self.owner, data, entropy=True))
        check_log_prob_output(result, data["input_ids"], calculate_entropy=True)
        ent = result.entropy.values() if result.entropy.is_nested else result.entropy
        low = float(ent.min())
        if low < -1e-6:
            raise CheckFailed(f"entropy must be >= 0, got {low:.3g}")
        return f"entropy present, min {low:.3g}"

    def _alignment(self) -> str:
        worst, tokens = 0.0, 0
        for i, prompt in enumerate(self.prompts[:2]):
            sample = self._generate(self.owner, prompt, seed=100 + i)
            if not sample.token_ids:
                continue
            data = self._batch([i], responses=[sample.token_ids])
            trainer = self._response_slots(data, self._call(self._log_probs(self.owner, data)))[0]
            sampler = torch.tensor(sample.log_probs[: trainer.shape[0]])
            worst = max(worst, float((trainer[: sampler.shape[0]] - sampler).abs().max()))
            tokens += sampler.shape[0]
        if tokens == 0:
            raise CheckFailed("generate returned no tokens to compare")
        if worst > self.opt.alignment_tolerance:
            raise CheckFailed(f"max |compute_log_prob - generate log-prob| = {worst:.3g} over {tokens} tokens "
                              f"(tolerance {self.opt.alignment_tolerance:g}; off by one slot?)")  # fmt: skip
        return f"max |trainer - sampler| = {worst:.2g} over {tokens} tokens at temperature {self.opt.temperature:g}"

    # ------------------------------------------------------------ 3. determinism and batching
    def _repeat(self) -> str:
        data = self._batch([0, 1, 2, 3])
        a = self._rows(data, self._call(self._log_probs(self.owner, data)))
        b = self._rows(data, self._call(self._log_probs(self.owner, data)))
        diff = _max_diff(a, b)
        self.seen["reference_rows"] = a
        if diff > self.opt.batch_tolerance:
            raise CheckFailed(f"the same batch twice differs by {diff:.3g} (tolerance {self.opt.batch_tolerance:g})")
        return f"max |diff| = {diff:.2g}"

    def _reorder(self) -> str:
        data = self._batch([3, 2, 1, 0])
        rows = self._rows(data, self._call(self._log_probs(self.owner, data)))[::-1]
        diff = _max_diff(rows, self.seen["reference_rows"])
        if diff > self.opt.batch_tolerance:
            raise CheckFailed(f"reversed rows differ by {diff:.3g} (tolerance {self.opt.batch_tolerance:g})")
        return f"max |diff| = {diff:.2g}"

    def _split(self) -> str:
        rows = []
        for half in ([0, 1], [2, 3]):
            data = self._batch(half)
            rows += self._rows(data, self._call(self._log_probs(self.owner, data)))
        diff = _max_diff(rows, self.seen["reference_rows"])
        if diff > self.opt.batch_tolerance:
            raise CheckFailed(
                f"two halves differ from the whole batch by {diff:.3g} (tolerance {self.opt.batch_tolerance:g})"
            )
        return f"max |diff| = {diff:.2g}"

    # ------------------------------------------------------------ 4. update semantics
    def _update_metrics(self) -> str:
        responses = [_response(self.vocab, seed=11), _response(self.vocab, seed=12)]
        scoring = self._batch([0, 0], responses=responses)
        before = self._response_slots(scoring, self._call(self._log_probs(self.owner, scoring)))
        sample_before = self._generate(self.owner, self.prompts[1], seed=7)
        result = self._call(self._update(self.owner, self._update_batch(responses, [1.0, -1.0], old=before)))
        if not isinstance(result, UpdateResult):
            raise CheckFailed(f"update_actor returned a {type(result).__name__}, expected an UpdateResult")
        missing = {"pg_loss", "grad_norm"} - set(result.metrics)
        if missing:
            raise CheckFailed(f"metrics lack {sorted(missing)} (got {sorted(result.metrics)})")
        bad = {k: v for k, v in result.metrics.items() if not all(math.isfinite(x) for x in _floats(v))}
        if bad:
            raise CheckFailed(f"non-finite metrics: {bad}")
        self.seen.update(update_rows=before, update_scoring=scoring, sample_before=sample_before)
        return f"metrics {sorted(result.metrics)}"

    def _direction(self) -> str:
        scoring, before = self.seen["update_scoring"], self.seen["update_rows"]
        after = self._response_slots(scoring, self._call(self._log_probs(self.owner, scoring)))
        up = float((after[0] - before[0]).mean())
        down = float((after[1] - before[1]).mean())
        if not (up > 0 and down < 0):
            raise CheckFailed(f"mean log-prob change: positive-advantage response {up:+.3g} (must rise), "
                              f"negative-advantage response {down:+.3g} (must fall)")  # fmt: skip
        return f"mean log-prob change {up:+.2g} (advantage +1), {down:+.2g} (advantage -1)"

    def _sampler_follows(self) -> str:
        self._call(self.owner.update_weights())
        prompt = self.prompts[1]
        before = self.seen["sample_before"]
        after = self._generate(self.owner, prompt, seed=7)
        data = self._batch([1], responses=[after.token_ids])
        trainer = self._response_slots(data, self._call(self._log_probs(self.owner, data)))[0]
        gap = float((trainer[: len(after.log_probs)] - torch.tensor(after.log_probs)).abs().max())
        same_tokens = before.token_ids == after.token_ids
        moved = (
            float((torch.tensor(before.log_probs) - torch.tensor(after.log_probs)).abs().max())
            if same_tokens
            else math.inf
        )
        if moved <= self.opt.batch_tolerance:
            raise CheckFailed(
                f"the sampler's log-probs did not change after update + update_weights (max |diff| {moved:.3g})"
            )
        if gap > self.opt.alignment_tolerance:
            raise CheckFailed(f"after update_weights the sampler's log-probs are {gap:.3g} from the trainer's "
                              f"(tolerance {self.opt.alignment_tolerance:g})")  # fmt: skip
        return (
            f"sampler moved ({'new tokens' if not same_tokens else f'max |diff| {moved:.2g}'}); "
            f"|sampler - trainer| = {gap:.2g}"
        )

    # ------------------------------------------------------------ 5. generation
    def _max_tokens(self) -> str:
        lengths = [
            len(self._generate(self.owner, p, max_tokens=3, seed=i).token_ids) for i, p in enumerate(self.prompts)
        ]
        if max(lengths) > 3:
            raise CheckFailed(f"max_tokens=3 but generate returned {max(lengths)} tokens")
        return f"lengths {lengths} with max_tokens=3"

    def _vocab(self) -> str:
        ids = [t for i, p in enumerate(self.prompts) for t in self._generate(self.owner, p, seed=20 + i).token_ids]
        bad = [t for t in ids if not (0 <= t < self.vocab)]
        if bad:
            raise CheckFailed(f"ids outside [0, {self.vocab}): {bad[:5]}")
        return f"{len(ids)} ids in [0, {self.vocab})"

    def _gen_logprobs(self) -> str:
        result = self._generate(self.owner, self.prompts[0], seed=30)
        lps = result.log_probs or []
        if result.token_ids and len(lps) != len(result.token_ids):
            raise CheckFailed(f"{len(lps)} log-probs for {len(result.token_ids)} tokens")
        if not all(math.isfinite(x) and x <= 1e-6 for x in lps):
            raise CheckFailed(f"log-probs must be finite and <= 0, got {lps}")
        plain = self._generate(self.owner, self.prompts[0], seed=30, logprobs=False)
        return (
            f"{len(lps)} log-probs; without logprobs=True: {'none' if plain.log_probs is None else 'returned anyway'}"
        )

    def _eos(self) -> str:
        if self.eos is None:
            raise _Unsupported("the model's tokenizer has no EOS id")
        prompts = [self.prompts[i % len(self.prompts)] for i in range(16)]
        samples = [self._generate(self.owner, p, max_tokens=32, seed=40 + i) for i, p in enumerate(prompts)]
        early = [s.token_ids for s in samples if self.eos in s.token_ids[:-1]]
        if early:
            raise CheckFailed(f"generation continued past EOS ({self.eos}): {early[0]}")
        ended = sum(bool(s.token_ids) and s.token_ids[-1] == self.eos for s in samples)
        return f"{ended}/{len(samples)} samples ended at EOS, none continued past it"

    def _concurrent(self) -> str:
        n = self.opt.concurrent_requests

        async def burst() -> list[Any]:
            calls = [
                self.owner.generate(
                    list(self.prompts[i % len(self.prompts)]),
                    {
                        "max_tokens": self.opt.max_tokens,
                        "temperature": 1.0,
                        "top_p": 1.0,
                        "top_k": -1,
                        "logprobs": False,
                        "seed": 50 + i,
                    },
                )
                for i in range(n)
            ]
            return await asyncio.gather(*calls)

        start = time.perf_counter()
        results = self._call(burst())
        if len(results) != n or not all(isinstance(r, GenerateResult) for r in results):
            raise CheckFailed(f"{n} concurrent calls returned {len(results)} results")
        return f"{n} concurrent calls completed in {time.perf_counter() - start:.1f}s"

    # ------------------------------------------------------------ 6. checkpoints
    def _resume(self) -> str:
        if not supports_resume(self.cls):
            raise _Unsupported("no load_checkpoint: resume unsupported (verl refuses to resume with this backend)")
        path = os.path.join(self.workdir, "ckpt", "global_step_1", "actor")
        self._call(self.owner.save_checkpoint(path=path, step=1))
        data = self._batch([0, 1, 2])
        responses = [_response(self.vocab, seed=61), _response(self.vocab, seed=62)]

        def update() -> Any:  # a fresh batch per call: an engine may consume what it is sent
            return self._update_batch(responses, [1.0, -1.0])

        saved = self._rows(data, self._call(self._log_probs(self.owner, data)))
        first = self._call(self._update(self.owner, update()))
        after_first = self._rows(data, self._call(self._log_probs(self.owner, data)))
        self._call(self.owner.destroy())
        self.owner = self._create()
        self._call(self.owner.load_checkpoint(path, 1))
        restored = self._rows(data, self._call(self._log_probs(self.owner, data)))
        second = self._call(self._update(self.owner, update()))
        after_second = self._rows(data, self._call(self._log_probs(self.owner, data)))
        gaps = {
            "log-probs after load": _max_diff(restored, saved),
            "log-probs after the next update": _max_diff(after_second, after_first),
            "grad_norm of the next update": abs(
                metric_scalar(second.metrics["grad_norm"]) - metric_scalar(first.metrics["grad_norm"])
            ),
        }
        tol = max(self.opt.batch_tolerance, 1e-5)
        bad = {k: v for k, v in gaps.items() if v > tol * (1 if "grad_norm" not in k else 100)}
        if bad:
            raise CheckFailed(
                "after save -> new engine -> load: " + ", ".join(f"{k} differ by {v:.3g}" for k, v in bad.items())
            )
        return "restored: " + ", ".join(f"{k} |diff| {v:.2g}" for k, v in gaps.items())

    # ------------------------------------------------------------ 7. errors
    def _missing_key(self) -> str:
        update = self._update_batch([_response(self.vocab, seed=71), _response(self.vocab, seed=72)], [1.0, -1.0])
        del update["advantages"]
        return self._refused("update_actor", self._update(self.owner, update), "a batch without 'advantages'")

    def _wrong_dtype(self) -> str:
        data = self._batch([0, 1])
        ids = data["input_ids"]
        data["input_ids"] = torch.nested.nested_tensor_from_jagged(ids.values().float(), offsets=ids.offsets())
        return self._refused("compute_log_prob", self._log_probs(self.owner, data), "float input_ids")

    def _refused(self, op: str, call: Awaitable[Any], what: str) -> str:
        try:
            self._call(call)
        except asyncio.TimeoutError:
            raise CheckFailed(f"{op} with {what} did not answer within {self.opt.call_timeout_s:g}s") from None
        except Exception as exc:  # noqa: BLE001 - the measured value
            try:
                back = _through_ray(exc)
            except Exception as pickling:  # noqa: BLE001
                raise CheckFailed(f"{op} with {what} raised {type(exc).__name__}, which does not survive pickling "
                                  f"({type(pickling).__name__}: {_first_line(pickling)})") from None  # fmt: skip
            if type(back) is not type(exc) or str(back) != str(exc):
                raise CheckFailed(f"{type(exc).__name__} changes when pickled: {str(exc)!r} -> {str(back)!r}") from None
            retry = "retried" if is_retryable(op, exc) else "not retried"
            return f"{type(exc).__name__} ({retry}): {_first_line(exc)[:100]}"
        raise CheckFailed(f"{op} accepted {what}")

    # ------------------------------------------------------------ 8. optional capabilities
    def _capabilities(self) -> str:
        present, absent, problems = [], [], []

        def probe(name: str, available: bool, use: Optional[Callable[[], Any]] = None) -> None:
            if not available:
                absent.append(name)
                return
            try:
                if use is not None:
                    use()
                present.append(name)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"{name}: {type(exc).__name__}: {_first_line(exc)}")

        probe("health", supports_health(self.owner), lambda: self._call(self.owner.health()))
        probe("log_location", implements(self.owner, "log_location"), lambda: _require_str(self.owner.log_location()))
        probe("batch_refs", accepts_batch_refs(self.owner), self._batch_ref_call)
        probe("sleep/wake_up", implements(self.owner, "sleep") and implements(self.owner, "wake_up"), self._sleep_wake)
        probe(
            "clear_kv_cache", implements(self.owner, "clear_kv_cache"), lambda: self._call(self.owner.clear_kv_cache())
        )
        probe("device report", self.seen.get("device") is not None)
        probe("timing (compute_s)", self.seen.get("compute_s") is not None)
        probe("check_config", implements(self.cls, "check_config"), lambda: self.cls.check_config(self.cfg))
        probe("checkpoint_problem", implements(self.cls, "checkpoint_problem"))
        probe("secret_settings", implements(self.cls, "secret_settings"), lambda: declared_secrets(self.cls))
        probe(
            "rollout_log_prob_problem",
            implements(self.cls, "rollout_log_prob_problem"),
            lambda: _require_str_or_none(self.cls.rollout_log_prob_problem(self.cfg)),
        )
        probe("resume", supports_resume(self.cls))
        if problems:
            raise CheckFailed("; ".join(problems))
        return f"present: {', '.join(present) or 'none'}; absent: {', '.join(absent) or 'none'}"

    def _batch_ref_call(self) -> None:
        import ray

        from verl.remote_backend.transport.batch_ref import BatchRef
        from verl.remote_backend.transport.wire import to_wire

        data = self._batch([0, 1])
        direct = self._rows(data, self._call(self._log_probs(self.owner, data)))
        ref = BatchRef.describe(data, ray.put(to_wire(data)))
        via_ref = self._rows(data, self._call(self._log_probs(self.owner, ref)))
        diff = _max_diff(direct, via_ref)
        if diff > self.opt.alignment_tolerance:  # the same computation, reached another way
            raise CheckFailed(f"a BatchRef gave log-probs {diff:.3g} away from the TensorDict's")

    def _sleep_wake(self) -> None:
        self._call(self.owner.sleep())
        self._call(self.owner.wake_up())
        self._generate(self.owner, self.prompts[0], seed=90)


# ------------------------------------------------------------------------------ Ray tasks
def _remote(fn: Callable) -> Any:
    import ray

    return ray.remote(num_cpus=0)(fn)


def _attached_log_probs_body(name: str, cfg: Any, handle: dict, data: Any, temperature: float) -> list:
    backend = RemoteBackendRegistry.get(name).from_config(cfg, handle=handle)
    try:
        result = asyncio.run(backend.compute_log_prob(data, ref=False, calculate_entropy=False, rollout_n=1,
                                                      temperature=temperature, pad_token_id=0))  # fmt: skip
        values = result.log_probs.values() if result.log_probs.is_nested else result.log_probs
        return [
            t.tolist() for t in torch.split(values.detach().float().cpu(), data["input_ids"].offsets().diff().tolist())
        ]
    finally:
        asyncio.run(backend.destroy())


def _attached_destroy_twice_body(
    name: str, cfg: Any, handle: dict, data: Any, temperature: float
) -> tuple[bool, Optional[str]]:
    """Re-attach, destroy twice, then call: (the call raised BackendClosedError, ``"Type: message"``
    of what it raised or ``None`` when it answered)."""
    backend = RemoteBackendRegistry.get(name).from_config(cfg, handle=handle)
    asyncio.run(backend.destroy())
    asyncio.run(backend.destroy())
    try:
        asyncio.run(backend.compute_log_prob(data, ref=False, calculate_entropy=False, rollout_n=1,
                                             temperature=temperature, pad_token_id=0))  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the measured value
        return isinstance(exc, BackendClosedError), f"{type(exc).__name__}: {_first_line(exc)[:100]}"
    return False, None


class _LazyRemote:
    """A Ray remote function made on first use (importing this module must not need Ray)."""

    def __init__(self, fn: Callable) -> None:
        self._fn, self._remote = fn, None

    def remote(self, *args: Any) -> Any:
        if self._remote is None:
            self._remote = _remote(self._fn)
        return self._remote.remote(*args)


_attached_log_probs = _LazyRemote(_attached_log_probs_body)
_attached_destroy_twice = _LazyRemote(_attached_destroy_twice_body)


# ------------------------------------------------------------------------------ helpers
def _through_ray(obj: Any) -> Any:
    """``obj`` after a round trip through Ray's object store (how an error reaches the trainer)."""
    import ray

    return ray.get(ray.put(obj))


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _max_diff(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> float:
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return math.inf
    return max(float((x - y).abs().max()) if x.numel() else 0.0 for x, y in zip(a, b))


def _floats(value: Any) -> list[float]:
    if isinstance(value, torch.Tensor):
        return [float(v) for v in value.reshape(-1).tolist()]
    if isinstance(value, (list, tuple)):
        return [f for v in value for f in _floats(v)]
    aggregate = getattr(value, "aggregate", None)
    return [float(aggregate())] if callable(aggregate) else [float(value)]


def _pad_rows(rows: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    out = torch.zeros((len(rows), width))
    for i, row in enumerate(rows):
        out[i, : row.shape[0]] = row
    return out


def _require_str(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise CheckFailed(f"log_location() returned {value!r}, expected a non-empty str")


def _require_str_or_none(value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise CheckFailed(f"rollout_log_prob_problem() returned {value!r}, expected None or a non-empty str")


def _response(vocab: int, *, seed: int, length: int = 6) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, min(vocab, 500), (length,), generator=g).tolist()


def _model_vocab(cfg: Any) -> tuple[int, Optional[int]]:
    """(rows of the model's embedding, the tokenizer's EOS id)."""
    from transformers import AutoConfig, AutoTokenizer

    path = cfg.actor_rollout_ref.model.path
    hf = AutoConfig.from_pretrained(path)
    text = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
    eos = AutoTokenizer.from_pretrained(path).eos_token_id
    return int(text.vocab_size), (None if eos is None else int(eos))


def _prompts(cfg: Any, vocab: int) -> list[list[int]]:
    """Four short prompts of different lengths, tokenized with the model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.actor_rollout_ref.model.path)
    texts = ["How many apples", "Question: 12 + 7 =", "The capital of France is", "Write one word:"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    return [[int(i) % vocab for i in p] or [3] for p in prompts]
