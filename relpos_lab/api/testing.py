"""The conformance kit: what relpos_lab's own tests check of the built-in schemes and tasks, for a plugin's.

`check_scheme(name_or_class, **fields)` builds tiny float64 models of every family with the
scheme and checks shapes, finite gradients reaching the scheme's parameters, what decoding does
(below), a few training steps and the inspect drawing. `check_task(name_or_class, **fields)` runs
the Task contract's verbs once each on real data in every family and a few optimizer steps (a task
that refuses a family, e.g. encoder_only without `output_length`, is reported as not supported). Both
return a `Report`: one line per check, so a plugin author sees every failure at once.
`relpos-lab check-scheme` / `check-task` print it (the very same function); in pytest,
`check_scheme("mine").raise_on_failure()`.

The decoding checks are relpos_lab.api.decoding_checks's (its docstring says what each compares).

A scheme that declares `supports_bidirectional = False` (causal-only) is not built into models with
a bidirectional self-attention layer: the checks of the encoder-decoder and encoder-only families and
of `bidirectional_prefix=true` are reported as skipped, one "skip" line each saying why, and the
decoder-only family (causal) is checked in full.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from relpos_lab.api import batch_invariance, registry
from relpos_lab.api.contract import check as check_verb
from relpos_lab.api.decoding_checks import (
    CACHE_TOLERANCE,
    beam_reorder,
    by_source_length,
    cache_equals_full,
    model_logits,
    padded_slots,
    padded_source,
    random_tokens,
)
from relpos_lab.api.errors import UserError
from relpos_lab.api.task import Task
from relpos_lab.core.attention.capture import AttentionProbe, capturing
from relpos_lab.core.compiling import graph_breaks
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.positions.base import Drawing, PositionScheme, position_scheme_of
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.stack import Stack
from relpos_lab.core.transformer import ARCHITECTURES, DecoderLM, EncoderDecoder, ModelConfig, MultiHeadAttention

DRAW_KINDS = ("curves", "matrix", "bars")
BIDIRECTIONAL = "decoder_only, bidirectional_prefix=true"
"""The decoding checks' third family: a prefix LM whose source attends to all of itself."""
FAMILIES = {"encoder_decoder": {"architecture": "encoder_decoder"}, "decoder_only": {"architecture": "decoder_only"},
            BIDIRECTIONAL: {"architecture": "decoder_only", "bidirectional_prefix": True},
            "encoder_only": {"architecture": "encoder_only"}}
DECODED = ("encoder_decoder", "decoder_only")
"""The families that decode (a KV cache, beam search); encoder_only reads its output in one pass."""
MODELS = {"encoder_decoder": EncoderDecoder, "decoder_only": DecoderLM, "encoder_only": EncoderOnly}
"""The model each family's scheme checks build (decoder_only: the plain LM; the prefix LM in its own checks)."""
SLOTS = ("encoder_only: padded sources: each row's slots equal that row alone (float64)",)
PADDED = "cached decoding of a padded batch (key padding) equals the full pass and each row alone (float64)"
BY_LENGTH = ("prefix LM, sources of different lengths: cached decoding per source length equals the padded full pass "
             "(float64)")
REORDERED = ("cached decoding with a beam-search reorder in the middle equals the full pass of the "
             "kept hypotheses (float64)")
DECODING_CHECKS = {"encoder_decoder": (f"encoder_decoder: {PADDED}", f"encoder_decoder: {REORDERED}"),
                   "decoder_only": (f"decoder_only: {BY_LENGTH}", f"decoder_only: prefix LM, {REORDERED}"),
                   BIDIRECTIONAL: (f"{BIDIRECTIONAL}: {BY_LENGTH}", f"{BIDIRECTIONAL}: prefix LM, {REORDERED}")}
"""The decoding checks after the plain one, by family: padding, then beam search's reorder."""
NOT_CHECKED = "not checked: the scheme declares supports_cache=False"
ALONE = ("each example scores as if alone beside longer and shorter ones: logits, greedy and beam output "
         "(batch invariance, evaluation)")
RANDOMIZED = ("randomized positions (max_random_len=24, randomize_at_eval): finite gradients in training, and each "
              "example scores as if alone at evaluation")

STACKS = ("stacks (sweep --stack): two runs as one model under vmap give each its solo loss and gradients "
          "(float64; a warning where it does not)")


class Advice(Exception):
    """A check's finding that is not a failure: the plugin works as it is, and could do better."""


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False  # not run: the scheme declares it does not support what it checks (ok stays True)
    warned: bool = False  # advice, not a failure: it works, slower than it could (ok stays True)


