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


@pytest.mark.slow  # ~26 s; train's own lines are checked by default
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

    def __init__(self, max_steps, step=0):
        self.global_step, self.max_steps, self.is_global_zero = step, max_steps, True


def _notice_lines(max_steps, paces, start_step=0, steps=40):
    """LongRunNotice's lines over `steps` steps of a fit from `start_step`, on a fake clock: the
    first three steps take 20 s (they compile and warm up), step i after them paces(i) seconds."""
    from relpos_lab.training.progress import LongRunNotice

    now, lines = [0.0], []
    notice = LongRunNotice(write=lines.append, clock=lambda: now[0])
    fit = _Fit(max_steps, start_step)
    notice.on_train_start(fit, None)
    for i in range(1, steps + 1):
        fit.global_step += 1
        now[0] += paces(i) if i > 3 else 20.0
        notice.on_train_batch_end(fit, None, None, None, i - 1)
    return lines


@pytest.mark.parametrize(("max_steps", "said"), [(100_000, True), (2_000, False)])
def test_a_long_run_says_how_long_and_how_to_shorten_it_early_once(max_steps, said):
    """0.05 s a step: a fresh run of 100,000 steps says so, 1 h 23 min to go (one line after the
    warm-up and ten timed steps, none after: the pace held); 2,000 steps are under 10 minutes (nothing)."""
    lines = _notice_lines(max_steps, lambda i: 0.05, steps=200)
    if said:
        (line,) = lines
        assert line.startswith("this run trains 100,000 steps, about 1:23:19 to go at 0.05 s a step here; ")
        assert "`debug` makes it a smoke test" in line and "trainer.max_steps=N" in line
    else:
        assert lines == []


def test_a_resumed_run_says_how_many_more_steps_it_trains():
    (line,) = _notice_lines(100_000, lambda i: 0.05, start_step=40_000)
    assert line.startswith("this run trains 60,000 more steps (from step 40,000 to 100,000), about 0:49:59 to go at ")


def test_the_estimate_is_said_again_once_the_real_step_time_is_known():
    """Ten steps at 0.05 s said 1 h 23 min; a hundred more at 0.02 s are the real pace: 33 min, said once."""
    first, again = _notice_lines(100_000, lambda i: 0.05 if i <= 13 else 0.02, steps=300)
    assert first.startswith("this run trains 100,000 steps, about 1:23:19 to go at 0.05 s a step")
    assert again == ("this run: about 0:33:18 to go at 0.02 s a step here, timed over 100 steps "
                     "(the first 10 timed said 0.05 s a step)")


def test_a_run_that_only_turns_out_long_says_so_once_its_step_time_is_known():
    (line,) = _notice_lines(2_000, lambda i: 0.05 if i <= 13 else 1.0, steps=300)
    assert line.startswith("this run trains 2,000 steps, about 0:31:27 to go at 1 s a step here; ")
