"""Real jobs on a real SLURM cluster (slurm/dev-cluster-start.sh brings one up on this machine).

Each test submits through the CLI and waits for the job with scontrol (there is no accounting
database, so no sacct): a two-task DDP job trains to completion, a two-point sweep runs as one
job array, and a job sent SIGUSR1 mid-training checkpoints, requeues itself and finishes from its
checkpoint in the same run directory and W&B run. CPU processes stand in for GPUs (gloo).
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest
import torch

from relpos_lab import cli
from relpos_lab.records.wandb_offline import history, read_runs


def _no_cluster() -> str | None:
    if shutil.which("sbatch") is None:
        return "needs SLURM (slurm/dev-cluster-start.sh)"
    from relpos_lab.launch.slurm import cluster_unreachable

    why = cluster_unreachable()
    return (f"sbatch is installed but no SLURM cluster answers ({why}); slurm/dev-cluster-start.sh starts one"
            if why else None)


NO_CLUSTER = _no_cluster()
pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.skipif(NO_CLUSTER is not None,
                                                                            reason=NO_CLUSTER or "")]

TINY = """
task: {name: reverse, train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 5],
       train_size: 256, eval_size_per_length: 3}
model: {d_model: 16, n_heads: 2, d_ff: 32, n_encoder_layers: 1, n_decoder_layers: 1, dropout: 0.0,
        attention_dropout: 0.0, positions: {scheme: shaw, max_distance: 4}}
data: {batch_size: 8, eval_batch_size: 32}
optim: {lr: 0.003, warmup_steps: 5}
trainer: {accelerator: cpu, max_steps: 40, val_every_n_steps: 20, log_every_n_steps: 5,
          num_sanity_val_steps: 0, enable_progress_bar: false, enable_model_summary: false}
cluster: {cpus_per_task: 1, time: "00:15:00"}
logging: {root: runs, inspect: false}
"""
DDP = ["trainer.devices=2", "trainer.strategy=ddp"]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
            "PREEMPTED"}
WAIT_S = 300  # generous: the dev cluster may be shared with other jobs


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    return tmp_path


def submit(capsys, *argv: str) -> str:
    """Run a submitting command through the CLI; returns the job id it printed."""
    assert cli.main(list(argv)) == 0
    out = capsys.readouterr().out
    match = re.search(r"submitted SLURM job (\d+)", out)
    assert match, out
    return match.group(1)


def job_records(job_id: str) -> list[dict[str, str]]:
    """scontrol's records of a job (one per array task once the tasks have started)."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return [dict(field.split("=", 1) for field in line.split() if "=" in field) for line in out.stdout.splitlines()]


def wait_for(job_id: str, tasks: int = 1, timeout: float = WAIT_S) -> list[dict[str, str]]:
    """Poll until all `tasks` records of the job are in a final state; cancel it on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        records = job_records(job_id)
        if len(records) == tasks and all(r["JobState"] in TERMINAL for r in records):
            return records
        time.sleep(0.5)
    subprocess.run(["scancel", job_id], timeout=30)
    pytest.fail(f"job {job_id} did not finish within {timeout:.0f}s: {job_records(job_id)}")


def logs(run_dir: Path, job_id: str) -> str:
    return "".join((run_dir / "slurm" / f"{job_id}.{ext}").read_text() for ext in ("out", "err"))


def the_run_dir(root: Path) -> Path:
    (run_dir,) = [p.parent for p in root.glob("runs/*/*/config.yaml")]
    return run_dir


def global_step(checkpoint: Path) -> int:
    return torch.load(checkpoint, map_location="cpu", weights_only=False)["global_step"]


def first_periodic_checkpoint(root: Path) -> int:
    """Wait for the run's first last.ckpt and return its step (retrying while it is being written)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        last = next(root.glob("runs/*/*/checkpoints/last.ckpt"), None)
        if last is not None:
            try:
                return global_step(last)
            except (OSError, RuntimeError, EOFError):  # still being written
                pass
        time.sleep(0.1)
    pytest.fail("no periodic checkpoint appeared")


