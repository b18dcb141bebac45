"""The two ops a stack of runs batches itself (core/stack.py): linear layers and SDPA.

Under `vmap`, torch batches `F.linear` with per-run weights by moving, expanding and copying its
operands around a batched matmul, about 30 ops a layer forward and backward where a solo run
dispatches 10; and CPU's fused SDPA has no batching rule (vmap loops over the runs). These ops
carry their own rule instead: the run dimension K becomes a batch dimension, a linear layer one
`baddbmm` over (K, rows, features) and attention one SDPA call over K·B rows. Their arithmetic is
the solo op's; autograd records the batched ops the rule calls, so no backward is written here.
Outside vmap each is the plain op.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@torch.library.custom_op("relpos_lab::stacked_linear", mutates_args=())
def stacked_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return F.linear(x, weight, bias)


@stacked_linear.register_fake
def _(x, weight, bias):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


def _runs_first(t: Tensor | None, dim: int | None, runs: int) -> Tensor | None:
    """`t` with the run dimension first: moved there, or broadcast where the runs share it."""
    if t is None:
        return None
    if dim is None:
        return t.expand(runs, *t.shape)
    return t if dim == 0 else t.movedim(dim, 0)


@stacked_linear.register_vmap
def _(info, in_dims, x, weight, bias):
    runs = info.batch_size
    x, weight, bias = (_runs_first(t, d, runs) for t, d in zip((x, weight, bias), in_dims))
    rows = x.reshape(runs, -1, x.shape[-1])
    out = (torch.bmm(rows, weight.transpose(1, 2)) if bias is None
           else torch.baddbmm(bias.unsqueeze(1), rows, weight.transpose(1, 2)))
    return out.view(*x.shape[:-1], weight.shape[1]), 0


class StackedLinear(nn.Linear):
    """nn.Linear whose call is `stacked_linear`: what a stack's copy of the model holds."""

    def forward(self, x: Tensor) -> Tensor:
        return stacked_linear(x, self.weight, self.bias)


def stack_linear_layers(model: nn.Module) -> nn.Module:
    """`model` with each of its nn.Linear layers (the scheme's own included) calling `stacked_linear`:
    the same parameters and state_dict, in place."""
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = StackedLinear
    return model


@torch.library.custom_op("relpos_lab::stacked_sdpa", mutates_args=())
def stacked_sdpa(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None, dropout_p: float, is_causal: bool,
                 scale: float | None) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                                          scale=scale)


@stacked_sdpa.register_fake
def _(q, k, v, attn_mask, dropout_p, is_causal, scale):
    return q.new_empty(*q.shape[:-1], v.shape[-1])


@stacked_sdpa.register_vmap
def _(info, in_dims, q, k, v, attn_mask, dropout_p, is_causal, scale):
    runs = info.batch_size
    q, k, v = (_runs_first(t, d, runs) for t, d in zip((q, k, v), in_dims[:3]))
    batch = q.shape[1]
    mask = attn_mask
    if mask is not None:  # (…, Lq, Lk) broadcastable to (B, H, Lq, Lk): made (K·B, 1 or H, Lq, Lk)
        mask = _runs_first(mask, in_dims[3], runs)
        mask = mask.reshape(runs, *(1,) * (4 - mask.dim() + 1), *mask.shape[1:])
        mask = mask.expand(runs, batch, *mask.shape[2:]).reshape(runs * batch, *mask.shape[2:])
    fold = lambda t: t.reshape(runs * batch, *t.shape[2:])  # noqa: E731
    out = F.scaled_dot_product_attention(fold(q), fold(k), fold(v), attn_mask=mask, dropout_p=dropout_p,
                                         is_causal=is_causal, scale=scale)
    return out.view(runs, batch, *out.shape[1:]), 0
