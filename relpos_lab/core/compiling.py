"""torch.compile for the lab's models: `trainer.compile` in training and evaluation.

A model is compiled in place (`nn.Module.compile`): its class, its state_dict keys (no
``_orig_mod.``) and its other methods stay as they are. A model a caller wrapped with
`torch.compile(model)` is the same model to the lab: code that dispatches on the model's class
looks through the wrapper (`unwrapped`). Only a call of the model itself, the
full-sequence forward of training, teacher-forced validation and the encoder-only slots, runs
compiled, and with it the backward. Decoding steps (`start_decoding`, `decode_step`) stay eager:
a KV cache's Python state changes every step and would recompile the graph each time.

Every built-in scheme traces as one graph, in every model family and with randomized positions
(tests/test_compile.py): the
attention's in-place autograd Functions, which save a pass in eager, give way to plain tensor ops
while dynamo traces (`torch.compiler.is_compiling()`), and nothing in the forward branches on a
tensor's value there. `graph_breaks` says where a plugin scheme does not.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

MODES = ("none", "default", "reduce-overhead", "max-autotune")
"""none: eager; the others are torch.compile's modes (default is its mode=None; reduce-overhead adds CUDA graphs)."""


def compile_model(model: nn.Module, mode: str) -> nn.Module:
    """`model`, its forward compiled in place with torch.compile's `mode` (see MODES).

    A run that recompiles past dynamo's limit (`torch._dynamo.config.recompile_limit`, too many
    distinct shapes) fails with dynamo's error naming the limit instead of quietly going on eager.
    """
    if _compiles(mode):
        model.compile(mode=None if mode == "default" else mode)
    return model


def compile_function(fn: Callable, mode: str) -> Callable:
    """`fn` compiled as `compile_model` compiles a forward: a stack's forward (with its backward) and
    its update (training/stacked.py), each one function and so one graph."""
    return torch.compile(fn, mode=None if mode == "default" else mode) if _compiles(mode) else fn


def _compiles(mode: str) -> bool:
    """Whether `mode` compiles (it is checked); if so, a recompile past dynamo's limit is an error."""
    if mode not in MODES:
        raise ValueError(f"compile mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "none":
        return False
    torch._dynamo.config.fail_on_recompile_limit_hit = True
    return True


def in_transform() -> bool:
    """True inside a torch.func transform: `vmap` running a stack of runs as one model
    (core/stack.py), or `grad`. Like a dynamo trace, it needs plain tensor ops (no in-place
    autograd Function, no branch on a tensor's value)."""
    if torch.compiler.is_compiling():  # dynamo traces the model (and any vmap in it) itself
        return False
    return torch._C._functorch.peek_interpreter_stack() is not None


def traced() -> bool:
    """True while dynamo traces the model or a torch.func transform runs it: the forward's plain-op
    paths, which never branch on a tensor's value, instead of eager's in-place shortcuts."""
    return torch.compiler.is_compiling() or in_transform()


def is_compiled(model: nn.Module) -> bool:
    return getattr(model, "_compiled_call_impl", None) is not None


def unwrapped(model: nn.Module) -> nn.Module:
    """The module `torch.compile(module)` wrapped (its `_orig_mod`), or `model` itself.

    The wrapper calls the module compiled and forwards every other attribute, but it is another
    class, its state_dict keys start with ``_orig_mod.`` and its submodules' names too: code that
    asks what a model is, names its layers or saves its weights asks this instead. Asked by the
    attribute, not the wrapper's class, so that an eager run does not import dynamo (seconds)."""
    while isinstance(getattr(model, "_orig_mod", None), nn.Module):
        model = model._orig_mod
    return model


def compiled_in_place(model: nn.Module) -> nn.Module:
    """`model`, or where it is a `torch.compile` wrapper, the module it wraps compiled in place
    with the wrapper's settings (what `module.compile(...)` with the same arguments does), so a
    task whose `build_model` returns `torch.compile(model)` trains a model whose checkpoints have
    the eager model's keys. Lightning turns a compiled LightningModule back the same way."""
    module = unwrapped(model)
    if module is not model:
        module._compiled_call_impl = model.dynamo_ctx(module._call_impl)
    return module


def graph_breaks(fn, *args, **kwargs) -> list[str]:
    """Where dynamo breaks the graph of `fn(*args, **kwargs)` (a model, or a function calling one):
    one line per break (reason @ file:line), empty when it traces as one graph. It runs once,
    traced, not compiled."""
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(*args, **kwargs)
    torch._dynamo.reset()
    lines = []
    for broken in explained.break_reasons:
        frame = broken.user_stack[-1] if broken.user_stack else None
        where = f" @ {frame.filename}:{frame.lineno}" if frame is not None else ""
        lines.append(str(broken.reason).splitlines()[0] + where)
    return lines


def graphs_compiled() -> int:
    """Graphs dynamo has compiled in this process so far: a run compiles one per mode (training,
    evaluation) and shape family (its first shape, then one graph dynamic in the lengths)."""
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
