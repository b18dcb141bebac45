"""Relation-aware attention (Shaw, Uszkoreit & Vaswani, 2018) as one functional op.

    e_ij = q_i · (k_j + a^K_ij) / sqrt(D)        a^K_ij = rel_k[clip(j - i, k)]
    z_i  = Σ_j softmax_j(e_ij) · (v_j + a^V_ij)  a^V_ij = rel_v[clip(j - i, k)]

Every implementation computes exactly this; they differ only in what they materialise:

- ``naive``   builds the (Lq, Lk, D) edge tensors and uses einsum: the readable definition.
- ``batched`` the paper's §3.3 form: q as (Lq, B·H, D) batched-matmul'd with (Lq, D, Lk) edges.
- ``gather``  q·rel_kᵀ → (B, H, Lq, 2k+1), added into the logits by label; the value term sums
              probabilities into 2k+1 label masses and does one matmul with rel_v. No Lq·Lk·D
              tensor, and no Lq·Lk index either: beyond the clip each row has one label per side,
              so only a window around the diagonal is indexed (see `add_by_label`).
- ``flex``    FlexAttention with a score_mod for the key term and masks as a BlockMask; the value
              term from bucket masses recovered with the log-sum-exp. Backward needs CUDA.
- ``banded``  beyond the clip, a^K and a^V are constant per row, so the two tails j−i ≤ −k and
              j−i ≥ k are plain attention shifted by a per-row constant: a fused kernel returning
              its log-sum-exp runs them (CPU: torch's flash kernel on shifted slices; CUDA:
              FlexAttention with a block-sparse BlockMask per tail, no score_mod), and only the
              band |j−i| < k is computed exactly on the side, in blocks; everything is combined
              by log-sum-exp. Self-attention, Lq = Lk, no offset, key-padding masks only. Memory
              is linear in L. On CPU it is exact but not faster than ``gather``.
- ``auto``    torch's SDPA when there is nothing relative to add (no tables, no bias); on CUDA,
              ``banded`` when gradients are needed and it supports the call (docs/performance.md
              has the GPU measurements); else ``gather``, the fastest exact form on CPU.

The op also carries the additive score biases of other schemes (ALiBi, T5) through ``attn_bias``,
so every position scheme runs through this one function.
"""
from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import Tensor

IMPLS = ("naive", "batched", "gather", "flex", "banded", "auto")


