"""How the Transformer's own weights start (`model.init`): PyTorch's defaults, or Haiku's, which the
DeepMind reference code of Delétang et al. and Ruoss et al. trains from.

Haiku's `hk.Linear` draws its weights from a normal truncated at two standard deviations, σ =
1/√fan_in (not rescaled for the truncation, so their spread is 0.88 σ), with zero biases, where
PyTorch's `nn.Linear` draws U(−1/√fan_in, 1/√fan_in), a spread of 0.58/√fan_in. The reference's
token embedding is a bias-free `hk.Linear` over one-hot inputs initialised at σ = 0.02 (its
`emb_init_scale`), then scaled by √d_model as ours is. A position scheme's own layers are drawn as
Haiku draws a layer of their kind (`haiku_layers_`): the reference's learned positions are an
`hk.Embed` (σ = 1, where PyTorch's scheme draws d_model^-0.5), its Transformer-XL projection W_R an
`hk.Linear`; a scheme's bare parameters (Shaw's tables, Transformer-XL's u and v, which the
reference draws from N(0, 0.02²) as ours does) keep the scheme's own draw.
"""
from __future__ import annotations

import math

from torch import Tensor, nn

INITS = ("pytorch", "haiku")
HAIKU_EMBEDDING_STD = 0.02  # the reference's emb_init_scale


def truncated_normal_(weight: Tensor, std: float) -> Tensor:
    """Haiku's TruncatedNormal(std): a normal cut at ±2 std, not rescaled."""
    return nn.init.trunc_normal_(weight, std=std, a=-2 * std, b=2 * std)


def linear(d_in: int, d_out: int, *, bias: bool = True, init: str = "pytorch") -> nn.Linear:
    """An nn.Linear initialised as `init` says."""
    layer = nn.Linear(d_in, d_out, bias=bias)
    if init == "haiku":
        truncated_normal_(layer.weight.data, 1 / math.sqrt(d_in))
        if bias:
            nn.init.zeros_(layer.bias)
    return layer


def haiku_layers_(module: nn.Module | None) -> None:
    """Redraw a position scheme's layers as Haiku's defaults draw them: every nn.Linear as hk.Linear
    (truncated normal, σ = 1/√fan_in, zero bias), every nn.Embedding as hk.Embed (truncated normal,
    σ = 1). Its bare nn.Parameters keep the scheme's own draw."""
    for layer in module.modules() if module is not None else ():
        if isinstance(layer, nn.Linear):
            truncated_normal_(layer.weight.data, 1 / math.sqrt(layer.in_features))
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
        elif isinstance(layer, nn.Embedding):
            truncated_normal_(layer.weight.data, 1.0)
