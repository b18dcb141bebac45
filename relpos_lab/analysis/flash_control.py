"""A plain FlashAttention-2 forward and backward in Triton: the control that `bench kernel --static`
measures the fused relative kernel against. Never used by `auto`.

Same habits as the fused kernel (fused_kernels.py), minus the relative terms: the same tile
helpers, base-2 softmax with log2 e folded into the scale, bounds checks only where the lengths
do not fill the tiles, the causal mask only on the tiles that cross the diagonal, dropout drawn
the same way, and the backward split the same way (dq per query block, dk/dv per key block).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from relpos_lab.core.attention.fused_kernels import dropped, load_row_stats, load_rows, load_transposed, visible

FULL = tl.constexpr(0)
DIAGONAL = tl.constexpr(1)


@triton.jit
def key_stages(m0, LK, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(diagonal_lo, hi): key tiles [0, diagonal_lo) need no causal mask, [diagonal_lo, hi) do."""
    hi = LK
    diagonal_lo = LK
    if CAUSAL:
        hi = min(LK, m0 + BLOCK_M)
        diagonal_lo = min(m0 // BLOCK_N * BLOCK_N, hi)
    return diagonal_lo, hi


@triton.jit
def query_stages(n0, LQ, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(lo, diagonal_hi): query blocks [lo, diagonal_hi) cross the diagonal, [diagonal_hi, LQ) do not."""
    lo = 0
    diagonal_hi = 0
    if CAUSAL:
        lo = min(n0 // BLOCK_M * BLOCK_M, LQ)
        diagonal_hi = min((n0 + BLOCK_N + BLOCK_M - 1) // BLOCK_M * BLOCK_M, LQ)
    return lo, diagonal_hi


@triton.jit
def _forward_tiles(acc, l_i, m_i, q, K_ptr, V_ptr, mask_ptr, stride_kn, stride_vn, rows, dims, lo, hi, LQ, LK, D,
                   qk_scale, seed, dropout_p, STAGE: tl.constexpr, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                   HAS_DROPOUT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                   BLOCK_N: tl.constexpr):
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        qk = tl.dot(q, load_transposed(K_ptr, cols, stride_kn, dims, LK, D, EVEN_N, EVEN_D))
        if STAGE == DIAGONAL or not EVEN_N or PADDING:
            qk = visible(qk, rows, rows, cols, mask_ptr, 0, 1, LQ, LK, PADDING, CAUSAL and STAGE == DIAGONAL, EVEN_N)
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(qk * qk_scale - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = dropped(p, seed, rows, cols, LK, dropout_p, HAS_DROPOUT)
        v = load_rows(V_ptr, cols, stride_vn, dims, LK, D, EVEN_N, EVEN_D, DIMS_FIRST=True)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def forward_kernel(Q, K, V, O, LSE, MASK_PTR, stride_qm, stride_kn, stride_vn, stride_om, LQ, LK, D, sm_scale, seed,
                   dropout_p, CAUSAL: tl.constexpr, PADDING: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One program: query block start_m of one (batch, head); (B·H, L, D) contiguous tensors."""
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    qk_scale = sm_scale * 1.4426950408889634
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_rows(Q + bh * LQ * stride_qm, rows, stride_qm, dims, LQ, D, EVEN_M, EVEN_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    diagonal_lo, hi = key_stages(start_m * BLOCK_M, LK, CAUSAL, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(2):  # FULL, DIAGONAL
        acc, l_i, m_i = _forward_tiles(
            acc, l_i, m_i, q, K + bh * LK * stride_kn, V + bh * LK * stride_vn, MASK_PTR + bh * LK, stride_kn,
            stride_vn, rows, dims,
            0 if stage == FULL else diagonal_lo, diagonal_lo if stage == FULL else hi, LQ, LK, D, qk_scale,
            seed + bh, dropout_p, STAGE=stage, CAUSAL=CAUSAL, PADDING=PADDING, HAS_DROPOUT=HAS_DROPOUT, EVEN_N=EVEN_N,
            EVEN_D=EVEN_D, BLOCK_N=BLOCK_N)
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = tl.where(seen[:, None], acc * (1.0 / l_safe)[:, None], 0.0)  # as the fused forward normalises
    tl.store(O + bh * LQ * stride_om + rows[:, None] * stride_om + dims[None, :], out.to(O.dtype.element_ty),
             mask=(rows[:, None] < LQ) & (dims[None, :] < D))
    tl.store(LSE + bh * LQ + rows, tl.where(seen, m_i + tl.log2(l_safe), float("inf")), mask=rows < LQ)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, K_ptr, V_ptr, mask_ptr, stride_kn, stride_vn, rows, dims, lo, hi, LQ, LK, D,
              qk_scale, seed, dropout_p, STAGE: tl.constexpr, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
              HAS_DROPOUT: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_N: tl.constexpr):
    for n0 in range(lo, hi, BLOCK_N):
        cols = n0 + tl.arange(0, BLOCK_N)
        k = load_rows(K_ptr, cols, stride_kn, dims, LK, D, EVEN_N, EVEN_D)
        v = load_rows(V_ptr, cols, stride_vn, dims, LK, D, EVEN_N, EVEN_D)
        qk = tl.dot(q, tl.trans(k))
        if STAGE == DIAGONAL or not EVEN_N or PADDING:
            qk = visible(qk, rows, rows, cols, mask_ptr, 0, 1, LQ, LK, PADDING, CAUSAL and STAGE == DIAGONAL, EVEN_N)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        dp = dropped(tl.dot(do, tl.trans(v)), seed, rows, cols, LK, dropout_p, HAS_DROPOUT)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k)
    return dq


@triton.jit
def backward_dq_kernel(Q, K, V, O, DO, LSE, DQ, DELTA, MASK_PTR, stride_qm, stride_kn, stride_vn, stride_om, LQ, LK, D,
                       sm_scale, seed, dropout_p, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                       HAS_DROPOUT: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0)
    bh = tl.program_id(1)
    qk_scale = sm_scale * 1.4426950408889634
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q = load_rows(Q + bh * LQ * stride_qm, rows, stride_qm, dims, LQ, D, EVEN_M, EVEN_D)
    do = load_rows(DO + bh * LQ * stride_om, rows, stride_om, dims, LQ, D, EVEN_M, EVEN_D)
    o = load_rows(O + bh * LQ * stride_om, rows, stride_om, dims, LQ, D, EVEN_M, EVEN_D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
    tl.store(DELTA + bh * LQ + rows, delta, mask=rows < LQ)
    lse = tl.load(LSE + bh * LQ + rows, mask=rows < LQ, other=float("inf"))
    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    diagonal_lo, hi = key_stages(start_m * BLOCK_M, LK, CAUSAL, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(2):
        dq = _dq_tiles(dq, q, do, lse, delta, K + bh * LK * stride_kn, V + bh * LK * stride_vn, MASK_PTR + bh * LK,
                       stride_kn, stride_vn, rows, dims, 0 if stage == FULL else diagonal_lo,
                       diagonal_lo if stage == FULL else hi,
                       LQ, LK, D, qk_scale, seed + bh, dropout_p, STAGE=stage, CAUSAL=CAUSAL, PADDING=PADDING,
                       HAS_DROPOUT=HAS_DROPOUT, EVEN_N=EVEN_N, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N)
    tl.store(DQ + bh * LQ * stride_qm + rows[:, None] * stride_qm + dims[None, :],
             (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rows[:, None] < LQ) & (dims[None, :] < D))


@triton.jit
def _dkdv_tiles(dk, dv, k, v, Q_ptr, DO_ptr, LSE_ptr, DELTA_ptr, mask_ptr, stride_qm, stride_om, cols, dims, lo, hi,
                LQ, LK, D, qk_scale, seed, dropout_p, STAGE: tl.constexpr, CAUSAL: tl.constexpr,
                PADDING: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr, BLOCK_M: tl.constexpr):
    for m0 in range(lo, hi, BLOCK_M):
        rows = m0 + tl.arange(0, BLOCK_M)
        q = load_rows(Q_ptr, rows, stride_qm, dims, LQ, D, EVEN_M, EVEN_D)
        do = load_rows(DO_ptr, rows, stride_om, dims, LQ, D, EVEN_M, EVEN_D)
        lse, delta = load_row_stats(LSE_ptr, DELTA_ptr, rows, LQ, EVEN_M)
        qk = tl.dot(q, tl.trans(k))
        if STAGE == DIAGONAL or not EVEN_N or PADDING:
            qk = visible(qk, rows, rows, cols, mask_ptr, 0, 1, LQ, LK, PADDING, CAUSAL and STAGE == DIAGONAL, EVEN_N)
        p = tl.exp2(qk * qk_scale - lse[:, None])
        dv += tl.dot(tl.trans(dropped(p, seed, rows, cols, LK, dropout_p, HAS_DROPOUT).to(do.dtype)), do)
        dp = dropped(tl.dot(do, tl.trans(v)), seed, rows, cols, LK, dropout_p, HAS_DROPOUT)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    return dk, dv


@triton.jit
def backward_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, MASK_PTR, stride_qm, stride_kn, stride_vn, stride_om, LQ, LK,
                         D, sm_scale, seed, dropout_p, CAUSAL: tl.constexpr, PADDING: tl.constexpr,
                         HAS_DROPOUT: tl.constexpr, EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    start_n = tl.program_id(0)
    bh = tl.program_id(1)
    qk_scale = sm_scale * 1.4426950408889634
    n0 = start_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = load_rows(K + bh * LK * stride_kn, cols, stride_kn, dims, LK, D, EVEN_N, EVEN_D)
    v = load_rows(V + bh * LK * stride_vn, cols, stride_vn, dims, LK, D, EVEN_N, EVEN_D)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    lo, diagonal_hi = query_stages(n0, LQ, CAUSAL, BLOCK_M, BLOCK_N)
    for stage in tl.static_range(2):
        dk, dv = _dkdv_tiles(dk, dv, k, v, Q + bh * LQ * stride_qm, DO + bh * LQ * stride_om, LSE + bh * LQ,
                             DELTA + bh * LQ, MASK_PTR + bh * LK, stride_qm, stride_om, cols, dims,
                             diagonal_hi if stage == FULL else lo, LQ if stage == FULL else diagonal_hi,
                             LQ, LK, D, qk_scale, seed + bh, dropout_p, STAGE=stage, CAUSAL=CAUSAL, PADDING=PADDING,
                             HAS_DROPOUT=HAS_DROPOUT, EVEN_M=EVEN_M, EVEN_N=EVEN_N, EVEN_D=EVEN_D, BLOCK_M=BLOCK_M)
    mask = (cols[:, None] < LK) & (dims[None, :] < D)
    tl.store(DK + bh * LK * stride_kn + cols[:, None] * stride_kn + dims[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=mask)
    tl.store(DV + bh * LK * stride_vn + cols[:, None] * stride_vn + dims[None, :], dv.to(DV.dtype.element_ty),
             mask=mask)


def launches(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, dropout_p: float, blocks: dict,
             mask: torch.Tensor | None = None):
    """[(kernel, grid, args, constexprs)] of one forward and backward over contiguous (B·H, L, D)
    tensors, mask (B·H, Lk) uint8 the keys that may be seen (padding) or None: what `attention`
    runs, and what `bench kernel --static` compiles."""
    bh, lq, d = q.shape
    lk = k.shape[1]
    block_d = max(16, triton.next_power_of_2(d))
    even = dict(EVEN_M=lq % blocks["BLOCK_M"] == 0, EVEN_N=lk % blocks["BLOCK_N"] == 0, EVEN_D=d == block_d)
    meta = dict(CAUSAL=causal, PADDING=mask is not None, HAS_DROPOUT=dropout_p > 0, **even, **blocks,
                BLOCK_D=block_d)
    mask = mask if mask is not None else q
    o, do, dq, dk, dv = (torch.empty_like(t) for t in (q, q, q, k, v))
    lse, delta = (torch.empty(bh * lq, device=q.device, dtype=torch.float32) for _ in range(2))
    scalars = (lq, lk, d, d ** -0.5, 0, dropout_p)
    rows = triton.cdiv(lq, blocks["BLOCK_M"])
    return [(forward_kernel, (rows, bh), (q, k, v, o, lse, mask, d, d, d, d) + scalars, meta),
            (backward_dq_kernel, (rows, bh), (q, k, v, o, do, lse, dq, delta, mask, d, d, d, d) + scalars, meta),
            (backward_dkdv_kernel, (triton.cdiv(lk, blocks["BLOCK_N"]), bh),
             (q, k, v, do, lse, delta, dk, dv, mask, d, d, d, d) + scalars, meta)]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False, dropout_p: float = 0.0,
              blocks: dict | None = None, mask: torch.Tensor | None = None):
    """(out, dq, dk, dv) for grad_out = ones: the control run for real, to show it computes attention."""
    blocks = blocks or {"BLOCK_M": 16, "BLOCK_N": 16}
    runs = launches(q, k, v, causal, dropout_p, blocks, mask)
    for kernel, grid, args, meta in runs:
        if kernel is backward_dq_kernel:
            args[4].fill_(1.0)  # dO
        if kernel is backward_dkdv_kernel:
            args[3].fill_(1.0)
        kernel[grid](*args, **meta)
    out = runs[0][2][3]
    dq = runs[1][2][6]
    dk, dv = runs[2][2][6], runs[2][2][7]
    return out, dq, dk, dv