def relative_positions(
    lq: int, lk: int, max_distance: int, query_offset: int = 0, device=None
) -> Tensor:
    """(Lq, Lk) long tensor of clipped distances shifted to table rows: clip(j - i, k) + k."""
    i = torch.arange(lq, device=device) + query_offset
    j = torch.arange(lk, device=device)
    return (j[None, :] - i[:, None]).clamp(-max_distance, max_distance) + max_distance


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
) -> Tensor:
    """Attention over (B, H, L, D) tensors with Shaw relative position representations.

    rel_k / rel_v: (2·max_distance+1, D) shared across heads, (H, 2·max_distance+1, D) per head,
    or None to leave that term out. Query row r sits at absolute position ``query_offset + r``
    (with a KV cache, ``Lk - Lq``); key column j at position j. ``attn_bias`` is an optional
    float tensor broadcastable to (B, H, Lq, Lk) added to the scaled logits.
    Fully masked query rows return zeros.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown attention impl {impl!r}; choose one of {', '.join(IMPLS)}")
    _check_shapes(q, k, v, rel_k, rel_v, max_distance)
    lq, lk = q.shape[-2], k.shape[-2]
    allowed = visibility_mask(attn_mask, is_causal, lq, lk, query_offset, q.device)
    if impl == "auto":
        impl = _pick_impl(q, k, v, rel_k, rel_v, max_distance, attn_mask, query_offset, dropout_p, attn_bias)
    if impl == "sdpa":
        if attn_mask is None and is_causal and lq == lk and query_offset == 0:  # lets CUDA pick flash
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if impl == "banded":
        why = _banded_unsupported(q, k, v, rel_k, rel_v, max_distance, attn_mask, query_offset, dropout_p, attn_bias)
        if why:
            raise ValueError(f"impl='banded' does not support {why}; use 'gather'")
        return _banded(q, k, v, rel_k, rel_v, max_distance, attn_mask, is_causal, scale)
    if impl == "flex":
        if dropout_p > 0:
            raise ValueError("impl='flex' does not support attention dropout; use 'gather'")
        return _flex(q, k, v, rel_k, rel_v, max_distance, attn_mask, is_causal, allowed, attn_bias, query_offset,
                     scale)
    if impl == "gather":
        return _gather(q, k, v, rel_k, rel_v, max_distance, allowed, attn_bias, query_offset, dropout_p, scale)
    idx = relative_positions(lq, lk, max_distance, query_offset, q.device)
    edge_logits, edge_values = {"naive": (_naive_logits, _naive_values),
                                "batched": (_batched_logits, _batched_values)}[impl]
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:
        scores = scores + edge_logits(q, rel_k, idx)
    p = _attention_probs(scores, scale, allowed, attn_bias, dropout_p, v.dtype)
    out = p @ v
    if rel_v is not None:
        out = out + edge_values(p, rel_v, idx)
    return out


def _check_shapes(q, k, v, rel_k, rel_v, max_distance):
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


def _pick_impl(q, k, v, rel_k, rel_v, max_distance, attn_mask, query_offset, dropout_p, attn_bias) -> str:
    if rel_k is None and rel_v is None and attn_bias is None:
        return "sdpa"
    if (q.is_cuda and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in (q, k, rel_k, rel_v))
            and _banded_unsupported(q, k, v, rel_k, rel_v, max_distance, attn_mask, query_offset, dropout_p,
                                    attn_bias) is None):
        return "banded"
    return "gather"


def _attention_probs(scores, scale, allowed, bias, dropout_p, dtype) -> Tensor:
    """Softmax in at least float32 (disallowed entries and fully masked rows come out as 0), then
    attention dropout and the cast to the values' dtype. `scores` are fresh logits: they may be
    overwritten."""
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
        penalty = torch.zeros(allowed.shape, dtype=acc, device=s.device).masked_fill_(~allowed, lowest)
        p = torch.softmax(_MaskLogits.apply(s, penalty), dim=-1)
        dead = penalty.amax(-1, keepdim=True) == lowest  # rows that may attend to nothing
        if p.device.type != "cpu" or dead.any():  # the check would stall an accelerator's queue
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
    softmax). With a padding mask the two passes had made `gather` 1.6x slower at B=8, H=8,
    L=512 (docs/performance.md).
    """

    @staticmethod
    def forward(ctx, s, penalty):
        ctx.mark_dirty(s)
        return s.add_(penalty)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


# --- naive: the definition, with (Lq, Lk, D) edge tensors --------------------------------------

def _naive_logits(q, rel_k, idx):
    a_k = rel_k[..., idx, :].to(q.dtype)  # (Lq, Lk, D) or (H, Lq, Lk, D)
    return torch.einsum("bhqd,qkd->bhqk" if rel_k.dim() == 2 else "bhqd,hqkd->bhqk", q, a_k)


def _naive_values(p, rel_v, idx):
    a_v = rel_v[..., idx, :].to(p.dtype)
    return torch.einsum("bhqk,qkd->bhqd" if rel_v.dim() == 2 else "bhqk,hqkd->bhqd", p, a_v)


# --- batched: the paper's §3.3 reshape, one batched matmul per term -----------------------------

def _batched_logits(q, rel_k, idx):
    b, h, lq, d = q.shape
    a_k = rel_k[..., idx, :].to(q.dtype)
    if rel_k.dim() == 2:  # (Lq, B·H, D) x (Lq, D, Lk)
        out = torch.bmm(q.permute(2, 0, 1, 3).reshape(lq, b * h, d), a_k.transpose(1, 2))
        return out.reshape(lq, b, h, -1).permute(1, 2, 0, 3)
    out = torch.bmm(q.permute(1, 2, 0, 3).reshape(h * lq, b, d),
                    a_k.reshape(h * lq, -1, d).transpose(1, 2))
    return out.reshape(h, lq, b, -1).permute(2, 0, 1, 3)


def _batched_values(p, rel_v, idx):
    b, h, lq, lk = p.shape
    a_v = rel_v[..., idx, :].to(p.dtype)
    d = a_v.shape[-1]
    if rel_v.dim() == 2:  # (Lq, B·H, Lk) x (Lq, Lk, D)
        out = torch.bmm(p.permute(2, 0, 1, 3).reshape(lq, b * h, lk), a_v)
        return out.reshape(lq, b, h, d).permute(1, 2, 0, 3)
    out = torch.bmm(p.permute(1, 2, 0, 3).reshape(h * lq, b, lk), a_v.reshape(h * lq, lk, d))
    return out.reshape(h, lq, b, d).permute(2, 0, 1, 3)


