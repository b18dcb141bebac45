"""The encoder-only model of Delétang et al. (2023) and Ruoss et al. (2023): the source followed by
blank output slots, read all at once.

An example becomes one sequence, ``source <slot> … <slot>``, with as many slots as the output has
tokens (the task says how many from the source's length: `Seq2SeqTask.output_length`). One
bidirectional encoder stack reads it, and the slots' final states are projected onto the target
vocabulary: the output comes out in one forward pass, with no decoding and no end of output to
predict. The slot is one more input symbol, learned like the others (the reference appends an
"empty" symbol to the one-hot input alphabet).

Positions are absolute within each example: a row's slots follow its own last source token, and
padding comes after them (right padding), so a row's output does not depend on the rows beside it.
Every position scheme acts in the encoder's self-attention as in the encoder-decoder's encoder; the
slots are positions like any other.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from relpos_lab.core.embedding import seed_eval_positions
from relpos_lab.core.init import linear
from relpos_lab.core.transformer import Encoder, ModelConfig, make_embedding


class EncoderOnly(nn.Module):
    """``source <slot>…`` through one encoder; logits at the slots (see the module docstring)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        if cfg.architecture != "encoder_only":
            raise ValueError(f"EncoderOnly needs model.architecture=encoder_only, got {cfg.architecture!r}")
        if cfg.n_encoder_layers < 1 or cfg.src_vocab_size < 1 or cfg.tgt_vocab_size < 1:
            raise ValueError("EncoderOnly needs n_encoder_layers >= 1 and both vocabulary sizes set")
        self.cfg, self.pad_id = cfg, cfg.pad_id
        self.slot_id = cfg.src_vocab_size  # the blank output slot: one symbol after the source's
        self.encoder = Encoder(cfg, make_embedding(cfg, cfg.src_vocab_size + 1))
        self.output = linear(cfg.d_model, cfg.tgt_vocab_size, bias=cfg.output_bias, init=cfg.init)
        seed_eval_positions(self, 0)

    def forward(self, src: Tensor, n_slots: Tensor, width: int | None = None) -> Tensor:
        """src (B, S) right-padded, n_slots (B,) the output length of each row -> logits (B, N, tgt_vocab)
        with N = max(n_slots); a row's logits past its own slots are meaningless (its target is pad there).

        width: N, when the caller knows it on the host; a compiled forward cannot read it from n_slots
        without leaving its graph."""
        batch, s = src.shape
        n = width if width is not None else int(n_slots.max()) if n_slots.numel() else 0
        n_src = (src != self.pad_id).sum(-1)
        column = torch.arange(n, device=src.device)
        where = n_src[:, None] + column  # (B, N): slot c of a row sits right after its source
        is_slot = column[None, :] < n_slots[:, None]
        # Out of place, so that a stack of runs can vmap it (core/stack.py)
        seq = torch.cat([src, src.new_full((batch, n), self.pad_id)], dim=1)
        seq = seq.scatter(1, where, torch.where(is_slot, self.slot_id, self.pad_id).to(src.dtype))
        hidden, _ = self.encoder(seq)  # (B, S + N, d)
        at_slots = hidden.gather(1, where[:, :, None].expand(-1, -1, hidden.shape[-1]))  # (B, N, d)
        return self.output(at_slots)
