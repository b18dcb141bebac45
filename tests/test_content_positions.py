"""Content-dependent position schemes (the `content_bias` hook): each one's defining equation in a
float64 loop, its gradients, and cached decoding equal to the full pass with non-trivial weights."""
import math

import pytest
import torch

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.positions import (
    BUILTIN,
    CopeConfig,
    CopePositions,
    DapeConfig,
    DapePositions,
    FoxPositions,
    KeyState,
    alibi_slopes,
    builtin_config,
    contract,
)
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig

from tests.test_positions import assert_same_outputs_and_grads

CONTENT = tuple(name for name, cls in BUILTIN.items()
                if contract.has_content_bias(cls(builtin_config(name)).attention(8, 2, True)
                                             or contract.RelativePositions()))


def attend_with_loop(q, k, v, logit_of, visible):
    """softmax_j over the keys visible(b, i, j) of logit_of(b, h, r, j); rows with no key give 0."""
    B, H, lq, _ = q.shape
    out = []
    for b in range(B):
        for h in range(H):
            for r in range(lq):
                keys = [j for j in range(k.shape[-2]) if visible(b, r, j)]
                logits = torch.stack([logit_of(b, h, r, j) for j in keys])
                out.append(sum(a * v[b, h, j] for a, j in zip(logits.softmax(-1), keys)))
    return torch.stack(out).view(B, H, lq, -1)


def case(causal, lq, lk, offset, heads=2, dim=4, padded=True):
    """q, k, v (float64, requiring grad), and which keys each query sees: causality at query
    position offset + r, and in batch row 1 the last two keys are padding."""
    q, k, v = (torch.randn(2, heads, n, dim, dtype=torch.float64, requires_grad=True) for n in (lq, lk, lk))
    keep = torch.ones(2, lk, dtype=torch.bool)
    if padded:
        keep[1, -2:] = False
    mask = keep[:, None, None, :]

    def visible(b, r, j):
        return bool(keep[b, j]) and (not causal or j <= offset + r)

    return q, k, v, mask, visible


CASES = [(True, 5, 5, 0), (True, 3, 7, 4), (False, 5, 5, 0), (False, 3, 6, 1)]


# --- CoPE -------------------------------------------------------------------------------------------


def cope_module(dim, npos_max, bidirectional):
    torch.manual_seed(1)
    rel = CopePositions(dim, npos_max, bidirectional).double()
    with torch.no_grad():  # the paper starts the tables at zero; any values must work
        for table in rel.parameters():
            table.normal_()
    return rel


@pytest.mark.parametrize("causal,lq,lk,offset", CASES)
def test_cope_matches_the_papers_equations_in_a_loop(causal, lq, lk, offset):
    """g_ij = σ(q_i·k_j/√D) over visible keys; p_ij = Σ_{t=j..i} g_it (bidirectional, j > i:
    Σ_{t=i..j} g_it on the table E⁺), clipped to npos_max − 1; e[p] interpolated between
    e[⌊p⌋] and e[⌈p⌉]; logit q_i·k_j/√D + q_i·e[p_ij]. npos_max = 3 so that some counts clip."""
    torch.manual_seed(0)
    D = 4
    q, k, v, mask, visible = case(causal, lq, lk, offset, dim=D)
    rel = cope_module(D, 3, bidirectional=not causal)

    def logit_of(b, h, r, j):
        i = offset + r
        gate = {t: torch.sigmoid(q[b, h, r] @ k[b, h, t] / math.sqrt(D)) for t in range(lk) if visible(b, r, t)}
        span, table = (range(j, i + 1), rel.past) if j <= i else (range(i, j + 1), rel.future)
        p = torch.clamp(sum((gate[t] for t in span if t in gate), torch.tensor(0.0, dtype=torch.float64)), max=2)
        lo, hi = math.floor(p.item()), math.ceil(p.item())
        e = (p - lo) * table[:, hi] + (1 - p + lo) * table[:, lo]
        return q[b, h, r] @ k[b, h, j] / math.sqrt(D) + q[b, h, r] @ e

    want = attend_with_loop(q, k, v, logit_of, visible)
    state = KeyState()
    bias = rel.content_bias(q, k, None, offset, contract_visible(mask, causal, lq, lk, offset), state)
    got = relative_attention(q, k, v, attn_mask=mask, is_causal=causal, query_offset=offset, impl="gather",
                             attn_bias=bias)
    assert_same_outputs_and_grads(rel, (q, k, v), got, want)
    assert state.value is None  # CoPE's gates are recomputed per query: nothing kept beyond the keys


