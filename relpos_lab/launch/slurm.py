"""SLURM launchers: an experiment (or a sweep's grid) as an sbatch script, and its submission.

The script is job.sbatch (package data beside this module) with three holes: the #SBATCH options,
the set-up lines and the job steps: one `srun` of the command, which starts it once per task, or a
packed sweep's steps (below). The options come from the config, and the world size from one place
only: ``--nodes`` is ``trainer.num_nodes`` and ``--ntasks-per-node`` (with ``--gpus-per-node`` on
GPUs) is ``trainer.devices`` — the two numbers Lightning's SLURMEnvironment checks against the
job, so the classic mismatch (a hang, or Lightning refusing to start) cannot be written down.
Everything else comes from the ``cluster`` section.

Every job asks for ``--signal=SIGUSR1@<cluster.signal_seconds> --requeue --open-mode=append``:
before the time limit the ranks checkpoint and the job requeues itself (requeue.py); the next
attempt runs the same command with ``resume=true`` in the same run directory (its path is a
function of the config, records.rundir.run_directory), appending to the same log files.

- `relpos-lab submit CONFIG`: the script and its logs go to ``<run dir>/slurm/``; the job trains
  ``<run dir>/config.yaml``, the resolved config written at submission, so editing the YAML files
  while the job waits or between requeues cannot move it to another run directory.
- `relpos-lab sweep FILE --slurm`: one job array, index i = grid point i, unfinished points only,
  at most ``cluster.array_parallelism`` at once. Script and logs go to ``<sweep dir>/slurm/``. As
  with `submit`, what each task trains is fixed at submission: every submitted point's resolved
  config is written into its run directory, and ``<sweep dir>/slurm/array-<time>/<i>`` links index
  i to that directory; task i trains ``array-<time>/<i>/config.yaml``. Editing the grid while the
  array waits cannot shift an index onto another point.
- ``cluster.runs_per_gpu=R`` (R > 1) packs R points into one array task: task g trains the points
  linked in ``array-<time>/<g>/`` (each link named by its point), one job step each, all at once on
  the task's one GPU. The task asks for R tasks of cpus_per_task CPUs; each step is
  ``srun --overlap -n1``, as a step otherwise holds the job's GPU alone, and logs to
  ``<array job>_<g>.<point>.out``. SIGUSR1 reaches every step; each run saves its checkpoint, the
  first to ask requeues the task, and the next attempt resumes every run of the task in its own
  run directory (a finished one has nothing to train). Only runs of one process (trainer.devices
  = num_nodes = 1) can be packed.
- ``cluster.stack=K`` (``sweep --slurm --stack K``) groups the points as `sweep --stack` does
  (launch/sweep.py's stack_groups, printed) and gives each group an array task: one job step,
  ``relpos-lab stack array-<time>/<g>``, trains its linked points as one stacked model (one point
  alone). SIGUSR1 saves the stack's checkpoint at the end of its step and requeues the task; the
  next attempt resumes the stack from it (training/stacked.py).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from relpos_lab.api.errors import PROG, UserError, shown_path
from relpos_lab.config import load_config
from relpos_lab.launch.sweep import Sweep, is_finished, stack_groups
from relpos_lab.records.rundir import budget_siblings, has_attempt, run_directory, save_resolved_config

TEMPLATE = Path(__file__).resolve().parent / "job.sbatch"
GPU_ACCELERATORS = ("gpu", "cuda")
# Lightning takes a job with one of these names for an interactive shell and ignores SLURM.
INTERACTIVE_JOB_NAMES = ("bash", "interactive")


@dataclass(frozen=True)
class Job:
    """A rendered sbatch script, where it goes, and the log files SLURM will write."""

    name: str
    script: str
    path: Path  # the script file
    output: Path  # stdout log, with SLURM's %j (or %A_%a for arrays) still in it
    error: Path  # stderr log
    directory: Path  # the run directory (a single run) or the sweep directory (an array)
    array: str | None = None  # e.g. "0-3%2"
    points: Path | None = None  # an array's index -> run directory links (written at submission)
    groups: tuple[tuple[int, ...], ...] | None = None  # packed (cluster.runs_per_gpu > 1): each task's points

    def logs_of(self, job_id: str) -> tuple[Path, Path]:
        """The log paths with SLURM's patterns filled in (%A_%a stays per task: shown with *)."""
        def fill(path: Path) -> Path:
            return Path(str(path).replace("%j", job_id).replace("%A", job_id).replace("%a", "*"))
        return fill(self.output), fill(self.error)


