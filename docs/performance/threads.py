"""Threads on a shared machine: the README main job's first steps, idle and beside a busy neighbour.

The neighbour is a second CPU-bound torch process using 2 threads, as a second run started with
torch's defaults would be. Each setting trains `relpos-lab train reverse_shaw` for --steps steps
(tiny final evaluation, W&B off) in a fresh run directory, alone and then beside the neighbour,
and the table gives both wall times and their ratio. Settings:

- torch's default: one thread per core and libgomp's default spin-wait (GOMP_SPINCOUNT=300000);
  what relpos-lab did before it chose threads itself;
- relpos-lab's default: trainer.threads=0 (this process's share of the CPUs it may use, less those
  other processes keep busy when it starts) and
  OpenMP threads that sleep when they wait (OMP_WAIT_POLICY=PASSIVE, set by the CLI);
- one thread, sleeping waits.

Run it on an otherwise idle machine:  python docs/performance/threads.py --json docs/performance/threads.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

NEIGHBOUR = "import torch\ntorch.set_num_threads(2)\nx = torch.randn(384, 384)\nwhile True:\n    x = (x @ x).tanh()\n"


def settings() -> dict[str, tuple[dict[str, str], list[str]]]:
    cores = os.cpu_count() or 1
    return {
        f"torch default ({cores} threads, spinning waits)": ({"GOMP_SPINCOUNT": "300000"},
                                                             [f"trainer.threads={cores}"]),
        "relpos-lab default (threads=0: its share, less busy CPUs; sleeping waits)": ({}, []),
        "1 thread, sleeping waits": ({}, ["trainer.threads=1"]),
    }


def clean_env(extra: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS")}
    return {**env, "WANDB_MODE": "disabled", **extra}


def train_seconds(steps: int, env: dict[str, str], overrides: list[str]) -> float:
    with tempfile.TemporaryDirectory() as root:
        command = [sys.executable, "-m", "relpos_lab", "train", "reverse_shaw", f"trainer.max_steps={steps}",
                   f"trainer.val_every_n_steps={steps}", "trainer.enable_progress_bar=false",
                   "task.eval_size_per_length=2", f"logging.root={root}", "logging.wandb.mode=disabled", *overrides]
        started = time.perf_counter()
        subprocess.run(command, env=clean_env(env), check=True, capture_output=True, cwd=root)
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--json", dest="json_path", default=None)
    args = parser.parse_args()
    rows = []
    for name, (env, overrides) in settings().items():
        idle = train_seconds(args.steps, env, overrides)
        neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR], env=clean_env({}))
        try:
            time.sleep(2)  # let it spin up
            busy = train_seconds(args.steps, env, overrides)
        finally:
            neighbour.kill()
            neighbour.wait()
        rows.append({"setting": name, "idle_s": round(idle, 1), "beside_neighbour_s": round(busy, 1),
                     "ratio": round(busy / idle, 2)})
        print(f"{name:50s} idle {idle:6.1f} s   beside a 2-thread neighbour {busy:6.1f} s   ratio {busy / idle:5.2f}",
              flush=True)
    if args.json_path:
        machine = {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "steps": args.steps}
        with open(args.json_path, "w") as file:
            json.dump({"machine": machine, "rows": rows}, file, indent=2)


if __name__ == "__main__":
    main()
