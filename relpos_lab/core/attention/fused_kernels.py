"""The fused kernel's Triton programs: forward, backward dq, backward dk/dv (imported only with triton).

One query block's key tiles fall in three stages, by the labels l(i, j) = clip(j − i, k) + k of
their pairs (a0, a1: the block's first and last absolute row). Here k is `band`: the band
|j − i| < k where each pair has a label of its own, the call's max_distance cut to the distances
its lengths reach (`fused._band`), so 2k + 1 = n_labels. Each stage is a function of each kernel
(dk/dv's loops run over query blocks, the same three from the keys' side: `query_stages`):

    stage  keys (`key_stages`)  pairs                                       forward        dq        dk/dv
    BAND   [band_lo, band_hi)   some |j − i| < k: labels read pair by pair  forward_band   dq_band   dkdv_band
    LEFT   [0, band_lo)         every j − i ≤ −k: label 0, a term per row   forward_left   dq_left   dkdv_left
    RIGHT  [band_hi, hi)        every j − i ≥ k: label 2k, a term per row   forward_right  dq_right  dkdv_right
    both narrow fringes as one tile (`fringe_pair`)                         forward_fringe_pair

A stage function owns its loops and reads what it needs by name from its kernel's *Tiles and
*Flags; per-tile arithmetic that stages share is in small helpers (`key_scores`, `raised_max`,
`add_values`, `dq_plain_tile`, `query_tile`, ...). Triton inlines them all: the split costs no
instruction (`bench kernel --static`).

Off the band a label's logit term R_il is a scalar per row, folded into the softmax's row offset,
and its probability mass is the row sum that the softmax takes anyway: those tiles cost what a
plain FlashAttention-2 tile costs. The band runs first; the causal mask, which only band tiles
can need, is applied there alone. The band's loop is not software-pipelined: it is a few tiles
long, a pipeline's prologue would cost more than it hides, and its label loads would be copied
through shared memory (`bench kernel --static` measures both). In the forward and dq the band's
tiles are BAND_BLOCK keys (`fused_tuning.band_block`: 64 and 32), narrower than BN: a 128-key band tile
spills, and a narrow band holds fewer pairs that need no label. It starts at a multiple of
FRINGE_BLOCK (32), and fringes of plain BAND_BLOCK and FRINGE_BLOCK tiles join it to the
BN-aligned plain stages (`key_stages`); the forward runs LEFT's FRINGE_BLOCK fringe and RIGHT's
as the two halves of one tile, right after the band (`fringe_pair`).

Per-pair label work goes through small tables in memory, one row per query row, read and written
at `row · (LABEL_TILE + 1) + l(i, j)` (L1-resident, and no register gather). LABEL_TILE, the
label tiles' width, is a power of two ≥ 2k (16 for a wide bias, which the kernels read from
memory), a constexpr, so that a tile of labels is stored and loaded without bounds checks:

    LOGITS (R)   R_il / scale = q_i·w^K_l + b_l / scale (units of q·k)   written by forward and dq
    VALUES (DW)  dO_i·w^V_l, the value term's share of dP                 written by dq
    MASS   (M)   M_il = Σ_{l(i,j)=l} p_ij, normalised, dropout applied    written by forward
    GRAD   (G)   G_il = Σ_{l(i,j)=l} dS_ij                                written by dq

An interior label l (0 < l < 2k) meets each row at one key only (j = i + l − k), so M and G
take interior values by plain stores (in the forward with w^K, M is R's own buffer: each interior
entry is read by its one pair before that pair's logit is stored over it, −inf where dropout drops
the pair, so that the epilogue needs no draw of its own), the edges by row sums
(G's label 0 not even that: a row of dS sums to zero; its label 2k, off the band, by the tensor
cores, dS times a column of ones).
The tables' gradients are small matmuls outside the kernels (dw^K = scale·Σ Gᵀq, db = Σ G,
dw^V = Σ Mᵀ dO): no atomics. dq also writes each row's edge terms beside lse and delta
(EDGE_STATS), so that the dk/dv kernel's plain tiles read them as a flash kernel reads lse.

The softmax runs in base 2 (exp2, log2 e folded into the scale). Dropout is Philox keyed by
(seed + batch·head, row·Lk + key), so the backward redraws the forward's mask; the seed is read
from a tensor (`seed_of`).
"""
from __future__ import annotations

import os
from typing import NamedTuple

import triton
import triton.language as tl

LOG2E = tl.constexpr(1.4426950408889634)
"""log2 e: the softmax runs in base 2, with log2 e folded into the scale and the bias."""
MIN_DOT = tl.constexpr(16)
"""The narrowest tl.dot takes: a row sum or a single label goes through the tensor cores this wide."""
NO_MASK = tl.constexpr(0)
KEY_MASK = tl.constexpr(1)
"""MASK: a mask per key (rows and heads broadcast: padding)."""
DENSE_MASK = tl.constexpr(2)
"""MASK: a mask per (query, key)."""
INLINE_PTX = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") in ("", "0"))
"""Compiled for a GPU (not interpreted): per-pair label loads and stores are inline PTX."""

class KeyStages(NamedTuple):
    """A query block's key bounds (`key_stages`), in key order. LEFT is [lo, left_hi) in BN tiles,
    then its wide fringe [left_hi, left_narrow) in BAND_BLOCK tiles and its narrow fringe
    [left_narrow, band_lo) in FRINGE_BLOCK tiles; the band is [band_lo, band_hi); RIGHT is its
    narrow fringe [band_hi, right_wide), its wide fringe [right_wide, right_lo) and [right_lo, hi)
    in BN tiles. The kernels run the band first, then LEFT's and RIGHT's loops from the band out."""
    lo: int
    left_hi: int
    left_narrow: int
    band_lo: int
    band_hi: int
    right_wide: int
    right_lo: int
    hi: int


class QueryBlock(NamedTuple):
    """A program's query rows, as the forward's and dq's key loops read them."""
    q: tl.tensor
    rows: tl.tensor  # (BM,) indices into Lq
    rows_abs: tl.tensor  # rows + OFFSET: the positions that labels and causality compare
    dims: tl.tensor
    LQ: tl.tensor


class KeySource(NamedTuple):
    """Where a (batch, head)'s key and value tiles are read from."""
    K: tl.tensor
    V: tl.tensor
    stride_kn: tl.tensor
    stride_vn: tl.tensor
    LK: tl.tensor
    D: tl.tensor


class Mask(NamedTuple):
    """A (batch, head)'s attention mask (MASK says which kind, if any)."""
    ptr: tl.tensor
    stride_q: tl.tensor
    stride_k: tl.tensor


class Dropout(NamedTuple):
    """A (batch, head)'s Philox key (seed + batch·head) and the probability a pair is dropped."""
    seed: tl.tensor
    p: tl.tensor


class ForwardTables(NamedTuple):
    """The label tables the forward's band reads and writes pair by pair, by row."""
    logit_rows: tl.tensor  # (BM,) pointers: the block's rows of the logit table (without w^K: the bias row)
    to_qk: tl.tensor  # what takes the logit table's entries to the units of q·k (`table_to_qk_units`)
    mass_rows: tl.tensor  # (BM,) pointers: its rows of the mass table (with w^K and w^V, logit_rows)
    band: tl.tensor  # k


class ForwardTiles(NamedTuple):
    """What each of the forward's key loops reads besides its keys."""
    block: QueryBlock
    keys: KeySource
    mask: Mask
    tables: ForwardTables
    qk_scale: tl.tensor  # sm_scale · log2 e
    dropout: Dropout


class ForwardFlags(NamedTuple):
    """The forward's compile-time switches that its key loops read (`forward_kernel`)."""
    IN_STAGE_UNITS: bool
    LAZY_HI: bool
    HAS_LOGITS: bool
    HAS_RV: bool
    IN_PLACE: bool
    LOW_REGISTERS: bool
    MASK: int
    CAUSAL: bool
    HAS_DROPOUT: bool
    EVEN_M: bool
    EVEN_N: bool
    EVEN_D: bool
    PRECISION: str


class Softmax(NamedTuple):
    """FlashAttention-2's online softmax of a query block, as the forward's stages pass it on."""
    acc: tl.tensor  # (BM, BLOCK_D) Σ p·v, at row maximum m
    l: tl.tensor  # (BM,) Σ p, at m
    m: tl.tensor  # (BM,) the row maximum (off the band with IN_STAGE_UNITS: less the stage's logit term)


class Masses(NamedTuple):
    """The value term's edge masses, unnormalised like acc: hi sums label 2k; lo every other label
    (the band's interior is taken out at the end, from the logits it stores by label), only with
    dropout, which takes mass out of the pairs and not out of l (without, lo = l − hi)."""
    lo: tl.tensor
    hi: tl.tensor
    hi_max: tl.tensor  # with LAZY_HI, the row maximum hi was last brought to (`forward_right`)


class FringePair(NamedTuple):
    """The forward's one tile for LEFT's and RIGHT's narrow fringes (`fringe_pair`)."""
    lo: tl.tensor  # its first key
    hi: tl.tensor  # past it: the tile runs where either fringe has keys, else hi = lo
    right_lo: tl.tensor  # its second half's first key
    r_left: tl.tensor  # the halves' logit terms (−inf for a missing half, which repeats the other's keys)
    r_right: tl.tensor


class BackwardRows(NamedTuple):
    """What dq reads of its query rows besides q: dO and the forward's saved statistics."""
    do: tl.tensor
    lse: tl.tensor  # (BM,) the log-sum-exp, base 2
    delta: tl.tensor  # (BM,) Σ_j p_ij dP_ij = dO_i·o_i


class DqTables(NamedTuple):
    """The label tables dq's band reads and writes pair by pair, by row (each (BM,) pointers)."""
    logit_rows: tl.tensor  # as `ForwardTables`'
    to_qk: tl.tensor
    value_rows: tl.tensor  # dO·w^V by label
    grad_rows: tl.tensor  # G, the band's interior values
    band: tl.tensor


class DqTiles(NamedTuple):
    """What each of dq's key loops reads besides its keys (as `ForwardTiles`)."""
    block: QueryBlock
    rows: BackwardRows
    keys: KeySource
    mask: Mask
    tables: DqTables
    qk_scale: tl.tensor
    dropout: Dropout


class EdgeTerms(NamedTuple):
    """An edge label's terms per row, with which an off-band tile of dq is a plain flash tile."""
    r: tl.tensor  # (BM,) its logit term, in the units of exp2
    dw: tl.tensor  # (BM,) dO·w^V (zeros without w^V)


class DqFlags(NamedTuple):
    """dq's compile-time switches that its key loops read (`backward_dq_kernel`)."""
    HAS_LOGITS: bool
    HAS_RV: bool
    NEEDS_G: bool
    MASK: int
    CAUSAL: bool
    HAS_DROPOUT: bool
    EVEN_M: bool
    EVEN_N: bool
    EVEN_D: bool
    PRECISION: str


class DkdvFlags(NamedTuple):
    """dk/dv's compile-time switches that its query loops read (`backward_dkdv_kernel`)."""
    TABLE_ROW: int  # LABEL_TILE + 1, a label table's row
    HAS_LOGITS: bool
    HAS_RV: bool
    BIAS_GRAD: bool
    MASK: int
    CAUSAL: bool
    HAS_DROPOUT: bool
    EVEN_M: bool
    EVEN_N: bool
    EVEN_D: bool
    BLOCK_N: int
    WINDOW: int
    PRECISION: str


class KeyBlock(NamedTuple):
    """A dk/dv program's key block, as each of its query loops reads it."""
    k: tl.tensor
    v: tl.tensor
    cols: tl.tensor  # (BN,) indices into Lk
    dims: tl.tensor
    LK: tl.tensor
    D: tl.tensor


class QuerySource(NamedTuple):
    """Where a (batch, head)'s query and dO tiles are read from."""
    Q: tl.tensor
    DO: tl.tensor
    stride_qm: tl.tensor
    stride_dom: tl.tensor
    LQ: tl.tensor
    OFFSET: tl.tensor  # the queries' position less their index