def sbatch_options(cfg: DictConfig, *, job_name: str, output: Path, error: Path,
                   array: str | None = None, runs: int = 1) -> list[str]:
    """The #SBATCH options of a job running `cfg`, one ``--key=value`` string each; `runs`: the runs
    packed into it (cluster.runs_per_gpu, all on one node and one GPU), a task each."""
    if job_name in INTERACTIVE_JOB_NAMES:
        raise UserError(f"a SLURM job named {job_name!r} is taken by Lightning for an interactive shell "
                        "and runs without its SLURM support: choose another experiment name (name=...)")
    t, c = cfg.trainer, cfg.cluster
    options = [f"--job-name={job_name}", f"--nodes={t.num_nodes}", f"--ntasks-per-node={t.devices * runs}"]
    if t.accelerator in GPU_ACCELERATORS:
        options.append(f"--gpus-per-node={t.devices}")
    options.append(f"--cpus-per-task={c.cpus_per_task}")
    for key in ("mem", "time", "partition", "account", "qos", "constraint"):
        if c[key] is not None:
            options.append(f"--{key}={c[key]}")
    if array is not None:
        options.append(f"--array={array}")
    options += [f"--signal=SIGUSR1@{c.signal_seconds}", "--requeue", "--open-mode=append",
                f"--chdir={Path.cwd()}", f"--output={output}", f"--error={error}"]
    options += [_option(line) for line in c.extra_sbatch]
    return options


def _option(line: str) -> str:
    """An extra_sbatch entry, given as ``--gres=gpu:4`` or as a whole ``#SBATCH --gres=gpu:4`` line."""
    option = line.strip().removeprefix("#SBATCH").strip()
    if not option.startswith("-"):
        raise UserError(f"cluster.extra_sbatch: {line!r} is not an sbatch option (e.g. --gres=gpu:4)")
    return option


def setup_lines(cfg: DictConfig) -> list[str]:
    """cluster.setup, or by default the activation of the environment relpos-lab runs from now."""
    if cfg.cluster.setup is not None:
        return list(cfg.cluster.setup)
    if sys.prefix != sys.base_prefix:  # a virtual environment
        return [f"source {shlex.quote(str(Path(sys.prefix) / 'bin' / 'activate'))}"]
    return []


def one_step(command: str) -> str:
    """The job step of a run: srun starts `command` once per task (trainer.devices per node)."""
    return f"srun --kill-on-bad-exit=1 {command} &\nsteps+=($!)"


def packed_steps(points: Path, logs: Path) -> str:
    """The job steps of a packed array task: one per run linked in points/<task>/, at once.

    --overlap: a step holds the job's GPU alone otherwise, and the next one would wait for it. No
    --cpus-per-task (it implies --exact, CPUs of the step's own, which overlapping steps may be
    given alike) and no binding: each process may run on all the task's CPUs, with OMP_NUM_THREADS
    threads. Each step's --ntasks-per-node=1 is the SLURM_NTASKS_PER_NODE Lightning checks against
    trainer.devices.
    """
    run = f"{PROG} train \"$run/config.yaml\" resume=true"
    log = f"{shlex.quote(str(logs))}/%A_%a.$point"
    return "\n".join([
        "# cluster.runs_per_gpu: a job step for each run of this task, all at once on its GPU and CPUs",
        "unset SRUN_CPUS_PER_TASK  # -c implies --exact: overlapping steps may be given the same CPUs",
        f'for run in {shlex.quote(str(points))}/"$SLURM_ARRAY_TASK_ID"/*; do  # named by grid point',
        "    point=${run##*/}",
        "    srun --overlap --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpu-bind=none --kill-on-bad-exit=1 \\",
        f"        --open-mode=append --output={log}.out --error={log}.err \\",
        f"        {run} &",
        "    steps+=($!)",
        "done"])


