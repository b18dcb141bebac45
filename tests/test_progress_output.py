"""What `relpos-lab train` prints when its stdout is a log file (a SLURM .out), not a terminal."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from relpos_lab.training.progress import ProgressLines, StepProgressBar, progress_bar

from test_train import TINY, env

PROGRESS = re.compile(r"^step (\d+)/30 \(\d+%\)  loss \d+\.\d{4}  \d+\.\d\d steps/s  ETA \d+:\d\d:\d\d$", re.M)
VALID = re.compile(r"^step (\d+)/30 valid  exact_match \d\.\d{4}  token_accuracy", re.M)
# Lightning's and W&B's own lines (the srun hint appears only where srun is installed)
NOISE = ("GPU available", "litlogger", "wandb: Tracking run", "Total FLOPs", "Epoch 1/-2", "Restoring states")


def train(root, *args: str) -> subprocess.CompletedProcess:
    (root / "tiny.yaml").write_text(TINY)
    return subprocess.run([sys.executable, "-m", "relpos_lab", "train", "tiny.yaml", "trainer.enable_progress_bar=true",
                           "trainer.enable_model_summary=true", "trainer.log_every_n_steps=10", *args],
                          cwd=root, env=env(), capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quiet_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("quiet")
    out = train(root)
    assert out.returncode == 0, out.stderr[-4000:]
    return root, out


@pytest.fixture(scope="module")
def quiet_run(quiet_root):
    return quiet_root[1]


def test_a_log_file_gets_a_plain_progress_line_every_n_steps(quiet_run):
    assert [int(s) for s in PROGRESS.findall(quiet_run.stdout)] == [10, 20, 30]
    assert [int(s) for s in VALID.findall(quiet_run.stdout)] == [15, 30]
    assert not re.search(r"^(Epoch|Training|Validation|Testing) .*━", quiet_run.stdout, re.M)  # no frame of a live bar


def test_the_run_directory_line_comes_first_and_the_chatter_is_left_out(quiet_run):
    assert quiet_run.stdout.startswith("Run directory: runs/tiny/")
    assert quiet_run.stdout.splitlines()[1].startswith("Model: ")  # the summary in one line
    for line in NOISE:
        assert line not in quiet_run.stdout + quiet_run.stderr, line


def run_cli(root, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=root, env=env(), capture_output=True,
                          text=True, timeout=300)


def test_eval_and_inspect_print_their_own_lines_only(quiet_root):
    """No Lightning warning that eval's Trainer lacks the training callbacks whose states the
    checkpoint holds (on purpose: it evaluates), no W&B banner and closing history from inspect;
    -v shows them."""
    root, _ = quiet_root
    (checkpoint,) = root.glob("runs/*/*/checkpoints/best-step=*.ckpt")
    out = run_cli(root, "eval", str(checkpoint))
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stderr == "" and "test" in out.stdout
    out = run_cli(root, "eval", str(checkpoint), "--split", "valid", "-v")
    assert out.returncode == 0 and "when using `ckpt_path`, callbacks used to create the checkpoint" in out.stderr

    out = run_cli(root, "inspect", str(checkpoint))
    assert out.returncode == 0, out.stderr[-4000:]
    assert out.stderr == "" and out.stdout.startswith("inspect: ") and out.stdout.count("\n") == 1, out.stdout
    assert (checkpoint.parent.parent / "inspect.json").is_file()


def test_verbose_shows_lightnings_own_lines(tmp_path):
    out = train(tmp_path, "-v", "logging.wandb.mode=disabled", "trainer.max_steps=10", "trainer.val_every_n_steps=10")
    assert out.returncode == 0, out.stderr[-4000:]
    assert "GPU available" in out.stderr and "litlogger" in out.stderr
    assert "Total params" in out.stdout + out.stderr  # Lightning's model summary table
    assert re.search(r"^step 10/10 \(100%\)  loss ", out.stdout, re.M)


def test_a_terminal_gets_a_bar_over_the_steps():
    assert isinstance(progress_bar(10, interactive=True), StepProgressBar)
    assert isinstance(progress_bar(10, interactive=False), ProgressLines)


class _Fit:
    """What LongRunNotice reads of a Trainer: the step, the budget, rank 0."""

    def __init__(self, max_steps):
        self.global_step, self.max_steps, self.is_global_zero = 0, max_steps, True


@pytest.mark.parametrize(("max_steps", "said"), [(100_000, True), (2_000, False)])
def test_a_long_run_says_how_long_and_how_to_shorten_it_early_once(max_steps, said):
    """0.05 s a step: 100,000 steps are 1 h 23 min (one line after the warm-up and ten timed
    steps); 2,000 steps are under 10 minutes (nothing)."""
    from relpos_lab.training.progress import LongRunNotice

    now, lines = [0.0], []
    notice = LongRunNotice(write=lines.append, clock=lambda: now[0])
    fit = _Fit(max_steps)
    for _ in range(40):
        fit.global_step += 1
        now[0] += 0.05 if fit.global_step > 3 else 20.0  # the first steps compile and warm up
        notice.on_train_batch_end(fit, None, None, None, fit.global_step - 1)
    if said:
        (line,) = lines
        assert line.startswith(f"this run trains {max_steps - 13:,} more steps, about 1:23:")
        assert "at 0.05 s a step here; `debug` makes it a smoke test" in line and "trainer.max_steps=N" in line
    else:
        assert lines == []
