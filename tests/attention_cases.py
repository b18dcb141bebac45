"""The float64 definition every attention test compares with, and the case table every tier runs.

`definition` is Shaw et al.'s equations over whole tensors, in float64, differentiable:

    e_ij = q_i·(k_j + a^K_ij)/√D + b_ij (+ attn_bias_ij),   z_i = Σ_j α_ij (v_j + a^V_ij),

a^K, a^V the rows of rel_k, rel_v (shared, or one table per head) and b the entries of rel_bias at
the label of j − i clipped to ±max_distance, α = softmax over the visible keys (a row that sees
none is zeros), with the entries where `dropped` is False zeroed and the rest / (1 − p). The CPU
tier (tests/test_attention.py) checks it against the same equations written element by element;
the Triton interpreter tier (tests/test_triton_kernel.py) and the CUDA tier (tests/test_cuda.py)
compare every implementation, and its gradients, with it.

`CASES` is one table of `Case` records, and `build` makes a case's tensors. The records come in
three sizes, one group each: `SMALL` (D = 4 and a few positions, so that the CPU tier's loops over
every element stay quick), `TILED` (lengths that are not multiples of the interpreter's 16-key
blocks, across several of them) and `LONG` (hundreds of positions, many of a GPU's blocks). The CPU
tier runs every case, the interpreter tier `SMALL` and `TILED` (`LONG` would take minutes there),
the CUDA tier `LONG`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from relpos_lab.core.attention.masks import relative_labels


def definition(q, k, v, *, rel_k=None, rel_v=None, rel_bias=None, max_distance=0, attn_mask=None, is_causal=False,
               query_offset=0, attn_bias=None, dropped=None, dropout_p=0.0):
    """`relative_attention(q, k, v, ...)` by its definition, in float64 (see the module docstring).
    `attn_mask`: bool, broadcastable to (B, H, Lq, Lk), True = attend; `dropped`: (B, H, Lq, Lk)."""
    q, k, v = q.double(), k.double(), v.double()
    b, h, lq, d = q.shape
    lk = k.shape[-2]
    label = relative_labels(lq, lk, max_distance, query_offset, q.device)  # (Lq, Lk)

    def table(t, head):
        return None if t is None else (t[head] if t.dim() == 3 else t).double()

    visible = torch.ones(b, h, lq, lk, dtype=torch.bool, device=q.device)
    if attn_mask is not None:
        visible = visible & attn_mask.to(torch.bool).expand(b, h, lq, lk)
    if is_causal:
        visible = visible & (torch.arange(lk, device=q.device)[None, :]
                             <= torch.arange(lq, device=q.device)[:, None] + query_offset)
    out = torch.zeros_like(q)
    for head in range(h):
        wk, wv = table(rel_k, head), table(rel_v, head)
        e = q[:, head] @ k[:, head].transpose(-1, -2)
        if wk is not None:
            e = e + torch.einsum("bid,ijd->bij", q[:, head], wk[label])
        e = e / d ** 0.5
        if rel_bias is not None:
            e = e + rel_bias[head].double()[label]
        if attn_bias is not None:
            e = e + attn_bias.double().expand(b, h, lq, lk)[:, head]
        p = torch.softmax(e.masked_fill(~visible[:, head], float("-inf")), -1).nan_to_num(0.0)
        if dropped is not None:
            p = p * dropped[:, head] / (1 - dropout_p)
        z = p @ v[:, head]
        if wv is not None:
            z = z + torch.einsum("bij,ijd->bid", p, wv[label])
        out[:, head] = z
    return out


@dataclass(frozen=True)
class Padding:
    """Padded keys: each sequence's length drawn from [shortest, Lk], as a (B, 1, 1, Lk) mask."""

    shortest: int = 1
    first_empty: bool = False
    """Sequence 0 sees no key: its rows must come out as zeros, its gradients finite."""
    last_whole: bool = False
    """The last sequence keeps every key."""


EMPTY_FIRST = Padding(first_empty=True)  # SMALL's: rows that see nothing beside random lengths
WHOLE_LAST = Padding(last_whole=True)  # TILED's: a whole sequence beside random lengths


