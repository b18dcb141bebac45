"""K models of one architecture run as one: a stack of runs under `torch.func.vmap`.

A sweep of small models is bound by the host on a GPU: each step of each run dispatches about a
thousand tiny ops. A stack holds K runs' parameters with a leading run dimension and runs the
model once for all of them, so one step dispatches about the ops of one run (each K times wider)
whatever K is. Each member keeps its own data (a (K, B, …) batch); training's optimizer
(training/stacking.py) updates the stack's flat (K, P) parameter tensor.

Exact: without dropout or randomized positions, a member's outputs and gradients are its solo
model's (the same ops per example; tests/test_stacking.py). Random draws (dropout, randomized
positions) are each member's own (`randomness="different"`), not its solo run's.

The model runs through its plain-op paths, as when compiled (`core.compiling.traced`): no in-place
autograd Function and no branch on a tensor's value; `auto` attention picks what vmap batches
(torch's SDPA, or `gather`), not the fused kernels. Every module of the stack's model has
`stacked = True`, for a layer that must run otherwise in a stack whether or not dynamo traces it
(where `compiling.in_transform` cannot tell): the digit embeddings skip their bounds assert, which
vmap cannot batch. `api.testing.check_scheme` says whether a plugin scheme stacks.
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
        for module in self._apply.modules():  # what a layer reads to run as a stack needs, compiled or not
            module.stacked = True
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
