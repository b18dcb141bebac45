"""Absolute schemes, added to the token embeddings: none (NoPE), sinusoidal, learned."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import PositionConfig, PositionScheme


class SinusoidalEmbedding(nn.Module):
    """The fixed sinusoids of Vaswani et al.; computed on the fly, so any length works.

    `count_from_end`: token t of L is at position L − t (L, L − 1, .., 1), so the last token is
    always at 1: what Delétang et al.'s code gives its encoder. It needs the whole sequence at once,
    and L is each row's own length (`reads_lengths`: the embedding passes them), not the padded width."""

    def __init__(self, d_model: int, count_from_end: bool = False):
        super().__init__()
        inv_freq = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.d_model = d_model
        self.count_from_end = self.reads_lengths = count_from_end

    def forward(self, x: Tensor, offset: int = 0, lengths: Tensor | None = None) -> Tensor:
        """x (B, L, d) plus the sinusoids of its positions; `lengths` (B,): each row's real tokens
        (count_from_end; default: all L)."""
        column = torch.arange(x.shape[1], device=x.device)
        if self.count_from_end:
            if offset:
                raise ValueError("model.positions.count_from_end counts from the sequence's end, which a decoder "
                                 "feeding one token at a time does not know; use it with model.architecture="
                                 "encoder_only")
            ends = torch.full((x.shape[0], 1), x.shape[1], device=x.device) if lengths is None else lengths[:, None]
            pos = (ends - column).float()  # (B, L): a row's last real token at 1, its padding at 0, -1, ..
        else:
            pos = (column + offset).float()[None]  # (1, L)
        angles = pos[..., None] * self.inv_freq
        pe = torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)[..., : self.d_model]
        return x + pe.to(x.dtype)


class LearnedEmbedding(nn.Module):
    """Trained absolute embeddings; cannot represent positions beyond max_len."""

    def __init__(self, d_model: int, max_len: int):
        super().__init__()
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, x: Tensor, offset: int = 0) -> Tensor:
        end = offset + x.shape[1]
        if end > self.embedding.num_embeddings:
            raise ValueError(
                f"sequence reaches position {end}, beyond model.positions.max_len="
                f"{self.embedding.num_embeddings}; raise model.positions.max_len or use a relative scheme"
            )
        return x + self.embedding(torch.arange(offset, end, device=x.device)).to(x.dtype)


@dataclass
class NoPEConfig(PositionConfig):
    scheme: str = "none"
    """none: no position information at all (NoPE; a decoder still sees order through causality)"""


class NoPE(PositionScheme):
    """No position information (NoPE): the model sees a bag of tokens, or causal order in a decoder."""

    config_class = NoPEConfig
    contributes_nothing = True


@dataclass
class SinusoidalConfig(PositionConfig):
    scheme: str = "sinusoidal"
    """sinusoidal: the fixed absolute sinusoids of Vaswani et al. (2017)"""

    count_from_end: bool = False
    """token t of L at position L − t, the last at 1, as Delétang et al.'s code places its encoder's
    tokens (model.architecture=encoder_only; not with randomized positions); false: 0, 1, .."""

    def validate(self) -> None:
        if self.count_from_end and self.max_random_len is not None:
            raise ValueError("model.positions.count_from_end and max_random_len do not combine (no reference "
                             "counts randomized positions from the end); set one of them off")


class Sinusoidal(PositionScheme):
    """Fixed absolute sinusoids added to the embeddings (Vaswani et al., 2017)."""

    config_class = SinusoidalConfig

    def embedding(self, d_model):
        return SinusoidalEmbedding(d_model, self.cfg.count_from_end)


@dataclass
class LearnedConfig(PositionConfig):
    scheme: str = "learned"
    """learned: one trained embedding per absolute position"""
    max_len: int = 1024
    """positions 0..max_len-1; a longer sequence is an error"""

    def validate(self) -> None:
        if self.max_len < 1:
            raise ValueError(f"model.positions.max_len={self.max_len} must be >= 1")


class Learned(PositionScheme):
    """Trained absolute position embeddings (Gehring et al., 2017), up to max_len."""

    config_class = LearnedConfig

    def embedding(self, d_model):
        return LearnedEmbedding(d_model, self.cfg.max_len)
