"""`relpos-lab bench`: speed and memory measured side by side in one run.

Every claim about performance comes from here: candidates are interleaved (each repeat runs all of
them in turn, after warm-up), times are medians, and ratios are taken against a baseline measured
in the same run. Peak memory on CPU is the growth of the process's peak RSS while running one
candidate in a fresh subprocess (the only honest CPU peak); on CUDA it is max_memory_allocated.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from relpos_lab.analysis.candidates import MASKS, attention_candidate, peak_in_subprocess, peak_memory_mb
from relpos_lab.analysis.throughput import PEAK_BF16, mfu, peak_flops, step_flops
from relpos_lab.config import OptimConfig
from relpos_lab.core.compiling import MODES as COMPILE_MODES, compile_model
from relpos_lab.core.decoding import greedy_search, sample
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import builtin_config, position_scheme_of
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig, MultiHeadAttention
from relpos_lab.training.optim import build_optimizer
from relpos_lab.training.threads import use_cpu_threads

if TYPE_CHECKING:  # a type name only: rich loads when the table is printed
    from rich.table import Table


@dataclass
class Result:
    name: str
    shape: dict
    median_ms: float
    times_ms: list[float]
    peak_mb: float | None = None
    ratio: float | None = None  # median time / baseline's median time
    extra: dict = field(default_factory=dict)


def _positions(scheme: str, max_distance: int):
    return builtin_config(scheme, **({"max_distance": max_distance} if scheme == "shaw" else {}))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def interleaved(fns: dict, repeats: int, warmup: int, device,
                host: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Run every candidate once per round so drift (thermal, other load) hits all of them alike.
    On CUDA each call is timed with device events (the GPU's own clock, no launch-queue gaps);
    `host` collects the host's time to issue each call (on a CPU, the call's time)."""
    for name, fn in list(fns.items()):  # a candidate that cannot run here is reported, not fatal
        try:
            for _ in range(warmup):
                fn()
            _sync(device)
        except Exception as err:  # noqa: BLE001 - e.g. a kernel the device has no resources for
            print(f"bench: {name} failed and is left out: {type(err).__name__}: {str(err).splitlines()[0][:300]}",
                  file=sys.stderr)
            del fns[name]
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if device.type == "cuda":
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                issued = time.perf_counter()
                fn()
                issued = time.perf_counter() - issued
                end.record()
                end.synchronize()
                times[name].append(start.elapsed_time(end))
                if host is not None:
                    host.setdefault(name, []).append(issued * 1e3)
                continue
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
            if host is not None:
                host.setdefault(name, []).append(times[name][-1])
    return times


# --- attention ---------------------------------------------------------------------------------

