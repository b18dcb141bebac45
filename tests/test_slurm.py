"""The sbatch scripts `relpos-lab submit --dry-run` and `sweep --slurm --dry-run` print.

The mapping config -> #SBATCH lines is what keeps SLURM and Lightning agreeing on the world size
(devices <-> --ntasks-per-node, num_nodes <-> --nodes). These tests need no cluster; the ones in
test_slurm_cluster.py submit real jobs.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relpos_lab import cli
from relpos_lab.config import load_config
from relpos_lab.config.find import find_in_group
from relpos_lab.launch import slurm
from relpos_lab.launch.slurm import _index_ranges, pin_points, sweep_job
from relpos_lab.launch.sweep import load_sweep

import docs_text

TINY = """
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 4], valid_lengths: [1, 4], test_lengths: [1, 6], train_size: 64, eval_size_per_length: 2}
trainer: {max_steps: 10}
logging: {root: runs}
"""
SWEEP = """
experiment: tiny.yaml
name: grid
grid:
  seed: [1, 2, 3]
"""


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    """These scripts are for clusters other than this machine's (GPUs, partition a100, ...): a dry
    run asks no cluster. tests/test_slurm_cluster.py checks requests against a real cluster."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny.yaml").write_text(TINY)
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    return tmp_path


def dry_run(capsys, *argv: str) -> str:
    assert cli.main([*argv, "--dry-run"]) == 0
    return capsys.readouterr().out