def stacked_step(points: Path) -> str:
    """The job step of a stacked array task: the points linked in points/<task>/ as one stack (one
    point: trained alone), in one process (`relpos-lab stack`)."""
    return one_step(f"{PROG} stack {shlex.quote(str(points))}/\"$SLURM_ARRAY_TASK_ID\"")


def render(options: list[str], setup: list[str], steps: str) -> str:
    """job.sbatch with its holes filled."""
    if not TEMPLATE.is_file():
        raise UserError(f"sbatch template not found at {TEMPLATE}: install relpos-lab from its "
                        "source tree (pip install -e .) to submit jobs")
    return (TEMPLATE.read_text()
            .replace("@SBATCH@", "\n".join(f"#SBATCH {o}" for o in options))
            .replace("@SETUP@", "\n".join(setup))
            .replace("@STEPS@", steps))


# --- one run ------------------------------------------------------------------------------------


def run_job(config: str | Path, overrides: list[str] = ()) -> tuple[Job, DictConfig]:
    """The job that trains `config` with `overrides`, and the resolved config it will train."""
    cfg = load_config(config, list(overrides))
    run_dir = _directory(cfg)[0].resolve()
    logs = run_dir / "slurm"
    output, error = logs / "%j.out", logs / "%j.err"
    command = shlex.join([PROG, "train", str(run_dir / "config.yaml"), "resume=true"])
    script = render(sbatch_options(cfg, job_name=cfg.name, output=output, error=error), setup_lines(cfg),
                    one_step(command))
    return Job(cfg.name, script, logs / "job.sbatch", output, error, run_dir), cfg


def _directory(cfg: DictConfig) -> tuple[Path, bool]:
    """The run directory the job trains in, and whether it extends another budget's run there
    (planning.training_directory; Lightning is loaded only when such a run exists)."""
    run_dir, extend = run_directory(cfg), OmegaConf.select(cfg, "extend", default=None)
    if extend is False or has_attempt(run_dir) or (not extend and not budget_siblings(cfg)):
        return run_dir, False
    from relpos_lab.training.planning import training_directory

    return training_directory(cfg)


def submit_run(config: str | Path, overrides: list[str] = (), echo=print) -> tuple[Job, str]:
    """Write the resolved config and the script into the run directory, then sbatch it.

    An extension (`extend=true`) is made when it is submitted: the run then holds the new budget
    (its config.yaml, extended.json), which the job's `train <run dir>/config.yaml` continues."""
    require_sbatch()
    job, cfg = run_job(config, overrides)
    extending = _directory(cfg)[1]
    if (job.directory / "results.json").is_file() and not extending:
        raise UserError(f"{shown_path(job.directory)} is finished (results.json): nothing to submit; "
                        f"`{PROG} eval` evaluates its checkpoints again")
    queued = queued_jobs(job.path)
    if queued:
        raise UserError(f"{shown_path(job.directory)} is already queued or running as SLURM job {', '.join(queued)}: "
                        "nothing submitted (scancel it first to submit again)")
    check_request(job, cfg)
    if extending:
        from relpos_lab.training.planning import extend_run

        extend_run(cfg, job.directory, echo)
    snapshot = save_resolved_config(cfg, job.directory)
    if run_directory(load_config(snapshot)).resolve() != job.directory:
        raise RuntimeError(f"{snapshot} does not reload into its own run directory")
    return job, sbatch(job)


# --- a sweep as a job array ---------------------------------------------------------------------


