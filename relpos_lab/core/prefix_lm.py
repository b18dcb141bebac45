"""A decoder-only model with the encoder-decoder's interface: a prefix language model.

An example becomes one sequence, ``source <sep> target <eos>``: the decoder reads the source,
then the separator, and predicts the target. The separator is the target's BOS, so `forward(src,
tgt_in)` and the cached `start_decoding(src)` / `decode_step(tokens, cache)` take exactly what
EncoderDecoder takes and return logits over the target vocabulary: losses, greedy and beam search
and every task's `evaluate` run unchanged on either architecture.

One token space: when source and target vocabularies are the same (the synthetic tasks, a joint
SentencePiece model) the sequence uses their ids as they are; otherwise target id t is ``t +
src_vocab_size`` in the joint space, so a source symbol and a target symbol never share an
embedding. Either way the model predicts only target tokens (its logits are the target slice of the
joint output), so generation cannot emit a source-only id.

Attention is causal throughout by default. With ``bidirectional_prefix`` the source attends to all
of itself (query i sees key j iff j <= max(i, n - 1) for a source of n tokens), as in prefix LMs;
the separator and the target stay causal. Decoding prefills the whole source in one call under
that mask, then steps causally from the separator.

Positions are absolute within each example (it starts at 0), so a batch pads on the right, and
decoding needs sources of one length per call (`decoding.by_source_length` groups a batch that
way): a left-padded prefix would shift every position of the shorter rows.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from relpos_lab.core.cache import DecoderCache
from relpos_lab.core.transformer import Decoder, ModelConfig, make_embedding


class PrefixLM(nn.Module):
    """``source <sep> target <eos>`` through one causal decoder (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, shared_vocab: bool = True):
        super().__init__()
        cfg.validate()
        if cfg.src_vocab_size < 1 or cfg.tgt_vocab_size < 1:
            raise ValueError("PrefixLM needs src_vocab_size and tgt_vocab_size set")
        if shared_vocab and cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise ValueError("PrefixLM(shared_vocab=True) needs equal source and target vocabularies")
        self.cfg, self.pad_id = cfg, cfg.pad_id
        self.offset = 0 if shared_vocab else cfg.src_vocab_size  # joint id of target id 0
        self.bidirectional = cfg.bidirectional_prefix
        embed = make_embedding(cfg, self.offset + cfg.tgt_vocab_size)
        self.decoder = Decoder(cfg, embed, cross_attention=False, causal=not self.bidirectional)

    def joint(self, tgt: Tensor) -> Tensor:
        """Target ids in the joint token space (padding stays pad)."""
        return torch.where(tgt == self.pad_id, tgt, tgt + self.offset)

    def _target_slice(self, logits: Tensor) -> Tensor:
        return logits[..., self.offset:self.offset + self.cfg.tgt_vocab_size]

    def forward(self, src: Tensor, tgt_in: Tensor, with_source: bool = False):
        """Target logits (B, T, tgt_vocab) for `tgt_in` (BOS + target) after right-padded `src`.

        with_source: also return the source positions' logits over the joint space (B, S, V) and
        what they predict (the next source token, then the separator; pad elsewhere), for
        `task.loss_on_source`.
        """
        (batch, s), t = src.shape, tgt_in.shape[1]
        n = (src != self.pad_id).sum(-1)
        where = n[:, None] + torch.arange(t, device=src.device)  # target column c sits at n + c
        # Out of place, so that a stack of runs can vmap it (core/stack.py)
        seq = torch.cat([src, src.new_full((batch, t), self.pad_id)], dim=1).scatter(1, where, self.joint(tgt_in))
        mask = self._prefix_mask(n, s + t) if self.bidirectional else None
        logits = self.decoder(seq, self_mask=mask, causal=not self.bidirectional)
        target = self._target_slice(logits.gather(1, where[:, :, None].expand(-1, -1, logits.shape[-1])))
        if not with_source:
            return target
        is_source = torch.arange(s, device=src.device)[None, :] < n[:, None]
        predicts = torch.where(is_source, seq[:, 1:s + 1], torch.full_like(src, self.pad_id))
        return target, logits[:, :s], predicts

    @staticmethod
    def _prefix_mask(n: Tensor, length: int) -> Tensor:
        """(B, 1, L, L), True = may attend: key j to query i iff j <= max(i, n - 1)."""
        i = torch.arange(length, device=n.device)
        last_visible = torch.maximum(i[None, :], n[:, None] - 1)  # (B, L): the last key query i sees
        return (i[None, None, :] <= last_visible[:, :, None])[:, None]

    def start_decoding(self, src: Tensor, max_tokens: int | None = None) -> DecoderCache:
        """Prefill the source in one call (under the prefix mask); steps continue from <sep>.
        max_tokens: the most target tokens decode_step will be fed (<sep> included); with
        randomize_at_eval, the positions of the source and of those are drawn here."""
        if (src == self.pad_id).any():
            raise ValueError("PrefixLM decodes sources of one length per call (padding would shift positions): "
                             "decode through relpos_lab.core.decoding.by_source_length")
        total = None if max_tokens is None else src.shape[1] + max_tokens
        cache = DecoderCache(len(self.decoder.layers), positions=self.decoder.embed.decoding_positions(total))
        if src.shape[1]:
            self.decoder(src, cache=cache, causal=not self.bidirectional)
        return cache

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> Tensor:
        """Target logits for target `tokens` (the first is BOS, the separator), causally after the cache."""
        return self._target_slice(self.decoder(self.joint(tokens), cache=cache))