def final_checkpoint(root: Path, steps: int) -> None:
    """Wait until last.ckpt holds the finished training (the final evaluation comes next)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        last = next(root.glob("runs/*/*/checkpoints/last.ckpt"), None)
        try:
            if last is not None and global_step(last) == steps:
                return
        except (OSError, RuntimeError, EOFError):  # still being written
            pass
        time.sleep(0.1)
    pytest.fail(f"no last.ckpt at step {steps} appeared")


def logged_steps(run_dir: Path, key: str) -> list[int]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return [int(row["step"]) for row in csv.DictReader(file) if row.get(key)]


def test_a_two_task_job_trains_with_ddp_to_completion(workdir, capsys):
    job_id = submit(capsys, "submit", "tiny.yaml", *DDP)
    assert cli.main(["submit", "tiny.yaml", *DDP]) == 2  # the same run again, while queued or running
    assert f"already queued or running as SLURM job {job_id}" in capsys.readouterr().err
    (record,) = wait_for(job_id)
    run_dir = the_run_dir(workdir)
    assert record["JobState"] == "COMPLETED", logs(run_dir, job_id)[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == 40 and "test/exact_match" in results["metrics"]
    text = logs(run_dir, job_id)
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in text and "GLOBAL_RANK: 1, MEMBER: 2/2" in text
    assert "SLURM auto-requeueing enabled" in text  # Lightning wired the ranks from SLURM's variables
    (attempts,) = read_runs(run_dir / "wandb").values()
    (run,) = attempts
    assert run.config["provenance"]["slurm"]["job_id"] == job_id
    assert run.metric("test/exact_match")
    assert cli.main(["submit", "tiny.yaml", *DDP]) == 2  # finished: nothing to submit
    assert "is finished (results.json): nothing to submit" in capsys.readouterr().err


@pytest.mark.slow  # ~28 s; tests/test_extend.py extends a run and checks the script `submit --extend` writes
def test_a_finished_ddp_run_extended_through_sbatch_continues_one_run(workdir, capsys):
    """`submit --extend` on a finished two-rank run: the job resumes the run's last.ckpt in its own
    directory (no second one) and every step, validation and W&B attempt lands in one history."""
    first = submit(capsys, "submit", "tiny.yaml", *DDP, "trainer.max_steps=20", "trainer.val_every_n_steps=10")
    (record,) = wait_for(first)
    run_dir = the_run_dir(workdir)
    assert record["JobState"] == "COMPLETED", logs(run_dir, first)[-3000:]
    assert cli.main(["submit", "tiny.yaml", *DDP, "trainer.max_steps=40", "trainer.val_every_n_steps=10"]) == 2
    assert "add --extend" in capsys.readouterr().err  # another budget is refused, naming the fix

    second = submit(capsys, "submit", "tiny.yaml", *DDP, "trainer.max_steps=40", "trainer.val_every_n_steps=10",
                    "--extend")
    (record,) = wait_for(second)
    text = logs(run_dir, second)
    assert record["JobState"] == "COMPLETED", text[-3000:]
    assert the_run_dir(workdir) == run_dir and "(resuming from last.ckpt)" in text
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in text  # the extension trained with both ranks again
    results = json.loads((run_dir / "results.json").read_text())
    assert (results["started_at_step"], results["global_step"]) == (20, 40)
    assert json.loads((run_dir / "results.step-20.json").read_text())["global_step"] == 20
    assert json.loads((run_dir / "extended.json").read_text())[0]["from_step"] == 20
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == 40
    train_steps = logged_steps(run_dir, "train/loss")
    assert train_steps == sorted(set(train_steps)) and train_steps[-1] >= 35  # one history, in order
    assert logged_steps(run_dir, "valid/exact_match") == [10, 20, 30, 40]
    # The final evaluation, once, at the step of the checkpoint it tested (trainer.evaluate=best: the
    # best validated one, 10 where the tiny model's validation peaks there).
    assert logged_steps(run_dir, "test/exact_match") == [results["checkpoint_step"]]
    (attempts,) = read_runs(run_dir / "wandb").values()  # one W&B run id, one attempt per job
    assert len(attempts) == 2 and {a.config["provenance"]["slurm"]["job_id"] for a in attempts} == {first, second}


def test_a_sweep_runs_as_one_job_array_with_a_run_directory_per_point(workdir, capsys):
    (workdir / "sweep.yaml").write_text("experiment: tiny.yaml\nname: grid\n"
                                        "overrides: [trainer.max_steps=20, cluster.array_parallelism=2]\n"
                                        "grid:\n  seed: [1, 2]\n")
    job_id = submit(capsys, "sweep", "sweep.yaml", "--slurm")
    records = wait_for(job_id, tasks=2)
    assert sorted(r["ArrayTaskId"] for r in records) == ["0", "1"]
    assert {r["JobState"] for r in records} == {"COMPLETED"}
    manifest = json.loads((workdir / "runs" / "grid" / "sweep.json").read_text())
    for point in manifest["points"]:
        results = json.loads((Path(point["run_dir"]) / "results.json").read_text())
        assert results["global_step"] == 20
        log = (workdir / "runs" / "grid" / "slurm" / f"{job_id}_{point['index']}.out").read_text()
        assert f"relpos-lab: job {job_id}_{point['index']}, job id " in log  # named as squeue shows it
        assert f"(array task {point['index']})" in log and Path(point["run_dir"]).name in log  # the pinned point
    assert len({p["run_dir"] for p in manifest["points"]}) == 2


@pytest.mark.slow  # ~25 s; tests/test_slurm_two_nodes.py requeues by USR1 and scontrol by default
def test_a_signalled_job_checkpoints_requeues_and_finishes_from_its_checkpoint(workdir, capsys):
    # Logging every step makes the step of the hpc checkpoint a logged one, wherever the signal lands.
    steps, every = 150, 20
    job_id = submit(capsys, "submit", "tiny.yaml", *DDP, f"trainer.max_steps={steps}", "trainer.log_every_n_steps=1",
                    "trainer.val_every_n_steps=75", f"trainer.checkpoint_every_n_steps={every}")
    try:
        saved_before_signal = first_periodic_checkpoint(workdir)
        subprocess.run(["scancel", "-s", "USR1", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)  # a no-op once the job is done
    run_dir = the_run_dir(workdir)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", text[-3000:]
    assert "attempt 1 " in text and "attempt 2 " in text  # both attempts appended to one log

    # The second attempt started from the checkpoint taken at the signal, no earlier than the last
    # periodic checkpoint, and trained to the end.
    results = json.loads((run_dir / "results.json").read_text())
    resumed_at = results["started_at_step"]
    assert saved_before_signal <= resumed_at < steps and results["global_step"] == steps
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))  # the requeue checkpoint is gone once the run is finished
    assert "resuming from hpc_ckpt_1.ckpt" in text
    assert "Traceback" not in text, text[-3000:]  # W&B's exit hook does not reach for its stopped service

    # Every logged step is in metrics.csv exactly once: nothing lost, nothing replayed.
    assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))

    # One W&B run, continued by the second attempt.
    runs = read_runs(run_dir / "wandb")
    assert len(runs) == 1
    (attempts,) = runs.values()
    assert len(attempts) == 2
    assert max(attempts[0].metric("trainer/global_step")) <= resumed_at
    assert attempts[1].metric("test/exact_match")
    # ... as one history: every training step once, in order (the second attempt rewinds to the first's end)
    assert [r["trainer/global_step"] for r in history(attempts) if "train/loss" in r] == list(range(steps))


def test_sigusr1_to_the_batch_shell_is_passed_on_to_the_step_and_requeues_the_job(workdir, capsys):
    """`scancel -s USR1 --batch` (as `--signal=B:USR1@<s>`) reaches the batch shell only: job.sbatch
    traps it and passes it on to srun's tasks, which checkpoint and requeue; untrapped, it killed
    the shell and failed the job. One task: the step's handling of the signal is the two-node test's."""
    job_id = submit(capsys, "submit", "tiny.yaml", "trainer.max_steps=400", "trainer.checkpoint_every_n_steps=20")
    try:
        first_periodic_checkpoint(workdir)
        subprocess.run(["scancel", "-s", "USR1", "--batch", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    run_dir = the_run_dir(workdir)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", text[-3000:]
    assert "SIGUSR1 reached the batch script: passing it on to the job step" in text
    assert "resuming from hpc_ckpt_1.ckpt" in text and "run the same command again" not in text
    results = json.loads((run_dir / "results.json").read_text())
    assert 0 < results["started_at_step"] < 400 and results["global_step"] == 400


def test_scancel_mid_training_checkpoints_every_rank_and_a_resubmission_continues_one_history(workdir, capsys):
    """Plain scancel (SIGTERM to every task, SIGKILL after KillWait): both DDP ranks save at the same
    step boundary and exit before KillWait (Lightning's own SIGTERM handler, which broadcasts inside
    the handler, left them waiting in mismatched collectives until SIGKILL); submitting again
    resumes there, and metrics.csv holds every step once, in order."""
    steps, every = 150, 20
    argv = ["submit", "tiny.yaml", *DDP, f"trainer.max_steps={steps}", "trainer.log_every_n_steps=1",
            "trainer.val_every_n_steps=75", f"trainer.checkpoint_every_n_steps={every}"]
    job_id = submit(capsys, *argv)
    try:
        first_periodic_checkpoint(workdir)
        run_dir = the_run_dir(workdir)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and max(logged_steps(run_dir, "train/loss"), default=0) < every + 5:
            time.sleep(0.1)  # past the periodic checkpoint, so the one at the signal is a new one
        seen = max(logged_steps(run_dir, "train/loss"))
        signalled = time.monotonic()
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
        while "COMPLETING" in job_records(job_id)[0].get("JobState", "") and time.monotonic() - signalled < 60:
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "CANCELLED", text[-3000:]
    saved = global_step(run_dir / "checkpoints" / "last.ckpt")
    assert seen < saved < steps, text[-3000:]  # saved at the signal, not the periodic checkpoint before it
    assert f"Stopped by SIGTERM at step {saved}" in text
    assert "Traceback" not in text, text[-3000:]  # no rank died in a collective, no W&B exit-hook traceback
    assert "Killed" not in text, text[-3000:]  # every rank exited before KillWait: srun reports SIGKILLed tasks

    job_id = submit(capsys, *argv)
    (record,) = wait_for(job_id)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED", text[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["started_at_step"] == saved and results["global_step"] == steps
    assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))
    # W&B: one history with every step once. SLURM's SIGTERM also reaches W&B's service process,
    # which dies without flushing, so the cancelled attempt's offline file lacks rows (often all):
    # the resumed attempt logs them again from metrics.csv before it trains.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cancelled attempt's file is cut short or empty
        (attempts,) = read_runs(run_dir / "wandb").values()
    assert [r["trainer/global_step"] for r in history(attempts) if "train/loss" in r] == list(range(steps))


@pytest.mark.slow  # ~17 s; the requeue and scancel paths run by default
def test_a_job_whose_steps_get_sigterm_without_a_requeue_fails_with_143_instead_of_completing(workdir, capsys):
    """`scancel -s TERM` signals the job's tasks without cancelling the job: every rank checkpoints
    and stops, and the job ends FAILED with exit code 143, not COMPLETED with no results."""
    job_id = submit(capsys, "submit", "tiny.yaml", *DDP, "trainer.max_steps=100000",
                    "trainer.checkpoint_every_n_steps=20")
    try:
        first_periodic_checkpoint(workdir)
        subprocess.run(["scancel", "-s", "TERM", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    run_dir = the_run_dir(workdir)
    text = logs(run_dir, job_id)
    assert (record["JobState"], record["ExitCode"]) == ("FAILED", "143:0"), text[-3000:]
    assert "Stopped by SIGTERM at step " in text and not (run_dir / "results.json").exists()


@pytest.mark.slow  # ~25 s; the requeue path itself is checked by tests/test_slurm_two_nodes.py
def test_a_job_signalled_during_its_final_evaluation_requeues_and_evaluates_again(workdir, capsys):
    # A long test split (reversing up to 40 tokens, greedy) keeps the job in its final evaluation.
    steps = 40
    job_id = submit(capsys, "submit", "tiny.yaml", f"trainer.max_steps={steps}", "task.test_lengths=[1,40]",
                    "task.eval_size_per_length=300")
    try:
        final_checkpoint(workdir, steps)
        subprocess.run(["scancel", "-s", "USR1", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    run_dir = the_run_dir(workdir)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", text[-3000:]
    assert "requeue signal during the final evaluation" in text and "attempt 2 " in text
    results = json.loads((run_dir / "results.json").read_text())
    assert results["global_step"] == steps and results["started_at_step"] == steps  # nothing retrained
    assert set(results["by_length"]["test"]) == {str(n) for n in range(1, 41)}


# --- requests SLURM could never start are refused at submission ----------------------------------


def test_more_processes_than_the_node_has_cpus_are_refused_and_nothing_is_written(workdir, capsys):
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    assert cli.main(["submit", "tiny.yaml", f"trainer.devices={cpus + 1}", "trainer.strategy=ddp"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SLURM cannot run this job" in err and f"{cpus} CPUs" in err, err
    assert not (workdir / "runs").exists()
    assert cli.main(["submit", "tiny.yaml", "--dry-run", f"trainer.devices={cpus + 1}"]) == 0  # a dry run asks nothing
    assert f"#SBATCH --ntasks-per-node={cpus + 1}" in capsys.readouterr().out


def test_more_nodes_than_the_partition_has_are_refused_naming_trainer_num_nodes(workdir, capsys):
    nodes = int(subprocess.run(["sinfo", "-h", "-p", "short", "-o", "%D"], capture_output=True, text=True).stdout)
    assert cli.main(["submit", "tiny.yaml", f"trainer.num_nodes={nodes + 1}", "cluster.partition=short", *DDP[1:]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "SLURM cannot run this job" in err, err
    assert (f"it asks for {nodes + 1} node(s)" in err
            and f"lower trainer.num_nodes (the partition has {nodes} node" in err)
    assert "trainer.devices" not in err  # the CPUs per node are not what is short
    assert not (workdir / "runs").exists()


def test_a_time_limit_over_the_partitions_maxtime_is_refused(workdir, capsys):
    """The dev cluster's partition `short` has MaxTime=30 (slurm/dev-cluster-start.sh)."""
    assert cli.main(["submit", "tiny.yaml", "cluster.partition=short", "cluster.time=01:00:00"]) == 2
    err = capsys.readouterr().err
    assert "cluster.time=01:00:00 exceeds the MaxTime of partition short (00:30:00)" in err, err
    assert not (workdir / "runs").exists()
