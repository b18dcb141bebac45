"""The conformance kit: what relpos_lab's own tests check of the built-in schemes and tasks, for a plugin's.

`check_scheme(name_or_class, **fields)` builds tiny float64 models of both families with the
scheme and checks shapes, finite gradients reaching the scheme's parameters, cached decoding and
multi-token prefill against the full pass, a few training steps and the inspect drawing.
`check_task(name_or_class, **fields)` runs the Task contract's verbs once each on real data in
both families and a few optimizer steps. Both return a `Report`: one line per check, so a plugin
author sees every failure at once. `relpos-lab check-scheme` / `check-task` print it; in pytest,
`check_scheme("mine").raise_on_failure()`.

A scheme that declares `supports_cache = False` (position coupling: a source digit's place needs
its number's end) has its decoding check reported as not checked; its own tests check the decoding
paths it does support. The decoding check is the one that catches a scheme that places queries at 0..L-1 instead of at
`query_offset` (tests/test_conformance.py keeps such a scheme as the negative control).

A scheme that declares `supports_bidirectional = False` (causal-only) is not built into models with
a bidirectional self-attention layer: the checks of the encoder-decoder family are reported as
skipped, one "skip" line each saying why, and the decoder-only family (causal) is checked in full.
"""
from __future__ import annotations

import dataclasses
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from relpos_lab.api import registry
from relpos_lab.api.contract import check as check_verb
from relpos_lab.api.errors import UserError
from relpos_lab.api.task import Task
from relpos_lab.core.positions.base import Drawing, PositionScheme, scheme_of
from relpos_lab.core.transformer import ARCHITECTURES, DecoderLM, EncoderDecoder, ModelConfig

CACHE_TOLERANCE = 1e-9
"""float64: cached decoding equals the full pass up to rounding, or positions are misplaced."""
DRAW_KINDS = ("curves", "matrix", "bars")


@dataclass
class Check:
    name: str
    ok: bool
    detail: str = ""
    skipped: bool = False  # not run: the scheme declares it does not support what it checks (ok stays True)


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
        """Run one check; an exception or an AssertionError is its failure, the last frame named."""
        try:
            detail = fn() or ""
            self.checks.append(Check(name, True, detail))
            return True
        except Exception as err:  # a plugin may raise anything: each is reported, none stops the kit
            where = traceback.extract_tb(err.__traceback__)[-1]
            self.checks.append(Check(name, False, f"{type(err).__name__}: {err} ({where.filename}:{where.lineno})"))
            return False

    def lines(self) -> list[str]:
        return [f"{'skip' if c.skipped else 'ok  ' if c.ok else 'FAIL'}  {c.name}" + (f": {c.detail}" if c.detail else "")
                for c in self.checks]

    def summary(self) -> str:
        """`N passed, M failed` (and `, K skipped` when the scheme declared some checks not applicable)."""
        failed, skipped = sum(not c.ok for c in self.checks), len(self.skipped)
        return (f"{len(self.checks) - failed - skipped} passed, {failed} failed"
                + (f", {skipped} skipped" if skipped else ""))

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
    models, unsupported = {}, _unsupported_families(scheme_of(positions), positions)

    def build(arch):
        def run():
            torch.manual_seed(0)
            model_cls = EncoderDecoder if arch == "encoder_decoder" else DecoderLM
            models[arch] = model_cls(tiny_model_config(positions, arch)).double()
        return run

    for arch in ARCHITECTURES:
        if arch in unsupported:
            report.skip(f"{arch}: builds", unsupported[arch])
        else:
            report.run(f"{arch}: builds", build(arch))
    src, tgt = _tokens(3, 7, seed=1), _tokens(3, 6, seed=2)
    for arch in ARCHITECTURES:
        names = (f"{arch}: output shape, finite gradients reaching the scheme's parameters",
                 f"{arch}: cached decoding and multi-token prefill equal the full pass (float64)",
                 f"{arch}: 40 training steps lower the loss on one batch")
        if arch in unsupported:
            for name in names:
                report.skip(name, unsupported[arch])
            continue
        if arch not in models:
            continue
        model = models[arch]
        report.run(names[0], lambda model=model, arch=arch: _gradients(model, arch, src, tgt))
        report.run(names[1], lambda model=model, arch=arch: _cache_equals_full(model, arch, src, tgt)
                   if scheme_of(positions).supports_cache else "not checked: the scheme declares supports_cache=False")
        report.run(names[2], lambda model=model, arch=arch: _trains(model, arch, src, tgt))
    if models:
        report.run("inspect drawing (optional)", lambda: _drawings(next(iter(models.values()))))
    return report


