"""Ops a training step dispatches: what a GPU pays in host time for a small model, counted on CPU.

A step of a small model on a GPU is bound by the host: each aten op is a dispatch (and mostly a
kernel launch) of microseconds, whatever its size. Counting them is a measure that does not
depend on the machine's load: `bench model --stack K` prints a solo run's step beside a stack's
step per member (core/stack.py, training/stacking.py).
"""
from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from relpos_lab.config import OptimConfig
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.stack import Stack
from relpos_lab.training.optim import build_optimizer
from relpos_lab.training.stacking import StackedAdamW


class OpCounter(TorchDispatchMode):
    """Every aten op dispatched while active, by name (views and scalar reads included: each costs
    the host a dispatch)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())


def count_ops(step: Callable[[], object]) -> OpCounter:
    """The ops of one call of `step`, after a first call (Adam's state and caches exist)."""
    step()
    with OpCounter() as counter:
        step()
    return counter


def solo_step(model: nn.Module, loss: Callable[[nn.Module], Tensor], max_grad_norm: float = 1.0):
    """One training step as a run takes it: loss, backward, global-norm clipping, AdamW (foreach)."""
    optimizer = build_optimizer(model.parameters(), OptimConfig(lr=1e-4))

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss(model).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return step


def stacked_step(models: list[nn.Module], loss: Callable[..., Tensor], batched: tuple, max_grad_norm: float = 1.0):
    """One step of the same runs stacked: `loss(model, *member_batch)` for each member at once."""
    stack = Stack([copy.deepcopy(m) for m in models])
    optimizer = StackedAdamW(stack, lr=1e-4, max_grad_norm=max_grad_norm)

    def step():
        losses = stack.apply(loss, *batched)
        optimizer.step(stack.flat_grad(losses), 1.0, losses)
    return step


def encoder_only_loss(model: nn.Module, src: Tensor, tgt: Tensor) -> Tensor:
    """The papers' encoder-only step: every output slot scored, as Delétang et al. train."""
    n_slots = torch.full_like(src[:, 0], tgt.shape[1])
    return label_smoothed_loss(model(src, n_slots, width=tgt.shape[1]), tgt, 0.0).loss
