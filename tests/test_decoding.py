"""Greedy and beam search: budgets, EOS handling, beam 1 == greedy, and beam beats greedy."""
import math

import pytest
import torch

from relpos_lab.core.decoding import beam_search, by_source_length, gnmt_length_penalty, greedy_search
from relpos_lab.core.positions import builtin_config
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig

PAD, BOS, EOS = 0, 1, 2

def positions(scheme: str, max_distance: int = 2, **fields):
    """A built-in scheme's config; Shaw takes the clipping distance."""
    return builtin_config(scheme, **({"max_distance": max_distance} if scheme == "shaw" else {}), **fields)



def random_model(scheme="shaw", seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=16, n_heads=2, d_ff=32,
                      n_encoder_layers=1, n_decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                      positions=positions(scheme, 2))
    return EncoderDecoder(cfg).eval()


def sources():
    src = torch.randint(3, 12, (4, 6), generator=torch.Generator().manual_seed(1))
    src[2, 3:] = PAD
    return src


@pytest.mark.parametrize("scheme", ["shaw", "sinusoidal", "rope", "transformer_xl", "fire"])
def test_beam_of_one_equals_greedy(scheme):
    model, src = random_model(scheme), sources()
    greedy = greedy_search(model, src, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_a=1.0, max_len_b=3)
    beam = beam_search(model, src, beam_size=1, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_a=1.0, max_len_b=3)
    assert torch.equal(greedy, beam)


def test_output_budget_is_relative_to_each_source_length():
    model, src = random_model(), sources()
    for search in (greedy_search, beam_search):
        out = search(model, src, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_a=0.5, max_len_b=2)
        lengths = [row.tolist().index(EOS) + 1 for row in out]  # every row ends in EOS
        budget = ((src != PAD).sum(-1) * 0.5).floor().long() + 2
        assert all(n <= b for n, b in zip(lengths, budget.tolist()))
        for row, n in zip(out, lengths):
            assert (row[n:] == PAD).all()


def test_batched_beam_equals_one_sentence_at_a_time():
    model, src = random_model(seed=3), sources()
    batched = beam_search(model, src, beam_size=3, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_b=4)
    for i in range(src.shape[0]):
        row = src[i:i + 1]
        row = row[:, : int((row != PAD).sum())]
        alone = beam_search(model, row, beam_size=3, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_b=4)
        n = alone.shape[1]
        assert batched[i, :n].tolist() == alone[0].tolist()
        assert (batched[i, n:] == PAD).all()


class ScriptedCache:
    def __init__(self, batch):
        self.seq = torch.zeros(batch, 0, dtype=torch.long)

    def reorder(self, index):
        self.seq = self.seq.index_select(0, index)


class GardenPath:
    """A 5-token toy model: greedy takes A (p=.5) then faces a flat .34 EOS; B (p=.4) is
    followed by EOS with p=.99, so the best sequence is 'B EOS' (.396 > .17)."""

    A, B = 3, 4

    def start_decoding(self, src, max_tokens=None):
        return ScriptedCache(src.shape[0])

    def decode_step(self, tokens, cache):
        cache.seq = torch.cat([cache.seq, tokens], dim=1)
        probs = torch.full((cache.seq.shape[0], 5), 1e-9)
        for row, seq in enumerate(cache.seq.tolist()):
            last = seq[-1]
            if last == BOS:
                probs[row, [self.A, self.B, EOS]] = torch.tensor([0.5, 0.4, 0.1])
            elif last == self.A:
                probs[row, [self.A, self.B, EOS]] = torch.tensor([0.33, 0.33, 0.34])
            else:
                probs[row, [self.A, self.B, EOS]] = torch.tensor([0.005, 0.005, 0.99])
        return probs.log()[:, None, :]


def test_beam_finds_the_higher_scoring_sequence_greedy_misses():
    src = torch.full((2, 3), 7)
    greedy = greedy_search(GardenPath(), src, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_b=5)
    beam = beam_search(GardenPath(), src, beam_size=2, length_penalty=0.0, bos_id=BOS, eos_id=EOS,
                       pad_id=PAD, max_len_b=5)
    assert greedy[0].tolist()[:2] == [GardenPath.A, EOS]
    assert beam.tolist() == [[GardenPath.B, EOS]] * 2


def test_a_sentence_that_reaches_its_length_limit_stops_the_search():
    """Sentence 0 may emit one token (forced EOS, one finished hypothesis); sentence 1 finishes
    two hypotheses at step 2: the search ends there instead of running to sentence 1's limit."""
    calls = []

    class Counting(GardenPath):
        def decode_step(self, tokens, cache):
            calls.append(tokens.shape)
            return super().decode_step(tokens, cache)

    src = torch.tensor([[7, PAD, PAD, PAD, PAD, PAD], [7] * 6])
    out = beam_search(Counting(), src, beam_size=2, length_penalty=0.0, bos_id=BOS, eos_id=EOS, pad_id=PAD,
                      max_len_a=1.0, max_len_b=0)
    assert out.tolist() == [[EOS, PAD], [GardenPath.B, EOS]]
    assert len(calls) == 2


