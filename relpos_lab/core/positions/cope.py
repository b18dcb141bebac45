"""CoPE (Golovneva et al., 2024, "Contextual Position Encoding: Learning to Count What's Important"):
positions counted by gates that depend on the tokens.

    g_ij = σ(q_i·k_j / √D)                          (0 for keys query i may not see)
    p_ij = Σ_{t=j..i} g_it                          (keys j ≤ i: a gated count back from i to j)
    e[p] = (p − ⌊p⌋)·e[⌈p⌉] + (1 − p + ⌊p⌋)·e[⌊p⌋]   p clipped to cope_npos_max − 1
    e_ij = q_i·k_j / √D + q_i·e[p_ij]

computed as in the paper: q·E for the integer positions (B, H, Lq, npos_max), then the two
neighbours of each p_ij gathered and interpolated, so no (Lq, Lk, D) tensor is formed. As in the
paper's code, the gates read the scaled logits q·k/√D, the position term q·e[p] is not scaled, the
table E (D, npos_max) is shared by the heads of a layer and starts at zero.

Bidirectional attention (encoders, a prefix LM's bidirectional prefix) is an extension, not the
paper's: a key after the query counts forward, p_ij = Σ_{t=i..j} g_it, and reads a second table
E⁺, so the two directions stay distinguishable. Only keys a query may see are counted (padding,
masks), which is what keeps cached decoding, multi-token prefill and padded batches equal.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


@dataclass
class CopeConfig(PositionConfig):
    scheme: str = "cope"
    """cope: contextual positions, gated counts of the keys between query and key (Golovneva et al., 2024)"""
    cope_npos_max: int = 64
    """learned position embeddings e[0..npos_max−1]; counts beyond npos_max−1 share the last"""

    def validate(self) -> None:
        if self.cope_npos_max < 2:
            raise ValueError(f"model.positions.cope_npos_max={self.cope_npos_max} must be >= 2 "
                             "(positions 0..npos_max−1 are interpolated between neighbours)")


class CopePositions(RelativePositions):
    """E (D, npos_max), and E⁺ for keys after the query when the layer is bidirectional."""

    def __init__(self, head_dim: int, npos_max: int, bidirectional: bool):
        super().__init__()
        self.npos_max = npos_max
        self.past = nn.Parameter(torch.zeros(head_dim, npos_max))
        self.future = nn.Parameter(torch.zeros(head_dim, npos_max)) if bidirectional else None

    def positions(self, q: Tensor, k: Tensor, query_offset: int, visible: Tensor | None) -> tuple[Tensor, Tensor]:
        """p_ij (B, H, Lq, Lk), clipped to npos_max − 1, and where key j is at or before query i (Lq, Lk)."""
        acc = torch.promote_types(q.dtype, torch.float32)
        gates = torch.sigmoid((q @ k.transpose(-1, -2)).to(acc) / math.sqrt(q.shape[-1]))  # g_ij
        if visible is not None:
            gates = gates * visible
        i = torch.arange(q.shape[-2], device=q.device)[:, None] + query_offset
        j = torch.arange(k.shape[-2], device=q.device)[None, :]
        before = j <= i
        p = (gates * before).flip(-1).cumsum(-1).flip(-1)  # Σ_{t=j..i} g_it: the row's sum from j on, t ≤ i
        if self.future is not None:
            p = torch.where(before, p, (gates * (j >= i)).cumsum(-1))  # Σ_{t=i..j} g_it for j > i
        return p.clamp(max=self.npos_max - 1), before

    def content_bias(self, q, k, x, query_offset, visible, state):
        p, before = self.positions(q, k, query_offset, visible)
        bias = self.interpolate(q, self.past, p)
        if self.future is not None:
            bias = torch.where(before, bias, self.interpolate(q, self.future, p))
        return bias

    @staticmethod
    def interpolate(q: Tensor, table: Tensor, p: Tensor) -> Tensor:
        """q_i·e[p_ij]: q·E at the integer positions, then each p between its two neighbours."""
        at_integers = (q @ table.to(q.dtype)).to(p.dtype)  # (B, H, Lq, npos_max)
        floor, ceil = p.floor(), p.ceil()
        w = p - floor
        return (w * at_integers.gather(-1, ceil.long()) + (1 - w) * at_integers.gather(-1, floor.long()))

    def draw(self, max_offset):
        """The learned embeddings e[p] by contextual position p (what a query reads at count p):
        their norms, and the cosine between positions (rows alike are counts the layer does not
        tell apart). The counts themselves depend on the tokens, which a drawing does not have."""
        drawings = {}
        for name, table in (("past", self.past), ("future", self.future)):
            if table is None:
                continue
            e = table.detach().float().t()  # (npos_max, D)
            unit = torch.nn.functional.normalize(e, dim=-1)
            where = "keys up to the query" if name == "past" else "keys after the query"
            positions = torch.arange(self.npos_max)
            drawings[f"{name}_norm"] = Drawing(
                "curves", e.norm(dim=-1)[None], positions, "‖e[p]‖ (L2 norm)",
                xlabel="contextual position p (gated count)", line_label="shared by all heads",
                title=f"CoPE: norm of e[p] per position ({where})")
            drawings[f"{name}_cosine"] = Drawing(
                "matrix", unit @ unit.t(), positions, "cos(e[p], e[p′])", xlabel="contextual position p",
                title=f"CoPE: cosine between positions ({where})")
        return drawings

    def draw_content(self, q, k, x, query_offset, visible, max_offset):
        """Beside the bias (super()'s panel): the contextual positions p_ij themselves by offset,
        how far the gated counts place each key from its query on this batch."""
        p, _ = self.positions(q, k, query_offset, visible)
        return {"positions": Drawing.by_offset(p, visible, query_offset, max_offset,
                                               "contextual position p_ij (gated count)",
                                               title="CoPE: contextual position on a sample batch: "
                                                     "mean ± std per head"),
                **super().draw_content(q, k, x, query_offset, visible, max_offset)}


class Cope(PositionScheme):
    """Contextual positions: gated counts of the tokens between query and key (Golovneva et al., 2024)."""

    config_class = CopeConfig
    positions_from_content = True

    def attention(self, head_dim, n_heads, causal):
        return CopePositions(head_dim, self.cfg.cope_npos_max, bidirectional=not causal)
