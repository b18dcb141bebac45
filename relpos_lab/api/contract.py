"""The Task contract, enforced on first use: what each verb of task.py must return.

A task plugin that returns the wrong thing (a bare loss tensor from `loss`, a list from `collate`)
would otherwise fail several frames deep inside Lightning or the metrics with a message that names
neither the task nor the verb. The framework (training/) checks each verb's first result with
`check` — `Checked` wraps a verb that runs every step, so only its first call pays — and every
error is one ContractError line (a TypeError) naming the task's class, the verb, what it returned
and what the contract expects.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from relpos_lab.api.task import Task
from relpos_lab.core.errors import ContractError


def _model(out: Any) -> str | None:
    return None if isinstance(out, nn.Module) else "an nn.Module (the model to train)"


def _evaluation(out: Any) -> str | None:
    if isinstance(out, nn.Module) and all(callable(getattr(out, m, None)) for m in ("compute", "reset")):
        return None
    return "an Evaluation (relpos_lab.api), or an nn.Module with compute() -> EvalResult and reset()"


def _batch(out: Any) -> str | None:
    if isinstance(out, dict) and all(isinstance(key, str) for key in out) and any(
            isinstance(value, Tensor) and value.dim() >= 1 for value in out.values()):
        return None
    return "a Batch: a dict of str -> tensor, at least one tensor with the batch as its first dimension"


def _loss(out: Any) -> str | None:
    parts = [getattr(out, name, None) for name in ("loss", "nll_sum", "n_tokens")]
    if all(isinstance(p, Tensor) and p.numel() == 1 for p in parts) and parts[0].is_floating_point():
        return None
    return ("a LossOutput(loss, nll_sum, n_tokens) of one-element tensors (relpos_lab.api.LossOutput, "
            "as label_smoothed_loss returns)")


def _predictions(out: Any) -> str | None:
    return None if out is None or isinstance(out, Tensor) else "a Tensor of predictions (for sample_rows) or None"


EXPECTED: dict[str, Callable[[Any], str | None]] = {
    "build_model": _model, "build_evaluation": _evaluation, "collate": _batch, "loss": _loss,
    "evaluate": _predictions,
}
"""Per verb: None if its result keeps the contract, else what the contract expects."""


def check(task: Task, verb: str, out: Any) -> Any:
    """`out`, if it is what `task.<verb>` must return; a one-line ContractError otherwise."""
    expected = EXPECTED[verb](out)
    if expected is not None:
        cls = type(task)
        name = getattr(task.cfg, "name", "?")
        raise ContractError(f"task '{name}' ({cls.__module__}.{cls.__qualname__}): {cls.__qualname__}.{verb}() "
                            f"returned {_describe(out)}; expected {expected}")
    return out


class Checked:
    """`task.<verb>` whose first result is checked, then called as it is (a class rather than a
    closure: data-loader workers pickle it)."""

    def __init__(self, task: Task, verb: str):
        self.task, self.verb, self.unchecked = task, verb, True

    def __call__(self, *args: Any) -> Any:
        out = getattr(self.task, self.verb)(*args)
        if self.unchecked:
            check(self.task, self.verb, out)
            self.unchecked = False
        return out


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"a Tensor of shape {tuple(value.shape)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(map(str, value))}"
    return "None" if value is None else f"a {type(value).__qualname__}"
