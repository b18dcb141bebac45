"""A third-party position scheme for the tests: causal-only, content-dependent, with a state
rewritten per key.

Selective attention's shape (Leviathan et al., 2024): each query subtracts from its logits a running
per-key sum of selection scores, F_ij = Σ_{t ≤ i} S_tj, with S_tj = s_h · softplus(q_t·k_j/√D) over
the keys query t sees. The sum runs over the queries before i, so it is defined for causal
attention only: the scheme declares `supports_bidirectional = False`, and its `attention()` refuses
causal=False. The cache keeps F of the last query for every key (a `KeyState` rewritten per key
with `replace`); a step adds its own queries' scores to it.

Only the relpos_lab.api imports, as a plugin's: tests/test_causal_only_schemes.py installs it
as a distribution (a .dist-info with its entry point) for the CLI, and imports it for the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from relpos_lab.api import PositionConfig, PositionScheme, RelativePositions


@dataclass
class RunningSumConfig(PositionConfig):
    scheme: str = "running_sum"
    """running_sum: each query subtracts a running per-key sum of selection scores (causal only)"""


class RunningSum(RelativePositions):
    def __init__(self, n_heads: int):
        super().__init__()
        self.strength = nn.Parameter(torch.full((n_heads,), 0.5))  # s_h

    def content_bias(self, q, k, x, query_offset, visible, state):
        lk = k.shape[-2]
        scores = self.strength[:, None, None] * F.softplus(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
        if visible is not None:
            scores = scores.masked_fill(~visible, 0.0)  # (B, H, Lq, Lk): S_tj of the new queries
        before = state.value if state.value is not None else scores.new_zeros(scores.shape[:2] + (0,))
        before = F.pad(before, (0, lk - before.shape[-1]))  # the new keys have no score yet
        running = before[..., None, :] + scores.cumsum(-2)  # F_ij = Σ_{t ≤ i} S_tj, earlier queries first
        state.replace(running[..., -1, :])  # every key's sum so far, rewritten
        return -running


class RunningSumScheme(PositionScheme):
    """Subtracts a running per-key sum of selection scores (selective attention, Leviathan et al., 2024)."""

    config_class = RunningSumConfig
    positions_from_content = True
    supports_bidirectional = False

    def attention(self, head_dim, n_heads, causal):
        if not causal:
            raise ValueError("running_sum sums over the queries before each one: it has no bidirectional form")
        return RunningSum(n_heads)