def sweep_job(sweep: Sweep, echo=print) -> Job | None:
    """One array job over the sweep's unfinished points (None when every point is finished): a task
    per point, cluster.runs_per_gpu points to a task, or (cluster.stack) a stack to a task, whose
    grouping is printed.

    An array has one shape for all its tasks, so every point must ask for the same resources.
    """
    todo = [p.index for p in sweep.points if not is_finished(p)]
    if not todo:
        return None
    directory = sweep.directory.resolve()
    logs = directory / "slurm"
    output, error = logs / "%A_%a.out", logs / "%A_%a.err"
    first = sweep.config(todo[0])
    per_gpu = first.cluster.runs_per_gpu
    if per_gpu > 1 and (first.trainer.devices, first.trainer.num_nodes) != (1, 1):
        raise UserError(f"sweep {sweep.path}: cluster.runs_per_gpu={per_gpu} packs runs of one process onto one "
                        f"GPU, and these runs have trainer.devices={first.trainer.devices} and "
                        f"trainer.num_nodes={first.trainer.num_nodes}: set trainer.devices=1 trainer.num_nodes=1, "
                        "or cluster.runs_per_gpu=1 (an array task per point)")
    groups = tuple(tuple(todo[i:i + per_gpu]) for i in range(0, len(todo), per_gpu)) if per_gpu > 1 else None
    if first.cluster.stack > 1:
        stacks = stack_groups(sweep, [sweep.points[i] for i in todo], first.cluster.stack, echo)
        groups, per_gpu = tuple(tuple(p.index for p in group) for group in stacks), 1  # one process a task
    throttle = first.cluster.array_parallelism
    array = _index_ranges(todo if groups is None else list(range(len(groups)))) + (f"%{throttle}" if throttle else "")
    runs = min(per_gpu, len(todo))

    def shape_of(cfg: DictConfig) -> list[str]:  # the #SBATCH options, and the packing, which is none of them
        return [*sbatch_options(cfg, job_name=sweep.name, output=output, error=error, array=array, runs=runs),
                f"cluster.runs_per_gpu={cfg.cluster.runs_per_gpu}"]

    shape = shape_of(first)
    resources = _resources(OmegaConf.to_container(first, resolve=True))
    for index, resolved in sweep.resolved(todo[1:]):
        if _resources(resolved) == resources:
            continue
        other = shape_of(sweep.config(index))
        if other != shape:
            differ = sorted(set(shape) ^ set(other))
            raise UserError(f"sweep {sweep.path}: point {index} {sweep.points[index].shown} needs other SLURM "
                            f"resources than point {todo[0]} ({', '.join(differ)}); one job array has one shape: "
                            "split the sweep or submit the points one by one")
    points = logs / f"array-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    if groups is None:
        steps = one_step(f"{PROG} train {shlex.quote(str(points))}/$SLURM_ARRAY_TASK_ID/config.yaml resume=true")
    elif first.cluster.stack > 1:
        steps = stacked_step(points)
    else:
        steps = packed_steps(points, logs)
    script = render(shape[:-1], setup_lines(first), steps)
    return Job(sweep.name, script, logs / "array.sbatch", output, error, directory, array, points, groups)


def _resources(resolved: dict) -> str:
    """What a job's shape (sbatch_options, runs_per_gpu) is made of: the trainer and cluster sections."""
    return repr((resolved["trainer"], resolved["cluster"]))


def first_unfinished(sweep: Sweep) -> DictConfig:
    """The config of the sweep's first unfinished point: every point of its array has its shape."""
    return sweep.config(next(p.index for p in sweep.points if not is_finished(p)))


def pin_points(sweep: Sweep, job: Job) -> None:
    """Write each submitted point's resolved config into its run directory and link array index
    i to it (job.points/i; packed, task g to each of its points p: job.points/g/p), so a task
    trains what was submitted whatever the grid says by then."""
    job.points.mkdir(parents=True)
    if job.groups is None:
        links = {job.points / str(p.index): p.index for p in sweep.points if not is_finished(p)}  # the array's
    else:
        links = {job.points / str(task) / str(index): index for task, group in enumerate(job.groups) for index in group}
    for link, index in links.items():
        cfg = sweep.config(index)
        run_dir = run_directory(cfg).resolve()
        snapshot = save_resolved_config(cfg, run_dir)
        if run_directory(load_config(snapshot)).resolve() != run_dir:
            raise RuntimeError(f"{snapshot} does not reload into its own run directory")
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(run_dir)


