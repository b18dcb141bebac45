"""Randomized positions (Ruoss et al., 2023), a modifier of every scheme: `model.positions.max_random_len`.

In training, a sequence of length L is given the positions of an ordered random subset of
[0, max_random_len) instead of 0..L-1 (one draw per forward pass of a stack, shared by its
embedding and all its layers), so positions beyond the training lengths are seen in training.
Evaluation and decoding use 0..L-1, as for any model.

Any scheme works unchanged, because a layer computes exactly what the scheme computes on a
sequence whose tokens sit at those positions: the scheme's hooks see the tokens spread into a
sequence of length max(position) + 1 whose other slots are masked out (cheap: q, k and the layer
input, O(max_random_len·D), plus the dense bias of a scheme that has one), and attention runs over
the real tokens only, its tables read at the labels of their positions (`relative_attention`'s
`positions`): O(L²) per layer, not O(max_random_len²) as attention over every slot was.
"""
from __future__ import annotations

import torch
from torch import Tensor


def sample_positions(length: int, max_random_len: int, device=None) -> Tensor:
    """An increasing random subset of [0, max_random_len) with `length` elements."""
    if length > max_random_len:
        raise ValueError(f"a sequence of {length} tokens does not fit model.positions.max_random_len="
                         f"{max_random_len}; raise it above the longest training sequence (with BOS/EOS)")
    return torch.randperm(max_random_len, device=device)[:length].sort().values


def spread(x: Tensor, positions: Tensor, dim: int) -> Tensor:
    """x with its `dim` rows placed at `positions` of a zero tensor of length positions[-1] + 1."""
    shape = list(x.shape)
    shape[dim] = int(positions[-1]) + 1
    return x.new_zeros(shape).index_copy(dim, positions, x)


def spread_mask(attn_mask: Tensor | None, is_causal: bool, positions: Tensor) -> Tensor:
    """The boolean mask (…, N, N), True = attend, of the spread sequence: only real tokens are
    keys, with `attn_mask` ((…, 1 or L, L), True = attend) and causality among them."""
    n = int(positions[-1]) + 1
    lead = attn_mask.shape[:-2] if attn_mask is not None else (1, 1)
    length = positions.numel()
    inner = torch.ones(length, length, dtype=torch.bool, device=positions.device)
    if is_causal:
        inner = inner.tril()
    if attn_mask is not None:
        inner = inner & attn_mask.to(torch.bool)
    inner = inner.expand(*lead, length, length)
    full = torch.zeros(*lead, n, n, dtype=torch.bool, device=positions.device)
    full[..., positions[:, None], positions[None, :]] = inner
    return full