def contract_visible(mask, causal, lq, lk, offset):
    """The `visible` the core hands content_bias: the mask and causality combined."""
    from relpos_lab.core.attention.masks import visibility_mask

    return visibility_mask(mask, causal, lq, lk, offset)


class ContentBias(torch.nn.Module):
    """A module's content_bias as a function of its inputs and its parameters, for gradcheck."""

    def __init__(self, rel, x=None):
        super().__init__()
        self.rel, self.x = rel, x

    def forward(self, q, k, x=None):
        return self.rel.content_bias(q, k, self.x if x is None else x, 0, None, KeyState())

    def gradcheck(self, *inputs):
        names = [name for name, _ in self.named_parameters()]
        params = tuple(p.detach().clone().requires_grad_() for p in self.parameters())

        def call(*args):
            given = dict(zip(names, args[len(inputs):]))
            return torch.func.functional_call(self, given, args[:len(inputs)])

        return torch.autograd.gradcheck(call, (*inputs, *params))


def test_cope_gradients_pass_gradcheck():
    """Piecewise smooth: random gates keep every count away from the integers, where ⌊p⌋ jumps."""
    torch.manual_seed(0)
    rel = cope_module(3, 4, bidirectional=True)
    q, k = (torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert ContentBias(rel).gradcheck(q, k)


def test_cope_counts_only_the_gated_tokens():
    """With gates forced to 0 or 1 (q·k = ±∞ in effect), p_ij is the number of keys in j..i whose
    gate is open: the paper's "count what matters"."""
    rel = CopePositions(1, 8, bidirectional=False)
    q = torch.full((1, 1, 5, 1), 1.0)
    k = torch.tensor([1e4, -1e4, 1e4, 1e4, -1e4]).view(1, 1, 5, 1)  # open, shut, open, open, shut
    p, _ = rel.positions(q, k, 0, None)
    assert p[0, 0, 4].tolist() == [3.0, 2.0, 2.0, 1.0, 0.0]
    assert p[0, 0, 2, :3].tolist() == [2.0, 1.0, 1.0]


def test_cope_config_errors_name_the_field():
    with pytest.raises(ValueError, match="model.positions.cope_npos_max=1 must be >= 2"):
        CopeConfig(cope_npos_max=1).validate()


# --- FoX --------------------------------------------------------------------------------------------


def fox_module(d_model, heads):
    torch.manual_seed(1)
    return FoxPositions(d_model, heads, bias_init=1.0).double()


@pytest.mark.parametrize("causal,lq,lk,offset", [(True, 5, 5, 0), (True, 3, 7, 4), (False, 5, 5, 0), (False, 3, 4, 1)])
def test_fox_matches_the_papers_equations_in_a_loop(causal, lq, lk, offset):
    """f_t = σ(w_f·x_t + b_f) per head; logit q_i·k_j/√D + Σ_{l=j+1..i} log f_l (bidirectional, j > i:
    Σ_{l=i+1..j} log f_l); padding tokens forget nothing. With a cache (offset > 0) the state holds
    the cached keys' cumulative sums."""
    torch.manual_seed(0)
    H, D = 2, 4
    q, k, v, mask, visible = case(causal, lq, lk, offset, heads=H, dim=D)
    rel = fox_module(H * D, H)
    x_all = torch.randn(2, lk, H * D, dtype=torch.float64, requires_grad=True)  # the layer input of every token
    keep = mask[:, 0, 0, :]

    def log_f(b, h, t):
        return torch.nn.functional.logsigmoid(rel.gate.weight[h] @ x_all[b, t] + rel.gate.bias[h]) * keep[b, t]

    def logit_of(b, h, r, j):
        i = offset + r
        span = range(j + 1, i + 1) if j <= i else range(i + 1, j + 1)
        return q[b, h, r] @ k[b, h, j] / math.sqrt(D) + sum((log_f(b, h, t) for t in span), torch.tensor(0.0))

    want = attend_with_loop(q, k, v, logit_of, visible)
    state = KeyState()
    if offset:  # the cached prefix went through the hook first (its visibility: causal among itself)
        prefix = contract_visible(mask[..., :offset], causal, offset, offset, 0)
        rel.content_bias(k[..., :offset, :], k[..., :offset, :], x_all[:, :offset], 0, prefix, state)
    x = x_all[:, offset:offset + lq]
    bias = rel.content_bias(q, k, x, offset, contract_visible(mask, causal, lq, lk, offset), state)
    assert state.value.shape == (2, H, offset + lq)
    got = relative_attention(q, k, v, attn_mask=mask, is_causal=causal, query_offset=offset, impl="gather",
                             attn_bias=bias)
    assert_same_outputs_and_grads(rel, (q, k, v, x_all), got, want)


def test_fox_gradients_pass_gradcheck():
    torch.manual_seed(0)
    rel = fox_module(6, 2)
    q = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    x = torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True)
    assert ContentBias(rel).gradcheck(q, q, x)