def submit_sweep(sweep: Sweep, echo=print) -> tuple[Job | None, str | None]:
    """Submit the sweep's unfinished points as one job array; (None, None) if none is left."""
    require_sbatch()
    job = sweep_job(sweep, echo)
    if job is None:
        return None, None
    check_request(job, first_unfinished(sweep))
    sweep.write_manifest()
    pin_points(sweep, job)
    return job, sbatch(job)


def _index_ranges(indices: list[int]) -> str:
    """SLURM's --array syntax for sorted indices: [0, 1, 2, 5, 7, 8] -> "0-2,5,7-8"."""
    ranges: list[list[int]] = []
    for i in indices:
        if ranges and i == ranges[-1][1] + 1:
            ranges[-1][1] = i
        else:
            ranges.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


# --- submission ---------------------------------------------------------------------------------


def sbatch_available() -> bool:
    return shutil.which("sbatch") is not None


def require_sbatch() -> None:
    """Fail before anything is written when there is no SLURM to submit to."""
    if not sbatch_available():
        raise UserError("sbatch not found: submitting needs a SLURM cluster (slurm/dev-cluster-start.sh "
                        "starts one on this machine); --dry-run prints the script without submitting")


def cluster_unreachable() -> str | None:
    """Why no SLURM cluster answers here (None: one does). sbatch may be installed on a machine
    with no slurm.conf (a login node image, a laptop with the client package): then every command
    fails with "Could not establish a configuration source"."""
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as err:
        return f"sinfo: {err}"
    if out.returncode != 0:
        return (out.stderr.strip().splitlines() or [f"sinfo exit status {out.returncode}"])[-1]
    return None


def check_request(job: Job, cfg: DictConfig) -> None:
    """Refuse a job SLURM could never start, before anything is written or queued (at submission;
    a --dry-run asks nothing, so it prints the script without a live cluster).

    SLURM accepts such a job and leaves it pending forever (Reason=PartitionConfig when no node has
    the CPUs or GPUs asked for, PartitionTimeLimit when cluster.time exceeds the partition's
    MaxTime). `sbatch --test-only` on the script answers the first; the partition's limit, read
    with sinfo, the second. The refusal names what sbatch objected to: no configuration, memory,
    the partition, or the CPUs and GPUs.
    """
    unreachable = cluster_unreachable()
    if unreachable:
        raise UserError(f"no SLURM cluster answers on this machine ({unreachable}): sbatch is installed but has no "
                        "configuration or controller to submit to; configure slurm.conf (slurm/dev-cluster-start.sh "
                        "starts a two-node cluster here), or --dry-run prints the script without submitting")
    partition = cfg.cluster.partition
    limit = partition_time_limit(partition)
    if cfg.cluster.time is not None and limit is not None and slurm_minutes(str(cfg.cluster.time)) > limit:
        raise UserError(f"cluster.time={cfg.cluster.time} exceeds the MaxTime of partition "
                        f"{partition or '(default)'} ({_hours(limit)}): lower cluster.time or choose another "
                        "partition (cluster.partition); SLURM would keep the job pending forever")
    with tempfile.TemporaryDirectory() as scratch:
        script = Path(scratch) / "test.sbatch"
        script.write_text(job.script)
        out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        said = reason.removeprefix("sbatch: error: ")
        if "memory" in reason.lower():
            raise UserError(f"SLURM cannot run this job ({said}): cluster.mem={cfg.cluster.mem} is more than a node of "
                            f"partition {partition or '(default)'} offers; lower cluster.mem or leave it unset")
        if "partition" in reason.lower():
            raise UserError(f"SLURM cannot run this job ({said}): cluster.partition={partition}; `sinfo -s` lists "
                            "the partitions you may use")
        runs = max(map(len, job.groups)) if job.groups else 1
        gpus = f" + {cfg.trainer.devices} GPUs per node" if cfg.trainer.accelerator in GPU_ACCELERATORS else ""
        asks = (f"{cfg.trainer.num_nodes} node(s) x {cfg.trainer.devices * runs} task(s) x {cfg.cluster.cpus_per_task} "
                f"CPUs{gpus}" + (f" ({runs} runs per GPU)" if runs > 1 else ""))
        nodes = partition_node_count(partition)
        lower = (f"trainer.num_nodes (the partition has {nodes} node{'s' if nodes != 1 else ''})"
                 if nodes and cfg.trainer.num_nodes > nodes else
                 f"{'cluster.runs_per_gpu' if runs > 1 else 'trainer.devices'} / cluster.cpus_per_task")
        raise UserError(f"SLURM cannot run this job ({reason.removeprefix('sbatch: error: ')}): it asks for {asks}, "
                        f"and partition {partition or '(default)'} has {partition_nodes(partition)}; lower "
                        f"{lower} or choose another partition (cluster.partition)")


