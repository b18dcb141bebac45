"""What every implementation shares: the relative label of a (query, key) pair, which keys a
query may see, and the masked softmax. One definition of each, so the implementations cannot
drift apart on an edge case (a query offset, a fully masked row, bf16 inputs)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from relpos_lab.core.compiling import traced


def max_offset(lq: int, lk: int, query_offset: int = 0) -> int:
    """The largest |j − i| between a query row (at query_offset + r) and a key: a clipping
    distance at least this large changes nothing, and a table of 2·max_offset + 1 labels (a
    `rel_bias` of an unbounded scheme) holds every offset of the call."""
    return max(query_offset + lq - 1, lk - 1 - query_offset, 0)


def relative_labels(
    lq: int, lk: int, max_distance: int, query_offset: int = 0, device=None, positions: Tensor | None = None
) -> Tensor:
    """(Lq, Lk) long tensor of clipped distances shifted to table rows: clip(j - i, k) + k; with
    `positions` (Lk,), the distances between positions[j] and positions[query_offset + r]."""
    if positions is not None:
        return (positions[None, :lk] - positions[query_offset:query_offset + lq, None]).clamp(
            -max_distance, max_distance) + max_distance
    i = torch.arange(lq, device=device) + query_offset
    j = torch.arange(lk, device=device)
    return (j[None, :] - i[:, None]).clamp(-max_distance, max_distance) + max_distance


def offset_bias(rel_bias: Tensor, lq: int, lk: int, max_distance: int, query_offset: int = 0,
                positions: Tensor | None = None) -> Tensor:
    """(1, H, Lq, Lk) dense form of a per-head offset bias (H, 2k+1): rel_bias[h, clip(j − i, k) + k]
    (with `positions`, the distances between the tokens' positions, as `relative_labels`)."""
    return rel_bias[:, relative_labels(lq, lk, max_distance, query_offset, rel_bias.device, positions)].unsqueeze(0)


def dense_terms(q: Tensor, k: Tensor, rel_bias: Tensor | None, max_distance: int, attn_mask: Tensor | None,
                is_causal: bool, query_offset: int, attn_bias: Tensor | None,
                positions: Tensor | None = None) -> tuple[Tensor | None, Tensor | None]:
    """(allowed, bias): the visibility mask and the sum of the additive biases as dense tensors, the
    form every implementation but `triton` (which builds both inside its tiles) takes them in
    (`positions`: the tokens' own, as `offset_bias`)."""
    lq, lk = q.shape[-2], k.shape[-2]
    if rel_bias is not None:
        dense = offset_bias(rel_bias, lq, lk, max_distance, query_offset, positions)
        attn_bias = dense if attn_bias is None else attn_bias + dense
    return visibility_mask(attn_mask, is_causal, lq, lk, query_offset, q.device), attn_bias


def visibility_mask(
    attn_mask: Tensor | None, is_causal: bool, lq: int, lk: int, query_offset: int, device=None
) -> Tensor | None:
    """Combine a boolean mask (True = may attend) with causality at absolute positions."""
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}")
    if not is_causal:
        return attn_mask
    i = torch.arange(lq, device=device) + query_offset
    causal = torch.arange(lk, device=device)[None, :] <= i[:, None]
    return causal if attn_mask is None else attn_mask & causal


def attention_probs(scores, scale, allowed, bias, dropout_p, dtype) -> Tensor:
    """Softmax in at least float32 (disallowed entries and fully masked rows come out as 0), then
    attention dropout and the cast to the values' dtype: the contract's precision in one place.
    `scores` are fresh logits: they may be overwritten."""
    acc = torch.promote_types(scores.dtype, torch.float32)
    s = scores.to(acc)
    if scale != 1.0:
        s = s * scale
    if bias is not None:
        s = s + bias.to(acc)
    if allowed is None:
        p = torch.softmax(s, dim=-1)
    else:
        lowest = torch.finfo(acc).min
        # The mask as 0 / lowest, without the head dimension: adding it broadcast over the heads
        # is a plain add, about 3x faster than masked_fill with a broadcast boolean mask.
        penalty = torch.zeros((), dtype=acc, device=s.device).masked_fill(~allowed, lowest)
        compiling = traced()  # compiled or stacked (vmap)
        # Compiled, the plain add fuses into the softmax; eager, the in-place one saves a pass.
        p = torch.softmax(s + penalty if compiling else _MaskLogits.apply(s, penalty), dim=-1)
        dead = penalty.amax(-1, keepdim=True) == lowest  # rows that may attend to nothing
        # Eager on CPU, skip the fill when no row is dead; the check would stall an accelerator's
        # queue, and a compiled graph cannot branch on it.
        if compiling or p.device.type != "cpu" or dead.any():
            p = p.masked_fill(dead, 0.0)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    return p.to(dtype)


class _MaskLogits(torch.autograd.Function):
    """Logits plus the mask's penalty (0, or the dtype's lowest value, which any logit rounds
    back to), in place, with a pass-through backward.

    An out-of-place masked_fill costs a copy of the (Lq, Lk) logits, and its backward another
    pass to zero the gradient at the masked entries; but that gradient is exactly zero already:
    the softmax gives those entries probability 0 (a fully masked row is zeroed after the
    softmax). Those two passes would be most of what a mask costs `gather`.
    """

    @staticmethod
    def forward(ctx, s, penalty):
        ctx.mark_dirty(s)
        return s.add_(penalty)

    @staticmethod
    def backward(ctx, grad):
        return grad, None
