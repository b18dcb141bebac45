"""Learning-rate schedules: exact multipliers of the peak rate."""
from __future__ import annotations

import math

import pytest
import torch

from relpos_lab.config import OptimConfig
from relpos_lab.training.optim import build_optimizer, build_scheduler, lr_factor


def factors(scheduler, n, warmup=4, total=10, min_lr_ratio=0.0):
    return [lr_factor(s, scheduler=scheduler, warmup_steps=warmup, total_steps=total, min_lr_ratio=min_lr_ratio)
            for s in range(n)]


def test_inverse_sqrt_warms_up_linearly_then_decays_as_inverse_sqrt():
    assert factors("inverse_sqrt", 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, math.sqrt(4 / 5), math.sqrt(4 / 6)])


def test_inverse_sqrt_matches_the_transformer_papers_formula():
    d_model, warmup = 512, 4000
    peak = d_model**-0.5 * warmup**-0.5
    for step in (1, 100, 4000, 10000):
        paper = d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
        assert (peak * lr_factor(step - 1, scheduler="inverse_sqrt", warmup_steps=warmup, total_steps=0)
                == pytest.approx(paper))


def test_cosine_ends_at_the_minimum_ratio():
    f = factors("cosine", 12, warmup=2, total=10, min_lr_ratio=0.1)
    assert f[:2] == pytest.approx([0.5, 1.0]) and f[9] == pytest.approx(0.1) and f[11] == pytest.approx(0.1)
    assert f[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))


def test_constant_holds_the_peak_after_warm_up():
    assert factors("constant", 6) == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_adam_uses_the_papers_betas_and_epsilon_and_the_schedule_steps():
    param = torch.nn.Parameter(torch.zeros(1))
    opt = build_optimizer([param], OptimConfig(lr=0.1, warmup_steps=4))
    sched = build_scheduler(opt, OptimConfig(lr=0.1, warmup_steps=4), total_steps=10)
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9
    assert group["lr"] == pytest.approx(0.025)
    opt.step()
    sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05)


def test_adamw_steps_every_parameter_at_once_on_cpu():
    """foreach on CPU (fused on CUDA: tests/test_cuda.py): one op per step for all tensors."""
    opt = build_optimizer([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.ones(3))], OptimConfig())
    assert opt.param_groups[0]["foreach"] is True and not opt.param_groups[0]["fused"]
