"""An error a user (or a plugin they installed) causes is one `relpos-lab: error:` line, wherever it
is raised, also deep inside Lightning's training step; `-v` adds the traceback.

The plugin here is a real distribution on the subprocess's path (a .dist-info with its entry
point, as pip would leave it), found through the `relpos_lab.positions` entry points like any other.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from relpos_lab.api import ContractError, UserError
from relpos_lab.api.errors import own_error

from installed import install_scheme, run_cli

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 2}
logging: {root: runs}
"""
WIDE_BIAS = '''
from dataclasses import dataclass

import torch
from torch import nn

from relpos_lab.api import PositionConfig, PositionScheme, RelativePositions


@dataclass
class WideBiasConfig(PositionConfig):
    scheme: str = "wide_bias"
    max_distance: int = 4


class WideBias(RelativePositions):
    def __init__(self, max_distance, n_heads):
        super().__init__()
        self.max_distance = max_distance
        self.bias = nn.Parameter(torch.zeros(n_heads, 2 * max_distance + 3))  # 2k+3 wide, not 2k+1

    def attention_kwargs(self, q, k, query_offset):
        return {"rel_bias": self.bias, "max_distance": self.max_distance}


class WideBiasScheme(PositionScheme):
    config_class = WideBiasConfig

    def attention(self, head_dim, n_heads, causal):
        return WideBias(self.cfg.max_distance, n_heads)
'''
MESSAGE = ("relpos-lab: error: position scheme 'wide_bias' (wide_bias.WideBiasScheme): WideBias.attention_kwargs "
           "returned rel_bias of shape (2, 11); expected (2, 9) for max_distance=4 (head dim 8, 2 heads)")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    install_scheme(tmp_path / "site", "wide-bias", "wide_bias", WIDE_BIAS, "wide_bias = wide_bias:WideBiasScheme")
    (tmp_path / "tiny.yaml").write_text(TINY)
    return tmp_path


def test_a_scheme_that_breaks_its_contract_in_the_first_step_is_one_line_and_leaves_nothing_behind(root):
    train = ["train", "tiny.yaml", "model.positions.scheme=wide_bias"]
    out = run_cli(root, *train)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stderr == MESSAGE + "\n", out.stderr[-3000:]
    assert out.stdout.startswith("Run directory: ") and out.stdout.count("\n") == 1, out.stdout
    assert not (root / "runs").exists(), list((root / "runs").rglob("*"))  # no W&B run, no .old-<time>

    out = run_cli(root, *train, "-v")  # the retry, with the traceback: again nothing to move aside
    assert out.returncode == 1
    assert "Traceback (most recent call last)" in out.stderr and "contract.py" in out.stderr
    assert out.stderr.endswith("\n" + MESSAGE + "\n")
    assert not (root / "runs").exists(), list((root / "runs").rglob("*"))


def test_a_config_the_task_refuses_prints_no_run_directory(root):
    """Refused while the model is built (before any step): no directory is named, none is made."""
    out = run_cli(root, "train", "tiny.yaml", "task.loss_on_source=true")
    assert out.returncode == 2 and "task.loss_on_source=true needs model.architecture=decoder_only" in out.stderr
    assert "Run directory" not in out.stdout, out.stdout
    assert not (root / "runs").exists(), list((root / "runs").rglob("*"))


def test_the_projects_own_error_is_found_behind_the_exception_raised_while_handling_it():
    """Lightning's teardown or a logger's finalize failing after the real error must not hide it."""
    try:
        try:
            raise ContractError("position scheme 'x': the real error")
        except ContractError:
            raise RuntimeError("teardown failed too")
    except RuntimeError as err:
        assert str(own_error(err)) == "position scheme 'x': the real error"
    try:
        raise RuntimeError("wrapped") from UserError("bad input")
    except RuntimeError as err:
        assert isinstance(own_error(err), UserError)
    assert own_error(RuntimeError("a bug")) is None


