"""The ``triton`` implementation: relation-aware attention as one FlashAttention-2-style kernel.

Shaw's terms live in the (2k+1)-wide label space of each query row, as in ``gather``:

    R_il = scale · q_i·w^K_l + b_l              the key term, plus a learned bias per offset
    e_ij = scale · q_i·k_j + R_i,l(i,j)          l(i,j) = clip(j − i, k) + k
    z_i  = Σ_j p_ij v_j + Σ_l M_il w^V_l        M_il = Σ_{j: l(i,j)=l} p_ij, the value term's masses

This module is the host side: what the kernels take, the launches, the autograd Function and
the tables' gradients, dw^K = scale·Σ Gᵀq, db = Σ G, dw^V = Σ Mᵀ dO, as small matmuls outside
the kernels (no atomics, deterministic). The kernels themselves, and how a tile off the band
|j − i| < k costs no more than a plain flash tile, are in fused_kernels.py; the configs they launch
with (autotuning, register caps, band tiles, the spill check) in fused_tuning.py.

Runs on CUDA, and on CPU through Triton's interpreter (TRITON_INTERPRET=1 set before triton is
first imported): the very kernel code, exact but slow, which is how the tests prove it. What it
does not take (`unsupported` says why) goes to ``gather``: a dense ``attn_bias``, head dimensions
above 128, and a^K / a^V label tiles wider than 128 (max_distance > 64 where the sequence
reaches that far). A ``rel_bias`` alone may be as wide as the sequences (every offset): it is read
by label from memory like any bias, and its gradient summed along each tile's diagonals into
per-label rows of each key block (`add_diagonals`; none of this when the table needs no gradient,
as ALiBi's). Masks are read inside the kernel: a key-padding mask (B, 1, 1, Lk) as one vector per
sequence, any other boolean mask tile by tile through its broadcast strides; causality is built
from indices. Attention dropout is drawn inside the kernels (Philox, keyed by a seed per call and
head, counted by row and group of eight keys), so the backward redraws the very mask the forward used.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from relpos_lab.core.attention import masks
from relpos_lab.core.attention.fused_tuning import (
    HAS_TRITON,
    INTERPRETED,
    MIN_BLOCK_N,
    cdiv,
    get_kernels,
    power_of_2_at_least,
    window,
)

MAX_LABELS = 128
"""Label tile width per query row in the kernels (labels 1..2k, 2k rounded up to a power of two)."""
MAX_HEAD_DIM = 128

if HAS_TRITON:
    from relpos_lab.core.attention import fused_kernels as kernels

_INTERPRETER_BLOCKS = {"BLOCK_M": 16, "BLOCK_N": 16}
"""The blocks every launch takes under Triton's interpreter, which autotunes nothing."""


def unsupported(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
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
            _band(q.shape[-2], k.shape[-2], max_distance, query_offset)) > MAX_LABELS:
        return (f"rel_k/rel_v with max_distance {max_distance} at these lengths (label space wider than "
                f"{MAX_LABELS}; a rel_bias alone may be wider)")
    return None


def _band(lq: int, lk: int, max_distance: int, query_offset: int) -> int:
    """The band |j − i| < band where each pair has a label of its own: max_distance cut to the
    farthest pair of these lengths, so clipping at it changes nothing (the kernels' k)."""
    return min(max_distance, masks.max_offset(lq, lk, query_offset))


def _label_space(band: int) -> int:
    """Columns of the kernels' label tiles: labels 1..2k (label 0 is a row vector of its own)."""
    return max(16, power_of_2_at_least(2 * band))


def label_tile(rel_k, rel_v, rel_bias, band: int) -> int:
    """LABEL_TILE, the kernels' label tile width: a wide bias is read from memory, its tiles the narrowest."""
    return 16 if _bias_is_wide(rel_k, rel_v, rel_bias, band) else _label_space(band)


