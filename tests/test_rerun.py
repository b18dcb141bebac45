"""Running a command again: a finished run is reported, an interrupted one resumes from its newest
readable checkpoint with one history (metrics.csv and W&B, no step twice); Ctrl-C and SIGTERM
checkpoint the current step; --force starts over, moving the old directory aside."""
from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from relpos_lab import cli
from relpos_lab.records.wandb_offline import history, read_run, read_runs

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {dropout: 0.0, positions: {max_distance: 4}}
logging: {root: runs}
"""
STEPS, LOG_EVERY = 300, 5
LONG = ["train", "tiny.yaml", f"trainer.max_steps={STEPS}", "trainer.val_every_n_steps=100",
        f"trainer.log_every_n_steps={LOG_EVERY}"]
LOGGED = list(range(LOG_EVERY - 1, STEPS, LOG_EVERY))  # Lightning logs optimizer step s as step s - 1


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "relpos_lab", *args]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)


def the_run_dir(root: Path) -> Path:
    (run_dir,) = [p for p in root.glob("runs/*/*") if p.is_dir() and ".old-" not in p.name]
    return run_dir


def global_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def csv_steps(run_dir: Path, key: str) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get(key)]


def wandb_steps(run_dir: Path, key: str) -> list[int]:
    (attempts,) = read_runs(run_dir / "wandb").values()
    rows = history(attempts)
    assert [r["_step"] for r in rows] == sorted({r["_step"] for r in rows})  # one monotone W&B history
    return [r["trainer/global_step"] for r in rows if key in r]


def assert_one_history(run_dir: Path) -> None:
    """Every logged training step exactly once, in order, in metrics.csv and in the W&B history,
    with the same values (rows a killed attempt's W&B file lacks are logged again from metrics.csv)."""
    for key in ("train/loss", "lr-AdamW"):
        assert csv_steps(run_dir, key) == LOGGED, key
        assert wandb_steps(run_dir, key) == LOGGED, key
    for key in ("valid/exact_match",):  # each validation of the fit once, at the step of its checkpoint
        steps = csv_steps(run_dir, key)  # (the final evaluation evaluates one of them again: logged once)
        assert steps == [100, 200, 300], steps
        assert wandb_steps(run_dir, key) == steps
    (attempts,) = read_runs(run_dir / "wandb").values()
    recorded = [r["train/loss"] for r in history(attempts) if "train/loss" in r]
    with open(run_dir / "metrics.csv", newline="") as file:
        assert recorded == [float(r["train/loss"]) for r in csv.DictReader(file) if r["train/loss"]]


def start(root: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(command(*args), cwd=root, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def wait_for(proc: subprocess.Popen, condition, what: str) -> None:
    deadline = time.time() + 240
    while not condition():
        assert proc.poll() is None, f"training ended before {what}"
        assert time.time() < deadline, f"no {what}"
        time.sleep(0.05)


def current_step(root: Path) -> int:
    return max((max(csv_steps(p.parent, "train/loss"), default=-1) for p in root.glob("runs/*/*/metrics.csv")),
               default=-1)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY)
    return tmp_path


def finish_and_check(root: Path, run_dir: Path, resumed_at: int, continued_at_end: bool = True,
                     resume: str = "allow") -> str:
    """Resume and finish the run; with `continued_at_end` the first attempt's W&B file was complete
    and the second attempt continues it after its last row: a plain resume numbering its rows from
    there (``logging.wandb.resume=allow``), or W&B's rewind to it (``rewind``: resume_from)."""
    out = run_cli(*LONG, f"logging.wandb.resume={resume}", cwd=root)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "(resuming from last.ckpt)" in out.stdout
    assert "not resumable" not in out.stderr  # Lightning restores the loader's place in the epoch
    assert the_run_dir(root) == run_dir
    results = json.loads((run_dir / "results.json").read_text())
    assert results["started_at_step"] == resumed_at and results["global_step"] == STEPS
    assert_one_history(run_dir)
    (attempts,) = read_runs(run_dir / "wandb").values()
    with open(run_dir / "metrics.csv", newline="") as file:
        logged = set(next(csv.reader(file))) - {"step"}
    assert logged <= attempts[-1].summary.keys()  # the run's summary, as the attempt that finished it leaves it
    if continued_at_end:
        (attempts,) = read_runs(run_dir / "wandb").values()
        assert len(attempts) == 2 and "W&B: the history lacks" not in out.stdout
        if resume == "rewind":
            assert attempts[1].branch_point[0] == attempts[0].run_id
            assert attempts[1].branch_point[1] == attempts[0].history[-1]["_step"]
        else:
            assert attempts[1].branch_point is None
            assert attempts[1].history[0]["_step"] == attempts[0].history[-1]["_step"] + 1
    return out.stdout


def test_ctrl_c_before_the_first_checkpoint_saves_the_current_step_and_the_run_resumes_from_it(root):
    proc = start(root, *LONG, "trainer.checkpoint_every_n_steps=100000")  # no periodic checkpoint
    wait_for(proc, lambda: current_step(root) >= 20, "logged steps")
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole process group
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, output[-3000:]
    run_dir = the_run_dir(root)
    saved = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert 20 < saved < STEPS
    assert "Ctrl-C: saving a checkpoint at the end of this training step" in output
    assert (f"Stopped by Ctrl-C (SIGINT) at step {saved}. Newest checkpoint: {run_dir.relative_to(root)}/checkpoints/"
            f"last.ckpt (step {saved}); run the same command again to resume from it.") in output
    assert "Detected KeyboardInterrupt" not in output  # Lightning's line: the run's own say it all
    finish_and_check(root, run_dir, saved, resume="rewind")


def test_a_run_killed_after_a_checkpoint_resumes_with_metrics_cut_back_and_wandb_continued(root):
    args = [*LONG, "trainer.checkpoint_every_n_steps=50"]
    proc = start(root, *args)
    wait_for(proc, lambda: current_step(root) >= 75, "steps logged after the first checkpoint")
    os.kill(proc.pid, signal.SIGKILL)  # e.g. the OOM killer: no chance to save; W&B's process writes what it got
    proc.communicate(timeout=60)
    run_dir = the_run_dir(root)
    saved = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert saved >= 50 and max(csv_steps(run_dir, "train/loss")) >= saved  # logged past the checkpoint
    with pytest.warns(UserWarning) if not first_attempt_recorded(run_dir) else contextlib.nullcontext():
        out = finish_and_check(root, run_dir, saved, continued_at_end=False)
        (attempts,) = read_runs(run_dir / "wandb").values()
    assert f"metrics.csv: cut back to step {saved}" in out
    if len(attempts) == 2:  # W&B's process wrote the killed attempt's records: the new one continues them
        held = max(row["trainer/global_step"] for row in attempts[0].history if "train/loss" in row)
        assert held > saved  # the killed attempt logged past the checkpoint: those steps are not logged again
        resumed = [row["trainer/global_step"] for row in attempts[1].history if "train/loss" in row]
        assert attempts[1].branch_point is None and resumed[0] == held + LOG_EVERY


def first_attempt_recorded(run_dir: Path) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(read_runs(run_dir / "wandb"))


def test_sigterm_saves_the_current_step_and_the_run_resumes_from_it_with_what_wandb_lost_logged_again(root):
    proc = start(root, *LONG, "trainer.checkpoint_every_n_steps=100000")
    wait_for(proc, lambda: current_step(root) >= 20, "logged steps")
    os.kill(proc.pid, signal.SIGTERM)  # the training process only, as `kill` does
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]  # 128 + SIGTERM: not a success (it was 0)
    run_dir = the_run_dir(root)
    saved = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert f"Stopped by SIGTERM at step {saved}. Newest checkpoint:" in output, output[-3000:]
    # What SLURM's SIGTERM does to W&B's service process (it dies without flushing): the
    # attempt's offline file ends early, here after half of its training rows.
    (run_file,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    last = cut_after_rows(run_file, len(csv_steps(run_dir, "train/loss")))
    out = finish_and_check(root, run_dir, saved, continued_at_end=False)
    # from the logged step after the file's last one, or that step itself when it lacks its lr row
    first = int(re.search(r"W&B: the history lacks steps (\d+)-", out).group(1))
    assert first in (last, last + LOG_EVERY), (first, last)


@pytest.mark.slow  # ~24 s; test_finishing's signal while finishing runs by default
def test_sigterm_during_the_final_evaluation_exits_143_and_the_same_command_evaluates_again(root):
    """Outside training Lightning's own SIGTERM handler stops the evaluation loop; the run still
    exits 143 with one line saying so, leaves no results.json, and the same command finishes it."""
    steps = 20
    args = ["train", "tiny.yaml", f"trainer.max_steps={steps}", "task.test_lengths=[1,40]",
            "task.eval_size_per_length=300", "logging.wandb.mode=disabled",
            "debug=false"]  # ~10 s of greedy decoding: the tiny model on the data as given
    proc = start(root, *args)
    wait_for(proc, lambda: checkpoint_step(root) == steps, "a last.ckpt of the last step")
    time.sleep(1.0)  # past the fit, into the final evaluation
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]
    run_dir = the_run_dir(root)
    (line,) = [line for line in output.splitlines() if line.startswith("Stopped by SIGTERM")]
    assert line.endswith("run the same command again to resume from it. (training is complete; the final "
                         "evaluation was not run)"), output[-3000:]
    assert "Traceback" not in output and not (run_dir / "results.json").exists()
    out = run_cli(*args, cwd=root)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert json.loads((run_dir / "results.json").read_text())["started_at_step"] == steps


def checkpoint_step(root: Path) -> int | None:
    """The step of the run's last.ckpt, None while there is none (or it is being written)."""
    last = next(root.glob("runs/*/*/checkpoints/last.ckpt"), None)
    try:
        return None if last is None else global_step(last)
    except (OSError, RuntimeError, EOFError):
        return None


def cut_after_rows(path: Path, logged: int) -> int:
    """Truncate an offline W&B file so that it holds only the rows of the first half of the `logged`
    training steps; returns the last training step it then holds a loss for."""
    def rows(size: int) -> list[dict]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cut = path.with_suffix(".cut")
            cut.write_bytes(path.read_bytes()[:size])
            try:
                return [r for r in read_run(cut).history if "train/loss" in r]
            except Exception:  # cut inside the run record
                return []
            finally:
                cut.unlink()
    want = logged // 2
    low, high = 0, path.stat().st_size  # the shortest prefix holding `want` training rows
    while low < high:
        middle = (low + high) // 2
        low, high = (middle + 1, high) if len(rows(middle)) < want else (low, middle)
    kept = rows(low)
    assert len(kept) == want > 0
    with open(path, "r+b") as file:
        file.truncate(low)
    return kept[-1]["trainer/global_step"]


def test_an_unreadable_newest_checkpoint_is_one_line_and_the_previous_one_is_used(root):
    out = run_cli("train", "tiny.yaml", cwd=root)  # 30 steps: best-step=15.ckpt, last.ckpt at 30
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = the_run_dir(root)
    (run_dir / "results.json").unlink()  # as if the run had been stopped before its final evaluation
    last = run_dir / "checkpoints" / "last.ckpt"
    last.write_bytes(last.read_bytes()[:1000])  # cut short
    (best,) = (run_dir / "checkpoints").glob("best-step=*.ckpt")
    out = run_cli("train", "tiny.yaml", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [line for line in out.stdout.splitlines() if "unreadable" in line]
    assert line.startswith(f"relpos-lab: skipping unreadable checkpoint: {last.relative_to(root)} (torch.load: ")
    assert line.endswith("; trying the one before it")
    assert f"(resuming from {best.name})" in out.stdout
    assert json.loads((run_dir / "results.json").read_text())["started_at_step"] == 15


def test_the_rule_finished_reports_interrupted_refuses_with_resume_false_and_force_moves_aside(root, monkeypatch,
                                                                                               capsys):
    monkeypatch.chdir(root)
    disabled = "logging.wandb.mode=disabled"
    assert cli.main(["train", "tiny.yaml", "trainer.max_steps=20", disabled]) == 0
    run_dir = the_run_dir(root).relative_to(root)
    capsys.readouterr()
    # finished: the same command prints the results and exits 0, with resume=false too
    for extra in ([], ["resume=false"]):
        assert cli.main(["train", "tiny.yaml", "trainer.max_steps=20", disabled, *extra]) == 0
        out = capsys.readouterr().out
        assert f"{run_dir} is finished (results.json): nothing to train" in out and "--force" in out
        assert "finished earlier" in out and "exact_match" in out
    # interrupted: resume=false refuses, naming --force
    (run_dir / "results.json").unlink()
    assert cli.main(["train", "tiny.yaml", "trainer.max_steps=20", disabled, "resume=false"]) == 2
    err = capsys.readouterr().err
    assert (err.count("\n") == 1
            and f"{run_dir} holds an interrupted attempt of this run (its newest checkpoint is " in err)
    assert "pass --force to start over (the old directory is moved to " in err
    # --force: the old directory is moved aside, never deleted, and the run starts over
    assert cli.main(["train", "tiny.yaml", "trainer.max_steps=20", disabled, "--force"]) == 0
    out = capsys.readouterr().out
    (old,) = root.glob(f"{run_dir}.old-*")
    assert f"--force: moved {run_dir} aside to {old.relative_to(root)}; starting over" in out
    assert (old / "checkpoints" / "last.ckpt").is_file() and not (old / "results.json").exists()
    assert json.loads((run_dir / "results.json").read_text())["started_at_step"] == 0


def test_an_attempt_killed_before_any_checkpoint_is_moved_aside_and_the_run_starts_over(root, monkeypatch, capsys):
    monkeypatch.chdir(root)
    run = ["train", "tiny.yaml", "trainer.max_steps=10", "trainer.val_every_n_steps=10"]
    assert cli.main([*run, "logging.wandb.mode=disabled"]) == 0
    run_dir = the_run_dir(root).relative_to(root)
    (run_dir / "results.json").unlink()  # what a kill before the first checkpoint leaves
    for checkpoint in (run_dir / "checkpoints").iterdir():
        checkpoint.unlink()
    capsys.readouterr()
    assert cli.main([*run, "logging.wandb.mode=disabled"]) == 0
    out = capsys.readouterr().out
    (old,) = root.glob(f"{run_dir}.old-*")
    assert (f"{run_dir} holds an attempt interrupted before its first checkpoint: nothing to resume; starting over "
            f"(the attempt is kept in {old.relative_to(root)})") in out
    assert csv_steps(run_dir, "train/loss") == sorted(set(csv_steps(run_dir, "train/loss")))
    assert csv_steps(old, "train/loss")  # the earlier attempt's rows are kept, aside


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its bytes (the run lock aside: taking it is not a change)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_checkpoint_that_does_not_fit_the_config_is_refused_before_the_run_directory_changes(
        root, monkeypatch, capsys, offline_wandb):
    """Resumed with a checkpoint of a wider model, or evaluated with an override that changes the
    vocabulary: one line naming the weights and the config key that differ, exit 2, and nothing
    written (no metrics.csv cut-back, no W&B rows logged again, no eval directory)."""
    monkeypatch.chdir(root)
    run = ["train", "tiny.yaml", "trainer.max_steps=20", "trainer.val_every_n_steps=10"]
    assert cli.main(run) == 0
    run_dir = the_run_dir(root).relative_to(root)
    assert cli.main([*run, "model.d_model=32", "trainer.max_steps=5", "trainer.val_every_n_steps=5"]) == 0
    (wider,) = [p for p in root.glob("runs/*/*") if p.is_dir() and p.name != run_dir.name]
    (run_dir / "results.json").unlink()  # interrupted before its final evaluation ...
    (run_dir / "checkpoints" / "last.ckpt").write_bytes((wider / "checkpoints" / "last.ckpt").read_bytes())
    before = snapshot(run_dir)  # ... with a newest checkpoint of another model
    capsys.readouterr()

    assert cli.main(run) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"relpos-lab: error: {run_dir}/checkpoints/last.ckpt does not fit "
                                                   "the model this config builds: model."), err
    assert "is (14, 32) in the checkpoint, (14, 16) in the model" in err and "(and " in err
    assert "model.d_model 32 -> 16" in err and "--force" in err
    assert snapshot(run_dir) == before  # metrics.csv byte-identical, no W&B attempt added

    (best,) = (run_dir / "checkpoints").glob("best-step=*.ckpt")
    assert cli.main(["eval", str(best), "task.alphabet_size=4"]) == 2
    err = capsys.readouterr().err
    assert (err.count("\n") == 1
            and "model.decoder.output.weight is (14, 16) in the checkpoint, (8, 16) in the model" in err)
    assert "task.alphabet_size 10 -> 4" in err and "Drop the overrides" in err
    assert not (run_dir / "eval").exists() and snapshot(run_dir) == before
