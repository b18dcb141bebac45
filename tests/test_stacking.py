"""Runs stacked into one model (relpos_lab/core/stack.py, training/stacking.py): every built-in scheme and option
in every model family stacks, and a member trains exactly as its solo run does."""
from __future__ import annotations

import copy

import pytest
import torch

from relpos_lab.analysis import ops
from relpos_lab.api import batch_invariance
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.config import OptimConfig
from relpos_lab.core.compiling import graph_breaks
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.model_config import ModelConfig
from relpos_lab.core.positions import BUILTIN, builtin_config
from relpos_lab.core.stack import Stack
from relpos_lab.training.optim import build_optimizer
from relpos_lab.training.stacking import StackedAdamW

from test_batch_invariance import FAMILIES, OPTIONS, _model

K = 3


@pytest.fixture(autouse=True)
def _float64():
    """In float64, so that the comparisons see the stack's arithmetic, not rounding: in float32 the
    batched matmuls add in another order, and Adam scales a gradient that is rounding noise (a
    direction the loss does not depend on) up to a full step either way."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)
RANDOM = {"randomized", "random distances", "abacus", "position_coupling"}
"""Options that draw at random in training (randomized positions, Abacus's and position coupling's
offsets): a member draws its own, not its solo run's, so those are checked to run, not to match."""


def _members(option: str, family: str, build=_model) -> list[torch.nn.Module]:
    members = []
    for seed in range(K):
        model = build(option, family)
        torch.manual_seed(seed)
        with torch.no_grad():  # members apart from each other, and every parameter off its init
            for p in model.parameters():
                p.normal_(0, 0.3)
        members.append(model.train())
    return members


def _batches():
    """Each member its own examples: the four of the batch-invariance check, rotated."""
    src, tgt = batch_invariance.examples(12)
    return torch.stack([src.roll(k, 0) for k in range(K)]), torch.stack([tgt.roll(k, 0) for k in range(K)])


def _loss(model, src, tgt):
    return label_smoothed_loss(batch_invariance.logits(model, src, tgt[:, :-1]), tgt[:, 1:]).loss


def _option_cases():
    """Every option in the papers' family (encoder-only) and one scheme of each kind in every family
    by default; the rest of the matrix under `-m slow`."""
    everywhere = ("shaw", "rope yarn scaling xdynamic", "alibi randomized", "t5_bias", "transformer_xl")
    for option in OPTIONS:
        for family in FAMILIES:
            marks = () if family == "encoder_only" or option in everywhere else (pytest.mark.slow,)
            yield pytest.param(option, family, marks=marks, id=f"{option}-{family}")


