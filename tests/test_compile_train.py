"""`trainer.compile` in a real Lightning fit: a compiled run trains, resumes from its checkpoint, and
ends where the eager run of the same seed ends (dropout off), its checkpoints the eager model's keys.

Inductor compiles for real here (a cold cache of its own: the fit's graphs take about a minute on CPU)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {dropout: 0.0, attention_dropout: 0.0, positions: {max_distance: 4}}
trainer: {val_every_n_steps: 10}
logging: {root: runs, wandb: {mode: disabled}}
"""


def _train(cwd: Path, *overrides: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(cwd / "inductor")}
    return subprocess.run([sys.executable, "-m", "relpos_lab", "train", "tiny.yaml", *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _results(cwd: Path) -> dict:
    (results,) = cwd.glob("runs/*/*/results.json")
    return json.loads(results.read_text())["metrics"]


@pytest.mark.slow  # two real fits, one with inductor's C++ compiles: 60-180 s on 2 cores
def test_a_compiled_run_trains_resumes_and_ends_where_the_eager_run_does(tmp_path):
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    for where in (eager, compiled):
        where.mkdir()
        (where / "tiny.yaml").write_text(TINY)
    assert _train(eager, "trainer.max_steps=20").returncode == 0
    first = _train(compiled, "trainer.max_steps=10", "trainer.compile=default")
    assert first.returncode == 0, first.stderr[-3000:]
    again = _train(compiled, "trainer.max_steps=20", "trainer.compile=default", "--extend")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resum" in again.stdout.lower() or "continu" in again.stdout.lower(), again.stdout
    want, got = _results(eager), _results(compiled)
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    (last,) = compiled.glob("runs/*/*/checkpoints/last.ckpt")
    state = torch.load(last, map_location="cpu", weights_only=False)
    assert state["global_step"] == 20
    assert not [k for k in state["state_dict"] if "_orig_mod" in k]