# --- gather: work in the (2k+1)-wide label space, never Lq·Lk·D --------------------------------
#
# Two maps between an (Lq, Lk) matrix and its (Lq, 2k+1) label space carry the whole edge work:
# `add_by_label` adds w[i, label(i, j)] to every entry (the key term into the logits; in the
# backward, the value term's gradient into dP) and `sum_by_label` sums entries per label (the
# probability mass per label for the value term; in the backward, the key term's gradient).
# Beyond the clip a row has one label per side, so for a block of rows everything left (right)
# of a small window is a single broadcast add or row sum; only the window (block + 2k wide) needs
# an index. No (Lq, Lk) index tensor is read, unlike torch.gather / scatter_add over the matrix.

_LABEL_BLOCK = 64  # query rows per block: the window is _LABEL_BLOCK + 2k - 1 keys wide


def _label_blocks(lq, lk, kmax, query_offset, device):
    """Per block of query rows: (rows slice, window start c0, window end c1, window labels)."""
    block = max(_LABEL_BLOCK, 2 * kmax)
    for r0 in range(0, lq, block):
        r1 = min(r0 + block, lq)
        c0 = min(max(r0 + query_offset - kmax + 1, 0), lk)  # keys left of c0: label 0 for all rows
        c1 = max(min(r1 - 1 + query_offset + kmax, lk), c0)  # keys from c1 on: label 2k for all rows
        labels = relative_positions(r1 - r0, c1 - c0, kmax, r0 + query_offset - c0, device)
        yield slice(r0, r1), c0, c1, labels


def add_by_label(x: Tensor, w: Tensor, kmax: int, query_offset: int) -> Tensor:
    """x[..., i, j] += w[..., i, clip(j - i) + k], in place; x is (B, H, Lq, Lk), w (B, H, Lq, 2k+1)."""
    for rows, c0, c1, labels in _label_blocks(x.shape[-2], x.shape[-1], kmax, query_offset, x.device):
        wr = w[..., rows, :]
        x[..., rows, :c0] += wr[..., :1]
        x[..., rows, c1:] += wr[..., -1:]
        if c1 > c0:
            x[..., rows, c0:c1] += wr.gather(-1, labels.expand(*wr.shape[:-1], c1 - c0))
    return x


def sum_by_label(x: Tensor, kmax: int, query_offset: int) -> Tensor:
    """(B, H, Lq, 2k+1): out[..., i, l] = Σ_j x[..., i, j] over the keys j with clip(j - i) + k = l."""
    out = x.new_zeros(*x.shape[:-1], 2 * kmax + 1)
    for rows, c0, c1, labels in _label_blocks(x.shape[-2], x.shape[-1], kmax, query_offset, x.device):
        xr, o = x[..., rows, :], out[..., rows, :]
        o[..., 0] = xr[..., :c0].sum(-1)
        o[..., -1] += xr[..., c1:].sum(-1)
        if c1 > c0:
            o.scatter_add_(-1, labels.expand(*xr.shape[:-1], c1 - c0), xr[..., c0:c1])
    return out


class _AddByLabel(torch.autograd.Function):
    """scores + w[label]: in place on the fresh logits, which no other backward needs."""

    @staticmethod
    def forward(ctx, scores, w, kmax, query_offset):
        ctx.mark_dirty(scores)
        ctx.kmax, ctx.query_offset = kmax, query_offset
        return add_by_label(scores, w, kmax, query_offset)

    @staticmethod
    def backward(ctx, grad):
        return grad, sum_by_label(grad, ctx.kmax, ctx.query_offset), None, None


class _ValuesWithEdges(torch.autograd.Function):
    """p @ v + masses(p) @ rel_v, with dP built in one (Lq, Lk) tensor in the backward."""

    @staticmethod
    def forward(ctx, p, v, rel_v, kmax, query_offset):
        masses = sum_by_label(p, kmax, query_offset)
        ctx.save_for_backward(p, v, rel_v, masses)
        ctx.kmax, ctx.query_offset = kmax, query_offset
        return p @ v + masses @ rel_v

    @staticmethod
    def backward(ctx, grad):
        p, v, rel_v, masses = ctx.saved_tensors
        grad_p = add_by_label(grad @ v.transpose(-2, -1), grad @ rel_v.transpose(-2, -1), ctx.kmax, ctx.query_offset)
        grad_rel_v = masses.transpose(-2, -1) @ grad  # (B, H, 2k+1, D)
        grad_rel_v = grad_rel_v.sum(0) if rel_v.dim() == 3 else grad_rel_v.sum((0, 1))
        return grad_p, p.transpose(-2, -1) @ grad, grad_rel_v, None, None