# --- a trained checkpoint used by eval, inspect, translate, generate ----------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny run trained once: its root (the working directory) and its best checkpoint."""
    root = tmp_path_factory.mktemp("trained")
    (root / "tiny.yaml").write_text(TINY)
    out = run_cli(root, "train", "tiny.yaml", "trainer.max_steps=10", "trainer.val_every_n_steps=10")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    (checkpoint,) = root.glob("runs/*/*/checkpoints/best-step=*.ckpt")
    return root, checkpoint.relative_to(root)


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of a run directory but W&B's own service logs (wandb/*/logs/): the training run's
    W&B service may still be appending its shutdown lines there when a test looks."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.parent.name != "logs"}


@pytest.mark.parametrize("verb", ["inspect", *(pytest.param(v, marks=pytest.mark.slow)
                                  for v in ("translate", "generate"))])
def test_a_checkpoint_that_does_not_fit_the_overrides_is_one_line_before_anything_is_written(trained, verb):
    """As `eval CKPT task.alphabet_size=4` (tests/test_rerun.py): the weights that differ, the
    config key behind them and the fix, not torch's size-mismatch traceback."""
    root, checkpoint = trained
    run_dir = root / checkpoint.parent.parent
    before = snapshot(run_dir)
    out = run_cli(root, verb, str(checkpoint), "task.alphabet_size=4")
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1 and out.stderr.startswith(
        f"relpos-lab: error: {checkpoint} does not fit the model this config builds: "), out.stderr[-3000:]
    assert "model.decoder.output.weight is (14, 16) in the checkpoint, (8, 16) in the model" in out.stderr
    assert ("task.alphabet_size 10 -> 4" in out.stderr
            and "Drop the overrides that change the model's shape" in out.stderr)
    assert out.stdout == "" and snapshot(run_dir) == before  # inspect: no inspect.json, no W&B rows


def unprivileged() -> list[str]:
    """The prefix that runs a command without root's right to write through any mode bits: a user
    namespace of its own with no mapping, where root's files are checked by their owner bits."""
    if os.geteuid() != 0:
        return []
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode:
        pytest.skip("running as root, and no user namespace (unshare -U) to drop its privilege")
    return ["unshare", "-U"]


@contextlib.contextmanager
def read_only(directory: Path):
    modes = {p: p.stat().st_mode for p in [directory, *directory.rglob("*")]}
    for path, mode in modes.items():
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(mode)


def test_eval_and_inspect_into_a_read_only_run_directory_are_one_line_naming_it_and_the_way_out(trained, tmp_path):
    root, checkpoint = trained
    run_dir = checkpoint.parent.parent
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*unprivileged(), sys.executable, "-m", "relpos_lab", *args], cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)

    with read_only(root / run_dir):
        out = run("eval", str(checkpoint))
        assert out.returncode == 2, out.stderr[-3000:]
        assert out.stderr == (f"relpos-lab: error: cannot write {run_dir}/eval: Permission denied; give another "
                              "directory for the results with --output DIR. Nothing was evaluated\n")
        out = run("inspect", str(checkpoint))
        assert out.returncode == 2, out.stderr[-3000:]
        assert out.stderr == (f"relpos-lab: error: cannot write {run_dir}: Permission denied; write the figures and "
                              "inspect.json to another directory with --out DIR (nothing is then logged to W&B). "
                              "Nothing was written\n")
        out = run("eval", str(checkpoint), "--output", str(tmp_path / "eval"))  # the way out the line names
        assert out.returncode == 0 and out.stderr == "", out.stderr[-3000:]
        assert (tmp_path / "eval" / "results.json").is_file()


def test_translate_into_a_file_it_cannot_write_is_one_line(trained):
    root, checkpoint = trained
    (root / "a_file").write_text("")
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "translate", str(checkpoint),
                          "--output", "a_file/out.txt"],
                         cwd=root, input="1 2 3\n", capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 2
    assert out.stderr == ("relpos-lab: error: cannot write --output a_file/out.txt: "
                          "Not a directory\n"), out.stderr[-3000:]
