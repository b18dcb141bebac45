"""Abacus embeddings and position coupling (core/positions/digits.py): each digit's place read from
the token ids, against a plain-Python reference on hand-written sums; cached decoding on the paths
that feed a source whole; the random training offset; and the formats they refuse."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from relpos_lab.api import ConfigError
from relpos_lab.api.testing import check_scheme, tiny_model_config
from relpos_lab.core.positions import AbacusConfig, PositionCouplingConfig
from relpos_lab.core.positions.digits import AbacusEmbedding, PositionCouplingEmbedding, digit_places
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import EncoderDecoder
from relpos_lab_tasks.addition import AdditionConfig, AdditionTask

DIGITS = torch.arange(4, 14)  # "0"-"9" after Vocabulary's four specials, as in the addition task
PLUS, BOS, PAD = 14, 1, 0


def ids(text: str) -> list[int]:
    """'123+4567' -> token ids; 'S' is the BOS (the separator), '_' padding."""
    return [{"+": PLUS, "S": BOS, "_": PAD}[c] if not c.isdigit() else 4 + int(c) for c in text]


def reference(text: str) -> tuple[list[int | None], list[int | None]]:
    """Per token: the digit's index from its number's first digit, and its significance (None for
    non-digits), by reading the string: numbers before 'S' end with their units digit, after it
    they start with it."""
    written, significance, seen_separator = [], [], False
    runs, i = [], 0
    while i < len(text):
        if text[i].isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    run_of = {k: (a, b) for a, b in runs for k in range(a, b)}
    for k, c in enumerate(text):
        seen_separator |= c == "S"
        if k not in run_of:
            written.append(None)
            significance.append(None)
            continue
        a, b = run_of[k]
        written.append(k - a)
        significance.append(k - a if seen_separator else b - 1 - k)
    return written, significance


HAND_WRITTEN = ["123+4567", "9+9", "S0964", "S1", "5+12S71", "12+345S753__", "+S+"]


@pytest.mark.parametrize("text", HAND_WRITTEN)
def test_digit_places_match_the_reference_read_from_the_string(text):
    is_digit, written, significance = digit_places(torch.tensor([ids(text)]), DIGITS, BOS)
    want_written, want_significance = reference(text)
    assert is_digit[0].tolist() == [w is not None for w in want_written]
    assert [w if d else None for w, d in zip(written[0].tolist(), is_digit[0].tolist())] == want_written
    assert [s if d else None for s, d in zip(significance[0].tolist(), is_digit[0].tolist())] == want_significance


def test_123_plus_4567_and_its_reversed_sum_by_hand():
    _, _, sig = digit_places(torch.tensor([ids("123+4567")]), DIGITS, BOS)
    assert sig[0].tolist()[:3] == [2, 1, 0] and sig[0].tolist()[4:] == [3, 2, 1, 0]
    coupling = PositionCouplingEmbedding(8, PositionCouplingConfig(), DIGITS).eval()
    assert coupling.index(torch.tensor([ids("123+4567")])).tolist() == [[3, 2, 1, 0, 4, 3, 2, 1]]
    assert coupling.index(torch.tensor([ids("S0964")])).tolist() == [[0, 1, 2, 3, 4]]  # 4690 reversed
    abacus = AbacusEmbedding(8, AbacusConfig(), DIGITS).eval()
    assert abacus.index(torch.tensor([ids("123+4567")])).tolist() == [[1, 2, 3, 0, 1, 2, 3, 4]]
    by_place = AbacusEmbedding(8, AbacusConfig(order="significance"), DIGITS).eval()
    assert by_place.index(torch.tensor([ids("123+4567")])).tolist() == [[3, 2, 1, 0, 4, 3, 2, 1]]


def test_random_sequences_match_the_reference():
    gen = torch.Generator().manual_seed(0)
    alphabet = "0123456789+S_"
    for _ in range(50):
        text = "".join(alphabet[i] for i in torch.randint(0, len(alphabet), (12,), generator=gen))
        is_digit, written, sig = digit_places(torch.tensor([ids(text)]), DIGITS, BOS)
        want_written, want_sig = reference(text)
        rows = zip(written[0].tolist(), sig[0].tolist(), is_digit[0].tolist())
        got = [(w, s) if d else (None, None) for w, s, d in rows]
        assert got == list(zip(want_written, want_sig)), text


# --- both model families, float64 ----------------------------------------------------------------


def model_config(positions, architecture):
    return tiny_model_config(positions, architecture, vocab=15)


SCHEMES = {"abacus": AbacusConfig(max_offset=3, max_len=16), "abacus_significance":
           AbacusConfig(order="significance", max_offset=3, max_len=16),
           "position_coupling": PositionCouplingConfig(max_position=16)}


def sums():
    """Sources '123+4567' and '98+7' (padded), targets '<s>' + the reversed sums."""
    src = torch.tensor([ids("123+4567"), ids("98+7____")])
    tgt_in = torch.tensor([ids("S0964"), ids("S501_")])
    return src, tgt_in


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_cached_encoder_decoder_decoding_equals_the_full_pass(scheme):
    torch.manual_seed(0)
    model = EncoderDecoder(model_config(SCHEMES[scheme], "encoder_decoder")).double().eval()
    src, tgt_in = sums()
    with torch.no_grad():
        full = model(src, tgt_in)
        cache = model.start_decoding(src)
        steps = torch.cat([model.decode_step(tgt_in[:, a:b], cache) for a, b in ((0, 2), (2, 3), (3, 5))], 1)
    torch.testing.assert_close(steps, full, atol=1e-9, rtol=0)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_cached_prefix_lm_decoding_equals_the_full_pass(scheme):
    """PrefixLM prefills the source whole, then steps through the target: each row as it decodes."""
    torch.manual_seed(0)
    model = PrefixLM(model_config(SCHEMES[scheme], "decoder_only")).double().eval()
    src, tgt_in = sums()
    with torch.no_grad():
        full = model(src, tgt_in)
        for row in range(2):
            n = int((src[row] != PAD).sum())
            cache = model.start_decoding(src[row:row + 1, :n])
            chunks = ((0, 1), (1, 3), (3, 5))
            steps = torch.cat([model.decode_step(tgt_in[row:row + 1, a:b], cache) for a, b in chunks], 1)
            torch.testing.assert_close(steps, full[row:row + 1], atol=1e-9, rtol=0)


def test_beam_search_reorders_the_token_history_with_the_keys():
    model = PrefixLM(model_config(SCHEMES["position_coupling"], "decoder_only")).eval()
    cache = model.start_decoding(torch.tensor([ids("12+3"), ids("45+6")]))
    cache.reorder(torch.tensor([1, 1]))
    assert cache.tokens.tolist() == [ids("45+6")] * 2


@pytest.mark.parametrize("scheme", ["abacus", "position_coupling"])
def test_the_conformance_kit_passes(scheme):
    """Shapes, gradients reaching the tables, training, in both families; position coupling's
    decoding check is declared not applicable (supports_cache=False), abacus's runs."""
    report = check_scheme(scheme)
    report.raise_on_failure()
    decoding = [c.detail for c in report.checks if "cached decoding" in c.name]
    assert all(("not checked" in d) == (scheme == "position_coupling") for d in decoding)


