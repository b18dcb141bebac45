"""Relation-aware attention (Shaw, Uszkoreit & Vaswani, 2018) as one functional op.

    e_ij = q_i · (k_j + a^K_ij) / sqrt(D)        a^K_ij = rel_k[clip(j - i, k)]
    z_i  = Σ_j softmax_j(e_ij) · (v_j + a^V_ij)  a^V_ij = rel_v[clip(j - i, k)]

Every implementation computes exactly this; they differ only in what they materialise:

- ``naive``   builds the (Lq, Lk, D) edge tensors and uses einsum: the readable definition.
- ``batched`` the paper's §3.3 form: q as (Lq, B·H, D) batched-matmul'd with (Lq, D, Lk) edges.
- ``gather``  q·rel_kᵀ → (B, H, Lq, 2k+1), gathered into the logits; the value term scatter-adds
              probabilities into 2k+1 buckets and does one matmul with rel_v. No Lq·Lk·D tensor.
- ``flex``    FlexAttention with a score_mod for the key term; the value term from bucket masses
              recovered with the log-sum-exp. Backward needs CUDA.
- ``auto``    the fastest exact one for the device and grad mode.

The op also carries the additive score biases of other schemes (ALiBi, T5) through ``attn_bias``,
so every position scheme runs through this one function.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

IMPLS = ("naive", "batched", "gather", "flex", "auto")


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
        impl = _pick_impl(q, rel_k, rel_v, attn_bias, dropout_p)
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    idx = relative_positions(lq, lk, max_distance, query_offset, q.device)
    scale = 1.0 / math.sqrt(q.shape[-1])
    if impl == "flex":
        if dropout_p > 0:
            raise ValueError("impl='flex' does not support attention dropout; use 'gather'")
        return _flex(q, k, v, rel_k, rel_v, max_distance, idx, allowed, attn_bias, query_offset, scale)
    edge_logits, edge_values = {"naive": (_naive_logits, _naive_values),
                                "batched": (_batched_logits, _batched_values),
                                "gather": (_gather_logits, _gather_values)}[impl]
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:
        scores = scores + edge_logits(q, rel_k, idx)
    p = _masked_softmax(scores, scale, allowed, attn_bias)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p)
    p = p.to(v.dtype)
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


def _pick_impl(q, rel_k, rel_v, attn_bias, dropout_p) -> str:
    if rel_k is None and rel_v is None and attn_bias is None:
        return "sdpa"
    return "gather"


def _masked_softmax(scores: Tensor, scale: float, allowed: Tensor | None, bias: Tensor | None) -> Tensor:
    """Softmax in at least float32; disallowed entries and fully masked rows come out as 0."""
    acc = torch.promote_types(scores.dtype, torch.float32)
    s = scores.to(acc) * scale
    if bias is not None:
        s = s + bias.to(acc)
    if allowed is None:
        return torch.softmax(s, dim=-1)
    s = s.masked_fill(~allowed, torch.finfo(acc).min)
    return torch.softmax(s, dim=-1).masked_fill(~allowed, 0.0)


# --- naive: the definition, with (Lq, Lk, D) edge tensors --------------------------------------

def _naive_logits(q, rel_k, idx):
    a_k = rel_k[..., idx, :]  # (Lq, Lk, D) or (H, Lq, Lk, D)
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

def _gather_logits(q, rel_k, idx):
    b, h, lq, _ = q.shape
    qw = q @ rel_k.to(q.dtype).transpose(-2, -1)  # (B, H, Lq, 2k+1)
    return torch.gather(qw, -1, idx.expand(b, h, lq, idx.shape[-1]))


def _gather_values(p, rel_v, idx):
    b, h, lq, lk = p.shape
    buckets = torch.zeros(b, h, lq, rel_v.shape[-2], dtype=p.dtype, device=p.device)
    buckets = buckets.scatter_add(-1, idx.expand(b, h, lq, lk), p)
    return buckets @ rel_v.to(p.dtype)


# --- flex: FlexAttention for the key term, bucket masses from the log-sum-exp -------------------

def _flex(q, k, v, rel_k, rel_v, max_distance, idx, allowed, attn_bias, query_offset, scale):
    from torch.nn.attention.flex_attention import flex_attention

    b, h, lq, d = q.shape
    lk = k.shape[-2]
    n_labels = 2 * max_distance + 1
    acc = torch.promote_types(q.dtype, torch.float32)
    qw = (q @ rel_k.to(q.dtype).transpose(-2, -1)).to(acc) * scale if rel_k is not None else None
    bias = attn_bias.to(acc).expand(b, h, lq, lk) if attn_bias is not None else None
    mask = allowed.expand(b, h, lq, lk) if allowed is not None else None

    def label(q_idx, kv_idx):
        return (kv_idx - q_idx - query_offset).clamp(-max_distance, max_distance) + max_distance

    def score_mod(score, bi, hi, q_idx, kv_idx):
        if qw is not None:
            score = score + qw[bi, hi, q_idx, label(q_idx, kv_idx)]
        if bias is not None:
            score = score + bias[bi, hi, q_idx, kv_idx]
        if mask is not None:
            score = torch.where(mask[bi, hi, q_idx, kv_idx], score, -float("inf"))
        return score

    out, lse = _flex_call(flex_attention, q, k, v, score_mod, scale)
    out = torch.nan_to_num(out.to(acc), nan=0.0)
    if rel_v is not None:
        masses = _bucket_masses(q, k, v, qw, bias, allowed, lse.to(acc), max_distance,
                                query_offset, scale, score_mod, flex_attention)
        out = out + masses @ rel_v.to(acc)
    return out.to(q.dtype)


FLEX_COMPILE = True
"""Compile FlexAttention (its fast path). Tests switch it off: eager flex is exact but unfused."""

_compiled_flex = None


def _flex_call(flex_attention, q, k, v, score_mod, scale):
    global _compiled_flex
    if FLEX_COMPILE:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex_attention, dynamic=False)
        fn = _compiled_flex
    else:
        fn = flex_attention
    from torch.nn.attention.flex_attention import AuxRequest

    out, aux = fn(q, k, v, score_mod=score_mod, scale=scale, return_aux=AuxRequest(lse=True))
    return out, aux.lse


def _bucket_masses(q, k, v, qw, bias, allowed, lse, max_distance, query_offset, scale,
                   score_mod, flex_attention):
    """(B, H, Lq, 2k+1) probability mass per relative label, without the probabilities.

    Inside the band |j - i| < k each label holds one key, so its mass is exp(e_ij - lse_i).
    The right tail (j - i ≥ k) is one more flex pass restricted to that tail; the left tail is
    what remains of the row's unit mass.
    """
    b, h, lq, d = q.shape
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

    def right_tail(score, bi, hi, q_idx, kv_idx):
        s = score_mod(score, bi, hi, q_idx, kv_idx)
        return torch.where(kv_idx - q_idx - query_offset >= kmax, s, -float("inf"))

    _, lse_right = _flex_call(flex_attention, q, k, v, right_tail, scale)
    masses[..., -1] = torch.where(live, torch.exp(lse_right.to(acc) - lse), torch.zeros_like(lse))
    left = 1.0 - masses.sum(-1)
    masses[..., 0] = torch.where(live, left.clamp_min(0.0), torch.zeros_like(left))
    return masses
