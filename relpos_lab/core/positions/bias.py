"""Score biases added to the attention logits: ALiBi's fixed slopes and T5's learned buckets."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


def alibi_slopes(n_heads: int) -> Tensor:
    """Geometric head slopes of Press et al. (2022), with their rule for non-powers of two."""
    def powers(n):
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(closest)
    if closest < n_heads:
        slopes += powers(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


class AlibiPositions(RelativePositions):
    """ALiBi: a fixed per-head penalty -m_h·|j - i| on the logits (symmetric for encoders)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def attention_kwargs(self, q, k, query_offset):
        (lq, lk), device = (q.shape[-2], k.shape[-2]), q.device
        i = torch.arange(lq, device=device) + query_offset
        dist = (torch.arange(lk, device=device)[None, :] - i[:, None]).abs().float()
        return {"attn_bias": -self.slopes.to(device)[:, None, None] * dist}

    def draw(self, max_offset):
        return {"slopes": Drawing("bars", self.slopes.float().cpu(), torch.arange(len(self.slopes)),
                                  "slope m_h (bias −m_h·|j − i|)", xlabel="head", title="ALiBi slope per head (fixed)"),
                "bias": bias_drawing(self, max_offset, "ALiBi bias −m_h·|j − i| per head")}


@dataclass
class AlibiConfig(PositionConfig):
    scheme: str = "alibi"
    """alibi: attention with linear biases (Press et al., 2022)"""


class Alibi(PositionScheme):
    """Attention with linear biases: a fixed per-head penalty on distance (Press et al., 2022)."""

    config_class = AlibiConfig

    def attention(self, head_dim, n_heads, causal):
        return AlibiPositions(n_heads)


class T5BiasPositions(RelativePositions):
    """T5's learned scalar bias per head and log-spaced distance bucket."""

    def __init__(self, cfg: T5BiasConfig, n_heads: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance = cfg.t5_num_buckets, cfg.t5_max_distance
        self.bidirectional = bidirectional
        self.bias = nn.Embedding(cfg.t5_num_buckets, n_heads)

    def bucket(self, rel: Tensor) -> Tensor:
        """Bucket of relative position j - i (exact for small distances, log-spaced beyond)."""
        n_buckets, ret = self.num_buckets, torch.zeros_like(rel)
        if self.bidirectional:
            n_buckets //= 2
            ret = ret + (rel > 0).long() * n_buckets
            n = rel.abs()
        else:
            n = (-rel).clamp_min(0)
        exact = n_buckets // 2
        large = exact + (
            torch.log(n.clamp_min(1).float() / exact) / math.log(self.max_distance / exact) * (n_buckets - exact)
        ).long()
        return ret + torch.where(n < exact, n, large.clamp_max(n_buckets - 1))

    def attention_kwargs(self, q, k, query_offset):
        (lq, lk), device = (q.shape[-2], k.shape[-2]), q.device
        i = torch.arange(lq, device=device) + query_offset
        rel = torch.arange(lk, device=device)[None, :] - i[:, None]
        return {"attn_bias": self.bias(self.bucket(rel)).permute(2, 0, 1)}

    def draw(self, max_offset):
        return {"bias": bias_drawing(self, max_offset, "T5 bias per head (learned per distance bucket)")}


def bias_drawing(module: RelativePositions, max_offset: int, title: str = "", query: int | None = None) -> Drawing:
    """A bias scheme's score bias by offset j − i, per head: one query at position `query`
    (default max_offset, so every offset down to -max_offset has a key) against keys around it."""
    query = max_offset if query is None else query
    q = torch.zeros(1, 1, 1, 1)
    k = torch.zeros(1, 1, query + max_offset + 1, 1)
    with torch.no_grad():
        bias = module.attention_kwargs(q, k, query)["attn_bias"]  # (H, 1, Lk) or (B, H, 1, Lk)
    bias = bias.reshape(-1, k.shape[-2])[:, query - max_offset:].float().cpu()
    return Drawing("curves", bias, torch.arange(-max_offset, max_offset + 1), "score bias added to the logit",
                   title=title)


@dataclass
class T5BiasConfig(PositionConfig):
    scheme: str = "t5_bias"
    """t5_bias: T5's learned bias per head and relative-distance bucket (Raffel et al., 2020)"""
    t5_num_buckets: int = 32
    """relative-position buckets (half per direction when bidirectional)"""
    t5_max_distance: int = 128
    """distances from here on share the last bucket"""

    def validate(self) -> None:
        if self.t5_num_buckets < 2 or self.t5_max_distance <= self.t5_num_buckets // 2:
            # The decoder's one-directional buckets have num_buckets/2 exact distances; the
            # log-spaced ones divide by log(max_distance / (num_buckets/2)), which must be > 0.
            raise ValueError(f"model.positions.t5_num_buckets must be >= 2 and model.positions.t5_max_distance > t5_num_buckets/2 "
                             f"(got {self.t5_num_buckets} and {self.t5_max_distance})")


class T5Bias(PositionScheme):
    """T5's relative bias: a learned scalar per head and log-spaced distance bucket (Raffel et al., 2020)."""

    config_class = T5BiasConfig

    def attention(self, head_dim, n_heads, causal):
        return T5BiasPositions(self.cfg, n_heads, bidirectional=not causal)
