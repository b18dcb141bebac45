"""`relpos-lab inspect` and the end-of-training inspection: exact masses through a whole
model whose attention is known, every figure and number of a trained tiny run, the images in its
offline W&B run, identical metrics with inspection on and off, one-line errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch.nn.utils.rnn import pad_sequence

from relpos_lab import cli
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import ShawConfig
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig
from relpos_lab.records.wandb_offline import read_runs
from relpos_lab.training import inspect as inspection

from test_train import TINY, run_cli, run_dir_of

KINDS = ("encoder_self", "decoder_self", "cross")
FIGURES = sorted([f"{p}_{k}.png" for p in ("attention", "by_length") for k in KINDS]
                 + [f"{p}_{k}_layer0.png" for p in ("lines", "example") for k in KINDS]
                 + ["scheme_encoder_self_layer0.png", "scheme_decoder_self_layer0.png"])


class _Stub:
    """The two Task verbs inspection uses, over (src, tgt) pairs of ids (pad 0)."""

    splits = ("valid",)

    def collate(self, examples):
        return {"src": pad_sequence([s for s, _ in examples], batch_first=True),
                "tgt_in": pad_sequence([t for _, t in examples], batch_first=True)}

    def loss(self, model, batch, label_smoothing):
        logits = model(batch["src"], batch["tgt_in"])
        return label_smoothed_loss(logits, batch["tgt_in"], smoothing=0.0, ignore_index=0)


def test_a_model_whose_encoder_looks_one_token_left_gives_exact_masses():
    """Encoder self-attention built so every query puts all its mass on offset -1 (the first
    query, with no key there, spreads it over its real keys); padding rows and keys excluded."""
    cfg = ModelConfig(src_vocab_size=8, tgt_vocab_size=8, d_model=4, n_heads=1, d_ff=4, n_encoder_layers=1,
                      n_decoder_layers=1, dropout=0.0, attention_dropout=0.0,
                      positions=ShawConfig(max_distance=2, use_values=False))
    model = EncoderDecoder(cfg).eval()
    attn = model.encoder.layers[0].self_attn.inner
    with torch.no_grad():
        for proj in (attn.q_proj, attn.k_proj):
            proj.weight.zero_()
            proj.bias.zero_()
        attn.q_proj.bias[0] = 1.0
        attn.relative.rel_k.zero_()
        attn.relative.rel_k[2 - 1, 0] = 1e4  # the row of offset -1
    examples = [(torch.tensor([3, 4, 5, 6, 7]), torch.tensor([1, 3])), (torch.tensor([3, 4, 5]), torch.tensor([1, 3]))]
    probe = inspection._measure(model, _Stub(), examples, batch_size=2)
    offsets, mass = probe.mean_by_offset(("encoder_self", 0))
    expected = torch.zeros(len(offsets), dtype=torch.float64)
    expected[offsets.index(-1)] = (4 + 2) / 8
    for n in (5, 3):
        for j in range(n):
            expected[offsets.index(j)] += 1 / n / 8
    assert probe.rows[("encoder_self", 0)] == 8
    torch.testing.assert_close(mass[0], expected, rtol=0, atol=1e-6)
    assert probe.example[("encoder_self", 0)].shape == (1, 5, 5)
    for kind in ("decoder_self", "cross"):
        assert probe.rows[(kind, 0)] == 4 and probe.mean_by_offset((kind, 0))[1].sum().item() == pytest.approx(1.0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run trained twice: inspection on (the default; explicit, so that the debug
    overlay may turn it off for speed) and off."""
    out = {}
    for name, extra in (("on", ["logging.inspect=true"]), ("off", ["logging.inspect=false"])):
        root = tmp_path_factory.mktemp(f"inspect_{name}")
        (root / "tiny.yaml").write_text(TINY)
        done = run_cli("train", "tiny.yaml", *extra, cwd=root)
        assert done.returncode == 0, done.stderr[-4000:]
        out[name] = (root, run_dir_of(root), done.stdout)
    return out


def test_inspection_on_and_off_give_identical_metrics(runs):
    (_, on, _), (_, off, _) = runs["on"], runs["off"]
    assert on.name == off.name  # logging.inspect does not change the run directory
    results = [json.loads((d / "results.json").read_text()) for d in (on, off)]
    assert results[0]["metrics"] == results[1]["metrics"] and results[0]["by_length"] == results[1]["by_length"]
    assert (on / "inspect.json").is_file() and not (off / "inspect.json").exists()
    assert not (off / "plots" / "inspect").exists()


