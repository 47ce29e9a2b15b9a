"""``verl.remote_backend.transport.layout``: packed <-> padded conversions equal a per-row reference."""

from __future__ import annotations

import pytest
import torch

from verl.remote_backend.transport.layout import (
    contiguous_rows,
    offsets_from_lengths,
    packed_index,
    packed_to_padded,
    padded_to_packed,
)


def _runs(batch: int, width: int, seed: int, *, allow_empty: bool = True):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0 if allow_empty else 1, width + 1, (batch,), generator=gen)
    starts = (torch.rand(batch, generator=gen) * (width - lengths + 1)).floor().to(torch.int64)
    return starts, lengths


def _reference_padded(values, offsets, width, starts, pad):
    out = values.new_full((offsets.numel() - 1, width, *values.shape[1:]), pad)
    for i in range(offsets.numel() - 1):
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        out[i, int(starts[i]) : int(starts[i]) + hi - lo] = values[lo:hi]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("batch,width", [(1, 1), (3, 7), (16, 33), (64, 5)])
def test_packed_to_padded_and_back_match_a_per_row_loop(seed, batch, width):
    starts, lengths = _runs(batch, width, seed)
    offsets = offsets_from_lengths(lengths)
    values = torch.randint(1, 1000, (int(lengths.sum()),))
    dense = packed_to_padded(values, offsets, width, starts=starts, pad_value=-7)
    assert torch.equal(dense, _reference_padded(values, offsets, width, starts, -7))
    assert torch.equal(padded_to_packed(dense, offsets, starts=starts), values)


def test_right_padding_is_the_default_and_matches_torch_nested():
    lengths = torch.tensor([3, 1, 4])
    values = torch.arange(8.0)
    offsets = offsets_from_lengths(lengths)
    njt = torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    dense = packed_to_padded(values, offsets, 4, pad_value=0.5)
    assert torch.equal(dense, torch.nested.to_padded_tensor(njt, 0.5, output_size=(3, 4)))
    assert torch.equal(padded_to_packed(dense, offsets), values)


def test_trailing_dimensions_travel_with_each_token():
    starts, lengths = torch.tensor([1, 0]), torch.tensor([2, 3])
    offsets = offsets_from_lengths(lengths)
    values = torch.arange(10.0).view(5, 2)
    dense = packed_to_padded(values, offsets, 4, starts=starts)
    assert dense.shape == (2, 4, 2)
    assert torch.equal(dense, _reference_padded(values, offsets, 4, starts, 0))
    assert torch.equal(padded_to_packed(dense, offsets, starts=starts), values)


def test_a_caller_supplied_inside_mask_gives_the_same_result():
    starts, lengths = _runs(8, 12, seed=3)
    offsets = offsets_from_lengths(lengths)
    values = torch.randint(0, 9, (int(lengths.sum()),))
    cols = torch.arange(12)
    inside = (cols >= starts[:, None]) & (cols < (starts + lengths)[:, None])
    assert torch.equal(
        packed_to_padded(values, offsets, 12, starts=starts, inside=inside),
        packed_to_padded(values, offsets, 12, starts=starts),
    )


def test_contiguous_rows_reads_runs_and_spots_holes():
    mask = torch.tensor([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 1]])
    starts, lengths, contiguous = contiguous_rows(mask)
    assert starts.tolist() == [1, 0, 0, 3] and lengths.tolist() == [2, 0, 4, 1] and contiguous
    assert contiguous_rows(torch.tensor([[1, 0, 1]]))[2] is False
    assert contiguous_rows(torch.tensor([[True, False, True, True]]))[2] is False


def test_verl_left_right_layout_round_trips_through_the_mask():
    prompt, response = torch.tensor([2, 3, 1]), torch.tensor([1, 2, 3])
    width_p, width_r = 3, 3
    cols = torch.arange(width_p + width_r)
    mask = ((cols >= width_p - prompt[:, None]) & (cols < width_p)) | (
        (cols >= width_p) & (cols < width_p + response[:, None])
    )
    starts, lengths, contiguous = contiguous_rows(mask)
    assert contiguous and starts.tolist() == (width_p - prompt).tolist()
    values = torch.arange(1, int(lengths.sum()) + 1)
    dense = packed_to_padded(values, offsets_from_lengths(lengths), 6, starts=starts)
    expected = torch.zeros(3, 6, dtype=values.dtype)
    expected[mask] = values
    assert torch.equal(dense, expected)


def test_bad_runs_and_sizes_are_refused():
    offsets = offsets_from_lengths(torch.tensor([3]))
    with pytest.raises(ValueError, match="within the padded width"):
        packed_to_padded(torch.zeros(3), offsets, 4, starts=torch.tensor([2]))
    with pytest.raises(ValueError, match="tokens"):
        packed_to_padded(torch.zeros(2), offsets, 4)
    with pytest.raises(ValueError, match=r"\[B, W"):
        padded_to_packed(torch.zeros(4), offsets)
    assert packed_index(offsets, None, 5).tolist() == [0, 1, 2]


def test_empty_batch():
    offsets = torch.zeros(1, dtype=torch.int64)
    assert packed_to_padded(torch.zeros(0), offsets, 3).shape == (0, 3)
    assert padded_to_packed(torch.zeros(0, 3), offsets).shape == (0,)