@dataclass
class Report:
    """The checks of one plugin, in the order they ran."""

    subject: str
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def skipped(self) -> list[Check]:
        return [c for c in self.checks if c.skipped]

    def skip(self, name: str, why: str) -> None:
        """Record a check that is not run, and why."""
        self.checks.append(Check(name, True, why, skipped=True))

    def run(self, name: str, fn: Callable[[], str | None]) -> bool:
        """Run one check; an exception or an AssertionError is its failure, the last frame named;
        an `Advice` is a warning."""
        try:
            detail = fn() or ""
            self.checks.append(Check(name, True, detail))
            return True
        except Advice as advice:
            self.checks.append(Check(name, True, str(advice), warned=True))
            return True
        except Exception as err:  # a plugin may raise anything: each is reported, none stops the kit
            where = traceback.extract_tb(err.__traceback__)[-1]
            self.checks.append(Check(name, False, f"{type(err).__name__}: {err} ({where.filename}:{where.lineno})"))
            return False

    def lines(self) -> list[str]:
        return [f"{'skip' if c.skipped else 'warn' if c.warned else 'ok  ' if c.ok else 'FAIL'}  {c.name}"
                + (f": {c.detail}" if c.detail else "")
                for c in self.checks]

    def summary(self) -> str:
        """`N passed, M failed` (and `, K skipped` when the scheme declared some checks not applicable,
        `, W warnings` for advice)."""
        failed, skipped = sum(not c.ok for c in self.checks), len(self.skipped)
        warned = sum(c.warned for c in self.checks)
        return (f"{len(self.checks) - failed - skipped - warned} passed, {failed} failed"
                + (f", {skipped} skipped" if skipped else "") + (f", {warned} warnings" if warned else ""))

    def raise_on_failure(self) -> None:
        if not self.ok:
            raise AssertionError(f"{self.subject}: " + "; ".join(l for l in self.lines() if l.startswith("FAIL")))


# --- position schemes ---------------------------------------------------------------------------


def tiny_model_config(positions, architecture: str = "encoder_decoder", vocab: int = 12, **kw) -> ModelConfig:
    """Two layers of width 16 with two heads, no dropout: small enough to check in float64."""
    cfg = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=16, n_heads=2, d_ff=32, n_encoder_layers=2,
               n_decoder_layers=2, dropout=0.0, attention_dropout=0.0, architecture=architecture, positions=positions)
    return ModelConfig(**{**cfg, **kw})


def check_scheme(scheme: str | type[PositionScheme], **fields) -> Report:
    """Every check of README's "Add a position scheme" on a registered scheme name or a scheme class."""
    cls = registry.get_scheme_class(scheme) if isinstance(scheme, str) else scheme
    report = Report(f"position scheme {getattr(cls.config_class, 'scheme', cls.__name__)!r} ({cls.__module__}."
                    f"{cls.__qualname__})")
    holder: dict = {}

    def config():
        holder["positions"] = cls.config_class(**fields)
        holder["positions"].validate()

    if not report.run("config: its dataclass takes the fields and validates", config):
        return report
    positions = holder["positions"]
    models, unsupported = {}, _unsupported_families(position_scheme_of(positions), positions)

    def build(arch):
        def run():
            torch.manual_seed(0)
            models[arch] = MODELS[arch](tiny_model_config(positions, arch)).double()
        return run

    for arch in ARCHITECTURES:
        if arch in unsupported:
            report.skip(f"{arch}: builds", unsupported[arch])
        else:
            report.run(f"{arch}: builds", build(arch))
    src, tgt = random_tokens(3, 7, seed=1), random_tokens(3, 6, seed=2)
    decodes = position_scheme_of(positions).supports_cache
    for arch in ARCHITECTURES:
        _family_checks(report, arch, positions, models.get(arch), unsupported, src, tgt, decodes)
    if BIDIRECTIONAL in unsupported:
        for name in DECODING_CHECKS[BIDIRECTIONAL]:
            report.skip(name, unsupported[BIDIRECTIONAL])
    else:
        _decoding_checks(report, BIDIRECTIONAL, positions, None, src, tgt, decodes)
    _randomized_check(report, cls, fields, unsupported, src, tgt)
    if models:
        arch = next(iter(models))
        report.run(f"{arch}: torch.compile traces forward and backward as one graph, gradients as eager's "
                   "(a warning where it breaks)", lambda: _compiles(models[arch], arch, src, tgt))
        report.run(f"{arch}: {STACKS}", lambda: _stacks(models[arch], arch, src, tgt))
        report.run("inspect drawing (optional)", lambda: _drawings(models[arch], arch, src, tgt))
    return report