class DkdvTables(NamedTuple):
    """The label tables dk/dv's band reads pair by pair, and a wide rel_bias's gradient row."""
    logit_base: tl.tensor  # row 0 of the logit table (without w^K: the bias row, which every row reads)
    logit_stride: tl.tensor  # between its rows (0 for the bias row)
    to_qk: tl.tensor
    value_base: tl.tensor  # row 0 of the dO·w^V table
    dbias: tl.tensor  # this program's own row of per-label sums (BIAS_GRAD)
    band: tl.tensor


class DkdvTiles(NamedTuple):
    """What each of dk/dv's query loops reads besides its rows' statistics."""
    keys: KeyBlock
    queries: QuerySource
    mask: Mask
    tables: DkdvTables
    qk_scale: tl.tensor
    dropout: Dropout


class RowPointers(NamedTuple):
    """Where a dk/dv stage reads its query rows' lse and delta (off the band: EDGE_STATS's rows)."""
    lse: tl.tensor
    delta: tl.tensor


class QueryTile(NamedTuple):
    """One tile of query rows in a dk/dv loop (`query_tile`)."""
    rows: tl.tensor
    rows_abs: tl.tensor
    q: tl.tensor
    do: tl.tensor
    lse: tl.tensor
    delta: tl.tensor


class QueryStages(NamedTuple):
    """A key block's query bounds (`query_stages`): RIGHT is [lo, band_lo), the band [band_lo,
    band_hi), LEFT [band_hi, Lq)."""
    lo: int
    band_lo: int
    band_hi: int


class EdgeStats(NamedTuple):
    """The edge statistics, per query row, that dq writes for dk/dv's off-band tiles, each in a
    row of EDGE_STATS per (batch, head), Lq long, in this order (`edge_stat`)."""
    lse_lo: tl.tensor  # lse − R_i0
    lse_hi: tl.tensor  # lse − R_i,2k
    delta_lo: tl.tensor  # delta − dO_i·w^V_0
    delta_hi: tl.tensor  # delta − dO_i·w^V_2k
    dw_lo: tl.tensor  # dO_i·w^V_0: with dropout, where dO·w^V is dropped with dO·v and delta cannot take it
    dw_hi: tl.tensor  # dO_i·w^V_2k


@triton.constexpr_function
def has_wide_fringes(BLOCK_N, BAND_BLOCK):
    """Whether the key loops include the BAND_BLOCK fringes: where the band's tiles are narrower than BN."""
    return BAND_BLOCK < BLOCK_N


@triton.constexpr_function
def has_narrow_fringes(CAUSAL, BAND_BLOCK, FRINGE_BLOCK):
    """Whether they include the FRINGE_BLOCK fringes: where a fringe tile is narrower than a band
    tile, and never with causality, whose band keeps BAND_BLOCK's alignment and ends at the
    diagonal. The forward runs LEFT's narrow fringe and RIGHT's as one tile (`fringe_pair`)."""
    return FRINGE_BLOCK < BAND_BLOCK and not CAUSAL


@triton.jit
def seed_of(SEED, HAS_DROPOUT: tl.constexpr):
    """The call's dropout seed, read from memory: drawn as a tensor where the call is made, so a
    compiled graph or a CUDA graph draws a new one at each run (SEED is any pointer without dropout)."""
    seed = 0
    if HAS_DROPOUT:
        seed = tl.load(SEED)
    return seed


@triton.jit
def head_of_program(H):
    """(b, h, b·H + h): the (batch, head) of a program on the (blocks, H, B) grid (no division
    by H, as a (blocks, B·H) grid would need)."""
    b = tl.program_id(2)
    h = tl.program_id(1)
    return b, h, b * H + h


