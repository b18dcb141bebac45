"""torch.compile: every built-in scheme traces as one graph in every model family, and the
compiled model's gradients are eager's, for every parameter (none missing).

BACKEND runs dynamo, AOTAutograd (where an in-place autograd Function once lost rel_k's gradient),
inductor's decompositions and its partitioner, without inductor's code generation, which costs
seconds a graph on CPU; the inductor tests below compile for real. Plain `aot_eager` runs the
backward as traced, a view wherever the traced strides allowed one, so every scheme runs under it
too: PoPE's softplus once got a gradient laid out unlike its trace there, and failed.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from relpos_lab.api import PositionConfig, PositionScheme, RelativePositions
from relpos_lab.api.decoding_checks import random_tokens
from relpos_lab.api.testing import check_scheme, tiny_model_config
from relpos_lab.core.compiling import compile_model, graph_breaks, is_compiled, unwrapped
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.positions import BUILTIN, builtin_config, position_scheme_of
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder
from relpos_lab_tasks.synthetic import ReverseTask, SyntheticConfig

BACKEND = "aot_eager_decomp_partition"
FAMILIES = {
    "encoder_decoder": (EncoderDecoder, {}),
    "encoder_only": (EncoderOnly, {"architecture": "encoder_only"}),
    "decoder_only": (PrefixLM, {"architecture": "decoder_only"}),
    "decoder_only_bidirectional_prefix": (PrefixLM, {"architecture": "decoder_only", "bidirectional_prefix": True}),
    "lm": (DecoderLM, {"architecture": "decoder_only"}),
}
EVERY_FAMILY = ("shaw", "rope", "alibi", "t5_bias", "cope", "abacus")
"""Also in a bidirectional prefix and the plain LM: one scheme of each kind (tables, rotation, bias,
content, token ids); every scheme in the three families."""


def _model(scheme: str, family: str, dtype=torch.float64, **model_fields):
    cls, kw = FAMILIES[family]
    cfg = tiny_model_config(builtin_config(scheme), **kw, **model_fields)
    if False in cfg.self_attention_causal and not position_scheme_of(cfg.positions).supports_bidirectional:
        pytest.skip(f"{scheme} is causal-only")
    torch.manual_seed(0)
    return cls(cfg).to(dtype).train()


def _inputs(family: str):
    src, tgt = random_tokens(3, 7, seed=1), random_tokens(3, 6, seed=2)
    if family in ("encoder_decoder", "encoder_only"):
        src[1, 4:] = 0  # key padding
    if family == "lm":
        return (torch.cat([src, tgt], 1),)
    if family == "encoder_only":
        return src, torch.tensor([6, 4, 5]), 6
    return src, tgt


def _gradients(model, call, inputs) -> dict[str, torch.Tensor]:
    """Seeded: abacus and position coupling draw their offsets in training."""
    torch.manual_seed(3)
    model.zero_grad()
    call(*inputs).log_softmax(-1).mean().neg().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_gradients(model, eager, compiled, tolerance):
    assert compiled.keys() == eager.keys(), f"missing compiled: {sorted(eager.keys() - compiled.keys())}"
    for name, want in eager.items():
        scale = max(want.abs().max().item(), 1e-3)  # k_proj's bias: zero but for rounding
        err = (compiled[name] - want).abs().max().item() / scale
        assert err < tolerance, f"{name}: compiled gradient off by {err:.2e} of its largest entry"


CASES = [pytest.param(scheme, family, marks=() if family == "encoder_decoder" or scheme in EVERY_FAMILY
                      else (pytest.mark.slow,))
         for scheme in BUILTIN for family in FAMILIES
         if family in ("encoder_decoder", "encoder_only", "decoder_only") or scheme in EVERY_FAMILY]
"""Every scheme in the encoder-decoder and one of each kind in every family by default; every scheme
in the encoder-only and decoder-only families under `-m slow`."""


@pytest.mark.parametrize(("scheme", "family"), CASES)
def test_every_scheme_traces_as_one_graph_in_every_family(scheme, family):
    """fullgraph=True refuses any break; dynamo alone (backend "eager") decides it, for the forward
    and so for the backward AOTAutograd derives from that one graph."""
    model = _model(scheme, family)
    inputs = _inputs(family)
    _gradients(model, torch.compile(model, backend="eager", fullgraph=True), inputs)
    torch._dynamo.reset()


OTHER_FAMILIES = [family for family in FAMILIES if family != "encoder_decoder"]
GRADIENT_QUICK = ("shaw", "rope", "alibi", "transformer_xl", "cope")
"""A scheme of each kind (tables, rotation, fixed bias, sinusoidal relative terms, content-based) by
default, in every family; the other schemes (10-20 s each, AOTAutograd's decompositions) under `-m slow`."""
GRADIENT_CASES = [pytest.param(scheme, "encoder_decoder", BACKEND,
                               marks=() if scheme in GRADIENT_QUICK else (pytest.mark.slow,)) for scheme in BUILTIN]
GRADIENT_CASES += [pytest.param(scheme, family, BACKEND, marks=() if scheme in GRADIENT_QUICK else (pytest.mark.slow,))
                   for scheme in EVERY_FAMILY for family in OTHER_FAMILIES]
GRADIENT_CASES += [("pope", family, "aot_eager") for family in FAMILIES]  # it failed there in every family
GRADIENT_CASES += [pytest.param(scheme, "encoder_decoder", "aot_eager", marks=pytest.mark.slow)  # ~5 s each
                   for scheme in BUILTIN if scheme != "pope"]


@pytest.mark.parametrize(("scheme", "family", "backend"), GRADIENT_CASES)
def test_compiled_gradients_are_eagers_for_every_parameter(scheme, family, backend):
    model = _model(scheme, family)
    inputs = _inputs(family)
    eager = _gradients(model, model, inputs)
    compiled = _gradients(model, torch.compile(model, backend=backend, fullgraph=True), inputs)
    _assert_same_gradients(model, eager, compiled, 1e-10)
    torch._dynamo.reset()


RANDOMIZED = [pytest.param(scheme, False, marks=() if scheme in ("shaw", "rope") else (pytest.mark.slow,))
              for scheme in BUILTIN if scheme != "none" and not BUILTIN[scheme].positions_from_content]
RANDOMIZED += [pytest.param(scheme, True, marks=() if scheme == "alibi" else (pytest.mark.slow,))  # per-layer draws
               for scheme in ("shaw", "rope", "alibi", "transformer_xl")]
"""Slow but for Shaw's tables and a rotation at random positions and a bias drawn per layer (5-10 s each)."""


@pytest.mark.parametrize(("scheme", "redraw"), RANDOMIZED)
def test_randomized_positions_trace_as_one_graph_with_eagers_gradients(scheme, redraw):
    """Ruoss et al.'s randomized positions: the tokens are spread over max_random_len slots, a
    length known when traced (the drawn positions' last + 1 was read from a tensor: 6-9 breaks)."""
    positions = builtin_config(scheme, max_random_len=64, redraw_per_layer=redraw)
    torch.manual_seed(0)
    model = EncoderOnly(tiny_model_config(positions, architecture="encoder_only")).double().train()
    inputs = _inputs("encoder_only")
    eager = _gradients(model, model, inputs)  # seeded: the same draws compiled
    compiled = _gradients(model, torch.compile(model, backend=BACKEND, fullgraph=True), inputs)
    _assert_same_gradients(model, eager, compiled, 1e-10)
    torch._dynamo.reset()


@pytest.mark.parametrize("scheme", ["alibi", "transformer_xl"])
def test_random_distances_trace_as_one_graph_with_eagers_gradients(scheme):
    positions = builtin_config(scheme, max_random_len=64, random_distances=True)
    torch.manual_seed(0)
    model = EncoderOnly(tiny_model_config(positions, architecture="encoder_only")).double().train()
    inputs = _inputs("encoder_only")
    eager = _gradients(model, model, inputs)
    compiled = _gradients(model, torch.compile(model, backend=BACKEND, fullgraph=True), inputs)
    _assert_same_gradients(model, eager, compiled, 1e-10)
    torch._dynamo.reset()


@pytest.mark.parametrize("impl", [*(pytest.param(i, marks=pytest.mark.slow) for i in ("naive", "batched")), "gather"])
@pytest.mark.parametrize("scheme", ["shaw", "alibi"])
def test_each_cpu_attention_impl_compiles_as_one_graph(scheme, impl):
    model = _model(scheme, "encoder_decoder", attention_impl=impl)
    inputs = _inputs("encoder_decoder")
    eager = _gradients(model, model, inputs)
    compiled = _gradients(model, torch.compile(model, backend=BACKEND, fullgraph=True), inputs)
    _assert_same_gradients(model, eager, compiled, 1e-10)
    torch._dynamo.reset()


def test_graph_breaks_names_where_a_scheme_leaves_the_graph():
    model = _model("shaw", "encoder_only")
    src, n_slots, width = _inputs("encoder_only")
    assert graph_breaks(model, src, n_slots, width) == []
    breaks = graph_breaks(model, src, n_slots)  # the slot count read from a tensor
    assert len(breaks) == 1 and "encoder_only.py" in breaks[0], breaks


def test_compiled_in_place_keeps_class_state_dict_and_eager_decoding():
    model = _model("shaw", "encoder_decoder")
    keys = list(model.state_dict())
    assert compile_model(model, "none") is model and not is_compiled(model)
    assert compile_model(model, "default") is model and is_compiled(model)
    assert isinstance(model, EncoderDecoder) and list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="choose one of none, default, reduce-overhead, max-autotune"):
        compile_model(model, "fast")


