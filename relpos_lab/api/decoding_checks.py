"""The conformance kit's decoding checks (relpos_lab.api.testing runs them, one Report line each).

The decoding checks compare the logits of cached decoding (core.cache's DecoderCache, fed
through `decode_step` in chunks: a multi-token prefill, one-token and multi-token steps) with the
full pass, in float64, to CACHE_TOLERANCE (1e-9), in each family:

- plain: one batch without padding (the encoder-decoder's target; the decoder-only LM's sequence);
- padding: the encoder-decoder with right-padded sources (key padding, masked in the encoder and
  the cross-attention), which must also equal each row without its padding; a prefix LM (PrefixLM,
  the decoder-only model of sequence-to-sequence tasks) trained on rows of different source lengths,
  decoded one source length at a time as `decoding.by_source_length` does;
- beam search: the cache's `reorder`, called as `decoding.beam_search` calls it, in the middle of
  decoding (hypotheses duplicated and swapped); what a scheme keeps per key must follow its rows;
- `model.bidirectional_prefix=true`: the prefix LM's two checks again, its source bidirectional.

The encoder-only family decodes nothing; its padding check asks that each row's output slots,
which follow that row's own source, equal the row's without padding.

The plain check is the one that catches a scheme that places queries at 0..L-1 instead of at
`query_offset` (tests/test_conformance.py keeps such a scheme as the negative control); the
reorder check catches one that keeps its per-key state outside the KeyState the cache reorders
(tests/test_conformance_decoding.py). A scheme that declares `supports_cache = False` (position
coupling: a source digit's place needs its number's end) has its decoding checks reported as not
checked; its own tests check the decoding paths it does support.
"""
from __future__ import annotations

import traceback

import torch
from torch import nn

from relpos_lab.core.compiling import unwrapped
from relpos_lab.core.transformer import EncoderDecoder

CACHE_TOLERANCE = 1e-9
"""float64: every decoding check's largest difference of logits (cached against the full pass); the
built-in schemes stay below 1e-14 (rounding); a misplaced position or a lost state is off by 1e-2 or more."""
SOURCE_LENGTHS = (7, 3, 7)
"""The padded batch's rows: sources of 7, 3 and 7 tokens, right-padded to 7 (two groups by length)."""
BEAM = 2
"""Hypotheses per sentence in the beam-reorder checks."""
PLACEMENT = ("do the scheme's hooks place query row r at query_offset + r (and does a content_bias keep what later "
             "steps need in its KeyState)?")
PADDING_HINT = ("do the scheme's hooks place query row r at query_offset + r, and does its content_bias leave out "
                "the keys that `visible` hides (padding)?")
REORDER_HINT = ("does the scheme keep what it remembers per key in the KeyState it is handed (the cache reorders "
                "that with the keys), not on its module?")


def random_tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 12, (batch, length), generator=torch.Generator().manual_seed(seed))


def model_logits(model: nn.Module, arch: str, src, tgt):
    """encoder_decoder: teacher forcing on tgt; encoder_only: tgt's length in slots; decoder_only: src + tgt."""
    if arch == "encoder_only":
        return model(src, torch.full((src.shape[0],), tgt.shape[1]), width=tgt.shape[1])
    return model(src, tgt) if arch == "encoder_decoder" else model(torch.cat([src, tgt], 1))


def decode_in_chunks(model, cache, tokens, bounds=(2, 3)) -> torch.Tensor:
    """`tokens` fed to decode_step in chunks (up to each bound, then the rest): a multi-token
    prefill, a one-token step and a multi-token step; their logits, concatenated."""
    cuts = [0, *(b for b in bounds if b < tokens.shape[1]), tokens.shape[1]]
    return torch.cat([model.decode_step(tokens[:, a:b], cache) for a, b in zip(cuts, cuts[1:]) if b > a], 1)


def largest_difference(cached, full, what: str, hint: str, against: str = "the full pass") -> float:
    """The largest difference; above CACHE_TOLERANCE, an AssertionError saying what differs and a hint."""
    err = (cached - full).abs().max().item()
    assert err <= CACHE_TOLERANCE, f"{what} differ from {against} by {err:.3g} (> {CACHE_TOLERANCE:g}): {hint}"
    return err


def cache_equals_full(model, arch, src, tgt) -> str:
    """Decode the target (or the whole sequence) in chunks of 2, 1 and the rest on the cache."""
    model.eval()
    with torch.no_grad():
        full = model_logits(model, arch, src, tgt)
        if arch == "encoder_decoder":
            cached = decode_in_chunks(model, model.start_decoding(src), tgt)
        else:
            cached = decode_in_chunks(model, model.start_decoding(), torch.cat([src, tgt], 1))
    err = largest_difference(cached, full, "cached logits", PLACEMENT)
    return f"max difference {err:.1e}"


def pad_sources(src: torch.Tensor, pad_id: int) -> torch.Tensor:
    """`src` with row r cut to SOURCE_LENGTHS[r] tokens and right-padded with pad_id."""
    lengths = torch.tensor(SOURCE_LENGTHS[:src.shape[0]])
    return src.masked_fill(torch.arange(src.shape[1])[None, :] >= lengths[:, None], pad_id)


