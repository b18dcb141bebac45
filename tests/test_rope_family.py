"""The RoPE family (p-RoPE, xPos, PoPE, RoPE scaled at evaluation) and Sandwich: each against a
float64 loop of its paper's equation, outputs and gradients, and cached decoding against a full pass."""
import math

import pytest
import torch
import torch.nn.functional as F

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.positions import (
    PopeConfig,
    PopePositions,
    RopeConfig,
    RotaryPositions,
    SandwichConfig,
    SandwichPositions,
    XposConfig,
    XposPositions,
    position_scheme_of,
)
from relpos_lab.core.positions.rotary import yarn_ramp
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder

from tests.test_positions import assert_same_outputs_and_grads, attend_with_loop
from tests.test_transformer import chunks, tiny

D = 8  # head dim: 4 rotation pairs


def qkv(lq, lk, heads=2):
    """float64 q, k, v (2, heads, L, D) that gradients are taken of."""
    torch.manual_seed(0)
    return tuple(torch.randn(2, heads, n, D, dtype=torch.float64, requires_grad=True) for n in (lq, lk, lk))


def pair(x, t):
    """Pair t of a head vector: dims (t, t + D/2), the rotate-half layout."""
    return torch.stack((x[t], x[t + len(x) // 2]))


def rotation(angle):
    angle = torch.as_tensor(angle, dtype=torch.float64)
    return torch.stack((torch.stack((angle.cos(), -angle.sin())), torch.stack((angle.sin(), angle.cos()))))


def rope_logit(q_i, k_j, i, j, theta, decay=None):
    """Σ_t ζ_t^((i−j)/γ)·(R(i·θ_t) q_t)·(R(j·θ_t) k_t): RoPE per pair, xPos's decay when given."""
    total = 0.0
    for t, th in enumerate(theta.tolist()):
        term = (rotation(i * th) @ pair(q_i, t)) @ (rotation(j * th) @ pair(k_j, t))
        total = total + (term if decay is None else decay[t] ** ((i - j) / decay[-1]) * term)
    return total


def run(module, q, k, v, offset, causal, impl="gather"):
    """One self-attention call of Lq = Lk new positions from `offset`, as the model makes it."""
    rq, rk = module.rotate(q, k, offset)
    return relative_attention(rq, rk, v, is_causal=causal, query_offset=offset, impl=impl,
                              **module.attention_kwargs(rq, rk, offset))


# --- p-RoPE ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fraction,kept", [(1.0, 4), (0.5, 2), (0.3, 1), (0.0, 0)])
def test_p_rope_rotates_only_the_highest_fraction_of_frequencies_as_in_a_loop(fraction, kept):
    """p-RoPE: θ_t = 10000^(−2t/D) for the ⌊p·D/2⌋ highest, 0 (no rotation) for the rest."""
    module = RotaryPositions(D, 10000.0, RopeConfig(rope_fraction=fraction)).double()
    theta = torch.tensor([10000 ** (-2 * t / D) if t < kept else 0.0 for t in range(D // 2)], dtype=torch.float64)
    torch.testing.assert_close(module.theta, theta)
    q, k, v = qkv(5, 5)
    want = attend_with_loop(q, k, v, lambda b, h, i, j: (rope_logit(q[b, h, i], k[b, h, j], i, j, theta)
                                                        - q[b, h, i] @ k[b, h, j]) / math.sqrt(D), True, 0)
    assert_same_outputs_and_grads(module, (q, k, v), run(module, q, k, v, 0, True), want)


def test_p_rope_at_zero_is_nope_and_at_one_is_rope():
    q, k, _ = qkv(4, 4)
    nope = RotaryPositions(D, 10000.0, RopeConfig(rope_fraction=0.0)).rotate(q, k, 3)
    assert torch.equal(nope[0], q) and torch.equal(nope[1], k)
    rope = RotaryPositions(D, 10000.0).rotate(q, k, 3)
    torch.testing.assert_close(RotaryPositions(D, 10000.0, RopeConfig(rope_fraction=1.0)).rotate(q, k, 3), rope)


# --- RoPE scaled at evaluation ---------------------------------------------------------------------


def expected_frequencies(kind, s, train_length, base=10000.0):
    """The papers' θ'_t and the factor on q and k, written out per pair."""
    theta = [base ** (-2 * t / D) for t in range(D // 2)]
    if kind == "linear":  # position interpolation: m → m/s
        return [th / s for th in theta], 1.0
    if kind == "ntk":  # NTK-aware: base · s^(D/(D−2))
        return [(base * s ** (D / (D - 2))) ** (-2 * t / D) for t in range(D // 2)], 1.0
    # yarn as its authors' code computes it: the pairs turning 32 and 1 times over L, rounded out,
    # bound a ramp linear in the pair index from θ_t (extrapolation) to θ_t/s (interpolation)
    def pair_turning(r):  # solve L·base^(−2t/D) / 2π = r for t
        return math.log(train_length / (2 * math.pi * r)) / math.log(base) * D / 2
    low, high = max(math.floor(pair_turning(32)), 0), min(math.ceil(pair_turning(1)), D - 1)
    out = []
    for t, th in enumerate(theta):
        interpolated = min(max((t - low) / ((high - low) or 0.001), 0.0), 1.0)
        out.append(interpolated * th / s + (1 - interpolated) * th)
    return out, 0.1 * math.log(s) + 1


def test_yarn_matches_a_hand_computed_case_of_its_authors_code():
    """D = 64, base 10000, s = 4, trained on L = 64, worked by hand from jquesnelle/yarn's
    find_correction_range and linear_ramp_mask (Hugging Face's `yarn` is the same). The pair that
    turns r times over L is t(r) = (D/2)·ln(L/(2π·r))/ln(base) = 32·ln(64/(2π·r))/9.21034:
    t(32) = 32·ln(1/π)/9.21034 = −3.977, low = max(⌊−3.977⌋, 0) = 0; t(1) = 32·ln(10.186)/9.21034
    = 8.064, high = ⌈8.064⌉ = 9. So pair t is interpolated by t/9 up to pair 9 and θ'_t =
    θ_t·((1 − t/9) + (t/9)/4), θ_t = 10^(−t/8): θ'_0 = 1; θ'_3 = 10^(−0.375)·0.75 = 0.31627238;
    θ'_6 = 10^(−0.75)·0.5 = 0.08891397; θ'_9 = 10^(−1.125)/4 = 0.018747355; θ'_31 = 10^(−3.875)/4 =
    3.3338036e−5. q and k are each scaled by 0.1·ln 4 + 1 = 1.1386294. The ramp linear in the rotation
    count (the paper's text) gives pair 0 weight 0.296 on θ_0 here: (64/2π − 1)/31."""
    cfg = RopeConfig(rope_scaling="yarn", rope_scaling_factor=4.0, rope_train_length=64)
    theta, factor = RotaryPositions(64, 10000.0, cfg).eval().frequencies(256)
    want = torch.tensor([1.0, 0.31627238, 0.08891397, 0.018747355, 3.3338036e-5], dtype=torch.float64)
    torch.testing.assert_close(theta[[0, 3, 6, 9, 31]], want, rtol=1e-7, atol=0)
    assert factor == pytest.approx(1.1386294, abs=1e-7)
    ramp = yarn_ramp(64, 10000.0, 64, 32.0, 1.0)
    assert ramp[0] == 0.0  # pair 0 keeps weight 1.0 on θ_0: pure extrapolation
    torch.testing.assert_close(ramp[:10], torch.arange(10, dtype=torch.float64) / 9)
    assert ramp[9:].eq(1.0).all()  # pure interpolation from the slow correction pair on


@pytest.mark.parametrize("head_dim,train_length,factor", [(64, 64, 4.0), (128, 4096, 4.0), (8, 8, 3.0), (64, 4, 2.0)])
def test_yarn_matches_hugging_face_transformers(head_dim, train_length, factor):
    """transformers' `yarn` rope init, where it is installed (a dev-only peer): inverse frequencies to
    1e-6 and the same attention factor; (64, 4) is the context too short for the slow correction pair."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "yarn", "factor": factor}
    hf = dict(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim, max_position_embeddings=train_length)
    if int(transformers.__version__.split(".")[0]) >= 5:
        config = transformers.LlamaConfig(**hf, rope_parameters={**rope, "rope_theta": 10000.0})
    else:
        config = transformers.LlamaConfig(**hf, rope_scaling=rope, rope_theta=10000.0)
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    cfg = RopeConfig(rope_scaling="yarn", rope_scaling_factor=factor, rope_train_length=train_length)
    theta, scale = RotaryPositions(head_dim, 10000.0, cfg).eval().frequencies(10 * train_length)
    torch.testing.assert_close(theta, inv_freq.double(), rtol=0, atol=1e-6)
    assert scale == pytest.approx(attention_factor)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
@pytest.mark.parametrize("factor", [3.0, 0.0], ids=["fixed", "dynamic"])
def test_rope_scaling_in_evaluation_beyond_the_training_length_follows_the_formula(kind, factor):
    """A 12-position evaluation pass of a model trained on 8: θ'_t of the paper and, for YaRN, logits
    times (0.1·ln s + 1)²; s = the factor, or 12/8 when dynamic."""
    cfg = RopeConfig(rope_scaling=kind, rope_scaling_factor=factor, rope_train_length=8)
    module = RotaryPositions(D, 10000.0, cfg).double().eval()
    theta, m = expected_frequencies(kind, factor or 12 / 8, 8)
    theta = torch.tensor(theta, dtype=torch.float64)
    q, k, v = qkv(12, 12, heads=1)
    want = attend_with_loop(q, k, v, lambda b, h, i, j: (m * m * rope_logit(q[b, h, i], k[b, h, j], i, j, theta)
                                                        - q[b, h, i] @ k[b, h, j]) / math.sqrt(D), True, 0)
    assert_same_outputs_and_grads(module, (q, k, v), run(module, q, k, v, 0, True), want)


def test_rope_scaling_is_plain_rope_in_training_and_within_the_training_length():
    q, k, _ = qkv(30, 30)
    plain = RotaryPositions(D, 10000.0).double()
    scaled = RotaryPositions(D, 10000.0, RopeConfig(rope_scaling="yarn", rope_scaling_factor=4.0,
                                                    rope_train_length=20)).double()
    assert scaled.training
    torch.testing.assert_close(scaled.rotate(q, k, 0), plain.rotate(q, k, 0), rtol=0, atol=0)  # training: any length
    scaled.eval()
    torch.testing.assert_close(scaled.rotate(q[..., :20, :], k[..., :20, :], 0),
                               plain.rotate(q[..., :20, :], k[..., :20, :], 0), rtol=0, atol=0)
    assert not torch.allclose(scaled.rotate(q, k, 0)[0], plain.rotate(q, k, 0)[0])  # 30 > 20 in evaluation


# --- xPos --------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 4, 7, 3), (True, 6, 6, 0), (False, 5, 5, 0)])
def test_xpos_matches_the_papers_equation_in_a_loop(causal, lq, lk, offset):
    """s_ij = Σ_t ζ_t^((i−j)/γ)·(R_i q)_t·(R_j k)_t, ζ_t = (t/(D/2) + γ̂)/(1 + γ̂), causal; bidirectional: RoPE."""
    cfg = XposConfig(xpos_gamma_hat=0.4, xpos_scale_base=4.0)  # a small γ so the decay shows at these lengths
    module = XposPositions(D, cfg, causal).double()
    zeta = [(t / (D / 2) + 0.4) / 1.4 for t in range(D // 2)] + [4.0]
    theta = torch.tensor([10000 ** (-2 * t / D) for t in range(D // 2)], dtype=torch.float64)
    q, k, v = qkv(lq, lk)

    def bias_of(b, h, i, j):
        return (rope_logit(q[b, h, i - offset], k[b, h, j], i, j, theta, zeta if causal else None)
                - q[b, h, i - offset] @ k[b, h, j]) / math.sqrt(D)

    want = attend_with_loop(q, k, v, bias_of, causal, offset)
    # keys before the offset were rotated by earlier calls: rotate all keys from 0, queries at the offset
    rk = module.rotate(k, k, 0)[1]
    rq = module.rotate(q, q, offset)[0]
    got = relative_attention(rq, rk, v, is_causal=causal, query_offset=offset, impl="gather")
    assert_same_outputs_and_grads(module, (q, k, v), got, want)


# --- PoPE --------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 4, 7, 3), (False, 5, 5, 0)])
def test_pope_matches_the_papers_equation_in_a_loop(causal, lq, lk, offset):
    """s_ij = Σ_c softplus(q_ic)·softplus(k_jc)·cos((i − j)·θ_c − δ_hc) / √D, θ_c = 10000^(−c/D),
    δ clamped to [−2π, 0] (one entry set below −2π here to check the clamp)."""
    module = PopePositions(D, 2, 10000.0).double()
    with torch.no_grad():
        module.phase.copy_(-torch.rand(2, D, dtype=torch.float64) * 6)
        module.phase[1, 3] = -7.0
    theta = [10000 ** (-c / D) for c in range(D)]
    q, k, v = qkv(lq, lk)

    def logit(b, h, i, j):
        delta = module.phase[h].clamp(-2 * math.pi, 0)
        return sum(F.softplus(q[b, h, i - offset, c]) * F.softplus(k[b, h, j, c])
                   * torch.cos((i - j) * theta[c] - delta[c]) for c in range(D)) / math.sqrt(D)

    want = attend_with_loop(q, k, v, lambda b, h, i, j: logit(b, h, i, j) - q[b, h, i - offset] @ k[b, h, j]
                            / math.sqrt(D), causal, offset)
    rk = module.rotate(k, k, 0)[1]
    rq = module.rotate(q, q, offset)[0]
    assert rq.shape[-1] == rk.shape[-1] == 2 * D
    got = relative_attention(rq, rk, v, is_causal=causal, query_offset=offset, impl="gather")
    assert_same_outputs_and_grads(module, (q, k, v), got, want)
    got = relative_attention(module.rotate(q, q, offset)[0], module.rotate(k, k, 0)[1], v, is_causal=causal,
                             query_offset=offset)
    grad = torch.autograd.grad(got.sum(), module.phase)[0]
    assert grad[1, 3] == 0 and grad[0].abs().sum() > 0  # the clamped phase gets no gradient


# --- Sandwich ------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 4, 7, 3), (False, 5, 5, 0), (False, 3, 6, 1)])
def test_sandwich_matches_the_papers_equation_in_a_loop(causal, lq, lk, offset):
    """b_h(i, j) = (Σ_{t=1..d'/2} cos((j − i)/10000^(2t/d')) − d'/2) / (8h/H), h = 1..H."""
    H, dim = 3, 6
    module = SandwichPositions(H, dim)
    q, k, v = qkv(lq, lk, heads=H)

    def bias_of(b, h, i, j):
        inner = sum(math.cos((j - i) / 10000 ** (2 * t / dim)) for t in range(1, dim // 2 + 1))
        return (inner - dim / 2) / (8 * (h + 1) / H)

    kwargs = module.attention_kwargs(q, k, offset)
    assert set(kwargs) == {"rel_bias", "max_distance"}  # an offset table: the fused kernel reads it
    for impl in ("naive", "gather"):
        want = attend_with_loop(q, k, v, bias_of, causal, offset)
        got = relative_attention(q, k, v, is_causal=causal, query_offset=offset, impl=impl, **kwargs)
        assert_same_outputs_and_grads(module, (q, k, v), got, want)


def test_sandwich_runs_in_the_fused_kernel_like_gather():
    from relpos_lab.core.attention import fused

    module = SandwichPositions(2, 16)
    q, k, v = (t.detach().float() for t in qkv(6, 9))
    kwargs = module.attention_kwargs(q, k, 3)
    if fused.unsupported(q, k, v, rel_k=None, rel_v=None, rel_bias=kwargs["rel_bias"],
                         max_distance=kwargs["max_distance"], attn_mask=None, is_causal=False, query_offset=3,
                         dropout_p=0.0, attn_bias=None):
        pytest.skip("triton is not available here")
    got = relative_attention(q, k, v, is_causal=True, query_offset=3, impl="triton", **kwargs)
    torch.testing.assert_close(got,
                               relative_attention(q, k, v, is_causal=True, query_offset=3, impl="gather", **kwargs),
                               atol=1e-5, rtol=1e-5)


def test_sandwich_bias_is_zero_at_offset_zero_and_never_positive():
    kwargs = SandwichPositions(4, 128).attention_kwargs(torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 300, 8), 299)
    bias, reach = kwargs["rel_bias"], kwargs["max_distance"]
    assert reach == 299 and torch.all(bias[:, reach] == 0) and torch.all(bias <= 1e-6)
    assert torch.all(bias[0, :reach] <= bias[-1, :reach])  # later heads are divided by more: a milder bias


# --- in the models: cached decoding, prefill, configs --------------------------------------------------

VARIANTS = {
    "p_rope": RopeConfig(rope_fraction=0.5),
    "rope_yarn_fixed": RopeConfig(rope_scaling="yarn", rope_scaling_factor=2.0, rope_train_length=4),
    "rope_ntk_fixed": RopeConfig(rope_scaling="ntk", rope_scaling_factor=2.0, rope_train_length=4),
    "rope_linear_fixed": RopeConfig(rope_scaling="linear", rope_scaling_factor=2.0, rope_train_length=4),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_decoder_only_equals_full_pass_for_rope_options(variant):
    """Scaled RoPE with a fixed factor and a prefill already beyond rope_train_length: every call
    rotates with the same frequencies, so the cache is exact."""
    torch.manual_seed(0)
    model = DecoderLM(tiny(positions=VARIANTS[variant], n_encoder_layers=0)).eval()
    tokens = torch.randint(3, 13, (2, 10))
    full = model(tokens)
    cache = model.start_decoding()
    steps = torch.cat([model.decode_step(part, cache) for part in chunks(tokens, [5, 1, 1, 3])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_encoder_decoder_equals_full_pass_for_rope_options(variant):
    torch.manual_seed(0)
    model = EncoderDecoder(tiny(positions=VARIANTS[variant])).eval()
    src, tgt = torch.randint(3, 13, (3, 7)), torch.randint(3, 13, (3, 9))
    src[1, 4:] = 0
    full = model(src, tgt)
    cache = model.start_decoding(src)
    steps = torch.cat([model.decode_step(part, cache) for part in chunks(tgt, [5, 1, 3])], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)


def test_a_scaled_rope_model_trains_as_plain_rope_and_evaluates_scaled():
    torch.manual_seed(0)
    plain = DecoderLM(tiny(positions=RopeConfig(), n_encoder_layers=0))
    scaled = DecoderLM(tiny(positions=RopeConfig(rope_scaling="yarn", rope_train_length=6), n_encoder_layers=0))
    scaled.load_state_dict(plain.state_dict())
    tokens = torch.randint(3, 13, (2, 10))
    torch.testing.assert_close(scaled(tokens), plain(tokens), rtol=0, atol=0)
    plain.eval(), scaled.eval()
    torch.testing.assert_close(scaled(tokens[:, :6]), plain(tokens[:, :6]), rtol=0, atol=0)
    assert not torch.allclose(scaled(tokens), plain(tokens))


@pytest.mark.parametrize("cfg, message", [
    (RopeConfig(rope_fraction=1.5), "rope_fraction=1.5 must be in"),
    (RopeConfig(rope_scaling="dynamic"), "rope_scaling='dynamic'; choose one of none, linear, ntk, yarn"),
    (RopeConfig(rope_scaling="yarn"), "needs model.positions.rope_train_length"),
    (RopeConfig(rope_scaling="ntk", rope_train_length=8, rope_scaling_factor=0.5),
     "rope_scaling_factor=0.5 must be >= 1"),
    (XposConfig(xpos_scale_base=0), "xpos_scale_base=0"),
    (SandwichConfig(sandwich_dim=7), "sandwich_dim=7 must be an even number"),
])
def test_config_errors_name_the_field(cfg, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        cfg.validate()


# --- drawings ------------------------------------------------------------------------------------


def test_rope_draws_its_score_by_offset_in_training_and_scaled_evaluation():
    layer = position_scheme_of(RopeConfig(rope_fraction=0.5, rope_scaling="linear", rope_scaling_factor=2.0,
                                 rope_train_length=16)).attention(D, 2, causal=True)
    drawn = layer.draw(5)
    d = torch.arange(-5, 6, dtype=torch.float64)
    theta = torch.tensor([1.0, 10000 ** -0.25, 0.0, 0.0], dtype=torch.float64)
    assert drawn["score"].values.shape == (1, 11) and drawn["score"].x.tolist() == list(range(-5, 6))
    torch.testing.assert_close(drawn["score"].values[0], (d[:, None] * theta).cos().mean(-1).float())
    torch.testing.assert_close(drawn["score_scaled"].values[0], (d[:, None] * theta / 2).cos().mean(-1).float())
    assert set(position_scheme_of(RopeConfig()).attention(D, 2, causal=True).draw(5)) == {"score"}
    assert layer.training  # drawing does not leave the layer in evaluation mode


def test_xpos_draws_its_decayed_score_and_decay_per_pair():
    layer = position_scheme_of(XposConfig(xpos_scale_base=8.0)).attention(D, 2, causal=True)
    drawn = layer.draw(6)
    d = torch.arange(-6, 1, dtype=torch.float64)
    zeta = (torch.arange(4, dtype=torch.float64) / 4 + 0.4) / 1.4
    theta = 10000 ** (-2 * torch.arange(4, dtype=torch.float64) / D)
    want = (zeta ** (-d[:, None] / 8) * (d[:, None] * theta).cos()).mean(-1)
    torch.testing.assert_close(drawn["score"].values[0], want.float())
    torch.testing.assert_close(drawn["decay"].values, (zeta ** (6 / 8)).float())


def test_pope_draws_its_score_per_head_and_learned_phases():
    layer = position_scheme_of(PopeConfig()).attention(D, 2, causal=True)
    with torch.no_grad():
        layer.phase.fill_(-1.0)
    drawn = layer.draw(3)
    theta = 10000 ** (-torch.arange(D, dtype=torch.float64) / D)
    d = torch.arange(-3, 4, dtype=torch.float64)
    torch.testing.assert_close(drawn["score"].values[1], (d[:, None] * theta - 1.0).cos().mean(-1).float())
    assert drawn["phase"].values.shape == (2, D)


def test_sandwich_draws_the_bias_it_adds():
    layer = position_scheme_of(SandwichConfig(sandwich_dim=16)).attention(D, 4, causal=False)
    drawn = layer.draw(5)["bias"]
    kwargs = layer.attention_kwargs(torch.zeros(1, 4, 1, D), torch.zeros(1, 4, 11, D), 5)
    torch.testing.assert_close(drawn.values, kwargs["rel_bias"].float())
