"""The CUDA tier (`pytest -m cuda`, skipped without a GPU): every attention impl against float64,
the fused forms' gradients (FlexAttention's backward, its log-sum-exp term included), masks,
bf16, no host synchronisation, bf16-mixed training through the CLI, cached decoding. The attention
cases are tests/attention_cases.py's LONG.

Tolerances are relative errors ‖x − ref‖ / ‖ref‖ against float64 computed from the same
(rounded) inputs, so they measure the arithmetic alone:
- float32 through cuBLAS (naive, batched, gather): 1e-5;
- float32 through Triton (flex, banded): its float32 dot runs on tf32 (10-bit mantissa,
  unit roundoff 2^-11 ≈ 5e-4 per product, averaged over D and L), so 2e-3;
- bf16 (8-bit mantissa, unit roundoff 2^-9 ≈ 2e-3, and the probabilities are rounded once
  more before P·V): 2e-2 for outputs and gradients.
"""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relpos_lab.core.attention import flex, relative_attention
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import BUILTIN, builtin_config
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig

from tests.attention_cases import CASES, LONG, Case, build, definition, long_padding, names

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

def positions(scheme: str, max_distance: int = 2, **fields):
    """A built-in scheme's config; Shaw takes the clipping distance."""
    return builtin_config(scheme, **({"max_distance": max_distance} if scheme == "shaw" else {}), **fields)



@pytest.fixture(autouse=True, scope="module")
def many_compiled_variants():
    """Many shapes, dtypes and masks compile FlexAttention more often than a training run does:
    keep them all compiled instead of falling back to eager flex after dynamo's default 8."""
    config = torch._dynamo.config
    saved = config.cache_size_limit, config.accumulated_cache_size_limit
    config.cache_size_limit, config.accumulated_cache_size_limit = max(saved[0], 256), max(saved[1], 1024)
    yield
    config.cache_size_limit, config.accumulated_cache_size_limit = saved


CUDA = torch.device("cuda")
IMPLS = ["naive", "batched", "gather", "flex", "banded", "triton", "auto"]
FUSED = ["flex", "banded", "triton"]

def to(x, dtype=None):
    if x is None:
        return None
    if x.dtype == torch.bool:
        return x.to(CUDA)
    return x.to(CUDA, dtype)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    assert torch.isfinite(x).all(), "non-finite values"
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def tolerance(impl, dtype) -> float:
    if dtype == torch.bfloat16:
        return 2e-2
    return 2e-3 if impl in FUSED else 1e-5


def supported(impl, case) -> bool:
    c = CASES[case]
    return not (impl == "banded" and (c.Lq != c.Lk or c.offset))


def leaves(q, k, v, kw):
    return [t for t in (q, k, v, kw["rel_k"], kw["rel_v"]) if t is not None]


def run(impl, q, k, v, kw, dtype, grad_weights=None):
    """Output (and gradients of every input if `grad_weights`) of `impl` on CUDA in `dtype`."""
    ins = [to(t, dtype).requires_grad_(grad_weights is not None) for t in (q, k, v)]
    tables = {n: (to(kw[n], dtype).requires_grad_(grad_weights is not None) if kw[n] is not None else None)
              for n in ("rel_k", "rel_v")}
    args = {**kw, **tables, "attn_mask": to(kw["attn_mask"])}
    out = relative_attention(*ins, impl=impl, **args)
    if grad_weights is None:
        return out, []
    (out.float() * to(grad_weights, torch.float32)).sum().backward()
    return out, [t.grad for t in ins + [tables["rel_k"], tables["rel_v"]] if t is not None]


def reference(q, k, v, kw, dtype, grad_weights=None):
    """float64 on the CPU from the inputs rounded to `dtype`: the definition (tests/attention_cases.py)."""
    ins = [t.to(dtype).double().requires_grad_(grad_weights is not None) for t in leaves(q, k, v, kw)]
    it = iter(ins)
    q64, k64, v64 = next(it), next(it), next(it)
    tables = {n: (next(it) if kw[n] is not None else None) for n in ("rel_k", "rel_v")}
    out = definition(q64, k64, v64, **{**kw, **tables})
    if grad_weights is None:
        return out, []
    (out * grad_weights).sum().backward()
    return out, [t.grad for t in ins]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", names(LONG))
