"""Position schemes: each one's defining property, and clear errors for invalid combinations."""
import math

import pytest
import torch

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.attention.masks import offset_bias
from relpos_lab.core.positions import (
    BUILTIN,
    AbacusEmbedding,
    AlibiPositions,
    FireConfig,
    FirePositions,
    LearnedEmbedding,
    PositionCouplingEmbedding,
    RelativePositions,
    RotaryPositions,
    ShawConfig,
    ShawPositions,
    SinusoidalEmbedding,
    T5BiasConfig,
    T5BiasPositions,
    TransformerXLPositions,
    alibi_slopes,
    builtin_config,
    position_scheme_of,
)


def qk(lq, lk, heads=2, dim=8):
    """q and k of the shapes attention_kwargs sees: (B, H, Lq, D) and (B, H, Lk, D)."""
    return torch.randn(1, heads, lq, dim), torch.randn(1, heads, lk, dim)


def test_sinusoids_follow_the_formula_and_offset():
    pe = SinusoidalEmbedding(6)(torch.zeros(1, 5, 6), offset=3)[0]
    pos, i = 4, 1  # row 1 is absolute position 4; column 2i is sin(pos / 10000^(2i/d))
    assert pe[1, 2 * i].item() == pytest.approx(math.sin(pos / 10000 ** (2 * i / 6)), abs=1e-6)
    assert pe[1, 2 * i + 1].item() == pytest.approx(math.cos(pos / 10000 ** (2 * i / 6)), abs=1e-6)


def test_learned_positions_refuse_lengths_beyond_max_len():
    emb = LearnedEmbedding(4, max_len=8)
    assert emb(torch.zeros(2, 8, 4)).shape == (2, 8, 4)
    with pytest.raises(ValueError, match="max_len=8"):
        emb(torch.zeros(1, 3, 4), offset=6)


def test_shaw_tables_have_2k_plus_1_rows_shared_or_per_head():
    shared = ShawPositions(ShawConfig(max_distance=3), head_dim=8, n_heads=4)
    assert shared.rel_k.shape == shared.rel_v.shape == (7, 8)
    per_head = ShawPositions(ShawConfig(max_distance=3, per_head=True), head_dim=8, n_heads=4)
    assert per_head.rel_k.shape == (4, 7, 8)
    keys_only = ShawPositions(ShawConfig(max_distance=3, use_values=False), head_dim=8, n_heads=4)
    assert keys_only.attention_kwargs(*qk(2, 2), 0)["rel_v"] is None
    assert not torch.equal(shared.rel_k, shared.rel_v)  # separate tables, unlike OpenNMT-py


def test_rope_scores_depend_only_on_relative_offset():
    rope = RotaryPositions(head_dim=8, base=10000.0)
    q, k = torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8), torch.randn(1, 1, 1, 8).expand(1, 1, 6, 8)
    rq, rk = rope.rotate(q, k, offset=0)
    scores = (rq @ rk.transpose(-1, -2))[0, 0]
    for shift in range(-5, 6):
        diag = torch.diagonal(scores, offset=shift)
        torch.testing.assert_close(diag, diag[0].expand_as(diag), atol=1e-5, rtol=1e-5)
    rq2, _ = rope.rotate(q[..., :2, :], k[..., :2, :], offset=4)  # cached decoding positions
    torch.testing.assert_close(rq2, rq[..., 4:6, :])


def test_alibi_slopes_match_the_paper():
    assert alibi_slopes(8).tolist() == pytest.approx([2 ** -(i + 1) for i in range(8)])
    assert alibi_slopes(6).shape == (6,)  # non-power-of-two rule
    got = AlibiPositions(2).attention_kwargs(*qk(2, 4), 1)  # queries at 1, 2; keys 0..3: offsets -2..2
    assert got["max_distance"] == 2 and got["rel_bias"].shape == (2, 5)
    bias = offset_bias(got["rel_bias"], 2, 4, 2, 1)[0]
    assert bias[0, 0].tolist() == pytest.approx([-1 / 16, 0.0, -1 / 16, -2 / 16])  # 2 heads: m = 2^-4, query at 1