def test_gnmt_length_penalty():
    assert gnmt_length_penalty(torch.tensor(1), 0.6).item() == pytest.approx(1.0)
    assert gnmt_length_penalty(torch.tensor(7), 0.6).item() == pytest.approx(2 ** 0.6)
    assert gnmt_length_penalty(torch.tensor(7), 0.0).item() == 1.0


class Scripted(GardenPath):
    """Next-token probabilities looked up by the whole prefix (BOS excluded)."""

    def __init__(self, table):
        self.table = table

    def decode_step(self, tokens, cache):
        cache.seq = torch.cat([cache.seq, tokens], dim=1)
        probs = torch.full((cache.seq.shape[0], 5), 1e-9)
        for row, seq in enumerate(cache.seq.tolist()):
            for token, p in self.table.get(tuple(seq[1:]), {EOS: 1.0}).items():
                probs[row, token] = p
        return probs.log()[:, None, :]


def test_length_penalty_reranks_finished_hypotheses():
    A, B = 3, 4
    model = Scripted({(): {A: 0.6, B: 0.35, EOS: 0.05}, (A,): {EOS: 0.55, A: 0.45},
                      (B,): {A: 0.9, EOS: 0.1}, (B, A): {EOS: 0.95}, (A, A): {EOS: 0.95}})
    src = torch.full((1, 3), 7)
    kw = dict(beam_size=2, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_b=6)
    # Finished: 'A EOS' (p=.33), 'B A EOS' (p=.299), 'A A EOS' (p=.257).
    assert beam_search(model, src, length_penalty=0.0, **kw).tolist() == [[A, EOS]]
    lp2, lp3 = (gnmt_length_penalty(torch.tensor(n), 1.0).item() for n in (2, 3))
    assert math.log(0.35 * 0.9 * 0.95) / lp3 > math.log(0.6 * 0.55) / lp2
    assert beam_search(model, src, length_penalty=1.0, **kw).tolist() == [[B, A, EOS]]


def test_decoder_only_generation_continues_a_prompt():
    torch.manual_seed(0)
    cfg = ModelConfig(tgt_vocab_size=12, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=0,
                      n_decoder_layers=2, dropout=0.0, attention_dropout=0.0)
    lm = DecoderLM(cfg).eval()
    prompt = torch.tensor([[BOS, 5, 6, 7], [BOS, 8, 9, 10]])
    out = greedy_search(lm, None, prompt=prompt, bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_b=5)
    # Recompute each step from scratch: the cached prompt prefill must agree.
    seq = prompt
    for step in range(out.shape[1]):
        nxt = lm(seq)[:, -1].argmax(-1)
        live = ~(out[:, :step] == EOS).any(1)
        assert torch.equal(out[live, step], torch.where(torch.tensor(step + 1 >= 5), EOS, nxt)[live])
        seq = torch.cat([seq, out[:, step:step + 1]], dim=1)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("scheme", ["sinusoidal", "learned", "shaw", "rope", "alibi", "t5_bias"])
@pytest.mark.parametrize("beam", [1, 3])
def test_decoder_only_batched_decoding_equals_each_sentence_alone(scheme, beam, bidirectional):
    """Sources of different lengths in one batch: grouped by length, a batch decodes exactly as
    each sentence alone, and an alone sentence decodes as a from-scratch recompute (greedy)."""
    torch.manual_seed(0)
    cfg = ModelConfig(architecture="decoder_only", bidirectional_prefix=bidirectional, src_vocab_size=12,
                      tgt_vocab_size=12, d_model=16, n_heads=2, d_ff=32, n_decoder_layers=2, dropout=0.0,
                      attention_dropout=0.0, positions=positions(scheme, 2))
    model, src = PrefixLM(cfg).eval(), sources()
    src[0, 5:] = PAD  # lengths 5, 6, 3, 6
    kw = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD, max_len_a=1.0, max_len_b=3)

    def search(rows):
        return beam_search(model, rows, beam_size=beam, **kw) if beam > 1 else greedy_search(model, rows, **kw)

    batched = by_source_length(search, src, PAD)
    with pytest.raises(ValueError, match="by_source_length"):
        search(src)
    for i in range(src.shape[0]):
        row = src[i:i + 1, : int((src[i] != PAD).sum())]
        alone = search(row)
        assert batched[i, : alone.shape[1]].tolist() == alone[0].tolist()
        assert (batched[i, alone.shape[1]:] == PAD).all()
        if beam == 1:  # the cache (prefix prefill + steps) against recomputing the whole sequence
            seq = torch.tensor([[BOS]])
            for step in range(alone.shape[1]):
                with torch.no_grad():
                    nxt = model(row, seq)[:, -1].argmax(-1)
                if step + 1 < int(row.shape[1] * 1.0) + 3:
                    assert alone[0, step] == nxt[0]
                if alone[0, step] == EOS:
                    break
                seq = torch.cat([seq, alone[:, step:step + 1]], dim=1)
