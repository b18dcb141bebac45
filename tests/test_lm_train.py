"""Task lm end to end through the CLI on the built-in corpus: train (one process, and 2-process DDP
whose sharded validation perplexity must equal one process's), the record it leaves, `eval` with
sliding windows, and `generate`."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relpos_lab import cli
from relpos_lab.training import experiment

TINY = ["lm_builtin", "debug", "debug=false", "task.subword.vocab_size=400", "task.train_length=16",
        "task.eval_lengths=[16,32,64]", "task.eval_tokens=3000", "model.positions.max_distance=4",
        "trainer.max_steps=30", "trainer.val_every_n_steps=15", "optim.lr=0.01", "model.dropout=0.0",
        "model.attention_dropout=0.0"]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    env.pop("WANDB_MODE", None)
    return subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lm-data")  # one subword model and token cache for every run here


def train(root: Path, data_dir: Path, *extra: str) -> Path:
    out = run_cli("train", *TINY, f"task.data_dir={data_dir}", *extra, cwd=root)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in (root / "runs" / "lm_builtin").iterdir() if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir) -> Path:
    return train(tmp_path_factory.mktemp("lm"), data_dir)


def test_a_tiny_run_on_the_builtin_corpus_records_perplexity_by_length(trained):
    results = json.loads((trained / "results.json").read_text())
    assert results["task"] == "lm" and results["train_lengths"] == [1, 16]
    for split in ("valid", "test"):
        rows = results["by_length"][split]
        assert sorted(rows, key=int) == ["16", "32", "64"]
        assert set(rows["64"]) == {"loss", "ppl", "n", "ppl_pos0-15", "ppl_pos16-31", "ppl_pos32-63"}
        assert set(rows["16"]) == {"loss", "ppl", "n", "ppl_pos0-15"}
        assert all(2 < row["ppl"] < 250 and row["n"] > 2000 for row in rows.values())  # uniform: ~400
        assert results["metrics"][f"{split}/ppl"] == rows["16"]["ppl"]
        assert math.isfinite(results["metrics"][f"{split}/ppl_ood"])
        signature = results["details"][split]["data_signature"]
        assert signature.startswith("pydoc_data.topics (Python 3.") and "|sha256:" in signature
        assert results["details"][split]["train_data_signature"].startswith("pydoc_data.topics")
        data = results["details"][split]["data"]  # in words, for the closing summary
        assert "pydoc topics, " in data and data.endswith(" tokens")
    assert (trained / "plots" / "by_length_ppl.png").is_file()
    assert (trained / "plots" / "by_length_ppl_pos32-63.png").is_file()


def test_the_summary_says_what_each_split_scored_and_that_they_differ(trained, data_dir):
    """valid and test are whole documents of their own: their perplexities differ by content."""
    out = run_cli("train", *TINY, f"task.data_dir={data_dir}", cwd=trained.parents[2])  # finished: the summary
    assert out.returncode == 0, out.stderr[-4000:]
    details = json.loads((trained / "results.json").read_text())["details"]
    for split in ("valid", "test"):
        assert f"{split} data  {details[split]['data']}" in out.stdout
    assert "valid and test are different texts: compare a metric between runs on one split" in out.stdout


def test_eval_with_sliding_windows_scores_every_token_once(trained, tmp_path):
    checkpoint = trained / "checkpoints" / "last.ckpt"
    out = run_cli("eval", str(checkpoint), "--split", "valid", "--output", str(tmp_path), "task.eval_stride=8",
                  cwd=trained)
    assert out.returncode == 0, out.stderr[-4000:]
    sliding = json.loads((tmp_path / "results.json").read_text())["by_length"]["valid"]
    plain = json.loads((trained / "results.json").read_text())["by_length"]["valid"]
    for length in ("16", "32", "64"):  # tokens 1.. up to the last whole window, each once
        assert 3000 - int(length) <= sliding[length]["n"] <= 3000
        assert sliding[length]["n"] >= plain[length]["n"]


def test_generate_continues_a_prompt_reproducibly(trained, capsys):
    checkpoint = str(trained / "checkpoints" / "last.ckpt")
    args = ["generate", checkpoint, "--prompt", "The for statement", "--max-new-tokens", "12", "--top-k", "20",
            "--seed", "7"]
    outputs = []
    for _ in range(2):
        assert cli.main(args) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and outputs[0].startswith("The for statement")
    assert len(outputs[0]) > len("The for statement") + 1
    assert cli.main(["generate", checkpoint, "--temperature", "0", "--max-new-tokens", "5"]) == 0


@pytest.mark.integration  # real processes: DDP over gloo
def test_two_processes_validate_to_the_one_process_perplexity(tmp_path_factory, data_dir, tmp_path, monkeypatch):
    """The final validation of a 2-process run shards the windows over the ranks; summed NLL and
    token counts reduce across them, so one process evaluating the same checkpoint on the same
    data gets the same perplexity, at every length and position bucket."""
    run_dir = train(tmp_path_factory.mktemp("lm-ddp"), data_dir, "trainer.devices=2", "trainer.strategy=ddp",
                    "data.batch_size=8")
    results = json.loads((run_dir / "results.json").read_text())
    monkeypatch.setenv("WANDB_MODE", "disabled")
    alone = experiment.evaluate(run_dir / results["checkpoint"], "valid", output=tmp_path / "eval")
    assert alone.metrics["valid/ppl"] == pytest.approx(results["metrics"]["valid/ppl"], rel=1e-9)
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())["by_length"]["valid"]
    for length, row in results["by_length"]["valid"].items():
        assert evaluated[length]["n"] == row["n"]
        for name, value in row.items():
            assert evaluated[length][name] == pytest.approx(value, rel=1e-6), (length, name)