def partition_time_limit(partition: str | None) -> float | None:
    """The partition's MaxTime in minutes (the default partition when None); None: unlimited or unknown."""
    row = _sinfo(partition, "%l")
    return slurm_minutes(row[0]) if row and row[0] not in ("infinite", "UNLIMITED", "n/a") else None


def partition_nodes(partition: str | None) -> str:
    """The partition's nodes as `name: N CPUs[, gres]`, for messages."""
    rows = _sinfo(partition, "%N %c %G", per_node=True)
    nodes = [f"{n}: {c} CPUs" + (f", {g}" if g not in ("(null)", "") else "")
             for n, c, g in (r.split(" ", 2) for r in rows)]
    return "; ".join(sorted(set(nodes))) or "no nodes"


def partition_node_count(partition: str | None) -> int:
    """How many nodes the partition has (0: unknown): more than that in trainer.num_nodes is what to lower."""
    return sum(int(row) for row in _sinfo(partition, "%D") if row.isdigit())


def _sinfo(partition: str | None, fmt: str, per_node: bool = False) -> list[str]:
    args = ["sinfo", "-h", "-o", fmt] + (["-N"] if per_node else []) + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return []
    rows = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if partition is None and not per_node:  # several partitions: the default one is marked with *
        marked = subprocess.run(["sinfo", "-h", "-o", f"%P {fmt}"], capture_output=True, text=True, timeout=60)
        rows = [line.split(" ", 1)[1] for line in marked.stdout.splitlines() if line.split(" ", 1)[0].endswith("*")]
    return rows


def slurm_minutes(text: str) -> float:
    """SLURM's time formats in minutes: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S."""
    days, _, rest = text.rpartition("-")
    parts = [float(x) for x in rest.split(":")]
    if days:
        hours_minutes_seconds = (parts + [0, 0])[:3]
        return (float(days) * 1440 + hours_minutes_seconds[0] * 60 + hours_minutes_seconds[1]
                + hours_minutes_seconds[2] / 60)
    if len(parts) == 3:
        return parts[0] * 60 + parts[1] + parts[2] / 60
    if len(parts) == 2:
        return parts[0] + parts[1] / 60
    return parts[0]


def _hours(minutes: float) -> str:
    return f"{int(minutes // 60):02d}:{int(minutes % 60):02d}:00"


def queued_jobs(script: Path) -> list[str]:
    """Ids of this user's pending or running jobs whose batch script is `script`."""
    out = subprocess.run(["squeue", "--me", "-h", "-t", "PENDING,RUNNING,REQUEUED,SUSPENDED", "-o", "%i %o"],
                         capture_output=True, text=True, timeout=60)
    return [line.split(" ", 1)[0] for line in out.stdout.splitlines()
            if line.split(" ", 1)[-1].strip() == str(script)]


def sbatch(job: Job) -> str:
    """Write the job's script and submit it; returns the job id."""
    job.path.parent.mkdir(parents=True, exist_ok=True)  # also the log directory: SLURM will not create it
    job.path.write_text(job.script)
    out = subprocess.run(["sbatch", "--parsable", str(job.path)], capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        reason = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise UserError(f"sbatch refused {job.path}: {reason}")
    return out.stdout.strip().split(";")[0]  # --parsable prints "id" or "id;cluster"
