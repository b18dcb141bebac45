"""`relpos-lab inspect` for every task and scheme: an `lm` checkpoint inspected at
its evaluation lengths (at the end of training and by the command), a content-dependent scheme's
bias drawn on a sample batch (mean and spread by offset, exact against each example alone, padding
left out), and one line for a scheme that draws nothing."""
from __future__ import annotations

import json
import math

import pytest
import torch

from relpos_lab import cli
from relpos_lab.api import Drawing, KeyState
from relpos_lab.core.positions import CopeConfig, DapeConfig, FoxConfig
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig, MultiHeadAttention
from relpos_lab.records.wandb_offline import read_runs
from relpos_lab.training import inspect as inspection

from test_inspect import _Stub
from test_lm_train import TINY, run_cli

LENGTHS = (16, 32, 64)  # TINY's task.eval_lengths; it trains on windows of 16
ANY_SCHEME = [arg for arg in TINY if not arg.startswith("model.positions.")]  # TINY less Shaw's k


# --- the drawing of a content bias, exact -----------------------------------------------------


def test_by_offset_is_the_mean_and_standard_deviation_over_the_counted_pairs_at_each_offset():
    """Against a loop over every pair: queries from position 3 on (a cache's query_offset), a
    visibility that differs per example and is shared by the heads, offsets beyond ±max_offset and
    offsets with no counted pair left out."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(3, 2, 4, 7, generator=g, dtype=torch.float64)
    visible = torch.rand(3, 1, 4, 7, generator=g) < 0.6
    visible[:, :, :, 6] = False  # nothing at offsets 6 - i > 2
    drawn = Drawing.by_offset(values, visible, 3, 3, "y", title="t")
    pairs: dict = {}
    for b in range(3):
        for i in range(4):
            for j in range(7):
                if visible[b, 0, i, j] and abs(j - (3 + i)) <= 3:
                    pairs.setdefault(j - (3 + i), []).append(values[b, :, i, j])
    offsets = sorted(pairs)
    assert drawn.kind == "curves" and drawn.title == "t" and drawn.x.tolist() == offsets
    stacked = [torch.stack(pairs[d]) for d in offsets]
    torch.testing.assert_close(drawn.values, torch.stack([s.mean(0) for s in stacked], -1).float())
    torch.testing.assert_close(drawn.spread, torch.stack([s.std(0, unbiased=False) for s in stacked], -1).float())


@pytest.mark.parametrize("positions", [CopeConfig(cope_npos_max=6), FoxConfig(), DapeConfig()],
                         ids=["cope", "fox", "dape"])
def test_a_content_scheme_draws_its_bias_over_the_real_pairs_of_a_padded_batch(positions):
    """What inspect draws (the probe's arguments, the module's draw_content) on a batch with padded
    sources and targets equals the bias computed on each example alone, pooled by offset: padded
    queries and keys are not counted, in the encoder and in the causal decoder."""
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=12, tgt_vocab_size=12, d_model=8, n_heads=2, d_ff=16, n_encoder_layers=1,
                      n_decoder_layers=1, dropout=0.0, attention_dropout=0.0, positions=positions)
    model = EncoderDecoder(cfg).double().eval()
    with torch.no_grad():
        for p in model.parameters():  # CoPE's tables start at zero: a bias worth drawing
            p.add_(0.5 * torch.randn_like(p))
    examples = [(torch.tensor([3, 4, 5, 6, 7, 8]), torch.tensor([1, 3, 4, 5, 9])),
                (torch.tensor([3, 4, 5]), torch.tensor([1, 3]))]
    batch = inspection._measure(model, _Stub(), examples, 2, keep_content=True)
    drawn = inspection._content_drawings(model, batch, max_offset=4)
    modules = {inspection.site_of(name): m.relative for name, m in model.named_modules()
               if isinstance(m, MultiHeadAttention) and m.content}
    assert set(modules) == {("encoder_self", 0), ("decoder_self", 0)}
    for kind in ("encoder_self", "decoder_self"):
        panel = drawn[kind][0]["content_bias"]
        pairs: dict = {}
        for example in examples:
            alone = inspection._measure(model, _Stub(), [example], 1, keep_content=True)
            q, k, x, offset, visible = alone.content[(kind, 0)]
            bias = modules[(kind, 0)].content_bias(q, k, x, offset, visible, KeyState())
            lq, lk = q.shape[-2], k.shape[-2]
            bias = bias.expand(1, 2, lq, lk)
            seen = (torch.ones(lq, lk, dtype=torch.bool) if visible is None
                    else torch.broadcast_to(visible, (1, 1, lq, lk))[0, 0])
            for i in range(lq):
                for j in range(lk):
                    if seen[i, j] and abs(j - i) <= 4:
                        pairs.setdefault(j - i, []).append(bias[0, :, i, j])
        offsets = sorted(pairs)
        assert panel.x.tolist() == offsets and (kind == "encoder_self") == (max(offsets) == 4)
        stacked = [torch.stack(pairs[d]) for d in offsets]
        torch.testing.assert_close(panel.values, torch.stack([s.mean(0) for s in stacked], -1).float())
        torch.testing.assert_close(panel.spread, torch.stack([s.std(0, unbiased=False) for s in stacked], -1).float())
        assert panel.spread.max() > 0


# --- tiny lm runs through the real CLI ----------------------------------------------------------


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("lm-data")  # one subword model and token cache for the runs here


def _train(tmp_path_factory, data_dir, name: str, *extra: str):
    root = tmp_path_factory.mktemp(f"lm-{name}")
    out = run_cli("train", *ANY_SCHEME, f"task.data_dir={data_dir}", *extra, cwd=root)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in (root / "runs" / "lm_builtin").iterdir() if p.is_dir()]
    return run_dir, out.stdout


@pytest.fixture(scope="module")
def shaw_lm(tmp_path_factory, data_dir):
    """Inspected at the end of training (the debug overlay turns that off; here it is on)."""
    return _train(tmp_path_factory, data_dir, "shaw", "model.positions.max_distance=4", "logging.inspect=true")


@pytest.fixture(scope="module")
def cope_lm(tmp_path_factory, data_dir):
    return _train(tmp_path_factory, data_dir, "cope", "model.positions.scheme=cope")


def test_an_lm_run_is_inspected_at_every_evaluation_length_when_it_finishes(shaw_lm):
    run_dir, stdout = shaw_lm
    assert "inspect: 5 figures in" in stdout
    assert sorted(p.name for p in (run_dir / "plots" / "inspect").glob("*.png")) == [
        "attention_decoder_self.png", "by_length_decoder_self.png", "example_decoder_self_layer0.png",
        "lines_decoder_self_layer0.png", "scheme_decoder_self_layer0.png"]
    numbers = json.loads((run_dir / "inspect.json").read_text())
    assert numbers["scheme"] == "shaw k=4" and list(numbers["sets"]) == ["valid", *(f"length {n}" for n in LENGTHS)]
    for length in LENGTHS:
        entry = numbers["sets"][f"length {length}"]
        assert entry["split"] == "valid" and entry["examples"] > 0
        assert entry["in_training_range"] == (length <= 16)
        (kind,) = entry["attention"]  # a decoder-only language model: causal self-attention only
        a = entry["attention"][kind]
        assert kind == "decoder_self" and a["offsets"] == list(range(1 - length, length))
        assert a["query_rows"] == entry["examples"] * length  # every window's every token
        for head in a["mass"][0]:
            assert sum(head) == pytest.approx(1.0, abs=1e-4)
            assert max(head[length:]) == 0.0 and head[0] > 0  # nothing ahead; the first key reached
        assert a["clipped"]["max_distance"] == 4
    assert set(numbers["drawings"]["decoder_self"]["0"]) == {"key_norm", "key_cosine", "value_norm", "value_cosine"}
    assert "content" not in numbers and "not_drawn" not in numbers


def test_the_inspect_command_takes_an_lm_checkpoint_and_its_lengths(shaw_lm, capsys, tmp_path):
    run_dir, _ = shaw_lm
    assert cli.main(["inspect", str(run_dir / "checkpoints" / "last.ckpt"), "--lengths", "32",
                     "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("inspect: 5 figures in")
    numbers = json.loads((tmp_path / "inspect.json").read_text())
    assert list(numbers["sets"]) == ["valid", "length 32"] and numbers["sets"]["length 32"]["examples"] > 0


def test_relpos_lab_inspect_draws_a_content_schemes_bias_on_an_lm_checkpoint(cope_lm):
    """The command as a user runs it: CoPE's gated counts and its bias, mean ± std by offset on a
    batch of the longest validation windows, in inspect.json, a figure and the run's W&B run."""
    run_dir, _ = cope_lm
    out = run_cli("inspect", str(run_dir / "checkpoints" / "last.ckpt"), cwd=run_dir)
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stdout.startswith("inspect: 6 figures in") and out.stdout.count("\n") == 1
    assert (run_dir / "plots" / "inspect" / "content_decoder_self_layer0.png").is_file()
    numbers = json.loads((run_dir / "inspect.json").read_text())
    content = numbers["content"]
    assert content["split"] == "valid" and content["examples"] > 1 and max(content["lengths"]) == 64
    assert set(content["lengths"]) <= set(LENGTHS)
    panels = content["drawings"]["decoder_self"]["0"]
    assert set(panels) == {"positions", "content_bias"}
    for panel in panels.values():
        assert panel["kind"] == "curves" and panel["x"] == list(range(-63, 1))  # causal: keys up to the query
        assert len(panel["values"]) == len(panel["spread"]) == 2  # heads
        assert all(len(row) == 64 and all(math.isfinite(v) for v in row) for row in panel["values"])
        assert all(v >= 0 for row in panel["spread"] for v in row)
    for p in panels["positions"]["values"]:  # p_ij = Σ_{t=j..i} g_it: i − j + 1 gates in (0, 1)
        assert 0 < p[-1] < 1 and p[-1] < p[-16] < p[0] <= 63
        assert all(0 <= v <= 1 - d for v, d in zip(p, panels["positions"]["x"]))
    assert set(numbers["drawings"]["decoder_self"]["0"]) == {"past_norm", "past_cosine"}  # draw() beside it
    (attempts,) = read_runs(run_dir / "wandb").values()
    logged = {key: value for row in attempts[-1].history for key, value in row.items()}
    assert logged["inspect/content_decoder_self_layer0"]["_type"] == "image-file"


def test_a_scheme_that_draws_nothing_says_so_in_one_line(tmp_path_factory, data_dir, capsys, tmp_path):
    run_dir, _ = _train(tmp_path_factory, data_dir, "sinusoidal", "model.positions.scheme=sinusoidal")
    assert cli.main(["inspect", str(run_dir / "checkpoints" / "last.ckpt"), "--out", str(tmp_path)]) == 0
    note, summary = capsys.readouterr().out.splitlines()
    assert note == ("inspect: position scheme 'sinusoidal' (relpos_lab.core.positions.absolute.Sinusoidal) draws "
                    "nothing: it has no module in the attention layers to draw; attention by offset is measured "
                    "all the same")
    assert summary.startswith("inspect: 4 figures in")
    numbers = json.loads((tmp_path / "inspect.json").read_text())
    assert numbers["not_drawn"] == note and numbers["drawings"] == {} and "content" not in numbers
    assert list(numbers["sets"]) == ["valid", *(f"length {n}" for n in LENGTHS)]
    assert (not list((tmp_path / "plots" / "inspect").glob("scheme_*"))
            and not list((tmp_path / "plots" / "inspect").glob("content_*")))
