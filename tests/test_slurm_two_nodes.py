"""Jobs across two SLURM nodes: slurm/dev-cluster-start.sh runs two slurmd on this machine
(`slurmd -N n1`, `slurmd -N n2`, each on its own port), so `relpos-lab submit trainer.num_nodes=2
trainer.devices=1` gets a real 2-node allocation: srun starts one rank on each node, with that
node's SLURM_* variables, and the ranks meet over gloo at n1 (the job's first node), as on a
cluster. Not covered: two machines (their network, a shared filesystem between them).

The helpers are tests/test_slurm_cluster.py's (submitting through the CLI, waiting with scontrol);
the one-process comparison uses tests/test_distributed.py's experiment, whose training set is one
global batch.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from relpos_lab.records.wandb_offline import history, read_runs

from test_distributed import CONFIG as ONE_BATCH, GLOBAL_BATCH, STEPS, logged
from test_slurm_cluster import (
    NO_CLUSTER,
    WAIT_S,
    first_periodic_checkpoint,
    global_step,
    job_records,
    logged_steps,
    logs,
    submit,
    the_run_dir,
    wait_for,
    workdir,  # noqa: F401 (a fixture: the tests take it as a parameter)
)

REPO = Path(__file__).resolve().parents[1]


def _fewer_than_two_nodes() -> str | None:
    if NO_CLUSTER is not None:
        return NO_CLUSTER
    out = subprocess.run(["sinfo", "-h", "-o", "%D"], capture_output=True, text=True, timeout=30)
    nodes = max((int(n) for n in out.stdout.split() if n.isdigit()), default=0)
    return None if nodes >= 2 else f"the SLURM cluster has {nodes} node(s); slurm/dev-cluster-start.sh starts two"


SKIP = _fewer_than_two_nodes()
pytestmark = [pytest.mark.slurm, pytest.mark.integration, pytest.mark.skipif(SKIP is not None, reason=SKIP or "")]

TWO_NODES = ["trainer.num_nodes=2", "trainer.devices=1", "trainer.strategy=ddp"]
SECOND_NODE = "n2"  # slurm/dev-cluster-start.sh's second node: rank 1's, the batch script runs on n1


def ran_on_both_nodes(record: dict[str, str]) -> bool:
    return record["NumNodes"] == "2" and record["NodeList"] == "n[1-2]"


def processes_on(node: str, job_id: str) -> list[int]:
    """The job's task processes on `node`: srun gives each task its node's SLURMD_NODENAME."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:  # gone, or not ours to read
            continue
        if f"SLURM_JOB_ID={job_id}".encode() in environ and f"SLURMD_NODENAME={node}".encode() in environ:
            pids.append(int(proc.name))
    return pids


def parent(pid: int) -> int:
    return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])


def requeue_checkpoint(path: Path) -> int:
    """Wait for the requeue's checkpoint (written atomically) and return its step."""
    deadline = time.monotonic() + WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            pytest.fail(f"no {path.name} appeared")
        time.sleep(0.1)
    return global_step(path)


def test_ddp_across_two_nodes_follows_the_one_process_loss_curve(
    workdir, capsys, monkeypatch  # noqa: F811 (workdir: the fixture imported above)
):
    """2 nodes x 1 task on a global batch of 32 (16 per rank) against 1 process on 32: the same
    loss at every step and the same test metrics (the two jobs run side by side)."""
    (workdir / "ddp.yaml").write_text(ONE_BATCH)
    shared = [str(workdir / "ddp.yaml"), "cluster.cpus_per_task=1", "cluster.time=00:15:00"]
    jobs = {}
    for name, overrides in {"nodes": [*TWO_NODES, f"data.batch_size={GLOBAL_BATCH // 2}"],
                            "single": ["trainer.devices=1", f"data.batch_size={GLOBAL_BATCH}"]}.items():
        (workdir / name).mkdir()
        monkeypatch.chdir(workdir / name)
        jobs[name] = submit(capsys, "submit", *shared, *overrides)
    records = {name: wait_for(job_id)[0] for name, job_id in jobs.items()}
    run_dirs = {name: the_run_dir(workdir / name) for name in jobs}
    for name, record in records.items():
        assert record["JobState"] == "COMPLETED", logs(run_dirs[name], jobs[name])[-3000:]
    assert ran_on_both_nodes(records["nodes"])
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in logs(run_dirs["nodes"], jobs["nodes"])  # one world of two ranks

    single, nodes = logged(run_dirs["single"], "train/loss"), logged(run_dirs["nodes"], "train/loss")
    assert sorted(single) == sorted(nodes) == list(range(STEPS))
    assert single[0] != pytest.approx(single[STEPS - 1], abs=1e-3)  # the curve moves: a real comparison
    for step in single:
        assert nodes[step] == pytest.approx(single[step], rel=1e-4, abs=1e-5), step
    results = {name: json.loads((run_dirs[name] / "results.json").read_text()) for name in jobs}
    assert results["nodes"]["metrics"].keys() == results["single"]["metrics"].keys()
    for metric, value in results["single"]["metrics"].items():  # the sharded evaluation too
        assert results["nodes"]["metrics"][metric] == pytest.approx(value, rel=1e-4, abs=1e-5), metric


