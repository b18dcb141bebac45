"""The ``triton`` implementation: relation-aware attention as one FlashAttention-2-style kernel.

Shaw's terms live in the (2k+1)-wide label space of each query row, as in ``gather``:

    R_il = scale · q_i·w^K_l + b_l              the key term, plus a learned bias per offset
    e_ij = scale · q_i·k_j + R_i,l(i,j)          l(i,j) = clip(j − i, k) + k
    z_i  = Σ_j p_ij v_j + Σ_l M_il w^V_l        M_il = Σ_{j: l(i,j)=l} p_ij, the value term's masses

A key tile entirely left of the band (every j − i ≤ −k) has label 0 for all its pairs: its key
term is one scalar per row, R_i0, and its probability mass goes to M_i0 (right of the band:
label 2k). Only the tiles that cross the band gather R by label and gather p back into masses
(a row meets an interior label at most once per tile), so the tile loop runs in three stages —
left, band, right — and the common tiles do no label work at all.

The backward recomputes p from the saved log-sum-exp (FlashAttention-2, Algorithm 2): one kernel
per query block writes dq and the per-row label sums G_il = Σ_{l(i,j)=l} dS_ij and M_il; one per
key block writes dk and dv. The tables' gradients are then small matmuls outside the kernels,
dw^K = scale·Σ Gᵀq, db = Σ G, dw^V = Σ Mᵀ dO: no atomics, deterministic. Attention dropout
is drawn inside the kernels (Philox, keyed by a seed per call and head, counted by row and key),
so the backward redraws the very mask the forward used and nothing of size Lq·Lk is stored.

Runs on CUDA, and on CPU through Triton's interpreter (TRITON_INTERPRET=1 set before triton is
first imported): the very kernel code, exact but slow, which is how the tests prove it. What it
does not take (`unsupported` says why) goes to ``gather``: a dense ``attn_bias``, head dimensions
above 128, and a^K / a^V label spaces wider than 128 (max_distance > 63 where the sequence
reaches that far). A ``rel_bias`` alone may be as wide as the sequences (every offset): it is then
read per tile from memory and its gradient summed along each tile's diagonals into per-label rows
of each key block (`_add_diagonals`; none of this when the table needs no gradient, as ALiBi's).
Masks are read inside the kernel: a key-padding mask (B, 1, 1, Lk) as one vector per sequence, any other boolean mask tile by tile through its broadcast strides; causality is built
from indices.
"""
from __future__ import annotations

import importlib.util
import os
from typing import NamedTuple

import torch
from torch import Tensor

HAS_TRITON = importlib.util.find_spec("triton") is not None
MAX_LABELS = 128
"""Label-space width held in registers per query row (2k+1 rounded up to a power of two)."""
MAX_HEAD_DIM = 128