def bench_attention(args, device, dtype) -> list[Result]:
    base_name = args.baseline
    names = list(dict.fromkeys([base_name, *args.candidates] + [f"shaw-{impl}" for impl in args.impl]))
    results = []
    for length in args.length:
        batch = max(1, args.tokens // length) if args.tokens else args.batch
        shape = dict(batch=batch, heads=args.heads, length=length, head_dim=args.head_dim, k=args.max_distance,
                     mask=args.mask)
        fns = {n: attention_candidate(n, batch, args.heads, length, args.head_dim, args.max_distance,
                                      dtype, device, backward=not args.forward_only, mask=args.mask) for n in names}
        times = interleaved(fns, args.repeats, args.warmup, device)
        base = statistics.median(times[base_name])
        for n in times:
            med = statistics.median(times[n])
            peak = None
            if args.memory:
                peak = peak_memory_mb(n, batch, args.heads, length, args.head_dim, args.max_distance,
                                      dtype, device, torch.get_num_threads(), args.mask)
            results.append(Result(n, shape, med, times[n], peak, med / base))
        del fns
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


# --- one self-attention module ------------------------------------------------------------------

def bench_layer(args, device, dtype) -> list[Result]:
    results = []
    for length in args.length:
        shape = dict(batch=args.batch, length=length, d_model=args.d_model, heads=args.heads, k=args.max_distance)
        fns = {}
        for scheme in ("none", "shaw"):
            cfg = ModelConfig(d_model=args.d_model, n_heads=args.heads, attention_dropout=0.0,
                              positions=_positions(scheme, args.max_distance))
            rel = position_scheme_of(cfg.positions).attention(cfg.head_dim, cfg.n_heads, causal=False)
            module = MultiHeadAttention(cfg, rel).to(device=device, dtype=dtype)
            x = torch.randn(args.batch, length, args.d_model, device=device, dtype=dtype, requires_grad=True)

            def run(module=module, x=x):
                module(x).sum().backward()
                module.zero_grad(set_to_none=True)
                x.grad = None
            fns[f"layer-{scheme}"] = run
        if args.opennmt:
            module = opennmt_attention(args.opennmt, args.heads, args.d_model, args.max_distance).to(device, dtype)
            x = torch.randn(args.batch, length, args.d_model, device=device, dtype=dtype, requires_grad=True)

            def run_peer(module=module, x=x):
                module(x, x, x, mask=None)[0].sum().backward()
                module.zero_grad(set_to_none=True)
                x.grad = None
            fns["layer-opennmt"] = run_peer
        times = interleaved(fns, args.repeats, args.warmup, device)
        base = statistics.median(times["layer-none"])
        for n, t in times.items():
            extra = {}
            if n == "layer-shaw" and "layer-opennmt" in times:
                extra["speedup_over_opennmt"] = statistics.median(times["layer-opennmt"]) / statistics.median(t)
            results.append(Result(n, shape, statistics.median(t), t, None, statistics.median(t) / base, extra))
    return results


def opennmt_attention(path: str, heads: int, d_model: int, max_distance: int) -> torch.nn.Module:
    """OpenNMT-py's MultiHeadedAttention with Shaw positions, as an optional benchmark peer.

    `path` holds an unpacked OpenNMT-py wheel (the directory with `onmt/`), e.g. after
    `pip download OpenNMT-py==3.5.1 --no-deps` and unzip; it is never a dependency. Only
    onmt/modules/multi_headed_attn.py (and the one sibling it imports) is loaded, under a private
    package name, so OpenNMT-py's own dependencies are not needed.
    """
    import importlib
    import types
    from pathlib import Path

    modules = Path(path) / "onmt" / "modules"
    if not (modules / "multi_headed_attn.py").is_file():
        raise SystemExit(f"--opennmt {path}: no onmt/modules/multi_headed_attn.py there; unpack an OpenNMT-py wheel "
                         "(pip download OpenNMT-py==3.5.1 --no-deps; unzip it) and pass that directory")
    package = types.ModuleType("_opennmt_peer")
    package.__path__ = [str(modules)]
    sys.modules.setdefault("_opennmt_peer", package)
    peer = importlib.import_module("_opennmt_peer.multi_headed_attn")
    return peer.MultiHeadedAttention(heads, d_model, dropout=0.0, is_decoder=False,
                                     max_relative_positions=max_distance, attn_type="self")


# --- end-to-end training throughput ------------------------------------------------------------

def bench_model(args, device, dtype) -> list[Result]:
    """Training steps (forward, backward, AdamW as training builds it) of the whole model,
    sinusoidal vs Shaw: the encoder-decoder (`length` tokens a side), with --architecture
    decoder_only the language model (`DecoderLM`, one causal stack of --layers layers over `length`
    tokens) followed by its cached generation, or encoder_only (Delétang et al.'s: `length` source
    tokens and as many output slots).

    With --precision bf16-mixed the weights stay float32 under bf16 autocast, as Lightning's
    bf16-mixed trains; --dtype then only sets the dtype of a model trained without autocast.
    --compile MODE adds each candidate compiled (`trainer.compile`), timed beside its eager twin;
    its first step, which compiles, is reported apart (extra["compile_s"]), not in its median:
    from cold caches (inductor's cache directory a fresh one for the bench).
    Every result carries host ms per step, FLOPs per token (counted) and, on a GPU with a known
    peak, MFU.
    """
    if not getattr(args, "compile", None):
        return _bench_model(args, device, dtype)
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="relpos-bench-inductor-") as cold:  # compile time from scratch
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold
        try:
            return _bench_model(args, device, dtype)
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR")
            if previous is not None:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