def test_t5_buckets_exact_near_and_log_spaced_far():
    t5 = T5BiasPositions(T5BiasConfig(t5_num_buckets=32, t5_max_distance=128), 2, True)
    rel = torch.tensor([-3, -1, 0, 1, 3, 20, 1000, -1000])
    b = t5.bucket(rel).tolist()
    assert b[:5] == [3, 1, 0, 17, 19]  # bidirectional: future distances in the upper half
    assert b[5:] == [26, 31, 15]  # 8 + floor(8·ln(20/8)/ln(16)) + 16; then clipped per half
    causal = T5BiasPositions(T5BiasConfig(), 2, False)
    assert causal.bucket(torch.tensor([2, 0, -2])).tolist() == [0, 0, 2]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5s_offset_table_is_its_bucketed_bias_at_every_distance(bidirectional):
    """The (H, 2k+1) rel_bias, k = t5_max_distance, gives each pair its bucket's bias, however far."""
    t5 = T5BiasPositions(T5BiasConfig(t5_num_buckets=8, t5_max_distance=20), 2, bidirectional)
    got = t5.attention_kwargs(*qk(3, 60), 30)
    rel = torch.arange(60)[None, :] - (torch.arange(3)[:, None] + 30)
    want = t5.bias(t5.bucket(rel)).permute(2, 0, 1)
    torch.testing.assert_close(offset_bias(got["rel_bias"], 3, 60, got["max_distance"], 30)[0], want)


# What each scheme contributes: an absolute module on the embeddings, and what its relative
# module hands relative_attention (keyword arguments) or does to q and k (rotation).
CONTRIBUTIONS = {
    "none": (None, set(), False),
    "sinusoidal": (SinusoidalEmbedding, set(), False),
    "learned": (LearnedEmbedding, set(), False),
    "shaw": (None, {"rel_k", "rel_v", "max_distance"}, False),
    "rope": (None, set(), True),
    "alibi": (None, {"rel_bias", "max_distance"}, False),
    "t5_bias": (None, {"rel_bias", "max_distance"}, False),
    "transformer_xl": (None, {"attn_bias"}, False),
    "fire": (None, {"attn_bias"}, False),
    "sandwich": (None, {"rel_bias", "max_distance"}, False),
    "xpos": (None, set(), True),
    "pope": (None, set(), True),
    "cope": (None, set(), False),  # content_bias only (tests/test_content_positions.py)
    "fox": (None, set(), False),
    "dape": (None, set(), False),
    "abacus": (AbacusEmbedding, set(), False),  # reads the token ids (tests/test_digit_positions.py)
    "position_coupling": (PositionCouplingEmbedding, set(), False),
}


@pytest.mark.parametrize("scheme", tuple(BUILTIN))
def test_every_scheme_contributes_where_it_says(scheme):
    assert set(CONTRIBUTIONS) == set(BUILTIN)
    absolute, kwargs, rotates = CONTRIBUTIONS[scheme]
    cfg = builtin_config(scheme)
    cfg.validate()
    module = position_scheme_of(cfg).embedding(16)
    assert (module is None) if absolute is None else isinstance(module, absolute)
    x = torch.randn(2, 5, 16)
    if module is not None:
        args = (0, torch.tensor([[4, 5, 3, 6, 7]] * 2)) if position_scheme_of(cfg).reads_tokens else ()
        assert module(x, *args).shape == x.shape and not torch.equal(module(x, *args), x)
    rel = position_scheme_of(cfg).attention(8, 2, causal=True) or RelativePositions()
    got = rel.attention_kwargs(*qk(5, 5), 0)
    assert set(got) == kwargs
    if "attn_bias" in got:
        assert got["attn_bias"].shape[-3:] == (2, 5, 5)
    if "rel_bias" in got:
        assert got["rel_bias"].shape == (2, 2 * got["max_distance"] + 1)
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    q2, k2 = rel.rotate(q, k, 0)
    assert (not torch.equal(q2, q) and not torch.equal(k2, k)) if rotates else (q2 is q and k2 is k)


