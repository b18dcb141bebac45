"""Randomized positions (Ruoss et al., 2023), a modifier of every scheme: `model.positions.max_random_len`.

In training, a sequence of length L is given the positions of an ordered random subset of
[0, max_random_len) instead of 0..L-1 (one draw per forward pass of a stack, shared by its
embedding, all its layers and every row of the batch), so positions beyond the training lengths
are seen in training. Two protocols at evaluation:

- `randomize_at_eval: false` (the default): evaluation and decoding use 0..L-1, as for any model.
- `randomize_at_eval: true`: Ruoss et al.'s protocol. Their code (google-deepmind/
  randomized_positional_encodings, read at commit 57bc5d01) draws at test time exactly as in
  training: `experiments/range_evaluation.py` (`range_evaluation`) applies the model with a fresh
  key from `hk.PRNGSequence(1)` for every batch (seeded, so repeatable), and
  `models/positional_encodings.py` (`noisy_fixed_positional_encodings`) takes
  `jrandom.choice(arange(noise_max_length), (sequence_length,), replace=False)`, sorted: one draw
  from [0, noise_max_length) per forward pass, shared by the batch, whose rows all have one length
  there (their evaluation batches hold one length each). (Their noisy RoPE draws anew in each layer,
  their noisy relative encodings draw distances: `redraw_per_layer`, `random_distances`.) Here an
  evaluation pass draws per length: a stack runs each length of a padded batch on its own
  (core/length_groups.py), from a generator seeded by (run seed, stack, length)
  (`Embedding.draws`), so an example of L tokens gets the same positions alone, in any batch, under
  DDP and in every evaluation. Their `models/transformer.py` has encoders only, read off in one
  pass; our decoders generate token by token, so a generation's positions are drawn up front, for
  the most tokens its row may feed (`Embedding.decoding_positions`; the searches run per source
  length, since the budget is a function of it), and step t uses the t-th of them: the KV cache
  then computes what a full pass at those positions computes.

In training a pass draws once for the batch's width W, and each row of n tokens takes a random n
of those W positions (`frame_slots`): its tokens move to n random slots of a frame of W, in order,
padding in the others, so a row's positions are an ordered random subset of [0, max_random_len)
exactly as they are alone, whatever its neighbours (a random n of a random W is a random n). The
stack runs on the frame, masked where it holds padding, and its output is read back in the rows'
order: the same ops for every batch, no host sync (a stack of runs vmaps it, a compiled model
traces it). With `random_distances` the tokens stay in place (a gap between two tokens would change
the offset their distance stands for): the batch draws W − 1 right-hand distances and each row of
n takes a random n − 1 of them, in order (`Embedding.random_distances_of`), a (B, 2W − 1) table
the layers read row by row. A scheme that reads token ids (digits.py: padding between digits would
move them) keeps the batch's one draw: a row of n tokens gets the first n of the W drawn
positions, the smallest. The papers' protocols train on batches of one length, where every way
agrees.

Any scheme works unchanged, because a layer computes exactly what the scheme computes on a
sequence whose tokens sit at those positions: the scheme's hooks see the tokens spread into a
sequence of length max(position) + 1 whose other slots are masked out (cheap: q, k and the layer
input, O(max_random_len·D), plus the dense bias of a scheme that has one), and attention runs over
the real tokens only, its tables read at the labels of their positions (`relative_attention`'s
`positions`): O(L²) per layer, not O(max_random_len²) as attention over every slot was.
Decoding (randomize_at_eval) keeps the spread keys in the KV cache, gaps included: each step
appends the slots up to its token's position and attends over the slots (O(max_random_len) a step).
"""
from __future__ import annotations

import torch
from torch import Tensor


def sample_positions(length: int, max_random_len: int, device=None,
                     generator: torch.Generator | None = None) -> Tensor:
    """An increasing random subset of [0, max_random_len) with `length` elements, drawn on
    `device` from the global generator, or from `generator` (a CPU one: the same draws on any device)."""
    if length > max_random_len:
        raise ValueError(f"a sequence of {length} tokens does not fit model.positions.max_random_len="
                         f"{max_random_len}; raise it above the longest sequence placed (with BOS/EOS; with "
                         f"randomize_at_eval, also the longest evaluated one and a decoder's whole output budget)")
    if generator is None:
        return torch.randperm(max_random_len, device=device)[:length].sort().values
    return torch.randperm(max_random_len, generator=generator)[:length].sort().values.to(device)


