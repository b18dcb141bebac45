"""Optimiser and learning-rate schedules: Adam as in "Attention Is All You Need", with warm-up.

The schedules are multipliers of the peak rate `optim.lr`, one per optimizer step:

- ``inverse_sqrt`` (the Transformer schedule): linear warm-up to the peak, then ∝ 1/sqrt(step).
  The paper's rate d_model^-0.5 · min(step^-0.5, step · warmup^-1.5) is this schedule with
  lr = d_model^-0.5 · warmup^-0.5.
- ``cosine``: linear warm-up, then half a cosine down to ``min_lr_ratio`` at the last step.
- ``constant``: linear warm-up, then flat.

They are plain functions of the step, wrapped in torch's LambdaLR, so a resumed run continues the
schedule exactly from the scheduler state in the checkpoint.
"""
from __future__ import annotations

import math
from functools import partial

import torch
from torch.optim.lr_scheduler import LambdaLR

from relpos_lab.config import OptimConfig


def lr_factor(step: int, *, scheduler: str, warmup_steps: int, total_steps: int, min_lr_ratio: float = 0.0) -> float:
    """Multiplier of the peak rate for the optimizer step with index `step` (0 for the first)."""
    s = step + 1  # the first update already gets a non-zero rate
    w = max(warmup_steps, 1)
    if scheduler == "inverse_sqrt":
        return min(s / w, math.sqrt(w / s))
    if scheduler == "constant":
        return min(s / w, 1.0)
    if scheduler == "cosine":
        if s < w:
            return s / w
        progress = min((s - w) / max(total_steps - w, 1), 1.0)
        return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"optim.scheduler={scheduler!r} is unknown")


def build_optimizer(params, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW: plain Adam when weight_decay is 0 (the paper), decoupled weight decay otherwise.

    On CUDA its fused kernel updates every parameter in a few launches; elsewhere the foreach
    form (one op per step for all parameters, not one per tensor)."""
    params = list(params)
    cuda = bool(params) and all(p.is_cuda for p in params)
    return torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps, weight_decay=cfg.weight_decay,
                             fused=cuda or None, foreach=None if cuda else True)


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int) -> LambdaLR:
    return LambdaLR(optimizer, partial(lr_factor, scheduler=cfg.scheduler, warmup_steps=cfg.warmup_steps,
                                       total_steps=total_steps, min_lr_ratio=cfg.min_lr_ratio))
