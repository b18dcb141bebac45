"""Sweeps packed several runs to a GPU (cluster.runs_per_gpu), or stacked into one model (cluster.stack),
on the real SLURM dev cluster.

An array task of a packed sweep starts one job step per grid point (`srun --overlap -n1`), all at
once, each training its own run directory with its own W&B run. CPU processes stand in for the
runs that would share a GPU. The helpers are tests/test_slurm_cluster.py's; tests/test_slurm.py
checks the rendered script and the refusals without a cluster.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch

from relpos_lab import cli
from relpos_lab.records.wandb_offline import history, read_runs

from test_slurm_cluster import (
    NO_CLUSTER,
    WAIT_S,
    logged_steps,
    submit,
    wait_for,
    workdir,  # noqa: F401 (a fixture: the tests take it as a parameter)
)

pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.skipif(NO_CLUSTER is not None,
                                                                            reason=NO_CLUSTER or "")]


def write_sweep(root: Path, seeds: list[int], overrides: list[str]) -> None:
    (root / "sweep.yaml").write_text(
        "experiment: tiny.yaml\nname: packed\n"
        f"overrides: [cluster.runs_per_gpu=2, {', '.join(overrides)}]\n"
        f"grid:\n  seed: {seeds}\n")


def points(root: Path) -> list[dict]:
    return json.loads((root / "runs" / "packed" / "sweep.json").read_text())["points"]


def step_log(root: Path, job_id: str, task: int, point: int) -> str:
    """What the job step of `point` in array task `task` wrote (stdout and stderr)."""
    base = root / "runs" / "packed" / "slurm" / f"{job_id}_{task}.{point}"
    return "".join(base.with_suffix(f"{base.suffix}.{ext}").read_text() for ext in ("out", "err"))


def task_log(root: Path, job_id: str, task: int) -> str:
    base = root / "runs" / "packed" / "slurm" / f"{job_id}_{task}"
    return "".join(Path(f"{base}.{ext}").read_text() for ext in ("out", "err"))


def test_three_points_packed_two_to_a_task_each_train_in_their_own_run_directory(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    write_sweep(workdir, [1, 2, 3], ["trainer.max_steps=20"])
    job_id = submit(capsys, "sweep", "sweep.yaml", "--slurm")
    records = wait_for(job_id, tasks=2)
    assert sorted(r["ArrayTaskId"] for r in records) == ["0", "1"]  # ceil(3 / 2) tasks
    assert {r["JobState"] for r in records} == {"COMPLETED"}, [task_log(workdir, job_id, t) for t in (0, 1)]
    assert {r["NumTasks"] for r in records} == {"2"}  # a task per run (an array has one shape)
    runs = points(workdir)
    assert len({p["run_dir"] for p in runs}) == 3
    for point, task in zip(runs, (0, 0, 1)):
        run_dir = Path(point["run_dir"])
        results = json.loads((run_dir / "results.json").read_text())
        assert results["global_step"] == 20 and "test/exact_match" in results["metrics"]
        text = step_log(workdir, job_id, task, point["index"])
        assert run_dir.name in text  # the step trained its pinned point, and wrote its own log
        ((run,),) = read_runs(run_dir / "wandb").values()  # its own W&B run
        assert run.config["provenance"]["slurm"]["array_job_id"] == job_id and run.metric("test/exact_match")
        assert run.config["provenance"]["slurm"]["array_task_id"] == str(task)
    assert cli.main(["sweep", "sweep.yaml", "--slurm"]) == 0  # a finished sweep submits nothing
    assert "every point is finished; nothing to submit" in capsys.readouterr().out


def wait_for_checkpoints(run_dirs: list[Path]) -> None:
    """Until every run has saved its first periodic checkpoint."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if all((d / "checkpoints" / "last.ckpt").is_file() for d in run_dirs):
            time.sleep(0.5)  # let the last one finish writing
            return
        time.sleep(0.1)
    pytest.fail(f"no periodic checkpoint in each of {run_dirs}")


