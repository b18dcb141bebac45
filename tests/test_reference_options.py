"""Options that reproduce the DeepMind reference code of Delétang et al. and Ruoss et al.:
what each changes in a model, and where it is refused. Their values against the reference's own
are tests/test_golden.py's (positions_deepmind.json, training_deepmind.json)."""
from __future__ import annotations

import json

import pytest
import torch

from relpos_lab.api import ConfigError, EncoderOnly, builtin_config
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.config.load import load_config
from relpos_lab.core.attention import relative_attention
from relpos_lab.core.positions import Alibi, AlibiConfig
from relpos_lab.launch.sweep import load_sweep

from tests.test_encoder_only import create  # a built-in task by name, its config validated


def alibi(left_offset: float):
    return builtin_config("alibi", left_offset=left_offset)


def same_weights(build, *configs):
    models = []
    for cfg in configs:
        torch.manual_seed(0)
        models.append(build(cfg).double().eval())
    return models


def alibi_positions(left_offset: float):
    return Alibi(AlibiConfig(left_offset=left_offset)).attention(8, 2, causal=False)


@pytest.mark.parametrize("impl", ["naive", "gather"])
def test_alibi_left_offset_lets_bidirectional_attention_tell_left_from_right(impl):
    """With the paper's symmetric bias (and no other position signal) attention over a reversed sequence
    is the reversed attention; with the reference's 0.5·m for keys on the left it is not."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 8, dtype=torch.float64) for _ in range(3))
    for left_offset, mirrored in [(0.0, True), (0.5, False)]:
        kwargs = alibi_positions(left_offset).attention_kwargs(q, k, 0)
        kwargs["rel_bias"] = kwargs["rel_bias"].double()
        out = relative_attention(q, k, v, impl=impl, **kwargs)
        flipped = relative_attention(q.flip(2), k.flip(2), v.flip(2), impl=impl, **kwargs)
        assert torch.allclose(flipped.flip(2), out, atol=1e-12) == mirrored, left_offset


def test_count_from_end_puts_the_last_slot_at_position_one_whatever_the_length():
    positions = builtin_config("sinusoidal", count_from_end=True)
    (model,) = same_weights(EncoderOnly, tiny_model_config(positions, "encoder_only"))
    pe = positions.scheme_class(positions).embedding(16)
    short, long = pe(torch.zeros(1, 3, 16))[0], pe(torch.zeros(1, 7, 16))[0]
    assert torch.equal(short, long[-3:])  # the last three tokens sit at 3, 2, 1 either way
    ascending = builtin_config("sinusoidal").scheme_class(builtin_config("sinusoidal")).embedding(16)
    assert torch.allclose(ascending(torch.zeros(1, 4, 16))[0][1:].flip(0), short)  # 1, 2, 3 reversed
    with torch.no_grad():
        out = model(torch.tensor([[3, 4, 5]]), torch.tensor([3]))
    assert out.shape == (1, 3, 12) and torch.isfinite(out).all()


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only"])
def test_count_from_end_is_refused_where_a_decoder_writes_token_by_token(architecture):
    cfg = tiny_model_config(builtin_config("sinusoidal", count_from_end=True), architecture)
    with pytest.raises(ValueError, match="count_from_end needs each sequence whole.*encoder_only"):
        cfg.validate()


def test_count_from_end_is_refused_with_randomized_positions():
    with pytest.raises(ValueError, match="count_from_end and max_random_len do not combine"):
        builtin_config("sinusoidal", count_from_end=True, max_random_len=64).validate()


@pytest.mark.parametrize("name", ["deletang2023_paper", "ruoss2023_paper", "deletang2023_paper_small",
                                  "ruoss2023_paper_small"])
def test_the_paper_sweeps_encode_as_their_reference_code(name):
    """NNCH counts sin/cos from the end, RPE's ascends; both codes' encoder ALiBi has the left offset, and
    both drop the embeddings only where an absolute scheme adds positions to them."""
    sweep = load_sweep(name, only=0)
    cells = {}
    for point in sweep.points:
        cells.setdefault(point.labels["scheme"], point.index)
    for label, index in cells.items():
        model = sweep.config(index).model
        positions = model.positions
        if positions.scheme == "sinusoidal":
            assert positions.count_from_end is name.startswith("deletang"), label
        if positions.scheme == "alibi":
            assert positions.left_offset == 0.5, label
        absolute = positions.scheme in ("sinusoidal", "learned")
        assert model.embedding_dropout == (0.1 if absolute else 0.0), label
        # what Ruoss et al.'s code redraws in each attention layer: RoPE's positions, the others' distances
        randomized = name.startswith("ruoss") and "randomized" in label
        assert positions.redraw_per_layer is (randomized and positions.scheme == "rope"), label
        assert positions.random_distances is (randomized and positions.scheme in ("alibi", "transformer_xl")), label
    assert load_config(sweep.experiment, ["model.positions.scheme=alibi"]).model.positions.left_offset == 0


# --- the reference's model: bias-free projections, a biased head, no FFN dropout, Haiku's init -------

def reference_model(**fields):
    return tiny_model_config(builtin_config("sinusoidal"), "encoder_only", d_model=256, d_ff=1024, **fields)


def test_bias_free_attention_and_a_biased_head():
    model = EncoderOnly(reference_model(attention_bias=False, output_bias=True))
    projections = [m for name, m in model.named_modules() if name.endswith(("q_proj", "k_proj", "v_proj", "out_proj"))]
    assert len(projections) == 4 * 2 and all(p.bias is None for p in projections)
    assert model.output.bias is not None and model.output.bias.shape == (12,)
    ffn = [m for name, m in model.named_modules() if name.endswith(("fc1", "fc2"))]
    assert all(m.bias is not None for m in ffn)  # the reference's feed-forward layers keep theirs


def test_the_feed_forward_hidden_layer_has_its_own_dropout():
    for ffn_dropout, expected in [(None, 0.3), (0.0, 0.0)]:
        model = EncoderOnly(reference_model(dropout=0.3, ffn_dropout=ffn_dropout))
        hidden = [m.dropout.p for name, m in model.named_modules() if name.endswith("ffn.inner")]
        sublayer = [m.dropout.p for name, m in model.named_modules() if name.endswith(("ffn", "self_attn"))]
        assert hidden == [expected] * 2 and sublayer == [0.3] * 4  # sublayer outputs keep model.dropout


def test_haiku_init_draws_linear_weights_from_a_normal_cut_at_two_sigma():
    torch.manual_seed(0)
    haiku, pytorch = EncoderOnly(reference_model(init="haiku")), EncoderOnly(reference_model())
    for name, module in haiku.named_modules():
        if isinstance(module, torch.nn.Linear) and not name.startswith("encoder.embed"):
            w, sigma = module.weight.detach(), module.in_features ** -0.5
            assert w.abs().max() <= 2 * sigma and w.std().item() == pytest.approx(0.8796 * sigma, rel=0.05), name
            assert module.bias is None or not module.bias.any(), name
    ffn = pytorch.get_submodule("encoder.layers.0.ffn.inner.fc1").weight.detach()
    assert ffn.std().item() == pytest.approx(256 ** -0.5 / 3 ** 0.5, rel=0.05)  # PyTorch's: U(±1/√fan_in)


def test_haiku_init_starts_token_embeddings_at_sigma_0_02_and_padding_at_zero():
    torch.manual_seed(0)
    tokens = EncoderOnly(reference_model(init="haiku", src_vocab_size=400)).encoder.embed.tokens.weight.detach()
    assert not tokens[0].any()  # pad
    assert tokens.abs().max() <= 0.04 and tokens[1:].std().item() == pytest.approx(0.8796 * 0.02, rel=0.05)


def test_embedding_dropout_apart_from_the_model_dropout():
    for embedding_dropout, expected in [(None, 0.3), (0.0, 0.0)]:
        model = EncoderOnly(reference_model(dropout=0.3, embedding_dropout=embedding_dropout))
        assert model.encoder.embed.dropout.p == expected


def test_an_unknown_init_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="model.init='jax'; choose one of pytorch, haiku"):
        reference_model(init="jax").validate()


# --- the reference's loss ------------------------------------------------------------------------

def test_the_loss_on_padding_averages_over_every_slot_pad_included():
    """binary_addition's sums end early (EOS) in their n + 1 slots; the reference scores the filler after
    the end too (its zeros; our pad), with a mean over every slot of the batch (its
    `jnp.mean(jnp.sum(pointwise_loss, axis=-1))` sums over the classes only)."""
    task = create("binary_addition", loss_on_padding=True)
    torch.manual_seed(0)
    model = task.build_model(tiny_model_config(builtin_config("shaw"), "encoder_only", src_vocab_size=0,
                                               tgt_vocab_size=0)).double()
    batch = task.collate([e for e in task.dataset("valid") if len(e.src) in (7, 9)][:12])
    logits, target, n_slots = task.at_slots(model, batch)
    assert (target == task.tgt_vocab.pad_id).logical_and(torch.arange(target.shape[1]) < n_slots[:, None]).any()
    logp = logits.log_softmax(-1)
    expected = sum(-logp[row, slot, target[row, slot]] for row in range(len(target)) for slot in range(n_slots[row]))
    out = task.loss(model, batch, label_smoothing=0.0)
    assert out.loss.item() == pytest.approx(expected.item() / n_slots.sum().item(), rel=1e-6)
    assert out.n_tokens == n_slots.sum()
    mean = create("binary_addition").loss(model, batch, label_smoothing=0.0)  # our default: non-pad tokens
    assert mean.n_tokens < n_slots.sum() and mean.loss.item() != pytest.approx(out.loss.item())


def test_the_loss_on_padding_needs_the_encoder_only_model():
    task = create("reverse_string", loss_on_padding=True)
    with pytest.raises(ConfigError, match="task.loss_on_padding=true .* encoder_only"):
        task.build_model(tiny_model_config(builtin_config("shaw"), "encoder_decoder", src_vocab_size=0,
                                           tgt_vocab_size=0))


# --- randomized positions drawn per layer (Ruoss et al.'s code) ------------------------------------

def layer_positions(redraw: bool) -> list[torch.Tensor]:
    positions = builtin_config("rope", max_random_len=64, redraw_per_layer=redraw)
    model = EncoderOnly(tiny_model_config(positions, "encoder_only", n_encoder_layers=3)).train()
    seen = []
    for layer in model.encoder.layers:
        layer.register_forward_pre_hook(lambda module, args, kwargs: seen.append(kwargs["positions"]),
                                        with_kwargs=True)
    torch.manual_seed(0)
    model(torch.tensor([[3, 4, 5, 6]]), torch.tensor([4]))
    return seen


def test_each_encoder_layer_draws_its_own_positions_with_redraw_per_layer():
    shared, redrawn = layer_positions(False), layer_positions(True)
    assert len(shared) == len(redrawn) == 3 and all(torch.equal(p, shared[0]) for p in shared)
    assert not torch.equal(redrawn[1], redrawn[0]) or not torch.equal(redrawn[2], redrawn[0])
    for positions in redrawn:  # each an increasing draw of 8 of [0, 64): 4 tokens and 4 slots
        assert len(positions) == 8 and bool((positions.diff() > 0).all()) and int(positions.max()) < 64


@pytest.mark.parametrize("architecture, fields", [("encoder_only", {}), ("decoder_only", {"max_random_len": 64})])
def test_redraw_per_layer_needs_randomized_positions_in_an_encoder_only_model(architecture, fields):
    cfg = tiny_model_config(builtin_config("rope", redraw_per_layer=True, **fields), architecture)
    with pytest.raises(ValueError, match="redraw_per_layer=true .* needs model.positions.max_random_len and "
                                         "model.architecture=encoder_only"):
        cfg.validate()


# --- random_distances: Ruoss et al.'s noisy ALiBi and relative (Transformer-XL) encodings ----------


def test_sampled_distances_are_odd_increasing_and_distinct_in_the_range():
    from relpos_lab.core.positions.randomized import sample_distances

    torch.manual_seed(0)
    for _ in range(20):
        d = sample_distances(6, 40)  # offsets -5..5
        assert len(d) == 11 and int(d[5]) == 0 and torch.equal(d, -d.flip(0))
        assert bool((d.diff() > 0).all()) and 1 <= int(d[6]) and int(d[-1]) < 40
    assert sample_distances(4, 4).tolist() == [-3, -2, -1, 0, 1, 2, 3]
    with pytest.raises(ValueError, match="offsets up to 4, more than model.positions.max_random_len=4"):
        sample_distances(5, 4)


def test_noisy_alibi_is_the_references_bias_at_the_drawn_distances():
    """The reference's compute_noisy_alibi_encodings_biases (symmetric): key j of query i gets
    m_h·(−d_|j−i| + 0.5) on the left and −m_h·d_|j−i| on the right, d the sorted draw."""
    module = alibi_positions(0.5)
    right = torch.tensor([3, 7, 8, 20])  # d_1..d_4 of 5 tokens
    distances = torch.cat((-right.flip(0), torch.zeros(1, dtype=torch.long), right))
    q = k = torch.zeros(1, 2, 5, 8)
    kw = module.attention_kwargs_at_distances(q, k, distances)
    reach = kw["max_distance"]
    slopes = module.slopes
    for h in range(2):
        for i in range(5):
            for j in range(5):
                d = 0 if i == j else int(right[abs(j - i) - 1])
                want = slopes[h] * (-d + (0.5 if j < i else 0.0))
                assert float(kw["rel_bias"][h, j - i + reach]) == pytest.approx(float(want)), (h, i, j)
    plain = module.attention_kwargs(q, k, 0)
    kw = module.attention_kwargs_at_distances(q, k, torch.arange(-4, 5))  # each offset its own distance
    assert torch.equal(kw["rel_bias"], plain["rel_bias"]) and kw["max_distance"] == plain["max_distance"]


def test_noisy_transformer_xl_projects_the_encoding_of_the_drawn_distance():
    """(q_i + v)·W_R R(i − j's distance) + u·k_j, over √D: the distance of i − j is minus that of j − i."""
    from relpos_lab.core.positions import TransformerXL, TransformerXLConfig

    torch.manual_seed(0)
    module = TransformerXL(TransformerXLConfig()).attention(4, 2, causal=False).double()
    q, k = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 4, 4, dtype=torch.float64)
    right = torch.tensor([2, 5, 9])
    distances = torch.cat((-right.flip(0), torch.zeros(1, dtype=torch.long), right))
    bias = module.attention_kwargs_at_distances(q, k, distances)["attn_bias"]
    w = module.r_proj.weight.view(2, 4, 8)
    for h in range(2):
        for i in range(4):
            for j in range(4):
                d = -distances[j - i + 3].double()  # i − j's distance
                r = module.encoding(d.reshape(1))[0]  # (d_model,)
                want = ((q[0, h, i] + module.v[h]) @ (w[h] @ r) + module.u[h] @ k[0, h, j]) / 2.0
                assert float(bias[0, h, i, j]) == pytest.approx(float(want), abs=1e-12), (h, i, j)
    same = module.attention_kwargs_at_distances(q, k, torch.arange(-3, 4))["attn_bias"]
    torch.testing.assert_close(same, module.attention_kwargs(q, k, 0)["attn_bias"], rtol=1e-12, atol=1e-12)


