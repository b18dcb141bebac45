"""The ``banded`` implementation: a fused kernel for the two tails, the band |j − i| < k exactly.

Beyond the clip, a^K and a^V are constant per row, so the tails j − i ≤ −k and j − i ≥ k are
plain attention shifted by a per-row constant: a fused kernel returning its log-sum-exp runs them
(CPU: torch's flash kernel on shifted slices; CUDA: FlexAttention with a block-sparse BlockMask
per tail, no score_mod), and only the band is computed on the side, in blocks; everything is
combined by log-sum-exp. Memory is linear in L. Self-attention only (Lq = Lk, no offset), key
padding masks only. On CPU exact but not faster than ``gather``; on CUDA what `auto` trains
with (docs/performance.md).
"""
from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from relpos_lab.core.attention.flex import flex_attention_lse, flex_block_mask

_FLASH_CPU = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_FLASH_CPU_BACKWARD = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)
_HAS_FLEX = importlib.util.find_spec("torch.nn.attention.flex_attention") is not None  # found, not imported


BAND_BLOCK = 16
"""Query rows per band block (at least k): each block meets 3·block keys in one small matmul."""

BANDED_COMPILE = False
"""On CUDA, compile banded's whole core (band, combination and the FlexAttention tails) as one
graph. Off: torch 2.11's inductor fails to compile it on CUDA ("ValueError: The argument
'-15 + ((-1))' is not comparable" in its tiling), although torch 2.13 compiles it
exactly on CPU (tests/test_attention.py). Eager, only the FlexAttention tails are compiled."""

_compiled_banded = None


