"""Training through the CLI: a real Lightning fit on CPU, its run directory, resume, bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from relpos_lab import cli
from relpos_lab.records.runlock import run_lock
from relpos_lab.records.wandb_offline import read_run, read_runs

# The shipped reverse experiment made tiny by the shipped debug overlay (30 steps), on short strings.
TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 256, eval_size_per_length: 4}
model: {dropout: 0.0, positions: {max_distance: 4}}
logging: {root: runs}
"""


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "relpos_lab", *args]


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), cwd=cwd, env=env(), capture_output=True, text=True, timeout=300)


def run_dir_of(root: Path) -> Path:
    (run_dir,) = [p for p in root.glob("runs/*/*") if p.is_dir()]
    return run_dir


def global_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny reverse run through `python -m relpos_lab train`, with offline W&B."""
    root = tmp_path_factory.mktemp("train")
    (root / "tiny.yaml").write_text(TINY)
    out = run_cli("train", "tiny.yaml", cwd=root)
    assert out.returncode == 0, out.stderr[-4000:]
    return root, run_dir_of(root), out


def test_train_writes_the_run_directory(trained):
    _, run_dir, out = trained
    for name in ("config.yaml", "checkpoints/last.ckpt", "metrics.csv", "results.json"):
        assert (run_dir / name).is_file(), name
    assert sorted(p.name for p in (run_dir / "plots").glob("*.png")) == [
        "by_length_exact_match.png", "by_length_token_accuracy.png"]
    assert list((run_dir / "checkpoints").glob("best-step=*.ckpt"))
    assert f"Run directory: {run_dir.relative_to(trained[0])}" in out.stdout
    assert "results.json" in out.stdout and "exact_match" in out.stdout  # the closing summary


def test_results_hold_valid_and_test_metrics_and_every_test_length(trained):
    _, run_dir, _ = trained
    results = json.loads((run_dir / "results.json").read_text())
    for split in ("valid", "test"):
        for metric in ("exact_match", "token_accuracy", "loss"):
            assert f"{split}/{metric}" in results["metrics"]
    assert sorted(int(n) for n in results["by_length"]["test"]) == [1, 2, 3, 4, 5, 6]
    assert results["by_length"]["test"]["6"]["n"] == 4
    assert results["global_step"] == 30 and results["started_at_step"] == 0
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == 30


def test_training_learns_something(trained):
    _, run_dir, _ = trained
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    losses = [float(r.split(",")[header.index("train/loss")]) for r in rows[1:]
              if r.split(",")[header.index("train/loss")]]
    assert len(losses) >= 5 and losses[-1] < losses[0]


def test_wandb_offline_history_holds_the_logged_metrics(trained):
    _, run_dir, out = trained
    assert "wandb sync" in out.stdout  # the summary says how to upload the run
    runs = read_runs(run_dir / "wandb")
    assert len(runs) == 1
    (run,) = next(iter(runs.values()))
    assert run.metric("train/loss") and run.metric("valid/exact_match") and run.metric("test/exact_match")
    assert run.job_type == "reverse" and run.group == "tiny"


def test_a_shipped_experiment_trains_by_name_from_an_empty_directory(tmp_path):
    out = run_cli("train", "reverse_shaw", "debug", "trainer.max_steps=4", "trainer.val_every_n_steps=4",
                  "task.valid_lengths=[1,4]", "task.test_lengths=[1,4]", "task.eval_size_per_length=2",
                  "logging.wandb.mode=disabled", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = run_dir_of(tmp_path)
    assert run_dir.parent == tmp_path / "runs" / "reverse_shaw" and run_dir.name.startswith("reverse-shaw-k16-")
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 4 and sorted(results["by_length"]["test"]) == ["1", "2", "3", "4"]


def test_a_wandb_service_inherited_from_another_process_is_not_used(tmp_path):
    """wandb points child processes at its service (WANDB_SERVICE); relpos-lab starts its own.

    A parent's service may be gone (here: a socket nobody listens on), and even a live one writes
    the child's offline file after the child has exited.
    """
    from wandb.sdk.lib.service.service_token import UnixServiceToken

    (tmp_path / "tiny.yaml").write_text(TINY)
    stale = UnixServiceToken(parent_pid=os.getpid(), path=str(tmp_path / "no-such-socket")).env_value
    out = subprocess.run(command("train", "tiny.yaml", "trainer.max_steps=5", "trainer.val_every_n_steps=5"),
                         cwd=tmp_path, env={**env(), "WANDB_SERVICE": stale}, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "could not start W&B run" not in out.stderr and "wandb sync" in out.stdout
    (run,) = next(iter(read_runs(run_dir_of(tmp_path) / "wandb").values()))
    assert run.metric("test/exact_match")


def test_eval_command_reproduces_the_final_test_metrics(trained):
    root, run_dir, _ = trained
    results = json.loads((run_dir / "results.json").read_text())
    checkpoint = run_dir / results["checkpoint"]
    out = run_cli("eval", str(checkpoint), "--split", "test", "--output", "eval_out", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    evaluated = json.loads((root / "eval_out" / "results.json").read_text())
    for name in ("exact_match", "token_accuracy", "loss"):
        assert evaluated["metrics"][f"test/{name}"] == pytest.approx(results["metrics"][f"test/{name}"], abs=1e-6)
    assert evaluated["by_length"]["test"] == results["by_length"]["test"]


def test_eval_overrides_apply_to_the_checkpoints_config(trained):
    root, run_dir, _ = trained
    out = run_cli("eval", str(run_dir / "checkpoints" / "last.ckpt"), "--split", "test",
                  "task.test_lengths=[7,8]", "--output", "longer", cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    evaluated = json.loads((root / "longer" / "results.json").read_text())
    assert sorted(evaluated["by_length"]["test"]) == ["7", "8"]
    assert evaluated["overrides"] == ["task.test_lengths=[7,8]"]
    assert "test_lengths:\n  - 7\n  - 8\n" in (root / "longer" / "config.yaml").read_text()


def test_evaluations_with_other_overrides_keep_their_own_default_directories(trained):
    root, run_dir, _ = trained
    for lengths in ("[7,8]", "[9,9]"):
        out = run_cli("eval", str(run_dir / "checkpoints" / "last.ckpt"), f"task.test_lengths={lengths}", cwd=root)
        assert out.returncode == 0, out.stderr[-3000:]
    outputs = sorted((run_dir / "eval").glob("last-test-*/results.json"))
    assert len(outputs) == 2
    assert {tuple(json.loads(p.read_text())["by_length"]["test"]) for p in outputs} == {("7", "8"), ("9",)}


def test_rerunning_a_finished_run_prints_its_results(trained, monkeypatch, capsys):
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    assert cli.main(["train", "tiny.yaml", "logging.wandb.mode=disabled"]) == 0
    out = capsys.readouterr().out
    assert f"{run_dir.relative_to(root)} is finished (results.json): nothing to train" in out and "exact_match" in out


def test_a_runs_own_config_that_resolves_elsewhere_is_refused(trained, monkeypatch, capsys):
    """What a requeued job trains: the run's config.yaml. If it no longer resolves to that run (a
    new config default, an override, another working directory), nothing starts from scratch."""
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    own = str(run_dir.relative_to(root) / "config.yaml")
    err = one_line_error(capsys, "train", own, "resume=true", "seed=7")
    assert f"belongs to the run in {run_dir.relative_to(root)}, but now resolves to" in err
    assert "Nothing was trained" in err and len([p for p in root.glob("runs/*/*") if p.is_dir()]) == 1
    monkeypatch.chdir(root / "runs")  # logging.root=runs is relative: from here it is runs/runs
    assert "now resolves to" in one_line_error(capsys, "train", str(run_dir / "config.yaml"), "resume=true")


def test_resuming_a_finished_run_trains_and_writes_nothing(trained, monkeypatch, capsys):
    """A job array submitted twice reaches a point the first one finished: nothing happens."""
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    files = {p: p.stat().st_mtime_ns for p in (run_dir / "results.json", run_dir / "checkpoints" / "last.ckpt")}
    assert cli.main(["train", "tiny.yaml", "resume=true", "logging.wandb.mode=disabled"]) == 0
    assert "is finished (results.json): nothing to train" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in files} == files


def test_a_run_being_trained_elsewhere_is_not_trained_twice(trained, monkeypatch, capsys):
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    before = (run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns
    with run_lock(run_dir):  # another trainer of this run (flock: a second open file conflicts too)
        err = one_line_error(capsys, "train", "tiny.yaml", "resume=true", "logging.wandb.mode=disabled")
    assert f"{run_dir.relative_to(root)} is being trained by pid {os.getpid()} on " in err
    assert (run_dir / "checkpoints" / "last.ckpt").stat().st_mtime_ns == before
    with run_lock(run_dir):  # released when its holder ends
        pass


@pytest.mark.slow  # test_rerun.py's SIGKILL case checks the same resume, with one history, by default
def test_killed_run_resumes_from_last_checkpoint_in_the_same_directory(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    args = ["train", "tiny.yaml", "trainer.max_steps=300", "trainer.val_every_n_steps=150",
            "trainer.checkpoint_every_n_steps=20"]
    first = subprocess.Popen(command(*args), cwd=tmp_path, env=env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        while not list(tmp_path.glob("runs/*/*/checkpoints/last.ckpt")) and first.poll() is None:
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.05)
    finally:
        os.killpg(first.pid, signal.SIGKILL)  # preemption: no chance to clean up
        first.wait()
    run_dir = run_dir_of(tmp_path)
    killed_at = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert 0 < killed_at < 300

    out = run_cli(*args, "resume=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    assert "not resumable" not in out.stderr  # Lightning restores the loader's place in the epoch
    assert run_dir_of(tmp_path) == run_dir  # same directory, no second run
    results = json.loads((run_dir / "results.json").read_text())
    assert results["started_at_step"] == killed_at and results["global_step"] == 300
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == 300
    # Both attempts log into one W&B run (the killed attempt's file may be cut short).
    attempts = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(attempts) == 2 and len({p.name.rsplit("-", 1)[1] for p in attempts}) == 1
    (resumed,) = attempts[1].glob("run-*.wandb")
    assert read_run(resumed).run_id == attempts[0].name.rsplit("-", 1)[1]


# --- bad input: one clear line on stderr, exit status 2 ------------------------------------------


def one_line_error(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: ")
    return err


@pytest.fixture
def tiny(tmp_path, monkeypatch) -> str:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    return "tiny.yaml"


def test_unknown_config_key_is_one_line(tiny, capsys, tmp_path):
    (tmp_path / "bad.yaml").write_text("extends: tiny.yaml\ntrainer: {max_step: 3}\n")
    err = one_line_error(capsys, "train", "bad.yaml")
    assert ("bad.yaml: unknown key 'trainer.max_step'; did you mean 'trainer.max_steps' (optimizer steps to train)?"
            in err)


def test_misspelled_task_is_one_line(tiny, capsys):
    err = one_line_error(capsys, "train", tiny, "task.name=revrse")
    assert "unknown task 'revrse'; did you mean 'reverse'?" in err


def test_impossible_model_shape_is_one_line(tiny, capsys):
    err = one_line_error(capsys, "train", tiny, "model.d_model=30", "model.n_heads=4")
    assert "model.d_model=30 is not divisible by model.n_heads=4" in err


def test_missing_config_file_is_one_line(tiny, capsys):
    assert "config file not found: missing.yaml" in one_line_error(capsys, "train", "missing.yaml")


def test_fp16_on_cpu_is_one_line(tiny, capsys):
    err = one_line_error(capsys, "train", tiny, "trainer.precision=16-mixed")
    assert "needs a GPU" in err and "bf16-mixed" in err


def test_missing_checkpoint_is_one_line(tiny, capsys):
    assert "checkpoint not found" in one_line_error(capsys, "eval", "nope.ckpt")


def test_a_file_that_is_not_a_checkpoint_is_one_line_without_torchs_mmap_advice(tiny, tmp_path, capsys):
    """It used to say: re-save it with `torch.save(_use_new_zipfile_serialization=True)` (advice for mmap)."""
    (tmp_path / "config.yaml").write_text(TINY)
    err = one_line_error(capsys, "eval", "config.yaml")
    assert err.startswith("relpos-lab: error: config.yaml is not a checkpoint torch can read (torch.load: ")
    assert err.endswith("); give a .ckpt file written by `relpos-lab train`, e.g. "
                        "runs/<name>/<run>/checkpoints/last.ckpt\n")
    assert "_use_new_zipfile_serialization" not in err
    (tmp_path / "empty.ckpt").write_bytes(b"")
    assert ("empty.ckpt is not a checkpoint torch can read (torch.load: EOFError"
            in one_line_error(capsys, "eval", "empty.ckpt"))
    torch.save({"state_dict": {}}, tmp_path / "legacy.ckpt", _use_new_zipfile_serialization=False)
    err = one_line_error(capsys, "eval", "legacy.ckpt")  # torch's legacy format is read (without mmap)
    assert "legacy.ckpt: not a relpos-lab checkpoint (no config in its hyperparameters)" in err


def test_the_closing_summary_shows_every_metric_name_whole_in_80_columns(tmp_path, monkeypatch):
    """A column per metric used to truncate them (`exact…`): id and ood could not be told apart."""
    import io

    from rich.console import Console

    from relpos_lab import terminal
    from relpos_lab.training.experiment import RunSummary

    names = ["exact_match", "token_accuracy", "loss", "ppl", "exact_match_id", "exact_match_ood",
             "token_accuracy_id", "token_accuracy_ood"]
    metrics = {f"{split}/{name}": i / 10 for split in ("valid", "test") for i, name in enumerate(names)}
    out = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=out, width=80, color_system=None))
    terminal.show_summary(RunSummary(tmp_path, tmp_path / "results.json", metrics), "tiny: trained")
    text = out.getvalue()
    table = text[text.index("┏"):]
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80, text
    rows = {line.split("│")[1].strip(): line.split("│")[2:4] for line in text.splitlines() if line.count("│") == 4}
    assert list(rows) == names and "┃ metric " in table
    assert [cell.strip() for cell in rows["exact_match_ood"]] == ["0.5000", "0.5000"]


def test_console_script_reports_bad_input_without_traceback(tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    script = Path(sys.executable).with_name("relpos-lab")
    out = subprocess.run([str(script), "train", "tiny.yaml", "task.name=revrse"], cwd=tmp_path, env=env(),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith("relpos-lab: error: command line: task.name: unknown task 'revrse'")
    assert "did you mean 'reverse'?" in line


def test_config_command_prints_the_resolved_config_and_its_run_directory(tiny, capsys):
    assert cli.main(["config", tiny, "optim.lr=0.5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# run directory: runs/tiny/reverse-shaw-k4-")
    assert "  lr: 0.5\n" in out and "  name: reverse\n" in out


def test_eval_of_an_unknown_split_lists_the_splits(trained, monkeypatch, capsys):
    root, run_dir, _ = trained
    monkeypatch.chdir(root)
    err = one_line_error(capsys, "eval", str(run_dir / "checkpoints" / "last.ckpt"), "--split", "tset")
    assert "no split 'tset'; did you mean 'test'? splits: train, valid, test" in err


def test_stop_at_ends_training_at_the_first_validation_past_it_and_randomized_positions_train(tmp_path):
    """trainer.stop_at (Lightning's EarlyStopping threshold on the task's main metric): any exact match
    passes -1, so training stops at the first validation, step 10 of 30. The same run trains Shaw at
    randomized positions (Ruoss et al.) through the whole CLI path; its directory names it."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = run_cli("train", "tiny.yaml", "trainer.max_steps=30", "trainer.val_every_n_steps=10", "trainer.stop_at=-1",
                  "model.positions.max_random_len=32", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = run_dir_of(tmp_path)
    assert "-k4-rand32-" in run_dir.name
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 10
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == 10