def test_every_impl_matches_float64(case, impl, dtype):
    if not supported(impl, case):
        pytest.skip("banded: self-attention without a query offset only")
    q, k, v, kw = build(CASES[case])
    want, _ = reference(q, k, v, kw, dtype)
    got, _ = run(impl, q, k, v, kw, dtype)
    assert got.dtype == dtype and got.is_cuda
    assert rel_err(got, want) < tolerance(impl, dtype)
    if kw["attn_mask"] is not None:
        assert got[0].abs().max() == 0  # the sentence that sees nothing


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("impl", FUSED + ["gather"])
@pytest.mark.parametrize("case", names(LONG))
def test_gradients_of_every_input_match_float64(case, impl, dtype):
    """The first backward of flex and of banded's FlexAttention tails on a GPU: q, k, v, rel_k and
    rel_v, through the log-sum-exps that carry the value term's bucket masses."""
    if not supported(impl, case):
        pytest.skip("banded: self-attention without a query offset only")
    q, k, v, kw = build(CASES[case], seed=1)
    w = torch.randn(q.shape[:-1] + (v.shape[-1],), generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    _, want = reference(q, k, v, kw, dtype, w)
    _, got = run(impl, q, k, v, kw, dtype, w)
    assert len(got) == len(want)
    for name, g, g_ref in zip(["q", "k", "v", "rel_k", "rel_v"], got, want):
        assert rel_err(g, g_ref) < tolerance(impl, dtype), name


def test_flex_log_sum_exp_is_differentiated_exactly():
    """What `flex` and `banded` differentiate through: FlexAttention's log-sum-exp, on a block-sparse
    tail with padding and rows that see no key (lse −inf, output 0, gradient 0)."""
    g = torch.Generator().manual_seed(3)
    B, H, L, D, K = 2, 2, 300, 64, 16
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    keep = torch.arange(L)[None, :] < torch.tensor([[230], [L]])
    mask = keep[:, None, None, :]
    w_out, w_lse = torch.randn(B, H, L, D, generator=g, dtype=torch.float64), torch.randn(B, H, L, generator=g,
                                                                                         dtype=torch.float64)
    ins = [t.clone().requires_grad_(True) for t in (q, k, v)]
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    allowed = mask & (j <= i - K)
    s = (ins[0] @ ins[1].transpose(-1, -2) / D**0.5).masked_fill(~allowed, float("-inf"))
    lse_ref = torch.logsumexp(s, -1)
    seen = torch.isfinite(lse_ref)
    p = torch.softmax(s.masked_fill(~seen[..., None], 0.0), -1).masked_fill(~allowed, 0.0)
    out_ref = p @ ins[2]
    (out_ref * w_out).sum().add((lse_ref.where(seen, 0.0) * w_lse).sum()).backward()
    want = [t.grad for t in ins]

    cuda_ins = [to(t, torch.float32).requires_grad_(True) for t in (q, k, v)]
    block_mask = flex.flex_block_mask(to(mask), False, L, L, 0, "left", K, CUDA)
    out, lse = flex.flex_attention_lse(*cuda_ins, D**-0.5, block_mask=block_mask)
    assert torch.equal(torch.isfinite(lse).cpu(), seen)
    assert rel_err(lse.where(torch.isfinite(lse), 0.0), lse_ref.where(seen, 0.0)) < 1e-3
    assert rel_err(out, out_ref) < 2e-3
    (out * to(w_out, torch.float32)).sum().add((lse.where(torch.isfinite(lse), 0.0) * to(w_lse, torch.float32)).sum()
                                              ).backward()
    for name, t, g_ref in zip("qkv", cuda_ins, want):
        assert rel_err(t.grad, g_ref) < 2e-3, name


def test_auto_trains_and_infers_with_triton_and_steps_one_token_with_gather(monkeypatch):
    from relpos_lab.core.attention import IMPLEMENTATIONS, Implementation

    calls = []
    for name in ("banded", "gather", "triton"):  # the dispatch calls the table's attend
        real = IMPLEMENTATIONS[name]
        monkeypatch.setitem(IMPLEMENTATIONS, name, Implementation(
            real.unsupported, lambda *a, _real=real.attend, _name=name, **kw: calls.append(_name) or _real(*a, **kw)))
    q, k, v, kw = build(CASES["padding_long"])
    run("auto", q, k, v, kw, torch.bfloat16, torch.randn(q.shape))
    with torch.no_grad():
        run("auto", q, k, v, kw, torch.bfloat16)
        run("auto", q[:, :, -1:], k, v, {**kw, "query_offset": q.shape[-2] - 1}, torch.bfloat16)  # one cached step
    kw["max_distance"], kw["rel_k"], kw["rel_v"] = 0, kw["rel_k"][:1], kw["rel_v"][:1]
    run("auto", q, k, v, kw, torch.bfloat16, torch.randn(q.shape))  # k = 0
    assert calls == ["triton", "triton", "gather", "triton"]


@pytest.mark.parametrize("impl", ["banded", "triton"])
@pytest.mark.parametrize("fresh_mask", [False, True], ids=["same_mask", "new_mask_each_step"])
@pytest.mark.parametrize("causal", [False, True], ids=["bidirectional", "causal"])
def test_fused_training_step_never_synchronises_with_the_host(causal, fresh_mask, impl):
    q, k, v, kw = build(Case("training_step", B=4, H=4, Lq=512, Lk=512, D=64, max_distance=16, causal=causal,
                             padding=long_padding(16)))
    ins = [to(t, torch.bfloat16).requires_grad_(True) for t in leaves(q, k, v, kw)]
    mask = to(kw["attn_mask"])

    def step():
        m = mask.clone() if fresh_mask else mask
        out = relative_attention(*ins[:3], rel_k=ins[3], rel_v=ins[4], max_distance=16, attn_mask=m,
                                 is_causal=causal, impl=impl, dropout_p=0.1 if impl == "triton" else 0.0)
        out.float().square().sum().backward()

    step()  # compiles (and autotunes)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()


def tiny_model(scheme="shaw", **kw) -> EncoderDecoder:
    cfg = dict(src_vocab_size=50, tgt_vocab_size=50, d_model=64, n_heads=2, d_ff=128, n_encoder_layers=2,
               n_decoder_layers=2, dropout=0.0, attention_dropout=0.0,
               positions=positions(scheme, 4))
    cfg.update(kw)
    return EncoderDecoder(ModelConfig(**cfg))


def test_a_model_trains_with_auto_as_with_gather():
    """auto (banded in self-attention, SDPA across) and gather give one loss and one gradient."""
    torch.manual_seed(0)
    src, tgt = torch.randint(3, 50, (4, 40), device=CUDA), torch.randint(3, 50, (4, 31), device=CUDA)
    src[1, 25:] = 0
    grads = {}
    for impl in ("gather", "auto"):
        torch.manual_seed(0)
        model = tiny_model(attention_impl=impl).to(CUDA)
        loss = label_smoothed_loss(model(src, tgt[:, :-1]), tgt[:, 1:]).loss
        loss.backward()
        grads[impl] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert rel_err(grads["auto"][0], grads["gather"][0]) < 1e-4
    assert len(grads["auto"][1]) == len(grads["gather"][1])
    scale = max(g.abs().max().item() for g in grads["gather"][1])
    for g, g_ref in zip(grads["auto"][1], grads["gather"][1]):
        # relative per tensor, but gradients that are zero in exact arithmetic (the key
        # projection's bias: softmax ignores a constant per row) are rounding noise in both
        assert (g - g_ref).norm() <= 5e-3 * g_ref.norm() + 1e-6 * scale


@pytest.mark.parametrize("scheme", tuple(BUILTIN))
def test_cached_decoding_equals_a_full_pass(scheme):
    torch.manual_seed(0)
    model = tiny_model(scheme).to(CUDA).eval()
    src, tgt = torch.randint(3, 50, (3, 23), device=CUDA), torch.randint(3, 50, (3, 19), device=CUDA)
    src[1, 15:] = 0
    with torch.no_grad():
        full = model(src, tgt)
        cache = model.start_decoding(src)
        steps = [model.decode_step(tgt[:, :5], cache)] + [model.decode_step(tgt[:, i:i + 1], cache)
                                                          for i in range(5, 19)]
    assert rel_err(torch.cat(steps, dim=1), full) < 1e-5


# --- bf16-mixed training through the CLI, against float32 -------------------------------------

REVERSE = """
task: {name: reverse, train_lengths: [20, 48], valid_lengths: [20, 48], test_lengths: [20, 48],
       train_size: 512, eval_size_per_length: 2}
model: {d_model: 64, n_heads: 2, d_ff: 128, n_encoder_layers: 2, n_decoder_layers: 2, dropout: 0.0,
        attention_dropout: 0.0, positions: {scheme: shaw, max_distance: 8}}
data: {batch_size: 32, eval_batch_size: 64}
optim: {lr: 0.001, warmup_steps: 10}
trainer: {accelerator: gpu, devices: 1, strategy: auto, max_steps: 12, val_every_n_steps: 12, log_every_n_steps: 1,
          num_sanity_val_steps: 0, enable_progress_bar: false, enable_model_summary: false}
logging: {root: runs, wandb: {mode: disabled}}
"""

TRANSLATION = """
task: {name: translation, corpus: files, data_dir: data/toy, src_lang: en, tgt_lang: xx,
       subword: {vocab_size: 200}, max_tokens: 1200, eval_max_tokens: 2400, length_buckets: [1, 10, 20]}
model: {d_model: 64, n_heads: 2, d_ff: 128, n_encoder_layers: 2, n_decoder_layers: 2, dropout: 0.0,
        attention_dropout: 0.0, positions: {scheme: shaw, max_distance: 4}}
optim: {lr: 0.001, warmup_steps: 10}
trainer: {accelerator: gpu, devices: 1, strategy: auto, max_steps: 12, val_every_n_steps: 12, log_every_n_steps: 1,
          num_sanity_val_steps: 0, enable_progress_bar: false, enable_model_summary: false}
logging: {root: runs, wandb: {mode: disabled}}
"""


def train_losses(root: Path, config: str, precision: str) -> list[float]:
    name = {"32": "fp32", "bf16-mixed": "bf16"}[precision]
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "train", config, f"trainer.precision={precision}",
                          f"name={name}"], cwd=root, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "COLUMNS": "250"})
    assert out.returncode == 0, out.stderr[-4000:]
    (metrics,) = root.glob(f"runs/{name}/*/metrics.csv")
    with open(metrics, newline="") as file:
        rows = [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(file) if r.get("train/loss")]
    return [loss for _, loss in sorted(rows)]