@pytest.mark.slow  # ~55 s; one node's requeue is test_slurm_cluster's, in the default tier
def test_a_two_node_job_requeued_by_sigusr1_and_by_scontrol_resumes_on_both_nodes_with_one_history(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    """SIGUSR1 to both ranks: they checkpoint at one step and the job requeues itself; then
    `scontrol requeue` from outside: SLURM's SIGTERM, a checkpoint at one step, the requeue. The
    third attempt finishes, every attempt on both nodes, one metrics.csv and one W&B run."""
    steps, every = 40, 10
    job_id = submit(capsys, "submit", "tiny.yaml", *TWO_NODES, f"trainer.max_steps={steps}",
                    "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=20",
                    f"trainer.checkpoint_every_n_steps={every}")
    try:
        first_periodic_checkpoint(workdir)
        subprocess.run(["scancel", "-s", "USR1", job_id], check=True, timeout=30)
        run_dir = the_run_dir(workdir)
        resumed = requeue_checkpoint(run_dir / "hpc_ckpt_1.ckpt")
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and max(logged_steps(run_dir, "train/loss"), default=0) < resumed + 5:
            time.sleep(0.2)  # the second attempt trains past its resumed step
        subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "2", text[-3000:]
    assert "Traceback" not in text, text[-3000:]  # W&B's exit hook does not reach for its stopped service
    assert ran_on_both_nodes(record)
    assert all(f"attempt {n} " in text for n in (1, 2, 3))
    assert text.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 3  # each attempt on both nodes
    assert "resuming from hpc_ckpt_1.ckpt" in text and "resuming from last.ckpt" in text
    # SLURM's SIGTERM (scontrol requeue) says how the run continues under SLURM, not "run the same command"
    assert "if SLURM requeues the job (scontrol requeue), its next attempt resumes from it" in text
    assert "run the same command again" not in text

    results = json.loads((run_dir / "results.json").read_text())
    assert global_step(run_dir / "checkpoints" / "last.ckpt") == steps == results["global_step"]
    assert not list(run_dir.glob("hpc_ckpt_*.ckpt"))  # the requeue checkpoint is gone once the run is finished
    assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))  # every step once
    # One W&B run: SLURM's SIGTERM also reaches W&B's service process, so the second attempt's
    # file lacks rows (often all, and then it is no attempt): the third logs them from metrics.csv.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (attempts,) = read_runs(run_dir / "wandb").values()
    assert [r["trainer/global_step"] for r in history(attempts) if "train/loss" in r] == list(range(steps))