@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_gradients_reach_the_digit_table_from_both_sides(scheme):
    model = EncoderDecoder(model_config(SCHEMES[scheme], "encoder_decoder")).train()
    src, tgt_in = sums()
    model(src, tgt_in).square().mean().backward()
    for embed in (model.encoder.embed, model.decoder.embed):
        grad = embed.absolute.embedding.weight.grad
        assert grad is not None and grad.abs().sum() > 0


# --- the random offset ---------------------------------------------------------------------------


def test_abacus_shifts_every_digit_by_one_k_per_batch_in_training_only():
    module = AbacusEmbedding(8, AbacusConfig(max_offset=100), DIGITS)
    batch = torch.tensor([ids("123+4567"), ids("9+12____")])
    plain = module.eval().index(batch)
    module.train()
    torch.manual_seed(0)
    shifts = set()
    for _ in range(200):
        shifted = module.index(batch)
        k = shifted - plain
        digit = plain > 0
        assert (k[~digit] == 0).all() and (k[digit] == k[digit][0]).all()  # one k for the batch, digits only
        shifts.add(int(k[digit][0]))
    assert min(shifts) == 0 and max(shifts) == 100 and len(shifts) > 80  # uniform over [0, k]
    assert torch.equal(module.eval().index(batch), plain)


def test_coupling_draws_a_start_per_example_that_keeps_its_ids_in_the_table():
    module = PositionCouplingEmbedding(8, PositionCouplingConfig(max_position=12), DIGITS)
    batch = torch.tensor([ids("123+4567"), ids("9+12____")])
    plain = module.eval().index(batch)
    assert plain.tolist() == [[3, 2, 1, 0, 4, 3, 2, 1], [1, 0, 2, 1, 0, 0, 0, 0]]
    module.train()
    torch.manual_seed(0)
    starts = {0: set(), 1: set()}
    for _ in range(300):
        shifted = module.index(batch)
        k = shifted - plain
        for row in range(2):
            assert (k[row] == k[row, 0]).all()  # one start for the whole example, '+' included
            starts[row].add(int(k[row, 0]))
        assert shifted.max() < 12
    assert starts[0] == set(range(12 - 4)) and starts[1] == set(range(12 - 2))  # every start below the top