def _bias_is_wide(rel_k, rel_v, rel_bias, band: int) -> bool:
    """A rel_bias alone whose label space does not fit the registers: read per tile from memory
    instead, its gradient summed along tile diagonals (`_add_diagonals`)."""
    return rel_bias is not None and rel_k is None and rel_v is None and _label_space(band) > MAX_LABELS


def attend(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
           attn_bias, scale):
    """Eager calls: the kernels from an autograd Function, the lightest launch path (a compiled
    model calls fused_op.attend instead; `relative_attention` picks)."""
    rel_k, rel_v, rel_bias, mask, launch = prepare(q, k, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal,
                                                   query_offset, dropout_p, scale)
    return _FusedRelativeAttention.apply(q, k, v, rel_k, rel_v, rel_bias, mask, launch)


def prepare(q, k, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p, scale):
    """(rel_k, rel_v, rel_bias, mask, launch) as the launches take them. Tables are cut to the
    distances these lengths reach (exact: clipping beyond them is a no-op); the kernels cast w^K
    and w^V to the inputs' dtype as they load them (no cast kernels, forward or backward); a
    (B, 1, 1, Lk) mask becomes per-key padding. Dropout's seed is a tensor drawn on the inputs'
    device (no host sync; a compiled graph draws it anew at each run), so torch.manual_seed
    reproduces it."""
    lq, lk = q.shape[-2], k.shape[-2]
    band = _band(lq, lk, max_distance, query_offset)
    if band < max_distance:  # sliced only then: a slice's gradient is a zeroed copy
        cut = slice(max_distance - band, max_distance + band + 1)
        rel_k = rel_k[..., cut, :] if rel_k is not None else None
        rel_v = rel_v[..., cut, :] if rel_v is not None else None
        rel_bias = rel_bias[..., cut] if rel_bias is not None else None
    rel_bias = rel_bias.float() if rel_bias is not None else None  # (rel_k, rel_v: cast as the kernels load them)
    mask = None  # viewed as bytes and broadcast by strides: no copy
    if attn_mask is not None:
        mask = attn_mask.view(torch.uint8).expand(q.shape[0], q.shape[1], lq, lk)
    seed = torch.randint(0, 2**30, (1,), dtype=torch.int32, device=q.device) if dropout_p > 0 else None
    return rel_k, rel_v, rel_bias, mask, _Launch(band, bool(is_causal), query_offset, scale, seed, float(dropout_p))


class _Launch(NamedTuple):
    """The scalars of one call, shared by its forward and backward launches."""
    band: int
    causal: bool
    offset: int
    scale: float
    seed: Tensor | None  # (1,) int32, with dropout
    dropout_p: float


def dropout_keep(seed: int, batch: int, heads: int, lq: int, lk: int, dropout_p: float, device) -> Tensor:
    """(B, H, Lq, Lk) bool: the entries attention dropout keeps for `seed` — the kernels' own draw,
    for tests that rebuild a dropped-out reference."""
    out = torch.empty(batch * heads, lq, lk, dtype=torch.int8, device=device)
    block = 16
    kernels.dropout_keep_kernel[(cdiv(lq, block), cdiv(lk, block), batch * heads)](
        out, torch.tensor([seed], dtype=torch.int32, device=device), lq, lk, dropout_p, BLOCK=block)
    return out.bool().reshape(batch, heads, lq, lk)


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


def _label_table(b: int, h: int, lq: int, args: dict, like: Tensor, needed: bool = True) -> Tensor:
    """(B·H·Lq, LABEL_TILE + 1) float32 rows, one per query row, label l in column l (a placeholder
    when not needed). Columns past 2k pad the row to the kernels' constexpr width."""
    width = args["meta"]["LABEL_TILE"] + 1
    return torch.empty((b * h * lq, width) if needed else (1,), device=like.device, dtype=torch.float32)


