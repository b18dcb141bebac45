"""Runs stacked into one model: K runs of one model shape trained by one step.

A sweep of small models is bound by the host on a GPU: each step of each run dispatches about a
thousand tiny ops. A stack holds K runs' parameters with a leading run dimension and runs the
model once for all of them under `torch.func.vmap`, so one step dispatches about the ops of one
run (each K times wider) whatever K is. Each run keeps its own data (a (K, B, …) batch), its own
learning rate, gradient clipping and Adam state: the update is AdamW and global-norm clipping,
per run, written over the stack's flat (K, P) parameter tensor, a few ops for all parameters.

Exact: without dropout or randomized positions, a member's losses and parameters are its solo
run's (the same ops per example; tests/test_stacking.py). Random draws (dropout, randomized
positions) are each member's own (`randomness="different"`), not its solo run's.

The model runs through its plain-op paths, as when compiled (`core.compiling.traced`): no in-place
autograd Function and no branch on a tensor's value; `auto` attention picks what vmap batches
(torch's SDPA, or `gather`), not the fused kernels.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, vmap

from relpos_lab.core.stacked_ops import stack_linear_layers


class _Apply(nn.Module):
    """`fn(model, *args)` as a module's forward, so functional_call swaps the model's parameters for
    one member's (tied weights included) however the task calls it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(self.model, *args)


class Stack:
    """K models of one architecture as one. `params` are (K, …) views of one flat (K, P) tensor
    that training updates in place; `member(k)` is run k as an ordinary model."""

    def __init__(self, models: Sequence[nn.Module]):
        if not models:
            raise ValueError("a stack needs at least one model")
        _check_same_shape(models)
        self.size = len(models)
        self._solo = copy.deepcopy(models[0])  # what `member` copies: the model as a solo run holds it
        self._apply = _Apply(stack_linear_layers(copy.deepcopy(models[0])))
        named = [dict(m.named_parameters()) for m in models]  # tied weights once, as functional_call expects
        self.shapes = {name: p.shape for name, p in named[0].items()}
        self.flat = torch.cat([torch.stack([n[name].detach().reshape(-1) for n in named]) for name in self.shapes],
                              dim=1)
        self.params: dict[str, Tensor] = {}
        start = 0
        for name, shape in self.shapes.items():
            size = shape.numel()
            self.params[name] = self.flat[:, start:start + size].view(self.size, *shape).requires_grad_()
            start += size
        self.buffers = {name: torch.stack([dict(m.named_buffers())[name] for m in models])
                        for name, _ in models[0].named_buffers()}

    @property
    def model(self) -> nn.Module:
        """The architecture as a solo run holds it (its own parameters are member 0's initial ones)."""
        return self._solo

    def apply(self, fn: Callable[..., Any], *batched: Any, shared: tuple = ()) -> Any:
        """`fn(model, *args)` for every member at once: `batched` are pytrees of (K, …) tensors, one
        slice per member; `shared` are passed as they are (host ints, configs). Results come back with
        a leading K dimension."""
        def one(params, buffers, *args):
            state = {f"model.{n}": t for n, t in (params | buffers).items()}
            return functional_call(self._apply, state, (fn, *args, *shared))

        return vmap(one, randomness="different")(self.params, self.buffers, *batched)

    def flat_grad(self, loss: Tensor) -> Tensor:
        """d loss.sum() / d parameters as one (K, P) tensor, in the layout of `flat`: member k's loss
        reaches only member k's parameters, so each row is that member's own gradient."""
        grads = torch.autograd.grad(loss.sum(), list(self.params.values()), allow_unused=True)
        return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(self.size, -1)
                          for g, p in zip(grads, self.params.values())], dim=1)

    def member_state_dict(self, k: int) -> dict[str, Tensor]:
        """Member k's parameters and buffers under the model's own state_dict keys (tied weights under
        each of their names), as a solo run's model would hold them."""
        own = {n: p[k].detach() for n, p in self.params.items()} | {n: b[k] for n, b in self.buffers.items()}
        model = self.model
        out = {}
        for key, value in model.state_dict(keep_vars=True).items():
            out[key] = own[key] if key in own else own[_tied_name(model, value, own)]
        return {key: value.clone() for key, value in out.items()}

    def member(self, k: int) -> nn.Module:
        """Member k as an ordinary model (a copy: evaluation, checkpoints, decoding)."""
        model = copy.deepcopy(self.model)
        model.load_state_dict(self.member_state_dict(k))
        return model


def _tied_name(model: nn.Module, value: Tensor, own: dict[str, Tensor]) -> str:
    """The name functional_call knows a tied parameter by (the first, as named_parameters gives it)."""
    for name, p in model.named_parameters():
        if p is value and name in own:
            return name
    raise KeyError("a state_dict entry that is neither a parameter nor a buffer of the stack")


def _check_same_shape(models: Sequence[nn.Module]) -> None:
    first = models[0]
    shapes = {n: p.shape for n, p in first.named_parameters()}
    for k, model in enumerate(models[1:], start=1):
        if type(model) is not type(first):
            raise ValueError(f"stack member {k} is a {type(model).__name__}, member 0 a {type(first).__name__}: "
                             "only runs of one model shape stack")
        other = {n: p.shape for n, p in model.named_parameters()}
        if other != shapes:
            diff = next(n for n in sorted(shapes.keys() | other.keys()) if shapes.get(n) != other.get(n))
            raise ValueError(f"stack member {k}'s parameter {diff} is {other.get(diff)}, member 0's "
                             f"{shapes.get(diff)}: only runs of one model shape stack")


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

    @torch.no_grad()
    def step(self, grad: Tensor, lr_factor: float | Tensor = 1.0, loss: Tensor | None = None) -> Tensor:
        """One update from the flat (K, P) gradient at the peak rates times `lr_factor` (the schedule's
        multiplier, one for all or (K,)); returns each member's gradient norm before clipping."""
        norms = grad.norm(dim=1, keepdim=True)
        finite = torch.isfinite(norms) if loss is None else torch.isfinite(norms) & torch.isfinite(loss)[:, None]
        self.active &= finite[:, 0]
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
