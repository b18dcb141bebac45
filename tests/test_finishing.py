"""A signal while a run finishes (training done: evaluation, outputs, plots, W&B summary, inspect, the
W&B run closed, results.json) leaves the run either finished or resumable, and the next attempt of
the same command finishes it: results.json, the plots, inspect's figures and the W&B test rows.

Each case trains a tiny run in a subprocess that gets SIGTERM, or SLURM's requeue signal SIGUSR1,
as finishing reaches one of its steps (training/finishing.py's RELPOS_LAB_SIGNAL_AT), then runs the
same command again. SIGUSR1 is a requeue only under SLURM: those cases run in a fake one-task
SLURM job whose `scontrol` records the requeue and sends the SIGTERM with which SLURM ends the
requeued attempt. Before results.json was written last, a signal after it left a run that the
next attempt called finished, without plots, inspect figures or W&B test rows.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relpos_lab.records.wandb_offline import history, read_runs

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {dropout: 0.0, positions: {max_distance: 4}}
trainer: {max_steps: 10, val_every_n_steps: 10}
logging: {root: runs, inspect: true}
"""
STEPS = 10
SCONTROL = """#!/bin/sh
echo "$@" >> "$SCONTROL_LOG"
kill -TERM $PPID
"""
FAKE_SLURM = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "relpos",
              "SLURM_NODELIST": "localhost", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}


def run(root: Path, signal_at: str | None = None, slurm: bool = False) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if not key.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", COLUMNS="250", WANDB_MODE="offline", WANDB_SILENT="true")
    if slurm:
        env.update(FAKE_SLURM, PATH=f"{root / 'bin'}{os.pathsep}{env['PATH']}", SCONTROL_LOG=str(root / "scontrol.log"))
    if signal_at:
        env["RELPOS_LAB_SIGNAL_AT"] = signal_at
    return subprocess.run([sys.executable, "-m", "relpos_lab", "train", "tiny.yaml"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL)
    (tmp_path / "bin" / "scontrol").chmod(0o755)
    return tmp_path


def the_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.glob("runs/*/*") if p.is_dir()]
    return run_dir


def assert_finished(run_dir: Path) -> None:
    """Everything finishing leaves: results.json, the plots, inspect's figures, the test rows once
    (metrics.csv and the W&B history read back from its offline file)."""
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == STEPS and "test/exact_match" in results["metrics"]
    assert {p.name for p in (run_dir / "plots").glob("*.png")} == {"by_length_exact_match.png",
                                                                   "by_length_token_accuracy.png"}
    assert (run_dir / "inspect.json").is_file() and list((run_dir / "plots" / "inspect").glob("*.png"))
    with open(run_dir / "metrics.csv", newline="") as file:
        tested = [int(r["step"]) for r in csv.DictReader(file) if r.get("test/exact_match")]
    assert tested == [results["checkpoint_step"]]  # once, at the step of the checkpoint it measured
    (attempts,) = read_runs(run_dir / "wandb").values()
    rows = history(attempts)
    assert [r["trainer/global_step"] for r in rows if "test/exact_match" in r] == tested
    assert any(key.startswith("inspect/") for r in rows for key in r)
    assert attempts[-1].summary.get("test/exact_match") == results["metrics"]["test/exact_match"]
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))


def check(root: Path, step: str, signal: str) -> None:
    slurm = signal == "USR1"
    first = run(root, f"{step}:{signal}", slurm=slurm)
    output = first.stdout + first.stderr
    run_dir = the_run_dir(root)
    if step == "done":  # after results.json: the run is finished whatever the signal does to the process
        assert_finished(run_dir)
    else:
        assert not (run_dir / "results.json").exists(), output[-3000:]
        if slurm:  # SLURM requeues the job: the attempt ends as a requeued one does, with 0
            assert first.returncode == 0, output[-3000:]
            assert (root / "scontrol.log").read_text() == "requeue 4242\n"
            assert "run the same command again" not in output
        elif step == "evaluate":  # before Lightning's evaluation registers its handler: killed, resumable
            assert first.returncode in (-15, 143), output[-3000:]
        else:
            assert first.returncode == 143, output[-3000:]
            assert f"Stopped by SIGTERM while finishing the run (before {step})" in output, output[-3000:]
        assert "Traceback" not in output, output[-3000:]
    second = run(root, slurm=slurm)
    output = second.stdout + second.stderr
    assert second.returncode == 0, output[-3000:]
    assert the_run_dir(root) == run_dir
    assert_finished(run_dir)
    if step == "done":
        assert "is finished (results.json" in output
    else:
        assert "(resuming from last.ckpt)" in output


# USR1 by default; TERM during finishing also in tests/test_rerun.py (exit 143, evaluated again)
@pytest.mark.parametrize("step, signal", [pytest.param("wandb", "TERM", marks=pytest.mark.slow), ("inspect", "USR1")])
def test_a_signal_while_finishing_leaves_the_run_resumable_and_the_next_attempt_finishes_it(root, step, signal):
    check(root, step, signal)


@pytest.mark.slow  # ~20 s a case; the two cases above run by default
@pytest.mark.parametrize("signal", ["TERM", "USR1"])
@pytest.mark.parametrize("step", ["evaluate", "outputs", "summary", "inspect", "wandb", "results", "done"])
def test_a_signal_at_every_finishing_step_leaves_the_run_finished_or_resumable(root, step, signal):
    check(root, step, signal)