def _family_checks(report: Report, arch: str, positions, model, unsupported: dict, src, tgt, decodes: bool) -> None:
    """One family's checks on its `model` (None: it did not build): gradients, cached decoding
    (the encoder-only model: its padded slots), batch invariance, and training."""
    names = (f"{arch}: output shape, finite gradients reaching the scheme's parameters",
             *((f"{arch}: cached decoding and multi-token prefill equal the full pass (float64)",
                *DECODING_CHECKS[arch]) if arch in DECODED else SLOTS),
             f"{arch}: {ALONE}",
             f"{arch}: 40 training steps lower the loss on one batch")
    if arch in unsupported:
        for name in names:
            report.skip(name, unsupported[arch])
        return
    if model is None:
        return
    report.run(names[0], lambda: _gradients(model, arch, src, tgt))
    if arch in DECODED:
        report.run(names[1], lambda: cache_equals_full(model, arch, src, tgt)
                   if decodes else NOT_CHECKED)
        _decoding_checks(report, arch, positions, model if arch == "encoder_decoder" else None, src, tgt, decodes)
    else:
        report.run(names[1], lambda: padded_slots(model, src, tgt))
    report.run(names[-2], lambda: batch_invariance.check(model))
    report.run(names[-1], lambda: _trains(model, arch, src, tgt))


def _randomized_check(report: Report, cls: type[PositionScheme], fields: dict, unsupported: dict, src, tgt) -> None:
    """The scheme under Ruoss et al.'s randomized positions, in the first family it supports: the
    hooks see the tokens spread over max_random_len slots, and evaluation's draws are per length."""
    if cls.contributes_nothing or cls.positions_from_content:
        report.skip(RANDOMIZED, "not run: the scheme declares " + ("contributes_nothing" if cls.contributes_nothing
                                                                  else "positions_from_content")
                    + ", so randomized positions are refused for it")
        return
    arch = next(a for a in ("encoder_only", "encoder_decoder", "decoder_only") if a not in unsupported)

    def run() -> str:
        positions = cls.config_class(**fields, max_random_len=24, randomize_at_eval=True)
        torch.manual_seed(0)
        model = MODELS[arch](tiny_model_config(positions, arch)).double()
        _gradients(model, arch, src, tgt)
        return batch_invariance.check(model)

    report.run(f"{arch}: {RANDOMIZED}", run)


def _unsupported_families(position_scheme: PositionScheme, positions) -> dict[str, str]:
    """The model families the kit skips for this scheme, each with why: a causal-only scheme
    (supports_bidirectional = False) has no place in a model with bidirectional self-attention."""
    if position_scheme.supports_bidirectional:
        return {}
    why = {"encoder_decoder": "this family's encoder self-attention is bidirectional",
           "encoder_only": "this family's self-attention is bidirectional",
           BIDIRECTIONAL: "bidirectional_prefix=true builds every decoder layer with bidirectional self-attention "
                          "(the source attends to all of itself)"}
    return {family: "not run: the scheme declares supports_bidirectional = False (causal-only), and " + why[family]
            for family, kw in FAMILIES.items()
            if False in tiny_model_config(positions, **kw).self_attention_causal}


def _decoding_checks(report: Report, family: str, positions, model, src, tgt, decodes: bool) -> None:
    """The padded-batch and beam-reorder checks of one family: the encoder-decoder on `model`, a
    decoder-only family on a PrefixLM built here (the model of sequence-to-sequence tasks)."""
    holder = {"model": model}

    def prefix_lm():
        if holder["model"] is None:
            torch.manual_seed(0)
            holder["model"] = PrefixLM(tiny_model_config(positions, **FAMILIES[family])).double()
        return holder["model"]

    padded, reordered = DECODING_CHECKS[family]
    if family == "encoder_decoder":
        report.run(padded, lambda: padded_source(model, src, tgt) if decodes else NOT_CHECKED)
    else:
        report.run(padded, lambda: by_source_length(prefix_lm(), src, tgt) if decodes else NOT_CHECKED)
    report.run(reordered, lambda: beam_reorder(model or prefix_lm(), src, tgt) if decodes else NOT_CHECKED)