def _by_label(table: Tensor, b: int, h: int, lq: int, n_labels: int) -> Tensor:
    """(B, H, Lq, 2k+1): a label table without its padding."""
    return table.view(b, h, lq, -1)[..., :n_labels]


def launch_forward(q, k, v, rel_k, rel_v, rel_bias, mask, launch: _Launch) -> tuple[Tensor, Tensor, Tensor, dict]:
    """The forward kernel: (output, log-sum-exp, the mass table the backward needs, the launch's
    arguments, which the backward reuses). q, k, v with a contiguous last dimension."""
    b, h, lq, _ = q.shape
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(b * h * lq, device=q.device, dtype=torch.float32)
    args = _common_args(q, k, v, rel_k, rel_v, rel_bias, mask, launch)
    mass = _label_table(b, h, lq, args, q, needed=rel_v is not None)
    # with both tables the forward writes the masses over its logits (fused_kernels.forward_kernel)
    logits = mass if rel_k is not None and rel_v is not None else _label_table(b, h, lq, args, q,
                                                                              needed=rel_k is not None)
    fwd, _, _, _ = get_kernels()
    fwd[lambda meta: (cdiv(lq, meta["BLOCK_M"]), h, b)](
        q, k, v, *args["tables"], args["mask"], o, lse, logits, mass,
        *_strides(q, k, v), *args["table_strides"], *args["mask_strides"], *_strides(o), *args["scalars"],
        **args["meta"])
    return o, lse, mass, args


class Needs(NamedTuple):
    """Which table gradients a backward computes (autograd's needs_input_grad, by name)."""
    rel_k: bool
    rel_v: bool
    rel_bias: bool

    @classmethod
    def of(cls, needs_input_grad) -> Needs:
        """From autograd's flags for the inputs (q, k, v, rel_k, rel_v, rel_bias, ...)."""
        inputs = dict(zip(("q", "k", "v", "rel_k", "rel_v", "rel_bias"), needs_input_grad))
        return cls(*(inputs[name] for name in cls._fields))


