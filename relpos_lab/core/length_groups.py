"""Rows grouped by their own length, for the passes whose arithmetic reads a sequence's length.

A right-padded batch is as wide as its longest row. Most of a model never notices: padding is
masked. A few things read the width itself, and then a row's output would depend on its
neighbours: randomized positions at evaluation draw L of max_random_len slots, RoPE scaling sizes
its factor from the positions in the call. A stack that reads the width runs once per group of rows
with equal length, each group cut to that length: exactly what each row alone gives. Decoding
groups the same way (`decoding.by_source_length`), since a prefix or a drawn budget is per row.
"""
from __future__ import annotations

from collections.abc import Callable

from torch import Tensor


def row_lengths(ids: Tensor, pad_id: int) -> Tensor:
    """(B,) real tokens per row of right-padded `ids` (B, W)."""
    return (ids != pad_id).sum(-1)


def length_groups(lengths: Tensor) -> list[tuple[int, Tensor]]:
    """(n, rows) for each distinct length n in `lengths` (B,), shortest first. Reads the lengths on
    the host: one sync, and a graph break when compiled."""
    return [(n, (lengths == n).nonzero().squeeze(1)) for n in lengths.unique().tolist()]


def per_length(run: Callable[[Tensor, int], Tensor], lengths: Tensor, width: int) -> Tensor:
    """`run(rows, n)` -> (len(rows), n, ...) for each group of rows with n real tokens, stitched into
    (B, width, ...) in batch order, zeros past each row's end (its padding, which no one reads)."""
    groups = length_groups(lengths.clamp_min(1))  # a row of padding alone runs as one token
    if len(groups) == 1 and groups[0][0] == width:  # no padding: the batch is one group already
        return run(groups[0][1], width)
    out = None
    for n, rows in groups:
        part = run(rows, n)
        if out is None:
            out = part.new_zeros(lengths.shape[0], width, *part.shape[2:])
        out[rows, :n] = part
    return out
