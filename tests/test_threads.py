"""CPU threads: each process takes its share of the CPUs it may use, and OpenMP does not spin."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import torch

from relpos_lab.training import threads


def test_the_share_is_the_allowed_cpus_divided_among_the_nodes_processes(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(threads, "busy_cpus", lambda: 0.0)  # an idle machine
    assert threads.available_cpus() == 8
    assert threads.cpu_threads(0, 1) == 8
    assert threads.cpu_threads(0, 3) == 2  # 8 // 3
    assert threads.cpu_threads(0, 16) == 1  # never zero
    assert threads.cpu_threads(5, 2) == 5  # trainer.threads wins
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")  # the job's allocation, even if affinity says more
    assert threads.cpu_threads(0, 2) == 2


def test_cpus_other_processes_keep_busy_are_left_to_them(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.delenv("SLURM_CPUS_PER_TASK", raising=False)
    monkeypatch.setattr(threads, "busy_cpus", lambda: 5.8)
    assert threads.cpu_threads(0, 1) == 2  # 8 - 5.8, rounded
    monkeypatch.setattr(threads, "busy_cpus", lambda: 8.0)
    assert threads.cpu_threads(0, 1) == 1  # never zero
    assert threads.cpu_threads(3, 1) == 3  # trainer.threads is taken as given


def test_a_busy_neighbour_is_seen_in_proc_stat():
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        assert threads.busy_cpus() >= 0.7  # one process spinning on one of our CPUs
    finally:
        spin.kill()
        spin.wait()


def test_a_training_process_uses_its_share(tmp_path, monkeypatch):
    from relpos_lab.config import load_config
    from relpos_lab.training import experiment

    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # not what the run asks for, so the assertion below can fail
    try:
        cfg = load_config("reverse_shaw", ["debug", "trainer.threads=1", "trainer.max_steps=2",
                                            "task.train_size=32", "task.eval_size_per_length=1",
                                            "logging.wandb.mode=disabled"])
        experiment.train(cfg, echo=lambda message: None)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_cli_makes_openmp_threads_sleep_unless_the_user_chose():
    probe = ("import os, sys; from relpos_lab import cli; sys.argv = ['relpos-lab', 'tasks']; "
             "import contextlib, io\nwith contextlib.redirect_stdout(io.StringIO()): cli.run()\n"
             "print(os.environ.get('OMP_WAIT_POLICY'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-1] == "PASSIVE", out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", probe], env={**env, "OMP_WAIT_POLICY": "ACTIVE"},
                         capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-1] == "ACTIVE", out.stderr[-2000:]
