"""The Forgetting Transformer (FoX; Lin et al., 2025, "Forgetting Transformer: Softmax Attention
with a Forget Gate"): a data-dependent decay of the logits, in place of positions.

    f_t  = σ(w_f·x_t + b_f)                 a scalar forget gate per token and head
    d_ij = Σ_{l=j+1..i} log f_l = c_i − c_j,   c_t = Σ_{l≤t} log f_l
    e_ij = q_i·k_j / √D + d_ij

x_t is the layer's input at token t (after pre-LN's norm when norm_first), w_f and b_f one row and
one bias per head (one Linear d_model -> H). The cache keeps c of every cached key (a `KeyState`),
so a step adds the new tokens' log gates to the last one: O(Lq) per step beside the keys.

Bidirectional attention (encoders, a prefix LM's bidirectional prefix) is an extension, not the
paper's (FoX is defined for causal attention): a key after the query decays by the gates between
them, d_ij = Σ_{l=i+1..j} log f_l = c_j − c_i, so d_ij = −|c_i − c_j| either way. A token that no
query may see (padding, randomized positions' gaps) forgets nothing (log f = 0).

Unverified here: the paper's initial b_f (b_f starts at fox_bias_init), and its scaling of q·k
(taken as the usual 1/√D); the "Pro" block (output gate, QK-norm, key shift) is not included.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


@dataclass
class FoxConfig(PositionConfig):
    scheme: str = "fox"
    """fox: forgetting attention, a data-dependent forget gate per token and head (Lin et al., 2025)"""
    fox_bias_init: float = 0.0
    """initial b_f of every head: the forget gate is σ(b_f) for an input orthogonal to w_f (larger
    keeps more of the past at the start of training)"""


class FoxPositions(RelativePositions):
    """w_f, b_f of one layer: Linear(d_model -> H)."""

    def __init__(self, d_model: int, n_heads: int, bias_init: float):
        super().__init__()
        self.gate = nn.Linear(d_model, n_heads)
        nn.init.constant_(self.gate.bias, bias_init)

    def content_bias(self, q, k, x, query_offset, visible, state):
        lq, lk = q.shape[-2], k.shape[-2]
        acc = torch.promote_types(q.dtype, torch.float32)
        log_f = F.logsigmoid(self.gate(x).to(acc)).transpose(1, 2)  # (B, H, Lq): log f_t of the new tokens
        if visible is not None:
            log_f = log_f * visible[..., lk - lq:].any(-2)  # unseen tokens (padding, gaps) forget nothing
        last = state.value[:, :, -1:] if state.value is not None else 0.0
        c = state.append(last + log_f.cumsum(-1))  # (B, H, Lk): c_j for every key
        c_i = c[:, :, lk - lq:, None]
        i = torch.arange(lq, device=q.device)[:, None] + query_offset
        before = torch.arange(lk, device=q.device)[None, :] <= i
        return torch.where(before, c_i - c[:, :, None, :], c[:, :, None, :] - c_i)  # −|c_i − c_j|

    def draw(self, max_offset):
        """Per head: the forget gate σ(b_f) for an input orthogonal to w_f, how strongly the gate
        reads the input (‖w_f‖), and the decay that content-free gate gives by offset,
        |j − i|·log σ(b_f). The real decay depends on the tokens."""
        gate = torch.sigmoid(self.gate.bias.detach().float())
        d = torch.arange(-max_offset, max_offset + 1)
        heads = torch.arange(len(gate))
        return {
            "gate": Drawing("bars", gate, heads, "σ(b_f)", xlabel="head",
                            title="FoX forget gate per head (content-free)"),
            "gate_weight": Drawing("bars", self.gate.weight.detach().float().norm(dim=-1), heads, "‖w_f‖",
                                   xlabel="head", title="FoX: how much the gate reads the input"),
            "bias": Drawing("curves", d.abs()[None] * gate.log()[:, None], d, "score bias added to the logit",
                            title="FoX decay |j − i|·log σ(b_f) per head (content-free gate)"),
        }


class Fox(PositionScheme):
    """Forgetting attention: a learned, data-dependent forget gate decays the logits (Lin et al., 2025)."""

    config_class = FoxConfig
    positions_from_content = True

    def attention(self, head_dim, n_heads, causal):
        return FoxPositions(head_dim * n_heads, n_heads, self.cfg.fox_bias_init)