def test_the_model_trains_with_the_offset_and_evaluates_without_it():
    torch.manual_seed(0)
    model = EncoderDecoder(model_config(SCHEMES["abacus"], "encoder_decoder"))
    src, tgt_in = sums()
    model.eval()
    assert torch.equal(model(src, tgt_in), model(src, tgt_in))
    model.train()
    outs = {tuple(model(src, tgt_in)[0, 0, :3].tolist()) for _ in range(10)}
    assert len(outs) > 1


# --- errors --------------------------------------------------------------------------------------


def test_a_digit_beyond_the_table_names_the_field_to_raise():
    module = PositionCouplingEmbedding(8, PositionCouplingConfig(max_position=4), DIGITS).eval()
    with pytest.raises(ValueError, match=r"beyond model.positions.max_position=4; raise it"):
        module(torch.zeros(1, 8, 8), 0, torch.tensor([ids("123+4567")]))
    with pytest.raises(ValueError, match="max_len=1024 must exceed max_offset"):
        AbacusConfig(max_offset=1023).validate()
    with pytest.raises(ValueError, match="order='place'; choose one of written, significance"):
        AbacusConfig(order="place").validate()


def addition(**fields):
    return AdditionTask(AdditionConfig(name="addition", train_lengths=[1, 3], train_size=10, **fields), seed=0)


def test_the_addition_task_hands_its_digit_ids_to_the_scheme():
    task = addition(reversed_output=True)
    cfg = dataclasses.replace(tiny_model_config(PositionCouplingConfig(), "decoder_only"), src_vocab_size=0,
                              tgt_vocab_size=0)
    model = task.build_model(cfg)
    want = [task.vocab.index[str(d)] for d in range(10)]
    assert model.cfg.positions.digit_ids == want
    assert model.decoder.embed.absolute.digits.tolist() == want


@pytest.mark.parametrize("positions", [PositionCouplingConfig(), AbacusConfig(order="significance")])
def test_a_sum_written_most_significant_digit_first_is_refused_naming_the_fix(positions):
    cfg = dataclasses.replace(tiny_model_config(positions), src_vocab_size=0, tgt_vocab_size=0)
    with pytest.raises(ConfigError, match="set task.reversed_output=true"):
        addition(reversed_output=False).build_model(cfg)
    addition(reversed_output=True).build_model(cfg)


def test_abacus_as_written_takes_any_order_and_index_hints_are_refused():
    cfg = dataclasses.replace(tiny_model_config(AbacusConfig()), src_vocab_size=0, tgt_vocab_size=0)
    addition(reversed_output=False).build_model(cfg)
    with pytest.raises(ConfigError, match="set task.index_hints=false"):
        addition(reversed_output=True, index_hints=True, max_digits=8).build_model(cfg)


def test_a_vocabulary_without_digits_is_a_config_error():
    from relpos_lab_tasks.synthetic import ReverseTask, SyntheticConfig

    task = ReverseTask(SyntheticConfig(name="reverse", alphabet_size=2), seed=0)  # symbols "0", "1"
    cfg = dataclasses.replace(tiny_model_config(PositionCouplingConfig()), src_vocab_size=0, tgt_vocab_size=0)
    with pytest.raises(ConfigError, match="vocabulary has no symbol '2'"):
        task.build_model(cfg)



def test_a_decoder_only_model_over_two_vocabularies_is_refused():
    """PrefixLM shifts the target's ids past the source's when the vocabularies differ."""
    from relpos_lab.api import Vocabulary

    class TwoVocabularies(AdditionTask):
        @property
        def tgt_vocab(self):
            return Vocabulary([*(str(d) for d in range(10)), "+", "="])

    task = TwoVocabularies(AdditionConfig(name="addition", reversed_output=True), seed=0)
    cfg = dataclasses.replace(tiny_model_config(PositionCouplingConfig(), "decoder_only"), src_vocab_size=0,
                              tgt_vocab_size=0)
    with pytest.raises(ConfigError, match="use model.architecture=encoder_decoder"):
        task.build_model(cfg)
    task.build_model(dataclasses.replace(cfg, architecture="encoder_decoder"))
