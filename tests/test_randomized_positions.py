"""Randomized positions (Ruoss et al., 2023): every scheme sees exactly the drawn positions in
training; evaluation is the plain model, or with randomize_at_eval draws too, reproducibly, and
cached decoding equals a full pass at the drawn positions."""
import math

import pytest
import torch

from relpos_lab.core.decoding import beam_search, greedy_search, sample
from relpos_lab.core.embedding import positions_in_order, seed_eval_positions
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.positions import (
    BUILTIN,
    RotaryPositions,
    ShawConfig,
    ShawPositions,
    builtin_config,
    position_scheme_of,
)
from relpos_lab.core.positions.randomized import frame_slots, sample_positions, spread_mask
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig, MultiHeadAttention

from tests.test_positions import attend_with_loop

SCHEMES_WITH_POSITIONS = tuple(s for s in BUILTIN if s != "none" and not BUILTIN[s].positions_from_content)


def config(scheme="shaw", **kw):
    fields = {"max_distance": 2} if scheme == "shaw" else {}
    fields.update(kw.pop("positions", {}))
    base = dict(src_vocab_size=11, tgt_vocab_size=11, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                n_decoder_layers=2, dropout=0.0, attention_dropout=0.0, positions=builtin_config(scheme, **fields))
    return ModelConfig(**{**base, **kw})


def test_sampled_positions_are_an_increasing_subset_of_the_range():
    torch.manual_seed(0)
    for _ in range(20):
        p = sample_positions(7, 12)
        assert p.numel() == 7 and (p.diff() > 0).all() and 0 <= p.min() and p.max() < 12
    assert sample_positions(5, 5).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="6 tokens does not fit model.positions.max_random_len=5"):
        sample_positions(6, 5)


@pytest.mark.parametrize("scheme", tuple(BUILTIN))
@pytest.mark.parametrize("causal", [False, True])
def test_positions_0_to_L_minus_1_are_the_plain_layer(scheme, causal):
    """The spread-and-mask path at positions 0..L-1 computes what the layer computes without it,
    padding included: the path adds nothing of its own."""
    torch.manual_seed(0)
    cfg = config(scheme)
    relative = position_scheme_of(cfg.positions).attention(cfg.head_dim, cfg.n_heads, causal)
    layer = MultiHeadAttention(cfg, relative).double()
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)[:, None, None, :]
    want = layer(x, attn_mask=mask, is_causal=causal)
    got = layer(x, attn_mask=mask, is_causal=causal, positions=torch.arange(6))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheme", SCHEMES_WITH_POSITIONS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_at_positions_is_the_layer_on_the_spread_sequence(scheme, causal):
    """Attention runs over the real tokens only (O(L²)); the definition is the plain layer on a
    sequence of positions[-1] + 1 slots whose gaps are masked out: the same values and gradients."""
    torch.manual_seed(0)
    cfg = config(scheme)
    relative = position_scheme_of(cfg.positions).attention(cfg.head_dim, cfg.n_heads, causal)
    layer = MultiHeadAttention(cfg, relative).double()
    p = torch.tensor([1, 2, 6, 7, 13, 20])
    x = torch.randn(3, 6, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 2 + [0] * 4], dtype=torch.bool)[:, None, None, :]
    spread_x = torch.zeros(3, 21, 16, dtype=torch.float64).index_copy(1, p, x)
    want = layer(spread_x, attn_mask=spread_mask(mask, causal, p))[:, p]
    got = layer(x, attn_mask=mask, is_causal=causal, positions=p)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, x, grad)[0], torch.autograd.grad(want, x, grad)[0],
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_shaw_at_random_positions_clips_their_differences(causal):
    """e_ij = q_i·(k_j + a^K_clip(p_j - p_i)) / sqrt(D), z_i = Σ_j α_ij (v_j + a^V_clip(p_j - p_i)): the
    paper's equations with the drawn positions p in place of the indices."""
    torch.manual_seed(0)
    H, D, k = 2, 4, 3
    rel = ShawPositions(ShawConfig(max_distance=k), D, H).double()
    p = torch.tensor([0, 2, 3, 7, 11])
    q = key = v = torch.randn(1, H, 5, D, dtype=torch.float64)  # identity projections below: one x is q, k and v

    def clip(i, j):
        return max(-k, min(k, int(p[j] - p[i]))) + k

    want = []
    for h in range(H):
        for i in range(5):
            keys = [j for j in range(5) if not causal or j <= i]
            logits = torch.stack([q[0, h, i] @ (key[0, h, j] + rel.rel_k[clip(i, j)]) / math.sqrt(D) for j in keys])
            want.append(sum(a * (v[0, h, j] + rel.rel_v[clip(i, j)]) for a, j in zip(logits.softmax(-1), keys)))
    want = torch.stack(want).view(1, H, 5, D)

    layer = MultiHeadAttention(config("shaw", n_heads=H, d_model=H * D, positions={"max_distance": k}), rel).double()
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):  # identity projections: q, k, v as given
        torch.nn.init.eye_(proj.weight), torch.nn.init.zeros_(proj.bias)
    merge = lambda t: t.transpose(1, 2).flatten(2)  # noqa: E731
    got = layer(merge(q), is_causal=causal, positions=p)
    torch.testing.assert_close(got, merge(want), rtol=1e-10, atol=1e-10)


