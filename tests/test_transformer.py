"""The encoder/decoder core: cached decoding equals a full pass for every scheme, and it learns."""
import inspect

import pytest
import torch
import torch.nn.functional as F

from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import BUILTIN, builtin_config
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import (
    MODEL_IMPLS,
    DecoderLayer,
    DecoderLM,
    Embedding,
    EncoderDecoder,
    EncoderLayer,
    ModelConfig,
    MultiHeadAttention,
)


def positions(scheme: str, max_distance: int = 2, **fields):
    """A built-in scheme's config; Shaw takes the clipping distance."""
    return builtin_config(scheme, **({"max_distance": max_distance} if scheme == "shaw" else {}), **fields)



def tiny(scheme="shaw", **kw):
    defaults = dict(src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=2, d_ff=32,
                    n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                    positions=positions(scheme, 2))
    defaults.update(kw)
    return ModelConfig(**defaults)


def chunks(tokens, sizes):
    out, start = [], 0
    for size in sizes:
        out.append(tokens[:, start:start + size])
        start += size
    return out


SPLITS = {"one_token_at_a_time": [1] * 9, "prefill_then_steps": [4, 1, 1, 3], "prefill_all": [9]}


def skip_without_cache(scheme: str) -> None:
    """Position coupling places a source digit by its number's end: exact only when each source
    number arrives in one call (tests/test_digit_positions.py checks the paths that do that)."""
    if scheme in BUILTIN and not BUILTIN[scheme].supports_cache:
        pytest.skip(f"{scheme} declares supports_cache=False")


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("scheme", tuple(BUILTIN) + ("shaw_per_head", "shaw_asymmetric"))
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_encoder_decoder_equals_full_pass(scheme, split, norm_first):
    skip_without_cache(scheme)
    torch.manual_seed(0)
    scheme_cfg = {"shaw_per_head": positions("shaw", 2, per_head=True),
                  "shaw_asymmetric": positions("shaw", 2, max_distance_left=1, max_distance_right=3)}.get(scheme) \
        or positions(scheme, 2)
    model = EncoderDecoder(tiny(positions=scheme_cfg, norm_first=norm_first)).eval()
    src = torch.randint(3, 13, (3, 7))
    src[1, 4:] = 0  # padding
    tgt = torch.randint(3, 13, (3, 9))
    full = model(src, tgt)
    cache = model.start_decoding(src)
    steps = torch.cat([model.decode_step(part, cache) for part in chunks(tgt, SPLITS[split])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", MODEL_IMPLS)
def test_every_model_impl_trains_and_decodes_like_auto(impl):
    """A config's attention_impl runs every attention call: self (cached), cross, with dropout."""
    torch.manual_seed(0)
    cfg = tiny(attention_impl=impl, attention_dropout=0.0 if impl == "flex" else 0.1)
    model = EncoderDecoder(cfg)
    reference = EncoderDecoder(tiny(attention_impl="auto", attention_dropout=cfg.attention_dropout))
    reference.load_state_dict(model.state_dict())
    src, tgt = torch.randint(3, 13, (3, 7)), torch.randint(3, 13, (3, 9))
    src[1, 4:] = 0
    if impl == "flex":  # torch's FlexAttention has no CPU backward: a forward in training mode
        with torch.no_grad():
            model(src, tgt)
    else:
        model(src, tgt).sum().backward()
    model.eval(), reference.eval()
    with torch.no_grad():
        full = model(src, tgt)
        torch.testing.assert_close(full, reference(src, tgt), atol=1e-5, rtol=1e-5)
        cache = model.start_decoding(src)
        steps = torch.cat([model.decode_step(part, cache) for part in chunks(tgt, [4, 1, 1, 3])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", tuple(BUILTIN))
def test_cached_decoder_only_equals_full_pass(scheme):
    skip_without_cache(scheme)
    torch.manual_seed(0)
    model = DecoderLM(tiny(scheme, n_encoder_layers=0)).eval()
    tokens = torch.randint(3, 13, (2, 10))
    full = model(tokens)
    cache = model.start_decoding()
    steps = torch.cat([model.decode_step(part, cache) for part in chunks(tokens, [5, 1, 1, 3])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", tuple(BUILTIN))
def test_cached_generation_equals_recompute(scheme):
    """`relpos-lab generate`'s sampler: a prompt prefilled, then 12 sampled tokens on the cache, draw
    the same tokens from the same logits as recomputing the whole sequence at every step."""
    skip_without_cache(scheme)
    from relpos_lab.core.decoding import sample

    torch.manual_seed(0)
    model = DecoderLM(tiny(scheme, n_encoder_layers=0)).eval()
    prompt = torch.randint(3, 13, (2, 5))
    runs = [sample(model, prompt, 12, temperature=1.0, top_k=6, generator=torch.Generator().manual_seed(1),
                   cached=cached) for cached in (True, False)]
    (tokens, logits), (tokens_full, logits_full) = runs
    torch.testing.assert_close(logits, logits_full, atol=1e-5, rtol=1e-5)
    assert torch.equal(tokens, tokens_full) and tokens.shape == (2, 12)


def prefix_lm(scheme="shaw", bidirectional=False, shared=True, **kw):
    cfg = tiny(scheme, architecture="decoder_only", bidirectional_prefix=bidirectional,
               tgt_vocab_size=13 if shared else 9, **kw)
    return PrefixLM(cfg, shared_vocab=shared).eval()


def prefix_batch():
    """Right-padded sources of lengths 7, 4, 1 and BOS + target (target ids 3..8 fit either vocabulary)."""
    src = torch.randint(3, 13, (3, 7))
    src[1, 4:] = 0
    src[2, 1:] = 0
    tgt = torch.randint(3, 9, (3, 6))
    tgt[:, 0] = 1
    return src, tgt


@pytest.mark.parametrize("shared", [True, False], ids=["shared_vocab", "joint_vocab"])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional_prefix"])
@pytest.mark.parametrize("scheme", tuple(BUILTIN))
def test_cached_prefix_lm_equals_full_pass(scheme, bidirectional, shared):
    """Decoder-only seq2seq: the source prefilled in one call (under the prefix mask), then the
    target in steps of 1, 1, 2, 2 tokens, equals the padded batch's full pass row by row."""
    torch.manual_seed(0)
    model, (src, tgt) = prefix_lm(scheme, bidirectional, shared), prefix_batch()
    with torch.no_grad():
        full = model(src, tgt)
        assert full.shape == (3, 6, 13 if shared else 9)
        for row in range(3):
            n = int((src[row] != 0).sum())
            cache = model.start_decoding(src[row:row + 1, :n])
            assert cache.length == n
            steps = torch.cat([model.decode_step(part, cache) for part in chunks(tgt[row:row + 1], [1, 1, 2, 2])], 1)
            torch.testing.assert_close(steps, full[row:row + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", MODEL_IMPLS)
def test_every_model_impl_runs_the_prefix_mask_like_auto(impl):
    """The bidirectional prefix's per-row mask (B, 1, L, L) through every attention impl, with Shaw tables."""
    torch.manual_seed(0)
    model = prefix_lm("shaw", True, attention_impl=impl)
    reference = prefix_lm("shaw", True, attention_impl="auto")
    reference.load_state_dict(model.state_dict())
    src, tgt = prefix_batch()
    with torch.no_grad():
        full = model(src, tgt)
        torch.testing.assert_close(full, reference(src, tgt), atol=1e-5, rtol=1e-5)
        cache = model.start_decoding(src[:1])
        steps = torch.cat([model.decode_step(part, cache) for part in chunks(tgt[:1], [2, 1, 3])], dim=1)
    torch.testing.assert_close(steps, full[:1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_prefix_lm_trains_at_randomized_positions_and_evaluates_as_the_plain_model(bidirectional):
    """model.positions.max_random_len spreads the sequence (and the prefix mask) in training only."""
    torch.manual_seed(0)
    randomized = prefix_lm("rope", bidirectional, positions=builtin_config("rope", max_random_len=40))
    plain = prefix_lm("rope", bidirectional)
    plain.load_state_dict(randomized.state_dict())
    src, tgt = prefix_batch()
    torch.testing.assert_close(randomized.eval()(src, tgt), plain(src, tgt), rtol=0, atol=0)
    randomized.train()
    first, second = randomized(src, tgt), randomized(src, tgt)
    assert not torch.allclose(first, second)
    first.sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in randomized.parameters())


@pytest.mark.parametrize("bidirectional", [False, True])
def test_only_a_bidirectional_prefix_sees_later_source_tokens(bidirectional):
    torch.manual_seed(0)
    model, (src, tgt) = prefix_lm("rope", bidirectional), prefix_batch()
    changed = src.clone()
    changed[0, 6] = 3 if src[0, 6] != 3 else 4  # the last source token
    with torch.no_grad():
        _, before, _ = model(src, tgt, with_source=True)
        _, after, _ = model(changed, tgt, with_source=True)
    assert torch.equal(before[0, :6], after[0, :6]) != bidirectional
    assert torch.equal(before[1:], after[1:])  # other rows are untouched


def test_prefix_lm_predicts_target_tokens_and_with_source_the_next_source_token():
    """Joint vocabulary: target id t is t + 13; the source positions predict the next source token,
    then the separator (the target's BOS), and nothing at padding."""
    model, (src, tgt) = prefix_lm(shared=False), prefix_batch()
    assert model.decoder.output.out_features == 13 + 9
    assert model.joint(torch.tensor([0, 1, 5])).tolist() == [0, 14, 18]
    _, src_logits, predicts = model(src, tgt, with_source=True)
    assert src_logits.shape == (3, 7, 22)
    assert predicts[0].tolist() == src[0, 1:].tolist() + [14]
    assert predicts[1].tolist() == src[1, 1:4].tolist() + [14, 0, 0, 0]
    assert predicts[2].tolist() == [14] + [0] * 6
    with pytest.raises(ValueError, match="by_source_length"):
        model.start_decoding(src)


@pytest.mark.parametrize("kwargs, message", [
    ({"architecture": "decoder_onyl"}, "choose one of encoder_decoder, decoder_only"),
    ({"bidirectional_prefix": True}, "needs model.architecture=decoder_only"),
    ({"architecture": "decoder_only"}, "EncoderDecoder needs model.architecture=encoder_decoder"),
])
def test_architecture_errors_name_the_key(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EncoderDecoder(tiny(**kwargs))


def test_reordered_cache_continues_the_chosen_rows_as_if_decoded_alone():
    """Beam search's reorder moves every cached tensor (self-attention keys and values, the
    projected memory, the memory and its mask) with its row."""
    torch.manual_seed(0)
    model = EncoderDecoder(tiny()).eval()
    src, tgt = torch.randint(3, 13, (3, 7)), torch.randint(3, 13, (3, 5))
    src[1, 4:] = 0
    index = torch.tensor([1, 1, 2, 0])
    with torch.no_grad():
        cache = model.start_decoding(src)
        model.decode_step(tgt[:, :4], cache)
        cache.reorder(index)
        got = model.decode_step(tgt[index, 4:], cache)
        want = model(src[index], tgt[index])[:, 4:]
    assert cache.length == 5
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_decoder_is_causal():
    torch.manual_seed(0)
    model = EncoderDecoder(tiny()).eval()
    src, tgt = torch.randint(3, 13, (1, 5)), torch.randint(3, 13, (1, 6))
    changed = tgt.clone()
    changed[0, 4] = (tgt[0, 4] + 1 - 3) % 10 + 3
    a, b = model(src, tgt), model(src, changed)
    torch.testing.assert_close(a[:, :4], b[:, :4])
    assert not torch.allclose(a[:, 4:], b[:, 4:])


def test_source_padding_does_not_change_the_output():
    torch.manual_seed(0)
    model = EncoderDecoder(tiny()).eval()
    src, tgt = torch.randint(3, 13, (1, 5)), torch.randint(3, 13, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


def test_relative_positions_live_in_self_attention_only():
    model = EncoderDecoder(tiny("shaw"))
    names = [n for n, _ in model.named_parameters() if "rel_" in n]
    assert names and all("self_attn" in n for n in names)
    assert len([n for n in names if n.endswith("rel_k")]) == 4  # one table per layer, 2 + 2 layers


@pytest.mark.parametrize("module", [MultiHeadAttention, EncoderLayer, DecoderLayer, Embedding])
def test_layer_and_attention_options_are_keyword_only(module):
    """Only the input is positional (torchtune's `*, mask=None, input_pos=None`), so every call
    says which option it sets."""
    _self, _input, *options = inspect.signature(module.forward).parameters.values()
    assert options and all(p.kind is p.KEYWORD_ONLY for p in options), [str(p) for p in options]


def test_tied_and_shared_embeddings():
    model = EncoderDecoder(tiny(share_src_tgt_embeddings=True))
    assert model.decoder.output.weight is model.decoder.embed.tokens.weight
    assert model.encoder.embed.tokens is model.decoder.embed.tokens
    untied = EncoderDecoder(tiny(tie_embeddings=False))
    assert untied.decoder.output.weight is not untied.decoder.embed.tokens.weight


@pytest.mark.parametrize("kwargs,message", [
    (dict(d_model=30, n_heads=4), "d_model=30 is not divisible by model.n_heads=4"),
    (dict(attention_impl="fast"), "attention_impl='fast'"),
    (dict(attention_impl="banded"), "'banded' handles encoder self-attention only"),
    (dict(attention_impl="flex", attention_dropout=0.1), "set model.attention_dropout=0"),
    (dict(positions=positions("t5_bias", t5_num_buckets=32, t5_max_distance=16)),
     r"t5_max_distance=16 must be above t5_num_buckets // 2 = 16, .*: set it to 17 or more"),
    (dict(positions=positions("t5_bias", t5_num_buckets=2, t5_max_distance=5)),  # was a ZeroDivisionError
     r"t5_num_buckets=2 is too few: set it to 4 or more"),
    (dict(positions=positions("t5_bias", t5_num_buckets=3, t5_max_distance=5)), r"t5_num_buckets=3 is too few"),
    (dict(dropout=1.5), "dropout must be in"),
    (dict(share_src_tgt_embeddings=True, tgt_vocab_size=7), "equal source and target"),
    (dict(positions=positions("rope"), d_model=18, n_heads=2, d_ff=8), "even head dimension"),
])
def test_impossible_shapes_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EncoderDecoder(tiny(**kwargs))


def test_t5_bias_runs_at_the_fewest_buckets_validation_accepts():
    """4 buckets, max distance 3: bidirectional attention keeps 1 exact distance per direction (2 or 3
    buckets kept none and divided by zero in the encoder), causal attention 2; both run."""
    fewest = positions("t5_bias", t5_num_buckets=4, t5_max_distance=3)
    model = EncoderDecoder(tiny(positions=fewest))
    src, tgt = torch.randint(3, 13, (2, 9)), torch.randint(3, 13, (2, 7))
    assert model(src, tgt).isfinite().all()
    for bidirectional in (True, False):
        assert prefix_lm(positions=fewest, bidirectional=bidirectional)(*prefix_batch()).isfinite().all()
    # j − i = −5..5. The encoder: 0 the query itself (its one exact distance), 1 behind, 3 ahead (2, ahead
    # by 0, is never used); the decoder: 0 and 1 exact, 2 and 3 log-spaced up to max_distance
    encoder, decoder = (stack.layers[0].self_attn.inner.relative for stack in (model.encoder, model.decoder))
    assert encoder.bucket(torch.arange(-5, 6)).tolist() == [1, 1, 1, 1, 1, 0, 3, 3, 3, 3, 3]
    assert decoder.bucket(torch.arange(-5, 1)).tolist() == [3, 3, 3, 2, 1, 0]


def test_label_smoothed_loss_matches_torch_and_ignores_padding():
    logits = torch.randn(2, 5, 11)
    target = torch.randint(1, 11, (2, 5))
    target[1, 3:] = 0
    out = label_smoothed_loss(logits, target, smoothing=0.1, ignore_index=0)
    want = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=0.1)
    torch.testing.assert_close(out.loss, want)
    nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    torch.testing.assert_close(out.nll_sum, nll)
    assert out.n_tokens.item() == 8


def copy_losses(model, steps: int) -> tuple[float, float]:
    """Train `model` (src, tgt_in) -> logits to copy random strings; mean loss of the first and last 5 steps."""
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
    losses = []
    for _ in range(steps):
        src = torch.randint(3, 13, (32, 6))
        tgt_in = torch.cat([torch.ones(32, 1, dtype=torch.long), src], dim=1)
        tgt_out = torch.cat([src, torch.full((32, 1), 2)], dim=1)
        loss = label_smoothed_loss(model(src, tgt_in), tgt_out, smoothing=0.0).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses[:5]) / 5, sum(losses[-5:]) / 5


def test_tiny_shaw_model_learns_to_copy():
    """Smoke test of the whole core: with Shaw positions, copying is learned in seconds."""
    torch.manual_seed(0)
    model = EncoderDecoder(tiny("shaw", d_model=32, n_heads=4, d_ff=64, n_encoder_layers=1, n_decoder_layers=1))
    start, end = copy_losses(model, 150)
    assert end < 0.25 * start, (start, end)


def test_tiny_prefix_lm_learns_to_copy():
    """The decoder-only model learns the same copy task from `source <sep> target` sequences."""
    torch.manual_seed(0)
    model = prefix_lm("shaw", d_model=32, n_heads=4, d_ff=64, n_decoder_layers=2).train()
    start, end = copy_losses(model, 300)
    assert end < 0.25 * start, (start, end)