def _reverse_task(cls=ReverseTask):
    return cls(SyntheticConfig(name="reverse", train_size=8, eval_size_per_length=2), seed=0)


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only", "encoder_only"])
def test_a_torch_compile_wrapper_is_the_same_model_to_the_task_and_its_checkpoint(architecture):
    """The nanoGPT habit, `model = torch.compile(model)`, gives a wrapper of another class whose
    state_dict keys start with `_orig_mod.`: the task's loss, greedy decoding and evaluation look
    through it (once, the encoder-only loss took the encoder-decoder's branch and failed in dynamo),
    and the weights to save are the module's (`unwrapped`), which an eager model loads."""
    task = _reverse_task()
    cfg = tiny_model_config(builtin_config("shaw"), architecture, vocab=len(task.tgt_vocab))
    torch.manual_seed(0)
    model = task.build_model(cfg)
    compiled = torch.compile(model, backend="aot_eager")
    batch = task.collate(task.dataset("valid")[:4])
    torch.testing.assert_close(task.loss(compiled, batch, 0.1).loss, task.loss(model, batch, 0.1).loss)
    evaluations = task.build_evaluation("valid"), task.build_evaluation("valid")
    with torch.no_grad():
        assert torch.equal(task.evaluate(compiled.eval(), batch, evaluations[0]),
                           task.evaluate(model, batch, evaluations[1]))  # greedy (beam_size 1) or the slots
    assert evaluations[0].compute().metrics == evaluations[1].compute().metrics
    assert all(key.startswith("_orig_mod.") for key in compiled.state_dict())
    eager = task.build_model(cfg)
    eager.load_state_dict(unwrapped(compiled).state_dict())
    assert all(torch.equal(eager.state_dict()[k], v) for k, v in model.state_dict().items())
    torch._dynamo.reset()