def test_noisy_lookup_clamped_reads_where_the_references_table_ends():
    """Ruoss et al.'s table holds positions 0..M − 1: a key at drawn distance d on the left reads
    row M − d, the query and the keys on its right row M − 1 (past the end, clamped): ours at
    d − M and 1 − M (tests/test_golden.py checks it against their code, whole model)."""
    from relpos_lab.core.positions import TransformerXL, TransformerXLConfig

    torch.manual_seed(0)
    m = 40
    clamped = TransformerXL(TransformerXLConfig(max_random_len=m, random_distances=True, noisy_lookup="clamped"))
    module = clamped.attention(4, 2, causal=False).double()
    plain = TransformerXL(TransformerXLConfig()).attention(4, 2, causal=False).double()
    plain.load_state_dict(module.state_dict())
    q, k = torch.randn(1, 2, 4, 4, dtype=torch.float64), torch.randn(1, 2, 4, 4, dtype=torch.float64)
    right = torch.tensor([2, 5, 9])
    distances = torch.cat((-right.flip(0), torch.zeros(1, dtype=torch.long), right))
    read = {o: (-distances[o + 3] - m if o < 0 else 1 - m) for o in range(-3, 4)}  # by offset j − i
    # plain reads i − j's entry at offset j − i's mirror (`distances` stand for offsets -3..3)
    want = plain.attention_kwargs_at_distances(q, k, torch.tensor([read[-o] for o in range(-3, 4)]))
    torch.testing.assert_close(module.attention_kwargs_at_distances(q, k, distances)["attn_bias"],
                               want["attn_bias"], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("fields, says", [
    ({"noisy_lookup": "clampd"}, "noisy_lookup='clampd': set it to distance or clamped"),
    ({"noisy_lookup": "clamped"}, "set model.positions.random_distances=true"),
])
def test_noisy_lookup_is_refused_where_it_cannot_apply(fields, says):
    with pytest.raises(ValueError, match=says):
        tiny_model_config(builtin_config("transformer_xl", **fields), "encoder_only").validate()


@pytest.mark.parametrize("scheme", ["alibi", "transformer_xl"])
def test_random_distances_train_drawn_and_evaluate_at_the_offsets_or_reproducibly_drawn(scheme):
    from relpos_lab.core.embedding import seed_eval_positions

    src, slots = torch.tensor([[3, 4, 5, 6], [7, 8, 9, 0]]), torch.tensor([4, 3])
    plain, drawn, at_eval = same_weights(
        lambda positions: EncoderOnly(tiny_model_config(positions, "encoder_only")),
        builtin_config(scheme), builtin_config(scheme, max_random_len=64, random_distances=True),
        builtin_config(scheme, max_random_len=64, random_distances=True, randomize_at_eval=True))
    torch.testing.assert_close(drawn(src, slots, 4), plain(src, slots, 4))  # evaluation: the offsets themselves
    drawn.train()
    assert not torch.allclose(drawn(src, slots, 4), drawn(src, slots, 4))  # each pass, each layer, a draw
    outputs = []
    for _ in range(2):
        seed_eval_positions(at_eval, 5)
        outputs.append(at_eval(src, slots, 4))
    torch.testing.assert_close(outputs[0], outputs[1])
    assert not torch.allclose(outputs[0], plain(src, slots, 4))


@pytest.mark.parametrize("scheme, fields, says", [
    ("shaw", {"max_random_len": 64}, "scheme 'shaw' cannot place its offsets at other distances"),
    ("alibi", {}, "needs model.positions.max_random_len"),
    ("alibi", {"max_random_len": 64, "redraw_per_layer": True}, "replaces redraw_per_layer"),
])
def test_random_distances_is_refused_where_it_cannot_apply(scheme, fields, says):
    cfg = tiny_model_config(builtin_config(scheme, random_distances=True, **fields), "encoder_only")
    with pytest.raises(ValueError, match=says):
        cfg.validate()


def _test_loss(run_dir, tmp_path, name: str, *overrides: str) -> float:
    from relpos_lab.training.experiment import evaluate

    summary = evaluate(run_dir / "checkpoints" / "last.ckpt", overrides=list(overrides), output=tmp_path / name)
    return json.loads(summary.results.read_text())["metrics"]["test/loss"]


def test_eval_dropout_evaluates_with_dropout_on_and_repeats(tiny_reverse_run, tmp_path):
    """trainer.eval_dropout: the reference's evaluation, dropout on (a loss of its own), its masks
    seeded from the run's seed, so two evaluations of one checkpoint agree to the digit."""
    on = ("model.dropout=0.3", "trainer.eval_dropout=true")
    first = _test_loss(tiny_reverse_run, tmp_path, "on1", *on)
    assert _test_loss(tiny_reverse_run, tmp_path, "on2", *on) == first
    assert _test_loss(tiny_reverse_run, tmp_path, "off", "model.dropout=0.3") != first
    assert _test_loss(tiny_reverse_run, tmp_path, "seed", *on, "seed=7") != first


def haiku_model(positions):
    return EncoderOnly(tiny_model_config(positions, "encoder_only", d_model=64, n_heads=4, d_ff=256, init="haiku"))


def test_haiku_init_draws_a_schemes_layers_as_haiku_would():
    """model.init=haiku: learned positions as hk.Embed (σ 1, cut at 2σ: spread 0.88), Transformer-XL's
    W_R as hk.Linear (σ 1/√d); u and v keep the reference's own N(0, 0.02²)."""
    torch.manual_seed(0)
    learned = haiku_model(builtin_config("learned", max_len=512))
    table = learned.encoder.embed.absolute.embedding.weight
    assert 0.85 < table.std().item() < 0.91 and table.abs().max().item() <= 2.0
    xl = haiku_model(builtin_config("transformer_xl"))
    module = xl.encoder.layers[0].self_attn.inner.relative
    w = module.r_proj.weight
    assert 0.85 / 8 < w.std().item() < 0.91 / 8 and w.abs().max().item() <= 2 / 8
    assert 0.015 < module.u.std().item() < 0.025