def test_randomized_positions_at_evaluation_give_the_same_numbers_each_time_a_checkpoint_is_evaluated(tmp_path):
    """model.positions.randomize_at_eval (Ruoss et al.'s protocol) draws positions at evaluation
    too, from the run's seed at the start of every evaluation: `eval` reproduces the final test.
    `inspect` measures attention at token distances, in order."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    out = run_cli("train", "tiny.yaml", "trainer.max_steps=20", "trainer.val_every_n_steps=10",
                  "model.positions.max_random_len=32", "model.positions.randomize_at_eval=true", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-4000:]
    run_dir = run_dir_of(tmp_path)
    assert "-k4-rand32eval-" in run_dir.name
    results = json.loads((run_dir / "results.json").read_text())
    out = run_cli("eval", str(run_dir / results["checkpoint"]), "--split", "test", "--output", "again", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    again = json.loads((tmp_path / "again" / "results.json").read_text())
    for name in ("exact_match", "token_accuracy", "loss"):
        assert again["metrics"][f"test/{name}"] == pytest.approx(results["metrics"][f"test/{name}"], abs=1e-6)
    assert again["by_length"]["test"] == results["by_length"]["test"]
    out = run_cli("inspect", str(run_dir / results["checkpoint"]), "--out", "inspected", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert json.loads((tmp_path / "inspected" / "inspect.json").read_text())["sets"]["valid"]["attention"]