def padded_source(model, src, tgt) -> str:
    """Encoder-decoder, right-padded sources: the padding is masked as keys of the encoder's
    self-attention and of the decoder's cross-attention. Cached decoding of the padded batch equals
    its full pass, and that equals each row's full pass without padding."""
    model.eval()
    src = pad_sources(src, model.cfg.pad_id)
    with torch.no_grad():
        full = model(src, tgt)
        cached = decode_in_chunks(model, model.start_decoding(src), tgt)
        alone = torch.cat([model(src[r:r + 1, :n], tgt[r:r + 1]) for r, n in enumerate(SOURCE_LENGTHS)])
    err = largest_difference(cached, full, "cached logits of the padded batch", PADDING_HINT)
    row = largest_difference(alone, full, "each row's logits without its padding",
                             "does the padding reach the scheme's positions? content_bias must leave out the keys "
                             "that `visible` hides", against="the padded batch's full pass")
    return f"source lengths {', '.join(map(str, SOURCE_LENGTHS))}; max difference {max(err, row):.1e}"


def padded_slots(model, src, tgt) -> str:
    """Encoder-only, right-padded sources: each row's slots follow its own source, so the padded
    batch's slot logits equal each row's without padding."""
    model.eval()
    src = pad_sources(src, model.cfg.pad_id)
    n_slots = torch.full((1,), tgt.shape[1])
    with torch.no_grad():
        full = model(src, n_slots.expand(src.shape[0]))
        alone = torch.cat([model(src[r:r + 1, :n], n_slots) for r, n in enumerate(SOURCE_LENGTHS)])
    err = largest_difference(alone, full, "each row's slot logits without its padding", PADDING_HINT,
                      against="the padded batch's")
    return f"source lengths {', '.join(map(str, SOURCE_LENGTHS))}; max difference {err:.1e}"


def by_source_length(model, src, tgt) -> str:
    """A prefix LM trains on a padded batch (each row's target right after its own source) and
    decodes one source length at a time, unpadded (decoding.by_source_length, since padding inside
    the prefix would shift positions): the per-length cached logits equal the padded full pass."""
    model.eval()
    src = pad_sources(src, model.cfg.pad_id)
    lengths = (src != model.cfg.pad_id).sum(-1)
    with torch.no_grad():
        full = model(src, tgt)
        cached = torch.empty_like(full)
        for n in lengths.unique().tolist():  # the groups of decoding.by_source_length
            rows = (lengths == n).nonzero().squeeze(1)
            cached[rows] = decode_in_chunks(model, model.start_decoding(src[rows, :n]), tgt[rows])
    err = largest_difference(cached, full, "cached logits, one source length at a time,", PADDING_HINT)
    return f"source lengths {', '.join(map(str, SOURCE_LENGTHS))}; max difference {err:.1e}"


def beam_reorder(model, src, tgt) -> str:
    """The cache's reorder, as decoding.beam_search calls it: every sentence's BEAM hypotheses
    share its encoding (or prefilled source) by `reorder(rows)`; after a few steps `reorder(parent)`
    keeps the surviving hypotheses, some twice, some from another hypothesis of the sentence. The
    steps before and after it equal the full pass over the tokens each kept hypothesis was fed."""
    model.eval()
    if isinstance(unwrapped(model), EncoderDecoder):
        src = pad_sources(src, model.cfg.pad_id)  # the memory's key mask is reordered too
    batch, fed, steps = src.shape[0], 3, tgt.shape[1]
    rows = torch.arange(batch).repeat_interleave(BEAM)  # beam_search: start_decoding, then reorder(rows)
    hypotheses = random_tokens(batch * BEAM, steps, seed=3)  # each hypothesis's own tokens, diverging from the first
    parent = torch.arange(batch * BEAM).view(batch, BEAM).flip(1).flatten()  # every hypothesis from another
    parent[0] = parent[1]  # and sentence 0 keeps one hypothesis twice
    with torch.no_grad():
        cache = model.start_decoding(src)
        cache.reorder(rows)
        kept = torch.cat([hypotheses[parent, :fed], hypotheses[:, fed:]], 1)
        try:
            before = decode_in_chunks(model, cache, hypotheses[:, :fed], bounds=(2,))  # the prefix at once, then a step
            cache.reorder(parent)  # beam_search: cache.reorder(parent) before every next step
            after = decode_in_chunks(model, cache, kept[:, fed:], bounds=(1,))
        except Exception as err:  # a state kept outside the cache no longer fits the reordered rows
            where = traceback.extract_tb(err.__traceback__)[-1]
            raise AssertionError(f"decoding after cache.reorder raised {type(err).__name__}: {err} "
                                 f"({where.filename}:{where.lineno}); {REORDER_HINT}") from err
        full = model(src[rows][parent], kept)
    err = largest_difference(before[parent], full[:, :fed], "before the reorder, cached logits", PLACEMENT)
    err = max(err, largest_difference(after, full[:, fed:], "after the reorder, cached logits", REORDER_HINT))
    return f"{BEAM} hypotheses per sentence, reordered after {fed} tokens; max difference {err:.1e}"
