"""PoPE (Gopalakrishnan, Csordás, Schmidhuber & Mozer, 2025, "Decoupling the 'What' and 'Where'
With Polar Coordinate Positional Embeddings"): content sets magnitudes, position sets phases.

Each of a head's D dimensions c becomes a complex number: the query at position n
q̃_c = softplus(q_c)·e^{i·n·θ_c} and the key at m k̃_c = softplus(k_c)·e^{i·(m·θ_c + δ_c)}, with
D frequencies θ_c = base^(−c/D) (RoPE has D/2) and a learned phase δ per head and dimension,
clamped to [−2π, 0] and initially 0. The logit is Re Σ_c q̃_c·conj(k̃_c) / √D
= Σ_c softplus(q_c)·softplus(k_c)·cos((n − m)·θ_c − δ_c) / √D: where a key is (the phase) no longer
mixes with what it is (the magnitude), unlike RoPE, where q's own pairs set part of the angle.

The real form [μ·cos φ, μ·sin φ] of q̃ and k̃ has 2D dimensions: `rotate` returns q and k of width
2D (v keeps D), and q is multiplied by √2 so that relative_attention's 1/√(2D) gives the 1/√D
above. Unverified details: the logit scale 1/√D (the paper's code may use the doubled width), and
θ_c, δ's clamp and zero initialisation, which follow the public PyTorch ports (lucidrains'
PoPE-pytorch, x-transformers) rather than the authors' code. As there, a phase that training
pushes past 0 (or −2π) stays clamped: the clamp passes it no gradient back. With no table or bias, attention
runs on torch's SDPA (or `gather` when asked).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


@dataclass
class PopeConfig(PositionConfig):
    scheme: str = "pope"
    """pope: polar coordinate positions, softplus magnitudes and rotated phases (Gopalakrishnan et al., 2025)"""
    rope_base: float = 10000.0
    """base of the D frequencies θ_c = base^(−c/D)"""

    def validate(self) -> None:
        if self.rope_base <= 1:
            raise ValueError(f"model.positions.rope_base={self.rope_base} must be > 1")


class PopePositions(RelativePositions):
    """q, k (B, H, L, D) -> the real form (B, H, L, 2D) of softplus magnitudes at position phases."""

    def __init__(self, head_dim: int, n_heads: int, base: float):
        super().__init__()
        self.register_buffer("theta", base ** (-torch.arange(head_dim, dtype=torch.float64) / head_dim),
                             persistent=False)
        self.phase = nn.Parameter(torch.zeros(n_heads, head_dim))  # δ, clamped to [−2π, 0] where used

    def delta(self) -> Tensor:
        return self.phase.clamp(-2 * math.pi, 0.0)

    def rotate(self, q, k, offset):
        pos = torch.arange(offset, offset + q.shape[-2], device=q.device, dtype=torch.float64)
        angles = (pos[:, None] * self.theta.double()[None, :]).to(q.dtype)  # (L, D)
        key_angles = angles + self.delta()[:, None, :].to(q.dtype)  # (H, L, D)
        return polar(softplus_magnitude(q) * math.sqrt(2), angles), polar(softplus_magnitude(k), key_angles)

    def draw(self, max_offset):
        """The logit equal unit magnitudes get by offset, mean_c cos((j − i)·θ_c + δ_hc), per head,
        and the learned phases δ per head."""
        d = torch.arange(-max_offset, max_offset + 1, dtype=torch.float64)
        with torch.no_grad():
            delta = self.delta().double()
            score = (d[None, :, None] * self.theta + delta[:, None, :]).cos().mean(-1)  # (H, offsets)
        return {"score": Drawing("curves", score.float(), d.long(), "mean_c cos((j − i)·θ_c + δ_c)",
                                 title="PoPE score of equal magnitudes by offset"),
                "phase": Drawing("curves", delta.float(), torch.arange(delta.shape[-1]), "learned phase δ_c (radians)",
                                 xlabel="dimension c (high → low frequency)", title="PoPE key phase per head")}


def softplus_magnitude(x: Tensor) -> Tensor:
    """softplus(x), of x made contiguous first: q and k come in as a transposed view of the heads,
    and for such an input torch's fake softplus backward (what a compiler traces) lays the gradient
    out unlike the real one, so plain aot_eager's backward then views a tensor it cannot view."""
    return F.softplus(x.contiguous())


def polar(magnitude: Tensor, angles: Tensor) -> Tensor:
    """[μ·cos φ, μ·sin φ] along the last dimension: the real form of μ·e^{iφ}."""
    return torch.cat((magnitude * angles.cos(), magnitude * angles.sin()), dim=-1)


class Pope(PositionScheme):
    """PoPE: softplus magnitudes from content, phases from position, D frequencies (Gopalakrishnan et al., 2025)."""

    config_class = PopeConfig

    def attention(self, head_dim, n_heads, causal):
        return PopePositions(head_dim, n_heads, self.cfg.rope_base)
