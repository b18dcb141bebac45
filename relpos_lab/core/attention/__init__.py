"""Relation-aware attention (Shaw, Uszkoreit & Vaswani, 2018) as one functional op.

    e_ij = q_i · (k_j + a^K_ij) / sqrt(D)        a^K_ij = rel_k[clip(j - i, k)]
    z_i  = Σ_j softmax_j(e_ij) · (v_j + a^V_ij)  a^V_ij = rel_v[clip(j - i, k)]

Every implementation computes exactly this; they differ only in what they materialise,
one module each:

- ``naive``, ``batched`` (reference.py): the paper's equations with (Lq, Lk, D) edge tensors;
  eq. 3-4 by einsum, and the §3.3 batched-matmul reshape.
- ``gather`` (gather.py): the edge terms in the (2k+1)-wide label space, no Lq·Lk·D tensor.
- ``flex`` (flex.py): FlexAttention with a score_mod and a BlockMask. Backward needs CUDA.
- ``banded`` (banded.py): a fused kernel for the tails beyond the clip, the band |j−i| < k on
  the side. Self-attention with key padding only; memory linear in L.
- ``triton`` (fused.py): one FlashAttention-2-style Triton kernel, forward and backward, with
  a^K, a^V and ``rel_bias`` in the tile loop; CUDA, or CPU through Triton's interpreter (tests).
- ``sdpa``: torch's SDPA, for calls with nothing relative to add.
- ``auto``: torch's SDPA when there is nothing relative to add (no tables, no bias); on CUDA,
  ``triton`` when it supports the call (more than one query row), then ``banded`` when gradients
  are needed and it supports the call (docs/performance.md has the GPU measurements); else
  ``gather``, the fastest exact form on CPU.

Each takes (q, k, v) and the same keyword arguments, and says why it cannot run a call
(`unsupported`); `IMPLEMENTATIONS` is their table. masks.py holds what they share: the relative
labels, the visibility mask and the dense biases, the masked softmax.
capture.py collects the probabilities by relative offset while an inspect probe is active.

The op also carries the additive score biases of other schemes: ``rel_bias`` (H, 2k+1), a scalar
per head and clipped offset (learned, or a fixed table such as ALiBi's), which the fused kernel
reads by label; and any dense ``attn_bias``. Every position scheme runs through this one function.
"""
from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from relpos_lab.core.attention import banded, capture, flex, fused, gather, reference
from relpos_lab.core.attention.masks import dense_terms, relative_labels, visibility_mask
from relpos_lab.core.compiling import in_transform


def _sdpa_unsupported(q, k, v, *, rel_k, rel_v, rel_bias, attn_bias, **call) -> str | None:
    if rel_k is not None or rel_v is not None or rel_bias is not None or attn_bias is not None:
        return "relative tables or a score bias (it is torch's attention without positions)"
    return None


def _sdpa(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p, attn_bias,
          scale):
    """torch's SDPA, for calls with nothing relative to add."""
    lq, lk = q.shape[-2], k.shape[-2]
    causal_only = attn_mask is None and is_causal and lq == lk and query_offset == 0  # lets CUDA pick flash
    allowed = None if causal_only else visibility_mask(attn_mask, is_causal, lq, lk, query_offset, q.device)
    if in_transform():  # runs stacked by vmap: one SDPA over the runs' rows (core/stacked_ops.py)
        from relpos_lab.core.stacked_ops import stacked_sdpa

        return stacked_sdpa(q, k, v, allowed, dropout_p, causal_only, scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p, is_causal=causal_only,
                                          scale=scale)


def _fused(q, k, v, **call) -> Tensor:
    """The fused kernel: eager, from an autograd Function (fused.py); while dynamo traces, as
    torch.library ops (fused_op.py, registered on the first compile)."""
    if torch.compiler.is_compiling():
        from relpos_lab.core.attention import fused_op

        return fused_op.attend(q, k, v, **call)
    return fused.attend(q, k, v, **call)


class Implementation(NamedTuple):
    """One way to compute the op. Both take (q, k, v) and the same keyword arguments, those of
    `relative_attention` (`unsupported` all but the scale): `unsupported` says why it cannot run
    them (None: it can), `attend` computes. Adding an implementation is a module and a row here."""
    unsupported: Callable[..., str | None]
    attend: Callable[..., Tensor]


IMPLEMENTATIONS = {
    "naive": Implementation(reference.unsupported, reference.naive),
    "batched": Implementation(reference.unsupported, reference.batched),
    "gather": Implementation(gather.unsupported, gather.attend),
    "flex": Implementation(flex.unsupported, flex.attend),
    "banded": Implementation(banded.unsupported, banded.attend),
    "triton": Implementation(fused.unsupported, _fused),
    "sdpa": Implementation(_sdpa_unsupported, _sdpa),
}
IMPLS = (*IMPLEMENTATIONS, "auto")


