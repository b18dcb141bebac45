"""Batch invariance over the whole matrix: every built-in scheme and option in every model family
with the default attention implementation, and every implementation a model can run on one scheme
of each kind (relpos_lab/api/batch_invariance.py says what is compared)."""
from __future__ import annotations

import json

import pytest
import torch

from relpos_lab.api import batch_invariance
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.positions import BUILTIN, builtin_config, position_scheme_of
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder

FAMILIES = {
    "encoder_decoder": (EncoderDecoder, {}),
    "prefix_lm": (PrefixLM, {"architecture": "decoder_only"}),
    "prefix_lm_bidirectional": (PrefixLM, {"architecture": "decoder_only", "bidirectional_prefix": True}),
    "lm": (DecoderLM, {"architecture": "decoder_only"}),
    "encoder_only": (EncoderOnly, {"architecture": "encoder_only"}),
}
RANDOMIZED = dict(max_random_len=24, randomize_at_eval=True)
OPTIONS = {f"{scheme}": (scheme, {}) for scheme in BUILTIN}
OPTIONS["sinusoidal count_from_end"] = ("sinusoidal", {"count_from_end": True})
for scaling in ("linear", "ntk", "yarn"):
    for factor in (0.0, 2.0):
        OPTIONS[f"rope {scaling} scaling x{factor or 'dynamic'}"] = (
            "rope", {"rope_scaling": scaling, "rope_scaling_factor": factor, "rope_train_length": 3})
for scheme, cls in BUILTIN.items():
    if not (cls.contributes_nothing or cls.positions_from_content):
        OPTIONS[f"{scheme} randomized"] = (scheme, RANDOMIZED)
for scheme in ("shaw", "rope", "alibi", "transformer_xl"):
    OPTIONS[f"{scheme} randomized per layer"] = (scheme, {**RANDOMIZED, "redraw_per_layer": True})
for scheme in ("alibi", "transformer_xl"):
    OPTIONS[f"{scheme} random distances"] = (scheme, {**RANDOMIZED, "random_distances": True})
IMPLS = ("naive", "batched", "gather", "flex", "triton", "auto")
IMPL_OPTIONS = ("shaw", "rope yarn scaling xdynamic", "alibi", "t5_bias", "sinusoidal count_from_end",
                "shaw randomized", "rope randomized", "alibi random distances")
"""One option of each kind for the implementations: tables, a width-reading rotation, a bias, a
bucketed bias, absolute positions from the end, randomized positions and distances."""
IMPL_QUICK = ("shaw", "rope yarn scaling xdynamic")


def _model(option: str, family: str, impl: str = "auto"):
    scheme, fields = OPTIONS[option]
    cls, kw = FAMILIES[family]
    try:
        cfg = tiny_model_config(builtin_config(scheme, **fields), attention_impl=impl, **kw)
        cfg.validate()
    except ValueError as err:  # e.g. count_from_end outside encoder_only, a causal-only scheme's encoder
        pytest.skip(f"not a model: {err}")
    if False in cfg.self_attention_causal and not position_scheme_of(cfg.positions).supports_bidirectional:
        pytest.skip(f"{scheme} is causal-only")
    torch.manual_seed(0)
    return cls(cfg)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("option", OPTIONS)
def test_every_option_scores_an_example_as_if_alone(option, family):
    batch_invariance.check(_model(option, family))


def _impl_cases():
    """Every option of IMPL_OPTIONS under every impl in the families that attend differently. Flex
    and Triton's interpreter take 5-15 s a case: by default each runs Shaw's tables and RoPE's
    width-reading rotation, the rest of their table under `-m slow`; greedy and beam search through
    the interpreter launch a kernel per step and layer (minutes for the table): triton's logits run
    by default, its searches under `-m slow`."""
    for option in IMPL_OPTIONS:
        for impl in IMPLS:
            slow = () if impl not in ("flex", "triton") or option in IMPL_QUICK else (pytest.mark.slow,)
            for family in ("encoder_decoder", "prefix_lm", "encoder_only"):
                if impl == "triton" and family != "encoder_only":
                    yield pytest.param(option, impl, family, False, id=f"{option}-{impl}-{family}-logits", marks=slow)
                    yield pytest.param(option, impl, family, True, id=f"{option}-{impl}-{family}-searches",
                                       marks=pytest.mark.slow)
                else:
                    yield pytest.param(option, impl, family, True, id=f"{option}-{impl}-{family}", marks=slow)


@pytest.mark.parametrize(("option", "impl", "family", "searches"), _impl_cases())
def test_every_attention_impl_scores_an_example_as_if_alone(option, impl, family, searches):
    model = _model(option, family, impl)
    try:
        batch_invariance.check(model, searches=searches)
    except ValueError as err:
        if "does not support" in str(err) or "does not take positions" in str(err):
            pytest.skip(f"impl={impl} cannot run this model: {err}")
        raise


def test_a_width_reading_scheme_is_caught_and_named():
    """The check's negative control: RoPE scaling with its per-length evaluation switched off reads
    the padded width, and the check names the first example it moves."""
    model = _model("rope yarn scaling xdynamic", "encoder_decoder")
    for module in model.modules():
        if hasattr(module, "per_length_at_eval"):  # an Embedding: its stack no longer runs per length
            module.reads_width = False
    with pytest.raises(AssertionError, match=r"example 0 \(source 5 tokens, target 4\)"):
        batch_invariance.check(model)


SIN_COS_FROM_THE_END = ("deletang2023_paper_small", "debug", "task.name=cycle_navigation", "trainer.max_steps=40",
                        "trainer.val_every_n_steps=40", "model.positions.scheme=sinusoidal",
                        "model.positions.count_from_end=true", "trainer.eval_dropout=false",
                        "logging.wandb.mode=disabled", "logging.root=runs")


def test_a_run_scores_the_same_under_ddp_and_at_any_evaluation_batch(tmp_path):
    """The papers' sin/cos (counted from each example's end) on cycle navigation: trained and tested
    by two DDP processes (gloo), then its checkpoint evaluated alone at one example a batch and at
    256 padded to a multiple of 16: one test accuracy and loss, whatever cut the batches."""
    from relpos_lab.training.experiment import evaluate

    from installed import run_cli

    out = run_cli(tmp_path, "train", *SIN_COS_FROM_THE_END, "trainer.accelerator=cpu", "trainer.devices=2",
                  "trainer.strategy=ddp")
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = [p for p in (tmp_path / "runs").glob("*/*") if p.is_dir()]
    under_ddp = json.loads((run_dir / "results.json").read_text())["metrics"]
    for i, batching in enumerate((["data.eval_batch_size=1"], ["data.eval_batch_size=256", "data.pad_to_multiple=16"])):
        alone = evaluate(run_dir / "checkpoints" / "last.ckpt", overrides=batching, output=tmp_path / f"eval{i}")
        metrics = json.loads(alone.results.read_text())["metrics"]
        assert metrics["test/accuracy"] == under_ddp["test/accuracy"], batching
        assert metrics["test/loss"] == pytest.approx(under_ddp["test/loss"], rel=1e-5), batching