# --- DAPE -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("base", ["kerple", "alibi"])
@pytest.mark.parametrize("causal,lq,lk,offset", CASES)
def test_dape_matches_the_papers_equation_in_a_loop(base, causal, lq, lk, offset):
    """logit s_ij + B_ij + f([s_ij ; B_ij]), s_ij = q_i·k_j/√D for every head, f = Linear(2H -> W),
    LeakyReLU(0.01), Linear(W -> H); B = −p_h·log(1 + a_h·|i − j|) (p, a clamped at 1e-2) or
    −m_h·|i − j|. Kerple's a starts below the clamp in one head, so the clamp is exercised."""
    torch.manual_seed(0)
    H, D = 3, 4
    q, k, v, mask, visible = case(causal, lq, lk, offset, heads=H, dim=D)
    torch.manual_seed(1)
    rel = DapePositions(DapeConfig(dape_base=base, dape_hidden=5), H).double()
    if base == "kerple":
        with torch.no_grad():
            rel.a[0] = 0.001
    first, second = rel.mlp[0], rel.mlp[2]

    def base_of(h, i, j):
        if base == "alibi":
            return -float(alibi_slopes(H)[h]) * abs(i - j)
        return -torch.clamp(rel.p[h], min=0.01) * torch.log(1 + torch.clamp(rel.a[h], min=0.01) * abs(i - j))

    def logit_of(b, n, r, j):
        i = offset + r
        s = [q[b, h, r] @ k[b, h, j] / math.sqrt(D) for h in range(H)]
        biases = [base_of(h, i, j) for h in range(H)]
        hidden = first.weight @ torch.stack([torch.as_tensor(t, dtype=torch.float64) for t in s + biases]) + first.bias
        hidden = torch.where(hidden > 0, hidden, 0.01 * hidden)
        return s[n] + biases[n] + second.weight[n] @ hidden + second.bias[n]

    want = attend_with_loop(q, k, v, logit_of, visible)
    bias = rel.content_bias(q, k, None, offset, contract_visible(mask, causal, lq, lk, offset), KeyState())
    got = relative_attention(q, k, v, attn_mask=mask, is_causal=causal, query_offset=offset, impl="gather",
                             attn_bias=bias)
    assert_same_outputs_and_grads(rel, (q, k, v), got, want)