@pytest.mark.parametrize(("option", "family"), _option_cases())
def test_every_option_stacks_and_a_member_computes_its_solo_loss_and_gradient(option, family):
    members = _members(option, family)
    stack = Stack([copy.deepcopy(m) for m in members])
    src, tgt = _batches()
    losses = stack.apply(_loss, src, tgt)
    grad = stack.flat_grad(losses)
    assert losses.shape == (K,) and torch.isfinite(grad).all()
    if any(word in option for word in RANDOM):
        return
    for k, model in enumerate(members):
        solo = _loss(model, src[k], tgt[k])
        solo.backward()
        solo_grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                               for p in dict(model.named_parameters()).values()])
        torch.testing.assert_close(losses[k], solo, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad[k], solo_grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_member_trains_as_its_solo_run_with_its_own_rate_and_clipping(family):
    """Five steps of AdamW with clipping and a warm-up: each member's parameters are its solo run's
    (torch.optim.AdamW and clip_grad_norm_), at its own peak rate and clipping norm. Without the
    projections' biases (as the papers' models): a key bias has no gradient but rounding noise,
    which Adam would scale up to a step of the full rate in a direction rounding picks."""
    def build(option, family):
        cls, kw = FAMILIES[family]
        return cls(tiny_model_config(builtin_config("shaw", max_distance=2), attention_bias=False, **kw))

    members = _members("shaw", family, build)
    rates, norms = [1e-2, 3e-3, 5e-2], [0.5, 0.0, 1.0]
    stack = Stack([copy.deepcopy(m) for m in members])
    optimizer = StackedAdamW(stack, lr=rates, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.01, max_grad_norm=norms)
    src, tgt = _batches()
    schedule = [0.2, 0.4, 0.6, 0.8, 1.0]
    for factor in schedule:
        losses = stack.apply(_loss, src, tgt)
        optimizer.step(stack.flat_grad(losses), factor, losses)
    for k, model in enumerate(members):
        opt = build_optimizer(model.parameters(), OptimConfig(lr=rates[k], betas=(0.9, 0.98), eps=1e-9,
                                                              weight_decay=0.01))
        for factor in schedule:
            for group in opt.param_groups:
                group["lr"] = rates[k] * factor
            opt.zero_grad()
            _loss(model, src[k], tgt[k]).backward()
            if norms[k]:
                torch.nn.utils.clip_grad_norm_(model.parameters(), norms[k])
            opt.step()
        for name, value in stack.member_state_dict(k).items():
            torch.testing.assert_close(value, model.state_dict()[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_member_that_diverges_stops_alone():
    members = _members("sinusoidal", "encoder_only")
    stack = Stack(members)
    optimizer = StackedAdamW(stack, lr=1e-2)
    src, tgt = _batches()
    before = stack.flat.clone()
    losses = stack.apply(_loss, src, tgt)
    grad = stack.flat_grad(losses)
    grad[1, 0] = float("nan")
    optimizer.step(grad, 1.0, losses)
    assert optimizer.active.tolist() == [True, False, True]
    assert torch.equal(stack.flat[1], before[1])
    assert not torch.equal(stack.flat[0], before[0]) and torch.isfinite(stack.flat).all()
    optimizer.step(stack.flat_grad(stack.apply(_loss, src, tgt)), 1.0)  # it stays stopped, the others train on
    assert torch.equal(stack.flat[1], before[1]) and optimizer.active.tolist() == [True, False, True]
    assert optimizer.stopped_at.tolist() == [-1, 0, -1]  # stopped before its first update


def test_a_member_comes_out_as_an_ordinary_model():
    members = _members("shaw", "encoder_decoder")
    stack = Stack(members)
    src, tgt = _batches()
    member = stack.member(2).eval()
    assert type(member) is type(members[2])
    torch.testing.assert_close(_loss(member, src[2], tgt[2]), _loss(members[2].eval(), src[2], tgt[2]))


def test_models_of_different_shapes_do_not_stack():
    with pytest.raises(ValueError, match="only runs of one model shape stack"):
        Stack([_model("shaw", "encoder_only"), _model("rope", "encoder_only")])


def test_the_option_table_covers_every_builtin_scheme():
    assert set(BUILTIN) <= set(OPTIONS)


def _paper_model(scheme: str, seed: int) -> torch.nn.Module:
    """Delétang et al.'s model (deletang2023_paper.yaml): 5 encoder layers of width 64, dropout 0.1."""
    torch.manual_seed(seed)
    cfg = ModelConfig(src_vocab_size=5, tgt_vocab_size=5, d_model=64, n_heads=8, d_ff=256, n_encoder_layers=5,
                      dropout=0.1, attention_dropout=0.0, attention_bias=False, output_bias=True,
                      positions=builtin_config(scheme), architecture="encoder_only", init="haiku")
    return EncoderOnly(cfg).train()


@pytest.mark.parametrize("scheme", [pytest.param(s, marks=() if s in ("sinusoidal", "shaw") else (pytest.mark.slow,))
                                    for s in BUILTIN])
def test_a_stack_of_32_dispatches_at_most_a_25th_of_the_ops_per_run(scheme):
    """What a GPU pays in host time per run-step, counted: a stack of 32 runs of the papers' model
    dispatches at most 1/25 of a solo step's ops (forward, backward, clipping, AdamW) per run."""
    runs = 32
    models = [_paper_model(scheme, seed) for seed in range(runs)]
    src, tgt = torch.randint(1, 5, (runs, 4, 10)), torch.randint(1, 5, (runs, 4, 10))
    solo = ops.count_ops(ops.solo_step(models[0], lambda m: ops.encoder_only_loss(m, src[0], tgt[0]))).total
    stacked = ops.count_ops(ops.stacked_step(models, ops.encoder_only_loss, (src, tgt))).total
    assert stacked / runs <= solo / 25, f"{scheme}: {stacked / runs:.1f} ops per run-step stacked, {solo} solo"


COMPILED_QUICK = ("shaw", "alibi randomized")
"""A table scheme and a randomized bias by default; every option under `-m slow` (dynamo traces each, ~5 s)."""


@pytest.mark.parametrize("option", [pytest.param(o, marks=() if o in COMPILED_QUICK else (pytest.mark.slow,))
                                    for o in OPTIONS])
def test_a_stacked_step_traces_as_one_graph_for_the_forward_and_one_for_the_update(option):
    """What `trainer.compile` compiles of a stack (training/stacked.py): its forward with the loss,
    and StackedAdamW's update, each one graph (no break), in the papers' family."""
    members = _members(option, "encoder_only")
    stack = Stack(members)
    optimizer = StackedAdamW(stack, lr=[1e-2, 3e-3, 5e-2], max_grad_norm=1.0)
    src, tgt = _batches()
    assert graph_breaks(lambda s, t: stack.apply(_loss, s, t), src, tgt) == []
    losses = stack.apply(_loss, src, tgt)
    assert graph_breaks(optimizer.step, stack.flat_grad(losses), torch.full((K,), 0.5), losses.detach()) == []