def sample_distances(length: int, max_random_len: int, device=None,
                     generator: torch.Generator | None = None) -> Tensor:
    """The distances the offsets -(length - 1)..length - 1 of `length` tokens stand for
    (`random_distances`): 0 for 0, an increasing random subset of [1, max_random_len) to the right
    and its negatives to the left, as Ruoss et al.'s noisy ALiBi and relative encodings draw them
    (symmetric). Drawn like `sample_positions`."""
    if length > max_random_len:
        raise ValueError(f"a sequence of {length} tokens has offsets up to {length - 1}, more than "
                         f"model.positions.max_random_len={max_random_len} leaves distinct distances for; raise it")
    right = torch.randperm(max_random_len - 1, generator=generator)[:length - 1].sort().values + 1
    return torch.cat((-right.flip(0), right.new_zeros(1), right)).to(device)


def spread(x: Tensor, positions: Tensor, dim: int, slots: int | None = None) -> Tensor:
    """x with its `dim` rows placed at `positions` of a zero tensor of length `slots`.

    In training and evaluation `slots` is max_random_len: a length known before the draw, so a
    compiled model traces one graph (positions[-1] + 1, the default, would be read from the tensor:
    a graph break). The slots past the last position are gaps like the others: the result is the same."""
    shape = list(x.shape)
    shape[dim] = int(positions[-1]) + 1 if slots is None else slots
    return x.new_zeros(shape).index_copy(dim, positions, x)


def spread_mask(attn_mask: Tensor | None, is_causal: bool, positions: Tensor, slots: int | None = None) -> Tensor:
    """The boolean mask (…, N, N), True = attend, of the spread sequence of N = `slots` (as in
    `spread`): only real tokens are keys, with `attn_mask` ((…, 1 or L, L), True = attend) and
    causality among them."""
    n = int(positions[-1]) + 1 if slots is None else slots
    lead = attn_mask.shape[:-2] if attn_mask is not None else (1, 1)
    length = positions.numel()
    inner = torch.ones(length, length, dtype=torch.bool, device=positions.device)
    if is_causal:
        inner = inner.tril()
    if attn_mask is not None:
        inner = inner & attn_mask.to(torch.bool)
    inner = inner.expand(*lead, length, length)
    # Read, not written: slot s holds token token_at[s] where occupied (a gather, which vmap batches
    # for a stack of runs, where writing inner into a fresh mask would not)
    token_at = torch.full((n,), -1, dtype=torch.long, device=positions.device).scatter(
        0, positions, torch.arange(length, device=positions.device))
    occupied = token_at >= 0
    token_at = token_at.clamp(min=0)
    return inner[..., token_at[:, None], token_at[None, :]] & occupied[:, None] & occupied[None, :]


def frame_slots(lengths: Tensor, width: int) -> Tensor:
    """(B, width): where each row's token i goes in a frame of `width` slots. A row of n tokens
    takes n slots drawn uniformly at random, in order (its tokens 0..n-1), then its padding the
    other slots, in order: a permutation of 0..width-1 per row, from torch's global generator."""
    b = lengths.shape[0]
    rank = torch.rand(b, width, device=lengths.device).argsort(-1).argsort(-1)  # each slot's random rank
    column = torch.arange(width, device=lengths.device)
    taken = rank < lengths[:, None]  # n slots per row, uniformly
    return torch.where(taken, column, column + width).argsort(-1)


def to_frame(x: Tensor, slots: Tensor) -> Tensor:
    """x (B, W, ...) with row b's element i moved to slot slots[b, i]."""
    index = slots.view(*slots.shape, *([1] * (x.dim() - 2))).expand_as(x)
    return torch.empty_like(x).scatter(1, index, x)


def from_frame(x: Tensor, slots: Tensor) -> Tensor:
    """The inverse of `to_frame`: row b's element i read back from slot slots[b, i]."""
    index = slots.view(*slots.shape, *([1] * (x.dim() - 2))).expand(*slots.shape, *x.shape[2:])
    return x.gather(1, index)


def framed_mask(real: Tensor, mask: Tensor | None, slots: Tensor) -> Tensor:
    """(B, 1, W, W), True = attend, for self-attention over a frame whose slots hold `real` (B, W)
    tokens: keys are the real slots, as `mask` ((B or 1, 1, W, W) over the rows' own order, or None)
    allows, moved into the frame; and each slot itself, so that a padding slot before a row's first
    token, under a causal mask, is left with a key (no NaN to leak through a zero weight)."""
    width = real.shape[1]
    keys = real[:, None, None, :]
    if mask is not None:
        inverse = slots.argsort(-1)  # (B, W): the token at each slot
        mask = mask.to(torch.bool).expand(slots.shape[0], *mask.shape[1:])
        rows = mask.gather(2, inverse[:, None, :, None].expand(-1, mask.shape[1], -1, width))
        keys = keys & rows.gather(3, inverse[:, None, None, :].expand(-1, mask.shape[1], width, -1))
    return keys | torch.eye(width, dtype=torch.bool, device=real.device)