@triton.jit
def key_stages(m0, OFFSET, LK, band, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BAND_BLOCK: tl.constexpr, FRINGE_BLOCK: tl.constexpr):
    """The `KeyStages` of query block [m0, m0 + BM). The band [band_lo, band_hi) is the fewest BAND_BLOCK tiles, from
    a FRINGE_BLOCK boundary, that hold every key with an interior label (with k = 16, BM = 64:
    two tiles of 64 from a multiple of 32, where a multiple of 64 needs three); it ends at Lk at
    the latest where Lk is a multiple of FRINGE_BLOCK. The plain stages' BN tiles are aligned
    to BN, and fringes join them to the band: LEFT is [0, left_hi) + [left_hi, left_narrow) in
    BAND_BLOCK tiles + [left_narrow, band_lo) in FRINGE_BLOCK tiles; RIGHT [band_hi, right_wide)
    in FRINGE_BLOCK tiles + [right_wide, right_lo) in BAND_BLOCK tiles + [right_lo, hi). A fringe
    tile does a plain tile's work on fewer keys (its per-tile costs weigh a little more), a band
    tile about twice that: the band holds only the tiles that have labels to read. (The forward
    pays those per-tile costs once for both FRINGE_BLOCK fringes: `fringe_pair`.) With
    causality the band runs to the diagonal, aligned to BAND_BLOCK. Plain integer arithmetic,
    so `bench kernel --static` counts tiles by calling it from Python (`.fn`)."""
    a0 = m0 + OFFSET
    a1 = a0 + BLOCK_M - 1
    hi = LK
    if CAUSAL:  # the diagonal's tiles need the causal mask: they are band tiles, whatever k
        hi = max(min(LK, a1 + 1), 0)
        band_lo = min(max(a0 - band + 1, 0) // BAND_BLOCK * BAND_BLOCK, hi)
        band_hi = hi
    else:
        band_lo = min(max(a0 - band + 1, 0) // FRINGE_BLOCK * FRINGE_BLOCK, hi)
        tiles = (max(min(a1 + band, hi) - band_lo, 0) + BAND_BLOCK - 1) // BAND_BLOCK
        band_lo = max(band_lo - max(band_lo + tiles * BAND_BLOCK - hi, 0) // FRINGE_BLOCK * FRINGE_BLOCK, 0)
        band_hi = band_lo + tiles * BAND_BLOCK
    left_hi = band_lo // BLOCK_N * BLOCK_N
    left_narrow = band_lo // BAND_BLOCK * BAND_BLOCK
    right_lo = min((band_hi + BLOCK_N - 1) // BLOCK_N * BLOCK_N, hi)
    right_wide = min((band_hi + BAND_BLOCK - 1) // BAND_BLOCK * BAND_BLOCK, right_lo)
    return KeyStages(0, left_hi, left_narrow, band_lo, band_hi, right_wide, right_lo, hi)


@triton.jit
def fringe_pair(stages, r_lo, r_hi, BAND_BLOCK: tl.constexpr):
    """The forward's one tile (`FringePair`) for LEFT's narrow fringe [left_narrow, band_lo) and
    RIGHT's [band_hi, right_wide), FRINGE_BLOCK = BAND_BLOCK / 2 keys each or none. A missing
    half repeats the other's keys with a −inf term: they add nothing."""
    has_left = stages.band_lo > stages.left_narrow
    has_right = stages.right_wide > stages.band_hi
    first = tl.where(has_left, stages.left_narrow, stages.band_hi)
    return FringePair(lo=first, hi=tl.where(has_left | has_right, first + BAND_BLOCK, first),
                      right_lo=tl.where(has_right, stages.band_hi, first),
                      r_left=tl.where(has_left, r_lo, float("-inf")), r_right=tl.where(has_right, r_hi, float("-inf")))


@triton.jit
def query_stages(n0, OFFSET, LQ, band, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """(lo, band_lo, band_hi): the query-block bounds of key block [n0, n0 + BN), from the keys'
    side: [lo, band_lo) every label 2k (queries before the keys), [band_lo, band_hi) the band,
    [band_hi, LQ) every label 0 (queries after)."""
    lo = 0
    if CAUSAL:  # query blocks that end before the first key see none of it
        lo = min(max(n0 - OFFSET, 0) // BLOCK_M * BLOCK_M, LQ)
    band_lo = min(max(max(n0 - band - OFFSET + 1, 0) // BLOCK_M * BLOCK_M, lo), LQ)
    if CAUSAL:
        band_lo = lo
    above = (max(n0 + BLOCK_N - 1 + band - OFFSET, 0) + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    band_hi = max(min(above, LQ), band_lo)
    return QueryStages(lo=lo, band_lo=band_lo, band_hi=band_hi)


@triton.jit
def pair_offsets(rows_abs, cols):
    """(BM, BN) j − i, from which every label and mask of a band tile follows."""
    return cols[None, :] - rows_abs[:, None]


@triton.jit
def by_label(table_rows, band, distance):
    """(BM, BN) addresses in a label table of a band tile's pairs, from the rows' pointers and
    their clip(j − i, k) (label k's entry, plus the distance)."""
    return (table_rows + band)[:, None] + distance


@triton.jit
def label_of(offset, band):
    """clip(j − i, k) + k."""
    return clipped(offset, band) + band


@triton.jit
def clipped(offset, band):
    """clip(j − i, k): a label less k, to index table rows whose pointers already point at label k
    (one add per row, not one per pair)."""
    return tl.minimum(tl.maximum(offset, -band), band)


@triton.jit
def load_by_row(ptrs, rows, LQ, EVEN_M: tl.constexpr):
    """A (BM, BN) load at a per-pair address, where every row is a query row (beyond Lq: 0).

    Compiled, it is one PTX ld per element, in the layout the tile already has: `tl.load` would
    give it a coalesced layout and move the tile through shared memory and back (about 40
    barriers per band tile, `bench kernel --static`). Not pure: it must stay after the barrier
    that publishes the table. The interpreter runs `tl.load`."""
    if EVEN_M and INLINE_PTX:
        return tl.inline_asm_elementwise("ld.global.f32 $0, [$1];", "=f,l", [ptrs.to(tl.int64)], dtype=tl.float32,
                                         is_pure=False, pack=1)
    elif EVEN_M:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=(rows < LQ)[:, None], other=0.0)


@triton.jit
def store_by_row(ptrs, x, rows, LQ, EVEN_M: tl.constexpr):
    """The store that goes with `load_by_row`: one PTX st per element, compiled."""
    if EVEN_M and INLINE_PTX:
        tl.inline_asm_elementwise("st.global.f32 [$1], $2; mov.u32 $0, 0;", "=r,l,f", [ptrs.to(tl.int64), x],
                                  dtype=tl.int32, is_pure=False, pack=1)
    elif EVEN_M:
        tl.store(ptrs, x)
    else:
        tl.store(ptrs, x, mask=(rows < LQ)[:, None])


@triton.jit
def stored_by_row(ptrs, x, rows, LQ, EVEN_M: tl.constexpr):
    """x, after a `store_by_row` of it: a store the caller orders by using its result. Compiled, the
    PTX is pure, so that a tile whose layout holds each element in several registers (a narrow
    tile in a wide dot's layout) is stored once per element, not once per copy."""
    if EVEN_M and INLINE_PTX:
        return tl.inline_asm_elementwise("st.global.f32 [$1], $2; mov.b32 $0, $2;", "=f,l,f",
                                         [ptrs.to(tl.int64), x], dtype=tl.float32, is_pure=True, pack=1)
    store_by_row(ptrs, x, rows, LQ, EVEN_M)
    return x


@triton.jit
def store_where(ptrs, x, mask):
    """A masked store at per-element addresses; compiled, one predicated PTX st per element in
    the tile's own layout (see `load_by_row`)."""
    if INLINE_PTX:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.f32 [$1], $2; }"
                                  " mov.u32 $0, 0;", "=r,l,f,r", [ptrs.to(tl.int64), x, mask.to(tl.int32)],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(ptrs, x, mask=mask)


@triton.jit
def interior_index(rows_abs, cols, band):
    """(BM, BN) j − i + k − 1 per pair of a band tile: the interior labels 1..2k−1 are 0..2k−2
    in it (one unsigned compare), label l at column 1 + index."""
    return cols[None, :] - (rows_abs - band + 1)[:, None]


@triton.jit
def store_interior(table_rows, x, index, band, rows, LQ, EVEN_M: tl.constexpr):
    """A band tile's interior pairs into a label table, the only ones read back (its edge
    entries are written whole later). Most pairs of a band tile are edges; masked off, they cost
    no memory access (docs/dev/fused-kernel.md). Compiled, the address is one wide multiply-add
    from the row's pointer and the store is predicated by the unsigned compare."""
    if EVEN_M and INLINE_PTX:
        tl.inline_asm_elementwise("{ .reg .pred p; .reg .b64 a; setp.lt.u32 p, $2, $3; mad.wide.s32 a, $2, 4, $1;"
                                  " @p st.global.f32 [a], $4; } mov.u32 $0, 0;", "=r,l,r,r,f",
                                  [(table_rows + 1).to(tl.int64)[:, None], index,
                                   tl.maximum(2 * band - 1, 0), x], dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store((table_rows + 1)[:, None] + index, x, mask=interior_pairs(index, band, rows, LQ, EVEN_M))


@triton.jit
def interior_pairs(index, band, rows, LQ, EVEN_M: tl.constexpr):
    """The pairs of a band tile with an interior label (`interior_index` in 0..2k−2), in rows below Lq."""
    interior = (index >= 0) & (index < 2 * band - 1)
    if not EVEN_M:
        interior = interior & (rows < LQ)[:, None]
    return interior


@triton.jit
def store_interior_over(ptrs, x, index, band, rows, LQ, EVEN_M: tl.constexpr):
    """store_interior at the addresses the tile's logits were just loaded from, when the logit
    table becomes the mass table: an interior entry is read by its one pair only, so that pair's
    logit s takes its place, at the load's own address (no address arithmetic per pair)."""
    if EVEN_M and INLINE_PTX:
        tl.inline_asm_elementwise("{ .reg .pred p; setp.lt.u32 p, $2, $3; @p st.global.f32 [$1], $4; } mov.u32 $0, 0;",
                                  "=r,l,r,r,f", [ptrs.to(tl.int64), index, tl.maximum(2 * band - 1, 0), x],
                                  dtype=tl.int32, is_pure=False, pack=1)
    else:
        tl.store(ptrs, x, mask=interior_pairs(index, band, rows, LQ, EVEN_M))


@triton.jit
def load_rows(ptr, rows, stride, dims, n_rows, D, EVEN_ROWS: tl.constexpr, EVEN_D: tl.constexpr,
              DIMS_FIRST: tl.constexpr = False):
    """A (rows, BLOCK_D) tile; bounds are checked only where the shape needs it. DIMS_FIRST: the
    pointers are ptr + dims first, then the rows' offsets, so that each 64-bit address is one
    pointer plus one offset. The forward's V tiles take it (added the other way, ptxas builds
    those addresses from three parts in each pipelined loop's first loads); dk/dv's do not (with
    it, dk/dv's one config without spills with causality and dropout on sm_80 spills)."""
    if DIMS_FIRST:
        ptrs = (ptr + dims[None, :]) + rows[:, None] * stride
    else:
        ptrs = ptr + rows[:, None] * stride + dims[None, :]
    if EVEN_ROWS and EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(rows[:, None] < n_rows) & (dims[None, :] < D), other=0.0)


@triton.jit
def load_transposed(ptr, rows, stride, dims, n_rows, D, EVEN_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """load_rows' tile transposed (DIMS_FIRST), (BLOCK_D, rows), as q·kᵀ takes k: loaded in that
    shape, not transposed after (on sm_80 a non-pipelined tile transposed after loading reaches
    the tensor cores through shared memory in four passes, two barriers each)."""
    ptrs = (ptr + dims[:, None]) + rows[None, :] * stride
    if EVEN_ROWS and EVEN_D:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(rows[None, :] < n_rows) & (dims[:, None] < D), other=0.0)


@triton.jit
def visible(s, rows, rows_abs, cols, mask_ptr, stride_mq, stride_mk, LQ, LK, MASK: tl.constexpr,
            CAUSAL: tl.constexpr, EVEN_N: tl.constexpr):
    """s with −inf where the key may not be seen: beyond Lk (unless Lk fills the tiles), masked
    out (KEY_MASK: per key, padding; DENSE_MASK: per (query, key)), or, CAUSAL, in the query's future."""
    if not EVEN_N:
        s = tl.where((cols < LK)[None, :], s, float("-inf"))
    if MASK == KEY_MASK:
        s = tl.where((tl.load(mask_ptr + cols * stride_mk, mask=cols < LK, other=0) != 0)[None, :], s,
                     float("-inf"))
    elif MASK == DENSE_MASK:
        attend = tl.load(mask_ptr + rows[:, None] * stride_mq + cols[None, :] * stride_mk,
                         mask=(rows[:, None] < LQ) & (cols[None, :] < LK), other=0)
        s = tl.where(attend != 0, s, float("-inf"))
    if CAUSAL:
        s = tl.where(cols[None, :] <= rows_abs[:, None], s, float("-inf"))
    return s


@triton.jit
def interleaved(a, b):
    """[..., 2N] from two [..., N]: a's and b's elements alternating (join adds the last axis)."""
    return tl.reshape(tl.join(a, b), (a.shape[0], 2 * a.shape[1]))


@triton.jit
def dropout_counter(rows, key_groups, LK):
    """The Philox counter of row i's group of eight keys j // 8: rows of ⌈Lk / 8⌉ counters."""
    return rows * ((LK + 7) // 8) + key_groups


@triton.jit
def dropout_words(seed, rows, cols, LK):
    """The random 16-bit words of a tile's pairs (row i, key j): half j % 8 of one Philox-4x32-10
    draw whose counter is (i, j // 8), so that a draw serves eight keys (tl.rand would spend one
    on each). The tile's keys `cols` are consecutive from a multiple of 8, as every tile's are."""
    N: tl.constexpr = cols.shape[0]
    first, _ = tl.split(tl.reshape(cols, (N // 8, 2, 2, 2)))
    first, _ = tl.split(first)
    first, _ = tl.split(first)  # each group of eight keys' first
    r0, r1, r2, r3 = tl.randint4x(seed, dropout_counter(rows[:, None], (first // 8)[None, :], LK))
    quads = interleaved(interleaved(r0, r2), interleaved(r1, r3))  # word j % 4 for key j // 2
    return interleaved(quads & 0xFFFF, quads >> 16)


@triton.jit
def kept_under(words, dropout_p):
    """Dropout keeps a pair whose 16-bit word is at least round(p·2¹⁶): with probability within
    2⁻¹⁷ of 1 − p (the output is scaled by 1/(1 − p)), from an eighth of a Philox draw."""
    return words >= tl.cast(dropout_p * 65536.0 + 0.5, tl.uint32)


@triton.jit
def kept_pairs(seed, rows, cols, LK, dropout_p):
    """(BM, BN) which pairs of a tile dropout keeps."""
    return kept_under(dropout_words(seed, rows, cols, LK), dropout_p)


@triton.jit
def dropped(x, seed, rows, cols, LK, dropout_p, HAS_DROPOUT: tl.constexpr):
    """x under attention dropout: zero where the pair's word (dropout_words) is below p·2¹⁶, else x / (1 − p)."""
    if HAS_DROPOUT:
        x = tl.where(kept_pairs(seed, rows, cols, LK, dropout_p), x / (1.0 - dropout_p), 0.0)
    return x


@triton.jit
def label_zero(W, dims, D, DTYPE: tl.constexpr):
    """(MIN_DOT, BLOCK_D): w_0 in row 0, zeros below, so that label 0 goes through the tensor cores
    as a narrow dot beside the tile's."""
    row = tl.arange(0, MIN_DOT)[:, None]
    return tl.load(W + row * 0 + dims[None, :], mask=(row == 0) & (dims[None, :] < D), other=0.0).to(DTYPE)


@triton.jit
def label_vectors(W, stride_wl, labels, dims, n_labels, D, DTYPE: tl.constexpr):
    """(LABEL_TILE, BLOCK_D): w_1..w_2k, past 2k zeros, in the rows' DTYPE (a table of float32
    parameters under autocast is cast here, as it loads, not by the host)."""
    return tl.load(W + (labels[:, None] + 1) * stride_wl + dims[None, :],
                   mask=(labels[:, None] + 1 < n_labels) & (dims[None, :] < D), other=0.0).to(DTYPE)


@triton.jit
def table_product(x, W, stride_wl, labels, dims, n_labels, D, PRECISION: tl.constexpr):
    """x · w_lᵀ for every label of a (2k+1, D) table and a block of rows: labels 1..2k as a
    (BM, LABEL_TILE) tile (column c is label c + 1), label 0 as a row vector. Label 0 stays out of
    the tile so that k = 16 fits 32 columns, not 64."""
    w = label_vectors(W, stride_wl, labels, dims, n_labels, D, x.dtype)
    column0 = tl.sum(tl.dot(x, tl.trans(label_zero(W, dims, D, x.dtype)), input_precision=PRECISION), 1)
    return tl.dot(x, tl.trans(w), input_precision=PRECISION), column0  # (label 0: one nonzero column)


@triton.jit
def table_combination(acc, tile, column0, W, stride_wl, labels, dims, n_labels, D, DTYPE: tl.constexpr,
                      PRECISION: tl.constexpr):
    """acc + Σ_l m_il w_l, (BM, D), the masses in DTYPE: the tile's labels 1..2k by one dot, label 0
    by another, both accumulating into acc (no adds of their own)."""
    w = label_vectors(W, stride_wl, labels, dims, n_labels, D, DTYPE)
    first = tl.arange(0, MIN_DOT)[None, :] == 0
    out = tl.dot(tile.to(DTYPE), w, acc, input_precision=PRECISION)
    return tl.dot(tl.where(first, column0[:, None], 0.0).to(DTYPE), label_zero(W, dims, D, DTYPE), out,
                  input_precision=PRECISION)


@triton.jit
def store_label_rows(table_rows, tile, column0, rows, labels, LQ, EVEN_M: tl.constexpr):
    """A block's rows of a label table, from a tile (labels 1..LABEL_TILE: past 2k, the row's
    padding) and the label-0 column."""
    store_by_row(table_rows[:, None] + 1 + labels[None, :], tile, rows, LQ, EVEN_M)
    if EVEN_M:
        tl.store(table_rows, column0)
    else:
        tl.store(table_rows, column0, mask=rows < LQ)


@triton.jit
def interior_of(table_rows, rows, rows_abs, labels, band, LQ, LK, other, CAUSAL: tl.constexpr,
                EVEN_M: tl.constexpr):
    """(BM, LABEL_TILE) the values the band stored by label, for interior labels that name a key the
    band visited (j = i + l − k); `other` for the rest, whose entries may be stale. Every
    address stays in the (padded) row."""
    label = labels[None, :] + 1
    first = band - rows_abs  # the label of key 0
    end = tl.minimum(band + 1 if CAUSAL else 2 * band, first + LK)  # past the last one
    ok = (label - first[:, None]).to(tl.uint32) < tl.maximum(end - first, 0).to(tl.uint32)[:, None]
    if not EVEN_M:
        ok = ok & (rows < LQ)[:, None]
    return tl.where(ok, load_by_row(table_rows[:, None] + label, rows, LQ, EVEN_M), other)


@triton.jit
def with_edges(tile, lo, hi, labels, band):
    """(tile, label-0 column) with the edges set: label 2k (column 2k − 1) to hi, label 0 to lo
    (k = 0 has one label: lo + hi)."""
    tile = tl.where(labels[None, :] + 1 == 2 * band, hi[:, None], tile)
    return tile, lo + tl.where(band == 0, hi, 0.0)


@triton.jit
def logit_rows_of(q, WK, stride_wkl, BIAS, LOGITS, rows, labels, dims, n_labels, LQ, D, qk_scale,
                  HAS_RK: tl.constexpr, HAS_BIAS: tl.constexpr, EVEN_M: tl.constexpr, PRECISION: tl.constexpr):
    """(BM,) pointers to the logit table's rows, which the band reads by label. With w^K: this
    block's R in the units of q·k, q·w^Kᵀ + b / scale (the band adds it to q·k and scales the sum
    once, into exp2: one FFMA), written here (the caller's barrier makes it visible to the
    block); without: the bias row itself (· log2 e, the units of exp2), for every query."""
    logit_rows = BIAS + rows * 0
    if HAS_RK:
        r, r0 = table_product(q, WK, stride_wkl, labels, dims, n_labels, D, PRECISION)
        if HAS_BIAS:
            to_qk = 1.0 / qk_scale
            r += tl.load(BIAS + 1 + labels, mask=labels + 1 < n_labels, other=0.0)[None, :] * to_qk
            r0 += tl.load(BIAS) * to_qk
        logit_rows = LOGITS + rows * (labels.shape[0] + 1)
        store_label_rows(logit_rows, r, r0, rows, labels, LQ, EVEN_M)
    return logit_rows


@triton.jit
def table_to_qk_units(qk_scale, HAS_RK: tl.constexpr):
    """The factor that takes the logit table's entries to the units of q·k, in which the band adds
    them: 1 for a table of w^K (`logit_rows_of` writes it so), 1 / (scale · log2 e) for a bias
    row alone (stored · log2 e, the units of exp2)."""
    return 1.0 if HAS_RK else 1.0 / qk_scale


@triton.jit
def edge_logits(logit_rows, rows, LQ, band, qk_scale, HAS_RK: tl.constexpr, HAS_LOGITS: tl.constexpr):
    """(BM,) × 2: each row's logit terms of labels 0 and 2k in the units of exp2, the row offsets
    of the stages off the band."""
    to_exp2 = table_to_qk_units(qk_scale, HAS_RK) * qk_scale
    return (edge_column(logit_rows, rows, LQ, 0, HAS_LOGITS) * to_exp2,
            edge_column(logit_rows, rows, LQ, 2 * band, HAS_LOGITS) * to_exp2)


@triton.jit
def edge_column(table_rows, rows, LQ, label, PRESENT: tl.constexpr):
    """(BM,) each row's entry for one label of a label table (zeros without one): the logit term
    or dO·w^V of a stage off the band, loaded as that stage starts."""
    column = tl.zeros(rows.shape, dtype=tl.float32)
    if PRESENT:
        column = tl.load(table_rows + label, mask=rows < LQ, other=0.0)
    return column


EDGE_STATS = tl.constexpr(len(EdgeStats._fields))
"""Rows of the edge statistics per (batch, head) (`EdgeStats`)."""


@triton.constexpr_function
def edge_row(name):
    """The row of the edge statistics that holds `EdgeStats` field `name`."""
    fields = EdgeStats._fields
    return fields.index(name)


@triton.jit
def edge_stat(edges, LQ, NAME: tl.constexpr):
    """Row NAME of a (batch, head)'s edge statistics."""
    return edges + edge_row(NAME) * LQ


@triton.jit
def store_edge_stats(edges, rows, LQ, stats):
    """A block's rows of the `EdgeStats` stats, field i in row i."""
    inside = rows < LQ
    for row in tl.static_range(EDGE_STATS):
        tl.store(edges + row * LQ + rows, stats[row], mask=inside)


@triton.jit
def load_row_stats(lse_ptr, delta_ptr, rows, LQ, EVEN_M: tl.constexpr):
    """The saved log-sum-exp and delta of query rows (+inf and 0 beyond Lq: no probability)."""
    if EVEN_M:
        return tl.load(lse_ptr + rows), tl.load(delta_ptr + rows)
    return (tl.load(lse_ptr + rows, mask=rows < LQ, other=float("inf")),
            tl.load(delta_ptr + rows, mask=rows < LQ, other=0.0))


# ---------------------------------------------------------------------------------------------
# Per-tile arithmetic the forward's and dq's stages share (`tiles`: their *Tiles)
# ---------------------------------------------------------------------------------------------

@triton.jit
def key_scores(tiles, cols, flags: tl.constexpr):
    """(BM, BN) q·kᵀ of the key tile `cols`, k loaded transposed (`load_transposed`)."""
    keys = tiles.keys
    k_t = load_transposed(keys.K, cols, keys.stride_kn, tiles.block.dims, keys.LK, keys.D, flags.EVEN_N, flags.EVEN_D)
    return tl.dot(tiles.block.q, k_t, input_precision=flags.PRECISION)


@triton.jit
def masked(s, tiles, cols, flags: tl.constexpr, CAUSAL: tl.constexpr):
    """`visible` for a tile of the block's rows and keys `cols`."""
    block = tiles.block
    mask = tiles.mask
    return visible(s, block.rows, block.rows_abs, cols, mask.ptr, mask.stride_q, mask.stride_k, block.LQ,
                   tiles.keys.LK, flags.MASK, CAUSAL, flags.EVEN_N)


@triton.jit
def plain_masked(s, tiles, cols, flags: tl.constexpr):
    """An off-band tile's `masked`: never causal (the band holds the diagonal), a no-op without a
    mask where Lk fills the tiles."""
    if flags.MASK != NO_MASK or not flags.EVEN_N:
        s = masked(s, tiles, cols, flags, CAUSAL=False)
    return s


@triton.jit
def dropped_in(x, tiles, rows, cols, flags: tl.constexpr):
    """`dropped` for the pairs (rows, cols) of the program's (batch, head)."""
    return dropped(x, tiles.dropout.seed, rows, cols, tiles.keys.LK, tiles.dropout.p, flags.HAS_DROPOUT)


@triton.jit
def raised_max(m_i, row_max):
    """The online softmax's step to a tile's row maxima: (the new maximum, it or 0 where a row has
    seen no key yet, exp2(m_i − that): what the sums so far are multiplied by)."""
    m_new = tl.maximum(m_i, row_max)
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    return m_new, m_safe, tl.exp2(m_i - m_safe)


@triton.jit
def add_values(acc, alpha, p, tiles, cols, flags: tl.constexpr):
    """acc rescaled by alpha, plus P·V of the value tile `cols`."""
    keys = tiles.keys
    v = load_rows(keys.V, cols, keys.stride_vn, tiles.block.dims, keys.LK, keys.D, flags.EVEN_N, flags.EVEN_D,
                  DIMS_FIRST=True)
    return acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=flags.PRECISION)


# ---------------------------------------------------------------------------------------------
# Forward
# ---------------------------------------------------------------------------------------------

LOGIT_FLOOR = tl.constexpr(-2.0 ** 20)
"""Edge logit terms (exp2 units) below this count as this in a stage that keeps its row maximum
less its term (−inf would make it nan): a key beyond a window of −inf edge biases adds exp2(−2²⁰)
= 0 to any row that sees a key within it. (A row that sees none, only keys beyond, attends to
those by q·k where the definition attends to nothing.)"""


@triton.jit
def out_of_stage(m_stage, m_entry, r_edge):
    """The row maximum in true units again after a stage that kept it less r_edge: exactly the
    one it entered with where the stage raised it nowhere (adding r_edge back would round)."""
    return tl.where(m_stage == m_entry - r_edge, m_entry, m_stage + r_edge)


@triton.jit
def rescale(m_from, m_to):
    """exp2(m_from − m_to): what a sum kept at row maximum m_from is multiplied by at m_to ≥ m_from
    (0 for a row that had seen nothing at m_from)."""
    return tl.exp2(m_from - tl.where(m_to == float("-inf"), 0.0, m_to))


@triton.jit
def forward_band(softmax, masses, tiles, stages, flags: tl.constexpr, BAND_BLOCK: tl.constexpr):
    """BAND, [band_lo, band_hi) in BAND_BLOCK tiles, first: each pair's logit term by label, then
    every mask (the causal one here alone). With w^V it stores its interior logits by label (−inf
    where dropout drops the pair), from which the epilogue takes their masses, and sums label 2k's
    mass in `masses.hi` (with dropout, which takes mass out of the pairs and not out of l, the
    rest in `masses.lo`; without, the epilogue takes it from l)."""
    block = tiles.block
    band = tiles.tables.band
    acc, l_i, m_i, m_lo, m_hi = softmax.acc, softmax.l, softmax.m, masses.lo, masses.hi
    for n0 in tl.range(stages.band_lo, stages.band_hi, BAND_BLOCK, num_stages=1):
        cols = n0 + tl.arange(0, BAND_BLOCK)
        qk = key_scores(tiles, cols, flags)
        offset = pair_offsets(block.rows_abs, cols)
        s, logit_ptrs = band_scores(qk, offset, tiles, cols, flags)
        row_max = tl.max(s, 1) * tiles.qk_scale
        if flags.HAS_RV:  # interior logits by label (with w^K: over the logit terms just read), −inf if dropped
            keep = store_band_logits(s, logit_ptrs, tiles, cols, flags)
            at_hi = offset >= band
        m_new, m_safe, alpha = raised_max(m_i, row_max)
        p = tl.exp2(s * tiles.qk_scale - m_safe[:, None])
        row_sum = tl.sum(p, 1)
        l_i = l_i * alpha + row_sum
        if flags.HAS_RV and flags.HAS_DROPOUT:  # after the normaliser
            p = tl.where(keep, p / (1.0 - tiles.dropout.p), 0.0)
        else:
            p = dropped_in(p, tiles, block.rows, cols, flags)
        acc = add_values(acc, alpha, p, tiles, cols, flags)
        if flags.HAS_RV:
            if flags.HAS_DROPOUT:
                row_sum = tl.sum(p, 1)
            hi_part = tl.sum(p * at_hi.to(tl.float32), 1)
            if flags.HAS_DROPOUT:
                m_lo = m_lo * alpha + (row_sum - hi_part)
            m_hi = m_hi * alpha + hi_part
        m_i = m_new
    return Softmax(acc=acc, l=l_i, m=m_i), Masses(lo=m_lo, hi=m_hi, hi_max=masses.hi_max)


@triton.jit
def band_scores(qk, offset, tiles, cols, flags: tl.constexpr):
    """(s, the logit table's addresses of the tile's pairs): a forward band tile's q·k plus each
    pair's logit term, masked, in the units of q·k (scaled once, with the row maximum)."""
    tables = tiles.tables
    distance = clipped(offset, tables.band)
    s = qk
    logit_ptrs = by_label(tables.logit_rows, tables.band, distance)
    if flags.HAS_LOGITS:
        s += load_by_row(logit_ptrs, tiles.block.rows, tiles.block.LQ, flags.EVEN_M) * tables.to_qk
    return masked(s, tiles, cols, flags, flags.CAUSAL), logit_ptrs


@triton.jit
def store_band_logits(s, logit_ptrs, tiles, cols, flags: tl.constexpr):
    """A band tile's interior logits into the mass table, −inf where dropout drops the pair:
    with both tables over the logit terms just read (`IN_PLACE`). Returns the pairs dropout keeps."""
    block = tiles.block
    band = tiles.tables.band
    keep = s  # (no dropout: unused)
    stored = s
    if flags.HAS_DROPOUT:
        keep = kept_pairs(tiles.dropout.seed, block.rows, cols, tiles.keys.LK, tiles.dropout.p)
        stored = tl.where(keep, s, float("-inf"))
    if flags.IN_PLACE and not flags.LOW_REGISTERS:
        store_interior_over(logit_ptrs, stored, interior_index(block.rows_abs, cols, band), band, block.rows,
                            block.LQ, flags.EVEN_M)
    else:
        store_interior(tiles.tables.mass_rows, stored, interior_index(block.rows_abs, cols, band), band, block.rows,
                       block.LQ, flags.EVEN_M)
    return keep


@triton.jit
def forward_fringe_pair(softmax, masses, tiles, stages, r_lo, r_hi, flags: tl.constexpr, BAND_BLOCK: tl.constexpr):
    """LEFT's and RIGHT's narrow fringes as the two halves of one tile (`fringe_pair`), right after
    the band and in its units: one label per half, so the row maximum is the greater of the
    halves' maxima, each plus its term (no pair takes an add), and RIGHT's half is label 2k's mass."""
    pair = fringe_pair(stages, r_lo, r_hi, BAND_BLOCK)
    block = tiles.block
    acc, l_i, m_i, m_lo, m_hi = softmax.acc, softmax.l, softmax.m, masses.lo, masses.hi
    for n0 in tl.range(pair.lo, pair.hi, BAND_BLOCK, num_stages=1):
        cols = n0 + tl.arange(0, BAND_BLOCK)
        in_right = tl.arange(0, BAND_BLOCK) >= BAND_BLOCK // 2  # (which half: the same in every row)
        cols = tl.where(in_right, cols + (pair.right_lo - n0 - BAND_BLOCK // 2), cols)
        qk = plain_masked(key_scores(tiles, cols, flags), tiles, cols, flags)
        row_max = tl.maximum(tl.max(tl.where(in_right[None, :], float("-inf"), qk), 1) * tiles.qk_scale + pair.r_left,
                             tl.max(tl.where(in_right[None, :], qk, float("-inf")), 1) * tiles.qk_scale + pair.r_right)
        m_new, m_safe, alpha = raised_max(m_i, row_max)
        p = tl.exp2(qk * tiles.qk_scale - tl.where(in_right[None, :], (m_safe - pair.r_right)[:, None],
                                                   (m_safe - pair.r_left)[:, None]))
        hi_part = tl.sum(tl.where(in_right[None, :], p, 0.0), 1)
        row_sum = tl.sum(tl.where(in_right[None, :], 0.0, p), 1) + hi_part
        l_i = l_i * alpha + row_sum
        p = dropped_in(p, tiles, block.rows, cols, flags)
        acc = add_values(acc, alpha, p, tiles, cols, flags)
        if flags.HAS_RV:
            if flags.HAS_DROPOUT:  # the kept masses
                hi_part = tl.sum(tl.where(in_right[None, :], p, 0.0), 1)
                m_lo = m_lo * alpha + (tl.sum(p, 1) - hi_part)
            m_hi = m_hi * alpha + hi_part
        m_i = m_new
    return Softmax(acc=acc, l=l_i, m=m_i), Masses(lo=m_lo, hi=m_hi, hi_max=masses.hi_max)


@triton.jit
def forward_left(softmax, masses, tiles, stages, r_lo, flags: tl.constexpr, BLOCK_N: tl.constexpr,
                 BAND_BLOCK: tl.constexpr):
    """LEFT, from the band out: its wide fringe [left_hi, left_narrow) in BAND_BLOCK tiles, then
    [0, left_hi) in BN tiles, pipelined. Every pair has label 0, whose logit term r_lo is a row
    offset: plain flash tiles (`forward_off_band`). Its kept mass (dropout) is label 0's."""
    m_ref = softmax.m
    softmax = in_stage_units(softmax, r_lo, flags)
    if has_wide_fringes(BLOCK_N, BAND_BLOCK):
        softmax, masses, kept = forward_off_band(softmax, masses, tiles, r_lo, stages.left_hi, stages.left_narrow,
                                                 flags, BAND_BLOCK)
        masses = Masses(lo=kept_into(masses.lo, kept, flags), hi=masses.hi, hi_max=masses.hi_max)
    softmax, masses, kept = forward_off_band(softmax, masses, tiles, r_lo, stages.lo, stages.left_hi, flags, BLOCK_N,
                                             PIPELINED=True)
    masses = Masses(lo=kept_into(masses.lo, kept, flags), hi=masses.hi, hi_max=m_ref)
    return out_of_stage_units(softmax, m_ref, r_lo, flags), masses


@triton.jit
def forward_right(softmax, masses, tiles, stages, r_hi, flags: tl.constexpr, BLOCK_N: tl.constexpr,
                  BAND_BLOCK: tl.constexpr):
    """RIGHT, from the band out, as LEFT (its wide fringe [right_wide, right_lo), then [right_lo,
    hi)): label 2k, term r_hi. Undropped, all it adds to l is label 2k's mass (LAZY_HI)."""
    hi = masses.hi
    if flags.LAZY_HI:  # from here on l's growth is label 2k's
        hi = hi * rescale(masses.hi_max, softmax.m) - softmax.l
    m_ref = softmax.m
    softmax = in_stage_units(softmax, r_hi, flags)
    masses = Masses(lo=masses.lo, hi=hi, hi_max=m_ref)
    if has_wide_fringes(BLOCK_N, BAND_BLOCK):
        softmax, masses, kept = forward_off_band(softmax, masses, tiles, r_hi, stages.right_wide, stages.right_lo,
                                                 flags, BAND_BLOCK)
        masses = Masses(lo=masses.lo, hi=kept_into(masses.hi, kept, flags), hi_max=m_ref)
    softmax, masses, kept = forward_off_band(softmax, masses, tiles, r_hi, stages.right_lo, stages.hi, flags, BLOCK_N,
                                             PIPELINED=True)
    masses = Masses(lo=masses.lo, hi=kept_into(masses.hi, kept, flags), hi_max=m_ref)
    return out_of_stage_units(softmax, m_ref, r_hi, flags), masses


@triton.jit
def forward_off_band(softmax, masses, tiles, r_edge, lo, hi, flags: tl.constexpr, BLOCK_N: tl.constexpr,
                     PIPELINED: tl.constexpr = False):
    """The online softmax over key tiles [lo, hi) off the band, all of one label whose logit term
    is r_edge, with m in the stage's units where IN_STAGE_UNITS (`in_stage_units`). With dropout
    and w^V it returns the kept mass beside (summed by the tensor cores with P·V: p times a
    column of ones, rescaled like acc), which the caller adds to its label's."""
    block = tiles.block
    acc, l_i, m_i, m_lo, m_hi = softmax.acc, softmax.l, softmax.m, masses.lo, masses.hi
    kept = tl.zeros((block.rows.shape[0], MIN_DOT), dtype=tl.float32)  # the kept mass, MIN_DOT times over
    for n0 in tl.range(lo, hi, BLOCK_N, num_stages=None if PIPELINED else 1):
        cols = n0 + tl.arange(0, BLOCK_N)
        qk = plain_masked(key_scores(tiles, cols, flags), tiles, cols, flags)
        row_max = tl.max(qk, 1) * tiles.qk_scale
        if not flags.IN_STAGE_UNITS:
            row_max += r_edge
        m_new, m_safe, alpha = raised_max(m_i, row_max)
        p = tl.exp2(qk * tiles.qk_scale - (m_safe if flags.IN_STAGE_UNITS else m_safe - r_edge)[:, None])
        row_sum = tl.sum(p, 1)
        l_i = l_i * alpha + row_sum
        p = dropped_in(p, tiles, block.rows, cols, flags)
        acc = add_values(acc, alpha, p, tiles, cols, flags)
        if flags.HAS_RV and flags.HAS_DROPOUT:
            ones = tl.full((BLOCK_N, MIN_DOT), 1.0, tiles.keys.V.dtype.element_ty)
            kept = tl.dot(p.to(ones.dtype), ones, kept * alpha[:, None], input_precision=flags.PRECISION)
            m_lo = m_lo * alpha
            m_hi = m_hi * alpha
        m_i = m_new
    if flags.HAS_RV and flags.HAS_DROPOUT:
        kept = tl.sum(kept, 1) / MIN_DOT
    return Softmax(acc=acc, l=l_i, m=m_i), Masses(lo=m_lo, hi=m_hi, hi_max=masses.hi_max), kept


@triton.jit
def kept_into(mass, kept, flags: tl.constexpr):
    """mass plus an off-band stage's kept mass (`forward_off_band`), which only dropout sums apart."""
    if flags.HAS_RV and flags.HAS_DROPOUT:
        mass += kept
    return mass


@triton.jit
def in_stage_units(softmax, r_edge, flags: tl.constexpr):
    """The softmax as an off-band stage keeps it (IN_STAGE_UNITS: its row maximum less the
    stage's logit term r_edge, so that its tiles are plain flash tiles)."""
    if flags.IN_STAGE_UNITS:
        softmax = Softmax(acc=softmax.acc, l=softmax.l, m=softmax.m - r_edge)
    return softmax


@triton.jit
def out_of_stage_units(softmax, m_entry, r_edge, flags: tl.constexpr):
    """`in_stage_units` undone (`out_of_stage`)."""
    if flags.IN_STAGE_UNITS:
        softmax = Softmax(acc=softmax.acc, l=softmax.l, m=out_of_stage(softmax.m, m_entry, r_edge))
    return softmax


@triton.jit
def forward_kernel(
        Q, K, V, WK, WV, BIAS, MASK_PTR, O, LSE, LOGITS, MASS,
        stride_qb, stride_qh, stride_qm,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_wkh, stride_wkl,
        stride_wvh, stride_wvl,
        stride_bh,
        stride_mb, stride_mh, stride_mq, stride_mk,
        stride_ob, stride_oh, stride_om,
        H, LQ, LK, D, OFFSET, band, sm_scale, SEED, dropout_p, L_BUCKET,
        LABEL_TILE: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_BIAS: tl.constexpr,
        MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BAND_BLOCK: tl.constexpr, FRINGE_BLOCK: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr, LOW_REGISTERS: tl.constexpr):
    """One program: query block start_m of one (batch, head). Writes its rows of O, of the
    log-sum-exp (base 2) and of the mass table; the logit table is its scratch (with w^K and
    w^V the same rows: the launch passes one buffer as LOGITS and MASS). LOW_REGISTERS
    (`fused_tuning.low_registers`): the band computes its stores' addresses again rather than keep its
    loads'."""
    start_m = tl.program_id(0)
    b, h, bh = head_of_program(H)
    seed = seed_of(SEED, HAS_DROPOUT)
    n_labels = 2 * band + 1
    qk_scale = sm_scale * LOG2E
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_abs = rows + OFFSET
    dims = tl.arange(0, BLOCK_D)
    labels = tl.arange(0, LABEL_TILE)
    q = load_rows(Q + b * stride_qb + h * stride_qh, rows, stride_qm, dims, LQ, D, EVEN_M, EVEN_D)

    # The label tables: logits (scratch, with w^K), masses (interior logits until the end).
    HAS_LOGITS: tl.constexpr = HAS_RK or HAS_BIAS
    table_offset = bh * LQ * (LABEL_TILE + 1)
    logit_rows = logit_rows_of(q, WK + h * stride_wkh, stride_wkl, BIAS + h * stride_bh, LOGITS + table_offset,
                               rows, labels, dims, n_labels, LQ, D, qk_scale, HAS_RK, HAS_BIAS, EVEN_M, PRECISION)
    if HAS_RK:
        tl.debug_barrier()
    # With w^K and w^V one table (the launch passes one buffer as both): the band stores each
    # interior logit over the logit term it has just read (read by that pair alone), the epilogue
    # the masses over those.
    IN_PLACE: tl.constexpr = HAS_RK and HAS_RV
    mass_rows = logit_rows if IN_PLACE else MASS + table_offset + rows * (LABEL_TILE + 1)  # (one pointer fewer)
    table_to_qk = table_to_qk_units(qk_scale, HAS_RK)
    r_lo, r_hi = edge_logits(logit_rows, rows, LQ, band, qk_scale, HAS_RK, HAS_LOGITS)

    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    l_i = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    m_lo = tl.zeros((BLOCK_M,), dtype=tl.float32)
    m_hi = tl.zeros((BLOCK_M,), dtype=tl.float32)
    stages = key_stages(start_m * BLOCK_M, OFFSET, LK, band, CAUSAL, BLOCK_M, BLOCK_N, BAND_BLOCK, FRINGE_BLOCK)
    K_ptr = K + b * stride_kb + h * stride_kh
    V_ptr = V + b * stride_vb + h * stride_vh
    mask_ptr = MASK_PTR + b * stride_mb + h * stride_mh
    # Off the band every pair of a stage has the row's logit term r_edge: the stage keeps m_i less
    # it (`in_stage_units`), so that its tiles are plain flash tiles. Nor do they sum m_hi: LEFT
    # adds nothing to it and RIGHT all it adds to l, so it stays at the maximum it was last brought
    # to (`Masses.hi_max`) until RIGHT starts and the end (`rescale`). Not with dropout, whose
    # tiles sum their kept mass apart (and with it, m_i less r_edge spills on sm_80).
    IN_STAGE_UNITS: tl.constexpr = not HAS_DROPOUT
    LAZY_HI: tl.constexpr = HAS_RV and IN_STAGE_UNITS
    if IN_STAGE_UNITS:
        r_lo = tl.maximum(r_lo, LOGIT_FLOOR)
        r_hi = tl.maximum(r_hi, LOGIT_FLOOR)
    tiles = ForwardTiles(block=QueryBlock(q=q, rows=rows, rows_abs=rows_abs, dims=dims, LQ=LQ),
                         keys=KeySource(K=K_ptr, V=V_ptr, stride_kn=stride_kn, stride_vn=stride_vn, LK=LK, D=D),
                         mask=Mask(ptr=mask_ptr, stride_q=stride_mq, stride_k=stride_mk),
                         tables=ForwardTables(logit_rows=logit_rows, to_qk=table_to_qk, mass_rows=mass_rows, band=band),
                         qk_scale=qk_scale, dropout=Dropout(seed=seed + bh, p=dropout_p))
    flags: tl.constexpr = ForwardFlags(IN_STAGE_UNITS=IN_STAGE_UNITS, LAZY_HI=LAZY_HI, HAS_LOGITS=HAS_LOGITS,
                                       HAS_RV=HAS_RV, IN_PLACE=IN_PLACE, LOW_REGISTERS=LOW_REGISTERS, MASK=MASK,
                                       CAUSAL=CAUSAL, HAS_DROPOUT=HAS_DROPOUT, EVEN_M=EVEN_M, EVEN_N=EVEN_N,
                                       EVEN_D=EVEN_D, PRECISION=PRECISION)
    softmax = Softmax(acc=acc, l=l_i, m=m_i)
    masses = Masses(lo=m_lo, hi=m_hi, hi_max=m_i)

    # The band, both narrow fringes as one tile, LEFT from the band out, then RIGHT from the band out.
    softmax, masses = forward_band(softmax, masses, tiles, stages, flags, BAND_BLOCK)
    if has_narrow_fringes(CAUSAL, BAND_BLOCK, FRINGE_BLOCK):
        softmax, masses = forward_fringe_pair(softmax, masses, tiles, stages, r_lo, r_hi, flags, BAND_BLOCK)
    softmax, masses = forward_left(softmax, masses, tiles, stages, r_lo, flags, BLOCK_N, BAND_BLOCK)
    if not CAUSAL:  # (RIGHT's keys are the future)
        softmax, masses = forward_right(softmax, masses, tiles, stages, r_hi, flags, BLOCK_N, BAND_BLOCK)
    acc, l_i, m_i, m_lo, m_hi, m_ref = softmax.acc, softmax.l, softmax.m, masses.lo, masses.hi, masses.hi_max

    # A fully masked row attends to nothing: its acc, masses and l are 0, its output zeros, and
    # its log-sum-exp +inf, so the backward gives it no gradient.
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    out = acc * (1.0 / l_safe)[:, None]  # a division per row, not per element
    lse = tl.where(seen, m_i + tl.log2(l_safe), float("inf"))
    if HAS_RV:
        # The masses, normalised: interior ones from the logits the band stored, edges from row sums.
        tl.debug_barrier()
        mass = tl.exp2(interior_of(mass_rows, rows, rows_abs, labels, band, LQ, LK, float("-inf"), CAUSAL,
                                   EVEN_M) * qk_scale - lse[:, None])
        if HAS_DROPOUT:  # (the band stored −inf for the pairs it dropped)
            mass = mass / (1.0 - dropout_p)
        if LAZY_HI:  # all mass but label 2k's (undropped, l is the masses' sum)
            m_hi = m_hi * rescale(m_ref, m_i) + (0.0 if CAUSAL else l_i)
            m_lo = l_i - m_hi
        # m_lo summed the band's interior too
        mass, mass0 = with_edges(mass, m_lo / l_safe - tl.sum(mass, 1), m_hi / l_safe, labels, band)
        mass = stored_by_row(mass_rows[:, None] + 1 + labels[None, :], mass, rows, LQ, EVEN_M)
        tl.store(mass_rows, mass0, mask=rows < LQ)
        out = table_combination(out, mass, mass0, WV + h * stride_wvh, stride_wvl, labels, dims, n_labels, D,
                                V.dtype.element_ty, PRECISION)
    O_rows = O + b * stride_ob + h * stride_oh + rows[:, None] * stride_om + dims[None, :]
    tl.store(O_rows, out.to(O.dtype.element_ty), mask=(rows[:, None] < LQ) & (dims[None, :] < D))
    tl.store(LSE + bh * LQ + rows, lse, mask=rows < LQ)


# ---------------------------------------------------------------------------------------------
# Backward: dq (one program per query block), then dk and dv (one per key block)
# ---------------------------------------------------------------------------------------------

@triton.jit
def dq_band(dq, g_hi, tiles, stages, flags: tl.constexpr, BAND_BLOCK: tl.constexpr):
    """BAND, [band_lo, band_hi) in BAND_BLOCK tiles: p recomputed with each pair's logit term by
    label, dP with its dO·w^V. G: label 2k's by row sums into g_hi, interior values stored in the
    grad table (the edges' entries are overwritten at the end)."""
    block = tiles.block
    tables = tiles.tables
    band = tables.band
    for n0 in tl.range(stages.band_lo, stages.band_hi, BAND_BLOCK, num_stages=1):
        cols = n0 + tl.arange(0, BAND_BLOCK)
        k, v = key_rows(tiles, cols, flags)
        s = tl.dot(block.q, tl.trans(k), input_precision=flags.PRECISION)
        offset = pair_offsets(block.rows_abs, cols)
        distance = clipped(offset, band)
        if flags.HAS_LOGITS:
            s += load_by_row(by_label(tables.logit_rows, band, distance), block.rows, block.LQ,
                             flags.EVEN_M) * tables.to_qk
        s = masked(s, tiles, cols, flags, flags.CAUSAL)
        p = tl.exp2(s * tiles.qk_scale - tiles.rows.lse[:, None])
        dp = tl.dot(tiles.rows.do, tl.trans(v), input_precision=flags.PRECISION)
        if flags.HAS_RV:
            dp += load_by_row(by_label(tables.value_rows, band, distance), block.rows, block.LQ, flags.EVEN_M)
        dq, ds = dq_step(dq, p, dp, tiles.rows.delta, k, tiles, cols, flags)
        if flags.NEEDS_G:
            g_hi += tl.sum(tl.where(offset >= band, ds, 0.0), 1)
            store_by_row(by_label(tables.grad_rows, band, distance), ds, block.rows, block.LQ, flags.EVEN_M)
    return dq, g_hi


@triton.jit
def dq_left(dq, tiles, stages, edge, flags: tl.constexpr, BLOCK_N: tl.constexpr, BAND_BLOCK: tl.constexpr,
            FRINGE_BLOCK: tl.constexpr):
    """LEFT, from the band out: its wide fringe in BAND_BLOCK tiles, its narrow one in
    FRINGE_BLOCK tiles, then [0, left_hi) in BN tiles, pipelined. Label 0 (`edge`'s terms) needs
    no sum of G: a row of dS sums to zero."""
    if has_wide_fringes(BLOCK_N, BAND_BLOCK):
        dq = _dq_left_tiles(dq, tiles, edge, stages.left_hi, stages.left_narrow, flags, BAND_BLOCK)
    if has_narrow_fringes(flags.CAUSAL, BAND_BLOCK, FRINGE_BLOCK):
        dq = _dq_left_tiles(dq, tiles, edge, stages.left_narrow, stages.band_lo, flags, FRINGE_BLOCK)
    return _dq_left_tiles(dq, tiles, edge, stages.lo, stages.left_hi, flags, BLOCK_N, PIPELINED=True)


@triton.jit
def _dq_left_tiles(dq, tiles, edge, lo, hi, flags: tl.constexpr, BLOCK_N: tl.constexpr,
                   PIPELINED: tl.constexpr = False):
    """LEFT's key tiles [lo, hi): plain tiles and nothing beside (`dq_left`)."""
    for n0 in tl.range(lo, hi, BLOCK_N, num_stages=None if PIPELINED else 1):
        dq, ds, k = dq_plain_tile(dq, tiles, n0 + tl.arange(0, BLOCK_N), edge, flags)
    return dq


@triton.jit
def dq_right(dq, g_hi, tiles, stages, edge, flags: tl.constexpr, BLOCK_N: tl.constexpr, BAND_BLOCK: tl.constexpr,
             FRINGE_BLOCK: tl.constexpr):
    """RIGHT, from the band out: its narrow fringe, its wide one, then [right_lo, hi) in BN
    tiles, pipelined. Label 2k's G by row sums (`_dq_right_tiles`)."""
    if has_narrow_fringes(flags.CAUSAL, BAND_BLOCK, FRINGE_BLOCK):
        dq, g_hi = _dq_right_tiles(dq, g_hi, tiles, edge, stages.band_hi, stages.right_wide, flags, FRINGE_BLOCK)
    if has_wide_fringes(BLOCK_N, BAND_BLOCK):
        dq, g_hi = _dq_right_tiles(dq, g_hi, tiles, edge, stages.right_wide, stages.right_lo, flags, BAND_BLOCK)
    return _dq_right_tiles(dq, g_hi, tiles, edge, stages.right_lo, stages.hi, flags, BLOCK_N, PIPELINED=True)


@triton.jit
def _dq_right_tiles(dq, g_hi, tiles, edge, lo, hi, flags: tl.constexpr, BLOCK_N: tl.constexpr,
                    PIPELINED: tl.constexpr = False):
    """The row sums of dS by the tensor cores, in the precision dq takes dS in: dS times a column
    of ones, MIN_DOT columns (their mean at the end: a max would spill in 64/128)."""
    g_right = tl.zeros((tiles.block.rows.shape[0], MIN_DOT), dtype=tl.float32)
    for n0 in tl.range(lo, hi, BLOCK_N, num_stages=None if PIPELINED else 1):
        dq, ds, k = dq_plain_tile(dq, tiles, n0 + tl.arange(0, BLOCK_N), edge, flags)
        if flags.NEEDS_G:
            g_right = tl.dot(ds.to(k.dtype), tl.full((BLOCK_N, MIN_DOT), 1.0, k.dtype), g_right,
                             input_precision=flags.PRECISION)
    if flags.NEEDS_G:
        g_hi += tl.sum(g_right, 1) / MIN_DOT
    return dq, g_hi


@triton.jit
def dq_plain_tile(dq, tiles, cols, edge, flags: tl.constexpr):
    """One off-band key tile of dq, all of one label (`EdgeTerms` edge): its logit term comes off
    lse, its dO·w^V off delta (with dropout, into dP, which is dropped with dO·v). (dq, dS, k)."""
    k, v = key_rows(tiles, cols, flags)
    s = plain_masked(tl.dot(tiles.block.q, tl.trans(k), input_precision=flags.PRECISION), tiles, cols, flags)
    p = tl.exp2(s * tiles.qk_scale - (tiles.rows.lse - edge.r)[:, None])
    dp = tl.dot(tiles.rows.do, tl.trans(v), input_precision=flags.PRECISION)
    delta = tiles.rows.delta
    if flags.HAS_RV:
        if flags.HAS_DROPOUT:
            dp += edge.dw[:, None]
        else:
            delta = delta - edge.dw
    dq, ds = dq_step(dq, p, dp, delta, k, tiles, cols, flags)
    return dq, ds, k


@triton.jit
def key_rows(tiles, cols, flags: tl.constexpr):
    """(k, v): the key and value tiles `cols`, by rows (dq takes k both ways)."""
    keys = tiles.keys
    k = load_rows(keys.K, cols, keys.stride_kn, tiles.block.dims, keys.LK, keys.D, flags.EVEN_N, flags.EVEN_D)
    v = load_rows(keys.V, cols, keys.stride_vn, tiles.block.dims, keys.LK, keys.D, flags.EVEN_N, flags.EVEN_D)
    return k, v


@triton.jit
def dq_step(dq, p, dp, delta, k, tiles, cols, flags: tl.constexpr):
    """(dq + dS·k, dS): dS = p (dP − delta), dP dropped as p was."""
    ds = p * (dropped_in(dp, tiles, tiles.block.rows, cols, flags) - delta[:, None])
    return dq + tl.dot(ds.to(k.dtype), k, input_precision=flags.PRECISION), ds


@triton.jit
def backward_dq_kernel(
        Q, K, V, WK, WV, BIAS, MASK_PTR, O, DO, LSE, DQ, DELTA, EDGES, LOGITS, VALUES, GRAD,
        stride_qb, stride_qh, stride_qm,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_wkh, stride_wkl,
        stride_wvh, stride_wvl,
        stride_bh,
        stride_mb, stride_mh, stride_mq, stride_mk,
        stride_ob, stride_oh, stride_om,
        stride_dob, stride_doh, stride_dom,
        stride_dqb, stride_dqh, stride_dqm,
        H, LQ, LK, D, OFFSET, band, sm_scale, SEED, dropout_p, L_BUCKET,
        LABEL_TILE: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_BIAS: tl.constexpr,
        NEEDS_G: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BAND_BLOCK: tl.constexpr, FRINGE_BLOCK: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PRECISION: tl.constexpr):
    """One program: query block start_m of one (batch, head). Writes its rows of dQ, delta, the
    edge statistics, and the logit, value and grad tables, which the dk/dv kernel and the tables'
    gradients read."""
    start_m = tl.program_id(0)
    b, h, bh = head_of_program(H)
    seed = seed_of(SEED, HAS_DROPOUT)
    n_labels = 2 * band + 1
    qk_scale = sm_scale * LOG2E
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rows_abs = rows + OFFSET
    dims = tl.arange(0, BLOCK_D)
    labels = tl.arange(0, LABEL_TILE)
    q = load_rows(Q + b * stride_qb + h * stride_qh, rows, stride_qm, dims, LQ, D, EVEN_M, EVEN_D)
    do = load_rows(DO + b * stride_dob + h * stride_doh, rows, stride_dom, dims, LQ, D, EVEN_M, EVEN_D)
    o = load_rows(O + b * stride_ob + h * stride_oh, rows, stride_om, dims, LQ, D, EVEN_M, EVEN_D)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # Σ_j p_ij dP_ij = dO_i·z_i
    tl.store(DELTA + bh * LQ + rows, delta, mask=rows < LQ)
    lse = tl.load(LSE + bh * LQ + rows, mask=rows < LQ, other=float("inf"))

    # The tables the band reads per pair: logits (as the forward's), and dO·w^V.
    HAS_LOGITS: tl.constexpr = HAS_RK or HAS_BIAS
    table_offset = bh * LQ * (LABEL_TILE + 1)
    logit_rows = logit_rows_of(q, WK + h * stride_wkh, stride_wkl, BIAS + h * stride_bh, LOGITS + table_offset,
                               rows, labels, dims, n_labels, LQ, D, qk_scale, HAS_RK, HAS_BIAS, EVEN_M, PRECISION)
    table_to_qk = table_to_qk_units(qk_scale, HAS_RK)
    value_rows = VALUES + table_offset + rows * (LABEL_TILE + 1)
    if HAS_RV:
        dw, dw0 = table_product(do, WV + h * stride_wvh, stride_wvl, labels, dims, n_labels, D, PRECISION)
        store_label_rows(value_rows, dw, dw0, rows, labels, LQ, EVEN_M)
    tl.debug_barrier()
    grad_rows = GRAD + table_offset + rows * (LABEL_TILE + 1)
    # Each edge label's terms, per row: off the band the dk/dv kernel reads them like lse and delta.
    r_lo, r_hi = edge_logits(logit_rows, rows, LQ, band, qk_scale, HAS_RK, HAS_LOGITS)
    dw_lo = edge_column(value_rows, rows, LQ, 0, HAS_RV)
    dw_hi = edge_column(value_rows, rows, LQ, 2 * band, HAS_RV)
    store_edge_stats(EDGES + bh * EDGE_STATS * LQ, rows, LQ,
                     EdgeStats(lse_lo=lse - r_lo, lse_hi=lse - r_hi, delta_lo=delta - dw_lo, delta_hi=delta - dw_hi,
                               dw_lo=dw_lo, dw_hi=dw_hi))

    dq = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    g_hi = tl.zeros((BLOCK_M,), dtype=tl.float32)
    stages = key_stages(start_m * BLOCK_M, OFFSET, LK, band, CAUSAL, BLOCK_M, BLOCK_N, BAND_BLOCK, FRINGE_BLOCK)
    K_ptr = K + b * stride_kb + h * stride_kh
    V_ptr = V + b * stride_vb + h * stride_vh
    mask_ptr = MASK_PTR + b * stride_mb + h * stride_mh
    tiles = DqTiles(block=QueryBlock(q=q, rows=rows, rows_abs=rows_abs, dims=dims, LQ=LQ),
                    rows=BackwardRows(do=do, lse=lse, delta=delta),
                    keys=KeySource(K=K_ptr, V=V_ptr, stride_kn=stride_kn, stride_vn=stride_vn, LK=LK, D=D),
                    mask=Mask(ptr=mask_ptr, stride_q=stride_mq, stride_k=stride_mk),
                    tables=DqTables(logit_rows=logit_rows, to_qk=table_to_qk, value_rows=value_rows,
                                    grad_rows=grad_rows, band=band),
                    qk_scale=qk_scale, dropout=Dropout(seed=seed + bh, p=dropout_p))
    flags: tl.constexpr = DqFlags(HAS_LOGITS=HAS_LOGITS, HAS_RV=HAS_RV, NEEDS_G=NEEDS_G, MASK=MASK, CAUSAL=CAUSAL,
                                  HAS_DROPOUT=HAS_DROPOUT, EVEN_M=EVEN_M, EVEN_N=EVEN_N, EVEN_D=EVEN_D,
                                  PRECISION=PRECISION)

    # The band, then LEFT from the band out, then RIGHT from the band out.
    dq, g_hi = dq_band(dq, g_hi, tiles, stages, flags, BAND_BLOCK)
    dq = dq_left(dq, tiles, stages, EdgeTerms(r=r_lo, dw=dw_lo), flags, BLOCK_N, BAND_BLOCK, FRINGE_BLOCK)
    if not CAUSAL:  # (RIGHT's keys are the future)
        dq, g_hi = dq_right(dq, g_hi, tiles, stages, EdgeTerms(r=r_hi, dw=dw_hi), flags, BLOCK_N, BAND_BLOCK,
                            FRINGE_BLOCK)

    if NEEDS_G:
        # The grad table's rows, whole: interior values the band stored, label 2k from row sums,
        # label 0 what makes the row sum zero.
        tl.debug_barrier()
        g = interior_of(grad_rows, rows, rows_abs, labels, band, LQ, LK, 0.0, CAUSAL, EVEN_M)
        g, g0 = with_edges(g, -(g_hi + tl.sum(g, 1)), g_hi, labels, band)
        store_label_rows(grad_rows, g, g0, rows, labels, LQ, EVEN_M)
        if HAS_RK:  # Σ_l G_il w^K_l, the key term's share of dq
            dq = table_combination(dq, g, g0, WK + h * stride_wkh, stride_wkl, labels, dims, n_labels, D,
                                   Q.dtype.element_ty, PRECISION)
    DQ_rows = DQ + b * stride_dqb + h * stride_dqh + rows[:, None] * stride_dqm + dims[None, :]
    tl.store(DQ_rows, (dq * sm_scale).to(DQ.dtype.element_ty), mask=(rows[:, None] < LQ) & (dims[None, :] < D))


@triton.jit
def add_diagonals(ds, dbias_ptr, m0, cols, OFFSET, band, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
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
    label = label_of(offset, band)
    real = w < BLOCK_M + BLOCK_N - 1
    inside = real & (label > 0) & (label < 2 * band)
    lo = tl.sum(tl.where(real & (label == 0), diag, 0.0), 0)
    hi = tl.where(band > 0, tl.sum(tl.where(real & (label == 2 * band), diag, 0.0), 0), 0.0)
    tl.store(dbias_ptr + label, tl.load(dbias_ptr + label, mask=inside, other=0.0) + diag, mask=inside)
    tl.store(dbias_ptr, tl.load(dbias_ptr) + lo)
    tl.store(dbias_ptr + 2 * band, tl.load(dbias_ptr + 2 * band) + hi)
    tl.debug_barrier()


@triton.jit
def dkdv_band(dk, dv, tiles, stats, stages, flags: tl.constexpr, BAND_ROWS: tl.constexpr):
    """BAND, query tiles [band_lo, band_hi) BAND_ROWS high, not pipelined: p recomputed with each
    pair's logit term by label and the causal mask, dP with its dO·w^V; a wide rel_bias's
    gradient summed along the tile's diagonals (`add_diagonals`)."""
    keys = tiles.keys
    tables = tiles.tables
    band = tables.band
    for m0 in tl.range(stages.band_lo, stages.band_hi, BAND_ROWS, num_stages=1):
        t = query_tile(tiles, m0, stats, flags, BAND_ROWS)
        logit_rows = tables.logit_base + t.rows * tables.logit_stride
        value_rows = tables.value_base + t.rows * flags.TABLE_ROW
        s = tl.dot(t.q, tl.trans(keys.k), input_precision=flags.PRECISION)
        distance = clipped(pair_offsets(t.rows_abs, keys.cols), band)
        if flags.HAS_LOGITS:
            s += load_by_row(by_label(logit_rows, band, distance), t.rows, tiles.queries.LQ,
                             flags.EVEN_M) * tables.to_qk
        p = tl.exp2(rows_masked(s, t, tiles, flags, flags.CAUSAL) * tiles.qk_scale - t.lse[:, None])
        dv = add_dropped_p(dv, p, t, tiles, flags)
        dp = tl.dot(t.do, tl.trans(keys.v), input_precision=flags.PRECISION)
        if flags.HAS_RV:
            dp += load_by_row(by_label(value_rows, band, distance), t.rows, tiles.queries.LQ, flags.EVEN_M)
        dk, ds = dk_step(dk, p, dp, t, tiles, flags)
        if flags.BIAS_GRAD:  # a wide rel_bias's gradient, into this key block's own row
            add_diagonals(ds, tables.dbias, m0, keys.cols, tiles.queries.OFFSET, band, BAND_ROWS, flags.BLOCK_N,
                          flags.WINDOW)
    return dk, dv


@triton.jit
def dkdv_left(dk, dv, tiles, stats, edges, stages, flags: tl.constexpr, BLOCK_M: tl.constexpr):
    """LEFT, the query blocks after the key block, [band_hi, Lq): every pair has label 0. Its
    rows' statistics are EDGE_STATS's, with label 0's logit term and dO·w^V in them (with
    dropout, delta and dO·w^V apart: `dkdv_off_band`)."""
    LQ = tiles.queries.LQ
    delta = stats.delta if flags.HAS_DROPOUT else edge_stat(edges, LQ, "delta_lo")
    return dkdv_off_band(dk, dv, tiles, RowPointers(lse=edge_stat(edges, LQ, "lse_lo"), delta=delta),
                         edge_stat(edges, LQ, "dw_lo"), stages.band_hi, LQ, flags, BLOCK_M, label=0)


@triton.jit
def dkdv_right(dk, dv, tiles, stats, edges, stages, flags: tl.constexpr, BLOCK_M: tl.constexpr):
    """RIGHT, the query blocks before the key block, [lo, band_lo): every pair has label 2k (as LEFT)."""
    LQ = tiles.queries.LQ
    lse = edge_stat(edges, LQ, "lse_hi")
    delta = stats.delta if flags.HAS_DROPOUT else edge_stat(edges, LQ, "delta_hi")
    return dkdv_off_band(dk, dv, tiles, RowPointers(lse=lse, delta=delta), edge_stat(edges, LQ, "dw_hi"), stages.lo,
                         stages.band_lo, flags, BLOCK_M, label=2 * tiles.tables.band)


@triton.jit
def dkdv_off_band(dk, dv, tiles, stats, dw_ptr, lo, hi, flags: tl.constexpr, BLOCK_M: tl.constexpr, label):
    """dk, dv over query tiles [lo, hi) off the band, all of one label: `stats` point at rows
    with its logit term and dO·w^V in them (with dropout, dw_ptr at dO·w^V, added to dP before
    it is dropped); a wide rel_bias's gradient is the tiles' dS summed into that label's entry."""
    keys = tiles.keys
    for m0 in tl.range(lo, hi, BLOCK_M):
        t = query_tile(tiles, m0, stats, flags, BLOCK_M)
        s = tl.dot(t.q, tl.trans(keys.k), input_precision=flags.PRECISION)
        if flags.MASK != NO_MASK or not flags.EVEN_N:
            s = rows_masked(s, t, tiles, flags, CAUSAL=False)
        p = tl.exp2(s * tiles.qk_scale - t.lse[:, None])
        dv = add_dropped_p(dv, p, t, tiles, flags)
        dp = tl.dot(t.do, tl.trans(keys.v), input_precision=flags.PRECISION)
        if flags.HAS_RV and flags.HAS_DROPOUT:
            dp += tl.load(dw_ptr + t.rows, mask=t.rows < tiles.queries.LQ, other=0.0)[:, None]
        dk, ds = dk_step(dk, p, dp, t, tiles, flags)
        if flags.BIAS_GRAD:
            dbias = tiles.tables.dbias + label
            tl.store(dbias, tl.load(dbias) + tl.sum(tl.sum(ds, 1), 0))
            tl.debug_barrier()
    return dk, dv


@triton.jit
def query_tile(tiles, m0, stats, flags: tl.constexpr, BLOCK_M: tl.constexpr):
    """The `QueryTile` of rows [m0, m0 + BLOCK_M), its lse and delta read at `stats`."""
    queries = tiles.queries
    rows = m0 + tl.arange(0, BLOCK_M)
    rows_abs = rows + queries.OFFSET
    q = load_rows(queries.Q, rows, queries.stride_qm, tiles.keys.dims, queries.LQ, tiles.keys.D, flags.EVEN_M,
                  flags.EVEN_D)
    do = load_rows(queries.DO, rows, queries.stride_dom, tiles.keys.dims, queries.LQ, tiles.keys.D, flags.EVEN_M,
                   flags.EVEN_D)
    lse, delta = load_row_stats(stats.lse, stats.delta, rows, queries.LQ, flags.EVEN_M)
    return QueryTile(rows=rows, rows_abs=rows_abs, q=q, do=do, lse=lse, delta=delta)


@triton.jit
def rows_masked(s, t, tiles, flags: tl.constexpr, CAUSAL: tl.constexpr):
    """`visible` for a query tile t and the program's keys."""
    mask = tiles.mask
    return visible(s, t.rows, t.rows_abs, tiles.keys.cols, mask.ptr, mask.stride_q, mask.stride_k, tiles.queries.LQ,
                   tiles.keys.LK, flags.MASK, CAUSAL, flags.EVEN_N)


@triton.jit
def add_dropped_p(dv, p, t, tiles, flags: tl.constexpr):
    """dv + P̃ᵀ·dO, P̃ p under dropout."""
    return dv + tl.dot(tl.trans(dropped_in(p, tiles, t.rows, tiles.keys.cols, flags).to(t.do.dtype)), t.do,
                       input_precision=flags.PRECISION)


@triton.jit
def dk_step(dk, p, dp, t, tiles, flags: tl.constexpr):
    """(dk + dSᵀ·q, dS): dS = p (dP − delta), dP dropped as p was."""
    ds = p * (dropped_in(dp, tiles, t.rows, tiles.keys.cols, flags) - t.delta[:, None])
    return dk + tl.dot(tl.trans(ds.to(t.q.dtype)), t.q, input_precision=flags.PRECISION), ds


@triton.jit
def backward_dkdv_kernel(
        Q, K, V, BIAS, MASK_PTR, DO, LSE, DELTA, EDGES, LOGITS, VALUES, DK, DV, DBIAS, DBIAS_ROWS,
        stride_qb, stride_qh, stride_qm,
        stride_kb, stride_kh, stride_kn,
        stride_vb, stride_vh, stride_vn,
        stride_bh,
        stride_mb, stride_mh, stride_mq, stride_mk,
        stride_dob, stride_doh, stride_dom,
        stride_dkb, stride_dkh, stride_dkn,
        stride_dvb, stride_dvh, stride_dvn,
        H, LQ, LK, D, OFFSET, band, sm_scale, SEED, dropout_p, L_BUCKET,
        LABEL_TILE: tl.constexpr, HAS_RK: tl.constexpr, HAS_RV: tl.constexpr, HAS_BIAS: tl.constexpr,
        BIAS_GRAD: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr, HAS_DROPOUT: tl.constexpr,
        EVEN_M: tl.constexpr, EVEN_N: tl.constexpr, EVEN_D: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, WINDOW: tl.constexpr,
        BAND_ROWS: tl.constexpr, PRECISION: tl.constexpr):
    """One program: key block start_n of one (batch, head). Writes its rows of dK and dV and,
    for a wide rel_bias that needs a gradient, its own row of per-label sums in DBIAS. The band's
    query tiles are BAND_ROWS high (a divisor of BLOCK_M)."""
    start_n = tl.program_id(0)
    b, h, bh = head_of_program(H)
    seed = seed_of(SEED, HAS_DROPOUT)
    n_labels = 2 * band + 1
    qk_scale = sm_scale * LOG2E
    n0 = start_n * BLOCK_N
    cols = n0 + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = load_rows(K + b * stride_kb + h * stride_kh, cols, stride_kn, dims, LK, D, EVEN_N, EVEN_D)
    v = load_rows(V + b * stride_vb + h * stride_vh, cols, stride_vn, dims, LK, D, EVEN_N, EVEN_D)
    HAS_LOGITS: tl.constexpr = HAS_RK or HAS_BIAS
    table_offset = bh * LQ * (LABEL_TILE + 1)
    logit_base = BIAS + h * stride_bh
    logit_stride = 0
    if HAS_RK:  # dq's table, in the units of q·k
        logit_base = LOGITS + table_offset
        logit_stride = LABEL_TILE + 1
    table_to_qk = table_to_qk_units(qk_scale, HAS_RK)
    dbias_ptr = DBIAS + (bh * DBIAS_ROWS + start_n) * n_labels  # this program's own row

    stages = query_stages(n0, OFFSET, LQ, band, CAUSAL, BLOCK_M, BLOCK_N)
    dk = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dv = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    edges = EDGES + bh * EDGE_STATS * LQ
    value_base = VALUES + table_offset
    Q_ptr = Q + b * stride_qb + h * stride_qh
    DO_ptr = DO + b * stride_dob + h * stride_doh
    mask_ptr = MASK_PTR + b * stride_mb + h * stride_mh
    tiles = DkdvTiles(keys=KeyBlock(k=k, v=v, cols=cols, dims=dims, LK=LK, D=D),
                      queries=QuerySource(Q=Q_ptr, DO=DO_ptr, stride_qm=stride_qm, stride_dom=stride_dom, LQ=LQ,
                                          OFFSET=OFFSET),
                      mask=Mask(ptr=mask_ptr, stride_q=stride_mq, stride_k=stride_mk),
                      tables=DkdvTables(logit_base=logit_base, logit_stride=logit_stride, to_qk=table_to_qk,
                                        value_base=value_base, dbias=dbias_ptr, band=band),
                      qk_scale=qk_scale, dropout=Dropout(seed=seed + bh, p=dropout_p))
    flags: tl.constexpr = DkdvFlags(TABLE_ROW=LABEL_TILE + 1, HAS_LOGITS=HAS_LOGITS, HAS_RV=HAS_RV,
                                    BIAS_GRAD=BIAS_GRAD, MASK=MASK, CAUSAL=CAUSAL, HAS_DROPOUT=HAS_DROPOUT,
                                    EVEN_M=EVEN_M, EVEN_N=EVEN_N, EVEN_D=EVEN_D, BLOCK_N=BLOCK_N, WINDOW=WINDOW,
                                    PRECISION=PRECISION)
    # The band, then the queries after the keys (LEFT: label 0), then those before them (RIGHT: 2k).
    stats = RowPointers(lse=LSE + bh * LQ, delta=DELTA + bh * LQ)
    dk, dv = dkdv_band(dk, dv, tiles, stats, stages, flags, BAND_ROWS)
    dk, dv = dkdv_left(dk, dv, tiles, stats, edges, stages, flags, BLOCK_M)
    dk, dv = dkdv_right(dk, dv, tiles, stats, edges, stages, flags, BLOCK_M)
    col_mask = (cols[:, None] < LK) & (dims[None, :] < D)
    tl.store(DK + b * stride_dkb + h * stride_dkh + cols[:, None] * stride_dkn + dims[None, :],
             (dk * sm_scale).to(DK.dtype.element_ty), mask=col_mask)
    tl.store(DV + b * stride_dvb + h * stride_dvh + cols[:, None] * stride_dvn + dims[None, :],
             dv.to(DV.dtype.element_ty), mask=col_mask)


@triton.jit
def label_sums_kernel(TABLE_A, X_A, TABLE_B, X_B, OUT,
                      stride_ab, stride_ah, stride_am,
                      stride_bb, stride_bh, stride_bm,
                      H, LQ, D, BLOCKS,
                      LABEL_TILE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    """One block of rows of one (batch, head) and one of two (label table T, rows x) pairs (the grid's
    first axis holds pair A's blocks, then B's: the grad table and q for dw^K, the mass table and
    dO for dw^V, in one launch): its share Σ_i T_il x_i of a table's gradient, as a
    (LABEL_TILE + 1, BLOCK_D) float32 block, label l in row l; the host sums the shares in a fixed
    order (no atomics). The tile in x's dtype on the tensor cores, as `impl="gather"` takes it
    under autocast. Its own kernel, not dq's epilogue, whose registers the sums would take (there
    they make dq spill on sm_80)."""
    pair = tl.program_id(0) // BLOCKS
    start_m = tl.program_id(0) - pair * BLOCKS
    b, h, bh = head_of_program(H)
    table, x_rows, stride_xm = TABLE_A, X_A + b * stride_ab + h * stride_ah, stride_am
    if pair == 1:
        table, x_rows, stride_xm = TABLE_B, X_B + b * stride_bb + h * stride_bh, stride_bm
    rows = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    labels = tl.arange(0, LABEL_TILE)
    x = load_rows(x_rows, rows, stride_xm, dims, LQ, D, False, False)
    table_rows = table + (bh * LQ + rows) * (LABEL_TILE + 1)
    tile = tl.load(table_rows[:, None] + 1 + labels[None, :], mask=(rows < LQ)[:, None], other=0.0)
    column0 = tl.load(table_rows, mask=rows < LQ, other=0.0)
    out = OUT + ((pair * tl.num_programs(2) * H + bh) * BLOCKS + start_m) * (LABEL_TILE + 1) * BLOCK_D
    tl.store(out + (labels[:, None] + 1) * BLOCK_D + dims[None, :],
             tl.dot(tl.trans(tile.to(x.dtype)), x, input_precision=PRECISION))
    tl.store(out + dims, tl.sum(column0[:, None] * x.to(tl.float32), 0))


@triton.jit
def dropout_keep_kernel(OUT, SEED, LQ, LK, dropout_p, BLOCK: tl.constexpr):
    """The kept entries of one (batch, head)'s dropout draw, for tests that rebuild the mask."""
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    bh = tl.program_id(2)
    kept = dropped(tl.full((BLOCK, BLOCK), 1.0, tl.float32), tl.load(SEED) + bh, rows, cols, LK, dropout_p,
                   True) != 0.0
    tl.store(OUT + bh * LQ * LK + rows[:, None] * LK + cols[None, :], kept.to(tl.int8),
             mask=(rows[:, None] < LQ) & (cols[None, :] < LK))