def test_rope_at_random_positions_rotates_each_token_by_its_drawn_position():
    torch.manual_seed(0)
    rope = RotaryPositions(4, 10000.0).double()
    p = torch.tensor([1, 4, 5, 9])
    cfg = config("rope", d_model=8, n_heads=2)
    layer = MultiHeadAttention(cfg, rope).double()
    for proj in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
        torch.nn.init.eye_(proj.weight), torch.nn.init.zeros_(proj.bias)
    q = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    rotated = torch.cat([rope._rotate_at(q[:, :, i:i + 1], int(p[i])) for i in range(4)], dim=2)

    def bias_free(b, h, i, j):
        return 0.0

    want = attend_with_loop(rotated, rotated, q, bias_free, causal=True, offset=0)
    got = layer(q.transpose(1, 2).flatten(2), is_causal=True, positions=p)
    torch.testing.assert_close(got, want.transpose(1, 2).flatten(2), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scheme", ["sinusoidal", "learned"])
def test_absolute_encodings_are_taken_at_the_drawn_positions(scheme):
    torch.manual_seed(0)
    model = EncoderDecoder(config(scheme, positions={"max_random_len": 40})).double()
    embed = model.encoder.embed
    p = torch.tensor([3, 8, 30])
    x = torch.zeros(1, 40, 16, dtype=torch.float64)
    table = embed.absolute(x, 0)[0]
    ids = torch.tensor([[0, 0, 0]])  # padding id: zero token embedding, so only positions remain
    torch.testing.assert_close(embed.eval()(ids, positions=p)[0], table[p])


@pytest.mark.parametrize("scheme", SCHEMES_WITH_POSITIONS)
def test_training_draws_new_positions_and_evaluation_is_the_plain_model(scheme):
    torch.manual_seed(0)
    randomized = EncoderDecoder(config(scheme, positions={"max_random_len": 64}))
    plain = EncoderDecoder(config(scheme))
    plain.load_state_dict(randomized.state_dict())
    src, tgt = torch.randint(1, 11, (2, 9)), torch.randint(1, 11, (2, 7))
    torch.testing.assert_close(randomized.eval()(src, tgt), plain.eval()(src, tgt), rtol=0, atol=0)
    randomized.train()
    first, second = randomized(src, tgt), randomized(src, tgt)
    assert not torch.allclose(first, second), "two training passes drew the same positions"
    first.sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in randomized.parameters())


def test_a_row_of_a_padded_training_batch_draws_its_positions_as_it_would_alone():
    """A row of 3 tokens in a batch 12 wide takes 3 random slots of the batch's draw of 12 positions
    from [0, 64): its positions then have the law of 3 drawn alone (the k-th at k(M + 1)/(n + 1) − 1
    on average: 15.25, 31.5, 47.75), where the first 3 of the 12 (before the frame) averaged 4, 9, 14.
    A full row keeps its slots."""
    torch.manual_seed(0)
    lengths = torch.tensor([3, 12] * 3000)
    slots = frame_slots(lengths, 12)
    assert torch.equal(slots.sort(-1).values, torch.arange(12).expand(len(lengths), -1))  # a permutation
    assert torch.equal(slots[1::2], torch.arange(12).expand(3000, -1))
    assert bool((slots[::2, :3].diff(dim=-1) > 0).all())  # the row's tokens in order
    drawn = torch.stack([sample_positions(12, 64) for _ in range(3000)])
    framed = drawn.gather(1, slots[::2, :3]).double()
    alone = torch.stack([sample_positions(3, 64) for _ in range(3000)]).double()
    expected = torch.tensor([15.25, 31.5, 47.75], dtype=torch.float64)
    torch.testing.assert_close(framed.mean(0), expected, atol=0.8, rtol=0)
    torch.testing.assert_close(alone.mean(0), expected, atol=0.8, rtol=0)
    torch.testing.assert_close(framed.std(0), alone.std(0), atol=0.8, rtol=0)