def _bench_model(args, device, dtype) -> list[Result]:
    out = []
    architecture = getattr(args, "architecture", "encoder_decoder")
    peak = peak_flops(device)
    for length in args.length:
        batch = max(1, args.tokens // length) if args.tokens else args.batch
        shape = dict(batch=batch, length=length, d_model=args.d_model, heads=args.heads, d_ff=args.d_ff,
                     layers=args.layers, k=args.max_distance, precision=args.precision,
                     **({"architecture": architecture} if architecture != "encoder_decoder" else {}))
        fns, n_tokens, extra, specs = {}, batch * length, {}, {}
        randomized = [None] + ([args.max_random_len] if getattr(args, "max_random_len", None) else [])
        others = [(scheme, "auto", n) for scheme in getattr(args, "schemes", []) for n in randomized]
        shaw = [("shaw", impl, n) for impl in args.impl for n in randomized]
        candidates = [("sinusoidal", "auto", None), *others, *shaw]
        modes = ["none"] + ([args.compile] if getattr(args, "compile", None) else [])
        for (scheme, impl, random_len), mode in itertools.product(candidates, modes):
            torch.manual_seed(0)
            model = _model(args, scheme, impl, random_len=random_len).to(
                device=device, dtype=torch.float32 if args.precision else dtype).train()
            step = _training_step(args, model, architecture, batch, length, device)
            name = (f"model-shaw-{impl}" if scheme == "shaw" else f"model-{scheme}") + (
                f"-random{random_len}" if random_len else "")
            specs[name] = (scheme, impl, random_len)
            if mode == "none":
                extra[name] = {"gflop_per_token": step_flops(step) / n_tokens / 1e9}
            else:
                compile_model(model, mode)
                extra[name + "-compiled"] = dict(extra[name], compile_s=_first_call_s(step, device))
                name += "-compiled"
            fns[name] = step
        host: dict[str, list[float]] = {}
        times = interleaved(fns, args.repeats, args.warmup, device, host)
        base = statistics.median(times["model-sinusoidal"])
        for n, t in times.items():
            med = statistics.median(t)
            measured = dict(extra[n], tokens_per_s=n_tokens / (med / 1e3), host_ms=statistics.median(host[n]))
            if peak is not None:
                measured.update(mfu=mfu(measured["gflop_per_token"] * 1e9 * n_tokens, med, peak[1]), peak_of=peak[0])
            memory = (_model_peak_mb(args, *specs[n], architecture, batch, length, device)
                      if getattr(args, "memory", False) and not n.endswith("-compiled") else None)
            # ratio here is throughput relative to sinusoidal (higher is better)
            out.append(Result(n, shape, med, t, memory, base / med, measured))
        del fns
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if architecture == "decoder_only":
        out += bench_generation(args, device, dtype)
    return out


def _training_step(args, model, architecture: str, batch: int, length: int, device):
    """One training step of `model` on random tokens: forward, label-smoothed loss, backward, AdamW."""
    opt = build_optimizer(model.parameters(), OptimConfig(lr=1e-4))
    src = torch.randint(4, 8000, (batch, length), device=device)
    tgt = torch.randint(4, 8000, (batch, length + 1), device=device)
    slots = torch.full((batch,), length, device=device)

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "bf16-mixed"):
            if architecture == "encoder_only":
                logits = model(src, slots, width=length)
            else:
                logits = model(tgt[:, :-1]) if architecture == "decoder_only" else model(src, tgt[:, :-1])
            loss = label_smoothed_loss(logits, tgt[:, 1:]).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def _first_call_s(step, device) -> float:
    """Seconds of a freshly compiled model's first step: compiling it, and the step itself."""
    _sync(device)
    start = time.perf_counter()
    step()
    _sync(device)
    return time.perf_counter() - start


MODEL_PEAK_SNIPPET = """
import json, sys, types, torch
from relpos_lab.analysis.bench import _model, _training_step
from relpos_lab.analysis.candidates import peak_kb

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
args, cpu = types.SimpleNamespace(**spec["args"]), torch.device("cpu")
torch.manual_seed(0)
model = _model(args, spec["scheme"], spec["impl"], random_len=spec["random_len"]).train()
_training_step(args, model, spec["architecture"], spec["batch"], 16, cpu)()  # weights, Adam's state, warm
base = peak_kb()
_training_step(args, model, spec["architecture"], spec["batch"], spec["length"], cpu)()
print((peak_kb() - base) / 1024)
"""


