"""Run directories a group can read: every file relpos_lab writes gets the mode open() would give it
under the process's umask, so colleagues on a shared filesystem can evaluate a run."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from relpos_lab.api.files import atomic_write
from relpos_lab.config import load_config
from relpos_lab.launch.slurm import setup_lines

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 64, eval_size_per_length: 2}
trainer: {max_steps: 4, val_every_n_steps: 2}
logging: {root: runs, inspect: true}
"""


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_writes_get_the_mode_open_would_give(tmp_path, mask, mode):
    previous = os.umask(mask)
    try:
        atomic_write(tmp_path / "results.json", "{}")
        with open(tmp_path / "plain.txt", "w") as file:
            file.write("x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "results.json").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == mode


def _modes(run_dir: Path) -> dict[str, int]:
    return {str(p.relative_to(run_dir)): stat.S_IMODE(p.stat().st_mode) for p in run_dir.rglob("*")
            if p.is_file() and not p.is_symlink()}


@pytest.mark.parametrize(("umask", "readable"), [pytest.param(0o022, True, marks=pytest.mark.slow), (0o077, False)])
def test_a_runs_files_honour_the_umask(tmp_path, umask, readable):
    """Results, config, metrics, inspect, checkpoints, plots and W&B's files, as the shell's umask says."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "train", "tiny.yaml"], cwd=tmp_path,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: os.umask(umask))
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs" / "tiny").iterdir()
    modes = _modes(run_dir)
    for name in ("results.json", "config.yaml", "metrics.csv", "inspect.json", "checkpoints/last.ckpt"):
        assert name in modes, sorted(modes)
    assert any(name.startswith("wandb/") for name in modes) and any(name.startswith("plots/") for name in modes)
    if readable:
        private = {name: oct(mode) for name, mode in modes.items() if mode & 0o044 != 0o044}
        assert not private, private
    else:
        shared = {name: oct(mode) for name, mode in modes.items() if mode & 0o077}
        assert not shared, shared


def test_a_slurm_job_sets_the_umask_its_cluster_setup_names(tmp_path, monkeypatch):
    """README's way to a group-readable run under SLURM: cluster.setup's first line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    cfg = load_config("tiny.yaml", ["cluster.setup=[umask 002,module load cuda]"])
    assert setup_lines(cfg) == ["umask 002", "module load cuda"]
