"""The fused kernels as torch.library ops: what a compiled model calls (`attend`, which
`relative_attention` calls while dynamo traces), so torch.compile keeps the kernel as one node of
its graph, schedules the rest around it, and CUDA graphs capture it, where an autograd Function
launching Triton would break the graph.

`relpos_lab::fused_attention` returns the output with the log-sum-exp and mass table the backward
reads; `relpos_lab::fused_attention_backward` returns dq, dk, dv and the tables' gradients (an
empty tensor where a table needs none). Their fake implementations give every output's shape from
the inputs alone, as the launches allocate them (`fused.label_tile`). These are custom ops rather than
`triton_op`s: the kernels are autotuned over a heuristics subclass (fused._Derived) and, in the
tests, interpreted, which `wrap_triton` does not take; opaque to inductor, they are still traced,
fused around and captured. Eager calls keep the autograd Function, whose launch path is lighter.
"""
from __future__ import annotations

import torch
from torch import Tensor

from relpos_lab.core.attention import fused


@torch.library.custom_op("relpos_lab::fused_attention", mutates_args=())
def fused_attention(q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None,
                    rel_bias: Tensor | None, mask: Tensor | None, band: int, causal: bool, offset: int, scale: float,
                    seed: Tensor | None, dropout_p: float) -> tuple[Tensor, Tensor, Tensor]:
    """(output, log-sum-exp, mass table) of `fused.launch_forward`. `mask`: uint8, broadcastable to
    (B, H, Lq, Lk); expanded here, whatever strides the graph gave it (the kernels read it by them)."""
    launch = fused._Launch(band, causal, offset, scale, seed, dropout_p)
    mask = _expanded(mask, q, k)
    o, lse, mass, _ = fused.launch_forward(q, k, v, rel_k, rel_v, rel_bias, mask, launch)
    return o, lse, mass if rel_v is not None else mass.zero_()  # (a placeholder without a^V: defined, not read)


@fused_attention.register_fake
def _(q, k, v, rel_k, rel_v, rel_bias, mask, band, causal, offset, scale, seed, dropout_p):
    b, h, lq, _ = q.shape
    width = fused.label_tile(rel_k, rel_v, rel_bias, band) + 1
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            q.new_empty(b * h * lq, dtype=torch.float32),
            q.new_empty((b * h * lq, width) if rel_v is not None else (1,), dtype=torch.float32))


@torch.library.custom_op("relpos_lab::fused_attention_backward", mutates_args=())
def fused_attention_backward(do: Tensor, q: Tensor, k: Tensor, v: Tensor, rel_k: Tensor | None, rel_v: Tensor | None,
                             rel_bias: Tensor | None, mask: Tensor | None, o: Tensor, lse: Tensor, mass: Tensor,
                             band: int, causal: bool, offset: int, scale: float, seed: Tensor | None, dropout_p: float,
                             needs_rel_k: bool, needs_rel_v: bool, needs_rel_bias: bool,
                             ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """dq, dk, dv, d rel_k, d rel_v, d rel_bias of `fused.launch_backward` (empty where not needed)."""
    launch = fused._Launch(band, causal, offset, scale, seed, dropout_p)
    mask = _expanded(mask, q, k)
    args = fused._common_args(q, k, v, rel_k, rel_v, rel_bias, mask, launch)
    grads = fused.launch_backward(do, q, k, v, rel_k, rel_v, rel_bias, mask, o, lse, mass, launch, args,
                                  fused.Needs(needs_rel_k, needs_rel_v, needs_rel_bias))
    return tuple(g if g is not None else q.new_empty(0) for g in grads)


@fused_attention_backward.register_fake
def _(do, q, k, v, rel_k, rel_v, rel_bias, mask, o, lse, mass, band, causal, offset, scale, seed, dropout_p,
      needs_rel_k, needs_rel_v, needs_rel_bias):
    def table(t, needed):
        return torch.empty_like(t, memory_format=torch.contiguous_format) if t is not None and needed \
            else q.new_empty(0)

    return (*(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v)),
            table(rel_k, needs_rel_k), table(rel_v, needs_rel_v), table(rel_bias, needs_rel_bias))


def _expanded(mask: Tensor | None, q: Tensor, k: Tensor) -> Tensor | None:
    return None if mask is None else mask.expand(q.shape[0], q.shape[1], q.shape[-2], k.shape[-2])


def _setup_context(ctx, inputs, output):
    q, k, v, rel_k, rel_v, rel_bias, mask, band, causal, offset, scale, seed, dropout_p = inputs
    o, lse, mass = output
    ctx.mark_non_differentiable(lse, mass)
    ctx.save_for_backward(q, k, v, rel_k, rel_v, rel_bias, mask, o, lse, mass, seed)
    ctx.scalars = band, causal, offset, scale, dropout_p


def _backward(ctx, do, _lse, _mass):
    needs = fused.Needs.of(ctx.needs_input_grad)
    *saved, seed = ctx.saved_tensors
    band, causal, offset, scale, dropout_p = ctx.scalars
    grads = fused_attention_backward(do, *saved, band, causal, offset, scale, seed, dropout_p, *needs)
    return (*grads[:3], *(g if need else None for g, need in zip(grads[3:], needs)), None, *(None,) * 6)


fused_attention.register_autograd(_backward, setup_context=_setup_context)


def attend(q, k, v, *, rel_k, rel_v, rel_bias, max_distance, attn_mask, is_causal, query_offset, dropout_p,
           attn_bias, scale):
    """`fused.attend` while dynamo traces: the kernels as the ops above, one node each in the graph,
    with attention dropout too (its seed is a tensor the graph draws at each run)."""
    rel_k, rel_v, rel_bias, mask, launch = fused.prepare(q, k, rel_k, rel_v, rel_bias, max_distance, attn_mask,
                                                         is_causal, query_offset, dropout_p, scale)
    q, k, v = (fused._last_dim_contiguous(t) for t in (q, k, v))
    return fused_attention(q, k, v, rel_k, rel_v, rel_bias, mask, *launch)[0]
