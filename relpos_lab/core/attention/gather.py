"""The ``gather`` implementation: the edge terms worked in the (2k+1)-wide label space.

q·rel_kᵀ is only (B, H, Lq, 2k+1): it is added into the logits by label; the value term sums
the probabilities into 2k+1 label masses and does one matmul with rel_v. No Lq·Lk·D tensor is
built. The fastest exact form on CPU, and the one that takes every argument (query offsets, any
mask, score biases, dropout), so `auto` falls back to it.

Two maps between an (Lq, Lk) matrix and its (Lq, 2k+1) label space carry the whole edge work:
`add_by_label` adds w[i, label(i, j)] to every entry (the key term into the logits; in the
backward, the value term's gradient into dP) and `sum_by_label` sums entries per label (the
probability mass per label for the value term; in the backward, the key term's gradient).
Beyond the clip a row has one label per side, so for a block of rows everything left (right)
of a small window is a single broadcast add or row sum; only the window (block + 2k wide) needs
an index. No (Lq, Lk) index tensor is read, unlike torch.gather / scatter_add over the matrix.
"""
from __future__ import annotations

import torch
from torch import Tensor

from relpos_lab.core.attention.masks import attention_probs, dense_terms, relative_labels
from relpos_lab.core.compiling import traced

_LABEL_BLOCK = 64  # query rows per block: the window is _LABEL_BLOCK + 2k - 1 keys wide


def _label_blocks(lq, lk, max_distance, query_offset, device):
    """Per block of query rows: (rows slice, window start c0, window end c1, window labels)."""
    block = max(_LABEL_BLOCK, 2 * max_distance)
    for r0 in range(0, lq, block):
        r1 = min(r0 + block, lq)
        c0 = min(max(r0 + query_offset - max_distance + 1, 0), lk)  # keys left of c0: label 0 for all rows
        c1 = max(min(r1 - 1 + query_offset + max_distance, lk), c0)  # keys from c1 on: label 2k for all rows
        labels = relative_labels(r1 - r0, c1 - c0, max_distance, r0 + query_offset - c0, device)
        yield slice(r0, r1), c0, c1, labels


def add_by_label(x: Tensor, w: Tensor, max_distance: int, query_offset: int) -> Tensor:
    """x[..., i, j] += w[..., i, clip(j - i) + k], in place; x is (B, H, Lq, Lk), w (B, H, Lq, 2k+1)."""
    for rows, c0, c1, labels in _label_blocks(x.shape[-2], x.shape[-1], max_distance, query_offset, x.device):
        wr = w[..., rows, :]
        x[..., rows, :c0] += wr[..., :1]
        x[..., rows, c1:] += wr[..., -1:]
        if c1 > c0:
            x[..., rows, c0:c1] += wr.gather(-1, labels.expand(*wr.shape[:-1], c1 - c0))
    return x


def sum_by_label(x: Tensor, max_distance: int, query_offset: int) -> Tensor:
    """(B, H, Lq, 2k+1): out[..., i, l] = Σ_j x[..., i, j] over the keys j with clip(j - i) + k = l."""
    out = x.new_zeros(*x.shape[:-1], 2 * max_distance + 1)
    for rows, c0, c1, labels in _label_blocks(x.shape[-2], x.shape[-1], max_distance, query_offset, x.device):
        xr, o = x[..., rows, :], out[..., rows, :]
        o[..., 0] = xr[..., :c0].sum(-1)
        o[..., -1] += xr[..., c1:].sum(-1)
        if c1 > c0:
            o.scatter_add_(-1, labels.expand(*xr.shape[:-1], c1 - c0), xr[..., c0:c1])
    return out


class _AddByLabel(torch.autograd.Function):
    """scores + w[label]: in place on the fresh logits, which no other backward needs."""

    @staticmethod
    def forward(ctx, scores, w, max_distance, query_offset):
        ctx.mark_dirty(scores)
        ctx.max_distance, ctx.query_offset = max_distance, query_offset
        return add_by_label(scores, w, max_distance, query_offset)

    @staticmethod
    def backward(ctx, grad):
        return grad, sum_by_label(grad, ctx.max_distance, ctx.query_offset), None, None