def test_training_writes_every_figure_and_the_numbers(runs):
    _, run_dir, stdout = runs["on"]
    assert sorted(p.name for p in (run_dir / "plots" / "inspect").glob("*.png")) == FIGURES
    assert "inspect: 14 figures in" in stdout
    numbers = json.loads((run_dir / "inspect.json").read_text())
    assert numbers["scheme"] == "shaw k=4" and numbers["run"] == run_dir.name
    assert list(numbers["sets"]) == ["valid", "length 4", "length 6"]  # longest training and test lengths
    assert numbers["sets"]["length 4"]["in_training_range"] and not numbers["sets"]["length 6"]["in_training_range"]
    assert numbers["sets"]["length 6"]["split"] == "test" and numbers["sets"]["length 6"]["examples"] == 4
    for entry in numbers["sets"].values():
        for kind in KINDS:
            a = entry["attention"][kind]
            for head in a["mass"][0]:
                assert sum(head) == pytest.approx(1.0, abs=1e-4)  # each real query row's mass is 1
            if kind != "cross":
                assert a["clipped"]["max_distance"] == 4
                assert [sum(h) for h in a["clipped"]["mass"][0]] == pytest.approx([1.0, 1.0], abs=1e-4)
            else:
                assert "clipped" not in a
    drawn = numbers["drawings"]["encoder_self"]["0"]
    assert set(drawn) == {"key_norm", "key_cosine", "value_norm", "value_cosine"}
    assert drawn["key_norm"]["x"] == list(range(-4, 5))


def test_the_offline_wandb_run_holds_the_images(runs):
    _, run_dir, _ = runs["on"]
    (attempts,) = read_runs(run_dir / "wandb").values()
    logged = {key: value for run in attempts for row in run.history for key, value in row.items()
              if key.startswith("inspect/")}
    for figure in FIGURES:
        assert logged[f"inspect/{Path(figure).stem}"]["_type"] == "image-file", figure
    assert logged["inspect/attention_by_offset"]["_type"] == "table-file"


def test_the_inspect_command_writes_where_asked(runs, capsys, tmp_path):
    _, run_dir, _ = runs["off"]
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    assert cli.main(["inspect", str(checkpoint), "--lengths", "2", "5", "--out", str(tmp_path / "x")]) == 0
    numbers = json.loads((tmp_path / "x" / "inspect.json").read_text())
    assert list(numbers["sets"]) == ["valid", "length 2", "length 5"]
    assert numbers["sets"]["length 5"]["split"] == "test"
    assert (tmp_path / "x" / "plots" / "inspect" / "by_length_cross.png").is_file()
    assert "inspect: 14 figures in" in capsys.readouterr().out


@pytest.mark.parametrize("args, expected", [
    (["--split", "vlaid"], "has no split 'vlaid'; did you mean 'valid'?"),
    (["--lengths", "9"], "no example of length 9 in split 'valid' (its lengths: 1–4) or in 'test'"),
])
def test_inspect_errors_are_one_line(runs, capsys, tmp_path, args, expected):
    _, run_dir, _ = runs["off"]
    assert cli.main(["inspect", str(run_dir / "checkpoints" / "last.ckpt"), *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_inspecting_a_file_that_is_no_checkpoint_is_one_line(tmp_path, capsys):
    (tmp_path / "x.ckpt").write_text("hello")
    assert cli.main(["inspect", str(tmp_path / "x.ckpt")]) == 2
    err = capsys.readouterr().err
    assert "is not a checkpoint torch can read" in err and err.count("\n") == 1


def test_lengths_beyond_learned_positions_are_one_line(tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from relpos_lab.api import UserError, registry
    from relpos_lab.config import load_config

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    cfg = load_config("tiny.yaml", ["model.positions.scheme=learned", "model.positions.max_len=6"])
    task = registry.create_task(OmegaConf.to_object(cfg.task), seed=0)
    model = task.build_model(OmegaConf.to_object(cfg.model))
    with pytest.raises(UserError, match=r"beyond model.positions.max_len=6.*\(--lengths\)"):
        inspection.inspect_model(model, task, cfg, tmp_path, lengths=[6])


def test_inspecting_a_run_again_continues_its_wandb_run_without_cutting_it(runs, capsys):
    """The command's W&B attempt continues the run after its last row: the merged history keeps
    every training row and gains the new images at the checkpoint's step, numbered after the rows
    W&B holds (offline, W&B itself would number them from 0 again)."""
    from relpos_lab.records.wandb_offline import history

    _, run_dir, _ = runs["on"]
    (before,) = read_runs(run_dir / "wandb").values()
    trained = [row for row in history(before) if "train/loss" in row]
    assert cli.main(["inspect", str(run_dir / "checkpoints" / "last.ckpt"), "--lengths", "3"]) == 0
    (attempts,) = read_runs(run_dir / "wandb").values()
    assert len(attempts) == len(before) + 1 and attempts[-1].branch_point is None
    assert attempts[-1].history[0]["_step"] == max(row["_step"] for run in before for row in run.history) + 1
    merged = history(attempts)
    assert [row for row in merged if "train/loss" in row] == trained
    images = [row for row in attempts[-1].history if "inspect/by_length_encoder_self" in row]
    assert images and images[0]["trainer/global_step"] == 30
    assert json.loads((run_dir / "inspect.json").read_text())["sets"].keys() == {"valid", "length 3"}


def test_inspection_is_on_by_default_and_outside_the_run_directory_hash():
    from relpos_lab.config import load_config
    from relpos_lab.records.rundir import run_directory

    cfg = load_config("reverse_shaw", [])
    assert cfg.logging.inspect is True
    assert run_directory(load_config("reverse_shaw", ["logging.inspect=false"])) == run_directory(cfg)
