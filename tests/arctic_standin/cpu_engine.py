"""CPU double of the DeepSpeed engine that Arctic's ``DeepSpeedWorker`` drives (tests only).

Arctic's worker (``arctic_platform.common.deepspeed_worker``) and processing pipeline
(``arctic_platform.rl.processors.pipeline``) run unchanged; only the object they call
``self.engine`` is replaced, because ``deepspeed.initialize`` targets GPUs (bf16, NCCL,
fused kernels) and the model's flash-attention varlen forward needs CUDA.

What it preserves (the DeepSpeed behaviour the worker and pipeline rely on):

* ``engine(input_ids [1, T], position_ids [1, T], ...)`` -> ``.logits [1, T, V]`` for a
  packed row holding several sequences; a sequence starts where ``position_ids`` is 0
  and attends only to itself (what flash-attention varlen computes from position ids).
  Without ``position_ids`` the row is one sequence, as it is for the real model.
* ZoRRo (``ds_worker_config.zorro_train_enable``): Arctic patches the model to take the
  padded ``[B, S]`` batch and return ``logprobs`` (and ``entropy`` when
  ``calculate_entropy``) of the response tokens only - the last ``response_len``
  columns - token-aligned (value ``k`` = ``log p(response token k)``) at the
  ``temperature`` it is given, flattened row-major to ``[1, N]`` (flash-attention
  kernels and prompt de-duplication are what the double leaves out).
* ``backward(loss, scale_wrt_gas=True)`` divides by ``gradient_accumulation_steps()``
  only when asked; gradients accumulate across micro-batches.
* ``step()`` is a no-op except at a gradient-accumulation boundary (every ``gas``
  calls): there it clips to ``gradient_clipping``, records the pre-clip global norm
  (``get_global_grad_norm``), steps AdamW, steps the LR scheduler (DeepSpeed's own
  ``WarmupLR`` / ``WarmupCosineLR`` classes) and increments ``global_steps``.
* ``train_batch_size = micro x gas x world`` is checked as DeepSpeed checks it.
* ``save_checkpoint(dir)`` writes DeepSpeed's layout: ``dir/latest`` naming the tag
  ``global_step<N>`` and ``dir/global_step<N>/mp_rank_00_model_states.pt`` (module,
  optimizer, scheduler, counters). ``load_checkpoint(dir)`` returns ``(None, None)``
  when ``dir/latest`` is missing (DeepSpeed logs a warning and loads nothing) and
  ``(path, client_state)`` after restoring.

Computation is float32 (the real server's default is bf16 autocast; parity tests need
float32 so that only the objective, not the number format, is compared).
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace
from typing import Any, Optional

import torch

_MODEL_STATES = "mp_rank_00_model_states.pt"


class CpuDeepSpeedEngine:
    """``deepspeed.DeepSpeedEngine`` stand-in for one rank on CPU."""

    def __init__(
        self,
        module: torch.nn.Module,
        config: dict,
        *,
        trainable: bool,
        world_size: int = 1,
        zorro_response_len: Optional[int] = None,
    ) -> None:
        self.module = module
        self._zorro_response_len = zorro_response_len
        self.config = config
        self.global_rank = 0
        self.local_rank = 0
        self.global_steps = 0
        self.micro_steps = 0
        self._world = world_size
        self._boundary_override: Optional[bool] = None
        self._grad_norm: Optional[float] = None
        self._gas = self._resolve_batch_sizes(config, world_size)
        self._clip = float(config.get("gradient_clipping") or 0.0)
        self.optimizer = self._build_optimizer(config) if trainable else None
        self.lr_scheduler = self._build_scheduler(config) if trainable else None
        if not trainable:
            module.requires_grad_(False)

    # ------------------------------------------------------------ config (as DeepSpeed reads it)
    @staticmethod
    def _resolve_batch_sizes(config: dict, world: int) -> int:
        train = config.get("train_batch_size")
        micro = config.get("train_micro_batch_size_per_gpu")
        gas = config.get("gradient_accumulation_steps")
        if train is not None and micro is not None and gas is not None:
            if int(train) != int(micro) * int(gas) * world:
                raise AssertionError(
                    f"Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * "
                    f"gradient_acc_step * world_size {train} != {micro} * {gas} * {world}"
                )
            return int(gas)
        if gas is not None:
            return int(gas)
        if train is not None and micro is not None:
            return int(train) // (int(micro) * world)
        return 1

    def _build_optimizer(self, config: dict) -> torch.optim.Optimizer:
        opt = config.get("optimizer") or {}
        kind = str(opt.get("type", "AdamW")).lower()
        if kind not in ("adamw", "adam"):
            raise ValueError(f"the CPU engine double implements DeepSpeed optimizer AdamW only, got {opt.get('type')!r}")
        params = dict(opt.get("params") or {})
        adam_w_mode = bool(params.pop("adam_w_mode", kind == "adamw"))
        params.pop("torch_adam", None)
        known = {k: params[k] for k in ("lr", "betas", "eps", "weight_decay") if k in params}
        cls = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
        return cls([p for p in self.module.parameters() if p.requires_grad], **known)

    def _build_scheduler(self, config: dict) -> Any:
        sched = config.get("scheduler")
        if not sched:
            return None
        from deepspeed.runtime import lr_schedules

        cls = getattr(lr_schedules, str(sched.get("type")), None)
        if cls is None:
            raise ValueError(f"unknown DeepSpeed scheduler {sched.get('type')!r}")
        return cls(self.optimizer, **(sched.get("params") or {}))

    # ------------------------------------------------------------ forward
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, input_ids: torch.Tensor, position_ids: Optional[torch.Tensor] = None, **kwargs: Any) -> Any:
        """Packed ``[1, T]`` row -> ``SimpleNamespace(logits=[1, T, V])``, each sequence attending to itself.

        Other keyword inputs the pipeline forwards (``attention_mask`` of ones, ``temperature``,
        ``calculate_entropy``) are ignored, as the Hugging Face model ignores them. In ZoRRo mode
        see :meth:`_zorro_forward`.
        """
        if self._zorro_response_len is not None:
            return self._zorro_forward(input_ids, position_ids, **kwargs)
        ids = input_ids.reshape(-1)
        total = ids.numel()
        if position_ids is None:
            starts = torch.zeros(1, dtype=torch.long)
        else:
            starts = (position_ids.reshape(-1) == 0).nonzero().reshape(-1)
            if starts.numel() == 0 or int(starts[0]) != 0:
                starts = torch.cat([torch.zeros(1, dtype=torch.long), starts])
        lengths = torch.diff(torch.cat([starts, torch.tensor([total])])).tolist()
        width = max(lengths)
        padded = ids.new_zeros((len(lengths), width))
        mask = torch.zeros((len(lengths), width), dtype=torch.long)
        for row, (start, length) in enumerate(zip(starts.tolist(), lengths)):
            padded[row, :length] = ids[start : start + length]
            mask[row, :length] = 1
        positions = torch.arange(width).expand(len(lengths), width)
        logits = self.module(input_ids=padded, attention_mask=mask, position_ids=positions, use_cache=False).logits
        return SimpleNamespace(logits=logits[mask.bool()].unsqueeze(0))

    def _zorro_forward(
        self,
        input_ids: torch.Tensor,
        position_ids: Optional[torch.Tensor] = None,
        attention_mask: Optional[torch.Tensor] = None,
        temperature: float = 1.0,
        calculate_entropy: bool = False,
        **_: Any,
    ) -> Any:
        """Padded ``[B, S]`` -> token-aligned response ``logprobs`` (``entropy``) ``[1, N]``, as ZoRRo's model returns."""
        if attention_mask is None or input_ids.dim() != 2:
            raise ValueError("ZoRRo forward needs the padded [B, S] input_ids and attention_mask")
        width = input_ids.shape[1]
        start = width - int(self._zorro_response_len)
        if start < 1:
            raise ValueError(f"ZoRRo response_len={self._zorro_response_len} leaves no prompt column in width {width}")
        logits = self.module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False).logits
        logits = logits[:, start - 1 : width - 1].float() / float(temperature)
        log_probs = torch.log_softmax(logits, dim=-1)
        targets = input_ids[:, start:]
        mask = attention_mask[:, start:].bool()
        out = SimpleNamespace(logprobs=log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)[mask].unsqueeze(0))
        if calculate_entropy:
            entropy = -(log_probs.exp() * log_probs).sum(-1)
            out.entropy = entropy[mask].unsqueeze(0)
        return out

    def train(self, mode: bool = True) -> "CpuDeepSpeedEngine":
        self.module.train(mode)
        return self

    def eval(self) -> "CpuDeepSpeedEngine":
        self.module.eval()
        return self

    # ------------------------------------------------------------ training
    def gradient_accumulation_steps(self) -> int:
        return self._gas

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self._boundary_override = bool(is_boundary)

    def is_gradient_accumulation_boundary(self) -> bool:
        if self._boundary_override is not None:
            return self._boundary_override
        return (self.micro_steps + 1) % self._gas == 0

    def backward(self, loss: torch.Tensor, scale_wrt_gas: bool = True, **_: Any) -> torch.Tensor:
        if self.optimizer is None:
            raise RuntimeError("backward() on an engine built without an optimizer (log-prob job)")
        if scale_wrt_gas and self._gas > 1:
            loss = loss / self._gas
        loss.backward()
        return loss

    def step(self, **_: Any) -> None:
        if self.optimizer is None:
            raise RuntimeError("step() on an engine built without an optimizer (log-prob job)")
        if self.is_gradient_accumulation_boundary():
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            clip = self._clip if self._clip > 0 else math.inf
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            self._grad_norm = float(norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.global_steps += 1
        self.micro_steps += 1
        self._boundary_override = None

    def get_global_grad_norm(self) -> Optional[float]:
        return self._grad_norm

    def get_lr(self) -> list[float]:
        if self.optimizer is None:
            return [0.0]
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    # ------------------------------------------------------------ checkpoints (DeepSpeed layout)
    def save_checkpoint(self, save_dir: str, tag: Optional[str] = None, client_state: Optional[dict] = None) -> bool:
        tag = tag or f"global_step{self.global_steps}"
        os.makedirs(os.path.join(save_dir, tag), exist_ok=True)
        state = {
            "module": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler is not None else None,
            "global_steps": self.global_steps,
            "micro_steps": self.micro_steps,
            "ds_config": self.config,
            **(client_state or {}),
        }
        torch.save(state, os.path.join(save_dir, tag, _MODEL_STATES))
        with open(os.path.join(save_dir, "latest"), "w") as f:
            f.write(tag)
        return True

    def load_checkpoint(self, load_dir: str, tag: Optional[str] = None, **_: Any) -> tuple[Optional[str], Optional[dict]]:
        if tag is None:
            latest = os.path.join(load_dir, "latest")
            if not os.path.isfile(latest):
                return None, None  # DeepSpeed: warning "Unable to find latest file", nothing loaded
            with open(latest) as f:
                tag = f.read().strip()
        path = os.path.join(load_dir, tag, _MODEL_STATES)
        if not os.path.isfile(path):
            return None, None
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.module.load_state_dict(state["module"], strict=True)
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.lr_scheduler is not None and state.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(state["lr_scheduler"])
        self.global_steps = int(state["global_steps"])
        self.micro_steps = int(state["micro_steps"])
        client = {k: v for k, v in state.items() if k not in ("module", "optimizer", "lr_scheduler")}
        return path, client

    # ------------------------------------------------------------ memory management (no-ops on CPU)
    def empty_partition_cache(self) -> None:
        pass

    def offload_states(self, include: Any = None, **_: Any) -> None:
        pass

    def reload_states(self, **_: Any) -> None:
        pass
