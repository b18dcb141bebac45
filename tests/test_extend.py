"""Training longer in place (`train --extend`), and starts that fail: what is left on disk, what is said."""
from __future__ import annotations

import contextlib
import csv
import errno
import io
import json
import os

import pytest
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.config import load_config
from relpos_lab.records.rundir import budget_siblings, run_directory
from relpos_lab.records.wandb_offline import read_runs
from relpos_lab.training import experiment

from test_train import TINY, global_step, run_dir_of


def one_line_error(capsys, *argv: str) -> str:
    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: "), err
    return err


def main(*argv: str) -> tuple[int, str, str]:
    """`relpos-lab ARGV` in this process (faster than a subprocess): exit status, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def extended(tmp_path_factory):
    """A tiny run of 30 steps, then the same config with trainer.max_steps=45 and --extend."""
    root = tmp_path_factory.mktemp("extend")
    (root / "tiny.yaml").write_text(TINY)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(root / "wandb_files"))
        status, _, err = main("train", "tiny.yaml")
        assert status == 0, err[-4000:]
        refused = main("train", "tiny.yaml", "trainer.max_steps=45")
        status, out, err = main("train", "tiny.yaml", "trainer.max_steps=45", "--extend")
        assert status == 0, err[-4000:]
        import wandb

        wandb.teardown()  # W&B's settings and service of this process were made with this fixture's environment
    return root, run_dir_of(root), refused, out


def test_a_config_differing_only_in_its_budget_is_refused_naming_the_run_and_extend(extended):
    root, run_dir, (status, _, err), _ = extended
    assert status == 2 and err.count("\n") == 1 and err.startswith("relpos-lab: error: ")
    assert str(run_dir.relative_to(root)) in err and "--extend" in err
    assert "trainer.max_steps 30 -> 45" in err and "extend=false" in err


def test_extend_continues_the_run_in_its_own_directory(extended):
    root, run_dir, _, out = extended
    assert [p for p in root.glob("runs/*/*") if p.is_dir()] == [run_dir]  # no second directory
    assert "--extend: continuing" in out and "(resuming from last.ckpt)" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 45 and results["started_at_step"] == 30
    assert json.loads((run_dir / "results.step-30.json").read_text())["global_step"] == 30
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == 45
    assert OmegaConf.load(run_dir / "config.yaml").trainer.max_steps == 45
    assert json.loads((run_dir / "extended.json").read_text())[0]["from_step"] == 30


def test_an_extended_run_keeps_one_metrics_history_and_one_wandb_run(extended):
    _, run_dir, _, _ = extended
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    train_steps = [int(r["step"]) for r in rows if r.get("train/loss")]
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] == 44
    assert [int(r["step"]) for r in rows if r.get("valid/exact_match")] == [15, 30, 45]
    evaluated = json.loads((run_dir / "results.json").read_text())["checkpoint_step"]
    # the final evaluation, once, at the step of the checkpoint it measured
    assert [int(r["step"]) for r in rows if r.get("test/exact_match")] == [evaluated]
    runs = read_runs(run_dir / "wandb")
    assert len(runs) == 1  # one run id, two attempts
    (attempts,) = runs.values()
    assert len(attempts) == 2


def test_an_extended_run_is_found_by_its_new_budget_its_old_one_and_its_own_config(extended, monkeypatch, capsys):
    root, run_dir, _, _ = extended
    monkeypatch.chdir(root)
    monkeypatch.setenv("WANDB_SILENT", "true")
    for argv in (["tiny.yaml", "trainer.max_steps=45"], ["tiny.yaml"], [str(run_dir / "config.yaml"), "resume=true"]):
        assert cli.main(["train", *argv, "logging.wandb.mode=disabled"]) == 0
        assert "is finished (results.json, extended to trainer.max_steps=45" in capsys.readouterr().out


def test_extend_false_is_a_separate_run_and_the_hash_of_other_configs_is_unchanged(extended, monkeypatch):
    root, run_dir, _, _ = extended
    monkeypatch.chdir(root)
    longer = load_config("tiny.yaml", ["trainer.max_steps=60", "extend=false"])
    target, extending = experiment.training_directory(longer)
    assert not extending and target == run_directory(longer) and target != run_dir.relative_to(root)
    assert budget_siblings(longer) == [run_dir.relative_to(root)]
    # `extend` is left out of the hash like `resume`: the run directory of a config is what it was
    assert run_directory(load_config("tiny.yaml", ["extend=true"])) == run_directory(load_config("tiny.yaml"))


def test_submit_refuses_another_budget_and_with_extend_submits_the_run_itself(extended, monkeypatch, capsys):
    root, run_dir, _, _ = extended
    monkeypatch.chdir(root)
    assert "add --extend" in one_line_error(capsys, "submit", "tiny.yaml", "trainer.max_steps=60", "--dry-run")
    assert cli.main(["submit", "tiny.yaml", "trainer.max_steps=60", "--extend", "--dry-run"]) == 0
    assert f"relpos-lab train {run_dir.resolve()}/config.yaml resume=true" in capsys.readouterr().out


def test_extend_without_a_run_to_extend_says_so(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, "train", "tiny.yaml", "--extend", "logging.wandb.mode=disabled")
    assert "nothing to extend" in err and not (tmp_path / "runs").exists()


def test_a_start_that_fails_validation_leaves_no_run_directory(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, "train", "tiny.yaml", "trainer.strategy=bogus", "logging.wandb.mode=disabled")
    assert "strategy" in err
    assert not (tmp_path / "runs").exists()


def test_a_file_where_the_run_directory_goes_is_one_line_naming_the_path(tmp_path, monkeypatch, capsys):
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "blocked").write_text("a file, not a directory")
    monkeypatch.chdir(tmp_path)
    err = one_line_error(capsys, "train", "tiny.yaml", "logging.root=blocked", "logging.wandb.mode=disabled")
    assert err.startswith("relpos-lab: error: cannot write blocked/tiny/reverse-shaw-k4-")
    assert ": Not a directory; no checkpoint was written" in err


def test_a_full_disk_is_one_line_naming_the_file_and_the_intact_checkpoint(tmp_path, monkeypatch, capsys):
    """The second write of last.ckpt (step 30) meets a full disk; the one of step 15 stays."""
    (tmp_path / "tiny.yaml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_SILENT", "true")
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        if (".last.ckpt." in os.readlink(f"/proc/self/fd/{fd}")
                and list(tmp_path.glob("runs/*/*/checkpoints/last.ckpt"))):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr("relpos_lab.api.files.os.fsync", fsync)
    err = one_line_error(capsys, "train", "tiny.yaml", "logging.wandb.mode=disabled")
    run_dir = run_dir_of(tmp_path).relative_to(tmp_path)
    last = run_dir / "checkpoints" / "last.ckpt"
    assert err.startswith(f"relpos-lab: error: cannot write {last}: No space left on device (")
    assert " MB free; a checkpoint takes " in err and "); the newest checkpoint, " in err
    assert "(step 15), is intact" in err
    assert global_step(tmp_path / last) == 15 and not list((tmp_path / run_dir).rglob("*.tmp"))
