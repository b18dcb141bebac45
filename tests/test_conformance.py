"""The conformance kit (relpos_lab.api.testing, `relpos-lab check-scheme` / `check-task`) passes every
built-in plugin and catches what it is for: a scheme that misplaces cached queries, a broken task."""
from __future__ import annotations

import subprocess
import sys
import types
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from relpos_lab.api import PositionConfig, PositionScheme, RelativePositions
from relpos_lab.api.testing import DECODING_CHECKS, RANDOMIZED, STACKS, check_scheme, check_task
from relpos_lab.core.attention.masks import relative_labels
from relpos_lab.core.positions import BUILTIN
from relpos_lab_tasks.synthetic import ReverseTask

import docs_text

KIT_QUICK = ("sinusoidal", "shaw", "rope", "cope", "abacus")
"""One scheme of each kind (absolute, tables, rotation, content-based, token ids) by default: the kit
takes 10-45 s a scheme, and its checks run on every scheme elsewhere in the default tier too
(test_batch_invariance, test_conformance_decoding, test_compile); the rest under `-m slow`."""


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=() if s in KIT_QUICK else (pytest.mark.slow,))
                                    for s in BUILTIN])
def test_every_builtin_scheme_passes_the_kit(scheme):
    report = check_scheme(scheme)
    report.raise_on_failure()
    refused = BUILTIN[scheme].contributes_nothing or BUILTIN[scheme].positions_from_content  # randomized positions
    assert len(report.checks) == 26 and [c.name for c in report.skipped] == ([f"{RANDOMIZED}"] if refused else [])
    compiled, stacked = report.checks[-3:-1]
    assert compiled.name.startswith("encoder_decoder: torch.compile") and compiled.detail == "one graph"
    draws = scheme in ("abacus", "position_coupling")  # random offsets in training: each member its own
    assert stacked.name == f"encoder_decoder: {STACKS}" and stacked.detail == (
        "runs stacked; its training draws are each member's own, so not compared with a solo run's" if draws
        else "each member its solo run")
    drawing = report.checks[-1]
    assert drawing.name == "inspect drawing (optional)"  # a content bias is also drawn on a sample batch
    assert ("on a sample batch: " in drawing.detail) == (scheme in ("cope", "fox", "dape"))


@dataclass
class OffsetBlindConfig(PositionConfig):
    scheme: str = "offset_blind"


class OffsetBlindBias(RelativePositions):
    """The negative control: a learned bias per clipped distance as a dense attn_bias, with the
    queries at 0..Lq-1 whatever query_offset says (right in a full pass, wrong on a cache)."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n_heads, 9))

    def attention_kwargs(self, q, k, query_offset):
        label = relative_labels(q.shape[-2], k.shape[-2], 4, 0, q.device)  # should pass query_offset
        return {"attn_bias": self.bias[:, label]}


class OffsetBlindScheme(PositionScheme):
    config_class = OffsetBlindConfig

    def attention(self, head_dim, n_heads, causal):
        return OffsetBlindBias(n_heads)


def test_a_scheme_that_ignores_query_offset_fails_exactly_the_cached_decoding_checks():
    failed = {c.name: c.detail for c in check_scheme(OffsetBlindScheme).checks if not c.ok}
    plain = [f"{arch}: cached decoding and multi-token prefill equal the full pass (float64)"
             for arch in ("encoder_decoder", "decoder_only")]
    assert sorted(failed) == sorted([*plain, *(name for names in DECODING_CHECKS.values() for name in names)])
    assert all("query_offset + r" in failed[name] for name in plain)
    # the reorder checks say it goes wrong before any reorder, not that the state was lost
    assert all("before the reorder" in failed[name] for names in DECODING_CHECKS.values() for name in names[1:])


def test_fields_reach_the_schemes_config_and_bad_ones_are_reported():
    assert check_scheme("shaw", max_distance=2).ok
    report = check_scheme("shaw", max_distance=-1)
    assert not report.ok and len(report.checks) == 1 and "max_distance" in report.checks[0].detail


def test_a_builtin_task_passes_in_every_family():
    report = check_task("reverse", train_size=64, eval_size_per_length=2)
    report.raise_on_failure()
    assert [c.name.split(":")[0] for c in report.checks[-3:]] == ["encoder_decoder", "decoder_only", "encoder_only"]
    assert "not supported" not in report.checks[-1].detail  # reverse says its output length


class BareLossReverse(ReverseTask):
    """Breaks the contract: `loss` returns a bare tensor instead of a LossOutput."""

    def loss(self, model, batch, label_smoothing):
        return super().loss(model, batch, label_smoothing).loss


def test_a_task_breaking_the_contract_is_named_with_the_verb():
    report = check_task(BareLossReverse, name="reverse", train_size=64, eval_size_per_length=2)
    failures = [c.detail for c in report.checks if not c.ok]
    assert len(failures) == 3 and all("BareLossReverse" in f and "loss" in f and "LossOutput" in f for f in failures)


def test_the_cli_prints_one_line_per_check_and_fails_with_the_kit(capsys):
    from relpos_lab import cli

    assert cli.main(["check-scheme", "shaw", "max_distance=3"]) == 0
    out = capsys.readouterr().out
    assert "ok    decoder_only: cached decoding" in out and "26 passed, 0 failed" in out
    assert cli.main(["check-scheme", "shaw", "max_distance=-2"]) == 1
    assert "FAIL  config" in capsys.readouterr().out
    bad = subprocess.run([sys.executable, "-m", "relpos_lab", "check-task", "reverse", "train_size"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "'train_size' is not FIELD=VALUE" in bad.stderr


def guide_module(name: str):
    """The guides' `# name.py` python block (docs/tasks.md, docs/positions.md) as an importable module
    (not installed)."""
    block = docs_text.block(f"# {name}.py\n")
    assert block.lang == "python", block
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(block.text, f"{block.page}:{name}.py", "exec"), module.__dict__)
    return module


def test_the_guides_plugin_examples_pass_the_kit_as_the_guides_say():
    try:
        guide_module("my_tasks")
        guide_module("my_schemes")
        check_task(sys.modules["my_tasks"].ShiftTask, name="shift", size=64).raise_on_failure()
        check_scheme(sys.modules["my_schemes"].DistanceBiasScheme, max_distance=4).raise_on_failure()
    finally:
        sys.modules.pop("my_tasks", None), sys.modules.pop("my_schemes", None)
