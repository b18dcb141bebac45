"""RoPE (Su et al., 2021): q and k rotated by their absolute positions; scores see only j - i."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from relpos_lab.core.positions.base import PositionConfig, PositionScheme, RelativePositions


@dataclass
class RopeConfig(PositionConfig):
    scheme: str = "rope"
    """rope: rotary position embeddings (Su et al., 2021)"""
    rope_base: float = 10000.0
    """base of the rotation frequencies"""

    def validate(self) -> None:
        if self.rope_base <= 1:
            raise ValueError(f"model.positions.rope_base={self.rope_base} must be > 1")


class RotaryPositions(RelativePositions):
    """Rotate q and k by their absolute positions; dot products then depend on j - i only."""

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


class Rope(PositionScheme):
    """Rotary position embeddings: q and k rotated by position (Su et al., 2021)."""

    config_class = RopeConfig

    def attention(self, head_dim, n_heads, causal):
        return RotaryPositions(head_dim, self.cfg.rope_base)

    def check(self, d_model, n_heads):
        if (d_model // n_heads) % 2:
            raise ValueError(f"rope needs an even head dimension; d_model/n_heads = {d_model // n_heads}")
