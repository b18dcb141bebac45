"""Score biases added to the attention logits: ALiBi's fixed slopes, Sandwich's sinusoid products
and T5's learned buckets.

All are functions of the offset j − i alone, so they hand `relative_attention` a table per head
and offset (``rel_bias``, (H, 2k+1)) rather than a dense (H, Lq, Lk) bias: the fused kernel reads
it by label (every offset for ALiBi and Sandwich, T5's buckets up to t5_max_distance), the other
implementations expand it to the dense bias it stands for."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.attention.masks import max_offset, offset_bias
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
    """ALiBi: a fixed per-head penalty -m_h·|j - i| on the logits, plus left_offset·m_h for keys left of
    the query (j < i). Without that offset an encoder's bias is symmetric and tells left from right
    by nothing; DeepMind's reference code adds 0.5·m_h there, "to (arbitrarily) break the symmetry".
    (In a causal decoder it only moves weight from the query's own key to the keys before it.)"""

    def __init__(self, n_heads: int, left_offset: float = 0.0):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self.left_offset = left_offset

    def attention_kwargs(self, q, k, query_offset):
        widest = max_offset(q.shape[-2], k.shape[-2], query_offset)  # no clipping
        return self._bias(torch.arange(-widest, widest + 1, device=q.device))  # j - i, the label order

    def attention_kwargs_at_distances(self, q, k, distances):
        """Ruoss et al.'s noisy ALiBi: −m_h·|d| (+ left_offset·m_h left of the query) at the distance
        d each offset stands for; each row its own, a dense bias, when `distances` is (B, 2L − 1)."""
        if distances.dim() == 1:
            return self._bias(distances.to(q.device))
        n = q.shape[-2]
        offset = torch.arange(n, device=q.device)
        at = distances.to(q.device).float()[:, offset[None, :] - offset[:, None] + n - 1]  # (B, L, L): of j − i
        penalty = at.abs() - self.left_offset * (at < 0)
        return {"attn_bias": -self.slopes.to(q.device)[None, :, None, None] * penalty[:, None]}

    def _bias(self, distances: Tensor) -> dict:
        """rel_bias over the labels of offsets −k..k whose distances are `distances` (2k + 1,)."""
        distances = distances.float()
        penalty = distances.abs() - self.left_offset * (distances < 0)
        return {"rel_bias": -self.slopes.to(distances.device)[:, None] * penalty, "max_distance": len(distances) // 2}

    def draw(self, max_offset):
        return {"slopes": Drawing("bars", self.slopes.float().cpu(), torch.arange(len(self.slopes)),
                                  "slope m_h (bias −m_h·|j − i|)", xlabel="head", title="ALiBi slope per head (fixed)"),
                "bias": bias_drawing(self, max_offset, "ALiBi bias −m_h·|j − i| per head")}


@dataclass
class AlibiConfig(PositionConfig):
    scheme: str = "alibi"
    """alibi: attention with linear biases (Press et al., 2022)"""

    left_offset: float = 0.0
    """added to the bias of keys left of the query (j < i), in units of the head's slope: 0.5 is the
    encoder ALiBi of Delétang et al.'s and Ruoss et al.'s code, which tells left from right; 0: the
    paper's symmetric bias"""


class Alibi(PositionScheme):
    """Attention with linear biases: a fixed per-head penalty on distance (Press et al., 2022)."""

    config_class = AlibiConfig

    def attention(self, head_dim, n_heads, causal):
        return AlibiPositions(n_heads, self.cfg.left_offset)


class SandwichPositions(RelativePositions):
    """Sandwich (Chi et al., 2023, "Dissecting Transformer Length Extrapolation via the Lens of
    Receptive Field Analysis"): the inner product of sinusoidal position embeddings of width d' as
    the bias, shifted to 0 at offset 0 and divided per head, for head h = 1..H,

        b_h(j − i) = (p_i·p_j − d'/2) / (8h/H),   p_i·p_j = Σ_{t=1..d'/2} cos((j − i) / 10000^(2t/d'))

    A function of |j − i| alone, ≤ 0, with a logarithmic-looking decay and small oscillations; it
    is symmetric, so bidirectional attention uses it as it is. Unverified against the paper's text
    (we could not read it here): the sum's index (t from 1, as in NVIDIA NeMo's implementation;
    from 0 it would add cos(j − i)), the shift d'/2, the head divisor 8h/H (both NeMo's) and the
    default d' = 128 (NeMo uses the model width). NeMo's function sums the angles (j − i)·ω_t
    without the cosine; we take the inner product p_i·p_j itself, the paper's definition.
    """

    def __init__(self, n_heads: int, dim: int):
        super().__init__()
        self.half = dim // 2
        self.register_buffer("omega", 10000.0 ** (-2 * torch.arange(1, self.half + 1, dtype=torch.float64) / dim),
                             persistent=False)
        self.register_buffer("divisor", 8 * torch.arange(1, n_heads + 1, dtype=torch.float64) / n_heads,
                             persistent=False)

    def attention_kwargs(self, q, k, query_offset):
        widest = max_offset(q.shape[-2], k.shape[-2], query_offset)  # no clipping
        d = torch.arange(-widest, widest + 1, device=q.device, dtype=torch.float64)
        inner = (d[:, None] * self.omega.to(q.device)).cos().sum(-1)  # p_i·p_j by offset
        bias = (inner - self.half)[None, :] / self.divisor.to(q.device)[:, None]
        return {"rel_bias": bias.to(torch.promote_types(q.dtype, torch.float32)), "max_distance": widest}

    def draw(self, max_offset):
        return {"bias": bias_drawing(self, max_offset, "Sandwich bias (p_i·p_j − d'/2) / (8h/H) per head")}


@dataclass
class SandwichConfig(PositionConfig):
    scheme: str = "sandwich"
    """sandwich: the inner product of sinusoidal embeddings as a fixed bias (Chi et al., 2023)"""
    sandwich_dim: int = 128
    """d': the width of the sinusoidal embeddings whose inner product p_i·p_j is the bias (even;
    NVIDIA NeMo's implementation uses the model width)"""

    def validate(self) -> None:
        if self.sandwich_dim < 2 or self.sandwich_dim % 2:
            raise ValueError(f"model.positions.sandwich_dim={self.sandwich_dim} must be an even number >= 2")


class Sandwich(PositionScheme):
    """Sandwich: p_i·p_j of sinusoidal embeddings, a parameter-free bias by distance, per head (Chi et al., 2023)."""

    config_class = SandwichConfig

    def attention(self, head_dim, n_heads, causal):
        return SandwichPositions(n_heads, self.cfg.sandwich_dim)


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
        # Every distance from t5_max_distance on is in the last bucket: the table stops there.
        offsets = torch.arange(-self.max_distance, self.max_distance + 1, device=q.device)
        return {"rel_bias": self.bias(self.bucket(offsets)).t(), "max_distance": self.max_distance}

    def draw(self, max_offset):
        return {"bias": bias_drawing(self, max_offset, "T5 bias per head (learned per distance bucket)")}


def bias_drawing(module: RelativePositions, max_offset: int, title: str = "", query: int | None = None) -> Drawing:
    """A bias scheme's score bias by offset j − i, per head: one query at position `query`
    (default max_offset, so every offset down to -max_offset has a key) against keys around it."""
    query = max_offset if query is None else query
    q = torch.zeros(1, 1, 1, 1)
    k = torch.zeros(1, 1, query + max_offset + 1, 1)
    with torch.no_grad():
        kwargs = module.attention_kwargs(q, k, query)
        bias = (offset_bias(kwargs["rel_bias"], 1, k.shape[-2], kwargs["max_distance"], query)
                if "rel_bias" in kwargs else kwargs["attn_bias"])  # (H, 1, Lk) or (B, H, 1, Lk)
    bias = bias.reshape(-1, k.shape[-2])[:, query - max_offset:].float().cpu()
    return Drawing("curves", bias, torch.arange(-max_offset, max_offset + 1), "score bias added to the logit",
                   title=title)


@dataclass
class T5BiasConfig(PositionConfig):
    scheme: str = "t5_bias"
    """t5_bias: T5's learned bias per head and relative-distance bucket (Raffel et al., 2020)"""
    t5_num_buckets: int = 32
    """relative-position buckets (half per direction when bidirectional); at least 4: bidirectional
    attention (an encoder, a bidirectional prefix) keeps num_buckets // 4 exact distances per
    direction, causal attention num_buckets // 2 (2 would do there, but one config serves both)"""
    t5_max_distance: int = 128
    """distances from here on share the last bucket; above t5_num_buckets // 2, where the
    log-spaced buckets of causal attention start"""

    def validate(self) -> None:
        n = self.t5_num_buckets
        if n < 4:
            raise ValueError(f"model.positions.t5_num_buckets={n} is too few: set it to 4 or more (bidirectional "
                             f"attention, an encoder's or a bidirectional prefix's, keeps num_buckets // 4 = {n // 4} "
                             "exact distances per direction, and needs 1)")
        if self.t5_max_distance <= n // 2:
            # The log-spaced buckets divide by log(max_distance / (num_buckets // 2)), which must be > 0.
            raise ValueError(f"model.positions.t5_max_distance={self.t5_max_distance} must be above "
                             f"t5_num_buckets // 2 = {n // 2}, where the log-spaced buckets start: set it to "
                             f"{n // 2 + 1} or more, or lower t5_num_buckets")


class T5Bias(PositionScheme):
    """T5's relative bias: a learned scalar per head and log-spaced distance bucket (Raffel et al., 2020)."""

    config_class = T5BiasConfig

    def attention(self, head_dim, n_heads, causal):
        return T5BiasPositions(self.cfg, n_heads, bidirectional=not causal)
