"""The draw hook of position schemes (RelativePositions.draw): what `relpos-lab inspect` plots is
the scheme's own numbers, at the right offsets."""
import pytest
import torch

from relpos_lab.core.positions import (
    AlibiConfig,
    CopeConfig,
    DapeConfig,
    FireConfig,
    FoxConfig,
    RelativePositions,
    ShawConfig,
    T5BiasConfig,
    TransformerXLConfig,
    position_scheme_of,
)


def _layer(cfg, causal=False):
    return position_scheme_of(cfg).attention(8, 4, causal=causal)


def test_shaw_draws_each_tables_norms_and_cosines_at_its_offsets():
    layer = _layer(ShawConfig(max_distance=3))
    drawn = layer.draw(10)
    assert set(drawn) == {"key_norm", "key_cosine", "value_norm", "value_cosine"}
    assert drawn["key_norm"].x.tolist() == [-3, -2, -1, 0, 1, 2, 3]  # the table's rows, not max_offset
    torch.testing.assert_close(drawn["value_norm"].values[0], layer.rel_v.detach().norm(dim=-1))
    cosine = drawn["key_cosine"].values
    assert cosine.shape == (7, 7) and torch.allclose(cosine.diagonal(), torch.ones(7))


def test_asymmetric_per_head_shaw_draws_its_own_rows_per_head():
    drawn = _layer(ShawConfig(max_distance=3, max_distance_left=1, per_head=True, use_values=False)).draw(5)
    assert set(drawn) == {"key_norm", "key_cosine"}
    assert drawn["key_norm"].x.tolist() == [-1, 0, 1, 2, 3] and drawn["key_norm"].values.shape == (4, 5)


def test_alibi_draws_its_slopes_and_the_bias_they_give():
    layer = _layer(AlibiConfig())
    drawn = layer.draw(5)
    torch.testing.assert_close(drawn["slopes"].values, layer.slopes)
    d = torch.arange(-5, 6)
    torch.testing.assert_close(drawn["bias"].values, -layer.slopes[:, None] * d.abs().float()[None])


@pytest.mark.parametrize("causal", [False, True])
def test_t5_draws_the_learned_bias_of_each_offsets_bucket(causal):
    layer = _layer(T5BiasConfig(), causal)
    drawn = layer.draw(40)["bias"]
    d = torch.arange(-40, 41)
    torch.testing.assert_close(drawn.values, layer.bias.weight.detach()[layer.bucket(d)].T)


@pytest.mark.parametrize("cfg", [FireConfig(), TransformerXLConfig()])
def test_bias_schemes_draw_what_their_attention_adds_for_distance_alone(cfg):
    layer = _layer(cfg)
    drawn = layer.draw(6)["bias"]
    assert drawn.kind == "curves" and drawn.values.shape == (4, 13) and drawn.x.tolist() == list(range(-6, 7))
    q, k = torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 13, 2)  # FIRE reads shapes only; XL: zero content
    if isinstance(cfg, TransformerXLConfig):
        q, k = torch.zeros(1, 4, 1, 8), torch.zeros(1, 4, 13, 8)
    with torch.no_grad():
        bias = layer.attention_kwargs(q, k, 6)["attn_bias"]
    torch.testing.assert_close(drawn.values, bias.reshape(4, 13))


def test_schemes_without_a_drawing_draw_nothing():
    assert RelativePositions().draw(4) == {}


@pytest.mark.parametrize("causal", [False, True])
def test_cope_draws_its_position_embeddings_by_contextual_position(causal):
    """Norms and cosines of e[p], p = 0..npos_max−1; a bidirectional layer also draws E⁺."""
    layer = _layer(CopeConfig(cope_npos_max=5), causal)
    with torch.no_grad():
        for table in layer.parameters():
            table.normal_()
    drawn = layer.draw(10)
    assert set(drawn) == ({"past_norm", "past_cosine"} | (set() if causal else {"future_norm", "future_cosine"}))
    assert drawn["past_norm"].x.tolist() == [0, 1, 2, 3, 4]
    torch.testing.assert_close(drawn["past_norm"].values[0], layer.past.detach().norm(dim=0))
    assert torch.allclose(drawn["past_cosine"].values.diagonal(), torch.ones(5))


def test_fox_draws_its_content_free_gate_and_the_decay_it_gives():
    layer = _layer(FoxConfig(fox_bias_init=2.0))
    drawn = layer.draw(3)
    gate = torch.sigmoid(torch.tensor(2.0))
    torch.testing.assert_close(drawn["gate"].values, gate.expand(4))
    torch.testing.assert_close(drawn["bias"].values[0], torch.tensor([3, 2, 1, 0, 1, 2, 3]) * gate.log())
    assert drawn["gate_weight"].values.shape == (4,)


@pytest.mark.parametrize("base", ["kerple", "alibi"])
def test_dape_draws_its_base_bias_and_what_the_mlp_makes_of_it_at_zero_logits(base):
    layer = _layer(DapeConfig(dape_base=base))
    drawn = layer.draw(5)
    d = torch.arange(-5, 6)
    assert drawn["base"].x.tolist() == d.tolist() and drawn["bias"].values.shape == (4, 11)
    if base == "alibi":
        torch.testing.assert_close(drawn["base"].values, -layer.slopes[:, None] * d.abs().float()[None])
    with torch.no_grad():
        q, k = torch.zeros(1, 4, 1, 2), torch.zeros(1, 4, 11, 2)
        bias = layer.content_bias(q, k, None, 5, None, None)
    torch.testing.assert_close(drawn["bias"].values, bias[0, :, 0])


@pytest.mark.parametrize("cfg", [CopeConfig(), FoxConfig(), DapeConfig()])
def test_content_schemes_drawings_plot(cfg, tmp_path):
    from relpos_lab.records.inspect_plots import plot_drawings

    assert plot_drawings(_layer(cfg).draw(4), tmp_path / "drawing.png", "content scheme").is_file()