@pytest.mark.slow  # ~27 s
def test_a_rank_killed_on_the_second_node_fails_the_job_in_seconds_and_a_resubmission_resumes(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    """SIGKILL to rank 1 (on n2) mid-training: srun --kill-on-bad-exit ends rank 0 too, so the job
    fails at once instead of rank 0 waiting in a collective; submitting again resumes from the
    periodic checkpoint, with one history."""
    steps, every = 60, 10
    argv = ["submit", "tiny.yaml", *TWO_NODES, f"trainer.max_steps={steps}", "trainer.log_every_n_steps=1",
            "trainer.val_every_n_steps=30", f"trainer.checkpoint_every_n_steps={every}"]
    job_id = submit(capsys, *argv)
    try:
        saved = first_periodic_checkpoint(workdir)
        rank = processes_on(SECOND_NODE, job_id)
        assert rank, f"no process of job {job_id} on {SECOND_NODE}"
        for pid in rank:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        (record,) = wait_for(job_id)
        failed_after = time.monotonic() - killed
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    run_dir = the_run_dir(workdir)
    assert record["JobState"] == "FAILED" and ran_on_both_nodes(record), logs(run_dir, job_id)[-3000:]
    assert failed_after < 20, failed_after
    assert not (run_dir / "results.json").exists()

    job_id = submit(capsys, *argv)
    (record,) = wait_for(job_id)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and ran_on_both_nodes(record), text[-3000:]
    assert "resuming from last.ckpt" in text and "GLOBAL_RANK: 1, MEMBER: 2/2" in text
    results = json.loads((run_dir / "results.json").read_text())
    assert results["started_at_step"] >= saved and results["global_step"] == steps
    assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))  # the steps after the checkpoint once
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the killed attempt's W&B file is cut short
        (attempts,) = read_runs(run_dir / "wandb").values()
    assert [r["trainer/global_step"] for r in history(attempts) if "train/loss" in r] == list(range(steps))


def slurmd_pid(node: str) -> int:
    """The pid of `node`'s slurmd, from its pid file (SlurmdPidFile, with %n for the node name)."""
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    (pattern,) = [line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("SlurmdPidFile")]
    return int(Path(pattern.replace("%n", node)).read_text())


def start_cluster() -> None:
    """slurm/dev-cluster-start.sh: starts a node's slurmd that is gone, and waits for both nodes."""
    out = subprocess.run(["bash", str(REPO / "slurm" / "dev-cluster-start.sh")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow  # ~70 s: SLURM takes 20-30 s (SlurmdTimeout=30) to set a silent node DOWN
def test_a_lost_second_node_is_noticed_by_slurm_which_requeues_the_job_and_it_resumes(
    workdir, capsys  # noqa: F811 (workdir: the fixture imported above)
):
    """n2 stops answering mid-training as a crashed machine does: its slurmd killed, its rank and
    slurmstepd frozen, their connections left open (rank 0 waits in a collective; nothing fails on
    n1). SLURM sets n2 DOWN after SlurmdTimeout, ends the attempt (NODE_FAIL) and requeues the job;
    n2 comes back (its processes gone, its slurmd started again) and the next attempt resumes from
    the periodic checkpoint on both nodes."""
    steps, every = 40, 10
    job_id = submit(capsys, "submit", "tiny.yaml", *TWO_NODES, f"trainer.max_steps={steps}",
                    "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=20",
                    f"trainer.checkpoint_every_n_steps={every}")
    frozen: list[int] = []
    try:
        first_periodic_checkpoint(workdir)
        rank = processes_on(SECOND_NODE, job_id)
        assert rank, f"no process of job {job_id} on {SECOND_NODE}"
        stepd = {parent(pid) for pid in rank} - set(rank)
        assert all((Path("/proc") / str(pid) / "cmdline").read_bytes().startswith(b"slurmstepd") for pid in stepd)
        frozen = sorted(set(rank) | stepd)
        os.kill(slurmd_pid(SECOND_NODE), signal.SIGKILL)
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + WAIT_S
        while job_records(job_id)[0]["Restarts"] == "0":  # SLURM requeues it (--requeue) once n2 is DOWN
            assert time.monotonic() < deadline, job_records(job_id)
            time.sleep(0.5)
    finally:
        for pid in frozen:  # the lost machine's processes are gone when it comes back
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        start_cluster()
    try:
        (record,) = wait_for(job_id)
    finally:
        subprocess.run(["scancel", job_id], timeout=30)
    run_dir = the_run_dir(workdir)
    text = logs(run_dir, job_id)
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1" and ran_on_both_nodes(record), text[-3000:]
    assert "DUE TO NODE FAILURE" in text  # SLURM ended the first attempt, not srun or a rank
    assert "attempt 2 " in text and "resuming from last.ckpt" in text
    assert text.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 2
    results = json.loads((run_dir / "results.json").read_text())
    assert every <= results["started_at_step"] < steps and results["global_step"] == steps
    assert sorted(logged_steps(run_dir, "train/loss")) == list(range(steps))
