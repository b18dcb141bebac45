"""The token embedding every stack starts with, and evaluation's randomized positions.

`Embedding` scales the token vectors by sqrt(d_model) and adds the scheme's absolute positions, if
it has any; with randomized positions (positions/randomized.py) it also draws each forward pass's
positions. At evaluation a sequence of L tokens draws from a generator seeded by (the run's seed,
the stack, L): an example gets the same positions alone or beside any neighbours, and in every
evaluation (`seed_eval_positions` sets the seed); `positions_in_order` turns the draws off for
`relpos-lab inspect`.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from relpos_lab.core.attention import capture
from relpos_lab.core.init import HAIKU_EMBEDDING_STD, haiku_layers_, truncated_normal_
from relpos_lab.core.length_groups import row_lengths
from relpos_lab.core.positions import PositionConfig, contract, position_scheme_of
from relpos_lab.core.positions.randomized import frame_slots, sample_distances, sample_positions
from relpos_lab.core.renamed import renamed_state_dict_keys


class Embedding(nn.Module):
    """Token embedding scaled by sqrt(d_model), plus absolute positions if the scheme has them.

    vocab_size, d_model: the token table's shape; `tokens`: a table to share instead (another
        embedding's, for shared source and target vocabularies), used as it is.
    positions: the model's position scheme config (`model.positions`): its absolute module, if any,
        and its randomized positions (max_random_len, randomize_at_eval).
    pad_id: the padding token, whose vector starts at zero; dropout: on the sum; init: the model's
        init scheme (`model.init`; "haiku": a truncated normal, else normal with std 1/sqrt(d_model)).
    `core.transformer.make_embedding` builds one from a `ModelConfig`.
    """

    def __init__(self, vocab_size: int, d_model: int, positions: PositionConfig, *, pad_id: int = 0,
                 dropout: float = 0.0, init: str = "pytorch", tokens: nn.Embedding | None = None):
        super().__init__()
        self.tokens = tokens or nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.pad_id = pad_id
        if tokens is None:
            if init == "haiku":
                truncated_normal_(self.tokens.weight.data, HAIKU_EMBEDDING_STD)
            else:
                nn.init.normal_(self.tokens.weight, std=d_model**-0.5)
            with torch.no_grad():
                self.tokens.weight[pad_id].zero_()
        position_scheme = position_scheme_of(positions)
        self.absolute = position_scheme.embedding(d_model)  # its module, or None; was `positions` (old keys load)
        if init == "haiku":
            haiku_layers_(self.absolute)
        self.reads_tokens = position_scheme.reads_tokens  # its module is called with the ids of every position so far
        self.scheme_label = contract.scheme_label(positions)  # how contract errors name the scheme
        self.unchecked = self.absolute is not None  # its output is checked on the first call (contract.py)
        self.scale = math.sqrt(d_model)
        self.dropout = nn.Dropout(dropout)
        self.max_random_len = positions.max_random_len
        self.randomize_at_eval = positions.randomize_at_eval
        self.random_distances = positions.random_distances  # the layers draw distances; tokens stay at 0..L-1
        self.eval_seed = (0, 0) if self.randomize_at_eval else None  # (run seed, stack): seed_eval_positions
        self.reads_width = position_scheme.reads_width
        self.register_load_state_dict_pre_hook(renamed_state_dict_keys("positions", "absolute"))

    @property
    def per_length_at_eval(self) -> bool:
        """Whether, at evaluation, a stack runs each length of a padded batch on its own
        (core/length_groups.py): its scheme reads the width, or it draws positions for a length. Not
        while an inspect probe measures whole batches (capture.py; positions_in_order turns the draws off)."""
        return capture.ACTIVE is None and (self.reads_width or (
            self.max_random_len is not None and self.randomize_at_eval))

    @property
    def frames_rows(self) -> bool:
        """Whether a training pass gives each row of a padded batch its own positions, drawn as for
        it alone, by moving its tokens to random slots of the batch's width (positions/randomized.py,
        `frame_slots`). Not with random_distances (each row draws its own distances instead,
        `random_distances_of`), nor for a scheme that reads token ids."""
        return (self.training and self.max_random_len is not None and not self.random_distances
                and not self.reads_tokens)

    def draws(self, length: int) -> torch.Generator | None:
        """Where one forward pass over `length` tokens draws its randomized positions: in training
        torch's global generator (None); at evaluation a generator seeded by (run seed, stack,
        length), so a sequence's draws depend on nothing but its own length. A pass takes every
        draw of its stack (embedding, then each layer's) from the one generator it gets here."""
        if self.training or self.eval_seed is None:
            return None
        return torch.Generator().manual_seed(hash((*self.eval_seed, length)) & (2**63 - 1))

    def random_positions(self, length: int, draws: torch.Generator | None = None) -> Tensor | None:
        """This forward pass's positions for `length` tokens with randomized positions: a fresh draw
        in training, and in evaluation with randomize_at_eval (from `draws`, `self.draws(length)`);
        None: 0..L-1."""
        if self.max_random_len is None or self.random_distances or not (self.training or self.randomize_at_eval):
            return None
        return sample_positions(length, self.max_random_len, self.tokens.weight.device, draws)

    def random_distances_of(self, length: int, draws: torch.Generator | None = None,
                            lengths: Tensor | None = None) -> Tensor | None:
        """With random_distances, the distances one layer's offsets stand for (`sample_distances`),
        drawn as `random_positions` draws; None: the offsets themselves. With `lengths` (B,), the rows'
        own lengths (training): (B, 2·length − 1), a row of n tokens taking a random n − 1 of the
        length − 1 drawn right-hand distances, in order, so that it draws them as it would alone."""
        if not self.random_distances or not (self.training or self.randomize_at_eval):
            return None
        drawn = sample_distances(length, self.max_random_len, self.tokens.weight.device, draws)
        if lengths is None:
            return drawn
        right = drawn[length:][frame_slots((lengths - 1).clamp_min(0), length - 1)]  # (B, length - 1)
        return torch.cat((-right.flip(-1), right.new_zeros(len(lengths), 1), right), dim=-1)

    def decoding_positions(self, max_tokens: int | None) -> Tensor | None:
        """A generation's positions, drawn up front for the most tokens it may feed (randomize_at_eval,
        in evaluation): step t takes the t-th. None: 0, 1, ... (and while training, as before)."""
        if self.training or not self.randomize_at_eval:
            return None
        if max_tokens is None:
            raise ValueError("model.positions.randomize_at_eval draws a generation's positions up front: pass "
                             "start_decoding(src, max_tokens=...) the most tokens decode_step will be fed "
                             "(relpos_lab.core.decoding does)")
        return self.random_positions(max_tokens, self.draws(max_tokens))

    def forward(self, ids: Tensor, *, offset: int = 0, positions: Tensor | None = None,
                seen: Tensor | None = None) -> Tensor:
        """`positions`: the positions of `ids` (randomized positions), else offset, offset + 1, ...
        `seen`: with a cache, the ids of every position so far (the cached, then `ids`), for a
        scheme that `reads_tokens`; without one, `ids` are all there is."""
        x = self.tokens(ids) * self.scale
        if self.absolute is not None:
            if self.reads_tokens:
                placed = self.absolute(x, offset, ids if seen is None else seen)
            elif getattr(self.absolute, "reads_lengths", False):  # count_from_end: each row from its own end
                placed = self.absolute(x, offset, lengths=row_lengths(ids, self.pad_id))
            else:
                placed = self.absolute(x, offset) if positions is None else x + self._at(positions, x)
            if self.unchecked:
                contract.check_embedding(self.scheme_label, self.absolute, placed, x)
                self.unchecked = False
            x = placed
        return self.dropout(x)

    def _at(self, positions: Tensor, x: Tensor) -> Tensor:
        """The scheme's absolute encodings at `positions`: what it adds to zeros there."""
        zeros = x.new_zeros(1, self.max_random_len, x.shape[-1])  # (1, max_random_len, d): a shape known when traced
        return self.absolute(zeros, 0).index_select(1, positions)  # (1, L, d): x's tokens' slots


def seed_eval_positions(model: nn.Module, seed: int) -> None:
    """Seed evaluation's position draws (randomize_at_eval) with the run's `seed`, each of `model`'s
    embeddings (stacks) with its own index beside it, so an encoder's and a decoder's draws differ.
    RelposModule calls it with the run's seed, so a checkpoint's numbers repeat."""
    drawing = [m for m in model.modules() if isinstance(m, Embedding) and m.eval_seed is not None]
    for stack, module in enumerate(drawing):
        module.eval_seed = (seed, stack)


def draws_when_decoding(model: nn.Module) -> bool:
    """Whether `model` draws a generation's positions up front now (randomize_at_eval, at evaluation):
    for the most tokens a row may be fed, which a search then gives each row as it would alone."""
    return isinstance(model, nn.Module) and any(  # decoding takes any object with start_decoding, decode_step
        isinstance(m, Embedding) and m.randomize_at_eval and not m.training for m in model.modules())


@contextmanager
def positions_in_order(model: nn.Module):
    """Within the block, evaluation places tokens at 0..L-1 even with randomize_at_eval (`relpos-lab
    inspect` measures attention by token distance j − i)."""
    drawing = [m for m in model.modules() if isinstance(m, Embedding) and m.randomize_at_eval]
    for module in drawing:
        module.randomize_at_eval = False
    try:
        yield
    finally:
        for module in drawing:
            module.randomize_at_eval = True