def launch_backward(do, q, k, v, rel_k, rel_v, rel_bias, mask, o, lse, mass, launch: _Launch, args: dict,
                    needs: Needs) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None]:
    """dq, dk, dv and the tables' gradients (None where not needed) from the forward's saved tensors."""
    do = _last_dim_contiguous(do)
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    nl = 2 * launch.band + 1
    wide = _bias_is_wide(rel_k, rel_v, rel_bias, launch.band)
    needs_g = (rel_k is not None and needs.rel_k) or (rel_bias is not None and not wide and needs.rel_bias)
    dq = torch.empty_like(q, memory_format=torch.contiguous_format)
    dk = torch.empty_like(k, memory_format=torch.contiguous_format)
    dv = torch.empty_like(v, memory_format=torch.contiguous_format)
    delta = torch.empty(b * h * lq, device=q.device, dtype=torch.float32)
    edges = torch.empty(b * h * kernels.EDGE_STATS.value * lq, device=q.device, dtype=torch.float32)
    logits = _label_table(b, h, lq, args, q, needed=rel_k is not None)
    values = _label_table(b, h, lq, args, q, needed=rel_v is not None)
    grad = _label_table(b, h, lq, args, q, needed=needs_g)
    wide_grad = wide and needs.rel_bias  # ALiBi's fixed table needs none
    rows = cdiv(lk, _INTERPRETER_BLOCKS["BLOCK_N"] if INTERPRETED else MIN_BLOCK_N) if wide_grad else 1
    dbias_rows = torch.zeros((b * h, rows, nl) if wide_grad else (1,), device=q.device, dtype=torch.float32)
    _, bwd_dq, bwd_dkdv, _ = get_kernels()
    # dq's kernel writes delta, the edge statistics and the logit and value tables, which the dk/dv
    # kernel reads: it runs first.
    bwd_dq[lambda meta: (cdiv(lq, meta["BLOCK_M"]), h, b)](
        q, k, v, *args["tables"], args["mask"], o, do, lse, dq, delta, edges, logits, values, grad,
        *_strides(q, k, v), *args["table_strides"], *args["mask_strides"], *_strides(o, do, dq), *args["scalars"],
        **args["meta"],
        NEEDS_G=needs_g)
    meta = args["meta"]
    bwd_dkdv[lambda meta: (cdiv(lk, meta["BLOCK_N"]), h, b)](
        q, k, v, args["tables"][2], args["mask"], do, lse, delta, edges, logits, values, dk, dv, dbias_rows, rows,
        *_strides(q, k, v), args["table_strides"].rel_bias_head, *args["mask_strides"], *_strides(do, dk, dv),
        *args["scalars"],
        **meta, BIAS_GRAD=wide_grad,
        **({"WINDOW": window(*_INTERPRETER_BLOCKS.values())} if INTERPRETED else {}))
    d_rel_k = d_rel_v = d_rel_bias = None
    pairs = {}  # dw^K_l = scale · Σ_i G_il q_i, dw^V_l = Σ_i M_il dO_i
    if rel_k is not None and needs.rel_k:
        pairs["k"] = (grad, q, rel_k)
    if rel_v is not None and needs.rel_v:
        pairs["v"] = (mass, do, rel_v)
    sums = dict(zip(pairs, _label_sums(list(pairs.values()), args, nl))) if pairs else {}
    if "k" in sums:
        d_rel_k = (sums["k"] * launch.scale).to(rel_k.dtype)
    if "v" in sums:
        d_rel_v = sums["v"].to(rel_v.dtype)
    if wide_grad:  # per key block and label, summed in a fixed order
        d_rel_bias = dbias_rows.view(b, h, rows, nl).sum((0, 2)).to(rel_bias.dtype)
    elif rel_bias is not None and needs.rel_bias:  # db_l = Σ_i G_il
        d_rel_bias = _by_label(grad, b, h, lq, nl).sum((0, 2)).to(rel_bias.dtype)
    return dq, dk, dv, d_rel_k, d_rel_v, d_rel_bias


class _FusedRelativeAttention(torch.autograd.Function):
    """Forward and backward of the fused kernels; saves q, k, v, the output, the log-sum-exp and
    the mass table (the value term's probabilities by label, which dw^V needs)."""

    @staticmethod
    def forward(ctx, q, k, v, rel_k, rel_v, rel_bias, mask, launch: _Launch):
        q, k, v = (_last_dim_contiguous(t) for t in (q, k, v))
        o, lse, mass, args = launch_forward(q, k, v, rel_k, rel_v, rel_bias, mask, launch)
        ctx.save_for_backward(q, k, v, rel_k, rel_v, rel_bias, mask, o, lse, mass)
        ctx.launch, ctx.args = launch, args  # (args: the saved tensors' views, strides and constexprs)
        return o

    @staticmethod
    def backward(ctx, do):
        needs = Needs.of(ctx.needs_input_grad)
        grads = launch_backward(do, *ctx.saved_tensors, ctx.launch, ctx.args, needs)
        return *grads, None, None


def _bucket(lq: int, lk: int) -> int:
    """The autotuning key's length: a power of two, so varying batch lengths do not re-tune."""
    return power_of_2_at_least(max(lq, lk))