def test_a_negative_clipping_distance_is_a_clear_error():
    for field in ("max_distance", "max_distance_left", "max_distance_right"):
        with pytest.raises(ValueError, match=f"model.positions.{field}=-1 must be >= 0"):
            ShawConfig(**{field: -1}).validate()


def test_shaw_with_sinusoids_adds_absolute_positions():
    assert position_scheme_of(ShawConfig()).embedding(8) is None
    assert isinstance(position_scheme_of(ShawConfig(add_sinusoids=True)).embedding(8), SinusoidalEmbedding)


@pytest.mark.parametrize("left,right", [(2, 2), (1, 3), (3, 0), (0, 2)])
@pytest.mark.parametrize("per_head", [False, True])
def test_asymmetric_shaw_clips_each_side_at_its_own_distance(left, right, per_head):
    """The loop reference: e_ij = q_i·(k_j + w^K[clip(j-i, -left, right)]) / sqrt(D), and values alike."""
    torch.manual_seed(0)
    cfg = ShawConfig(max_distance=9, max_distance_left=left, max_distance_right=right, per_head=per_head)
    rel = ShawPositions(cfg, head_dim=4, n_heads=2).double()
    assert rel.rel_k.shape[-2] == left + right + 1
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    offset = 3  # cached decoding: queries at absolute positions 3..8 over keys 0..8
    k, v = (torch.cat((torch.randn(1, 2, 3, 4, dtype=torch.float64), k), 2),
            torch.cat((torch.randn(1, 2, 3, 4, dtype=torch.float64), v), 2))
    for impl in ("naive", "gather"):
        out = relative_attention(q, k, v, query_offset=offset, impl=impl, **rel.attention_kwargs(q, k, offset))
        expected = torch.zeros_like(out)
        for h in range(2):
            wk, wv = (t[h] if per_head else t for t in (rel.rel_k, rel.rel_v))
            for i in range(6):
                labels = [max(-left, min(right, j - (i + offset))) + left for j in range(9)]
                logits = torch.stack([q[0, h, i] @ (k[0, h, j] + wk[labels[j]]) for j in range(9)]) / 2.0
                alpha = logits.softmax(-1)
                expected[0, h, i] = sum(alpha[j] * (v[0, h, j] + wv[labels[j]]) for j in range(9))
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


def test_symmetric_shaw_is_the_papers_2k_plus_1_table_passed_as_is():
    rel = ShawPositions(ShawConfig(max_distance=3), head_dim=4, n_heads=2)
    assert rel.labels is None and rel.attention_kwargs(*qk(2, 2), 0)["rel_k"] is rel.rel_k


def test_the_built_in_schemes_are_registered_through_entry_points_like_plugins():
    from relpos_lab.api import registry

    found = {e.name: e for e in registry.discover(registry.POSITIONS)}
    assert all(e.error is None for e in found.values()), [e.error for e in found.values()]
    assert {name: e.cls for name, e in found.items() if e.distribution == "relpos-lab"} == BUILTIN
    for name, cls in BUILTIN.items():
        assert cls.config_class.scheme == name and cls.describe()


def attend_with_loop(q, k, v, bias_of, causal, offset):
    """Attention with every logit from a Python loop: q_i·k_j / sqrt(D) + bias_of(b, h, i, j)."""
    B, H, lq, d = q.shape
    out = []
    for b in range(B):
        for h in range(H):
            for r in range(lq):
                i = offset + r
                keys = [j for j in range(k.shape[-2]) if not causal or j <= i]
                logits = torch.stack([q[b, h, r] @ k[b, h, j] / math.sqrt(d) + bias_of(b, h, i, j) for j in keys])
                out.append(sum(a * v[b, h, j] for a, j in zip(logits.softmax(-1), keys)))
    return torch.stack(out).view(B, H, lq, -1)


