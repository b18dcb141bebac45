"""The conformance kit checks what decoding does: cached decoding equals the full
pass with padded batches (key padding; a prefix LM's rows of different source lengths), across a
beam-search reorder in the middle of decoding, and at `bidirectional_prefix=true`, in float64 to
CACHE_TOLERANCE. It catches a scheme that keeps its per-key state where the cache's reorder cannot
reach it, and one that drops its state; the correct running-sum plugin passes.

The broken schemes are tests/running_sum_scheme.py with one thing changed each, through the
plugin API only; nothing is mocked: the kit runs the real models, caches and reorder.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch.nn.functional as F

from relpos_lab import cli
from relpos_lab.api import KeyState
from relpos_lab.api.testing import CACHE_TOLERANCE, DECODING_CHECKS, RANDOMIZED, check_scheme
from relpos_lab.core.positions.fox import Fox, FoxConfig, FoxPositions

import docs_text
from running_sum_scheme import RunningSum, RunningSumConfig, RunningSumScheme

PLAIN = "decoder_only: cached decoding and multi-token prefill equal the full pass (float64)"
BY_LENGTH, REORDERED = DECODING_CHECKS["decoder_only"]


class ModuleSum(RunningSum):
    """Keeps the running sums on the module instead of in the KeyState: right on a cache that keeps
    its rows (one sentence, one hypothesis), wrong once beam search reorders them."""

    sums = None

    def content_bias(self, q, k, x, query_offset, visible, state):
        scores = self.strength[:, None, None] * F.softplus(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5)
        if visible is not None:
            scores = scores.masked_fill(~visible, 0.0)
        before = self.sums if query_offset and self.sums is not None else scores.new_zeros(scores.shape[:2] + (0,))
        running = F.pad(before, (0, k.shape[-2] - before.shape[-1]))[..., None, :] + scores.cumsum(-2)
        self.sums = running[..., -1, :].detach()
        return -running


class StatelessSum(RunningSum):
    """Ignores its state: every call sums over its own queries only, as if the cache were empty."""

    def content_bias(self, q, k, x, query_offset, visible, state):
        return super().content_bias(q, k, x, query_offset, visible, type(state)())


class ModuleFox(FoxPositions):
    """FoX's cumulative gates, appended per key, but into a KeyState of the module's own (made anew
    at every sequence's first call) instead of the one the cache hands it."""

    kept = None

    def content_bias(self, q, k, x, query_offset, visible, state):
        if not query_offset or self.kept is None:
            self.kept = KeyState()
        return super().content_bias(q, k, x, query_offset, visible, self.kept)


@dataclass
class ModuleFoxConfig(FoxConfig):
    scheme: str = "module_fox"


class ModuleFoxScheme(Fox):
    config_class = ModuleFoxConfig

    def attention(self, head_dim, n_heads, causal):
        return ModuleFox(head_dim * n_heads, n_heads, self.cfg.fox_bias_init)


@dataclass
class ModuleSumConfig(RunningSumConfig):
    scheme: str = "module_sum"


@dataclass
class StatelessSumConfig(RunningSumConfig):
    scheme: str = "stateless_sum"


class ModuleSumScheme(RunningSumScheme):
    config_class = ModuleSumConfig

    def attention(self, head_dim, n_heads, causal):
        super().attention(head_dim, n_heads, causal)  # refuses causal=False
        return ModuleSum(n_heads)


class StatelessSumScheme(RunningSumScheme):
    config_class = StatelessSumConfig

    def attention(self, head_dim, n_heads, causal):
        super().attention(head_dim, n_heads, causal)
        return StatelessSum(n_heads)


def failures(report) -> dict[str, str]:
    return {c.name: c.detail for c in report.checks if not c.ok}


def test_a_scheme_whose_state_the_reorder_cannot_reach_fails_exactly_the_beam_reorder_check():
    report = check_scheme(ModuleSumScheme)
    failed = failures(report)
    assert list(failed) == [REORDERED], report.lines()
    assert "after cache.reorder" in failed[REORDERED] and "KeyState" in failed[REORDERED]
    with pytest.raises(AssertionError, match="FAIL  decoder_only: prefix LM, cached decoding with a beam-search "
                                             "reorder in the middle equals the full pass"):
        report.raise_on_failure()


def test_a_bidirectional_scheme_with_its_own_state_fails_the_beam_reorder_check_of_every_family():
    """Encoder-decoder: the decoder's first step comes after the beam's rows are made, so the state
    has the right shape and the logits after the reorder are wrong; prefix LMs: the prefilled
    source's state has the sentences' rows, not the hypotheses'."""
    report = check_scheme(ModuleFoxScheme)
    failed = failures(report)
    assert list(failed) == [names[1] for names in DECODING_CHECKS.values()], report.lines()
    wrong = failed[DECODING_CHECKS["encoder_decoder"][1]]
    assert "after the reorder, cached logits differ from the full pass by" in wrong and "KeyState" in wrong
    assert all("decoding after cache.reorder raised" in failed[DECODING_CHECKS[family][1]]
               for family in ("decoder_only", "decoder_only, bidirectional_prefix=true"))


def test_a_scheme_that_drops_its_state_fails_every_decoder_only_decoding_check():
    report = check_scheme(StatelessSumScheme)
    failed = failures(report)
    assert list(failed) == [PLAIN, BY_LENGTH, REORDERED], report.lines()
    assert all("differ from the full pass by" in detail for detail in failed.values())
    assert "before the reorder" in failed[REORDERED]  # a lost state shows before any reorder


def test_the_running_sum_plugin_passes_every_decoding_check_it_supports():
    report = check_scheme(RunningSumScheme)
    report.raise_on_failure()
    checks = {c.name: c for c in report.checks}
    for name in (PLAIN, BY_LENGTH, REORDERED):
        assert not checks[name].skipped and "max difference" in checks[name].detail
        assert float(checks[name].detail.rsplit(" ", 1)[1]) <= CACHE_TOLERANCE
    for name in (*DECODING_CHECKS["encoder_decoder"], *DECODING_CHECKS["decoder_only, bidirectional_prefix=true"]):
        assert checks[name].skipped and "supports_bidirectional = False" in checks[name].detail


def test_every_family_has_its_padding_and_reorder_checks_for_a_bidirectional_scheme():
    report = check_scheme("fox")
    report.raise_on_failure()
    names = [c.name for c in report.checks]
    for family, checks in DECODING_CHECKS.items():
        for name in checks:
            assert name in names and name.startswith(f"{family}: ")
    padded = next(c for c in report.checks if c.name == DECODING_CHECKS["encoder_decoder"][0])
    assert "source lengths 7, 3, 7" in padded.detail
    assert [c.name for c in report.skipped] == [RANDOMIZED]  # fox counts its positions from the tokens


def test_the_command_line_runs_the_same_checks_as_the_pytest_helper(capsys):
    assert cli.main(["check-scheme", "cope"]) == 0
    printed = capsys.readouterr().out.splitlines()
    report = check_scheme("cope")
    assert printed[-len(report.checks) - 1:] == [*report.lines(), report.summary()]


def test_the_scheme_guide_states_the_tolerance_and_what_decoding_checks_cover():
    marker = "**Check it as we check ours.** `relpos-lab check-scheme"
    text = docs_text.page_with(marker)
    kit = text[text.index(marker):]
    kit = kit[:kit.index("\n#")]  # up to the next heading
    assert "to 1e-9 in float64" in kit and float("1e-9") == CACHE_TOLERANCE
    for covered in ("key padding", "by_source_length", "beam search", "reorder", "bidirectional_prefix=true"):
        assert covered in kit, covered
