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

In training a pass still draws once for the batch's width, shared by its rows: a row of n tokens
in a batch padded to W gets the n smallest of W drawn slots, not a draw of its own. The papers'
protocols train on batches of one length, where the two agree; a training set of mixed lengths
(`train_size` > 0) learns from that skewed draw.

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
