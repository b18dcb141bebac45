"""DDP on CPU (gloo, devices=2) against one process with the same global batch.

The training set is exactly one global batch (32 examples: 32 per step in one process, 16 per
rank with two), so every step sees the same examples in either setting whatever order each
sampler draws them in, and all training strings have one length, so both ranks hold the same
number of target tokens: DDP's average of the two ranks' mean losses is then the one-process
mean, and the two runs must follow the same loss curve and end with the same weights, up to
floating-point reduction order.

The evaluation splits have odd sizes, so a rank-sharded evaluation that padded or dropped
examples would disagree with a one-process evaluation of the same checkpoint.
"""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relpos_lab.records.wandb_offline import read_runs
from relpos_lab.training import experiment

GLOBAL_BATCH = 32
STEPS = 12
pytestmark = pytest.mark.integration  # real processes: DDP over gloo

CONFIG = f"""
task: {{name: reverse, train_lengths: [5, 5], valid_lengths: [1, 5], test_lengths: [1, 7],
       train_size: {GLOBAL_BATCH}, eval_size_per_length: 3}}
model: {{d_model: 16, n_heads: 2, d_ff: 32, n_encoder_layers: 1, n_decoder_layers: 1, dropout: 0.0,
        attention_dropout: 0.0, positions: {{scheme: shaw, max_distance: 4}}}}
data: {{eval_batch_size: 4}}
optim: {{lr: 0.003, warmup_steps: 3}}
trainer: {{accelerator: cpu, strategy: ddp, max_steps: {STEPS}, val_every_n_steps: 6, log_every_n_steps: 1,
          gradient_clip_val: 1.0, num_sanity_val_steps: 0, enable_progress_bar: false,
          enable_model_summary: false}}
logging: {{root: runs, inspect: false, wandb: {{mode: offline}}}}
"""


def train(root: Path, devices: int) -> Path:
    """Train CONFIG with `devices` processes through the CLI; returns the run directory."""
    (root / "ddp.yaml").write_text(CONFIG)
    args = ["train", "ddp.yaml", f"trainer.devices={devices}", f"data.batch_size={GLOBAL_BATCH // devices}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    env.pop("WANDB_MODE", None)
    out = subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=root, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in root.glob("runs/ddp/*") if p.is_dir()]
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[int, Path]:
    """The same experiment trained in one process and in two (DDP); devices -> run directory."""
    return {devices: train(tmp_path_factory.mktemp(f"devices{devices}"), devices) for devices in (1, 2)}


def logged(run_dir: Path, key: str) -> dict[int, float]:
    """step -> value of `key` in metrics.csv; a step logged twice fails the test."""
    values: dict[int, float] = {}
    with open(run_dir / "metrics.csv", newline="") as file:
        for row in csv.DictReader(file):
            if row.get(key):
                step = int(row["step"])
                assert step not in values, f"{key} logged twice at step {step}"
                values[step] = float(row[key])
    return values


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]


def test_two_processes_follow_the_one_process_loss_curve(runs):
    single, ddp = logged(runs[1], "train/loss"), logged(runs[2], "train/loss")
    assert sorted(single) == sorted(ddp) and len(single) == STEPS
    assert single[0] != pytest.approx(single[STEPS - 1], abs=1e-3)  # the curve moves: a real comparison
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-4, abs=1e-5), step


def test_two_processes_end_with_the_one_process_weights(runs):
    single, ddp = weights(runs[1]), weights(runs[2])
    assert single.keys() == ddp.keys()
    # A key bias shifts every score of a query by the same amount, which softmax ignores: its exact
    # gradient is zero, and Adam turns the rounding noise it gets instead into lr-sized steps.
    compared = [name for name in single if not name.endswith("k_proj.bias")]
    assert len(compared) > len(single) // 2
    for name in compared:
        torch.testing.assert_close(ddp[name], single[name], rtol=1e-4, atol=1e-5, msg=name)