if HAS_TRITON:
    import triton
    import triton.language as tl

    INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")

    @triton.jit
    def _labels(rows_abs, cols, KMAX):
        """(BM, BN) clip(j − i, k) + k: the one place the kernels compute a pair's label."""
        return tl.minimum(tl.maximum(cols[None, :] - rows_abs[:, None], -KMAX), KMAX) + KMAX

    @triton.jit
    def _label_logits(q, wk_ptr, bias_ptr, swkl, D, scale, HAS_RK: tl.constexpr, HAS_BIAS: tl.constexpr,
                      NL, NLP: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """R (BM, NLP) = scale · q·w^Kᵀ + b: every label's logit term for a block of query rows."""
        labels = tl.arange(0, NLP)
        dims = tl.arange(0, BLOCK_D)
        r = tl.zeros((q.shape[0], NLP), dtype=tl.float32)
        if HAS_RK:
            wk = tl.load(wk_ptr + labels[:, None] * swkl + dims[None, :],
                         mask=(labels[:, None] < NL) & (dims[None, :] < D), other=0.0)
            r = tl.dot(q, tl.trans(wk), input_precision=PRECISION) * scale
        if HAS_BIAS:
            r += tl.load(bias_ptr + labels, mask=labels < NL, other=0.0)[None, :]
        return r

    @triton.jit
    def _column(x, label, NLP: tl.constexpr):
        """x[:, label] of a (BM, NLP) label-space tensor."""
        return tl.sum(tl.where(tl.arange(0, NLP)[None, :] == label, x, 0.0), 1)

    @triton.jit
    def _by_label(x_rows, x_lo, x_hi, rows_abs, n0, STAGE: tl.constexpr, KMAX,
                  BLOCK_N: tl.constexpr):
        """The label-space term of a tile, (BM, BN): x_rows[i, l(i, j)], one scalar per row off the band."""
        if STAGE == 0:
            out = tl.broadcast_to(x_lo[:, None], (x_lo.shape[0], BLOCK_N))
        elif STAGE == 2:
            out = tl.broadcast_to(x_hi[:, None], (x_hi.shape[0], BLOCK_N))
        else:
            out = tl.gather(x_rows, _labels(rows_abs, n0 + tl.arange(0, BLOCK_N), KMAX), 1)
        return out

    @triton.jit
    def _sum_by_label(x, rows_abs, n0, STAGE: tl.constexpr, KMAX, NLP: tl.constexpr,
                      BLOCK_N: tl.constexpr):
        """(BM, NLP): Σ_j x_ij over this tile's keys j with label l — the masses M, the sums G."""
        labels = tl.arange(0, NLP)[None, :]
        if STAGE == 0:
            out = tl.where(labels == 0, tl.sum(x, 1)[:, None], 0.0)
        elif STAGE == 2:
            out = tl.where(labels == 2 * KMAX, tl.sum(x, 1)[:, None], 0.0)
        else:
            lab = _labels(rows_abs, n0 + tl.arange(0, BLOCK_N), KMAX)
            lo = tl.sum(tl.where(lab == 0, x, 0.0), 1)
            hi = tl.sum(tl.where(lab == 2 * KMAX, x, 0.0), 1)
            key = labels - KMAX + rows_abs[:, None] - n0  # the one key of an interior label in this tile
            inside = (key >= 0) & (key < BLOCK_N) & (labels > 0) & (labels < 2 * KMAX)
            mid = tl.gather(x, tl.minimum(tl.maximum(key, 0), BLOCK_N - 1), 1)
            out = tl.where(inside, mid, 0.0) + tl.where(labels == 0, lo[:, None], 0.0) \
                + tl.where(labels == 2 * KMAX, hi[:, None], 0.0)
        return out

    @triton.jit
    def _visible(rows, rows_abs, cols, mask_ptr, smq, smk, LQ, LK, MASK: tl.constexpr, CAUSAL: tl.constexpr):
        """(BM, BN) bool: the key exists, the mask allows it — MASK 1: per key (padding), 2: per
        (query, key) — and, causal, it is not in the query's future."""
        ok = (cols < LK)[None, :] & (rows_abs[:, None] >= 0)
        if MASK == 1:
            ok = ok & (tl.load(mask_ptr + cols * smk, mask=cols < LK, other=0) != 0)[None, :]
        elif MASK == 2:
            ok = ok & (tl.load(mask_ptr + rows[:, None] * smq + cols[None, :] * smk,
                               mask=(rows[:, None] < LQ) & (cols[None, :] < LK), other=0) != 0)
        if CAUSAL:
            ok = ok & (cols[None, :] <= rows_abs[:, None])
        return ok

    @triton.jit
    def _dropped(x, seed, rows, cols, LK, PD, HAS_DROPOUT: tl.constexpr):
        """x under attention dropout: zero where Philox(seed, row·Lk + key) < p, else x / (1 − p).
        The backward draws the same numbers from the same (seed, row, key)."""
        if HAS_DROPOUT:
            kept = tl.rand(seed, rows[:, None] * LK + cols[None, :]) >= PD
            x = tl.where(kept, x / (1.0 - PD), 0.0)
        return x

    @triton.jit
    def _query_stages(start_m, OFFSET, LK, KMAX, CAUSAL: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """Key-tile bounds of a query block's three stages: [0, band_lo) left, [band_lo, band_hi)
        band, [band_hi, hi) right. Tiles off the band are exactly those with one label per side."""
        a0 = start_m * BLOCK_M + OFFSET
        a1 = a0 + BLOCK_M - 1
        hi = LK
        if CAUSAL:
            hi = tl.minimum(LK, a1 + 1)
        band_lo = tl.minimum((tl.maximum(a0 - KMAX + 1, 0) // BLOCK_N) * BLOCK_N, hi)
        band_hi = tl.maximum(tl.minimum((a1 + KMAX + BLOCK_N - 1) // BLOCK_N * BLOCK_N, hi), band_lo)
        # k = 0: one label for every pair, all "left" (a band tile would count label 0 as both ends).
        band_lo = tl.where(KMAX == 0, hi, band_lo)  # a select, not a branch: LK may be the constant 1
        band_hi = tl.where(KMAX == 0, hi, band_hi)
        return band_lo, band_hi, hi

    @triton.jit
    def _forward_stage(acc, l_i, m_i, mass, q, r, r_lo, r_hi, bias_ptr, k_ptr, v_ptr, keep_ptr, smq, smk, skn, svn,
                       rows, rows_abs, lo, hi, LQ, LK, D, scale, seed, PD,
                       STAGE: tl.constexpr, KMAX, NLP: tl.constexpr, HAS_R: tl.constexpr,
                       HAS_RV: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_DROPOUT: tl.constexpr, BIAS_WIDE: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """The online softmax over key tiles [lo, hi) of one stage."""
        dims = tl.arange(0, BLOCK_D)
        for n0 in range(lo, hi, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            kv_mask = (cols[:, None] < LK) & (dims[None, :] < D)
            k = tl.load(k_ptr + cols[:, None] * skn + dims[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            if HAS_R:
                s += _by_label(r, r_lo, r_hi, rows_abs, n0, STAGE, KMAX, BLOCK_N)
            if BIAS_WIDE:
                s += tl.load(bias_ptr + _labels(rows_abs, cols, KMAX))
            s = tl.where(_visible(rows, rows_abs, cols, keep_ptr, smq, smk, LQ, LK, MASK, CAUSAL), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen no key yet
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            p = _dropped(p, seed, rows, cols, LK, PD, HAS_DROPOUT)  # the normaliser l_i is taken before
            v = tl.load(v_ptr + cols[:, None] * svn + dims[None, :], mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
            if HAS_RV:
                mass = mass * alpha[:, None] + _sum_by_label(p, rows_abs, n0, STAGE, KMAX, NLP, BLOCK_N)
            m_i = m_new
        return acc, l_i, m_i, mass

    @triton.jit
    def _forward(Q, K, V, WK, WV, BIAS, KEEP, O, LSE,
                 sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, swkh, swkl, swvh, swvl, sbh, smb, smh, smq, smk,
                 sob, soh, som, H, LQ, LK, D, OFFSET, scale, seed, PD, L_BUCKET,
                 KMAX, NLP: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr,
                 HAS_BIAS: tl.constexpr, HAS_R: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_DROPOUT: tl.constexpr, BIAS_WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows_abs = rows + OFFSET
        dims = tl.arange(0, BLOCK_D)
        row_mask = (rows[:, None] < LQ) & (dims[None, :] < D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :], mask=row_mask, other=0.0)
        r = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
        if HAS_R:
            r = _label_logits(q, WK + h * swkh, BIAS + h * sbh, swkl, D, scale, HAS_RK, HAS_BIAS,
                              2 * KMAX + 1, NLP, BLOCK_D, PRECISION)
        r_lo = _column(r, 0, NLP)
        r_hi = _column(r, 2 * KMAX, NLP)

        acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        mass = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
        l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
        m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
        band_lo, band_hi, hi = _query_stages(start_m, OFFSET, LK, KMAX, CAUSAL, BLOCK_M, BLOCK_N)
        k_ptr = K + b * skb + h * skh
        v_ptr = V + b * svb + h * svh
        keep_ptr = KEEP + b * smb + h * smh
        acc, l_i, m_i, mass = _forward_stage(
            acc, l_i, m_i, mass, q, r, r_lo, r_hi, BIAS + h * sbh, k_ptr, v_ptr, keep_ptr, smq, smk, skn, svn, rows,
            rows_abs, 0, band_lo,
            LQ, LK, D, scale, seed + bh, PD, 0, KMAX, NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE,
            BLOCK_N, BLOCK_D, PRECISION)
        acc, l_i, m_i, mass = _forward_stage(
            acc, l_i, m_i, mass, q, r, r_lo, r_hi, BIAS + h * sbh, k_ptr, v_ptr, keep_ptr, smq, smk, skn, svn, rows,
            rows_abs, band_lo, band_hi,
            LQ, LK, D, scale, seed + bh, PD, 1, KMAX, NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE,
            BLOCK_N, BLOCK_D, PRECISION)
        acc, l_i, m_i, mass = _forward_stage(
            acc, l_i, m_i, mass, q, r, r_lo, r_hi, BIAS + h * sbh, k_ptr, v_ptr, keep_ptr, smq, smk, skn, svn, rows,
            rows_abs, band_hi, hi,
            LQ, LK, D, scale, seed + bh, PD, 2, KMAX, NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE,
            BLOCK_N, BLOCK_D, PRECISION)

        if HAS_RV:  # Σ_l M_il w^V_l, once per row block
            labels = tl.arange(0, NLP)
            wv = tl.load(WV + h * swvh + labels[:, None] * swvl + dims[None, :],
                         mask=(labels[:, None] < 2 * KMAX + 1) & (dims[None, :] < D), other=0.0)
            acc += tl.dot(mass.to(wv.dtype), wv, input_precision=PRECISION)
        seen = l_i > 0.0  # a fully masked row attends to nothing: zeros, and no gradient
        out = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        tl.store(O + b * sob + h * soh + rows[:, None] * som + dims[None, :], out.to(O.dtype.element_ty),
                 mask=row_mask)
        lse = tl.where(seen, m_i + tl.log(tl.where(seen, l_i, 1.0)), float("inf"))
        tl.store(LSE + bh * LQ + rows, lse, mask=rows < LQ)

    @triton.jit
    def _dq_stage(dq, g, mass, q, do, r, r_lo, r_hi, bias_ptr, dw, dw_lo, dw_hi, lse, delta, k_ptr, v_ptr, keep_ptr,
                  smq, smk, skn, svn, rows, rows_abs, lo, hi, LQ, LK, D, scale, seed, PD,
                  STAGE: tl.constexpr, KMAX, NLP: tl.constexpr, HAS_R: tl.constexpr,
                  HAS_RV: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                  BIAS_WIDE: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
        """dq, G and M of a query block over key tiles [lo, hi) of one stage."""
        dims = tl.arange(0, BLOCK_D)
        for n0 in range(lo, hi, BLOCK_N):
            cols = n0 + tl.arange(0, BLOCK_N)
            kv_mask = (cols[:, None] < LK) & (dims[None, :] < D)
            k = tl.load(k_ptr + cols[:, None] * skn + dims[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + cols[:, None] * svn + dims[None, :], mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            if HAS_R:
                s += _by_label(r, r_lo, r_hi, rows_abs, n0, STAGE, KMAX, BLOCK_N)
            if BIAS_WIDE:
                s += tl.load(bias_ptr + _labels(rows_abs, cols, KMAX))
            s = tl.where(_visible(rows, rows_abs, cols, keep_ptr, smq, smk, LQ, LK, MASK, CAUSAL), s, float("-inf"))
            p = tl.exp(s - lse[:, None])
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            if HAS_RV:
                dp += _by_label(dw, dw_lo, dw_hi, rows_abs, n0, STAGE, KMAX, BLOCK_N)
                mass += _sum_by_label(_dropped(p, seed, rows, cols, LK, PD, HAS_DROPOUT), rows_abs, n0, STAGE, KMAX,
                                      NLP, BLOCK_N)
            dp = _dropped(dp, seed, rows, cols, LK, PD, HAS_DROPOUT)  # the gradient of the kept, rescaled p
            ds = p * (dp - delta[:, None])
            dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
            if HAS_R:
                g += _sum_by_label(ds, rows_abs, n0, STAGE, KMAX, NLP, BLOCK_N)
        return dq, g, mass

    @triton.jit
    def _backward_dq(Q, K, V, WK, WV, BIAS, KEEP, O, DO, LSE, DQ, DELTA, G, M,
                     sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, swkh, swkl, swvh, swvl, sbh, smb, smh, smq, smk,
                     sob, soh, som, sdob, sdoh, sdom, sdqb, sdqh, sdqm, H, LQ, LK, D, OFFSET, scale, seed, PD,
                     L_BUCKET, KMAX, NLP: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr,
                     HAS_BIAS: tl.constexpr, HAS_R: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                     HAS_DROPOUT: tl.constexpr, BIAS_WIDE: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                     PRECISION: tl.constexpr):
        start_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rows_abs = rows + OFFSET
        dims = tl.arange(0, BLOCK_D)
        labels = tl.arange(0, NLP)
        row_mask = (rows[:, None] < LQ) & (dims[None, :] < D)
        q = tl.load(Q + b * sqb + h * sqh + rows[:, None] * sqm + dims[None, :], mask=row_mask, other=0.0)
        do = tl.load(DO + b * sdob + h * sdoh + rows[:, None] * sdom + dims[None, :], mask=row_mask, other=0.0)
        o = tl.load(O + b * sob + h * soh + rows[:, None] * som + dims[None, :], mask=row_mask, other=0.0)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # Σ_j p_ij dP_ij = dO_i·z_i
        tl.store(DELTA + bh * LQ + rows, delta, mask=rows < LQ)
        lse = tl.load(LSE + bh * LQ + rows, mask=rows < LQ, other=float("inf"))
        r = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
        if HAS_R:
            r = _label_logits(q, WK + h * swkh, BIAS + h * sbh, swkl, D, scale, HAS_RK, HAS_BIAS,
                              2 * KMAX + 1, NLP, BLOCK_D, PRECISION)
        r_lo = _column(r, 0, NLP)
        r_hi = _column(r, 2 * KMAX, NLP)
        dw = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)  # dO_i·w^V_l: the value term's share of dP
        if HAS_RV:
            wv = tl.load(WV + h * swvh + labels[:, None] * swvl + dims[None, :],
                         mask=(labels[:, None] < 2 * KMAX + 1) & (dims[None, :] < D), other=0.0)
            dw = tl.dot(do, tl.trans(wv), input_precision=PRECISION)
        dw_lo = _column(dw, 0, NLP)
        dw_hi = _column(dw, 2 * KMAX, NLP)

        dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
        g = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
        mass = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
        band_lo, band_hi, hi = _query_stages(start_m, OFFSET, LK, KMAX, CAUSAL, BLOCK_M, BLOCK_N)
        k_ptr = K + b * skb + h * skh
        v_ptr = V + b * svb + h * svh
        keep_ptr = KEEP + b * smb + h * smh
        dq, g, mass = _dq_stage(dq, g, mass, q, do, r, r_lo, r_hi, BIAS + h * sbh, dw, dw_lo, dw_hi, lse, delta, k_ptr, v_ptr,
                                keep_ptr, smq, smk, skn, svn, rows, rows_abs, 0, band_lo, LQ, LK, D, scale, seed + bh, PD, 0, KMAX,
                                NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BLOCK_N, BLOCK_D,
                                PRECISION)
        dq, g, mass = _dq_stage(dq, g, mass, q, do, r, r_lo, r_hi, BIAS + h * sbh, dw, dw_lo, dw_hi, lse, delta, k_ptr, v_ptr,
                                keep_ptr, smq, smk, skn, svn, rows, rows_abs, band_lo, band_hi, LQ, LK, D, scale, seed + bh, PD, 1, KMAX,
                                NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BLOCK_N, BLOCK_D,
                                PRECISION)
        dq, g, mass = _dq_stage(dq, g, mass, q, do, r, r_lo, r_hi, BIAS + h * sbh, dw, dw_lo, dw_hi, lse, delta, k_ptr, v_ptr,
                                keep_ptr, smq, smk, skn, svn, rows, rows_abs, band_hi, hi, LQ, LK, D, scale, seed + bh, PD, 2, KMAX,
                                NLP, HAS_R, HAS_RV, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BLOCK_N, BLOCK_D,
                                PRECISION)
        if HAS_RK:  # Σ_l G_il w^K_l, the key term's share of dq
            wk = tl.load(WK + h * swkh + labels[:, None] * swkl + dims[None, :],
                         mask=(labels[:, None] < 2 * KMAX + 1) & (dims[None, :] < D), other=0.0)
            dq += tl.dot(g.to(wk.dtype), wk, input_precision=PRECISION)
        tl.store(DQ + b * sdqb + h * sdqh + rows[:, None] * sdqm + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
                 mask=row_mask)
        label_mask = (rows[:, None] < LQ) & (labels[None, :] < 2 * KMAX + 1)
        label_ptrs = bh * LQ * NLP + rows[:, None] * NLP + labels[None, :]
        if HAS_R:
            tl.store(G + label_ptrs, g, mask=label_mask)
        if HAS_RV:
            tl.store(M + label_ptrs, mass, mask=label_mask)

    @triton.jit
    def _edge_logit(q, w_edge, b_edge, scale, HAS_RK: tl.constexpr, HAS_BIAS: tl.constexpr):
        """(BM,) R_il for one label l (0 or 2k) whose w^K row is w_edge: a tile off the band."""
        r = tl.zeros((q.shape[0],), dtype=tl.float32)
        if HAS_RK:
            r = tl.sum(q.to(tl.float32) * w_edge[None, :], 1) * scale
        if HAS_BIAS:
            r += b_edge
        return r

    @triton.jit
    def _dkdv_stage(dk, dv, k, v, wk, wk_lo, wk_hi, bias, b_lo, b_hi, wv, wv_lo, wv_hi, bias_ptr, dbias_ptr,
                    q_ptr, do_ptr, lse_ptr, delta_ptr, sqm, sdom, cols, keep_ptr, smq, smk, lo, hi, LQ, LK, D, OFFSET,
                    scale, seed, PD, STAGE: tl.constexpr, KMAX, NLP: tl.constexpr, HAS_RK: tl.constexpr,
                    HAS_RV: tl.constexpr, HAS_BIAS: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, BIAS_WIDE: tl.constexpr, BIAS_GRAD: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr):
        """dk, dv of a key block over query blocks [lo, hi) of one stage (from the keys' side: stage 2
        = queries far below the keys, every label 2k; stage 0 = far above, label 0)."""
        dims = tl.arange(0, BLOCK_D)
        for m0 in range(lo, hi, BLOCK_M):
            rows = m0 + tl.arange(0, BLOCK_M)
            rows_abs = rows + OFFSET
            row_mask = (rows[:, None] < LQ) & (dims[None, :] < D)
            q = tl.load(q_ptr + rows[:, None] * sqm + dims[None, :], mask=row_mask, other=0.0)
            do = tl.load(do_ptr + rows[:, None] * sdom + dims[None, :], mask=row_mask, other=0.0)
            lse = tl.load(lse_ptr + rows, mask=rows < LQ, other=float("inf"))
            delta = tl.load(delta_ptr + rows, mask=rows < LQ, other=0.0)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
            if STAGE == 1:
                if HAS_RK or HAS_BIAS:
                    r = tl.zeros((BLOCK_M, NLP), dtype=tl.float32)
                    if HAS_RK:
                        r = tl.dot(q, tl.trans(wk), input_precision=PRECISION) * scale
                    if HAS_BIAS:
                        r += bias[None, :]
                    s += tl.gather(r, _labels(rows_abs, cols, KMAX), 1)
            elif STAGE == 2:
                s += _edge_logit(q, wk_hi, b_hi, scale, HAS_RK, HAS_BIAS)[:, None]
            else:
                s += _edge_logit(q, wk_lo, b_lo, scale, HAS_RK, HAS_BIAS)[:, None]
            if BIAS_WIDE:
                s += tl.load(bias_ptr + _labels(rows_abs, cols, KMAX))
            s = tl.where(_visible(rows, rows_abs, cols, keep_ptr, smq, smk, LQ, LK, MASK, CAUSAL), s, float("-inf"))
            p = tl.exp(s - lse[:, None])
            dv += tl.dot(tl.trans(_dropped(p, seed, rows, cols, LK, PD, HAS_DROPOUT).to(do.dtype)), do,
                         input_precision=PRECISION)
            dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
            if HAS_RV:
                if STAGE == 1:
                    dp += tl.gather(tl.dot(do, tl.trans(wv), input_precision=PRECISION), _labels(rows_abs, cols, KMAX), 1)
                elif STAGE == 2:
                    dp += tl.sum(do.to(tl.float32) * wv_hi[None, :], 1)[:, None]
                else:
                    dp += tl.sum(do.to(tl.float32) * wv_lo[None, :], 1)[:, None]
            dp = _dropped(dp, seed, rows, cols, LK, PD, HAS_DROPOUT)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
            if BIAS_WIDE and BIAS_GRAD:
                _add_diagonals(ds, dbias_ptr, m0, cols, OFFSET, KMAX, BLOCK_M, BLOCK_N, WINDOW)
        return dk, dv

    @triton.jit
    def _add_diagonals(ds, dbias_ptr, m0, cols, OFFSET, KMAX, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       WINDOW: tl.constexpr):
        """A wide rel_bias's gradient: the tile's dS summed along its BM + BN − 1 diagonals (one
        offset j − i each), added into this key block's own row of per-label sums. Diagonals
        beyond ±k share the end labels: they are summed first, so every address is written once
        per tile. Read-modify-write in order by the one program that owns the row: deterministic."""
        w = tl.arange(0, WINDOW)
        rows_local = tl.arange(0, BLOCK_M)
        key = w[None, :] - (BLOCK_M - 1) + rows_local[:, None]  # the tile column on diagonal w of row i
        on_tile = (key >= 0) & (key < BLOCK_N)
        diag = tl.sum(tl.where(on_tile, tl.gather(ds, tl.minimum(tl.maximum(key, 0), BLOCK_N - 1), 1), 0.0), 0)
        offset = tl.min(cols, 0) - (m0 + OFFSET) - (BLOCK_M - 1) + w  # j − i of diagonal w, absolute positions
        label = tl.minimum(tl.maximum(offset, -KMAX), KMAX) + KMAX
        real = w < BLOCK_M + BLOCK_N - 1
        inside = real & (label > 0) & (label < 2 * KMAX)
        lo = tl.sum(tl.where(real & (label == 0), diag, 0.0), 0)
        hi = tl.where(KMAX > 0, tl.sum(tl.where(real & (label == 2 * KMAX), diag, 0.0), 0), 0.0)  # k = 0: one end
        tl.store(dbias_ptr + label, tl.load(dbias_ptr + label, mask=inside, other=0.0) + diag, mask=inside)
        tl.store(dbias_ptr, tl.load(dbias_ptr) + lo)
        tl.store(dbias_ptr + 2 * KMAX, tl.load(dbias_ptr + 2 * KMAX) + hi)
        tl.debug_barrier()

    @triton.jit
    def _backward_dkdv(Q, K, V, WK, WV, BIAS, KEEP, DO, LSE, DELTA, DK, DV, DBIAS, DBIAS_ROWS,
                       sqb, sqh, sqm, skb, skh, skn, svb, svh, svn, swkh, swkl, swvh, swvl, sbh, smb, smh, smq, smk,
                       sdob, sdoh, sdom, sdkb, sdkh, sdkn, sdvb, sdvh, sdvn, H, LQ, LK, D, OFFSET, scale, seed, PD,
                       L_BUCKET, KMAX, NLP: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr,
                       HAS_BIAS: tl.constexpr, HAS_R: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_DROPOUT: tl.constexpr, BIAS_WIDE: tl.constexpr, BIAS_GRAD: tl.constexpr,
                       BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr, PRECISION: tl.constexpr):
        start_n = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        n0 = start_n * BLOCK_N
        cols = n0 + tl.arange(0, BLOCK_N)
        dims = tl.arange(0, BLOCK_D)
        labels = tl.arange(0, NLP)
        col_mask = (cols[:, None] < LK) & (dims[None, :] < D)
        k = tl.load(K + b * skb + h * skh + cols[:, None] * skn + dims[None, :], mask=col_mask, other=0.0)
        v = tl.load(V + b * svb + h * svh + cols[:, None] * svn + dims[None, :], mask=col_mask, other=0.0)
        keep_ptr = KEEP + b * smb + h * smh
        dbias_ptr = DBIAS + (bh * DBIAS_ROWS + start_n) * (2 * KMAX + 1)  # this program's own row
        table_mask = (labels[:, None] < 2 * KMAX + 1) & (dims[None, :] < D)
        wk = tl.zeros((NLP, BLOCK_D), dtype=K.dtype.element_ty)
        wv = tl.zeros((NLP, BLOCK_D), dtype=V.dtype.element_ty)
        bias = tl.zeros((NLP,), dtype=tl.float32)
        if HAS_RK:
            wk = tl.load(WK + h * swkh + labels[:, None] * swkl + dims[None, :], mask=table_mask, other=0.0)
        if HAS_RV:
            wv = tl.load(WV + h * swvh + labels[:, None] * swvl + dims[None, :], mask=table_mask, other=0.0)
        if HAS_BIAS:
            bias = tl.load(BIAS + h * sbh + labels, mask=labels < 2 * KMAX + 1, other=0.0)
        wk_lo = tl.sum(tl.where(labels[:, None] == 0, wk.to(tl.float32), 0.0), 0)
        wk_hi = tl.sum(tl.where(labels[:, None] == 2 * KMAX, wk.to(tl.float32), 0.0), 0)
        wv_lo = tl.sum(tl.where(labels[:, None] == 0, wv.to(tl.float32), 0.0), 0)
        wv_hi = tl.sum(tl.where(labels[:, None] == 2 * KMAX, wv.to(tl.float32), 0.0), 0)
        b_lo = tl.sum(tl.where(labels == 0, bias, 0.0), 0)
        b_hi = tl.sum(tl.where(labels == 2 * KMAX, bias, 0.0), 0)

        # Query-block bounds of the three stages, from this key block's side.
        lo = 0
        if CAUSAL:  # query blocks entirely before the first key see none of it
            lo = (tl.maximum(n0 - OFFSET, 0) // BLOCK_M) * BLOCK_M
        band_lo = tl.minimum(tl.maximum((tl.maximum(n0 - KMAX - OFFSET + 1, 0) // BLOCK_M) * BLOCK_M, lo), LQ)
        first_above = (tl.maximum(n0 + BLOCK_N - 1 + KMAX - OFFSET, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
        band_hi = tl.maximum(tl.minimum(first_above, LQ), band_lo)
        band_lo = tl.where(KMAX == 0, lo, band_lo)  # k = 0: every query block is "above" (label 0)
        band_hi = tl.where(KMAX == 0, lo, band_hi)
        q_ptr = Q + b * sqb + h * sqh
        do_ptr = DO + b * sdob + h * sdoh
        dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
        dk, dv = _dkdv_stage(dk, dv, k, v, wk, wk_lo, wk_hi, bias, b_lo, b_hi, wv, wv_lo, wv_hi, BIAS + h * sbh, dbias_ptr,
                             q_ptr, do_ptr, LSE + bh * LQ, DELTA + bh * LQ, sqm, sdom, cols, keep_ptr, smq, smk,
                             lo, band_lo, LQ, LK, D, OFFSET, scale, seed + bh, PD, 2, KMAX, NLP, HAS_RK, HAS_RV,
                             HAS_BIAS, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BIAS_GRAD, BLOCK_M, BLOCK_N, BLOCK_D,
                             WINDOW,
                             PRECISION)
        dk, dv = _dkdv_stage(dk, dv, k, v, wk, wk_lo, wk_hi, bias, b_lo, b_hi, wv, wv_lo, wv_hi, BIAS + h * sbh, dbias_ptr,
                             q_ptr, do_ptr, LSE + bh * LQ, DELTA + bh * LQ, sqm, sdom, cols, keep_ptr, smq, smk,
                             band_lo, band_hi, LQ, LK, D, OFFSET, scale, seed + bh, PD, 1, KMAX, NLP, HAS_RK, HAS_RV,
                             HAS_BIAS, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BIAS_GRAD, BLOCK_M, BLOCK_N, BLOCK_D,
                             WINDOW,
                             PRECISION)
        dk, dv = _dkdv_stage(dk, dv, k, v, wk, wk_lo, wk_hi, bias, b_lo, b_hi, wv, wv_lo, wv_hi, BIAS + h * sbh, dbias_ptr,
                             q_ptr, do_ptr, LSE + bh * LQ, DELTA + bh * LQ, sqm, sdom, cols, keep_ptr, smq, smk,
                             band_hi, LQ, LQ, LK, D, OFFSET, scale, seed + bh, PD, 0, KMAX, NLP, HAS_RK, HAS_RV,
                             HAS_BIAS, MASK, CAUSAL, HAS_DROPOUT, BIAS_WIDE, BIAS_GRAD, BLOCK_M, BLOCK_N, BLOCK_D,
                             WINDOW,
                             PRECISION)
        tl.store(DK + b * sdkb + h * sdkh + cols[:, None] * sdkn + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
                 mask=col_mask)
        tl.store(DV + b * sdvb + h * sdvh + cols[:, None] * sdvn + dims[None, :], dv.to(DV.dtype.element_ty),
                 mask=col_mask)


def _configs(window: bool) -> list:
    """Block sizes, warps and stages tried once per shape class on a GPU (Hopper and Ampere). The
    dk/dv kernel also takes WINDOW, the power of two holding a tile's BM + BN − 1 diagonals."""
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, **({"WINDOW": _window(bm, bn)} if window else {})},
                          num_warps=w, num_stages=s)
            for bm, bn, w, s in ((128, 64, 8, 3), (64, 64, 4, 3), (128, 32, 4, 3), (64, 128, 4, 2))]


MIN_BLOCK_N = 16
"""At most the smallest key block of any config: a wide rel_bias's gradient has a row per key block."""


def _window(block_m: int, block_n: int) -> int:
    return triton.next_power_of_2(block_m + block_n - 1)


_TUNE_KEY = ["L_BUCKET", "NLP", "BLOCK_D", "HAS_RK", "HAS_RV", "HAS_BIAS", "MASK", "CAUSAL", "HAS_DROPOUT",
             "BIAS_WIDE"]
_INTERPRETER_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}
_kernels = None


def _get_kernels():
    """The three kernels, autotuned on a GPU; fixed small blocks under the interpreter (where
    autotuning would only multiply the run time)."""
    global _kernels
    if _kernels is None:
        if INTERPRETED:
            _kernels = (_forward, _backward_dq, _backward_dkdv)
        else:
            # The wide bias's gradient rows are read-modify-written: zeroed again before each
            # configuration the autotuner tries, or its trial runs would add up in them.
            _kernels = tuple(triton.autotune(configs=_configs(window=kernel is _backward_dkdv), key=_TUNE_KEY,
                                             reset_to_zero=["DBIAS"] if kernel is _backward_dkdv else None)(kernel)
                             for kernel in (_forward, _backward_dq, _backward_dkdv))
    return _kernels


def unsupported(q, k, v, rel_k, rel_v, rel_bias, max_distance, attn_mask, query_offset, dropout_p,
                attn_bias) -> str | None:
    """Why `triton` cannot run these arguments (None: it can)."""
    if not HAS_TRITON:
        return "this environment (triton is not installed)"
    if q.device.type == "cpu" and not INTERPRETED:
        return "CPU tensors unless TRITON_INTERPRET=1 was set before triton was imported (the interpreter)"
    if q.device.type not in ("cpu", "cuda"):
        return f"device {q.device.type}"
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"dtype {q.dtype}"
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] != q.shape[-1]:
        return f"head dimension {q.shape[-1]} (q, k) / {v.shape[-1]} (v): needs equal and at most {MAX_HEAD_DIM}"
    if not 0.0 <= dropout_p < 1.0:
        return f"dropout_p={dropout_p}"
    if attn_bias is not None:
        return "a dense attn_bias (express an offset bias as rel_bias)"
    if (rel_k is not None or rel_v is not None) and _label_space(
            _reach(q.shape[-2], k.shape[-2], max_distance, query_offset)) > MAX_LABELS:
        return (f"rel_k/rel_v with max_distance {max_distance} at these lengths (label space wider than "
                f"{MAX_LABELS}; a rel_bias alone may be wider)")
    return None


def _reach(lq: int, lk: int, kmax: int, query_offset: int) -> int:
    """The clipping distance that changes nothing here: no pair is farther apart than this."""
    return min(kmax, max(query_offset + lq - 1, lk - 1 - query_offset, 0))


def _label_space(kmax: int) -> int:
    return max(16, triton.next_power_of_2(2 * kmax + 1)) if HAS_TRITON else 2 * kmax + 1


def _bias_is_wide(rel_k, rel_v, rel_bias, kmax: int) -> bool:
    """A rel_bias alone whose label space does not fit the registers: read per tile from memory
    instead, its gradient summed along tile diagonals (`_add_diagonals`)."""
    return rel_bias is not None and rel_k is None and rel_v is None and _label_space(kmax) > MAX_LABELS


def attend(q, k, v, rel_k, rel_v, rel_bias, kmax, attn_mask, is_causal, query_offset, dropout_p, scale):
    """Tables are cut to the distances these lengths reach (exact: clipping beyond them is a
    no-op) and cast to the inputs' dtype; a (B, 1, 1, Lk) mask becomes per-key padding. Dropout's
    seed comes from torch's CPU generator, so torch.manual_seed reproduces it, with no device sync."""
    lq, lk = q.shape[-2], k.shape[-2]
    reach = _reach(lq, lk, kmax, query_offset)
    cut = slice(kmax - reach, kmax + reach + 1)
    rel_k = rel_k[..., cut, :].to(q.dtype) if rel_k is not None else None
    rel_v = rel_v[..., cut, :].to(v.dtype) if rel_v is not None else None
    rel_bias = rel_bias[..., cut].float() if rel_bias is not None else None
    mask = None  # viewed as bytes and broadcast by strides: no copy
    if attn_mask is not None:
        mask = attn_mask.view(torch.uint8).expand(q.shape[0], q.shape[1], lq, lk)
    seed = int(torch.randint(0, 2**30, (1,)).item()) if dropout_p > 0 else 0
    launch = _Launch(reach, bool(is_causal), query_offset, scale, seed, float(dropout_p))
    return _FusedRelativeAttention.apply(q, k, v, rel_k, rel_v, rel_bias, mask, launch)


class _Launch(NamedTuple):
    """The scalars of one call, shared by its forward and backward launches."""
    kmax: int
    causal: bool
    offset: int
    scale: float
    seed: int
    dropout_p: float


def dropout_keep(seed: int, batch: int, heads: int, lq: int, lk: int, dropout_p: float, device) -> Tensor:
    """(B, H, Lq, Lk) bool: the entries attention dropout keeps for `seed` — the kernels' own draw,
    for tests that rebuild a dropped-out reference."""
    out = torch.empty(batch * heads, lq, lk, dtype=torch.int8, device=device)
    block = 16
    _dropout_keep[(triton.cdiv(lq, block), triton.cdiv(lk, block), batch * heads)](
        out, seed, lq, lk, dropout_p, BLOCK=block)
    return out.bool().reshape(batch, heads, lq, lk)


if HAS_TRITON:
    @triton.jit
    def _dropout_keep(OUT, seed, LQ, LK, PD, BLOCK: tl.constexpr):
        rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        bh = tl.program_id(2)
        kept = _dropped(tl.full((BLOCK, BLOCK), 1.0, tl.float32), seed + bh, rows, cols, LK, PD, True) != 0.0
        tl.store(OUT + bh * LQ * LK + rows[:, None] * LK + cols[None, :], kept.to(tl.int8),
                 mask=(rows[:, None] < LQ) & (cols[None, :] < LK))


def _last_dim_contiguous(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _table(t: Tensor | None, like: Tensor):
    """(w, head stride, label stride) for rel_k / rel_v; a table shared by the heads has head stride 0."""
    if t is None:
        return like, 0, 0
    t = t.contiguous()
    if t.dim() == 2:
        return t, 0, t.stride(0)
    return t, t.stride(0), t.stride(1)


def _strides(*tensors: Tensor) -> list[int]:
    """Batch, head and row strides of (B, H, L, D) tensors whose last dimension is contiguous."""
    return [stride for t in tensors for stride in t.stride()[:3]]


class _FusedRelativeAttention(torch.autograd.Function):
    """Forward and backward of the fused kernels; saves q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(ctx, q, k, v, rel_k, rel_v, rel_bias, keep, launch: _Launch):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        o = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty(b * h * lq, device=q.device, dtype=torch.float32)
        args = _common_args(q, k, v, rel_k, rel_v, rel_bias, keep, launch)
        fwd, _, _ = _get_kernels()
        fwd[lambda meta: (triton.cdiv(lq, meta["BLOCK_M"]), b * h)](
            q, k, v, *args["tables"], args["keep"], o, lse, *_strides(q, k, v), *args["strides"], *_strides(o),
            h, lq, lk, d, launch.offset, launch.scale, launch.seed, launch.dropout_p, _bucket(lq, lk), **args["meta"])
        ctx.save_for_backward(q, k, v, rel_k, rel_v, rel_bias, keep, o, lse)
        ctx.launch = launch
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, rel_k, rel_v, rel_bias, keep, o, lse = ctx.saved_tensors
        launch = ctx.launch
        do = _last_dim_contiguous(do)
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        args = _common_args(q, k, v, rel_k, rel_v, rel_bias, keep, launch)
        nlp = args["meta"]["NLP"]
        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        delta = torch.empty(b * h * lq, device=q.device, dtype=torch.float32)
        has_r = rel_k is not None or rel_bias is not None
        g = torch.empty((b, h, lq, nlp) if has_r else (1,), device=q.device, dtype=torch.float32)
        mass = torch.empty((b, h, lq, nlp) if rel_v is not None else (1,), device=q.device, dtype=torch.float32)
        nl = 2 * launch.kmax + 1
        wide_grad = args["meta"]["BIAS_WIDE"] and ctx.needs_input_grad[5]  # ALiBi's fixed table needs none
        rows = triton.cdiv(lk, _INTERPRETER_BLOCKS["BLOCK_N"] if INTERPRETED else MIN_BLOCK_N) if wide_grad else 1
        dbias_rows = torch.zeros((b * h, rows, nl) if wide_grad else (1,), device=q.device, dtype=torch.float32)
        scalars = (h, lq, lk, d, launch.offset, launch.scale, launch.seed, launch.dropout_p, _bucket(lq, lk))
        _, bwd_dq, bwd_dkdv = _get_kernels()
        # dq's kernel also writes delta_i = dO_i·z_i, which the dk/dv kernel reads: it runs first.
        bwd_dq[lambda meta: (triton.cdiv(lq, meta["BLOCK_M"]), b * h)](
            q, k, v, *args["tables"], args["keep"], o, do, lse, dq, delta, g, mass, *_strides(q, k, v),
            *args["strides"], *_strides(o, do, dq), *scalars, **args["meta"])
        bwd_dkdv[lambda meta: (triton.cdiv(lk, meta["BLOCK_N"]), b * h)](
            q, k, v, *args["tables"], args["keep"], do, lse, delta, dk, dv, dbias_rows, rows, *_strides(q, k, v),
            *args["strides"], *_strides(do, dk, dv), *scalars, **args["meta"], BIAS_GRAD=wide_grad,
            **({"WINDOW": _window(*_INTERPRETER_BLOCKS.values())} if INTERPRETED else {}))
        d_rel_k = d_rel_v = d_rel_bias = None
        if rel_k is not None and ctx.needs_input_grad[3]:  # dw^K_l = scale · Σ_i G_il q_i
            d_rel_k = _per_table(torch.einsum("bhil,bhid->hld", g[..., :nl], q.to(g.dtype)) * launch.scale, rel_k)
        if rel_v is not None and ctx.needs_input_grad[4]:  # dw^V_l = Σ_i M_il dO_i
            d_rel_v = _per_table(torch.einsum("bhil,bhid->hld", mass[..., :nl], do.to(mass.dtype)), rel_v)
        if wide_grad:  # per key block and label, summed in a fixed order
            d_rel_bias = dbias_rows.view(b, h, rows, nl).sum((0, 2))
        elif rel_bias is not None and ctx.needs_input_grad[5]:  # db_l = Σ_i G_il
            d_rel_bias = g[..., :nl].sum((0, 2)).to(rel_bias.dtype)
        return dq, dk, dv, d_rel_k, d_rel_v, d_rel_bias, None, None


def _bucket(lq: int, lk: int) -> int:
    """The autotuning key's length: a power of two, so varying batch lengths do not re-tune."""
    return triton.next_power_of_2(max(lq, lk))


def _per_table(grad_per_head: Tensor, table: Tensor) -> Tensor:
    return (grad_per_head if table.dim() == 3 else grad_per_head.sum(0)).to(table.dtype)


def _common_args(q, k, v, rel_k, rel_v, rel_bias, keep, launch: _Launch) -> dict:
    """The kernels' shared arguments: tables with their strides, the padding vector, constexprs."""
    wk, swkh, swkl = _table(rel_k, q)
    wv, swvh, swvl = _table(rel_v, q)
    bias = rel_bias.contiguous() if rel_bias is not None else q
    sbh = bias.stride(0) if rel_bias is not None else 0
    wide = _bias_is_wide(rel_k, rel_v, rel_bias, launch.kmax)
    meta = dict(KMAX=launch.kmax, NLP=16 if wide else _label_space(launch.kmax), HAS_RK=rel_k is not None,
                HAS_RV=rel_v is not None, HAS_BIAS=rel_bias is not None and not wide, BIAS_WIDE=wide,
                HAS_R=rel_k is not None or (rel_bias is not None and not wide), MASK=_mask_kind(keep), CAUSAL=launch.causal,
                HAS_DROPOUT=launch.dropout_p > 0, BLOCK_D=max(16, triton.next_power_of_2(q.shape[-1])),
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    if INTERPRETED:
        meta.update(_INTERPRETER_BLOCKS)
    return {"tables": (wk, wv, bias), "keep": keep if keep is not None else q,
            "strides": (swkh, swkl, swvh, swvl, sbh, *(keep.stride() if keep is not None else (0, 0, 0, 0))),
            "meta": meta}


def _mask_kind(mask: Tensor | None) -> int:
    """0: no mask; 1: per key (the rows and heads broadcast: padding); 2: per (query, key)."""
    if mask is None:
        return 0
    return 1 if mask.stride(2) == 0 and mask.stride(1) == 0 else 2
