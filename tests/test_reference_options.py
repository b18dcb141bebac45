"""Options that reproduce the DeepMind reference code of Delétang et al. and Ruoss et al. (issue 56):
what each changes in a model, and where it is refused. Their values against the reference's own
are tests/test_golden.py's (positions_deepmind.json)."""
from __future__ import annotations

import pytest
import torch

from relpos_lab.api import EncoderOnly, builtin_config
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.config.load import load_config
from relpos_lab.core.attention import relative_attention
from relpos_lab.core.positions import Alibi, AlibiConfig
from relpos_lab.launch.sweep import load_sweep


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


def test_the_delétang_sweep_turns_both_on_and_the_ruoss_sweep_only_alibis():
    """NNCH counts sin/cos from the end; RPE's sin/cos ascends; both codes' encoder ALiBi has the offset."""
    for name, from_end in [("deletang2023_paper", True), ("ruoss2023_paper", False)]:
        sweep = load_sweep(name, only=0)
        cells = {}
        for point in sweep.points:
            cells.setdefault(point.labels["scheme"], point.index)
        for label, index in cells.items():
            positions = sweep.config(index).model.positions
            if positions.scheme == "sinusoidal":
                assert positions.count_from_end is (from_end and "randomized" not in label), (name, label)
            if positions.scheme == "alibi":
                assert positions.left_offset == 0.5, (name, label)
    assert load_config("deletang2023_paper", ["model.positions.scheme=alibi"]).model.positions.left_offset == 0.0