def _model_peak_mb(args, scheme, impl, random_len, architecture, batch, length, device) -> float:
    """Peak memory of one training step beyond the weights and optimizer state: on CUDA the growth of
    max_memory_allocated over a step, on CPU of a fresh process's peak RSS (after a 16-token step)."""
    if device.type == "cuda":
        torch.manual_seed(0)
        model = _model(args, scheme, impl, random_len=random_len).to(device).train()
        step = _training_step(args, model, architecture, batch, length, device)
        step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    fields = ("d_model", "heads", "d_ff", "layers", "max_distance", "attention_dropout", "architecture", "precision")
    spec = dict(args={f: getattr(args, f, None) for f in fields}, scheme=scheme, impl=impl, random_len=random_len,
                architecture=architecture, batch=batch, length=length, threads=torch.get_num_threads())
    return peak_in_subprocess(MODEL_PEAK_SNIPPET, spec, f"model-{scheme}")


def _model(args, scheme: str, impl: str, vocab: int = 8000, random_len: int | None = None) -> torch.nn.Module:
    positions = _positions(scheme, args.max_distance)
    if random_len:
        positions.max_random_len = random_len
    architecture = getattr(args, "architecture", "encoder_decoder")
    cfg = ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=args.d_model, n_heads=args.heads,
                      d_ff=args.d_ff, n_encoder_layers=args.layers, n_decoder_layers=args.layers,
                      attention_dropout=args.attention_dropout, attention_impl=impl, positions=positions,
                      architecture=architecture)
    return {"decoder_only": DecoderLM, "encoder_only": EncoderOnly}.get(architecture, EncoderDecoder)(cfg)


def bench_generation(args, device, dtype) -> list[Result]:
    """`relpos-lab generate`'s loop, greedy: a 16-token prompt continued by --new-tokens tokens on
    the KV cache vs recomputing the whole sequence at every step, for each scheme; both must
    produce the same tokens. ratio: speed-up of the cache over recompute (higher is better)."""
    out = []
    for scheme in ("sinusoidal", "shaw"):
        torch.manual_seed(0)
        model = _model(args, scheme, "auto").to(device=device, dtype=dtype).eval()
        prompt = torch.randint(4, 8000, (1, 16), device=device)
        fns = {f"generate-{scheme}-{kind}": partial(sample, model, prompt, args.new_tokens, temperature=0,
                                                   cached=kind == "cached") for kind in ("recompute", "cached")}
        first = [fn()[0] for fn in fns.values()]
        if not torch.equal(*first):
            raise RuntimeError(f"{scheme}: cached and recomputed generation disagree")
        times = interleaved(fns, args.repeats, args.warmup, device)
        base = statistics.median(times[f"generate-{scheme}-recompute"])
        shape = dict(batch=1, prompt=16, new_tokens=args.new_tokens, d_model=args.d_model, layers=args.layers)
        out += [Result(n, shape, statistics.median(t), t, None, base / statistics.median(t),
                       {"tokens_per_s": args.new_tokens / (statistics.median(t) / 1e3)}) for n, t in times.items()]
    return out


# --- cached vs recompute-everything greedy decoding --------------------------------------------

@torch.no_grad()
def greedy_recompute(model, src, steps, bos_id=1):
    """The baseline without a cache: every step re-runs the decoder over the whole prefix."""
    memory, mask = model.encoder(src)
    tokens = torch.full((src.shape[0], 1), bos_id, dtype=torch.long, device=src.device)
    for _ in range(steps):
        nxt = model.decoder(tokens, memory, mask)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
    return tokens[:, 1:]