def test_sharded_evaluation_equals_one_process_evaluation_of_the_same_checkpoint(runs, tmp_path, monkeypatch):
    results = json.loads((runs[2] / "results.json").read_text())
    monkeypatch.setenv("WANDB_MODE", "disabled")
    alone = experiment.evaluate(runs[2] / results["checkpoint"], "test", output=tmp_path / "eval")
    for name, value in alone.metrics.items():
        assert results["metrics"][name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["by_length"]["test"] == evaluated["by_length"]["test"]
    assert sum(row["n"] for row in results["by_length"]["test"].values()) == 7 * 3  # every example once


def test_only_rank_zero_writes_the_run_directory(runs):
    def files(run_dir: Path) -> set[str]:  # W&B's own files are named by time and checked below
        return {str(p.relative_to(run_dir)) for p in run_dir.rglob("*") if p.is_file() and "wandb" not in p.parts}

    assert files(runs[2]) == files(runs[1])
    assert len(list((runs[2] / "wandb").glob("offline-run-*"))) == 1


def test_wandb_records_each_step_once(runs):
    (attempts,) = read_runs(runs[2] / "wandb").values()
    (run,) = attempts
    csv_losses = logged(runs[2], "train/loss")
    assert run.metric("train/loss") == pytest.approx([csv_losses[s] for s in sorted(csv_losses)], rel=1e-6)
    assert len(run.metric("test/exact_match")) == 1


def test_two_processes_validate_the_last_step_and_choose_the_best_over_every_validated_step(tmp_path):
    """max_steps not a multiple of the interval: every rank validates the last step (a stop request
    at the same step on each), and the best checkpoint is chosen over steps 3 and 5."""
    (tmp_path / "ddp.yaml").write_text(CONFIG)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "train", "ddp.yaml", "trainer.devices=2",
                          "trainer.max_steps=5", "trainer.val_every_n_steps=3", "name=last"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in tmp_path.glob("runs/last/*") if p.is_dir()]
    validated = logged(run_dir, "valid/exact_match")
    assert sorted(validated) == [3, 5]  # at the steps of their checkpoints
    best = max(sorted(validated), key=lambda s: (validated[s], -s))  # ModelCheckpoint keeps the first best
    results = json.loads((run_dir / "results.json").read_text())
    assert results["checkpoint"] == f"checkpoints/best-step={best}.ckpt" and results["checkpoint_step"] == best
    assert results["metrics"]["valid/exact_match"] == pytest.approx(validated[best], abs=1e-6)


# --- evaluation splits smaller than the world ---------------------------------------------------

SMALL_SPLITS = {1: ([1, 1], 1), 3: ([1, 3], 1), 100: ([1, 5], 20)}  # examples -> (lengths, per length)


# 3: as 1, smaller than the world; 100: as the sharded evaluation of `runs` above
@pytest.mark.parametrize("examples", [1, pytest.param(3, marks=pytest.mark.slow),
                                      pytest.param(100, marks=pytest.mark.slow)])
def test_two_processes_evaluate_splits_of_any_size_as_one_process_does(examples, tmp_path, monkeypatch):
    """1 example leaves rank 1 without an example; it must still join the metrics' gather (it
    used to fail Lightning's zero-length check, or hang the other rank), and the numbers of the
    final evaluation must be those of one process evaluating the same checkpoint."""
    lengths, per_length = SMALL_SPLITS[examples]
    small = CONFIG.replace("valid_lengths: [1, 5], test_lengths: [1, 7]",
                           f"valid_lengths: {lengths}, test_lengths: {lengths}").replace(
        "eval_size_per_length: 3", f"eval_size_per_length: {per_length}")
    assert small != CONFIG
    (tmp_path / "ddp.yaml").write_text(small)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "train", "ddp.yaml", "trainer.devices=2",
                          "trainer.max_steps=4", "trainer.val_every_n_steps=2", "name=small"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = [p for p in tmp_path.glob("runs/small/*") if p.is_dir()]
    results = json.loads((run_dir / "results.json").read_text())
    monkeypatch.setenv("WANDB_MODE", "disabled")
    for split in ("valid", "test"):
        alone = experiment.evaluate(run_dir / results["checkpoint"], split, output=tmp_path / f"eval-{split}")
        assert set(alone.metrics) == {k for k in results["metrics"] if k.startswith(f"{split}/")}
        for name, value in alone.metrics.items():
            assert results["metrics"][name] == pytest.approx(value, rel=1e-6, abs=1e-6), name
        evaluated = json.loads((tmp_path / f"eval-{split}" / "results.json").read_text())
        assert results["by_length"][split] == evaluated["by_length"][split]
        assert sum(row["n"] for row in results["by_length"][split].values()) == examples  # each once