def _gather(q, k, v, rel_k, rel_v, kmax, allowed, attn_bias, query_offset, dropout_p, scale):
    q = q * scale  # scaling q costs Lq·D, scaling the logits Lq·Lk
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:
        qw = q @ rel_k.to(q.dtype).transpose(-2, -1)  # (B, H, Lq, 2k+1)
        scores = _AddByLabel.apply(scores, qw, kmax, query_offset)
    p = _attention_probs(scores, 1.0, allowed, attn_bias, dropout_p, v.dtype)
    if rel_v is None:
        return p @ v
    return _ValuesWithEdges.apply(p, v, rel_v.to(p.dtype), kmax, query_offset)


# --- flex: FlexAttention for the key term, bucket masses from the log-sum-exp -------------------

def _flex(q, k, v, rel_k, rel_v, max_distance, attn_mask, is_causal, allowed, attn_bias, query_offset, scale):
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    acc = torch.promote_types(q.dtype, torch.float32)
    qw = (q @ rel_k.to(q.dtype).transpose(-2, -1)).to(acc) * scale if rel_k is not None else None
    bias = attn_bias.to(acc).expand(b, h, lq, lk) if attn_bias is not None else None

    kmax, offset = (torch.full((), x, dtype=torch.long, device=q.device) for x in (max_distance, query_offset))

    def label(q_idx, kv_idx):  # device scalars: one compiled kernel for every k and offset
        return torch.clamp(kv_idx - q_idx - offset, -kmax, kmax) + kmax

    def score_mod(score, bi, hi, q_idx, kv_idx):
        if qw is not None:
            score = score + qw[bi, hi, q_idx, label(q_idx, kv_idx)]
        if bias is not None:
            score = score + bias[bi, hi, q_idx, kv_idx]
        return score

    block_mask = flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, None, max_distance, q.device)
    out, lse = _flex_attend(q, k, v, scale, score_mod, block_mask, _SCORE_MOD_KERNEL)
    out = out.to(acc)
    if rel_v is not None:
        lse_right = None  # the right tail j − i ≥ k (none when k = 0): one more pass restricted to it
        if max_distance > 0:
            right = flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, "right", max_distance, q.device)
            lse_right = _flex_attend(q, k, v, scale, score_mod, right, _SCORE_MOD_KERNEL)[1]
        masses = _bucket_masses(q, k, qw, bias, allowed, lse.to(acc), max_distance, query_offset, scale, lse_right)
        out = out + masses @ rel_v.to(acc)
    return out.to(q.dtype)


FLEX_COMPILE = True
"""Compile FlexAttention on CUDA (its fast path). On CPU, torch's compiled flex refuses the
log-sum-exp this op needs, so CPU always runs eager flex: exact, unfused."""

_compiled_flex = None

_SCORE_MOD_KERNEL = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}
"""Smaller tiles for flex with a score_mod that reads a float32 table: in bf16 on an H100 (torch
2.11) the default tiles asked for 240-304 KB of shared memory, over the 227 KB there are."""


def _flex_attend(q, k, v, scale, score_mod=None, block_mask=None, kernel_options=None,
                 compiled=True) -> tuple[Tensor, Tensor]:
    """FlexAttention's output and log-sum-exp (natural log; −inf, with a zero output, on rows
    that may attend to nothing). Compiled once on CUDA; shapes become dynamic after the first
    recompile, so training on batches of varying length does not compile per shape. `compiled`
    False: called from inside a compiled region, which compiles it with everything else."""
    from torch.nn.attention import flex_attention as fa

    global _compiled_flex
    fn = fa.flex_attention
    if FLEX_COMPILE and q.is_cuda and compiled:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(fa.flex_attention)
        fn = _compiled_flex
    kwargs = dict(score_mod=score_mod, block_mask=block_mask, scale=scale)
    if kernel_options and q.is_cuda:
        kwargs["kernel_options"] = kernel_options
    if hasattr(fa, "AuxRequest"):  # torch >= 2.9; return_lse before (and deprecated since)
        out, aux = fn(q, k, v, return_aux=fa.AuxRequest(lse=True), **kwargs)
        lse = aux.lse
    else:
        out, lse = fn(q, k, v, return_lse=True, **kwargs)
    seen = torch.isfinite(lse)
    return torch.where(seen[..., None], out, out.new_zeros(())), lse


