"""Position schemes: one small class each, chosen by one config flag (``PositionConfig.scheme``).

A scheme contributes in at most two places, so the Transformer never special-cases one:

- an *absolute* module added to token embeddings (``sinusoidal``, ``learned``, ``shaw`` with
  ``add_sinusoids``), built once per stack by :func:`build_absolute`;
- a *relative* module per self-attention layer (``shaw``, ``rope``, ``alibi``, ``t5_bias``), built
  by :func:`build_relative`. It may rotate q and k (RoPE) and returns the keyword arguments it
  adds to :func:`relpos_lab.core.attention.relative_attention` (Shaw tables, or a score bias).

Every relative module takes ``query_offset`` (absolute position of the first query row), which is
what keeps cached decoding and multi-token prefill exact.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

SCHEMES = ("none", "sinusoidal", "learned", "shaw", "rope", "alibi", "t5_bias")


@dataclass
class PositionConfig:
    scheme: str = "shaw"
    """none | sinusoidal | learned | shaw | rope | alibi | t5_bias"""
    max_distance: int = 16
    """Shaw's clipping distance k: 2k+1 labels"""
    use_keys: bool = True
    """a^K (the paper's ablation switches these off)"""
    use_values: bool = True
    """a^V"""
    per_head: bool = False
    """the paper shares tables across heads"""
    add_sinusoids: bool = False
    """Shaw on top of absolute sinusoids"""
    max_len: int = 1024
    """learned absolute positions only"""
    rope_base: float = 10000.0
    """rope: base of the rotation frequencies"""
    t5_num_buckets: int = 32
    """t5_bias: relative-position buckets (half per direction when bidirectional)"""
    t5_max_distance: int = 128
    """t5_bias: distances from here on share the last bucket"""

    def validate(self) -> None:
        """Raise ValueError naming the bad field and the fix."""
        if self.scheme not in SCHEMES:
            raise ValueError(f"model.positions.scheme={self.scheme!r} is unknown; choose one of {', '.join(SCHEMES)}")
        if self.scheme != "shaw":
            for name in ("per_head", "add_sinusoids"):
                if getattr(self, name):
                    raise ValueError(f"model.positions.{name}=true only applies to scheme 'shaw', not {self.scheme!r}")
            if not (self.use_keys and self.use_values):
                raise ValueError(f"model.positions.use_keys/use_values only apply to scheme 'shaw', not {self.scheme!r}")
        if self.max_distance < 0:
            raise ValueError(f"model.positions.max_distance={self.max_distance} must be >= 0: it is the clipping distance k "
                             "(the paper uses 16; 0 ignores relative positions)")
        if self.max_len < 1:
            raise ValueError(f"model.positions.max_len={self.max_len} must be >= 1")
        if self.t5_num_buckets < 2 or self.t5_max_distance <= self.t5_num_buckets // 2:
            # The decoder's one-directional buckets have num_buckets/2 exact distances; the
            # log-spaced ones divide by log(max_distance / (num_buckets/2)), which must be > 0.
            raise ValueError(f"model.positions.t5_num_buckets must be >= 2 and model.positions.t5_max_distance > t5_num_buckets/2 "
                             f"(got {self.t5_num_buckets} and {self.t5_max_distance})")


# --- absolute schemes: added to embeddings ---------------------------------------------------

class SinusoidalPositions(nn.Module):
    """The fixed sinusoids of Vaswani et al.; computed on the fly, so any length works."""

    def __init__(self, d_model: int):
        super().__init__()
        inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.d_model = d_model

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        pos = torch.arange(offset, offset + x.shape[1], device=x.device).float()
        angles = pos[:, None] * self.inv_freq[None, :]
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(1)[:, : self.d_model]
        return x + pe.to(x.dtype)


