"""The last training step is validated, the best checkpoint is chosen over every validated step
including it, results.json names the checkpoint it evaluated, and metrics.csv logs each validation
at the step of the checkpoint it validates.

Real Lightning fits on CPU, in process, from the debug overlay: a few seconds each.
"""
from __future__ import annotations

import csv
import json
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException

from relpos_lab.config import load_config
from relpos_lab.records.wandb_offline import find_run_files, history, read_runs
from relpos_lab.training import experiment
from relpos_lab.training.interrupt import InterruptCheckpoint

# The shipped reverse experiment made tiny by the shipped debug overlay, on short strings; a high
# learning rate so that exact match moves within 20 steps.
TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 3], valid_lengths: [1, 3], test_lengths: [1, 4], train_size: 256, eval_size_per_length: 8}
model: {dropout: 0.0, positions: {max_distance: 4}}
optim: {lr: 0.01}
logging: {root: runs, wandb: {mode: disabled}}
"""


@pytest.fixture
def root(tmp_path, monkeypatch):
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    return tmp_path


def train(*overrides: str, echo=lambda _: None):
    return experiment.train(load_config("tiny.yaml", list(overrides)), echo=echo)


def step_of(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def valid_rows(run_dir: Path, key: str = "valid/exact_match") -> dict[int, float]:
    """step -> value of `key` in metrics.csv; a step logged twice fails the test."""
    rows: dict[int, float] = {}
    with open(run_dir / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            if row.get(key):
                assert int(row["step"]) not in rows, f"{key} logged twice at step {row['step']}"
                rows[int(row["step"])] = float(row[key])
    return rows


def best_of(rows: dict[int, float]) -> int:
    """The step ModelCheckpoint(mode="max", save_top_k=1) keeps: the first of the highest."""
    return max(sorted(rows), key=lambda s: (rows[s], -s))


def test_the_last_step_is_validated_and_the_best_is_chosen_over_every_validated_step(root):
    summary = train("trainer.max_steps=20", "trainer.val_every_n_steps=15")
    run_dir = summary.run_dir
    rows = valid_rows(run_dir)
    assert sorted(rows) == [15, 20]  # the last step too, each at the step of its checkpoint (not 14, 19)
    results = json.loads((run_dir / "results.json").read_text())
    best = best_of(rows)
    assert results["checkpoint"] == f"checkpoints/best-step={best}.ckpt"
    assert results["checkpoint_step"] == best and results["checkpoint_choice"] == "best"
    assert step_of(run_dir / results["checkpoint"]) == best
    # the numbers in results.json are the evaluated checkpoint's: its validation, evaluated again
    assert results["metrics"]["valid/exact_match"] == pytest.approx(rows[best], abs=1e-6)
    assert (summary.checkpoint.resolve() == (run_dir / results["checkpoint"]).resolve()
            and summary.checkpoint_step == best)
    assert results["global_step"] == 20 and step_of(run_dir / "checkpoints" / "last.ckpt") == 20


def test_the_last_step_can_be_the_best(root):
    """At this seed and learning rate the last step (25) beats steps 10 and 20: the final validation decides."""
    summary = train("trainer.max_steps=25", "trainer.val_every_n_steps=10", "optim.lr=0.02", "seed=2")
    rows = valid_rows(summary.run_dir)
    assert sorted(rows) == [10, 20, 25]
    assert rows[25] > max(rows[10], rows[20]), rows  # the premise of this test
    results = json.loads((summary.run_dir / "results.json").read_text())
    assert results["checkpoint"] == "checkpoints/best-step=25.ckpt" and results["checkpoint_step"] == 25
    assert [p.name for p in (summary.run_dir / "checkpoints").glob("best-step=*.ckpt")] == ["best-step=25.ckpt"]


def test_an_interval_longer_than_the_run_validates_once_at_the_last_step(root):
    summary = train("trainer.max_steps=8", "trainer.val_every_n_steps=1000")
    assert sorted(valid_rows(summary.run_dir)) == [8]
    results = json.loads((summary.run_dir / "results.json").read_text())
    assert results["checkpoint"] == "checkpoints/best-step=8.ckpt" and results["checkpoint_step"] == 8


def test_evaluate_last_evaluates_last_ckpt(root):
    lines: list[str] = []
    summary = train("trainer.max_steps=20", "trainer.val_every_n_steps=15", "trainer.evaluate=last",
                    echo=lines.append)
    results = json.loads((summary.run_dir / "results.json").read_text())
    assert results["checkpoint"] == "checkpoints/last.ckpt"
    assert results["checkpoint_step"] == 20 and results["checkpoint_choice"] == "last"
    assert results["metrics"]["valid/exact_match"] == pytest.approx(valid_rows(summary.run_dir)[20], abs=1e-6)
    assert summary.checkpoint_step == 20 and summary.checkpoint_choice == "last"


def test_the_default_choice_keeps_existing_run_directories(root):
    from relpos_lab.records.rundir import run_directory

    default = run_directory(load_config("tiny.yaml", []))
    assert run_directory(load_config("tiny.yaml", ["trainer.evaluate=best"])) == default
    assert run_directory(load_config("tiny.yaml", ["trainer.evaluate=last"])) != default


@pytest.mark.parametrize("stop_at", [17, 20])
def test_a_resumed_run_validates_its_last_step_once(root, monkeypatch, stop_at):
    """Interrupted at step `stop_at` (SIGTERM, checkpoint at that step), then resumed: step 20 is
    validated exactly once, also when the checkpoint is of step 20 itself, written before its
    validation (the resumed fit has no step left to train)."""
    args = ("trainer.max_steps=20", "trainer.val_every_n_steps=15")
    original = InterruptCheckpoint.on_train_batch_end

    def interrupt_at(self, trainer, *rest):
        if trainer.global_step == stop_at:
            self._requested = signal.SIGTERM
        return original(self, trainer, *rest)

    monkeypatch.setattr(InterruptCheckpoint, "on_train_batch_end", interrupt_at)
    with pytest.raises(SIGTERMException):
        train(*args)
    monkeypatch.setattr(InterruptCheckpoint, "on_train_batch_end", original)
    (run_dir,) = (root / "runs" / "tiny").iterdir()
    assert step_of(run_dir / "checkpoints" / "last.ckpt") == stop_at
    assert sorted(valid_rows(run_dir)) == [15]
    summary = train(*args)
    assert summary.resumed_from.resolve() == (run_dir / "checkpoints" / "last.ckpt").resolve()
    rows = valid_rows(run_dir)
    assert sorted(rows) == [15, 20]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["started_at_step"] == stop_at and results["global_step"] == 20
    best = best_of(rows)
    assert results["checkpoint"] == f"checkpoints/best-step={best}.ckpt" and results["checkpoint_step"] == best
    assert step_of(run_dir / results["checkpoint"]) == best


def test_a_run_stopped_after_its_fit_does_not_validate_the_last_step_twice(root):
    """last.ckpt is saved at step 20 before step 20's validation (every 10 steps) and again after
    the fit, so that it records that validation: a run stopped during its final evaluation (here:
    results.json removed) resumes from it without validating step 20 again."""
    args = ("trainer.max_steps=20", "trainer.val_every_n_steps=15", "trainer.checkpoint_every_n_steps=10")
    first = train(*args)
    (first.run_dir / "results.json").unlink()
    again = train(*args)
    assert again.resumed_from.name == "last.ckpt"
    assert sorted(valid_rows(again.run_dir)) == [15, 20]  # valid_rows fails on a step logged twice
    results = json.loads((again.run_dir / "results.json").read_text())
    assert results["started_at_step"] == 20 and results["checkpoint_step"] == first.checkpoint_step
    # the final test is logged once, by the attempt that finished, at the step of the checkpoint it read
    assert list(valid_rows(again.run_dir, "test/exact_match")) == [first.checkpoint_step]


def test_wandb_logs_each_validation_at_the_step_of_its_checkpoint(root, offline_wandb):
    summary = train("trainer.max_steps=20", "trainer.val_every_n_steps=15", "logging.wandb.mode=offline")
    (attempts,) = read_runs(summary.run_dir / "wandb").values()
    logged = [r["trainer/global_step"] for r in history(attempts) if "valid/exact_match" in r]
    assert logged == sorted(valid_rows(summary.run_dir)) == [15, 20]
    # the run's summary holds what results.json holds under best/, the evaluated checkpoint's numbers
    # with its step, beside the history's last values (valid/ of the last validation, step 20)
    results = json.loads((summary.run_dir / "results.json").read_text())
    (run,) = attempts
    for name, value in results["metrics"].items():
        assert run.summary[f"best/{name}"] == pytest.approx(value), name
    assert run.summary["best/step"] == results["checkpoint_step"]
    last = [r for r in history(attempts) if "valid/loss" in r][-1]
    assert run.summary["valid/loss"] == pytest.approx(last["valid/loss"]) and last["trainer/global_step"] == 20


def test_the_test_is_logged_at_the_step_of_the_checkpoint_it_measured(root, offline_wandb):
    """A learning rate too small to move exact match: every validation ties, the best is the first
    (step 10), and the test of it is charted at 10, not at the fit's last step (20)."""
    summary = train("trainer.max_steps=20", "trainer.val_every_n_steps=10", "optim.lr=1e-12",
                    "logging.wandb.mode=offline")
    assert summary.checkpoint_step == 10
    (attempts,) = read_runs(summary.run_dir / "wandb").values()
    rows = history(attempts)
    assert [r["trainer/global_step"] for r in rows if "test/exact_match" in r] == [10]
    assert [r["trainer/global_step"] for r in rows if "samples/test" in r] == [10]
    assert list(valid_rows(summary.run_dir, "test/exact_match")) == [10]
    assert max(r["trainer/global_step"] for r in rows if "train/loss" in r) == 19  # the fit went on


def test_log_checkpoints_best_records_the_best_checkpoint_as_a_model_artifact(root, offline_wandb):
    summary = train("trainer.max_steps=20", "trainer.val_every_n_steps=10", "logging.wandb.mode=offline",
                    "logging.wandb.log_checkpoints=best")
    (path,) = find_run_files(summary.run_dir / "wandb")
    recorded = path.read_bytes()  # the artifact records wandb sync uploads: type model, the checkpoints' names
    assert recorded.count(b'"original_filename"') >= 1
    assert f"best-step={summary.checkpoint_step}.ckpt".encode() in recorded and b"model.ckpt" in recorded
    plain = train("trainer.max_steps=20", "trainer.val_every_n_steps=10", "logging.wandb.mode=offline", "seed=1")
    (path,) = find_run_files(plain.run_dir / "wandb")
    assert b"original_filename" not in path.read_bytes()  # the default, none, uploads nothing