# --- two nodes x one process, as a 2-node SLURM allocation starts them ------------------------


def free_slurm_job_id() -> str:
    """A job id whose port (Lightning's SLURMEnvironment: 15000 + its last 4 digits) is free here."""
    import socket

    for job_id in range(4242, 10000, 97):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", 15000 + job_id))
                return str(job_id)
            except OSError:
                continue
    pytest.skip("no free port in Lightning's SLURM range")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> tuple[Path, str]:
    """CONFIG at trainer.num_nodes=2, devices=1, started as srun starts the tasks of the job that
    `relpos-lab submit` renders for it: each process sees the variables of its own node of a
    2-node allocation (node names that resolve here; the run directory on a shared filesystem)."""
    from relpos_lab.launch.slurm import run_job

    root = tmp_path_factory.mktemp("two_nodes")
    (root / "ddp.yaml").write_text(CONFIG)
    overrides = ["trainer.num_nodes=2", "trainer.devices=1", f"data.batch_size={GLOBAL_BATCH // 2}"]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        job, _ = run_job("ddp.yaml", overrides)
    finally:
        os.chdir(cwd)
    # Two node names that resolve here; Lightning makes the first one MASTER_ADDR, as on a cluster.
    node_names = ["localhost", "127.0.0.1"]
    nodes = ",".join(node_names)
    allocation = {"SLURM_JOB_ID": free_slurm_job_id(), "SLURM_JOB_NAME": job.name, "SLURM_NNODES": "2",
                  "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": nodes,
                  "SLURM_NODELIST": nodes, "SLURM_CPUS_PER_TASK": "1"}
    procs = []
    for node in (0, 1):
        env = {**os.environ, **allocation, "OMP_NUM_THREADS": "1", "COLUMNS": "200",
               "SLURM_NODEID": str(node), "SLURM_PROCID": str(node), "SLURM_LOCALID": "0",
               "SLURMD_NODENAME": node_names[node]}
        for name in ("WANDB_MODE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(name, None)
        procs.append(subprocess.Popen([sys.executable, "-m", "relpos_lab", "train", "ddp.yaml", *overrides], cwd=root,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outputs)
    (run_dir,) = [p for p in root.glob("runs/ddp/*") if p.is_dir()]
    assert run_dir.resolve() == job.directory  # the directory the submitted job would train
    return run_dir, job.script


@pytest.mark.slow  # the 2-node processes take ~50 s; `runs` covers 2-process DDP by default
def test_the_two_node_job_runs_one_process_per_node_through_srun(two_nodes):
    _, script = two_nodes
    assert "#SBATCH --nodes=2" in script and "#SBATCH --ntasks-per-node=1" in script
    assert "\nsrun " in script  # srun starts one task per node, each with its node's SLURM_* variables


@pytest.mark.slow  # the 2-node processes take ~50 s; `runs` covers 2-process DDP by default
def test_two_nodes_follow_the_one_process_loss_curve(runs, two_nodes):
    single, nodes = logged(runs[1], "train/loss"), logged(two_nodes[0], "train/loss")
    assert sorted(single) == sorted(nodes) and len(single) == STEPS
    for step in single:
        assert nodes[step] == pytest.approx(single[step], rel=1e-4, abs=1e-5), step


@pytest.mark.slow  # the 2-node processes take ~50 s; `runs` covers 2-process DDP by default
def test_only_global_rank_zero_writes_on_a_shared_filesystem(runs, two_nodes):
    """Node 1's process is local rank 0 of its node: anything written by local rank 0 would appear twice."""
    run_dir = two_nodes[0]

    def files(d: Path) -> set[str]:
        return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file() and "wandb" not in p.parts}

    assert files(run_dir) == files(runs[1])
    (attempts,) = read_runs(run_dir / "wandb").values()
    assert len(attempts) == 1 and len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
    assert attempts[0].metric("train/loss") == pytest.approx(
        [v for _, v in sorted(logged(run_dir, "train/loss").items())], rel=1e-6)


# --- the rendezvous: bounded, one line naming the address ---------------------------------------

RENDEZVOUS_S = 3  # trainer.rendezvous_timeout_seconds in these tests
RENDEZVOUS = ["trainer.num_nodes=2", "trainer.devices=1", f"trainer.rendezvous_timeout_seconds={RENDEZVOUS_S}",
              "logging.wandb.mode=disabled", "name=rendezvous"]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_rank(root: Path, variables: dict[str, str]) -> subprocess.Popen:
    """`relpos-lab train` as one process of a 2-process world, with the variables its launcher sets."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", **variables}
    for name in ("MASTER_ADDR", "MASTER_PORT", "WANDB_MODE"):
        if name not in variables:
            env.pop(name, None)
    return subprocess.Popen([sys.executable, "-m", "relpos_lab", "train", "ddp.yaml", *RENDEZVOUS], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_rendezvous_nobody_completes_fails_in_bounded_time_with_one_line_naming_the_address(tmp_path):
    """Today's launchers, each with a rendezvous that cannot complete, all three at once: rank 1 of a
    2-node SLURM allocation whose first node does not resolve (Lightning's SLURMEnvironment makes it
    MASTER_ADDR), rank 1 under torchrun's variables with a port nothing listens on, and rank 0 whose
    rank 1 never comes. Each exits non-zero within a bound, with one `relpos-lab: error:` line naming
    the address and port it tried and no traceback (c10d's retry warnings and C++ stack included)."""
    import time

    ports = {"torchrun": free_port(), "alone": free_port()}
    job_id = free_slurm_job_id()
    cases = {
        "slurm": ("nosuch-node.invalid", 15000 + int(job_id[-4:]),
                  {"SLURM_JOB_ID": job_id, "SLURM_JOB_NAME": "rendezvous", "SLURM_NNODES": "2", "SLURM_NTASKS": "2",
                   "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "nosuch-node.invalid,localhost",
                   "SLURM_NODELIST": "nosuch-node.invalid,localhost", "SLURM_CPUS_PER_TASK": "1",
                   "SLURM_NODEID": "1", "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "localhost"}),
        "torchrun": ("127.0.0.1", ports["torchrun"],
                     {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports["torchrun"]), "WORLD_SIZE": "2", "RANK": "1",
                      "LOCAL_RANK": "0", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "1", "TORCHELASTIC_RUN_ID": "rdzv"}),
        "alone": ("127.0.0.1", ports["alone"],
                  {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports["alone"]), "NODE_RANK": "0"}),
    }
    roots = {name: tmp_path / name for name in cases}
    for name, root in roots.items():
        root.mkdir()
        (root / "ddp.yaml").write_text(CONFIG)
    started = time.monotonic()
    procs = {name: one_rank(roots[name], variables) for name, (_, _, variables) in cases.items()}
    results = {}
    for name, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            pytest.fail(f"{name}: still waiting at the rendezvous after 120 s")
        results[name] = (proc.returncode, out, err, time.monotonic() - started)
    for name, (host, port, _) in cases.items():
        code, out, err, seconds = results[name]
        text = out + err
        errors = [line for line in text.splitlines() if line.startswith("relpos-lab: error:")]
        assert code == 2, (name, text[-3000:])
        assert seconds < 60, (name, seconds)  # three processes importing torch on 2 cores, then 3 s
        assert len(errors) == 1, (name, text[-3000:])
        assert f"{host}:{port}" in errors[0] and "trainer.rendezvous_timeout_seconds" in errors[0], (name, errors[0])
        assert "Traceback" not in text and "frame #" not in text and "[c10d]" not in text, (name, text[-3000:])
    assert "rank 1 of 2 could not reach" in results["slurm"][2] and "does not resolve" in results["slurm"][2]
    assert "rank 1 of 2 could not reach" in results["torchrun"][2] and "nothing answered" in results["torchrun"][2]
    assert "rank 0 of 2 waited 3 s" in results["alone"][2] and "1 of 2 processes joined" in results["alone"][2]
    assert not list(roots["alone"].glob("runs/rendezvous/*"))  # rank 0 failed before its first step: nothing left


BARRIER = """
import os, sys, time
from pathlib import Path
from relpos_lab.config import load_config
from relpos_lab.training.trainer import build_trainer

cfg = load_config("ddp.yaml", sys.argv[1:])
strategy = build_trainer(cfg, Path("."), loggers=[], callbacks=[]).strategy
Path("ready" + os.environ["NODE_RANK"]).touch()  # both imported: they meet well within the rendezvous timeout
while not (Path("ready0").exists() and Path("ready1").exists()):
    time.sleep(0.05)
strategy.setup_environment()
if strategy.global_rank == 0:
    time.sleep(2 * {s})  # rank 0 busy (prepare_data, a checkpoint write) while the other waits
strategy.barrier("after the rendezvous")
print("rank", strategy.global_rank, "passed the barrier")
"""


@pytest.mark.slow  # ~16 s; the rendezvous' own bound runs by default
def test_collectives_keep_lightnings_timeout_after_a_short_rendezvous(tmp_path):
    """The rendezvous's short timeout is the process group's only while the processes meet: a barrier
    that then waits longer than it for rank 0 still completes (it timed out with the rendezvous's)."""
    (tmp_path / "ddp.yaml").write_text(CONFIG)
    (tmp_path / "barrier.py").write_text(BARRIER.format(s=RENDEZVOUS_S))
    port = str(free_port())
    procs = []
    for node in (0, 1):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
               "NODE_RANK": str(node)}
        procs.append(subprocess.Popen([sys.executable, "barrier.py", *RENDEZVOUS], cwd=tmp_path, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    for node, (proc, out) in enumerate(zip(procs, outputs)):
        assert proc.returncode == 0 and f"rank {node} passed the barrier" in out, out[-3000:]


@pytest.mark.parametrize(("strategy", "devices", "num_nodes", "expected"), [
    ("ddp", 2, 1, {"start_method": "popen"}),
    ("auto", 1, 2, {"start_method": "popen"}),  # Lightning's "auto" picks ddp for several processes
    ("auto", 2, 1, {"start_method": "popen"}),
    ("ddp_spawn_find_unused_parameters_true", 2, 1, {"start_method": "spawn", "find_unused_parameters": True}),
    ("auto", 1, 1, None),  # one process: no rendezvous
    ("deepspeed", 2, 1, None),  # not DDP: Lightning's own strategy, by name
])
def test_ddp_strategies_get_the_bounded_rendezvous(strategy, devices, num_nodes, expected):
    from omegaconf import OmegaConf

    from relpos_lab.training.rendezvous import BoundedRendezvousDDP, ddp_strategy

    cfg = OmegaConf.create({"trainer": {"strategy": strategy, "devices": devices, "num_nodes": num_nodes,
                                        "rendezvous_timeout_seconds": 7.5}})
    chosen = ddp_strategy(cfg)
    if expected is None:
        assert chosen == strategy
        return
    assert isinstance(chosen, BoundedRendezvousDDP) and chosen.rendezvous_timeout.total_seconds() == 7.5
    assert chosen._start_method == expected["start_method"]
    assert chosen._ddp_kwargs.get("find_unused_parameters", False) == expected.get("find_unused_parameters", False)