class LearnedPositions(nn.Module):
    """Trained absolute embeddings; cannot represent positions beyond max_len."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        end = offset + x.shape[1]
        if end > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence reaches position {end}, beyond positions.max_len="
                f"{self.embedding.num_embeddings}; raise positions.max_len or use a relative scheme"
            )
        return x + self.embedding(torch.arange(offset, end, device=x.device)).to(x.dtype)


def build_absolute(cfg: PositionConfig, d_model: int) -> nn.Module | None:
    if cfg.scheme == "sinusoidal" or (cfg.scheme == "shaw" and cfg.add_sinusoids):
        return SinusoidalPositions(d_model)
    if cfg.scheme == "learned":
        return LearnedPositions(d_model, cfg.max_len)
    return None


# --- relative schemes: one module per self-attention layer -----------------------------------

class RelativePositions(nn.Module):
    """Base: leaves q and k alone and adds nothing to attention (schemes none/sinusoidal/learned)."""

    def rotate(self, q: Tensor, k: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        return q, k

    def attention_kwargs(self, lq: int, lk: int, query_offset: int, device) -> dict:
        return {}


class ShawPositions(RelativePositions):
    """w^K and w^V: 2k+1 learned vectors each, shared across heads unless per_head."""

    def __init__(self, cfg: PositionConfig, head_dim: int, n_heads: int):
        super().__init__()
        self.max_distance = cfg.max_distance
        shape = (n_heads,) if cfg.per_head else ()
        shape += (2 * cfg.max_distance + 1, head_dim)
        self.rel_k = nn.Parameter(torch.randn(shape) * head_dim**-0.5) if cfg.use_keys else None
        self.rel_v = nn.Parameter(torch.randn(shape) * head_dim**-0.5) if cfg.use_values else None

    def attention_kwargs(self, lq, lk, query_offset, device):
        return {"rel_k": self.rel_k, "rel_v": self.rel_v, "max_distance": self.max_distance}


class RotaryPositions(RelativePositions):
    """RoPE (Su et al., 2021): rotate q and k by their absolute positions; dot products see j - i."""

    def __init__(self, head_dim: int, base: float):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dimension, got d_model/n_heads={head_dim}")
        inv_freq = base ** (-torch.arange(0, head_dim, 2).float() / head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _rotate_at(self, x: Tensor, offset: int) -> Tensor:
        pos = torch.arange(offset, offset + x.shape[-2], device=x.device).float()
        angles = pos[:, None] * self.inv_freq[None, :]
        cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    def rotate(self, q, k, offset):
        # New keys sit at the same absolute positions as the new queries; cached keys were
        # rotated when they were new.
        return self._rotate_at(q, offset), self._rotate_at(k, offset)


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

    def attention_kwargs(self, lq, lk, query_offset, device):
        i = torch.arange(lq, device=device) + query_offset
        dist = (torch.arange(lk, device=device)[None, :] - i[:, None]).abs().float()
        return {"attn_bias": -self.slopes.to(device)[:, None, None] * dist}


class T5BiasPositions(RelativePositions):
    """T5's learned scalar bias per head and log-spaced distance bucket."""

    def __init__(self, cfg: PositionConfig, n_heads: int, bidirectional: bool):
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

    def attention_kwargs(self, lq, lk, query_offset, device):
        i = torch.arange(lq, device=device) + query_offset
        rel = torch.arange(lk, device=device)[None, :] - i[:, None]
        return {"attn_bias": self.bias(self.bucket(rel)).permute(2, 0, 1)}


def build_relative(cfg: PositionConfig, head_dim: int, n_heads: int, causal: bool) -> RelativePositions:
    if cfg.scheme == "shaw":
        return ShawPositions(cfg, head_dim, n_heads)
    if cfg.scheme == "rope":
        return RotaryPositions(head_dim, cfg.rope_base)
    if cfg.scheme == "alibi":
        return AlibiPositions(n_heads)
    if cfg.scheme == "t5_bias":
        return T5BiasPositions(cfg, n_heads, bidirectional=not causal)
    return RelativePositions()