def test_inspect_looks_through_a_torch_compile_wrapper(tmp_path, monkeypatch):
    """The probes find attention layers by name, which the wrapper prefixes with `_orig_mod.`.
    The numbers (inspect.json) are compared; the figures drawn from them are left out (seconds)."""
    from relpos_lab.config import load_config
    from relpos_lab.training import inspect as inspection

    monkeypatch.setattr(inspection, "attention_figures", lambda *args: [])
    task = _reverse_task()
    cfg = load_config("reverse_shaw", ["debug"])
    torch.manual_seed(0)
    model = task.build_model(tiny_model_config(builtin_config("shaw"), vocab=len(task.tgt_vocab)))
    inspection.inspect_model(torch.compile(model, backend="aot_eager"), task, cfg, tmp_path / "compiled", lengths=[3])
    inspection.inspect_model(model, task, cfg, tmp_path / "eager", lengths=[3], run_name="compiled")
    compiled, eager = (json.loads((tmp_path / name / "inspect.json").read_text()) for name in ("compiled", "eager"))
    assert compiled == eager
    torch._dynamo.reset()


class CompilingReverseTask(ReverseTask):
    """A task whose model comes compiled, as `model = torch.compile(model)` in build_model."""

    def build_model(self, cfg):
        return torch.compile(super().build_model(cfg), backend=self.backend)


