"""DAPE (Zheng et al., 2024, "DAPE: Data-Adaptive Positional Encoding for Length Extrapolation"): a
base bias adjusted per (query, key) by a small MLP that also reads the attention logits.

    s_ij = q_i·k_j / √D                       the logits of every head, (H,) per pair
    B_ij = base bias                          kerple: −p_h·log(1 + a_h·|i − j|);  alibi: −m_h·|i − j|
    e_ij = s_ij + B_ij + f([s_ij ; B_ij])     f: Linear(2H -> W), LeakyReLU, Linear(W -> H)

f runs over the heads' values of one pair, so the bias a head gets depends on every head's logit
and base bias there. As in the authors' released code (DAPE.py: AliBi_DAPE, ParallelKerpleLog_DAPE;
read, not copied), f sees the scaled logits before any mask, Kerple's p and a start uniform in
[0, 2) and [0, 1) and are used clamped at 1e-2 (their code clamps the parameters in place; here
the forward clamps, so a parameter below 1e-2 gets no gradient), and ALiBi's slopes are Press et
al.'s. The MLP is per layer. Bidirectional attention uses |i − j| on both sides (their code builds
the causal triangle only; for a causal layer the two agree). Each pair's bias depends on its own
logits and offset only, so cached decoding needs no state. Cost: q·k once more and an MLP of
width W at every (query, key) pair: O(B·Lq·Lk·(H·D + H·W)) time, O(B·Lq·Lk·W) memory.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import Drawing, KeyState, PositionConfig, PositionScheme, RelativePositions
from relpos_lab.core.positions.bias import alibi_slopes

BASES = ("kerple", "alibi")
KERPLE_MIN = 1e-2


@dataclass
class DapeConfig(PositionConfig):
    scheme: str = "dape"
    """dape: a base bias adjusted by an MLP over every head's logit and bias per pair (Zheng et al., 2024)"""
    dape_base: str = "kerple"
    """the base bias B: kerple (−p·log(1 + a·|i − j|), learned p, a per head) | alibi (fixed slopes)"""
    dape_hidden: int = 32
    """width W of the MLP f: 2·heads -> W -> heads (the paper's default is 32)"""

    def validate(self) -> None:
        if self.dape_base not in BASES:
            raise ValueError(f"model.positions.dape_base={self.dape_base!r}; choose one of {', '.join(BASES)}")
        if self.dape_hidden < 1:
            raise ValueError(f"model.positions.dape_hidden={self.dape_hidden} must be >= 1 (the paper uses 32)")


class DapePositions(RelativePositions):
    """The base bias's parameters (Kerple's p, a; ALiBi's fixed slopes) and the MLP f of one layer."""

    def __init__(self, cfg: DapeConfig, n_heads: int):
        super().__init__()
        self.base = cfg.dape_base
        if self.base == "kerple":
            self.p = nn.Parameter(torch.rand(n_heads) * 2)
            self.a = nn.Parameter(torch.rand(n_heads))
        else:
            self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)
        self.mlp = nn.Sequential(nn.Linear(2 * n_heads, cfg.dape_hidden), nn.LeakyReLU(),
                                 nn.Linear(cfg.dape_hidden, n_heads))

    def base_bias(self, lq: int, lk: int, query_offset: int, dtype) -> Tensor:
        """B (H, Lq, Lk) at query positions query_offset.., keys 0.."""
        i = torch.arange(lq, device=self.mlp[0].weight.device, dtype=dtype)[:, None] + query_offset
        distance = (i - torch.arange(lk, device=i.device, dtype=dtype)[None, :]).abs()
        if self.base == "kerple":
            p, a = (t.clamp(min=KERPLE_MIN).to(dtype)[:, None, None] for t in (self.p, self.a))
            return -p * torch.log1p(a * distance)
        return -self.slopes.to(dtype)[:, None, None] * distance

    def content_bias(self, q, k, x, query_offset, visible, state):
        acc = torch.promote_types(q.dtype, torch.float32)
        logits = (q @ k.transpose(-1, -2)).to(acc) / math.sqrt(q.shape[-1])  # s (B, H, Lq, Lk)
        base = self.base_bias(q.shape[-2], k.shape[-2], query_offset, acc)  # B (H, Lq, Lk)
        pairs = torch.cat((logits, base.expand_as(logits)), dim=1).permute(0, 2, 3, 1)  # (B, Lq, Lk, 2H)
        adjust = self.mlp(pairs.to(self.mlp[0].weight.dtype)).to(acc)  # f([s; B]) (B, Lq, Lk, H)
        return base + adjust.permute(0, 3, 1, 2)

    def draw(self, max_offset):
        """Per head, by offset j − i for a query at position max_offset: the base bias B, and the
        whole bias B + f([s; B]) where every logit s is 0 (its content-free part)."""
        n_heads = self.mlp[-1].out_features
        d = torch.arange(-max_offset, max_offset + 1)
        q, k = torch.zeros(1, n_heads, 1, 1), torch.zeros(1, n_heads, 2 * max_offset + 1, 1)
        with torch.no_grad():
            base = self.base_bias(1, 2 * max_offset + 1, max_offset, torch.float32)[:, 0]
            bias = self.content_bias(q, k, None, max_offset, None, KeyState())[0, :, 0]
        return {"base": Drawing("curves", base, d, "base bias B", title=f"DAPE base bias ({self.base}) per head"),
                "bias": Drawing("curves", bias, d, "score bias added to the logit",
                                title="DAPE bias B + f([0; B]) per head (logits at 0)")}


class Dape(PositionScheme):
    """DAPE: a Kerple or ALiBi bias adjusted by an MLP over the heads' logits and biases (Zheng et al., 2024)."""

    config_class = DapeConfig

    def attention(self, head_dim, n_heads, causal):
        return DapePositions(self.cfg, n_heads)