def _unsupported_families(scheme: PositionScheme, positions) -> dict[str, str]:
    """The model families the kit skips for this scheme, each with why: a causal-only scheme
    (supports_bidirectional = False) has no place in a model with bidirectional self-attention."""
    if scheme.supports_bidirectional:
        return {}
    return {arch: "not run: the scheme declares supports_bidirectional = False (causal-only), and this family's "
                  "encoder self-attention is bidirectional"
            for arch in ARCHITECTURES if False in tiny_model_config(positions, arch).self_attention_causal}


def _tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 12, (batch, length), generator=torch.Generator().manual_seed(seed))


def _logits(model: nn.Module, arch: str, src, tgt):
    return model(src, tgt) if arch == "encoder_decoder" else model(torch.cat([src, tgt], 1))


def _gradients(model, arch, src, tgt) -> str:
    model.train().zero_grad()
    logits = _logits(model, arch, src, tgt)
    want = (src.shape[0], tgt.shape[1] if arch == "encoder_decoder" else src.shape[1] + tgt.shape[1], 12)
    assert tuple(logits.shape) == want, f"logits of shape {tuple(logits.shape)}, expected {want}"
    logits.log_softmax(-1).mean().neg().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients in {', '.join(bad)}"
    own = {n: p for n, p in model.named_parameters() if ".positions." in f".{n}"}
    dead = [n for n, p in own.items() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, f"the scheme's parameters get no gradient: {', '.join(dead)}"
    return f"{len(own)} scheme parameter tensors" if own else "the scheme has no parameters"


def _cache_equals_full(model, arch, src, tgt) -> str:
    """Decode the target (or the whole sequence) in chunks of 2, 1 and the rest on the cache."""
    model.eval()
    with torch.no_grad():
        full = _logits(model, arch, src, tgt)
        if arch == "encoder_decoder":
            cache, steps, tokens = model.start_decoding(src), [], tgt
        else:
            cache, steps, tokens = model.start_decoding(), [], torch.cat([src, tgt], 1)
        bounds = [0, 2, 3, tokens.shape[1]]
        for a, b in zip(bounds, bounds[1:]):
            steps.append(model.decode_step(tokens[:, a:b], cache))
        cached = torch.cat(steps, 1)
    err = (cached - full).abs().max().item()
    assert err <= CACHE_TOLERANCE, (f"cached logits differ from the full pass by {err:.3g} (> {CACHE_TOLERANCE:g}): "
                                    "do the scheme's hooks place query row r at query_offset + r?")
    return f"max difference {err:.1e}"


def _trains(model, arch, src, tgt) -> str:
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    target = tgt if arch == "encoder_decoder" else torch.cat([src, tgt], 1)
    losses = []
    for _ in range(40):
        logits = _logits(model, arch, src, tgt)[:, :-1]
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), target[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(x) for x in losses), "the loss became non-finite"
    assert losses[-1] < 0.7 * losses[0], f"loss {losses[0]:.3f} -> {losses[-1]:.3f}: less than 30% lower"
    return f"loss {losses[0]:.3f} -> {losses[-1]:.3f}"


def _drawings(model) -> str:
    module = next((m.positions for m in model.modules() if hasattr(m, "positions") and hasattr(m.positions, "draw")),
                  None)
    drawn = module.draw(6) if module is not None else {}
    for name, panel in drawn.items():
        assert isinstance(panel, Drawing), f"draw()[{name!r}] is a {type(panel).__name__}, not a Drawing"
        assert panel.kind in DRAW_KINDS, f"draw()[{name!r}].kind={panel.kind!r}; one of {', '.join(DRAW_KINDS)}"
        assert torch.isfinite(torch.as_tensor(panel.values, dtype=torch.float64)).all(), f"draw()[{name!r}] not finite"
    return ", ".join(drawn) if drawn else "draws nothing"


# --- tasks --------------------------------------------------------------------------------------


def check_task(task: str | type[Task], seed: int = 0, **fields) -> Report:
    """The Task contract's verbs on real data, once each, in both model families, and a few steps."""
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


__all__ = ["Check", "Report", "check_scheme", "check_task", "tiny_model_config"]
