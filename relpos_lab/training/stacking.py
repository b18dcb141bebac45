"""Training a stack of runs (core/stack.py) with one update for all: AdamW and global-norm
clipping per run, written over the stack's flat (K, P) parameter tensor, a few ops for all
parameters of all runs, each run at its own learning rate, clipping norm and Adam state.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from relpos_lab.core.stack import Stack


class StackedAdamW:
    """AdamW (plain Adam at weight decay 0) with global-norm gradient clipping, per member, over a
    stack's flat parameters: the arithmetic of torch.optim.AdamW and clip_grad_norm_ as a solo run
    does them, a few ops for every parameter of every member. Hyperparameters are per member
    ((K,) tensors or one value for all)."""

    def __init__(self, stack: Stack, lr: Sequence[float] | float, betas=(0.9, 0.98), eps=1e-9,
                 weight_decay: Sequence[float] | float = 0.0, max_grad_norm: Sequence[float] | float = 0.0):
        self.stack, k = stack, stack.size
        column = lambda v: torch.as_tensor(v, dtype=stack.flat.dtype, device=stack.flat.device).expand(k)[:, None]  # noqa: E731
        self.peak_lr, self.weight_decay, self.max_grad_norm = column(lr), column(weight_decay), column(max_grad_norm)
        self.beta1, self.beta2 = column(betas[0]), column(betas[1])
        self.eps = column(eps)
        self.exp_avg = torch.zeros_like(stack.flat)
        self.exp_avg_sq = torch.zeros_like(stack.flat)
        self.steps = 0
        self.active = torch.ones(k, dtype=torch.bool, device=stack.flat.device)
        """members still training: one whose loss or gradient went non-finite stops alone (its
        parameters and moments stay as they were before that step)"""
        self.stopped_at = torch.full((k,), -1, dtype=torch.long, device=stack.flat.device)
        """each stopped member's updates taken before it stopped (−1: still training); kept on the
        device, so that no step waits to read it"""

    @torch.no_grad()
    def step(self, grad: Tensor, lr_factor: float | Tensor = 1.0, loss: Tensor | None = None) -> Tensor:
        """One update from the flat (K, P) gradient at the peak rates times `lr_factor` (the schedule's
        multiplier, one for all or (K,)); returns each member's gradient norm before clipping."""
        norms = grad.norm(dim=1, keepdim=True)
        finite = torch.isfinite(norms) if loss is None else torch.isfinite(norms) & torch.isfinite(loss)[:, None]
        self.active &= finite[:, 0]
        self.stopped_at = torch.where(self.active | (self.stopped_at >= 0), self.stopped_at, self.steps)
        on = self.active[:, None]
        # clip_grad_norm_: scale by max_norm / (norm + 1e-6) where that is below 1
        clip = torch.where(self.max_grad_norm > 0, self.max_grad_norm / (norms + 1e-6), 1.0).clamp(max=1.0)
        grad = torch.where(on, grad * clip, 0.0)
        self.steps += 1
        lr = self.peak_lr * torch.as_tensor(lr_factor, dtype=grad.dtype, device=grad.device).reshape(-1, 1) * on
        flat = self.stack.flat
        flat.mul_(1 - lr * self.weight_decay)
        self.exp_avg.copy_(torch.where(on, self.exp_avg.lerp(grad, 1 - self.beta1), self.exp_avg))
        self.exp_avg_sq.copy_(torch.where(on, self.exp_avg_sq * self.beta2 + (1 - self.beta2) * grad * grad,
                                          self.exp_avg_sq))
        correction1 = 1 - self.beta1 ** self.steps
        correction2_sqrt = (1 - self.beta2 ** self.steps).sqrt()
        denom = self.exp_avg_sq.sqrt() / correction2_sqrt + self.eps
        flat.addcdiv_(self.exp_avg * (-lr / correction1), denom)
        return norms[:, 0]