@pytest.mark.parametrize("task", ["reverse", "translation"])
def test_bf16_mixed_training_follows_float32(task, tmp_path):
    config = {"reverse": REVERSE, "translation": TRANSLATION}[task]
    if task == "translation":
        sys.path.insert(0, str(Path(__file__).parent))
        from toy_translation import write_toy_files

        write_toy_files(tmp_path / "data" / "toy")
    (tmp_path / "run.yaml").write_text(config)
    fp32, bf16 = train_losses(tmp_path, "run.yaml", "32"), train_losses(tmp_path, "run.yaml", "bf16-mixed")
    assert len(fp32) == len(bf16) >= 10
    assert all(torch.isfinite(torch.tensor(bf16)))
    assert bf16[-1] < bf16[0]  # it learns
    for a, b in zip(bf16, fp32):
        assert abs(a - b) / abs(b) < 3e-2, (bf16, fp32)


def test_adamw_is_fused_on_cuda():
    from relpos_lab.config import OptimConfig
    from relpos_lab.training.optim import build_optimizer

    opt = build_optimizer([torch.nn.Parameter(torch.zeros(4, device=CUDA))], OptimConfig())
    assert opt.param_groups[0]["fused"] is True


@pytest.mark.parametrize("scheme", ["sinusoidal", "shaw", "alibi"])
def test_compiled_model_gradients_equal_eager_on_cuda(scheme):
    """auto on CUDA: SDPA for sinusoidal, the fused kernel (a node of the graph) for Shaw and ALiBi."""
    from relpos_lab.api.testing import tiny_model_config
    from relpos_lab.core.compiling import compile_model

    torch.manual_seed(0)
    model = EncoderDecoder(tiny_model_config(positions(scheme), d_model=64, n_heads=4)).to(CUDA).train()
    src, tgt = torch.randint(3, 12, (4, 40), device=CUDA), torch.randint(3, 12, (4, 33), device=CUDA)
    src[1, 30:] = 0

    def grads():
        model.zero_grad()
        model(src, tgt).log_softmax(-1).mean().neg().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager = grads()
    compile_model(model, "default")
    compiled = grads()
    assert compiled.keys() == eager.keys()
    for name, want in eager.items():
        err = (compiled[name] - want).norm() / want.norm().clamp_min(1e-3)  # k_proj.bias: 0 but for rounding
        assert err < 2e-3, (name, float(err))  # tf32 in Triton's float32 dots