class _ValuesWithEdges(torch.autograd.Function):
    """p @ v + masses(p) @ rel_v, with dP built in one (Lq, Lk) tensor in the backward."""

    @staticmethod
    def forward(ctx, p, v, rel_v, max_distance, query_offset):
        masses = sum_by_label(p, max_distance, query_offset)
        ctx.save_for_backward(p, v, rel_v, masses)
        ctx.max_distance, ctx.query_offset = max_distance, query_offset
        return p @ v + masses @ rel_v

    @staticmethod
    def backward(ctx, grad):
        p, v, rel_v, masses = ctx.saved_tensors
        grad_p = add_by_label(grad @ v.transpose(-2, -1), grad @ rel_v.transpose(-2, -1), ctx.max_distance,
                              ctx.query_offset)
        grad_rel_v = masses.transpose(-2, -1) @ grad  # (B, H, 2k+1, D)
        grad_rel_v = grad_rel_v.sum(0) if rel_v.dim() == 3 else grad_rel_v.sum((0, 1))
        return grad_p, p.transpose(-2, -1) @ grad, grad_rel_v, None, None


def probabilities(q, k, rel_k, max_distance, allowed, attn_bias, query_offset, scale, dropout_p=0.0, dtype=None):
    """softmax_j(e_ij) (B, H, Lq, Lk), then dropout: gather's first half, which `relative_attention`
    also calls alone to show an inspect probe (core/attention/capture.py) the probabilities."""
    q = q * scale  # scaling q costs Lq·D, scaling the logits Lq·Lk
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:
        qw = q @ rel_k.to(q.dtype).transpose(-2, -1)  # (B, H, Lq, 2k+1)
        scores = _AddByLabel.apply(scores, qw, max_distance, query_offset)
    return attention_probs(scores, 1.0, allowed, attn_bias, dropout_p, dtype or q.dtype)


def unsupported(q, k, v, **call) -> str | None:
    """`gather` runs every call."""
    return None


def attend(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
           attn_bias, scale):
    """Both label maps sit inside autograd Functions so their backwards are label maps too: no
    (Lq, Lk, D) or (Lq, Lk) index tensor is saved for the backward either."""
    allowed, attn_bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias)
    if traced():  # compiled, inductor fuses the labels' arithmetic into one gather and its scatter
        labels = relative_labels(q.shape[-2], k.shape[-2], max_distance, query_offset, q.device)
        return attend_at(q, k, v, rel_k, rel_v, labels, allowed, attn_bias, dropout_p, scale)
    p = probabilities(q, k, rel_k, max_distance, allowed, attn_bias, query_offset, scale, dropout_p, v.dtype)
    if rel_v is None:
        return p @ v
    return _ValuesWithEdges.apply(p, v, rel_v.to(p.dtype), max_distance, query_offset)


def attend_at(q, k, v, rel_k, rel_v, labels, allowed, attn_bias, dropout_p, scale):
    """`attend` with an explicit (Lq, Lk) label matrix, for tokens at arbitrary increasing
    positions (randomized positions): torch's gather and scatter_add over the matrix, since the
    labels have no band structure for the window trick above."""
    q = q * scale
    scores = q @ k.transpose(-2, -1)
    if rel_k is not None:
        qw = q @ rel_k.to(q.dtype).transpose(-2, -1)  # (B, H, Lq, 2k+1)
        scores = scores + qw.gather(-1, labels.expand(*qw.shape[:-1], labels.shape[-1]))
    p = attention_probs(scores, 1.0, allowed, attn_bias, dropout_p, v.dtype)
    if rel_v is None:
        return p @ v
    masses = p.new_zeros(*p.shape[:-1], rel_v.shape[-2]).scatter_add(-1, labels.expand_as(p), p)
    return p @ v + masses @ rel_v.to(p.dtype)
