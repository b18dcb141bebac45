"""The paper's equations as code: ``naive`` (eq. 3-4, the definition) and ``batched`` (§3.3).

    e_ij = q_i (k_j + a^K_ij)ᵀ / √D     (4)      a^K_ij = w^K[clip(j − i, k)]
    z_i  = Σ_j α_ij (v_j + a^V_ij)      (3)      a^V_ij = w^V[clip(j − i, k)]

Both split e_ij into q_i k_jᵀ + q_i a^K_ijᵀ (eq. 5) and z_i into Σ α_ij v_j + Σ α_ij a^V_ij, so
the plain terms stay one matmul each and only the edge terms differ. They materialise a^K and
a^V as (Lq, Lk, D) tensors: memory Lq·Lk·D, so they are the yardstick for the fast kernels
(gather, flex, banded), not what `auto` runs.
"""
from __future__ import annotations

import torch

from relpos_lab.core.attention.masks import attention_probs, dense_terms, relative_labels


def unsupported(q, k, v, **call) -> str | None:
    """The definition runs every call."""
    return None


def naive(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p, attn_bias,
          scale):
    """The definition, every a_ij built: what the other implementations are tested against."""
    allowed, attn_bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias)
    idx = relative_labels(q.shape[-2], k.shape[-2], max_distance, query_offset, q.device)  # (Lq, Lk): clip(j − i) + k
    e = q @ k.transpose(-2, -1)  # (B, H, Lq, Lk): q_i k_jᵀ
    if rel_k is not None:
        a_k = rel_k[..., idx, :].to(q.dtype)  # a^K: (Lq, Lk, D), or (H, Lq, Lk, D) per head
        e = e + torch.einsum("bhqd,qkd->bhqk" if rel_k.dim() == 2 else "bhqd,hqkd->bhqk", q, a_k)  # + q_i a^K_ijᵀ
    alpha = attention_probs(e, scale, allowed, attn_bias, dropout_p, v.dtype)  # softmax_j(e_ij / √D)
    z = alpha @ v  # (B, H, Lq, D): Σ_j α_ij v_j
    if rel_v is not None:
        a_v = rel_v[..., idx, :].to(alpha.dtype)  # a^V, shaped as a^K
        z = z + torch.einsum("bhqk,qkd->bhqd" if rel_v.dim() == 2 else "bhqk,hqkd->bhqd", alpha, a_v)  # + Σ α_ij a^V_ij
    return z


def batched(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
            attn_bias, scale):
    """§3.3: the edge terms as batched matmuls over the query position, which the paper found
    efficient on accelerators: q reshaped to (Lq, B·H, D) against a^K as (Lq, D, Lk)."""
    allowed, attn_bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias)
    idx = relative_labels(q.shape[-2], k.shape[-2], max_distance, query_offset, q.device)
    e = q @ k.transpose(-2, -1)
    if rel_k is not None:
        e = e + _batched_logits(q, rel_k[..., idx, :].to(q.dtype))
    alpha = attention_probs(e, scale, allowed, attn_bias, dropout_p, v.dtype)
    z = alpha @ v
    if rel_v is not None:
        z = z + _batched_values(alpha, rel_v[..., idx, :].to(alpha.dtype))
    return z


def _batched_logits(q, a_k):
    """q_i a^K_ijᵀ for all i, j: (B, H, Lq, Lk)."""
    b, h, lq, d = q.shape
    if a_k.dim() == 3:  # (Lq, B·H, D) x (Lq, D, Lk)
        out = torch.bmm(q.permute(2, 0, 1, 3).reshape(lq, b * h, d), a_k.transpose(1, 2))
        return out.reshape(lq, b, h, -1).permute(1, 2, 0, 3)
    # per-head tables: one (B, D) x (D, Lk) product per (head, query position)
    out = torch.bmm(q.permute(1, 2, 0, 3).reshape(h * lq, b, d),
                    a_k.reshape(h * lq, -1, d).transpose(1, 2))
    return out.reshape(h, lq, b, -1).permute(2, 0, 1, 3)


def _batched_values(alpha, a_v):
    """Σ_j α_ij a^V_ij for all i: (B, H, Lq, D)."""
    b, h, lq, lk = alpha.shape
    d = a_v.shape[-1]
    if a_v.dim() == 3:  # (Lq, B·H, Lk) x (Lq, Lk, D)
        out = torch.bmm(alpha.permute(2, 0, 1, 3).reshape(lq, b * h, lk), a_v)
        return out.reshape(lq, b, h, d).permute(1, 2, 0, 3)
    out = torch.bmm(alpha.permute(1, 2, 0, 3).reshape(h * lq, b, lk), a_v.reshape(h * lq, lk, d))
    return out.reshape(h, lq, b, d).permute(2, 0, 1, 3)