@pytest.mark.parametrize("architecture", ["encoder_decoder", "decoder_only", "encoder_only"])
@pytest.mark.parametrize("scheme", ["sinusoidal", "shaw", "alibi"])
def test_a_training_step_never_waits_for_the_gpu(scheme, architecture):
    """Forward, loss, backward and fused AdamW under sync_debug_mode("error"): any host read raises."""
    import dataclasses

    from relpos_lab.api import registry
    from relpos_lab.api.testing import tiny_model_config
    from relpos_lab.config import OptimConfig
    from relpos_lab.training.optim import build_optimizer

    cls = registry.get_task_class("reverse")
    task = cls(cls.config_class(name="reverse", train_lengths=[1, 6], valid_lengths=[1, 6], test_lengths=[1, 8],
                                train_size=32, eval_size_per_length=2), seed=0)
    cfg = tiny_model_config(positions(scheme), architecture, vocab=0, dropout=0.1, attention_dropout=0.1)
    model = task.build_model(dataclasses.replace(cfg, src_vocab_size=0, tgt_vocab_size=0)).to(CUDA).train()
    opt = build_optimizer(model.parameters(), OptimConfig())
    batch = {k: v.to(CUDA) for k, v in task.collate(task.dataset("train")[:8]).items()}
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            opt.zero_grad(set_to_none=True)
            task.loss(model, batch, label_smoothing=0.1).loss.backward()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