def unsupported(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
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
    if dropout_p > 0 or attn_bias is not None or rel_bias is not None:
        return "attention dropout or a score bias"
    if max_distance < 1 or max_distance >= q.shape[-2]:
        return "max_distance outside [1, L)"
    if attn_mask is not None and (attn_mask.dim() != 4 or attn_mask.shape[1:3] != (1, 1)):
        return "masks other than key padding (B, 1, 1, Lk)"
    return None


def attend(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
           attn_bias, scale):
    """CUDA builds the tails' BlockMasks here, outside the core, where their cache (one padding
    mask per batch, shared by the layers) works even when the core is compiled."""
    n = q.shape[-2]
    keep = attn_mask.reshape(attn_mask.shape[0], n).expand(q.shape[0], n) if attn_mask is not None else None
    if q.device.type == "cpu":
        return _banded_core(q, k, v, rel_k, rel_v, max_distance, keep, is_causal, scale, None, False)
    masks = tuple(flex_block_mask(attn_mask, False, n, n, 0, side, max_distance, q.device)
                  for side in (("left",) if is_causal else ("left", "right")))
    if not BANDED_COMPILE:
        return _banded_core(q, k, v, rel_k, rel_v, max_distance, keep, is_causal, scale, masks, True)
    global _compiled_banded
    if _compiled_banded is None:
        _compiled_banded = torch.compile(_banded_core)
    return _compiled_banded(q, k, v, rel_k, rel_v, max_distance, keep, is_causal, scale, masks, False)


def _banded_core(q, k, v, rel_k, rel_v, max_distance, keep, is_causal, scale, masks, compile_flex):
    """The band exactly, the tails as attention (CPU flash kernel, or FlexAttention with `masks`),
    combined by log-sum-exp. Query block b meets the keys of blocks b−1..b+1 in one small matmul;
    row r's band is a diagonal of that block, read and written as a strided view."""
    b, h, n, d = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    labels = 2 * max_distance + 1
    qw = (q @ rel_k.to(q.dtype).transpose(-2, -1)).to(acc) * scale if rel_k is not None else \
        q.new_zeros(b, h, n, labels, dtype=acc)

    # Band: offsets −k+1 … k−1 (… 0 when causal), labels 1 … 2k−1 (1 … k).
    block = max(max_distance, BAND_BLOCK)
    hi = 0 if is_causal else max_distance - 1
    width = hi + max_distance
    k_win, nb = _band_windows(k, block)
    v_win, _ = _band_windows(v, block)
    q_blk = F.pad(q, (0, 0, 0, nb * block - n)).view(b, h, nb, block, d)
    scores = (q_blk @ k_win.transpose(-1, -2)).to(acc) * scale  # (B, H, nb, block, 3·block)
    first = block - max_distance + 1  # row r's offset −k+1 sits at column block + r − k + 1
    e_band = _Diagonals.apply(scores, first, width).reshape(b, h, nb * block, width)[:, :, :n]
    e_band = e_band + qw[..., 1:1 + width]
    j = torch.arange(n, device=q.device)[:, None] + torch.arange(-max_distance + 1, hi + 1, device=q.device)[None, :]
    valid = (j >= 0) & (j < n)
    if keep is not None:
        valid = valid & keep[:, j.clamp(0, n - 1)][:, None]
    e_band = e_band.masked_fill(~valid, float("-inf"))

    # Tails: keys j <= i - k (left) and j >= i + k (right): plain attention and its log-sum-exp.
    if masks is None:
        o_left, lse_left, o_right, lse_right = _cpu_tails(q, k, v, keep, max_distance, is_causal, scale)
    else:
        o_left, lse_left, o_right, lse_right = _flex_tails(q, k, v, masks, max_distance, is_causal, scale, compile_flex)

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


def _cpu_tails(q, k, v, keep, max_distance, is_causal, scale):
    """The tails as causal flash attention on shifted slices: row i's left tail is keys 0..i−k."""
    b, h, n, d = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    empty_lse = q.new_full((b, h, n), float("-inf"), dtype=acc)
    empty_out = q.new_zeros(b, h, n, d, dtype=acc)
    near, far = slice(None, n - max_distance), slice(max_distance, None)  # the first and last n − k positions
    o_left, lse_left = _causal_tail(q[:, :, far], k[:, :, near], v[:, :, near],
                                    keep[:, near] if keep is not None else None, scale)
    o_left = torch.cat((empty_out[:, :, :max_distance], o_left.to(acc)), dim=2)
    lse_left = torch.cat((empty_lse[:, :, :max_distance], lse_left.to(acc)), dim=2)
    if not is_causal:
        o_right, lse_right = _causal_tail(q[:, :, near].flip(2), k[:, :, far].flip(2), v[:, :, far].flip(2),
                                          keep[:, far].flip(1) if keep is not None else None, scale)
        o_right = torch.cat((o_right.flip(2).to(acc), empty_out[:, :, :max_distance]), dim=2)
        lse_right = torch.cat((lse_right.flip(2).to(acc), empty_lse[:, :, :max_distance]), dim=2)

    return (o_left, lse_left) + ((None, None) if is_causal else (o_right, lse_right))


def _causal_tail(q, k, v, keep, scale):
    """Causal attention of q over k (row r sees keys 0..r) and its lse; -inf lse where no key is seen."""
    mask = None
    if keep is not None:
        mask = torch.zeros(keep.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~keep, float("-inf"))[:, None, None, :]
    out, lse = _FlashWithLse.apply(q.contiguous(), k.contiguous(), v.contiguous(), mask, scale)
    if keep is not None:
        seen = keep.cumsum(-1)[:, None, : q.shape[-2]] > 0  # (B, 1, Lq): any visible key among 0..r
        lse = lse.masked_fill(~seen, float("-inf"))
        out = out.masked_fill(~seen[..., None], 0.0)
    return out, lse


class _FlashWithLse(torch.autograd.Function):
    """torch's CPU flash attention returning its log-sum-exp, differentiable in both outputs.

    The kernel's backward computes dS = P ∘ (dP − rowsum(dO ∘ O)); a gradient g on the lse adds
    P ∘ g. Handing the backward one extra (zero) head dimension whose output column is −1 and
    whose incoming gradient is g shifts rowsum(dO ∘ O) by −g and leaves dP unchanged: exact.
    The extra columns are padded with zeros to a multiple of 16, the head dimensions the kernel's
    backward runs fast at (docs/dev/fused-kernel.md).
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


def _flex_tails(q, k, v, masks, max_distance, is_causal, scale, compiled):
    """The tails as FlexAttention over the whole sequence, each restricted by its BlockMask: the
    blocks wholly outside a tail are skipped, so the two tails together cost about one attention."""
    o_left, lse_left = flex_attention_lse(q, k, v, scale, block_mask=masks[0], compiled=compiled)
    if is_causal:
        return o_left, lse_left, None, None
    o_right, lse_right = flex_attention_lse(q, k, v, scale, block_mask=masks[1], compiled=compiled)
    return o_left, lse_left, o_right, lse_right


def _band_windows(x, block):
    """(B, H, nb, 3·block, D): for query block b, the keys of blocks b−1, b, b+1 (zero padded)."""
    b, h, n, d = x.shape
    nb = -(-n // block)
    x = F.pad(x, (0, 0, block, nb * block - n + block)).view(b, h, nb + 2, block, d)
    # Three shifted block views concatenated (not Tensor.unfold: compiled, the backward of its
    # overlapping windows came out wrong for k and v on torch 2.13's CPU inductor).
    return torch.cat((x[:, :, :-2], x[:, :, 1:-1], x[:, :, 2:]), dim=3), nb


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
