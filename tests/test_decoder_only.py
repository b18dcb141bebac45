"""`model.architecture=decoder_only`: every built-in task trains and evaluates as a prefix LM
through the real Lightning path (the README plugin's run is in test_registry.py), its checkpoint
evaluates again, and the key leaves every existing run directory where it was."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.api.registry import available, create_task
from relpos_lab.config import load_config
from relpos_lab.records.rundir import run_directory

from toy_translation import write_toy_files

SYNTHETIC = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {{name: {task}, train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 64,
       eval_size_per_length: 2}}
model: {{architecture: decoder_only}}
trainer: {{max_steps: 4, val_every_n_steps: 4}}
logging: {{root: runs, wandb: {{mode: disabled}}}}
"""
TRANSLATION = """
task: {name: translation, corpus: files, data_dir: data/toy, src_lang: en, tgt_lang: xx,
       subword: {vocab_size: 60}, max_tokens: 400, eval_max_tokens: 800, length_buckets: [1, 10]}
model: {architecture: decoder_only, d_model: 16, n_heads: 2, d_ff: 32, n_decoder_layers: 1,
        positions: {scheme: shaw, max_distance: 8}}
optim: {warmup_steps: 2}
trainer: {accelerator: cpu, max_steps: 4, val_every_n_steps: 4, num_sanity_val_steps: 0,
          enable_progress_bar: false, enable_model_summary: false}
logging: {root: runs, wandb: {mode: disabled}}
"""
SYNTHETIC_TASKS = ("copy", "reverse", "duplicate", "sort", "odds_first")


def train(tmp_path: Path, monkeypatch, text: str, *overrides: str) -> tuple[Path, dict]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(text)
    assert cli.main(["train", "exp.yaml", *overrides]) == 0
    (run_dir,) = [p for p in (tmp_path / "runs" / "exp").iterdir() if p.is_dir()]
    return run_dir, json.loads((run_dir / "results.json").read_text())


def decoder_only_weights(run_dir: Path) -> bool:
    (best,) = (run_dir / "checkpoints").glob("best-*.ckpt")
    keys = torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
    return not any(".encoder." in k for k in keys) and any(k.startswith("model.decoder.") for k in keys)


def test_the_tests_cover_every_built_in_task():
    assert set(available()) >= {*SYNTHETIC_TASKS, "translation"}


@pytest.mark.parametrize("task", SYNTHETIC_TASKS)
def test_every_synthetic_task_trains_and_evaluates_decoder_only(task, tmp_path, monkeypatch):
    run_dir, data = train(tmp_path, monkeypatch, SYNTHETIC.format(task=task))
    assert decoder_only_weights(run_dir)
    assert sorted(data["by_length"]["test"], key=int) == [str(n) for n in range(1, 7)]
    for key in ("valid/exact_match", "test/token_accuracy", "test/exact_match_ood", "test/loss"):
        assert key in data["metrics"]


def test_translation_trains_and_evaluates_decoder_only(tmp_path, monkeypatch):
    write_toy_files(tmp_path / "data" / "toy", {"train": 300, "valid": 8, "test": 8})
    run_dir, data = train(tmp_path, monkeypatch, TRANSLATION)
    assert decoder_only_weights(run_dir)
    assert {"test/bleu", "test/chrf", "valid/bleu"} <= set(data["metrics"])
    hyps = (run_dir / "outputs" / "test.hyp").read_text().splitlines()
    assert len(hyps) == 8
    checkpoint = str(run_dir / data["checkpoint"])  # `translate` decodes as evaluation did
    assert cli.main(["translate", checkpoint, "--input", str(run_dir / "outputs" / "test.src"),
                     "--output", "hyp.txt"]) == 0
    assert (tmp_path / "hyp.txt").read_text().splitlines() == hyps


@pytest.mark.parametrize("options", [["model.bidirectional_prefix=true"], ["task.loss_on_source=true"],
                                     ["task.decoding.beam_size=3"]])
def test_decoder_only_options_train_and_a_checkpoint_evaluates_again(options, tmp_path, monkeypatch):
    run_dir, data = train(tmp_path, monkeypatch, SYNTHETIC.format(task="reverse"), *options)
    (best,) = (run_dir / "checkpoints").glob("best-*.ckpt")
    assert cli.main(["eval", str(best), "--split", "test", "--output", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    assert again["metrics"]["test/exact_match"] == data["metrics"]["test/exact_match"]
    assert again["metrics"]["test/loss"] == pytest.approx(data["metrics"]["test/loss"])


def test_loss_on_source_adds_the_source_tokens_to_the_objective(tmp_path):
    cfg = load_config(write(tmp_path, SYNTHETIC.format(task="copy")), ["task.loss_on_source=true"])
    task = create_task(OmegaConf.to_object(cfg.task), seed=0)
    model = task.build_model(OmegaConf.to_object(cfg.model))
    batch = task.collate(task.dataset("valid")[:6])
    with_source = task.loss(model, batch, 0.0)
    task.cfg.loss_on_source = False
    target_only = task.loss(model, batch, 0.0)
    n_source = int((batch["src"] != 0).sum())  # each source token predicts the next one or <sep>
    assert with_source.n_tokens == target_only.n_tokens + n_source


def test_token_batches_count_a_decoder_only_example_as_one_sequence(tmp_path):
    cfg = load_config(write(tmp_path, SYNTHETIC.format(task="duplicate")))
    task = create_task(OmegaConf.to_object(cfg.task), seed=0)
    example = task.dataset("valid")[-1]  # source 4, target 8
    assert task.num_tokens(example) == 9  # encoder-decoder: the longer side, target + EOS
    task.build_model(OmegaConf.to_object(cfg.model))
    assert task.num_tokens(example) == 4 + 1 + 8  # source <sep> target (the <eos> is only predicted)


@pytest.mark.parametrize("overrides, message", [
    (["model.architecture=decoder_only", "model.bidirectional_prefix=true", "task.loss_on_source=true"],
     "task.loss_on_source=true needs model.architecture=decoder_only with a causal prefix"),
    (["task.loss_on_source=true"], "task.loss_on_source=true needs model.architecture=decoder_only"),
    (["model.bidirectional_prefix=true"], "model.bidirectional_prefix=true needs model.architecture=decoder_only"),
    (["model.architecture=decoder-only"], "did you mean 'decoder_only'?"),
])
def test_impossible_combinations_are_one_line(overrides, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "reverse_shaw", "debug", "logging.wandb.mode=disabled", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: ") and message in err, err


def test_the_new_keys_at_their_defaults_keep_the_run_directory(tmp_path):
    path = write(tmp_path, SYNTHETIC.format(task="reverse").replace("architecture: decoder_only", "d_model: 16"))
    base = run_directory(load_config(path))
    same = ["model.architecture=encoder_decoder", "model.bidirectional_prefix=false", "task.loss_on_source=false"]
    assert run_directory(load_config(path, same)) == base
    for changed in ("model.architecture=decoder_only", "task.loss_on_source=true"):
        assert run_directory(load_config(path, [changed, "model.architecture=decoder_only"])) != base


def test_the_kazemnejad_protocol_is_decoder_only():
    cfg = load_config("kazemnejad2023_copy")
    assert cfg.model.architecture == "decoder_only" and cfg.task.name == "copy"
    assert list(cfg.task.train_lengths) == [1, 20] and list(cfg.task.test_lengths) == [1, 40]


def write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "exp.yaml").write_text(text)
    return tmp_path / "exp.yaml"