class Replay:
    """Records a training pass's frames and drawn positions, then replays them for one row alone:
    its frame the identity, its positions the ones its slots took in the batch."""

    def __init__(self, model, monkeypatch):
        import relpos_lab.core.transformer as transformer

        self.log, self.row, self.replaying = [], None, False
        real_frame = transformer.frame_slots

        def frame(lengths, width):
            if not self.replaying:
                self.log.append(("frame", real_frame(lengths, width)))
                return self.log[-1][1]
            kind, self.slots = self.log[self.cursor]
            self.cursor += 1
            return torch.arange(width)[None, :].expand(len(lengths), -1)

        monkeypatch.setattr(transformer, "frame_slots", frame)
        for embed in {m for m in model.modules() if hasattr(m, "random_positions")}:
            def positions(n, draws=None, real=embed.random_positions):
                if not self.replaying:
                    self.log.append(("positions", real(n, draws)))
                    return self.log[-1][1]
                kind, drawn = self.log[self.cursor]
                self.cursor += 1
                return drawn[self.slots[self.row, :n]]
            embed.random_positions = positions

    def alone(self, row: int):
        self.row, self.replaying, self.cursor = row, True, 0
        return self


FAMILIES = ["encoder_decoder", "encoder_only", "prefix_lm", "prefix_lm_bidirectional", "decoder_lm"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("scheme", ["shaw", "rope", "learned", "alibi"])
def test_each_row_of_a_padded_training_batch_computes_what_it_computes_alone_at_its_positions(
        scheme, family, monkeypatch):
    """In training, each row of a right-padded batch of mixed lengths gives exactly the logits of
    that row alone at the positions it drew (the frame moves tokens, never changes what they see)."""
    torch.manual_seed(0)
    fields = {"max_random_len": 40, "redraw_per_layer": family == "encoder_only" and scheme == "rope"}
    architecture = {"encoder_only": "encoder_only", "prefix_lm": "decoder_only",
                    "prefix_lm_bidirectional": "decoder_only", "decoder_lm": "decoder_only"}.get(family,
                                                                                                 "encoder_decoder")
    cfg = config(scheme, architecture=architecture, positions=fields,
                 bidirectional_prefix=family == "prefix_lm_bidirectional")
    model = {"encoder_decoder": EncoderDecoder, "encoder_only": EncoderOnly, "prefix_lm": PrefixLM,
             "prefix_lm_bidirectional": PrefixLM, "decoder_lm": DecoderLM}[family](cfg).double().train()
    src, tgt = torch.randint(3, 11, (3, 7)), torch.randint(3, 11, (3, 6))
    src_lengths, tgt_lengths = [7, 2, 4], [3, 6, 1]
    for i in range(3):
        src[i, src_lengths[i]:] = 0
        tgt[i, tgt_lengths[i]:] = 0

    def run(rows, s, t):
        if family == "encoder_only":
            return model(src[rows, :s], torch.tensor([tgt_lengths[r] for r in rows]), t)
        if family == "decoder_lm":
            return model(src[rows, :s])
        return model(src[rows, :s], tgt[rows, :t])

    replay = Replay(model, monkeypatch)
    batch = run([0, 1, 2], 7, 6)
    assert any(kind == "frame" for kind, _ in replay.log)
    for i in range(3):
        replay.alone(i)
        alone = run([i], src_lengths[i], tgt_lengths[i])
        n = src_lengths[i] if family == "decoder_lm" else tgt_lengths[i]
        torch.testing.assert_close(batch[i, :n], alone[0, :n], rtol=1e-10, atol=1e-10, msg=f"row {i}")


def test_a_row_of_a_padded_training_batch_draws_its_distances_as_it_would_alone():
    """random_distances: a row of 3 tokens in a batch 12 wide takes 2 of the 11 drawn right-hand
    distances, so they have the law of 2 drawn alone from [1, 64) (on average 1 + k·63/3 − 1: 21, 42),
    mirrored to the left; a full row takes all 11."""
    from relpos_lab.core.embedding import Embedding

    torch.manual_seed(0)
    embed = Embedding(11, 8, builtin_config("alibi", max_random_len=64, random_distances=True)).train()
    rows = torch.stack([embed.random_distances_of(12, lengths=torch.tensor([3, 12])) for _ in range(3000)])
    short, full = rows[:, 0], rows[:, 1]
    assert torch.equal(short, -short.flip(-1)) and torch.equal(full, -full.flip(-1))  # odd in the offset
    assert bool((full.diff(dim=-1) > 0).all()) and bool((short[:, 12:14].diff(dim=-1) > 0).all())
    alone = torch.stack([embed.random_distances_of(3, lengths=torch.tensor([3]))[0] for _ in range(3000)])
    torch.testing.assert_close(short[:, 12:14].double().mean(0), torch.tensor([21.0, 42.0], dtype=torch.float64),
                               atol=0.8, rtol=0)
    torch.testing.assert_close(short[:, 12:14].double().std(0), alone[:, 3:].double().std(0), atol=0.8, rtol=0)


@pytest.mark.parametrize("scheme", ["alibi", "transformer_xl"])
def test_each_row_of_a_padded_training_batch_computes_what_it_computes_alone_at_its_distances(scheme):
    """Each row of a padded training batch, with its own (B, 2L − 1) distances, gives the logits of
    that row alone at those distances, taken the (2L − 1,) way the goldens check."""
    torch.manual_seed(0)
    model = EncoderOnly(config(scheme, architecture="encoder_only",
                               positions={"max_random_len": 40, "random_distances": True})).double().train()
    embed = model.encoder.embed
    src = torch.randint(3, 11, (3, 7))
    src_lengths, slots = [7, 2, 4], torch.tensor([3, 6, 1])
    for i in range(3):
        src[i, src_lengths[i]:] = 0
    drawn, real = [], embed.random_distances_of

    def record(n, draws=None, lengths=None):
        drawn.append(real(n, draws, lengths))
        return drawn[-1]

    embed.random_distances_of = record
    batch = model(src, slots, 6)
    assert all(d.shape == (3, 2 * 13 - 1) for d in drawn) and len(drawn) == 2  # a draw per layer, per row
    for i in range(3):
        layers = iter(drawn)
        embed.random_distances_of = lambda m, draws=None, lengths=None: (  # one row's, as the batch-wide path takes
            lambda right: torch.cat((-right.flip(0), right.new_zeros(1), right)))(next(layers)[i, 13:13 + m - 1])
        alone = model(src[i:i + 1, :src_lengths[i]], slots[i:i + 1], int(slots[i]))
        torch.testing.assert_close(batch[i, :int(slots[i])], alone[0], rtol=1e-10, atol=1e-10, msg=f"row {i}")


def test_invalid_randomization_is_a_clear_error():
    with pytest.raises(ValueError, match="max_random_len=0 must be >= 1"):
        config("rope", positions={"max_random_len": 0}).validate()
    with pytest.raises(ValueError, match="scheme 'none' has none"):
        config("none", positions={"max_random_len": 64}).validate()
    with pytest.raises(ValueError, match="'fox' counts its positions from the tokens alone"):
        config("fox", positions={"max_random_len": 64}).validate()
    model = EncoderDecoder(config("rope", positions={"max_random_len": 8})).train()
    with pytest.raises(ValueError, match="12 tokens does not fit model.positions.max_random_len=8"):
        model(torch.randint(1, 11, (1, 12)), torch.randint(1, 11, (1, 3)))


# --- randomize_at_eval: Ruoss et al.'s protocol, positions drawn at evaluation and decoding too ---

RUOSS = {"max_random_len": 40, "randomize_at_eval": True}
NEVER = 99  # an EOS id the model cannot predict: every row decodes the whole budget


def test_positions_drawn_at_evaluation_are_sorted_unique_and_in_range():
    model = EncoderDecoder(config("rope", positions=RUOSS)).eval()
    for embed in (model.encoder.embed, model.decoder.embed):
        for _ in range(20):
            p = embed.random_positions(9)
            assert p.numel() == 9 and (p.diff() > 0).all() and 0 <= p.min() and p.max() < 40
    drawn = model.start_decoding(torch.randint(1, 11, (2, 5)), max_tokens=12).positions
    assert drawn.numel() == 12 and (drawn.diff() > 0).all() and 0 <= drawn.min() and drawn.max() < 40


@pytest.mark.parametrize("scheme", SCHEMES_WITH_POSITIONS)
def test_evaluation_draws_positions_per_seed_and_length_and_repeats(scheme):
    """At evaluation a sequence's draw depends on the run's seed and its own length alone: every pass
    repeats it (and batch invariance holds: tests/test_batch_invariance.py), another seed moves it,
    and it is not 0..L-1."""
    torch.manual_seed(0)
    model = EncoderDecoder(config(scheme, positions=RUOSS)).eval()
    src, tgt = torch.randint(1, 11, (2, 9)), torch.randint(1, 11, (2, 7))
    seed_eval_positions(model, 3)
    first = model(src, tgt)
    torch.testing.assert_close(model(src, tgt), first, rtol=0, atol=0)
    seed_eval_positions(model, 4)
    assert not torch.allclose(model(src, tgt), first), "another seed drew the same positions"
    with positions_in_order(model):
        assert not torch.allclose(model(src, tgt), first), "the draw placed the tokens at 0..L-1"


def test_positions_in_order_evaluate_at_0_to_L_minus_1_within_the_block():
    torch.manual_seed(0)
    ruoss = EncoderDecoder(config("rope", positions=RUOSS)).eval()
    plain = EncoderDecoder(config("rope"))
    plain.load_state_dict(ruoss.state_dict())
    src, tgt = torch.randint(1, 11, (2, 9)), torch.randint(1, 11, (2, 7))
    with positions_in_order(ruoss):
        torch.testing.assert_close(ruoss(src, tgt), plain.eval()(src, tgt), rtol=0, atol=0)
    assert not torch.allclose(ruoss(src, tgt), plain(src, tgt))


def test_randomize_at_eval_leaves_training_as_it_was():
    torch.manual_seed(0)
    ruoss = EncoderDecoder(config("rope", positions=RUOSS)).train()
    trained_only = EncoderDecoder(config("rope", positions={"max_random_len": 40}))
    trained_only.load_state_dict(ruoss.state_dict())
    src, tgt = torch.randint(1, 11, (2, 9)), torch.randint(1, 11, (2, 7))
    torch.manual_seed(1)
    want = trained_only.train()(src, tgt)
    torch.manual_seed(1)
    torch.testing.assert_close(ruoss(src, tgt), want, rtol=0, atol=0)


def steps_and_full_pass(model, src, tgt_in, split, budget):
    """Logits of tgt_in fed to the cache in chunks of `split`, and of one full pass at the
    positions the cache drew (the same seed: the same draws)."""
    seed_eval_positions(model, 5)
    cache = model.start_decoding(src, max_tokens=budget)
    starts = [0, *torch.tensor(split).cumsum(0).tolist()]
    steps = torch.cat([model.decode_step(tgt_in[:, i:i + n], cache) for i, n in zip(starts, split)], dim=1)
    if isinstance(model, PrefixLM):
        seq, n = torch.cat([src, model.joint(tgt_in)], dim=1), src.shape[1]
        mask = model._prefix_mask(torch.full((len(src),), n), seq.shape[1]) if model.bidirectional else None
        full = model.decoder(seq, self_mask=mask, causal=not model.bidirectional, positions=cache.positions)[:, n:]
    else:
        full = model.decoder(tgt_in, cache.memory, cache.memory_mask, positions=cache.positions)
    return steps, full


def bos_and(out):
    return torch.cat([torch.ones(len(out), 1, dtype=torch.long), out[:, :-1]], dim=1)


@pytest.mark.parametrize("scheme", SCHEMES_WITH_POSITIONS)
def test_cached_decoding_at_drawn_positions_equals_a_full_pass_at_them(scheme):
    """The decoder's positions are drawn once for the whole budget; step t takes the t-th: one token
    at a time and a multi-token prefill both give the full pass's logits, and greedy (and beam
    search of width 1) emits its argmax."""
    torch.manual_seed(0)
    model = EncoderDecoder(config(scheme, positions=RUOSS)).double().eval()
    src, budget = torch.randint(3, 11, (2, 6)), 8
    src[1, 4:] = 0  # padding
    tgt_in = bos_and(torch.randint(3, 11, (2, budget)))
    for split in ([1] * budget, [3, 1, 4]):
        steps, full = steps_and_full_pass(model, src, tgt_in, split, budget)
        torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)

    search = dict(bos_id=1, eos_id=NEVER, pad_id=0, max_len_a=0.0, max_len_b=budget)
    seed_eval_positions(model, 5)
    out = greedy_search(model, src, **search)
    _, full = steps_and_full_pass(model, src, bos_and(out), [budget], budget)
    assert torch.equal(full.argmax(-1)[:, :-1], out[:, :-1])
    for_beam = {**search, "eos_id": 2}
    seed_eval_positions(model, 5)
    greedy = greedy_search(model, src, **for_beam)
    seed_eval_positions(model, 5)
    assert torch.equal(beam_search(model, src, beam_size=1, **for_beam), greedy)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional_prefix"])