def bench_decode(args, device, dtype) -> list[Result]:
    steps = args.steps
    shape = dict(batch=args.batch, src_length=args.length[0], steps=steps, d_model=args.d_model, layers=args.layers)
    torch.manual_seed(0)
    cfg = ModelConfig(src_vocab_size=1000, tgt_vocab_size=1000, d_model=args.d_model, n_heads=args.heads,
                      d_ff=args.d_ff, n_encoder_layers=args.layers, n_decoder_layers=args.layers,
                      positions=_positions("shaw", args.max_distance))
    model = EncoderDecoder(cfg).to(device=device, dtype=dtype).eval()
    src = torch.randint(4, 1000, (args.batch, args.length[0]), device=device)
    eos = -1  # never emitted: both decoders run exactly `steps` steps
    fns = {
        "decode-recompute": lambda: greedy_recompute(model, src, steps),
        "decode-cached": lambda: greedy_search(model, src, bos_id=1, eos_id=eos, pad_id=0, max_len_a=0.0,
                                               max_len_b=steps),
    }
    # Both must produce the same tokens, or the comparison means nothing.
    cached = fns["decode-cached"]()
    if not torch.equal(cached[:, : steps - 1], fns["decode-recompute"]()[:, : steps - 1]):
        raise RuntimeError("cached and recomputed greedy decoding disagree")
    times = interleaved(fns, args.repeats, args.warmup, device)
    base = statistics.median(times["decode-recompute"])
    # ratio here is speed-up over recompute (higher is better)
    return [Result(n, shape, statistics.median(t), t, None, base / statistics.median(t)) for n, t in times.items()]


THROUGHPUT = (("tokens_per_s", "tokens/s", "{:,.0f}"), ("host_ms", "host ms", "{:.3g}"),
              ("gflop_per_token", "GFLOP/token", "{:.3g}"), ("mfu", "MFU", "{:.1%}"))
"""bench model's extra columns: (key in Result.extra, column, format)."""
BENCHES = {"attention": bench_attention, "layer": bench_layer, "model": bench_model, "decode": bench_decode}
RATIO_MEANING = {
    "attention": "time / the baseline without positions, --baseline (lower is better)",
    "layer": "time / module without positions (lower is better)",
    "model": "throughput / sinusoidal model (higher is better); generate-*: speed-up over recompute (higher is better)",
    "decode": "speed-up over recompute-everything (higher is better)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=list(BENCHES), help="what to measure")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--length", type=int, nargs="+", default=[512])
    parser.add_argument("--max-distance", type=int, default=16)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--d-ff", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=128, help="decode: tokens generated")
    parser.add_argument("--architecture", default="encoder_decoder",
                        choices=["encoder_decoder", "decoder_only", "encoder_only"],
                        help="model: the encoder-decoder, the decoder-only LM and its cached generation, or the "
                             "encoder-only model (length source tokens, as many output slots)")
    parser.add_argument("--schemes", nargs="*", default=[],
                        help="model: other position schemes to train beside sinusoidal and Shaw (e.g. rope alibi)")
    parser.add_argument("--compile", nargs="?", const="default", default=None, choices=COMPILE_MODES[1:],
                        help="model: also time each candidate compiled (trainer.compile's modes; default: default), "
                             "its compile time on its own line")
    parser.add_argument("--new-tokens", type=int, default=256,
                        help="model --architecture decoder_only: tokens generated after a 16-token prompt")
    parser.add_argument("--impl", nargs="+", default=None,
                        help="Shaw impls to compare (attention default: gather batched; model default: auto)")
    parser.add_argument("--baseline", default="sdpa", choices=["sdpa", "flash"],
                        help="attention: the candidate ratios are taken against (flash: CUDA's flash kernel)")
    parser.add_argument("--candidates", nargs="*", default=["unfused"],
                        help="attention: peers without Shaw tables (sdpa, flash, unfused; a learned (H, 2k+1) offset "
                             "bias: flex-bias as a FlexAttention score_mod, triton-bias as rel_bias in the fused "
                             "kernel)")
    parser.add_argument("--max-random-len", type=int, default=None,
                        help="model: also train each Shaw and --schemes candidate at randomized positions drawn "
                             "from [0, N)")
    parser.add_argument("--tokens", type=int, default=None,
                        help="batch = tokens // length for each length (default: --batch at every length)")
    parser.add_argument("--precision", default=None, choices=["bf16-mixed"],
                        help="model: float32 weights under bf16 autocast, as trainer.precision=bf16-mixed")
    parser.add_argument("--attention-dropout", type=float, default=0.0,
                        help="model: attention dropout (triton draws it inside the kernel; banded and flex have none)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16", "float64"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch CPU threads (default: the CPUs this process may use, as training chooses)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--runs", type=int, default=1,
                        help="repeat the whole side-by-side measurement; reports the min-max of the per-run ratios")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--mask", default="none", choices=MASKS,
                        help="attention: key padding as in a batch of unequal lengths, or padding + causal")
    parser.add_argument("--memory", action="store_true",
                        help="attention, model: also measure peak memory (model: one training step's, beyond the "
                             "weights and optimizer state)")
    parser.add_argument("--json", dest="json_path", default=None, help="also write results here")
    parser.add_argument("--opennmt", default=None, metavar="DIR",
                        help="layer: also time OpenNMT-py's attention from an unpacked OpenNMT-py wheel in DIR")


