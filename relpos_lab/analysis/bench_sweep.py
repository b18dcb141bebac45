"""`relpos-lab bench sweep [NAME ...]`: how long the shipped sweeps take to expand, and their
`--slurm --dry-run`; no model, no device."""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

PAPER_SWEEPS = ("deletang2023_paper", "ruoss2023_paper", "zhou2024_addition")
"""The largest shipped sweeps (ruoss2023_paper: 5,850 points), `bench sweep`'s default."""

SLURM_DRY_RUN = ("trainer=gpu1", "cluster=example", "cluster.runs_per_gpu=8", "cluster.cpus_per_task=2")
"""docs/slurm.md's packed job array (with the shipped cluster piece): what `bench sweep` times
`sweep NAME --slurm --dry-run` with."""


def bench_sweeps(names: list[str]) -> dict[str, tuple[float, float]]:
    """`bench sweep [NAME ...]`: for each sweep, the seconds it takes to expand (every point's
    config resolved and checked, its run directory found), what `sweep --list` waits for before it
    prints, then those of `sweep NAME --slurm --dry-run` with SLURM_DRY_RUN's pieces (the expansion
    again, with them, and the job array's script); wall and CPU seconds, as a loaded machine
    stretches the one and not the other. The first sweep's time includes loading its tasks' plugins."""
    from relpos_lab.launch.slurm import sweep_job
    from relpos_lab.launch.sweep import load_sweep

    def timed(work: Callable[[], Any]) -> tuple[Any, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = work()
        return out, time.perf_counter() - wall, time.process_time() - cpu

    seconds = {}
    for name in names:
        sweep, wall, cpu = timed(lambda: load_sweep(name))
        points = len(sweep.points)
        print(f"sweep {name}: {points:,} points expanded in {wall:.1f} s ({cpu:.1f} s CPU, "
              f"{wall / points * 1e3:.2f} ms a point)")
        _, slurm_wall, slurm_cpu = timed(lambda: sweep_job(load_sweep(name, list(SLURM_DRY_RUN))))
        print(f"sweep {name} --slurm --dry-run {' '.join(SLURM_DRY_RUN)}: {slurm_wall:.1f} s "
              f"({slurm_cpu:.1f} s CPU)")
        seconds[name] = (wall, slurm_wall)
    return seconds
