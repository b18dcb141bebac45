"""The ``flex`` implementation: FlexAttention with a score_mod for the key term and the masks as
a BlockMask; the value term from per-label probability masses recovered with the log-sum-exp.

Also the FlexAttention plumbing `banded` reuses on CUDA for its tails: the call that returns the
log-sum-exp (compiled once) and the cached BlockMasks. Backward needs CUDA; on CPU flex runs
eager, forward only.
"""
from __future__ import annotations

import torch
from torch import Tensor

from relpos_lab.core.attention.masks import dense_terms

FLEX_COMPILE = True
"""Compile FlexAttention on CUDA (its fast path). On CPU, torch's compiled flex refuses the
log-sum-exp this op needs, so CPU always runs eager flex: exact, unfused."""

_compiled_flex = None

_SCORE_MOD_KERNEL = {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2}
"""Smaller tiles for flex with a score_mod that reads a float32 table: in bf16 the default tiles
ask for more shared memory than a Hopper SM has (227 KB)."""


def unsupported(q, k, v, *, dropout_p, **call) -> str | None:
    """Why `flex` cannot run these arguments (None: it can)."""
    return "attention dropout" if dropout_p > 0 else None


def attend(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
           attn_bias, scale):
    """FlexAttention never hands out the probabilities, so the value term is rebuilt from the
    per-label masses (`_bucket_masses`); the key term is an ordinary score_mod."""
    allowed, attn_bias = dense_terms(q, k, rel_bias, max_distance, attn_mask, is_causal, query_offset, attn_bias)
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    acc = torch.promote_types(q.dtype, torch.float32)
    qw = (q @ rel_k.to(q.dtype).transpose(-2, -1)).to(acc) * scale if rel_k is not None else None
    bias = attn_bias.to(acc).expand(b, h, lq, lk) if attn_bias is not None else None

    clip, offset = (torch.full((), x, dtype=torch.long, device=q.device) for x in (max_distance, query_offset))

    def label(q_idx, kv_idx):  # device scalars: one compiled kernel for every k and offset
        return torch.clamp(kv_idx - q_idx - offset, -clip, clip) + clip

    def score_mod(score, bi, hi, q_idx, kv_idx):
        if qw is not None:
            score = score + qw[bi, hi, q_idx, label(q_idx, kv_idx)]
        if bias is not None:
            score = score + bias[bi, hi, q_idx, kv_idx]
        return score

    block_mask = flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, None, max_distance, q.device)
    out, lse = flex_attention_lse(q, k, v, scale, score_mod, block_mask, _SCORE_MOD_KERNEL)
    out = out.to(acc)
    if rel_v is not None:
        lse_right = None  # the right tail j − i ≥ k (none when k = 0): one more pass restricted to it
        if max_distance > 0:
            right = flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, "right", max_distance, q.device)
            lse_right = flex_attention_lse(q, k, v, scale, score_mod, right, _SCORE_MOD_KERNEL)[1]
        masses = _bucket_masses(q, k, qw, bias, allowed, lse.to(acc), max_distance, query_offset, scale, lse_right)
        out = out + masses @ rel_v.to(acc)
    return out.to(q.dtype)


def flex_attention_lse(q, k, v, scale, score_mod=None, block_mask=None, kernel_options=None,
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


def flex_block_mask(attn_mask, is_causal, lq, lk, query_offset, region, max_distance, device):
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
           max_distance, str(device))
    hit = _BLOCK_MASKS.get(key)
    if hit is not None and hit[0] is anchor:
        return hit[1]
    from torch.nn.attention.flex_attention import create_block_mask

    keep = dense = None
    batch = heads = None  # None: one mask for every row (head), which flex broadcasts
    if attn_mask is not None:
        m = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))
        if m.shape[1] == 1 and m.shape[2] == 1:
            keep = m[:, 0, 0, :].expand(m.shape[0], lk)
        else:
            dense = m.expand(m.shape[0], m.shape[1], lq, lk)
            heads = dense.shape[1] if dense.shape[1] > 1 else None
        batch = m.shape[0] if m.shape[0] > 1 else None

    # The allowed offsets j - i as a range [lo, hi]; device scalars, not Python constants, so the
    # compiled kernel is the same for every region, k and offset instead of one compile each.
    big = lq + lk + abs(query_offset)
    lo, hi = {None: (-big, big), "left": (-big, -max_distance), "right": (max_distance, big)}[region]
    if is_causal:
        hi = min(hi, 0)
    lo, hi, offset = (torch.full((), x, dtype=torch.long, device=device) for x in (lo, hi, query_offset))

    def mask_mod(b, h, q_idx, kv_idx):
        rel = kv_idx - q_idx - offset
        ok = (rel >= lo) & (rel <= hi)
        if keep is not None:  # a mask of batch 1 serves every row: flex still asks with each row's b
            ok = ok & keep[b if batch else 0, kv_idx]
        if dense is not None:
            ok = ok & dense[b if batch else 0, h if heads else 0, q_idx, kv_idx]
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
    acc = lse.dtype
    live = torch.isfinite(lse)
    masses = q.new_zeros(b, h, lq, 2 * max_distance + 1, dtype=acc)
    pos = torch.arange(lq, device=q.device) + query_offset
    for offset in range(-max_distance + 1, max_distance):
        j = pos + offset
        ok = (j >= 0) & (j < lk)
        jj = j.clamp(0, lk - 1)
        k_j = k[:, :, jj, :]  # (B, H, Lq, D)
        e = (q.to(acc) * k_j.to(acc)).sum(-1) * scale
        if qw is not None:
            e = e + qw[..., offset + max_distance]
        if bias is not None:
            e = e + bias.gather(-1, jj.view(1, 1, lq, 1).expand(b, h, lq, 1)).squeeze(-1)
        vis = ok.view(1, 1, lq).expand(b, h, lq)
        if allowed is not None:
            a = allowed.expand(b, h, lq, lk).gather(-1, jj.view(1, 1, lq, 1).expand(b, h, lq, 1))
            vis = vis & a.squeeze(-1)
        m = torch.exp(torch.where(live, e - lse, torch.full_like(e, -float("inf"))))
        masses[..., offset + max_distance] = torch.where(vis, m, torch.zeros_like(m))
    if max_distance == 0:
        masses[..., 0] = live.to(acc)
        return masses

    masses[..., -1] = torch.where(live, torch.exp(lse_right.to(acc) - lse), torch.zeros_like(lse))
    left = 1.0 - masses.sum(-1)
    masses[..., 0] = torch.where(live, left.clamp_min(0.0), torch.zeros_like(left))
    return masses