@pytest.mark.parametrize("scheme", ["shaw", "rope", "learned", "alibi"])
def test_cached_prefix_lm_decoding_at_drawn_positions_equals_a_full_pass_at_them(scheme, bidirectional):
    """Decoder-only: the source's and the whole output's positions are drawn when decoding starts;
    the prefill takes the source's, the steps the rest."""
    torch.manual_seed(0)
    cfg = config(scheme, architecture="decoder_only", bidirectional_prefix=bidirectional, positions=RUOSS)
    model = PrefixLM(cfg).double().eval()
    src, budget = torch.randint(3, 11, (2, 5)), 7
    steps, full = steps_and_full_pass(model, src, bos_and(torch.randint(3, 11, (2, budget))), [2] + [1] * 5, budget)
    torch.testing.assert_close(steps, full, rtol=1e-10, atol=1e-10)
    seed_eval_positions(model, 5)
    out = greedy_search(model, src, bos_id=1, eos_id=NEVER, pad_id=0, max_len_a=0.0, max_len_b=budget)
    _, full = steps_and_full_pass(model, src, bos_and(out), [budget], budget)
    assert torch.equal(full.argmax(-1)[:, :-1], out[:, :-1])


def test_cached_sampling_of_a_language_model_at_drawn_positions_equals_a_full_pass_at_them():
    torch.manual_seed(0)
    model = DecoderLM(config("shaw", positions=RUOSS)).double().eval()
    prompt, n = torch.randint(3, 11, (2, 4)), 5
    seed_eval_positions(model, 5)
    new, logits = sample(model, prompt, n, temperature=0)
    seed_eval_positions(model, 5)
    drawn = model.start_decoding(None, max_tokens=4 + n - 1).positions
    full = model.decoder(torch.cat([prompt, new[:, :-1]], dim=1), positions=drawn)
    torch.testing.assert_close(logits, full[:, 3:], rtol=1e-10, atol=1e-10)