def options(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def option(script: str, name: str) -> str | None:
    """The value of ``#SBATCH --name=value`` (None when absent; every option appears at most once)."""
    values = [o.split("=", 1)[1] for o in options(script) if o.split("=", 1)[0] == f"--{name}"]
    assert len(values) <= 1, values
    return values[0] if values else None


def run_dir_of(script: str) -> Path:
    return Path(option(script, "output")).parent.parent


# --- the world size: one config value each ----------------------------------------------------------


@pytest.mark.parametrize("devices, nodes", [(1, 1), (2, 1), (4, 2), (8, 16)])
def test_devices_and_num_nodes_become_ntasks_per_node_and_nodes(workdir, capsys, devices, nodes):
    script = dry_run(capsys, "submit", "tiny.yaml", f"trainer.devices={devices}", f"trainer.num_nodes={nodes}")
    assert option(script, "ntasks-per-node") == str(devices)
    assert option(script, "nodes") == str(nodes)
    assert option(script, "ntasks") is None  # a total task count could disagree with the two above


@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_gpu_jobs_ask_for_one_gpu_per_process(workdir, capsys, accelerator):
    script = dry_run(capsys, "submit", "tiny.yaml", f"trainer.accelerator={accelerator}", "trainer.devices=4")
    assert option(script, "gpus-per-node") == "4" and option(script, "ntasks-per-node") == "4"


def test_cpu_jobs_ask_for_no_gpus(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", "trainer.devices=2")
    assert not [o for o in options(script) if o.startswith(("--gpu", "--gres"))]


# --- the cluster section ----------------------------------------------------------------------------


def test_cluster_section_becomes_sbatch_options(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", "cluster.partition=a100", "cluster.account=nlp",
                     "cluster.qos=high", "cluster.constraint=ampere", "cluster.time=1-00:00:00", "cluster.mem=64G",
                     "cluster.cpus_per_task=8", 'cluster.extra_sbatch=["--exclusive", "#SBATCH --mail-type=END"]')
    assert [option(script, k) for k in ("partition", "account", "qos", "constraint", "time", "mem", "cpus-per-task")] \
        == ["a100", "nlp", "high", "ampere", "1-00:00:00", "64G", "8"]
    assert "--exclusive" in options(script) and "--mail-type=END" in options(script)


def test_unset_cluster_options_are_left_to_the_site_defaults(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml")
    for name in ("partition", "account", "qos", "constraint", "mem"):
        assert option(script, name) is None


def test_every_job_checkpoints_and_requeues_before_its_time_limit(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", "cluster.signal_seconds=300")
    assert option(script, "signal") == "SIGUSR1@300"
    assert "--requeue" in options(script) and option(script, "open-mode") == "append"


def test_an_extra_option_must_be_an_option(workdir, capsys):
    assert cli.main(["submit", "tiny.yaml", "--dry-run", 'cluster.extra_sbatch=["exclusive"]']) == 2
    assert "not an sbatch option" in capsys.readouterr().err


def test_a_job_named_bash_is_refused(workdir, capsys):
    # Lightning treats a job named bash as an interactive shell and ignores SLURM (no ranks, no requeue).
    assert cli.main(["submit", "tiny.yaml", "--dry-run", "name=bash"]) == 2
    assert "interactive shell" in capsys.readouterr().err


# --- what the job runs, and where its files go ---------------------------------------------------------


def test_the_job_resumes_the_run_directorys_config_from_the_submission_directory(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", "optim.lr=0.01")
    assert option(script, "job-name") == "tiny"
    assert option(script, "chdir") == str(workdir)
    run_dir = run_dir_of(script)
    assert run_dir.parent == (workdir / "runs" / "tiny").resolve()
    assert option(script, "output") == f"{run_dir}/slurm/%j.out"
    assert option(script, "error") == f"{run_dir}/slurm/%j.err"
    assert f"\nsrun --kill-on-bad-exit=1 relpos-lab train {run_dir}/config.yaml resume=true &\n" in script
    assert not run_dir.exists()  # a dry run writes nothing


def test_the_default_setup_activates_the_submitting_virtual_environment(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml")
    if sys.prefix == sys.base_prefix:
        pytest.skip("the tests do not run in a virtual environment")
    assert f"\nsource {Path(sys.prefix) / 'bin' / 'activate'}\n" in script


def test_setup_lines_replace_the_default_activation(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", 'cluster.setup=["module load cuda/12.4", "conda activate rl"]')
    assert "\nmodule load cuda/12.4\nconda activate rl\n" in script
    assert "bin/activate" not in script


def test_the_script_is_valid_bash(workdir, capsys):
    script = dry_run(capsys, "submit", "tiny.yaml", 'cluster.setup=["echo ready"]')
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


@pytest.fixture
def unconfigured(workdir, monkeypatch) -> Path:
    """sbatch and sinfo installed, but no slurm.conf: every SLURM command fails as Slurm 22.05 does."""
    bin_dir = workdir / "bin"
    bin_dir.mkdir()
    for name in ("sbatch", "sinfo", "squeue", "scontrol"):
        (bin_dir / name).write_text(f"#!/bin/sh\necho '{name}: error: resolve_ctls_from_dns_srv: res_nsearch error: "
                                    "Unknown host' >&2\necho '{name}: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                    f"echo '{name}: error: Could not establish a configuration source' >&2\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return workdir


def test_the_guides_own_experiment_is_the_command_line_it_stands_for(tmp_path, monkeypatch, capsys):
    """docs/slurm.md's reverse_shaw_gpu.yaml says it equals `submit reverse_shaw trainer=gpu
    cluster=mysite`: both print the same sbatch script (job name, run directory, everything)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs" / "cluster").mkdir(parents=True)  # the guide's `cp configs/cluster/example.yaml ...`
    (tmp_path / "configs" / "cluster" / "mysite.yaml").write_text(find_in_group("cluster", "example").read_text())
    block = docs_text.block("# reverse_shaw_gpu.yaml: ")
    (tmp_path / "reverse_shaw_gpu.yaml").write_text(block.text)
    claimed = re.search(r"\(= relpos-lab (submit [^)]+)\)", block.text).group(1).split()
    scripts = []
    for argv in (["submit", "reverse_shaw_gpu.yaml", "--dry-run"], [*claimed, "--dry-run"]):
        assert cli.main(argv) in (0, None)
        scripts.append(capsys.readouterr().out)
    assert "#SBATCH --job-name=reverse_shaw\n" in scripts[0] and scripts[0] == scripts[1]


def test_dry_runs_print_the_script_where_sbatch_has_no_cluster(unconfigured, capsys):
    assert option(dry_run(capsys, "submit", "tiny.yaml", "trainer.devices=64"), "ntasks-per-node") == "64"
    assert option(dry_run(capsys, "sweep", "sweep.yaml", "--slurm"), "array") == "0-2"


def test_submitting_where_no_cluster_answers_names_the_configuration(unconfigured, capsys):
    assert slurm.cluster_unreachable() == "sinfo: error: Could not establish a configuration source"
    assert cli.main(["submit", "tiny.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no SLURM cluster answers on this machine" in err
    assert "configuration" in err and "--dry-run" in err and "CPUs" not in err
    assert not (unconfigured / "runs").exists()


def test_submitting_without_sbatch_is_one_line(workdir, capsys, monkeypatch):
    monkeypatch.setenv("PATH", str(workdir))
    assert cli.main(["submit", "tiny.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "sbatch not found" in err and "--dry-run" in err
    assert not (workdir / "runs").exists()


# --- sweeps as job arrays ---------------------------------------------------------------------------


def test_a_sweep_is_one_array_with_an_index_per_point_and_a_throttle(workdir, capsys):
    script = dry_run(capsys, "sweep", "sweep.yaml", "--slurm", "cluster.array_parallelism=2", "trainer.devices=2")
    assert option(script, "array") == "0-2%2"
    assert option(script, "ntasks-per-node") == "2" and option(script, "job-name") == "grid"
    sweep_dir = (workdir / "runs" / "grid").resolve()
    assert option(script, "output") == f"{sweep_dir}/slurm/%A_%a.out"
    (command,) = [line for line in script.splitlines() if line.startswith("srun ")]
    assert re.fullmatch(rf"srun --kill-on-bad-exit=1 relpos-lab train {sweep_dir}/slurm/array-[0-9-]+"
                        r"/\$SLURM_ARRAY_TASK_ID/config.yaml resume=true &", command), command


def test_an_unthrottled_array_has_no_percent(workdir, capsys):
    assert option(dry_run(capsys, "sweep", "sweep.yaml", "--slurm"), "array") == "0-2"


def test_finished_points_are_left_out_of_the_array(workdir, capsys):
    manifest = workdir / "runs" / "grid" / "sweep.json"
    assert cli.main(["sweep", "sweep.yaml", "--list"]) == 0
    points = json.loads(manifest.read_text())["points"]
    (Path(points[1]["run_dir"]) / "results.json").parent.mkdir(parents=True)
    (Path(points[1]["run_dir"]) / "results.json").write_text("{}")
    capsys.readouterr()
    assert option(dry_run(capsys, "sweep", "sweep.yaml", "--slurm"), "array") == "0,2"


def test_each_array_index_stays_the_point_it_was_submitted_as(workdir, capsys):
    grid = load_sweep("sweep.yaml", ["trainer.max_steps=7"])
    job = sweep_job(grid)
    pin_points(grid, job)
    submitted = [Path(p.run_dir).resolve() for p in grid.points]
    assert [(job.points / str(i)).resolve() for i in range(3)] == submitted
    for run_dir in submitted:  # the resolved config each task will train, written at submission
        assert load_config(run_dir / "config.yaml").trainer.max_steps == 7
    # The grid is edited while the array waits: index 0 is now another experiment.
    (workdir / "sweep.yaml").write_text((workdir / "sweep.yaml").read_text().replace("[1, 2, 3]", "[9, 1, 2, 3]"))
    assert Path(load_sweep("sweep.yaml", ["trainer.max_steps=7"]).points[0].run_dir).resolve() != submitted[0]
    assert (job.points / "0" / "config.yaml").resolve().parent == submitted[0]


def test_points_needing_different_resources_cannot_share_an_array(workdir, capsys):
    (workdir / "sweep.yaml").write_text("experiment: tiny.yaml\nname: grid\ngrid:\n  trainer.devices: [1, 2]\n")
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "one job array has one shape" in err and "--ntasks-per-node=2" in err


@pytest.mark.parametrize("indices, spec", [([0], "0"), ([0, 1, 2], "0-2"), ([0, 1, 2, 5, 7, 8], "0-2,5,7-8"),
                                           ([3, 9], "3,9")])
def test_array_indices_are_written_as_ranges(indices, spec):
    assert _index_ranges(indices) == spec


FAKE_SRUN = """#!/bin/bash
# Stands in for srun: records the signals it gets, exits as a requeued attempt does (0) on SIGUSR1.
trap 'echo USR1 >> "$SIGNALS"; exit 0' USR1
echo running > "$SIGNALS.ready"
while :; do sleep 0.05; done
"""


@pytest.mark.parametrize("send", ["USR1", None])
def test_the_batch_script_passes_sigusr1_on_to_the_job_step_and_exits_as_it_does(workdir, capsys, send):
    """`scancel --signal=USR1 --batch` and `--signal=B:USR1@<s>` signal the batch shell only: the
    script forwards it to srun (which signals the tasks) and waits until srun exits, with its status;
    untrapped, the signal killed the script and failed the job (JobLaunchFailure)."""
    script = dry_run(capsys, "submit", "tiny.yaml", 'cluster.setup=["true"]')
    (workdir / "fake").mkdir()
    srun = workdir / "fake" / "srun"
    srun.write_text(FAKE_SRUN if send else "#!/bin/sh\nexit 3\n")
    srun.chmod(0o755)
    (workdir / "job.sh").write_text(script)
    signals = workdir / "signals"
    env = {**os.environ, "PATH": f"{srun.parent}:{os.environ['PATH']}", "SIGNALS": str(signals),
           "SLURM_JOB_ID": "7"}
    job = subprocess.Popen(["bash", str(workdir / "job.sh")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    if send:
        deadline = time.monotonic() + 30
        while not signals.with_name("signals.ready").exists():
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.02)
        job.send_signal(signal.SIGUSR1)
    out, err = job.communicate(timeout=30)
    if send:
        assert job.returncode == 0, out + err
        assert signals.read_text() == "USR1\n"
        assert "SIGUSR1 reached the batch script: passing it on to the job step" in err
    else:
        assert job.returncode == 3, out + err  # srun's status is the job's


# --- several runs to a GPU (cluster.runs_per_gpu) -------------------------------------------------------


def test_packed_points_are_ceil_points_over_runs_per_gpu_tasks_of_one_step_per_run(workdir, capsys):
    script = dry_run(capsys, "sweep", "sweep.yaml", "--slurm", "cluster.runs_per_gpu=2", "cluster.array_parallelism=1",
                     "trainer.accelerator=gpu")
    assert option(script, "array") == "0-1%1"  # 3 points, 2 to a task
    assert option(script, "ntasks-per-node") == "2" and option(script, "gpus-per-node") == "1"
    assert option(script, "nodes") == "1" and option(script, "cpus-per-task") == "4"  # per run
    sweep_dir = (workdir / "runs" / "grid").resolve()
    (loop,) = re.findall(r'\nfor run in (\S+)/"\$SLURM_ARRAY_TASK_ID"/\*; do', script)
    assert re.fullmatch(rf"{sweep_dir}/slurm/array-[0-9-]+", loop)
    srun = script[script.index("    srun "):script.index("    steps+=($!)")]
    assert "--overlap" in srun and "--ntasks=1" in srun and "--ntasks-per-node=1" in srun  # Lightning: devices=1
    assert f"--output={sweep_dir}/slurm/%A_%a.$point.out" in srun and "--open-mode=append" in srun
    assert srun.rstrip().endswith('relpos-lab train "$run/config.yaml" resume=true &')
    assert "\nunset SRUN_CPUS_PER_TASK" in script  # no --exact: a step may use every CPU of the task
    checked = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr


def test_a_packed_array_pins_each_task_to_its_points(workdir, capsys):
    grid = load_sweep("sweep.yaml", ["cluster.runs_per_gpu=2"])
    (Path(grid.points[1].run_dir) / "results.json").parent.mkdir(parents=True)
    (Path(grid.points[1].run_dir) / "results.json").write_text("{}")  # finished: left out
    job = sweep_job(grid)
    assert job.groups == ((0, 2),) and job.array == "0"
    assert option(job.script, "ntasks-per-node") == "2"
    pin_points(grid, job)
    assert sorted(p.name for p in (job.points / "0").iterdir()) == ["0", "2"]
    for index in (0, 2):
        assert (job.points / "0" / str(index)).resolve() == Path(grid.points[index].run_dir).resolve()
        assert (job.points / "0" / str(index) / "config.yaml").is_file()
    grid = load_sweep("sweep.yaml", ["cluster.runs_per_gpu=4"])
    (Path(grid.points[1].run_dir) / "results.json").unlink()
    job = sweep_job(grid)  # fewer points than runs_per_gpu: a task of as many runs as there are
    assert job.groups == ((0, 1, 2),) and option(job.script, "ntasks-per-node") == "3"


@pytest.mark.parametrize("world", [["trainer.devices=2"], ["trainer.num_nodes=2"]])
def test_runs_of_several_processes_cannot_be_packed(workdir, capsys, world):
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--dry-run", "cluster.runs_per_gpu=2", *world]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cluster.runs_per_gpu=2" in err, err
    assert f"trainer.{world[0].split('.')[1]}" in err and "set trainer.devices=1 trainer.num_nodes=1" in err
    assert "cluster.runs_per_gpu=1" in err
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--dry-run", "cluster.runs_per_gpu=0"]) == 2
    assert "runs_per_gpu" in capsys.readouterr().err


def test_one_run_and_runs_per_gpu_1_are_not_packed(workdir, capsys):
    for argv in (["submit", "tiny.yaml", "cluster.runs_per_gpu=4"], ["sweep", "sweep.yaml", "--slurm"]):
        script = dry_run(capsys, *argv)
        assert option(script, "ntasks-per-node") == "1" and "--overlap" not in script


def test_points_packing_other_numbers_cannot_share_an_array(workdir, capsys):
    (workdir / "sweep.yaml").write_text("experiment: tiny.yaml\nname: grid\ngrid:\n  point:\n"
                                        "    a: {seed: 1, cluster.runs_per_gpu: 2}\n"
                                        "    b: {seed: 2, cluster.runs_per_gpu: 3}\n")
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "one job array has one shape" in err and "cluster.runs_per_gpu=3" in err


FAKE_PACKED_SRUN = """#!/bin/bash
# Stands in for srun: records the run it trains and the signals it gets; a run named in $FAIL exits 3.
run=${@: -2:1}
point=$(basename "$(dirname "$run")")
trap 'echo "$point USR1" >> "$SIGNALS"; exit 0' USR1
if [ "$point" = "$FAIL" ]; then exit 3; fi
echo "$point" >> "$SIGNALS.ready"
while :; do sleep 0.05; done
"""


@pytest.mark.parametrize("fail", [None, "2"])
def test_a_packed_task_starts_a_step_per_run_and_passes_sigusr1_on_to_every_step(workdir, capsys, fail):
    grid = load_sweep("sweep.yaml", ["cluster.runs_per_gpu=2", 'cluster.setup=["true"]'])
    job = sweep_job(grid)
    pin_points(grid, job)
    (workdir / "fake").mkdir()
    srun = workdir / "fake" / "srun"
    srun.write_text(FAKE_PACKED_SRUN)
    srun.chmod(0o755)
    (workdir / "job.sh").write_text(job.script)
    signals = workdir / "signals"
    env = {**os.environ, "PATH": f"{srun.parent}:{os.environ['PATH']}", "SIGNALS": str(signals),
           "SLURM_JOB_ID": "8", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "1" if fail else "0",
           "FAIL": fail or ""}
    started = subprocess.Popen(["bash", str(workdir / "job.sh")], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    if fail:  # task 1 holds point 2 alone, which fails: the job's status is the step's
        out, err = started.communicate(timeout=30)
        assert started.returncode == 3, out + err
        return
    deadline = time.monotonic() + 30
    while len(signals.with_name("signals.ready").read_text().split() if signals.with_name("signals.ready").exists()
              else []) < 2:
        assert started.poll() is None and time.monotonic() < deadline, started.communicate()
        time.sleep(0.02)
    assert sorted(signals.with_name("signals.ready").read_text().split()) == ["0", "1"]  # task 0: points 0 and 1
    started.send_signal(signal.SIGUSR1)
    out, err = started.communicate(timeout=30)
    assert started.returncode == 0, out + err
    assert sorted(signals.read_text().splitlines()) == ["0 USR1", "1 USR1"]
    assert "SIGUSR1 reached the batch script: passing it on to the job steps" in err


# --- stacks to array tasks (cluster.stack) -------------------------------------------------------


def test_a_stacked_array_gives_each_stack_a_task_whose_one_step_trains_it(workdir, capsys):
    """`--slurm --stack 2`: seeds 1, 2 stack, seed 3 trains alone; each task's step is `relpos-lab
    stack` on its pinned links, which trains them as the local `sweep --stack` does."""
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--stack", "2", "--dry-run", "trainer.accelerator=gpu"]) == 0
    out, err = capsys.readouterr()
    assert "stack of 2: points 0 1" in err and "alone: point 2 seed=3" in err and "stack of" not in out
    assert option(out, "array") == "0-1" and option(out, "ntasks-per-node") == "1"
    assert re.search(r'\nsrun --kill-on-bad-exit=1 relpos-lab stack \S+/slurm/array-[0-9-]+/"\$SLURM_ARRAY_TASK_ID" &',
                     out), out
    assert subprocess.run(["bash", "-n"], input=out, capture_output=True, text=True).returncode == 0
    grid = load_sweep("sweep.yaml", ["cluster.stack=2", "logging.wandb.mode=disabled"])
    job = sweep_job(grid)
    assert job.groups == ((0, 1), (2,))
    pin_points(grid, job)
    for task in ("0", "1"):  # what each array task runs
        assert cli.main(["stack", str(job.points / task)]) == 0
    for point in grid.points:
        results = json.loads((Path(point.run_dir) / "results.json").read_text())
        assert results["global_step"] == 10 and results["seed"] == point.index + 1


def test_a_task_cannot_both_stack_and_pack(workdir, capsys):
    assert cli.main(["sweep", "sweep.yaml", "--slurm", "--dry-run", "cluster.stack=2", "cluster.runs_per_gpu=2"]) == 2
    err = capsys.readouterr().err
    assert "cluster.stack=2 and cluster.runs_per_gpu=2: a task trains one stack or several packed runs" in err
    assert cli.main(["stack", str(workdir)]) == 2
    assert "no run directory with a config.yaml in it" in capsys.readouterr().err
