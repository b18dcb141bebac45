"""The key/value cache of decoding: what each attention keeps of the positions seen so far, so
that a step attends to them without computing them again (torchtune keeps its cache in kv_cache.py
likewise).

`KVCache` is one attention's keys and values; `LayerCache` a decoder layer's two (self-attention's,
and cross-attention's projection of the encoder memory); `DecoderCache` the whole decoder's, with
the memory, the positions drawn for the generation and the token ids a scheme may read. Each level
has `reorder(index)`, which keeps batch rows by index: beam search's surviving hypotheses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from relpos_lab.core.positions import KeyState
from relpos_lab.core.renamed import renamed_attribute, warn_renamed


@dataclass
class KVCache:
    """One attention's keys and values, (B, H, L, D), for every position seen so far, and what a
    content-dependent position scheme keeps per key (`KeyState`; FoX's cumulative forget gates)."""

    k: Tensor | None = None
    v: Tensor | None = None
    state: KeyState = field(default_factory=KeyState)

    @property
    def length(self) -> int:
        return self.k.shape[-2] if self.k is not None else 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Add the new positions; returns all keys and values, which the new queries attend to."""
        if self.k is not None:
            k, v = torch.cat((self.k, k), dim=-2), torch.cat((self.v, v), dim=-2)  # (B, H, L_cached + L_new, D)
        self.k, self.v = k, v
        return k, v

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search picks its surviving hypotheses with this)."""
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        self.state.reorder(index)


@dataclass
class LayerCache:
    """A decoder layer's caches: its self-attention's, and its cross-attention's projection of
    the encoder memory (filled on the first step, unused without an encoder)."""

    self_attn: KVCache = field(default_factory=KVCache)
    cross_attn: KVCache = field(default_factory=KVCache)

    def reorder(self, index: Tensor) -> None:
        self.self_attn.reorder(index)
        self.cross_attn.reorder(index)


class DecoderCache:
    """What decoding carries from step to step: a LayerCache per decoder layer, the encoder's
    output, which the cross-attention of a layer's first step projects, and the positions drawn for
    the whole generation (`positions`: randomize_at_eval; None: 0, 1, ...), the same for every row."""

    input_pos = renamed_attribute(f"{__name__}.DecoderCache", "input_pos", "positions", settable=True)

    def __init__(self, n_layers: int, memory=None, memory_mask=None, positions: Tensor | None = None, *,
                 input_pos: Tensor | None = None):
        self.layers = [LayerCache() for _ in range(n_layers)]
        self.memory, self.memory_mask = memory, memory_mask
        if input_pos is not None:  # the keyword's old name
            warn_renamed(f"{__name__}.DecoderCache", "input_pos", "positions")
            positions = input_pos
        self.positions = positions
        self.tokens: Tensor | None = None  # every position's token id, kept for a scheme that reads them

    def positions_with(self, n: int) -> Tensor | None:
        """The drawn positions of every token so far and of `n` new ones (theirs last), or None."""
        if self.positions is None:
            return None
        seen = int((self.positions < self.length).sum())  # the cache ends one slot after its last token
        if seen + n > self.positions.numel():
            raise ValueError(f"decoding feeds more than the {self.positions.numel()} tokens whose positions "
                             "were drawn: start_decoding's max_tokens must cover every token decode_step is fed")
        return self.positions[:seen + n]

    def remember(self, tokens: Tensor) -> Tensor:
        """Add the new positions' token ids (B, N); returns every position's so far."""
        self.tokens = tokens if self.tokens is None else torch.cat((self.tokens, tokens), dim=1)
        return self.tokens

    @property
    def length(self) -> int:
        """Positions decoded so far: where the next tokens' absolute positions start."""
        return self.layers[0].self_attn.length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (beam search picks its surviving hypotheses with this)."""
        for layer in self.layers:
            layer.reorder(index)
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, index)
        if self.memory is not None:
            self.memory = self.memory.index_select(0, index)
            self.memory_mask = self.memory_mask.index_select(0, index)