def long_padding(max_distance: int) -> Padding:
    """`LONG`'s padding: sequence 0 empty, the last whole, the others at least k/2 + 1 keys long."""
    return Padding(shortest=max_distance // 2 + 1, first_empty=True, last_whole=True)


@dataclass(frozen=True)
class Case:
    """One attention problem: its sizes and which of relative_attention's arguments it passes."""

    name: str
    B: int
    H: int
    Lq: int
    Lk: int
    D: int
    max_distance: int
    offset: int = 0
    """query_offset: query i sits at position offset + i (a cached prefix of `offset` keys)."""
    causal: bool = False
    padding: Padding | None = None
    full_mask: bool = False
    """A random (B, 1, Lq, Lk) mask, about 70% visible (instead of any padding)."""
    per_head: bool = False
    """rel_k and rel_v of shape (H, 2k+1, D), one table per head, instead of (2k+1, D)."""
    use_k: bool = True
    """rel_k, the a^K table."""
    use_v: bool = True
    """rel_v, the a^V table."""
    rel_bias: bool = False
    """rel_bias (H, 2k+1): a score bias per clipped offset."""
    attn_bias: bool = False
    """A dense attn_bias (1, H, Lq, Lk)."""


SMALL = (
    Case("square", B=2, H=3, Lq=5, Lk=5, D=4, max_distance=2),
    Case("rect_offset_causal", B=2, H=2, Lq=3, Lk=7, D=4, max_distance=2, offset=4, causal=True),
    Case("causal_prefill", B=1, H=2, Lq=6, Lk=6, D=4, max_distance=1, causal=True),
    Case("padding_with_empty_row", B=3, H=2, Lq=4, Lk=6, D=4, max_distance=2, padding=EMPTY_FIRST),
    Case("mask_2d_and_causal", B=2, H=2, Lq=5, Lk=5, D=4, max_distance=3, full_mask=True, causal=True),
    Case("k0", B=2, H=2, Lq=4, Lk=4, D=4, max_distance=0),
    Case("k1", B=2, H=2, Lq=5, Lk=6, D=4, max_distance=1),
    Case("k_beyond_length", B=1, H=2, Lq=4, Lk=5, D=4, max_distance=9),
    Case("keys_only", B=2, H=2, Lq=4, Lk=5, D=4, max_distance=2, use_v=False),
    Case("values_only", B=2, H=2, Lq=4, Lk=5, D=4, max_distance=2, use_k=False),
    Case("neither", B=2, H=2, Lq=4, Lk=5, D=4, max_distance=2, use_k=False, use_v=False, causal=True, offset=1),
    Case("per_head", B=2, H=3, Lq=4, Lk=6, D=4, max_distance=2, per_head=True, padding=EMPTY_FIRST),
    Case("per_head_causal_offset", B=1, H=2, Lq=2, Lk=5, D=4, max_distance=1, per_head=True, causal=True, offset=3),
    Case("with_bias", B=2, H=2, Lq=4, Lk=4, D=4, max_distance=1, attn_bias=True),
)

TILED = (
    Case("all_terms_tiled", B=2, H=3, Lq=37, Lk=37, D=24, max_distance=4, rel_bias=True),
    Case("per_head_tiled", B=2, H=3, Lq=29, Lk=29, D=24, max_distance=3, per_head=True, rel_bias=True),
    Case("keys_only_tiled", B=2, H=3, Lq=33, Lk=33, D=24, max_distance=4, use_v=False),
    Case("values_only_tiled", B=2, H=3, Lq=33, Lk=33, D=24, max_distance=4, use_k=False),
    Case("rel_bias_only_tiled", B=2, H=3, Lq=33, Lk=33, D=24, max_distance=4, use_k=False, use_v=False,
         rel_bias=True),
    Case("neither_tiled", B=2, H=3, Lq=21, Lk=21, D=24, max_distance=2, use_k=False, use_v=False),
    Case("k0_tiled", B=2, H=3, Lq=23, Lk=23, D=24, max_distance=0, rel_bias=True),
    Case("k1_tiled", B=1, H=2, Lq=70, Lk=70, D=24, max_distance=1, rel_bias=True),  # many tiles off the band
    Case("k16_tiled", B=1, H=3, Lq=45, Lk=45, D=24, max_distance=16, rel_bias=True),
    Case("k_beyond_length_tiled", B=1, H=3, Lq=20, Lk=20, D=24, max_distance=50, rel_bias=True),
    Case("d64_tiled", B=1, H=2, Lq=19, Lk=19, D=64, max_distance=3, rel_bias=True),
    Case("padding_tiled", B=2, H=3, Lq=37, Lk=37, D=24, max_distance=4, padding=WHOLE_LAST, rel_bias=True),
    Case("causal_tiled", B=2, H=3, Lq=37, Lk=37, D=24, max_distance=4, causal=True, rel_bias=True),
    Case("padding_causal_tiled", B=2, H=3, Lq=37, Lk=37, D=24, max_distance=4, padding=WHOLE_LAST, causal=True,
         rel_bias=True),
    Case("cross_lengths_tiled", B=1, H=3, Lq=13, Lk=40, D=24, max_distance=5, rel_bias=True),
    Case("per_head_causal_offset_tiled", B=1, H=3, Lq=7, Lk=40, D=24, max_distance=5, offset=33, causal=True,
         per_head=True, rel_bias=True),  # a prefill on a cache
    Case("offset_beyond_band_tiled", B=1, H=3, Lq=9, Lk=45, D=24, max_distance=2, offset=30, rel_bias=True),
)

LONG = (
    Case("square_long", B=2, H=4, Lq=300, Lk=300, D=64, max_distance=16),
    Case("padding_long", B=3, H=2, Lq=300, Lk=300, D=64, max_distance=16, padding=long_padding(16)),
    Case("causal_long", B=2, H=2, Lq=300, Lk=300, D=64, max_distance=16, causal=True),
    Case("padding_causal_long", B=3, H=2, Lq=257, Lk=257, D=64, max_distance=8, causal=True,
         padding=long_padding(8)),
    Case("per_head_padding_long", B=2, H=4, Lq=200, Lk=200, D=64, max_distance=16, per_head=True,
         padding=long_padding(16)),
    Case("values_only_long", B=2, H=2, Lq=300, Lk=300, D=64, max_distance=16, use_k=False),
    Case("keys_only_k1_long", B=2, H=2, Lq=130, Lk=130, D=64, max_distance=1, use_v=False, padding=long_padding(1)),
    Case("rect_offset_causal_long", B=2, H=2, Lq=37, Lk=300, D=64, max_distance=16, offset=263, causal=True),
)

CASES = {case.name: case for case in SMALL + TILED + LONG}
assert len(CASES) == len(SMALL) + len(TILED) + len(LONG), "two cases share a name"


def names(*groups) -> list[str]:
    """The names of the cases in these groups (SMALL, TILED, LONG), in table order: pytest's ids."""
    return [case.name for group in groups for case in group]


def build(case: Case, dtype=torch.float64, device="cpu", seed=0, requires_grad=False):
    """q, k, v and relative_attention's keyword arguments for `case`, drawn from `seed` (in float64
    on the CPU whatever `dtype` and `device`, so each is the same draw rounded). With
    `requires_grad`, every floating tensor is a leaf that requires its gradient.

    rel_k is drawn at half the scale of the keys, so that q·(k + a^K)/√D stays near unit variance."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q = rand(case.B, case.H, case.Lq, case.D)
    k, v = rand(case.B, case.H, case.Lk, case.D), rand(case.B, case.H, case.Lk, case.D)
    mask = None
    if case.padding is not None:
        lengths = torch.randint(case.padding.shortest, case.Lk + 1, (case.B,), generator=g)
        if case.padding.last_whole:
            lengths[-1] = case.Lk
        if case.padding.first_empty:
            lengths[0] = 0
        mask = (torch.arange(case.Lk)[None, :] < lengths[:, None])[:, None, None, :]
    labels = 2 * case.max_distance + 1
    table = (case.H, labels, case.D) if case.per_head else (labels, case.D)
    rel_k = rand(*table) * 0.5 if case.use_k else None
    rel_v = rand(*table) if case.use_v else None
    rel_bias = rand(case.H, labels) if case.rel_bias else None
    if case.full_mask:
        mask = torch.rand(case.B, 1, case.Lq, case.Lk, generator=g) > 0.3
    attn_bias = rand(1, case.H, case.Lq, case.Lk) if case.attn_bias else None

    def place(t):
        if t is None:
            return None
        if t.dtype == torch.bool:
            return t.to(device)
        return t.to(device, dtype).requires_grad_(requires_grad)

    q, k, v, rel_k, rel_v, rel_bias, attn_bias = map(place, (q, k, v, rel_k, rel_v, rel_bias, attn_bias))
    kwargs = dict(rel_k=rel_k, rel_v=rel_v, rel_bias=rel_bias, max_distance=case.max_distance,
                  attn_mask=place(mask), is_causal=case.causal, query_offset=case.offset, attn_bias=attn_bias)
    return q, k, v, kwargs