def test_dape_gradients_pass_gradcheck():
    torch.manual_seed(0)
    rel = DapePositions(DapeConfig(dape_hidden=4), 2).double()
    q, k = (torch.randn(1, 2, 3, 2, dtype=torch.float64, requires_grad=True) for _ in range(2))
    assert ContentBias(rel).gradcheck(q, k)


def test_dape_config_errors_name_the_field():
    with pytest.raises(ValueError, match="model.positions.dape_base='rope'; choose one of kerple, alibi"):
        DapeConfig(dape_base="rope").validate()
    with pytest.raises(ValueError, match="model.positions.dape_hidden=0 must be >= 1"):
        DapeConfig(dape_hidden=0).validate()


# --- all: the model core ---------------------------------------------------------------------------


def tiny(scheme, **kw):
    fields = dict(src_vocab_size=13, tgt_vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
                  n_decoder_layers=2, dropout=0.0, attention_dropout=0.0,
                  positions=builtin_config(scheme, **({"cope_npos_max": 4} if scheme == "cope" else {})))
    return ModelConfig(**{**fields, **kw})


def randomized_tables(model):
    """CoPE's tables start at zero (the paper): fill them, so the cached path has something to get wrong."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".past", ".future")):
                p.normal_()
    return model.eval()


@pytest.mark.parametrize("scheme", CONTENT)
def test_content_schemes_decode_with_a_cache_exactly_in_every_model_family(scheme):
    """Cached steps and multi-token prefill (5, 1, 1, 3) equal the full pass: DecoderLM, the
    encoder-decoder (padded bidirectional encoder), the prefix LM with a bidirectional prefix."""
    torch.manual_seed(0)
    tokens = torch.randint(3, 13, (2, 10))
    steps = lambda model, cache: torch.cat(  # noqa: E731
        [model.decode_step(part, cache) for part in tokens.split([5, 1, 1, 3], dim=1)], 1)
    with torch.no_grad():
        lm = randomized_tables(DecoderLM(tiny(scheme, n_encoder_layers=0)))
        torch.testing.assert_close(steps(lm, lm.start_decoding()), lm(tokens), atol=1e-5, rtol=1e-5)
        seq2seq = randomized_tables(EncoderDecoder(tiny(scheme)))
        src = torch.randint(3, 13, (2, 7))
        src[1, 4:] = 0
        torch.testing.assert_close(steps(seq2seq, seq2seq.start_decoding(src)), seq2seq(src, tokens),
                                   atol=1e-5, rtol=1e-5)
        prefix = randomized_tables(PrefixLM(tiny(scheme, architecture="decoder_only", bidirectional_prefix=True)))
        src = torch.randint(3, 13, (2, 6))
        torch.testing.assert_close(steps(prefix, prefix.start_decoding(src)), prefix(src, tokens),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", CONTENT)
def test_content_schemes_ignore_source_padding(scheme):
    """Padding keys are not counted (CoPE) and do not decay (FoX): a padded source encodes alike."""
    torch.manual_seed(0)
    model = randomized_tables(EncoderDecoder(tiny(scheme)))
    src, tgt = torch.randint(3, 13, (1, 5)), torch.randint(3, 13, (1, 4))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("scheme", CONTENT)
def test_a_reordered_cache_continues_the_chosen_rows_as_if_decoded_alone(scheme):
    """Beam search's reorder moves what a content scheme keeps per key with the keys."""
    torch.manual_seed(0)
    model = randomized_tables(EncoderDecoder(tiny(scheme)))
    src, tgt = torch.randint(3, 13, (3, 7)), torch.randint(3, 13, (3, 5))
    index = torch.tensor([1, 1, 2, 0])
    with torch.no_grad():
        cache = model.start_decoding(src)
        model.decode_step(tgt[:, :4], cache)
        cache.reorder(index)
        got = model.decode_step(tgt[index, 4:], cache)
        want = model(src[index], tgt[index])[:, 4:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_fox_cache_keeps_the_cumulative_log_forget_gates_of_every_key():
    torch.manual_seed(0)
    model = DecoderLM(tiny("fox", n_encoder_layers=0)).eval()
    tokens = torch.randint(3, 13, (2, 6))
    with torch.no_grad():
        cache = model.start_decoding()
        model.decode_step(tokens[:, :4], cache)
        model.decode_step(tokens[:, 4:], cache)
        layer = cache.layers[0].self_attn
        x = model.decoder.embed(tokens)
        c = torch.nn.functional.logsigmoid(model.decoder.layers[0].self_attn.inner.relative.gate(x)).cumsum(1)
    assert layer.state.value.shape == (2, 2, 6) and layer.k.shape[-2] == 6
    torch.testing.assert_close(layer.state.value, c.transpose(1, 2))


@pytest.mark.parametrize("scheme", CONTENT)
def test_content_schemes_contribute_through_content_bias_only(scheme):
    module = BUILTIN[scheme](builtin_config(scheme)).attention(8, 2, causal=True)
    assert contract.has_content_bias(module)
    q = torch.randn(1, 2, 3, 8)
    assert module.attention_kwargs(q, q, 0) == {} and module.rotate(q, q, 0) == (q, q)
    assert not any(contract.has_content_bias(cls(builtin_config(name)).attention(8, 2, True) or
                                             contract.RelativePositions())
                   for name, cls in BUILTIN.items() if name not in CONTENT)


# --- the scheme guide's worked example (docs/positions.md) ------------------------------------------


@pytest.fixture(scope="module")
def readme_scheme():
    """The guide's `my_content_schemes.py`, read from the page and imported as that module."""
    import sys
    import types

    import docs_text

    block = docs_text.block("# my_content_schemes.py\n")
    assert block.lang == "python", block
    module = types.ModuleType("my_content_schemes")
    sys.modules[module.__name__] = module
    try:
        exec(compile(block.text, f"{block.page}:my_content_schemes.py", "exec"), module.__dict__)
        yield module
    finally:
        del sys.modules[module.__name__]


def test_readmes_content_scheme_trains_and_decodes_with_a_cache_exactly(readme_scheme):
    torch.manual_seed(0)
    cfg = tiny("none", positions=readme_scheme.GatedAlibiConfig())
    model = EncoderDecoder(cfg)
    src, tokens = torch.randint(3, 13, (2, 7)), torch.randint(3, 13, (2, 9))
    src[1, 5:] = 0
    model(src, tokens).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if n.endswith("positions.gate.weight"))
    model.eval()
    with torch.no_grad():
        cache = model.start_decoding(src)
        steps = torch.cat([model.decode_step(part, cache) for part in tokens.split([4, 1, 1, 3], dim=1)], 1)
        torch.testing.assert_close(steps, model(src, tokens), atol=1e-5, rtol=1e-5)
    assert cache.layers[0].self_attn.state.value.shape == (2, 2, 9)


def test_readmes_content_scheme_is_alibi_over_the_gated_count(readme_scheme):
    """bias_ij = −m_h · Σ_{t between} σ(w_h·x_t + b_h), the tokens after the earlier of i, j up to the later."""
    torch.manual_seed(0)
    rel = readme_scheme.GatedAlibi(6, 2).double()
    x = torch.randn(1, 4, 6, dtype=torch.float64)
    q = torch.zeros(1, 2, 4, 3, dtype=torch.float64)
    with torch.no_grad():
        bias = rel.content_bias(q, q, x, 0, None, KeyState())
        g = torch.sigmoid(rel.gate(x))[0]  # (L, H)
    for h, m in enumerate((0.5, 0.25)):
        for i in range(4):
            for j in range(4):
                count = sum(g[t, h] for t in range(min(i, j) + 1, max(i, j) + 1))
                assert bias[0, h, i, j].item() == pytest.approx(-m * float(count), abs=1e-12)
