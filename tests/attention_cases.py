"""The float64 definition every attention test compares with, and the CPU tier's case table.

`definition` is Shaw et al.'s equations over whole tensors, in float64, differentiable:

    e_ij = q_i·(k_j + a^K_ij)/√D + b_ij (+ attn_bias_ij),   z_i = Σ_j α_ij (v_j + a^V_ij),

a^K, a^V the rows of rel_k, rel_v (shared, or one table per head) and b the entries of rel_bias at
the label of j − i clipped to ±max_distance, α = softmax over the visible keys (a row that sees
none is zeros), with the entries where `dropped` is False zeroed and the rest / (1 − p). The CPU
tier (tests/test_attention.py) checks it against the same equations written element by element;
the Triton interpreter tier (tests/test_triton_kernel.py) and the CUDA tier (tests/test_cuda.py)
compare every implementation, and its gradients, with it.
"""
from __future__ import annotations

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


CASES = {
    "square": dict(B=2, H=3, Lq=5, Lk=5, K=2),
    "rect_offset_causal": dict(B=2, H=2, Lq=3, Lk=7, K=2, offset=4, causal=True),
    "causal_prefill": dict(B=1, H=2, Lq=6, Lk=6, K=1, causal=True),
    "padding_with_empty_row": dict(B=3, H=2, Lq=4, Lk=6, K=2, padding=True),
    "mask_2d_and_causal": dict(B=2, H=2, Lq=5, Lk=5, K=3, full_mask=True, causal=True),
    "k0": dict(B=2, H=2, Lq=4, Lk=4, K=0),
    "k1": dict(B=2, H=2, Lq=5, Lk=6, K=1),
    "k_beyond_length": dict(B=1, H=2, Lq=4, Lk=5, K=9),
    "keys_only": dict(B=2, H=2, Lq=4, Lk=5, K=2, use_v=False),
    "values_only": dict(B=2, H=2, Lq=4, Lk=5, K=2, use_k=False),
    "neither": dict(B=2, H=2, Lq=4, Lk=5, K=2, use_k=False, use_v=False, causal=True, offset=1),
    "per_head": dict(B=2, H=3, Lq=4, Lk=6, K=2, per_head=True, padding=True),
    "per_head_causal_offset": dict(B=1, H=2, Lq=2, Lk=5, K=1, per_head=True, causal=True, offset=3),
    "with_bias": dict(B=2, H=2, Lq=4, Lk=4, K=1, bias=True),
}
"""The CPU tier's cases: each implementation against `definition` in float64 (tests/test_attention.py)."""


def make_case(B, H, Lq, Lk, K, offset=0, causal=False, padding=False, full_mask=False, use_k=True,
              use_v=True, per_head=False, bias=False, D=4, dtype=torch.float64, seed=0):
    """q, k, v and relative_attention's keyword arguments for one case of `CASES` (or any such sizes)."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    q, k, v = rand(B, H, Lq, D), rand(B, H, Lk, D), rand(B, H, Lk, D)
    shape = (H, 2 * K + 1, D) if per_head else (2 * K + 1, D)
    rel_k = rand(*shape) if use_k else None
    rel_v = rand(*shape) if use_v else None
    mask = None
    if padding:
        lengths = torch.randint(1, Lk + 1, (B,), generator=g)
        mask = (torch.arange(Lk)[None, :] < lengths[:, None])[:, None, None, :].clone()
        mask[0] = False  # a sentence with no visible key: its rows must come out as zeros
    if full_mask:
        mask = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
    attn_bias = rand(1, H, Lq, Lk) if bias else None
    kwargs = dict(rel_k=rel_k, rel_v=rel_v, max_distance=K, attn_mask=mask, is_causal=causal,
                  query_offset=offset, attn_bias=attn_bias)
    return q, k, v, kwargs