def run(args: argparse.Namespace, show_table: Callable[[Table], None] | None = None) -> list[Result]:
    """Measure, print the results table through `show_table` (rich's own print by default, which
    cuts names at 80 columns when piped; the CLI passes terminal.show_table, which prints them
    whole), then the notes beside it, and write --json."""
    from rich.console import Console
    from rich.table import Table

    use_cpu_threads(args.threads)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if args.impl is None:
        args.impl = ["auto"] if args.what == "model" else ["gather", "batched"]
    results = combine_runs([BENCHES[args.what](args, device, dtype) for _ in range(args.runs)])
    machine = dict(device=str(device), threads=torch.get_num_threads(), torch=torch.__version__,
                   cpu=platform.processor() or platform.machine(),
                   gpu=torch.cuda.get_device_name() if device.type == "cuda" else None)
    table = Table(title=f"bench {args.what} — {machine['device']}, {machine['threads']} threads, {args.dtype}",
                  caption=f"ratio: {RATIO_MEANING[args.what]}")
    spread = args.runs > 1
    measured = [(key, label, form) for key, label, form in THROUGHPUT if any(key in r.extra for r in results)]
    for col in (("candidate", "shape", "median ms", "ratio") + (("ratio min-max",) if spread else ()) + ("peak MB",)
                + tuple(label for _, label, _ in measured)):
        table.add_column(col, justify="left" if col in ("candidate", "shape") else "right")
    for r in results:
        low_high = r.extra.get("ratio_range")
        table.add_row(r.name, " ".join(f"{k}={v}" for k, v in r.shape.items()), f"{r.median_ms:.3g}",
                      f"{r.ratio:.2f}" if r.ratio is not None else "",
                      *((f"{low_high[0]:.2f}-{low_high[1]:.2f}" if low_high else "",) if spread else ()),
                      f"{r.peak_mb:.0f}" if r.peak_mb is not None else "",
                      *(form.format(r.extra[key]) if key in r.extra else "" for key, _, form in measured))
    (show_table or Console().print)(table)
    for r in results:
        if "compile_s" in r.extra:
            Console().print(f"compile: {r.name} at length {r.shape['length']}: {r.extra['compile_s']:.1f} s "
                            "(its first step, compiling; not in its median)")
    if any("mfu" in r.extra for r in results):
        peak = next(r.extra["peak_of"] for r in results if "mfu" in r.extra)
        Console().print(f"MFU: counted FLOPs per second / the {peak}'s dense bf16 peak "
                        f"({PEAK_BF16[peak] / 1e12:.0f} TFLOP/s)")
    for r in results:
        if "speedup_over_opennmt" in r.extra:
            low, high = r.extra.get("speedup_over_opennmt_range", [r.extra["speedup_over_opennmt"]] * 2)
            Console().print(f"{r.name} at length {r.shape['length']}: {r.extra['speedup_over_opennmt']:.2f}x faster "
                            "than OpenNMT-py's attention (forward+backward)"
                            + (f"; {low:.2f}-{high:.2f}x over {args.runs} runs" if spread else ""))
    if args.json_path:
        payload = {"bench": args.what, "machine": machine, "args": {k: v for k, v in vars(args).items() if k != "func"},
                   "results": [asdict(r) for r in results]}
        with open(args.json_path, "w") as f:
            json.dump(payload, f, indent=2)
    return results


