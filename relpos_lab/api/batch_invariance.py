"""Batch invariance, the core's contract: an example's outputs are the same alone and in a
right-padded batch beside longer and shorter neighbours, at evaluation.

A published score is a sum over examples; if an example's logits moved with its neighbours' lengths,
the score would measure how the evaluation batches were cut. `check(model, family)` scores each
example of a fixed mixed-length batch alone (no padding) and batched, and names the first one whose
logits differ beyond float32 rounding, or whose greedy or beam output differs. The suite runs it
over every built-in scheme and option, every family and attention implementation
(tests/test_batch_invariance.py); `relpos-lab check-scheme` runs it on a plugin.

Randomized positions (randomize_at_eval) are included exactly: at evaluation a sequence of L
tokens draws its positions from a generator seeded by (run seed, stack, L) (core/embedding.py), so
alone and batched it gets the same draw. In training each row takes a random subset of its
batch's draw, as long as itself, which has the law of its own draw alone
(positions/randomized.py; tests/test_randomized_positions.py checks it); the check is of evaluation.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from relpos_lab.core.compiling import unwrapped
from relpos_lab.core.decoding import beam_search, by_source_length, greedy_search
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM

SOURCE_LENGTHS = (5, 2, 8, 5)
"""The examples' source lengths: a short and a long neighbour, and two rows of one length."""
TARGET_LENGTHS = (4, 6, 2, 3)
"""Their target (teacher-forced input, BOS first) or output-slot lengths: not ordered as the sources."""
TOLERANCE = 1e-4
"""Largest difference of logits, relative to the largest logit (at least 1): float32 rounding of a
tiny model stays below 1e-5; a row placed by its neighbours' width is off by 1e-3 to 1."""
BOS, EOS, PAD = 1, 2, 0


def examples(vocab: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """(src, tgt_in): right-padded (B, max) token ids of SOURCE_LENGTHS and TARGET_LENGTHS, targets
    starting with BOS; ids from 3 up (0-2 are the specials)."""
    g = torch.Generator().manual_seed(seed)

    def padded(lengths, bos):
        ids = torch.randint(3, vocab, (len(lengths), max(lengths)), generator=g)
        ids[:, 0] = BOS if bos else ids[:, 0]
        return ids.masked_fill(torch.arange(ids.shape[1])[None, :] >= torch.tensor(lengths)[:, None], PAD)

    return padded(SOURCE_LENGTHS, False), padded(TARGET_LENGTHS, True)


def family_of(model: nn.Module) -> str:
    model = unwrapped(model)
    if isinstance(model, EncoderOnly):
        return "encoder_only"
    if isinstance(model, PrefixLM):
        return "prefix_lm"
    return "lm" if isinstance(model, DecoderLM) else "encoder_decoder"


def logits(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """The family's teacher-forced logits (B, T, V) at each row's target positions."""
    family = family_of(model)
    if family == "encoder_only":
        return model(src, (tgt != PAD).sum(-1), width=tgt.shape[1])
    return model(tgt) if family == "lm" else model(src, tgt)  # the plain LM: the targets as token streams


def check(model: nn.Module, seed: int = 0, searches: bool = True) -> str:
    """Each example's logits (and, for the families that decode, its greedy and beam output unless
    `searches` is False) alone against batched, in eval mode; an AssertionError names the first
    that differs."""
    model.eval()
    vocab = model.cfg.src_vocab_size
    src, tgt = examples(vocab, seed)
    worst = 0.0
    with torch.no_grad():
        batched = logits(model, src, tgt)
        for r, (n, m) in enumerate(zip(SOURCE_LENGTHS, TARGET_LENGTHS)):
            alone = logits(model, src[r:r + 1, :n], tgt[r:r + 1, :m])[0]
            diff = (alone - batched[r, :m]).abs().max().item()
            scale = max(1.0, alone.abs().max().item())
            assert diff <= TOLERANCE * scale, (
                f"example {r} (source {n} tokens, target {m}) has logits {diff:.3g} away from its own when batched "
                f"with sources of {', '.join(map(str, SOURCE_LENGTHS))} tokens (tolerance {TOLERANCE * scale:.1g}): "
                "does something read the padded width (x.shape, a draw of the batch's length) instead of the "
                "row's own? A scheme whose arithmetic reads it declares reads_width = True")
            worst = max(worst, diff / scale)
        if searches and family_of(model) in ("encoder_decoder", "prefix_lm"):
            for name, search in (("greedy", greedy_search), ("beam", beam_search)):
                _same_output(model, name, search, src)
    return f"max difference {worst:.1e} of the largest logit, alone against batched"


def _same_output(model, name: str, search, src: Tensor) -> None:
    def run(rows: Tensor) -> Tensor:
        return search(model, rows, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_a=1.0, max_len_b=3)

    def decode(rows: Tensor) -> Tensor:
        return by_source_length(run, rows, PAD) if family_of(model) == "prefix_lm" else run(rows)

    batched = decode(src)
    for r, n in enumerate(SOURCE_LENGTHS):
        alone = decode(src[r:r + 1, :n])[0]
        mine = batched[r, :alone.shape[0]]
        assert torch.equal(alone, mine) and not (batched[r, alone.shape[0]:] != PAD).any(), (
            f"example {r} (source {n} tokens): {name} search gives {alone.tolist()} alone and "
            f"{batched[r].tolist()} batched")
