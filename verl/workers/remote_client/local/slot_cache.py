"""Per-row KV storage for the sampler: one preallocated slot per live request, left-aligned in time.

Layer tensors are ``[rows, kv_heads, time, head_dim]``; row ``r`` holds its own ``length[r]``
tokens at time ``0 .. length[r]-1`` (its positions), the rest is unused. A joining request
writes only its own rows, a finished one is replaced by the last live row (one row copy), and
a decode step writes one column per row in place; capacity grows by doubling, so whole-cache
copies happen O(log) times. Keys are read as ``[:n, :, :width]`` views with a padding mask.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

__all__ = ["SlotCache"]


class _SlotLayer(CacheLayerMixin):
    """One attention layer's slots; :meth:`update` is called by the model during a decode forward."""

    def __init__(self, owner: "SlotCache") -> None:
        super().__init__()
        self.owner = owner
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass  # storage is allocated by the owner when rows are written

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        o = self.owner
        n = key_states.shape[0]
        rows = torch.arange(n, device=key_states.device)
        # key_states [n, H, 1, D]: each row's new token goes to its own time index (= its length).
        self.keys[rows, :, o.write_pos] = key_states[:, :, 0]
        self.values[rows, :, o.write_pos] = value_states[:, :, 0]
        return self.keys[:n, :, : o.width], self.values[:n, :, : o.width]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        # The model derives the query offset from this: width - 1 lets every row's query see
        # the whole window; the 2-D padding mask then hides what a row does not own.
        return self.owner.width - 1

    def get_max_length(self) -> int:
        """No fixed maximum (slots grow by doubling); transformers >= 5.11 asks under this name."""
        return -1

    def get_max_cache_shape(self) -> int:
        """:meth:`get_max_length` under the name transformers < 5.11 (verl 0.9.1's range) asks for."""
        return self.get_max_length()


class SlotCache(Cache):
    """KV cache of a continuous decoding batch; rows ``0 .. n-1`` are the live requests.

    The owner (:class:`~.sampler.DecodeBatch`) writes prefilled rows with :meth:`write_rows`,
    calls :meth:`begin_step` before each one-token forward (passing this object as the model's
    cache), :meth:`end_step` after it, and :meth:`keep` to drop finished rows.
    """

    def __init__(self, num_layers: int) -> None:
        self.write_pos = torch.zeros(0, dtype=torch.long)
        self.width = 0
        super().__init__(layers=[_SlotLayer(self) for _ in range(num_layers)])
        self.lengths = torch.zeros(0, dtype=torch.long)  # [n] tokens stored per live row

    @property
    def rows(self) -> int:
        return int(self.lengths.numel())

    def _reserve(self, rows: int, time: int, like: torch.Tensor) -> None:
        """Make room for ``rows`` rows of ``time`` tokens (doubling, so growth copies are rare)."""
        first = self.layers[0].keys
        have_rows, have_time = (0, 0) if first is None else (first.shape[0], first.shape[2])
        if rows <= have_rows and time <= have_time:
            return
        new_rows = max(rows, 2 * have_rows) if rows > have_rows else have_rows
        new_time = max(time, 2 * have_time) if time > have_time else have_time
        n, w = self.rows, int(self.lengths.max()) if self.rows else 0
        for layer in self.layers:
            for name in ("keys", "values"):
                old: Optional[torch.Tensor] = getattr(layer, name)
                new = like.new_zeros((new_rows, like.shape[1], new_time, like.shape[3]))
                if old is not None and n:
                    new[:n, :, :w] = old[:n, :, :w]
                setattr(layer, name, new)

    def write_rows(self, layer_kv: list[tuple[torch.Tensor, torch.Tensor]], lengths: torch.Tensor) -> None:
        """Append ``m`` prefilled rows after the live ones.

        Args:
            layer_kv: per layer ``(keys, values)`` ``[m, H, W, D]``, LEFT-padded: row ``i`` holds
                its ``lengths[i]`` tokens at ``W - lengths[i] .. W - 1``.
            lengths: ``[m]`` int64 prompt lengths.
        """
        m, width = layer_kv[0][0].shape[0], layer_kv[0][0].shape[2]
        n = self.rows
        lengths = lengths.to(layer_kv[0][0].device)
        self._reserve(n + m, width + 1, layer_kv[0][0])
        # Shift each row left by its padding: source index (j + pad) mod W puts token 0 at time 0.
        src = (torch.arange(width, device=lengths.device)[None, :] + (width - lengths)[:, None]) % width
        for layer, (k, v) in zip(self.layers, layer_kv):
            idx = src[:, None, :, None].expand(m, k.shape[1], width, k.shape[3])
            layer.keys[n : n + m, :, :width] = k.gather(2, idx)
            layer.values[n : n + m, :, :width] = v.gather(2, idx)
        self.lengths = torch.cat([self.lengths.to(lengths.device), lengths])

    def begin_step(self) -> torch.Tensor:
        """Prepare a one-token forward of every live row; returns the ``[n, width]`` attention mask."""
        self.write_pos = self.lengths
        self.width = int(self.lengths.max()) + 1
        self._reserve(self.rows, self.width, self.layers[0].keys)
        cols = torch.arange(self.width, device=self.lengths.device)
        return (cols[None, :] <= self.lengths[:, None]).long()

    def end_step(self) -> None:
        self.lengths = self.lengths + 1

    def keep(self, keep: torch.Tensor) -> torch.Tensor:
        """Keep rows ``keep`` (sorted int64 indices); returns the permutation ``perm`` (new row j
        was old row ``perm[j]``) that the owner applies to its own per-row state."""
        n, k = self.rows, int(keep.numel())
        # Rows already in place stay; only those beyond the new end move into the freed slots.
        movers = keep[keep >= k]
        holes = torch.ones(k, dtype=torch.bool, device=keep.device)
        holes[keep[keep < k]] = False
        holes = holes.nonzero().squeeze(-1)
        perm = torch.arange(k, device=keep.device)
        perm[holes] = movers
        if movers.numel() and n:
            for layer in self.layers:
                layer.keys[holes] = layer.keys[movers]
                layer.values[holes] = layer.values[movers]
        self.lengths = self.lengths[perm]
        return perm
