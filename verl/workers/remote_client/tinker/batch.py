"""verl's packed batch <-> Tinker's per-sequence arrays (pure torch; no ``tinker`` import).

Alignment. Row ``i`` of verl's batch holds ``L_i`` real tokens ``x_0 .. x_{L-1}`` (prompt of
``p_i`` tokens, then response of ``r_i``). A Tinker ``Datum`` for it has ``model_input =
x[:-1]`` and ``target_tokens = x[1:]``: its slot ``j`` (``0 <= j < L-1``) is
``log p(x_{j+1} | x_{<=j})`` - exactly slot ``j`` of the contract's packed layout, whose last
slot (``L-1``) is unused and written as 0. Response token ``k`` (``x_{p+k}``) is predicted at
slot ``p + k - 1``; its advantage, old log-prob and mask go there; prompt slots get weight 0.
``compute_logprobs`` of a sampling client answers one value per token after the first (the
first may come back as ``None``): aligned from the right, that is the same ``L-1`` slots.

Loss scaling. The server's gradient per ``optim_step`` is
``(1/N) * sum_s (1/W_s) * sum_t w_st * grad l(A_st)`` with ``N`` the sequences accumulated and
``W_s = sum_t w_st``: verl's ``seq-mean-token-mean``. Both server losses are linear in the
advantage and their clip decision does not depend on its (positive) scale, so multiplying the
advantages of sequence ``s`` by ``c_s`` reproduces verl's other modes exactly
(:func:`advantage_scales`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Row", "rows_of", "advantage_scales", "packed_from_slots", "policy_metrics"]


@dataclass
class Row:
    """One sample: its real tokens and, per Tinker slot (``len(tokens) - 1``), loss inputs."""

    tokens: list[int]
    prompt_len: int
    response_len: int
    weights: list[float]  # response mask on slots
    advantages: list[float]
    old_log_probs: list[float]

    @property
    def mask_sum(self) -> float:
        return float(sum(self.weights))


def rows_of(data: Any, *, with_update_fields: bool) -> list[Row]:
    """Rows of verl's batch (module docstring's alignment). ``with_update_fields``: also place
    ``advantages``, ``old_log_probs`` and ``response_mask`` on the slots (for updates)."""
    ids = data["input_ids"]
    values, offsets = ids.values(), ids.offsets()
    if values.is_floating_point() or values.is_complex():
        raise TypeError(f"input_ids must hold integer token ids, got dtype {values.dtype}")
    prompts, mask = data["prompts"], data["attention_mask"]
    width = prompts.shape[1]
    prompt_lens = mask[:, :width].sum(-1).tolist()
    resp_lens = mask[:, width:].sum(-1).tolist()
    if with_update_fields:
        resp_mask = data["response_mask"].float()
        adv = data["advantages"].float()
        old = data["old_log_probs"].float()
    rows = []
    for i in range(len(prompt_lens)):
        toks = values[offsets[i] : offsets[i + 1]].tolist()
        p, r = int(prompt_lens[i]), int(resp_lens[i])
        if p + r != len(toks):
            raise ValueError(f"row {i}: {len(toks)} packed tokens but attention_mask counts prompt {p} + response {r}")
        n = len(toks) - 1
        w, a, o = [0.0] * n, [0.0] * n, [0.0] * n
        if with_update_fields:
            for k in range(r):
                slot = p + k - 1
                if slot < 0:
                    continue  # a response with no prompt token before it cannot be scored
                w[slot] = float(resp_mask[i, k])
                a[slot] = float(adv[i, k])
                o[slot] = float(old[i, k])
        rows.append(Row(toks, p, r, w, a, o))
    return rows


def advantage_scales(
    rows: list[Row], loss_agg_mode: str, *, response_width: int, loss_scale_factor: Any = None
) -> list[float]:
    """Per-sequence factor ``c_s`` on the advantages that turns the server's seq-mean-token-mean
    into verl's ``loss_agg_mode`` over this mini-batch (module docstring)."""
    live = [r for r in rows if r.mask_sum > 0]
    n_seq = len(live) or 1
    if loss_agg_mode == "seq-mean-token-mean":
        return [1.0 for _ in rows]
    if loss_agg_mode == "token-mean":
        total = sum(r.mask_sum for r in live) or 1.0
        # verl: sum_all / total; server: (1/N) sum_s (1/W_s) sum_t -> c_s = N * W_s / total
        return [n_seq * r.mask_sum / total for r in rows]
    if loss_agg_mode == "seq-mean-token-sum":
        return [r.mask_sum for r in rows]
    if loss_agg_mode == "seq-mean-token-sum-norm":
        horizon = float(loss_scale_factor) if loss_scale_factor else float(response_width)
        return [r.mask_sum / horizon for r in rows]
    raise ValueError(f"loss_agg_mode={loss_agg_mode!r} is not supported by the tinker backend")


def packed_from_slots(rows: list[Row], per_row_slots: list[list[float]]) -> torch.Tensor:
    """The contract's packed ``[T]`` tensor: each row's ``L-1`` slot values, then 0 for its last slot."""
    out = []
    for row, slots in zip(rows, per_row_slots):
        n = len(row.tokens) - 1
        if len(slots) != n:
            raise ValueError(f"expected {n} per-token values for a row of {len(row.tokens)} tokens, got {len(slots)}")
        out.extend(float(x) for x in slots)
        out.append(0.0)
    return torch.tensor(out, dtype=torch.float32)


def align_right(values: list, n: int) -> list[float]:
    """The last ``n`` of ``values`` (``compute_logprobs`` answers ``n`` or ``n+1`` with a leading None)."""
    if len(values) < n:
        raise ValueError(f"expected at least {n} log-probs, got {len(values)}")
    tail = list(values[len(values) - n :])
    if any(v is None for v in tail):
        raise ValueError("the server returned None for a scored position")
    return [float(v) for v in tail]


def policy_metrics(
    rows: list[Row], new_log_probs: list[list[float]], clip_low: float, clip_high: float
) -> dict[str, float]:
    """verl's actor metrics of one mini-batch from the server's per-slot log-probs (before the step):
    ``pg_clipfrac`` (token share whose ratio left the clip range on the side that binds),
    ``ppo_kl`` (token mean of ``old - new``)."""
    num, clipped, kl = 0.0, 0.0, 0.0
    for row, lp in zip(rows, new_log_probs):
        for w, a, o, n in zip(row.weights, row.advantages, row.old_log_probs, lp):
            if w <= 0:
                continue
            ratio = float(torch.exp(torch.tensor(n - o)))
            binds = (a > 0 and ratio > clip_high) or (a < 0 and ratio < clip_low)
            clipped += w * float(binds)
            kl += w * (o - n)
            num += w
    num = num or 1.0
    return {"pg_clipfrac": clipped / num, "ppo_kl": kl / num}