def test_randomize_at_eval_without_its_range_or_budget_is_a_clear_error():
    with pytest.raises(ValueError, match="randomize_at_eval=true draws evaluation positions from "
                                         r"\[0, max_random_len\): set model.positions.max_random_len too"):
        config("rope", positions={"randomize_at_eval": True}).validate()
    model = EncoderDecoder(config("rope", positions=RUOSS)).eval()
    with pytest.raises(ValueError, match=r"pass start_decoding\(src, max_tokens=...\)"):
        model.start_decoding(torch.randint(1, 11, (1, 4)))
    cache = model.start_decoding(torch.randint(1, 11, (1, 4)), max_tokens=2)
    model.decode_step(torch.ones(1, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="decoding feeds more than the 2 tokens whose positions were drawn"):
        model.decode_step(torch.ones(1, 1, dtype=torch.long), cache)


class LargestTensor:
    """The most elements any tensor an op returns has, while active (forward and backward)."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self
        self.most = 0

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in out if isinstance(out, (tuple, list)) else (out,):
                    if isinstance(t, torch.Tensor):
                        outer.most = max(outer.most, t.numel())
                return out

        self.mode = Mode()


def test_transformer_xl_at_the_papers_length_is_linear_in_the_drawn_range():
    """Ruoss et al.'s L = 2048 with 40 tokens: the bias over every spread slot was (B, H, P, 2P - 1),
    about 34 GB a layer at their batch; at the tokens' own positions nothing grows with P."""
    torch.manual_seed(0)
    model = EncoderDecoder(config("transformer_xl", positions={"max_random_len": 2048})).train()
    src, tgt = torch.randint(3, 11, (2, 40)), torch.randint(3, 11, (2, 41))
    largest = LargestTensor()
    with largest.mode:
        model(src, tgt).sum().backward()
    assert largest.most <= 2 * 2 * 41 * 41, largest.most  # the (B, H, L, L) bias is the largest: nothing in P