def requeued_once(root: Path, job_id: str, ready) -> str:
    """SIGUSR1 to array task 0 once `ready()` returns; its log, after it completed on its second attempt."""
    try:
        ready()
        subprocess.run(["scancel", "-s", "USR1", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    text = task_log(root, job_id, 0)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", text[-3000:]
    return text


@pytest.mark.slow  # ~40 s; a solo job's requeue is test_slurm_cluster's, in the default tier
def test_a_packed_task_signalled_mid_training_requeues_once_and_every_run_resumes(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    # The two runs start seconds apart on a busy machine (one was 60 steps ahead at the signal):
    # 400 steps keep both mid-training when the second has saved its first checkpoint.
    steps = 400
    write_sweep(workdir, [1, 2], [f"trainer.max_steps={steps}", "trainer.log_every_n_steps=1",
                                  "trainer.val_every_n_steps=200", "trainer.checkpoint_every_n_steps=20"])
    job_id = submit(capsys, "sweep", "sweep.yaml", "--slurm")
    run_dirs = [Path(p["run_dir"]) for p in points(workdir)]
    text = requeued_once(workdir, job_id, lambda: wait_for_checkpoints(run_dirs))
    assert "attempt 1 " in text and "attempt 2 " in text
    for index, run_dir in enumerate(run_dirs):
        log = step_log(workdir, job_id, 0, index)
        results = json.loads((run_dir / "results.json").read_text())
        assert 0 < results["started_at_step"] < steps and results["global_step"] == steps, log[-3000:]
        assert "resuming from " in log and "Traceback" not in log, log[-3000:]  # W&B's exit hook included
        assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))  # nothing lost, nothing twice
        assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))
        assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == steps
        (attempts,) = read_runs(run_dir / "wandb").values()  # one W&B run per point, continued
        assert len(attempts) == 2
        assert [r["trainer/global_step"] for r in history(attempts) if "train/loss" in r] == list(range(steps))


def test_more_packed_runs_than_a_node_has_cpus_are_refused_naming_runs_per_gpu(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    write_sweep(workdir, list(range(1, cpus + 2)), [f"cluster.runs_per_gpu={cpus + 1}"])
    assert cli.main(["sweep", "sweep.yaml", "--slurm"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SLURM cannot run this job" in err, err
    assert f"{cpus + 1} task(s) x 1 CPUs ({cpus + 1} runs per GPU)" in err
    assert "lower cluster.runs_per_gpu / cluster.cpus_per_task" in err
    assert not (workdir / "runs" / "packed" / "slurm").exists()


@pytest.mark.slow  # ~60 s
def test_a_stacked_task_signalled_mid_training_requeues_once_and_resumes_the_stack(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    """Two seeds as one stack in one array task: SIGUSR1 mid-training saves the stack's checkpoint at
    the end of its step and requeues the task; the next attempt resumes the stack there and writes
    both members, every step logged once."""
    steps = 400
    (workdir / "sweep.yaml").write_text(
        "experiment: tiny.yaml\nname: packed\n"
        f"overrides: [trainer.max_steps={steps}, trainer.log_every_n_steps=1, trainer.val_every_n_steps=200, "
        "trainer.checkpoint_every_n_steps=20]\ngrid:\n  seed: [1, 2]\n")
    job_id = submit(capsys, "sweep", "sweep.yaml", "--slurm", "--stack", "2")
    stacks = workdir / "runs" / "packed" / "stacks"

    def saved() -> None:
        deadline = time.monotonic() + WAIT_S
        while not list(stacks.glob("stack-*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)

    text = requeued_once(workdir, job_id, saved)
    assert "the stack stopped after step " in text and "requeueing SLURM job" in text, text[-3000:]
    assert "stack of 2: resuming at step " in text, text[-3000:]
    for run_dir in (Path(p["run_dir"]) for p in points(workdir)):
        results = json.loads((run_dir / "results.json").read_text())
        assert results["global_step"] == steps and "test/exact_match" in results["metrics"]
        assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))  # nothing lost, nothing twice
    assert not list(stacks.iterdir())  # every member written: the stack's checkpoint is gone