_BLOCK_MASKS: dict = {}
_BLOCK_MASK_CACHE = 32


def flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, region, kmax, device):
    """FlexAttention's BlockMask for a call: key padding or a dense boolean mask, causality and
    an optional region of relative offsets ("left": j − i ≤ −k, "right": j − i ≥ k), all as
    mask_mod, so fully masked blocks are skipped rather than scored.

    Built once and reused while the same mask tensor comes back (a model's layers share one
    padding mask per batch): the cache holds the mask itself, so an id is never mistaken for
    a new tensor's. None when nothing is masked.
    """
    if attn_mask is None and not is_causal and region is None:
        return None
    anchor = attn_mask
    key = (id(anchor), anchor._version if anchor is not None else 0, is_causal, lq, lk, query_offset, region,
           kmax, str(device))
    hit = _BLOCK_MASKS.get(key)
    if hit is not None and hit[0] is anchor:
        return hit[1]
    from torch.nn.attention.flex_attention import create_block_mask

    keep = dense = None
    batch = heads = None
    if attn_mask is not None:
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        if m.shape[1] == 1 and m.shape[2] == 1:
            keep = m[:, 0, 0, :].expand(m.shape[0], lk)
            batch = keep.shape[0]
        else:
            dense = m.expand(m.shape[0], m.shape[1], lq, lk)
            batch, heads = dense.shape[0], (dense.shape[1] if dense.shape[1] > 1 else None)

    # The allowed offsets j - i as a range [lo, hi]; device scalars, not Python constants, so the
    # compiled kernel is the same for every region, k and offset instead of one compile each.
    big = lq + lk + abs(query_offset)
    lo, hi = {None: (-big, big), "left": (-big, -kmax), "right": (kmax, big)}[region]
    if is_causal:
        hi = min(hi, 0)
    lo, hi, offset = (torch.full((), x, dtype=torch.long, device=device) for x in (lo, hi, query_offset))

    def mask_mod(b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx - offset
        ok = (rel >= lo) & (rel <= hi)
        if keep is not None:
            ok = ok & keep[b, kv_idx]
        if dense is not None:
            ok = ok & dense[b, h if heads else 0, q_idx, kv_idx]
        return ok

    block_mask = create_block_mask(mask_mod, batch, heads, lq, lk, device=device)
    if len(_BLOCK_MASKS) >= _BLOCK_MASK_CACHE:
        _BLOCK_MASKS.pop(next(iter(_BLOCK_MASKS)))
    _BLOCK_MASKS[key] = (anchor, block_mask)
    return block_mask


def _bucket_masses(q, k, qw, bias, allowed, lse, max_distance, query_offset, scale, lse_right):
    """(B, H, Lq, 2k+1) probability mass per relative label, without the probabilities.

    Inside the band |j - i| < k each label holds one key, so its mass is exp(e_ij - lse_i).
    The right tail's (j - i ≥ k) mass comes from `lse_right`, the log-sum-exp of a flex pass
    restricted to it; the left tail is what remains of the row's unit mass.
    """
    b, h, lq, _ = q.shape
    lk = k.shape[-2]
    kmax = max_distance
    acc = lse.dtype
    live = torch.isfinite(lse)
    masses = q.new_zeros(b, h, lq, 2 * kmax + 1, dtype=acc)
    pos = torch.arange(lq, device=q.device) + query_offset
    for offset in range(-kmax + 1, kmax):
        j = pos + offset
        ok = (j >= 0) & (j < lk)
        jj = j.clamp(0, lk - 1)
        k_j = k[:, :, jj, :]  # (B, H, Lq, D)
        e = (q.to(acc) * k_j.to(acc)).sum(-1) * scale
        if qw is not None:
            e = e + qw[..., offset + kmax]
        if bias is not None:
            e = e + bias.gather(-1, jj.view(1, 1, lq, 1).expand(b, h, lq, 1)).squeeze(-1)
        vis = ok.view(1, 1, lq).expand(b, h, lq)
        if allowed is not None:
            a = allowed.expand(b, h, lq, lk).gather(-1, jj.view(1, 1, lq, 1).expand(b, h, lq, 1))
            vis = vis & a.squeeze(-1)
        m = torch.exp(torch.where(live, e - lse, torch.full_like(e, -float("inf"))))
        masses[..., offset + kmax] = torch.where(vis, m, torch.zeros_like(m))
    if kmax == 0:
        masses[..., 0] = live.to(acc)
        return masses

    masses[..., -1] = torch.where(live, torch.exp(lse_right.to(acc) - lse), torch.zeros_like(lse))
    left = 1.0 - masses.sum(-1)
    masses[..., 0] = torch.where(live, left.clamp_min(0.0), torch.zeros_like(left))
    return masses


# --- banded: a fused kernel for the two tails, the band |j - i| < k on the side -----------------

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CPU_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None  # found, not imported


def _banded_unsupported(q, k, v, rel_k, rel_v, max_distance, attn_mask, query_offset, dropout_p,
                        attn_bias) -> str | None:
    """Why `banded` cannot run these arguments (None: it can)."""
    if q.device.type == "cpu":
        if _FLASH_CPU is None:
            return "this torch (it needs torch's CPU flash-attention kernel)"
        if q.dtype not in (torch.float32, torch.float64, torch.bfloat16):
            return f"dtype {q.dtype}"
    elif q.device.type == "cuda":
        d = q.shape[-1]
        if not _HAS_FLEX:
            return "this torch (it needs torch.nn.attention.flex_attention, torch >= 2.5)"
        if q.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            return f"dtype {q.dtype} on CUDA"
        if d < 16 or d & (d - 1) or v.shape[-1] != d:
            return f"head dimension {d} on CUDA (FlexAttention's kernels want a power of two >= 16)"
    else:
        return f"device {q.device.type}"
    if q.shape != k.shape or query_offset:
        return "Lq != Lk or a query offset (cached decoding)"
    if dropout_p > 0 or attn_bias is not None:
        return "attention dropout or a score bias"
    if max_distance < 1 or max_distance >= q.shape[-2]:
        return "max_distance outside [1, L)"
    if attn_mask is not None and (attn_mask.dim() != 4 or attn_mask.shape[1:3] != (1, 1)):
        return "masks other than key padding (B, 1, 1, Lk)"
    return None


class _FlashWithLse(torch.autograd.Function):
    """torch's CPU flash attention returning its log-sum-exp, differentiable in both outputs.

    The kernel's backward computes dS = P ∘ (dP − rowsum(dO ∘ O)); a gradient g on the lse adds
    P ∘ g. Handing the backward one extra (zero) head dimension whose output column is −1 and
    whose incoming gradient is g shifts rowsum(dO ∘ O) by −g and leaves dP unchanged: exact.
    The extra columns are padded with zeros to a multiple of 16: the kernel's backward at head
    dimension 65 took 1.6× as long as at 64, at 80 only 1.06× (one thread, L=512).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask, scale):
        out, lse = _FLASH_CPU(q, k, v, 0.0, True, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, mask, out, lse)
        ctx.scale = scale
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, mask, out, lse = ctx.saved_tensors
        if grad_out is None:
            grad_out = torch.zeros_like(out)
        if grad_lse is None:
            grad_lse = torch.zeros_like(lse)

        d = q.shape[-1]
        pad = -(d + 1) % 16

        def widen(x, fill):
            return F.pad(torch.cat((x, torch.full_like(x[..., :1], fill)), dim=-1), (0, pad))

        dq, dk, dv = _FLASH_CPU_BACKWARD(
            F.pad(torch.cat((grad_out, grad_lse.to(grad_out.dtype)[..., None]), dim=-1), (0, pad)),
            widen(q, 0.0), widen(k, 0.0), widen(v, 0.0), widen(out, -1.0), lse,
            0.0, True, attn_mask=mask, scale=ctx.scale,
        )
        return dq[..., :d], dk[..., :d], dv[..., :d], None, None


def _causal_tail(q, k, v, keep, scale):
    """Causal attention of q over k (row r sees keys 0..r) and its lse; -inf lse where no key is seen."""
    mask = None
    if keep is not None:
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(~keep, float("-inf"))[:, None, None, :]
    out, lse = _FlashWithLse.apply(q.contiguous(), k.contiguous(), v.contiguous(), mask, scale)
    if keep is not None:
        seen = keep.cumsum(-1)[:, None, : q.shape[-2]] > 0  # (B, 1, Lq): any visible key among 0..r
        lse = lse.masked_fill(~seen, float("-inf"))
        out = out.masked_fill(~seen[..., None], 0.0)
    return out, lse


def _band_windows(x, block):
    """(B, H, nb, 3·block, D): for query block b, the keys of blocks b−1, b, b+1 (zero padded)."""
    b, h, n, d = x.shape
    nb = -(-n // block)
    x = F.pad(x, (0, 0, block, nb * block - n + block)).view(b, h, nb + 2, block, d)
    # Three shifted block views concatenated (not Tensor.unfold: compiled, the backward of its
    # overlapping windows came out wrong for k and v on torch 2.13's CPU inductor).
    return torch.cat((x[:, :, :-2], x[:, :, 1:-1], x[:, :, 2:]), dim=3), nb


def _cpu_tails(q, k, v, keep, kmax, is_causal, scale):
    """The tails as causal flash attention on shifted slices: row i's left tail is keys 0..i−k."""
    b, h, n, d = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    empty_lse = q.new_full((b, h, n), float("-inf"), dtype=acc)
    empty_out = q.new_zeros(b, h, n, d, dtype=acc)
    o_left, lse_left = _causal_tail(q[:, :, kmax:], k[:, :, : n - kmax], v[:, :, : n - kmax],
                                    keep[:, : n - kmax] if keep is not None else None, scale)
    o_left = torch.cat((empty_out[:, :, :kmax], o_left.to(acc)), dim=2)
    lse_left = torch.cat((empty_lse[:, :, :kmax], lse_left.to(acc)), dim=2)
    if not is_causal:
        o_right, lse_right = _causal_tail(q[:, :, : n - kmax].flip(2), k[:, :, kmax:].flip(2), v[:, :, kmax:].flip(2),
                                          keep[:, kmax:].flip(1) if keep is not None else None, scale)
        o_right = torch.cat((o_right.flip(2).to(acc), empty_out[:, :, :kmax]), dim=2)
        lse_right = torch.cat((lse_right.flip(2).to(acc), empty_lse[:, :, :kmax]), dim=2)

    return (o_left, lse_left) + ((None, None) if is_causal else (o_right, lse_right))


def _flex_tails(q, k, v, masks, kmax, is_causal, scale, compiled):
    """The tails as FlexAttention over the whole sequence, each restricted by its BlockMask: the
    blocks wholly outside a tail are skipped, so the two tails together cost about one attention."""
    o_left, lse_left = _flex_attend(q, k, v, scale, block_mask=masks[0], compiled=compiled)
    if is_causal:
        return o_left, lse_left, None, None
    o_right, lse_right = _flex_attend(q, k, v, scale, block_mask=masks[1], compiled=compiled)
    return o_left, lse_left, o_right, lse_right


def _diagonal_view(x: Tensor, first: int, width: int) -> Tensor:
    """(…, rows, W) → (…, rows, width): row r's columns r + first … r + first + width − 1, a view.
    `x` must be contiguous in its last two dimensions."""
    *lead, rows, w = x.shape
    return x.as_strided((*lead, rows, width), (*x.stride()[:-2], w + 1, 1), x.storage_offset() + first)


class _Diagonals(torch.autograd.Function):
    """Copy a diagonal band out of (…, rows, W) blocks; the backward puts it back into zeros."""

    @staticmethod
    def forward(ctx, x, first, width):
        ctx.shape, ctx.first = x.shape, first
        return _diagonal_view(x.contiguous(), first, width).clone()

    @staticmethod
    def backward(ctx, grad):
        return _Undiagonals.apply(grad, ctx.first, ctx.shape[-1]), None, None


class _Undiagonals(torch.autograd.Function):
    """The inverse: (…, rows, width) → (…, rows, W), zero outside the band."""

    @staticmethod
    def forward(ctx, band, first, w):
        ctx.first, ctx.width = first, band.shape[-1]
        out = band.new_zeros(*band.shape[:-1], w)
        _diagonal_view(out, first, band.shape[-1]).copy_(band)
        return out

    @staticmethod
    def backward(ctx, grad):
        return _Diagonals.apply(grad, ctx.first, ctx.width), None, None


BAND_BLOCK = 16
"""Query rows per band block (at least k): each block meets 3·block keys in one small matmul."""

BANDED_COMPILE = False
"""On CUDA, compile banded's whole core (band, combination and the FlexAttention tails) as one
graph. Off: torch 2.11's inductor fails to compile it on CUDA ("ValueError: The argument
'-15 + ((-1))' is not comparable" in its tiling, on an H100), although torch 2.13 compiles it
exactly on CPU (tests/test_attention.py). Eager, only the FlexAttention tails are compiled."""

_compiled_banded = None


def _banded(q, k, v, rel_k, rel_v, kmax, attn_mask, is_causal, scale):
    n = q.shape[-2]
    keep = attn_mask.reshape(attn_mask.shape[0], n).expand(q.shape[0], n) if attn_mask is not None else None
    if q.device.type == "cpu":
        return _banded_core(q, k, v, rel_k, rel_v, kmax, keep, is_causal, scale, None, False)
    masks = tuple(flex_block_mask(attn_mask, False, n, n, 0, side, kmax, q.device)
                  for side in (("left",) if is_causal else ("left", "right")))
    if not BANDED_COMPILE:
        return _banded_core(q, k, v, rel_k, rel_v, kmax, keep, is_causal, scale, masks, True)
    global _compiled_banded
    if _compiled_banded is None:
        _compiled_banded = torch.compile(_banded_core)
    return _compiled_banded(q, k, v, rel_k, rel_v, kmax, keep, is_causal, scale, masks, False)


def _banded_core(q, k, v, rel_k, rel_v, kmax, keep, is_causal, scale, masks, compile_flex):
    """The band exactly, the tails as attention (CPU flash kernel, or FlexAttention with `masks`),
    combined by log-sum-exp. Query block b meets the keys of blocks b−1..b+1 in one small matmul;
    row r's band is a diagonal of that block, read and written as a strided view."""
    b, h, n, d = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    labels = 2 * kmax + 1
    qw = (q @ rel_k.to(q.dtype).transpose(-2, -1)).to(acc) * scale if rel_k is not None else \
        q.new_zeros(b, h, n, labels, dtype=acc)

    # Band: offsets −k+1 … k−1 (… 0 when causal), labels 1 … 2k−1 (1 … k).
    block = max(kmax, BAND_BLOCK)
    hi = 0 if is_causal else kmax - 1
    width = hi + kmax
    k_win, nb = _band_windows(k, block)
    v_win, _ = _band_windows(v, block)
    q_blk = F.pad(q, (0, 0, 0, nb * block - n)).view(b, h, nb, block, d)
    scores = (q_blk @ k_win.transpose(-1, -2)).to(acc) * scale  # (B, H, nb, block, 3·block)
    first = block - kmax + 1  # row r's offset −k+1 sits at column block + r − k + 1
    e_band = _Diagonals.apply(scores, first, width).reshape(b, h, nb * block, width)[:, :, :n]
    e_band = e_band + qw[..., 1:1 + width]
    j = torch.arange(n, device=q.device)[:, None] + torch.arange(-kmax + 1, hi + 1, device=q.device)[None, :]
    valid = (j >= 0) & (j < n)
    if keep is not None:
        valid = valid & keep[:, j.clamp(0, n - 1)][:, None]
    e_band = e_band.masked_fill(~valid, float("-inf"))

    # Tails: keys j <= i - k (left) and j >= i + k (right): plain attention and its log-sum-exp.
    if masks is None:
        o_left, lse_left, o_right, lse_right = _cpu_tails(q, k, v, keep, kmax, is_causal, scale)
    else:
        o_left, lse_left, o_right, lse_right = _flex_tails(q, k, v, masks, kmax, is_causal, scale, compile_flex)

    a_left = lse_left + qw[..., 0]
    logits = [a_left[..., None], e_band]
    if not is_causal:
        a_right = lse_right + qw[..., -1]
        logits.append(a_right[..., None])
    logits = torch.cat(logits, dim=-1)
    alive = torch.isfinite(logits).any(-1, keepdim=True)  # fully masked rows: every mass 0, no NaN
    lse = torch.logsumexp(torch.where(alive, logits, torch.zeros_like(logits)), dim=-1)
    lse = torch.where(alive.squeeze(-1), lse, torch.zeros_like(lse))
    masses = torch.exp(logits - lse[..., None])  # left tail, band…, right tail: labels 0 … 2k (0 … k)
    p_band = masses[..., 1:1 + width]
    out = masses[..., :1] * o_left
    if not is_causal:
        out = out + masses[..., -1:] * o_right
    # Band values: the band probabilities back into the block layout, one matmul with v windows.
    p_blk = _Undiagonals.apply(F.pad(p_band, (0, 0, 0, nb * block - n)).view(b, h, nb, block, width),
                               first, 3 * block)
    out = out + (p_blk.to(v.dtype) @ v_win).reshape(b, h, nb * block, d)[:, :, :n].to(acc)
    if rel_v is not None:
        out = out + masses @ rel_v.to(acc)[..., : masses.shape[-1], :]
    return out.to(q.dtype)
