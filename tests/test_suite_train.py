"""Every task of the length-generalization suite (Delétang et al.'s tasks, addition) trains a few
steps and evaluates through the real Lightning path, encoder-decoder and decoder-only: a
representative few in the default run, all of them under `-m slow`."""
from __future__ import annotations

import json

import pytest

from relpos_lab import cli

from test_chomsky import TASKS as CHOMSKY

EXPERIMENT = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {{name: {task}, train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 64,
       eval_size_per_length: 2}}
model: {{architecture: {architecture}}}
trainer: {{max_steps: 3, val_every_n_steps: 3}}
logging: {{root: runs, wandb: {{mode: disabled}}}}
"""
TASKS = [*CHOMSKY, "addition"]
DEFAULT = {("parity_check", "encoder_decoder"), ("stack_manipulation", "decoder_only"),
           ("modular_arithmetic", "encoder_decoder"), ("addition", "decoder_only")}
CASES = [pytest.param(task, arch, marks=() if (task, arch) in DEFAULT else pytest.mark.slow)
         for task in TASKS for arch in ("encoder_decoder", "decoder_only")]


@pytest.mark.parametrize("task,architecture", CASES)
def test_every_suite_task_trains_and_reports_by_length(task, architecture, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exp.yaml").write_text(EXPERIMENT.format(task=task, architecture=architecture))
    overrides = ["task.index_hints=true", "task.reversed_output=true"] if task == "addition" else []
    assert cli.main(["train", "exp.yaml", *overrides]) == 0
    (run_dir,) = [p for p in (tmp_path / "runs" / "exp").iterdir() if p.is_dir()]
    data = json.loads((run_dir / "results.json").read_text())
    buckets = [int(n) for n in data["by_length"]["test"]]
    assert buckets == sorted(buckets) and buckets[-1] in (5, 6) and 1 <= len(buckets) <= 6
    metric = "exact_match" if task == "addition" else "accuracy"
    for key in (f"test/{metric}_ood", f"valid/{metric}", "test/loss"):
        assert key in data["metrics"], key
