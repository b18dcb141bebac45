"""CPU threads chosen on purpose: the CPUs this process may use, shared among the node's processes.

torch's default, one thread per core of the machine, assumes the machine is ours alone. Researchers
share login nodes, laptops and oversubscribed cluster nodes; beside another busy process, OpenMP
threads that spin-wait for each other burn the cores the other process needs, and both slow down
many times over (docs/performance.md, "Threads on a shared machine", measures it). So a process
takes the CPUs it may run on (its affinity mask, capped by SLURM_CPUS_PER_TASK) divided by the
processes of its node, less the CPUs other processes keep busy right now (sampled from /proc/stat
over 0.2 s at start), and OpenMP threads sleep instead of spinning when they wait. A neighbour
that starts later is not seen: set `trainer.threads` for such a machine.

The wait policy must be set before torch loads its OpenMP runtime, so the CLI calls
`quiet_openmp()` first thing; this module imports torch only inside `use_cpu_threads`.
"""
from __future__ import annotations

import os
import time


def quiet_openmp() -> None:
    """OpenMP threads block instead of spin-waiting (OMP_WAIT_POLICY=PASSIVE), unless the user
    chose a policy or a spin count: effective only before torch is first imported."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def available_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by SLURM's per-task allocation."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    return max(1, cpus)


def cpu_threads(configured: int, local_processes: int) -> int:
    """`configured` when > 0 (trainer.threads), else this process's share of the available CPUs,
    and no more than the CPUs other processes leave idle."""
    if configured > 0:
        return configured
    share = max(1, available_cpus() // max(1, local_processes))
    busy = busy_cpus() if share > 1 else None
    if busy is None:
        return share
    idle = available_cpus() - busy
    return max(1, min(share, int(idle + 0.5)))


def busy_cpus(interval: float = 0.2) -> float | None:
    """How many of this process's CPUs others keep busy now (0.0-N), from two /proc/stat samples
    of just those CPUs; None where /proc/stat cannot be read (not Linux)."""
    try:
        mine = os.sched_getaffinity(0)
        first = _cpu_times(mine)
        time.sleep(interval)
        second = _cpu_times(mine)
    except (AttributeError, OSError, ValueError):
        return None
    busy = 0.0
    for cpu, (used, total) in second.items():
        used0, total0 = first.get(cpu, (used, total))
        if total > total0:
            busy += (used - used0) / (total - total0)
    return busy


def _cpu_times(cpus: set[int]) -> dict[int, tuple[int, int]]:
    """{cpu: (busy jiffies, total jiffies)} of the given CPUs; idle and iowait count as not busy."""
    times = {}
    with open("/proc/stat") as stat:
        for line in stat:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
                values = [int(v) for v in fields[:8]]
                idle = values[3] + values[4]
                times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def use_cpu_threads(configured: int = 0, local_processes: int = 1) -> int:
    """Set torch's intra-op threads for this process; returns the number set."""
    import torch

    threads = cpu_threads(configured, local_processes)
    torch.set_num_threads(threads)
    return threads