def _gradients(model, arch, src, tgt) -> str:
    model.train().zero_grad()
    logits = model_logits(model, arch, src, tgt)
    want = (src.shape[0], tgt.shape[1] if arch != "decoder_only" else src.shape[1] + tgt.shape[1], 12)
    assert tuple(logits.shape) == want, f"logits of shape {tuple(logits.shape)}, expected {want}"
    logits.log_softmax(-1).mean().neg().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {', '.join(bad)}"
    own = {n: p for n, p in model.named_parameters() if ".relative." in f".{n}" or ".absolute." in f".{n}"}
    dead = [n for n, p in own.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, f"the scheme's parameters get no gradient: {', '.join(dead)}"
    return f"{len(own)} scheme parameter tensors" if own else "the scheme has no parameters"


def _trains(model, arch, src, tgt) -> str:
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    target = tgt if arch != "decoder_only" else torch.cat([src, tgt], 1)
    losses = []
    for _ in range(40):
        logits = model_logits(model, arch, src, tgt)[:, :-1]
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses), "the loss became non-finite"
    assert losses[-1] < 0.7 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}: less than 30% lower"
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def _compiles(model, arch, src, tgt) -> str:
    """A graph break is advice (trainer.compile still runs, between graphs); a compiled gradient that
    differs from eager's is a failure (compiled training would learn something else)."""
    def logits():
        return model_logits(model, arch, src, tgt)

    breaks = graph_breaks(logits)
    if breaks:
        raise Advice(f"{len(breaks)} graph break(s), trainer.compile runs the rest eagerly: " + "; ".join(breaks[:3])
                     + " (README's plugin guide: what breaks a graph)")

    def gradients(fn):
        torch.manual_seed(0)  # schemes that draw in training draw the same
        model.train().zero_grad()
        fn().log_softmax(-1).mean().neg().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager = gradients(logits)
    compiled = gradients(torch.compile(logits, backend="aot_eager_decomp_partition", fullgraph=True))
    torch._dynamo.reset()
    missing = sorted(eager.keys() - compiled.keys())
    assert not missing, f"compiled, these parameters get no gradient: {', '.join(missing)}"
    off = {n: float((compiled[n] - g).abs().max() / g.abs().max().clamp_min(1e-3)) for n, g in eager.items()}
    worst = max(off, key=off.get, default=None)
    assert worst is None or off[worst] < 1e-8, f"compiled, {worst}'s gradient is off by {off[worst]:.1e} of its largest"
    return "one graph"


def _stacks(model, arch, src, tgt) -> str:
    """Two members apart (the model, and a copy moved off it), each on its own batch. A scheme that
    does not stack still trains alone: advice, the reason named (`sweep --stack` fails on it)."""
    def loss(m, s, t):
        return model_logits(m, arch, s, t).log_softmax(-1).mean().neg()

    batches = torch.stack([src, src.roll(1, 0)]), torch.stack([tgt, tgt.roll(1, 0)])
    try:
        other = copy.deepcopy(model)
        torch.manual_seed(1)
        with torch.no_grad():
            for p in other.parameters():
                p.add_(torch.randn_like(p), alpha=0.1)
        members = [model.train(), other.train()]
        stack = Stack([copy.deepcopy(m) for m in members])
        losses = stack.apply(loss, *batches)
        grads = stack.flat_grad(losses)
    except Exception as err:  # noqa: BLE001 - whatever vmap (or copying the model) refuses, named for the author
        raise Advice(f"does not stack, sweep --stack cannot train it ({type(err).__name__}: {err}); "
                     "README's plugin guide: what a stack needs") from err
    if not torch.isfinite(grads).all():
        raise AssertionError("stacked, a member's gradient is not finite")
    if _draws_in_training(lambda: loss(members[0], src, tgt)):
        return "runs stacked; its training draws are each member's own, so not compared with a solo run's"
    for k, m in enumerate(members):
        m.zero_grad()
        solo = loss(m, batches[0][k], batches[1][k])
        solo.backward()
        solo_grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                               for p in dict(m.named_parameters()).values()])
        assert torch.allclose(losses[k], solo, rtol=1e-9, atol=1e-12), \
            f"stacked, member {k}'s loss is {losses[k].item():.12g}, alone {solo.item():.12g}"
        off = float((grads[k] - solo_grad).abs().max() / solo_grad.abs().max().clamp_min(1e-3))
        assert off < 1e-8, f"stacked, member {k}'s gradient is off by {off:.1e} of its largest"
    return "each member its solo run"


def _draws_in_training(loss) -> bool:
    """Whether a training pass draws at random (Abacus's offsets, say): two seeds, two losses."""
    with torch.no_grad():
        torch.manual_seed(0)
        first = loss()
        torch.manual_seed(1)
        return not torch.equal(first, loss())