def test_a_training_module_holds_a_compiled_model_in_place_and_saves_its_eager_keys():
    from relpos_lab.config import load_config
    from relpos_lab.training.module import RelposModule

    cfg = load_config("reverse_shaw", ["debug"])
    counter = torch._dynamo.testing.CompileCounter()
    task = _reverse_task(CompilingReverseTask)
    task.backend = counter
    module = RelposModule(cfg, task)
    assert isinstance(module.model, EncoderDecoder) and is_compiled(module.model)
    eager = RelposModule(cfg, _reverse_task())
    assert list(module.state_dict()) == list(eager.state_dict())
    eager.load_state_dict(module.state_dict())
    batch = task.collate(task.dataset("train")[:4])
    task.loss(module.model, batch, 0.1)
    assert counter.frame_count == 1  # the wrapper's backend, called in place
    torch._dynamo.reset()


@pytest.mark.slow  # inductor's C++ compiles: 20-80 s each on 2 cores; the graphs above are inductor's input
@pytest.mark.parametrize("scheme", ["shaw", "alibi", "abacus"])
def test_inductor_gradients_equal_eager(scheme):
    """Inductor's generated code, float32, dropout off: every parameter's gradient, rel_k's included."""
    model = _model(scheme, "encoder_decoder", dtype=torch.float32)
    inputs = _inputs("encoder_decoder")
    eager = _gradients(model, model, inputs)
    with torch._inductor.config.patch(fallback_random=True):  # abacus's offset drawn as eager draws it
        compiled = _gradients(model, torch.compile(model, fullgraph=True), inputs)
    _assert_same_gradients(model, eager, compiled, 1e-4)
    torch._dynamo.reset()


@pytest.mark.slow  # inductor's C++ compile
def test_inductor_trains_shaw_with_attention_dropout():
    """Compiled Shaw once failed in its first backward with dropout on (an expand of 2k+1 labels)."""
    model = _model("shaw", "encoder_decoder", dtype=torch.float32, dropout=0.1, attention_dropout=0.1)
    compiled = torch.compile(model, fullgraph=True)
    grads = _gradients(model, compiled, _inputs("encoder_decoder"))
    rel_k = [g for n, g in grads.items() if n.endswith("rel_k")]
    assert rel_k and all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in rel_k)
    torch._dynamo.reset()


@dataclass
class HostReadConfig(PositionConfig):
    scheme: str = "host_read"


class HostReadBias(RelativePositions):
    """A learned bias per clipped distance that reads its own size on the host: a graph break."""

    def __init__(self, n_heads: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(n_heads, 9))

    def attention_kwargs(self, q, k, query_offset):
        bias = self.bias if float(self.bias.detach().abs().max()) < 1e6 else self.bias.clamp(-1e6, 1e6)
        return {"rel_bias": bias, "max_distance": 4}


class HostReadScheme(PositionScheme):
    config_class = HostReadConfig

    def attention(self, head_dim, n_heads, causal):
        return HostReadBias(n_heads)


def test_check_scheme_warns_where_a_plugin_breaks_the_graph_and_cannot_stack():
    """A host read breaks a graph and is refused under vmap: two warnings, no failure (it trains alone)."""
    report = check_scheme(HostReadScheme)
    assert report.ok, report.lines()
    compiled, stacked = [c for c in report.checks if c.warned]
    assert "torch.compile" in compiled.name and "graph break" in compiled.detail
    assert "test_compile.py" in compiled.detail
    assert "stacks" in stacked.name and "does not stack" in stacked.detail and ".item()" in stacked.detail
    assert report.summary().endswith(", 2 warnings") and any(line.startswith("warn  ") for line in report.lines())
