"""CPU threads chosen on purpose: the CPUs this process may use, shared among the node's processes.

torch's default, one thread per core of the machine, assumes the machine is ours alone. Researchers
share login nodes, laptops and oversubscribed cluster nodes; beside another busy process, OpenMP
threads that spin-wait for each other burn the cores the other process needs, and both slow down
many times over (docs/performance.md, "Threads on a shared machine", measures it). So a process
takes the CPUs it may run on (its affinity mask, capped by SLURM_CPUS_PER_TASK) divided by the
processes of its node, and OpenMP threads sleep instead of spinning when they wait.

The wait policy must be set before torch loads its OpenMP runtime, so the CLI calls
`quiet_openmp()` first thing; this module imports torch only inside `use_cpu_threads`.
"""
from __future__ import annotations

import os


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
    """`configured` when > 0 (trainer.threads), else this process's share of the available CPUs."""
    if configured > 0:
        return configured
    return max(1, available_cpus() // max(1, local_processes))


def use_cpu_threads(configured: int = 0, local_processes: int = 1) -> int:
    """Set torch's intra-op threads for this process; returns the number set."""
    import torch

    threads = cpu_threads(configured, local_processes)
    torch.set_num_threads(threads)
    return threads