def relative_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    rel_k: Tensor | None = None,
    rel_v: Tensor | None = None,
    max_distance: int = 0,
    attn_mask: Tensor | None = None,
    is_causal: bool = False,
    query_offset: int = 0,
    dropout_p: float = 0.0,
    impl: str = "auto",
    attn_bias: Tensor | None = None,
    rel_bias: Tensor | None = None,
    positions: Tensor | None = None,
) -> Tensor:
    """Attention over (B, H, L, D) tensors with Shaw relative position representations.

    rel_k / rel_v: (2·max_distance+1, D) shared across heads, (H, 2·max_distance+1, D) per head,
    or None to leave that term out. Query row r sits at absolute position ``query_offset + r``
    (with a KV cache, ``Lk - Lq``); key column j at position j. ``attn_bias`` is an optional
    float tensor broadcastable to (B, H, Lq, Lk) added to the scaled logits; ``rel_bias`` (H,
    2·max_distance+1) adds rel_bias[h, clip(j − i, k) + k] to them, the same as that dense bias.
    Fully masked query rows return zeros.

    ``positions`` (Lk,), increasing: key j sits at positions[j] and query row r at
    positions[query_offset + r] instead of j and query_offset + r (randomized positions: the
    tokens of a short sequence placed far apart). Only ``gather`` takes them; an inspect probe
    does not see such calls.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    _check_shapes(q, k, v, rel_k, rel_v, max_distance, rel_bias, attn_mask)
    if positions is not None and (rel_k is not None or rel_v is not None or rel_bias is not None):
        return _at_positions(q, k, v, rel_k, rel_v, max_distance, attn_mask, is_causal, query_offset, dropout_p,
                             impl, attn_bias, rel_bias, positions)
    call = dict(rel_k=rel_k, rel_v=rel_v, rel_bias=rel_bias, max_distance=max_distance, attn_mask=attn_mask,
                is_causal=is_causal, query_offset=query_offset, dropout_p=dropout_p, attn_bias=attn_bias)
    if impl == "auto":
        impl = _pick_impl(q, k, v, call)
    else:  # asked for by name: say why not (auto only picks one where it runs)
        why = IMPLEMENTATIONS[impl].unsupported(q, k, v, **call)
        if why:
            raise ValueError(f"impl={impl!r} does not support {why}; use 'gather'")
    scale = 1.0 / math.sqrt(q.shape[-1])
    if capture.ACTIVE is not None:
        allowed, bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias)
        _observe(q, k, rel_k, max_distance, allowed, bias, query_offset, scale)
    return IMPLEMENTATIONS[impl].attend(q, k, v, **call, scale=scale)


def _at_positions(q, k, v, rel_k, rel_v, max_distance, attn_mask, is_causal, query_offset, dropout_p, impl,
                  attn_bias, rel_bias, positions):
    """The tables' labels from the given positions; causality and masks stay in index order, which
    increasing positions keep."""
    lq, lk = q.shape[-2], k.shape[-2]
    if impl not in ("auto", "gather"):
        raise ValueError(f"impl={impl!r} does not take positions; use 'gather' (or 'auto')")
    if positions.dim() != 1 or positions.numel() != lk or query_offset + lq > lk:
        raise ValueError(f"positions must be (Lk,) = ({lk},) with query_offset + Lq <= Lk; got "
                         f"{tuple(positions.shape)}, query_offset={query_offset}, Lq={lq}")
    positions = positions.to(q.device)
    labels = relative_labels(lq, lk, max_distance, query_offset, q.device, positions)
    allowed, attn_bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias,
                                     positions)
    return gather.attend_at(q, k, v, rel_k, rel_v, labels, allowed, attn_bias, dropout_p, 1.0 / math.sqrt(q.shape[-1]))


def _observe(q, k, rel_k, max_distance, allowed, bias, query_offset, scale):
    """Show an active inspect probe (capture.py) the probabilities; the output is the same either way."""
    with torch.no_grad():
        p = gather.probabilities(q, k, rel_k, max_distance, allowed, bias, query_offset, scale)
    capture.ACTIVE.observe(p, query_offset, max_distance)


def _check_shapes(q, k, v, rel_k, rel_v, max_distance, rel_bias, attn_mask):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q, k, v must be (B, H, L, D)")
    if k.shape[-2] != v.shape[-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"mismatched q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    for name, table, d in (("rel_k", rel_k, q.shape[-1]), ("rel_v", rel_v, v.shape[-1])):
        if table is None:
            continue
        want = (2 * max_distance + 1, d)
        if table.shape[-2:] != want or table.dim() not in (2, 3) or (
            table.dim() == 3 and table.shape[0] != q.shape[1]
        ):
            raise ValueError(
                f"{name} has shape {tuple(table.shape)}; expected {want} or "
                f"({q.shape[1]}, {want[0]}, {want[1]}) for max_distance={max_distance}"
            )
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        raise TypeError(f"attn_mask must be bool (True = may attend), got {attn_mask.dtype}")
    if rel_bias is not None and tuple(rel_bias.shape) != (q.shape[1], 2 * max_distance + 1):
        raise ValueError(f"rel_bias has shape {tuple(rel_bias.shape)}; expected (heads, 2·max_distance+1) = "
                         f"({q.shape[1]}, {2 * max_distance + 1})")


def _pick_impl(q, k, v, call: dict) -> str:
    """The fastest exact implementation for this call (docs/performance.md has the measurements):
    SDPA when there is nothing relative; on CUDA `triton` for more than one query row, then `banded`
    when gradients are needed; else `gather`."""
    def runs(name: str) -> bool:
        return IMPLEMENTATIONS[name].unsupported(q, k, v, **call) is None

    if runs("sdpa"):
        return "sdpa"
    if in_transform():  # runs stacked by vmap (core/stack.py): the fused kernels have no batching rule
        return "gather"
    if q.is_cuda and q.shape[-2] > 1 and runs("triton"):
        return "triton"
    if (q.is_cuda and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (q, k, call["rel_k"], call["rel_v"]))
            and runs("banded")):
        return "banded"
    return "gather"