def _label_sums(pairs: list[tuple[Tensor, Tensor, Tensor]], args: dict, n_labels: int) -> list[Tensor]:
    """For each (label table, x, w) of one or two: float32 Σ_i table[i, l] · x_i over each head's
    B·Lq rows, x (B, H, Lq, D), as w's gradient takes it: (H, 2k+1, D), or (2k+1, D) over all heads
    for a w they share. A share per block of rows (`label_sums_kernel`, both pairs in one launch),
    summed here in one reduction per pair: the label tiles in x's dtype on the tensor cores, x read
    once, where one einsum over all rows runs as narrow float32 GEMMs per head and copies
    (docs/dev/fused-kernel.md). Each sum is a tensor of its own, not a view into one for both: the
    custom op returns them, and its fake outputs (fused_op) are fresh contiguous tensors."""
    (table_a, x_a, _), (table_b, x_b, _) = pairs[0], pairs[-1]
    b, h, lq, d = x_a.shape
    meta = args["meta"]
    block = _INTERPRETER_BLOCKS["BLOCK_M"] if INTERPRETED else 64
    blocks = cdiv(lq, block)
    shares = torch.empty((len(pairs), b * h * blocks, meta["LABEL_TILE"] + 1, meta["BLOCK_D"]), device=x_a.device,
                         dtype=torch.float32)
    _, _, _, sums = get_kernels()
    sums[(blocks * len(pairs), h, b)](table_a, x_a, table_b, x_b, shares, *x_a.stride()[:3], *x_b.stride()[:3],
                                      h, lq, d, blocks, LABEL_TILE=meta["LABEL_TILE"], BLOCK_M=block,
                                      BLOCK_D=meta["BLOCK_D"], PRECISION=meta["PRECISION"])
    shares = shares.view(len(pairs), b, h, blocks, *shares.shape[2:])[..., :n_labels, :d]
    return [share.sum((0, 2) if w.dim() == 3 else (0, 1, 2)) for share, (_, _, w) in zip(shares, pairs)]


def _common_args(q, k, v, rel_k, rel_v, rel_bias, mask, launch: _Launch) -> dict:
    """The kernels' shared arguments: tables with their strides, the mask, scalars, constexprs.
    The bias goes in as rel_bias · log2 e: the kernels' logits are in base 2."""
    wk, swkh, swkl = _table(rel_k, q)
    wv, swvh, swvl = _table(rel_v, q)
    bias = (rel_bias.float() * kernels.LOG2E.value).contiguous() if rel_bias is not None else q
    sbh = bias.stride(0) if rel_bias is not None else 0
    meta = dict(LABEL_TILE=label_tile(rel_k, rel_v, rel_bias, launch.band),
                HAS_RK=rel_k is not None, HAS_RV=rel_v is not None, HAS_BIAS=rel_bias is not None,
                MASK=_mask_kind(mask), CAUSAL=launch.causal, HAS_DROPOUT=launch.dropout_p > 0,
                BLOCK_D=max(16, power_of_2_at_least(q.shape[-1])),
                PRECISION="ieee" if q.dtype == torch.float32 else "tf32")
    if INTERPRETED:
        meta.update(_INTERPRETER_BLOCKS)
    lq, lk = q.shape[-2], k.shape[-2]
    return {"tables": (wk, wv, bias), "mask": mask if mask is not None else q,
            "table_strides": TableStrides(swkh, swkl, swvh, swvl, sbh),
            "mask_strides": MaskStrides(*(mask.stride() if mask is not None else (0, 0, 0, 0))),
            "scalars": (q.shape[1], lq, lk, q.shape[-1], launch.offset, launch.band, launch.scale,
                        launch.seed if launch.seed is not None else q, launch.dropout_p, _bucket(lq, lk)),
            "meta": meta}


class TableStrides(NamedTuple):
    """The tables' strides the kernels take (0 where a table is shared by the heads, or absent)."""
    rel_k_head: int
    rel_k_label: int
    rel_v_head: int
    rel_v_label: int
    rel_bias_head: int


class MaskStrides(NamedTuple):
    """The mask's strides (0 where it broadcasts, or is absent)."""
    batch: int
    head: int
    query: int
    key: int


def _mask_kind(mask: Tensor | None) -> int:
    """The kernels' MASK: none, one per key (the rows and heads broadcast: padding), or per (query, key)."""
    if mask is None:
        return kernels.NO_MASK.value
    return kernels.KEY_MASK.value if mask.stride(2) == 0 and mask.stride(1) == 0 else kernels.DENSE_MASK.value