def assert_same_outputs_and_grads(module, inputs, got, want):
    weights = torch.randn_like(want)
    params = list(module.parameters()) + list(inputs)
    grads_got = torch.autograd.grad((got * weights).sum(), params)
    grads_want = torch.autograd.grad((want * weights).sum(), params)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    for g, w in zip(grads_got, grads_want):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 4, 7, 3), (True, 5, 5, 0), (False, 5, 5, 0), (False, 3, 6, 1)])
def test_transformer_xl_matches_the_papers_equation_in_a_loop(causal, lq, lk, offset):
    """e_ij = [(q_i + u)·k_j + (q_i + v)·W_R R_{i-j}] / sqrt(D), R the [sin, cos] encoding of i - j,
    for every (i, j): cached rows (offset), future keys (bidirectional: negative i - j)."""
    torch.manual_seed(0)
    H, D = 2, 4
    rel = TransformerXLPositions(D, H).double()
    q, k, v = (torch.randn(2, H, n, D, dtype=torch.float64, requires_grad=True) for n in (lq, lk, lk))
    d_model = H * D

    def bias_of(b, h, i, j):
        R = torch.tensor([math.sin((i - j) / 10000 ** (2 * t / d_model)) for t in range(d_model // 2)]
                         + [math.cos((i - j) / 10000 ** (2 * t / d_model)) for t in range(d_model // 2)],
                         dtype=torch.float64)
        WR = (rel.r_proj.weight @ R)[h * D:(h + 1) * D]
        return (rel.u[h] @ k[b, h, j] + (q[b, h, i - offset] + rel.v[h]) @ WR) / math.sqrt(D)

    for impl in ("naive", "gather"):
        want = attend_with_loop(q, k, v, bias_of, causal, offset)
        got = relative_attention(q, k, v, is_causal=causal, query_offset=offset, impl=impl,
                                 **rel.attention_kwargs(q, k, offset))
        assert_same_outputs_and_grads(rel, (q, k, v), got, want)


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 4, 7, 3), (True, 6, 6, 0), (False, 5, 5, 0)])
def test_fire_matches_the_papers_equation_in_a_loop(causal, lq, lk, offset):
    """b(i, j) = f_θ(ψ(|i - j|) / (ψ(max(L, i)) + 1e-6)), ψ(x) = log(|c·x| + 1), L = |λ|·L₀, per head;
    L₀ = 3 so that max(L, i) takes either side within these lengths."""
    torch.manual_seed(0)
    H, D = 3, 4
    rel = FirePositions(FireConfig(fire_hidden=5, fire_c=0.7, fire_threshold=3.0), H).double()
    with torch.no_grad():
        rel.threshold_scale.fill_(1.1)
    q, k, v = (torch.randn(2, H, n, D, dtype=torch.float64, requires_grad=True) for n in (lq, lk, lk))
    first, second = rel.mlp[0], rel.mlp[2]

    def bias_of(b, h, i, j):
        c, L = rel.c, abs(rel.threshold_scale * 3.0)
        x = (torch.log(abs(c * abs(i - j)) + 1)
             / (torch.log(abs(c * torch.maximum(torch.tensor(float(i)), L)) + 1) + 1e-6))
        hidden = torch.relu(first.weight[:, 0] * x + first.bias)
        return second.weight[h] @ hidden + second.bias[h]

    want = attend_with_loop(q, k, v, bias_of, causal, offset)
    got = relative_attention(q, k, v, is_causal=causal, query_offset=offset, impl="gather",
                             **rel.attention_kwargs(q, k, offset))
    assert_same_outputs_and_grads(rel, (q, k, v), got, want)


def test_fire_config_errors_name_the_field():
    for field, value in (("fire_hidden", 0), ("fire_c", 0.0), ("fire_threshold", -1.0)):
        with pytest.raises(ValueError, match=f"model.positions.{field}={value}"):
            FireConfig(**{field: value}).validate()
