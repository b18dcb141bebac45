"""FIRE (Li et al., 2024): a learned function of the progressively normalised distance, per head.

    b(i, j) = f_θ( ψ(|i - j|) / (ψ(max(L, i)) + ε) ),   ψ(x) = log(|c·x| + 1)

This is the paper's eq. for causal attention, b(i, j) = f_θ(ψ(i - j) / ψ(max(L, i))) with
ψ(x) = log(cx + 1), in the form of the paper's reference code: ψ takes |c·x| (so c acts through
its magnitude and i - j through |i - j|), the threshold is L = |λ|·L₀ with λ learned (initially
1) and L₀ = fire_threshold, and ε = 1e-6 keeps the denominator off 0. f_θ is an MLP 1 -> hidden ->
H with a ReLU. i is the query's absolute position (query_offset + row with a cache), j the key's.
Bidirectional attention (encoders) uses the same formula: |i - j| for keys on either side, still
normalised by ψ(max(L, i)) — an extension, since the paper defines FIRE for causal attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relpos_lab.core.positions.base import PositionConfig, PositionScheme, RelativePositions
from relpos_lab.core.positions.bias import bias_drawing

EPS = 1e-6


@dataclass
class FireConfig(PositionConfig):
    scheme: str = "fire"
    """fire: a learned MLP of the log-normalised distance, per head (Li et al., 2024)"""
    fire_hidden: int = 32
    """hidden width of the MLP f_θ (1 -> hidden -> heads)"""
    fire_c: float = 0.1
    """initial c of ψ(x) = log(c·x + 1)"""
    fire_threshold: float = 512.0
    """initial threshold L: positions below it are normalised by ψ(L) instead of ψ(i)"""

    def validate(self) -> None:
        if self.fire_hidden < 1:
            raise ValueError(f"model.positions.fire_hidden={self.fire_hidden} must be >= 1 (the paper uses 32)")
        for name in ("fire_c", "fire_threshold"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.positions.{name}={getattr(self, name)} must be > 0 "
                                 "(the paper starts from c=0.1, L=512)")


class FirePositions(RelativePositions):
    """f_θ, c and the threshold's learned scale λ of one layer; the bias is (H, Lq, Lk)."""

    def __init__(self, cfg: FireConfig, n_heads: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(1, cfg.fire_hidden), nn.ReLU(), nn.Linear(cfg.fire_hidden, n_heads))
        self.c = nn.Parameter(torch.tensor(cfg.fire_c))
        self.threshold_scale = nn.Parameter(torch.tensor(1.0))  # λ: L = |λ|·L₀
        self.initial_threshold = cfg.fire_threshold

    def psi(self, x):
        return torch.log(torch.abs(self.c * x) + 1)

    def normalised_distance(self, lq: int, lk: int, query_offset: int):
        """ψ(|i - j|) / (ψ(max(L, i)) + ε) for query positions i = offset.., keys j = 0..: (Lq, Lk)."""
        i = torch.arange(lq, device=self.c.device, dtype=self.c.dtype) + query_offset
        j = torch.arange(lk, device=self.c.device, dtype=self.c.dtype)
        threshold = torch.abs(self.threshold_scale * self.initial_threshold)
        return self.psi((i[:, None] - j[None, :]).abs()) / (self.psi(torch.maximum(i, threshold)) + EPS)[:, None]

    def attention_kwargs(self, q, k, query_offset):
        x = self.normalised_distance(q.shape[-2], k.shape[-2], query_offset)
        return {"attn_bias": self.mlp(x[..., None]).permute(2, 0, 1).to(q.dtype)}

    def draw(self, max_offset):
        """The bias seen by a query at position max_offset (FIRE's bias also depends on i, through
        ψ(max(L, i)); below the threshold L it does not)."""
        return {"bias": bias_drawing(self, max_offset, f"FIRE bias per head, query at position {max_offset}")}


class Fire(PositionScheme):
    """FIRE: an MLP of the log distance over the log query position, per head (Li et al., 2024)."""

    config_class = FireConfig

    def attention(self, head_dim, n_heads, causal):
        return FirePositions(self.cfg, n_heads)