def _drawings(model, arch: str, src, tgt) -> str:
    """`draw` of the first layer's module and, for a content-dependent one, `draw_content` on the
    arguments its content_bias got in a forward pass (as `relpos-lab inspect` calls them)."""
    module = next((m.relative for m in model.modules() if isinstance(m, MultiHeadAttention)
                   and hasattr(m.relative, "draw")), None)
    drawn = module.draw(6) if module is not None else {}
    _check_panels("draw()", drawn)
    content = _content_drawing(model, arch, src, tgt)
    _check_panels("draw_content()", content)
    shown = ", ".join(drawn) + (f"{'; ' if drawn else ''}on a sample batch: {', '.join(content)}" if content else "")
    return shown or "draws nothing"


def _content_drawing(model, arch: str, src, tgt) -> dict:
    layer = next((m for m in model.modules() if isinstance(m, MultiHeadAttention) and m.content), None)
    if layer is None:
        return {}
    probe = AttentionProbe(keep_content=True)
    handle = layer.register_forward_pre_hook(lambda module, args: setattr(probe, "where", "layer"))
    try:
        with capturing(probe), torch.no_grad():
            model_logits(model, arch, src, tgt)
            return layer.relative.draw_content(*probe.content["layer"], 6)
    finally:
        handle.remove()


def _check_panels(hook: str, drawn: dict) -> None:
    for name, panel in drawn.items():
        assert isinstance(panel, Drawing), f"{hook}[{name!r}] is a {type(panel).__name__}, not a Drawing"
        assert panel.kind in DRAW_KINDS, f"{hook}[{name!r}].kind={panel.kind!r}; one of {', '.join(DRAW_KINDS)}"
        for part in ("values", "spread"):
            value = getattr(panel, part, None)
            assert value is None or torch.isfinite(torch.as_tensor(value, dtype=torch.float64)).all(), \
                f"{hook}[{name!r}].{part} not finite"


# --- tasks --------------------------------------------------------------------------------------


def check_task(task: str | type[Task], seed: int = 0, **fields) -> Report:
    """The Task contract's verbs on real data, once each, in every model family, and a few steps."""
    cls = registry.get_task_class(task) if isinstance(task, str) else task
    report = Report(f"task {task if isinstance(task, str) else cls.__name__!r} ({cls.__module__}.{cls.__qualname__})")
    holder: dict = {}

    def create():
        cfg = cls.config_class(**{"name": task if isinstance(task, str) else cls.__name__.lower(), **fields})
        cfg.validate()
        holder["task"] = cls(cfg, seed=seed)
        holder["task"].prepare_data()

    if not report.run("config validates; the task is created and prepares its data", create):
        return report
    t: Task = holder["task"]
    batches = {}

    def split(name):
        def run():
            data = t.dataset(name)
            assert len(data) > 0, f"split {name!r} is empty"
            batches[name] = check_verb(t, "collate", t.collate([data[i] for i in range(min(4, len(data)))]))
            return f"{len(data)} examples"
        return run

    for name in t.splits:
        report.run(f"split {name!r}: examples, and collate gives a batch", split(name))
    if "train" not in batches:
        return report
    for arch in ARCHITECTURES:
        report.run(f"{arch}: build_model, loss, backward and 5 steps, evaluate",
                   lambda arch=arch: _task_steps(t, arch, batches))
    return report


def _task_steps(t: Task, arch: str, batches: dict) -> str:
    torch.manual_seed(0)
    cfg = dataclasses.replace(tiny_model_config(ModelConfig().positions, arch), src_vocab_size=0, tgt_vocab_size=0)
    try:
        model = check_verb(t, "build_model", t.build_model(cfg))
    except UserError as err:  # a task may serve one family only (lm: decoder_only), and says so
        return f"not supported ({err})"
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(5):
        out = check_verb(t, "loss", t.loss(model.train(), batches["train"], 0.1))
        assert torch.isfinite(out.loss), f"loss {out.loss.item()}"
        opt.zero_grad()
        out.loss.backward()
        opt.step()
    evaluated = "valid" if "valid" in batches else "train"
    evaluation = check_verb(t, "build_evaluation", t.build_evaluation(evaluated))
    with torch.no_grad():
        check_verb(t, "evaluate", t.evaluate(model.eval(), batches[evaluated], evaluation))
    metrics = evaluation.compute().metrics
    assert t.main_metric in metrics, f"evaluate gave {', '.join(metrics)}; the main metric {t.main_metric!r} is missing"
    return f"loss {out.loss.item():.3f}; {evaluated} {t.main_metric} {float(metrics[t.main_metric]):.3f}"


__all__ = ["CACHE_TOLERANCE", "Check", "Report", "check_scheme", "check_task", "tiny_model_config"]