def combine_runs(runs: list[list[Result]]) -> list[Result]:
    """Several whole runs of one bench as one result per candidate: the median of the per-run
    medians and ratios, and the min-max of the per-run ratios (extra["ratio_range"]) — candidates
    whose ratio moves between runs (another process, a peer's allocator) are quoted as a range."""
    if len(runs) == 1:
        return runs[0]
    combined = []
    for same in zip(*runs):
        first = same[0]
        ratios = [r.ratio for r in same if r.ratio is not None]
        extra = dict(first.extra)
        if ratios:
            extra["ratio_range"] = [min(ratios), max(ratios)]
        if "speedup_over_opennmt" in first.extra:
            speedups = [r.extra["speedup_over_opennmt"] for r in same]
            extra["speedup_over_opennmt"] = statistics.median(speedups)
            extra["speedup_over_opennmt_range"] = [min(speedups), max(speedups)]
        peaks = [r.peak_mb for r in same if r.peak_mb is not None]
        combined.append(Result(first.name, first.shape, statistics.median(r.median_ms for r in same),
                               [t for r in same for t in r.times_ms], max(peaks) if peaks else None,
                               statistics.median(ratios) if ratios else None, extra))
    return combined


PAPER_SWEEPS = ("deletang2023_paper", "ruoss2023_paper", "zhou2024_addition")
"""The largest shipped sweeps (ruoss2023_paper: 5,850 points), `bench sweep`'s default."""

SLURM_DRY_RUN = ("trainer=gpu1", "cluster=example", "cluster.runs_per_gpu=8", "cluster.cpus_per_task=2")
"""docs/slurm.md's packed job array (with the shipped cluster piece): what `bench sweep` times
`sweep NAME --slurm --dry-run` with."""


def bench_sweeps(names: list[str]) -> dict[str, tuple[float, float]]:
    """`bench sweep [NAME ...]`: for each sweep, the seconds it takes to expand (every point's
    config resolved and checked, its run directory found), what `sweep --list` waits for before it
    prints, then those of `sweep NAME --slurm --dry-run` with SLURM_DRY_RUN's pieces (the expansion
    again, with them, and the job array's script); wall and CPU seconds, as a loaded machine
    stretches the one and not the other. The first sweep's time includes loading its tasks' plugins."""
    from relpos_lab.launch.slurm import sweep_job
    from relpos_lab.launch.sweep import load_sweep

    def timed(work: Callable[[], Any]) -> tuple[Any, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        out = work()
        return out, time.perf_counter() - wall, time.process_time() - cpu

    seconds = {}
    for name in names:
        sweep, wall, cpu = timed(lambda: load_sweep(name))
        points = len(sweep.points)
        print(f"sweep {name}: {points:,} points expanded in {wall:.1f} s ({cpu:.1f} s CPU, "
              f"{wall / points * 1e3:.2f} ms a point)")
        _, slurm_wall, slurm_cpu = timed(lambda: sweep_job(load_sweep(name, list(SLURM_DRY_RUN))))
        print(f"sweep {name} --slurm --dry-run {' '.join(SLURM_DRY_RUN)}: {slurm_wall:.1f} s "
              f"({slurm_cpu:.1f} s CPU)")
        seconds[name] = (wall, slurm_wall)
    return seconds


def main(argv=None, show_table: Callable[[Table], None] | None = None):
    """`relpos-lab bench ARGS`; `show_table` prints the results table (see `run`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["kernel"]:  # the fused kernel compiled for a GPU target: static counts, no timing
        from relpos_lab.analysis import kernel_static
        return kernel_static.main(kernel_static.parse(argv[1:]))
    if argv[:1] == ["sweep"]:  # a sweep's expansion: no model, no device
        return bench_sweeps(argv[1:] or list(PAPER_SWEEPS))
    parser = argparse.ArgumentParser(prog="relpos-lab bench", description=__doc__.splitlines()[0])
    add_arguments(parser)
    run(parser.parse_args(argv), show_table)


if __name__ == "__main__":
    main()
