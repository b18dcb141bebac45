"""`relpos-lab bench model`: training steps of whole models, sinusoidal against Shaw (and any
other scheme), with their FLOPs, MFU, compile time and peak memory; for the decoder-only model its
cached generation too. The models the other benches build take their positions from here.
"""
from __future__ import annotations

import itertools
import os
import statistics
import tempfile
from functools import partial

import torch

from relpos_lab.analysis import ops
from relpos_lab.analysis.bench_timing import Result, first_call_s, interleaved
from relpos_lab.analysis.candidates import peak_in_subprocess
from relpos_lab.analysis.throughput import mfu, peak_flops, step_flops
from relpos_lab.config import OptimConfig
from relpos_lab.core.compiling import compile_model
from relpos_lab.core.decoding import sample
from relpos_lab.core.encoder_only import EncoderOnly
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab.core.positions import builtin_config
from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig
from relpos_lab.training.optim import build_optimizer


def positions_config(scheme: str, max_distance: int):
    """A built-in scheme's config; Shaw's clipped at `max_distance`."""
    return builtin_config(scheme, **({"max_distance": max_distance} if scheme == "shaw" else {}))


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
            model = build_model(args, scheme, impl, random_len=random_len).to(
                device=device, dtype=torch.float32 if args.precision else dtype).train()
            step = training_step(args, model, architecture, batch, length, device)
            name = (f"model-shaw-{impl}" if scheme == "shaw" else f"model-{scheme}") + (
                f"-random{random_len}" if random_len else "")
            specs[name] = (scheme, impl, random_len)
            if mode == "none":
                extra[name] = {"gflop_per_token": step_flops(step) / n_tokens / 1e9}
            else:
                compile_model(model, mode)
                extra[name + "-compiled"] = dict(extra[name], compile_s=first_call_s(step, device))
                name += "-compiled"
            fns[name] = step
            if mode == "none" and getattr(args, "stack", None):
                fns[name + f"-stack{args.stack}"] = _add_stacked(args, extra, name, step, (scheme, impl, random_len),
                                                                 architecture, batch, length, device)
        host: dict[str, list[float]] = {}
        times = interleaved(fns, args.repeats, args.warmup, device, host)
        base = statistics.median(times["model-sinusoidal"])
        for n, t in times.items():
            med = statistics.median(t)
            runs = args.stack if "-stack" in n else 1  # a stacked step trains `runs` runs at once
            med_per_run = med / runs
            measured = dict(extra[n], tokens_per_s=n_tokens / (med_per_run / 1e3), host_ms=statistics.median(host[n]))
            if peak is not None:
                measured.update(mfu=mfu(measured["gflop_per_token"] * 1e9 * n_tokens, med, peak[1]), peak_of=peak[0])
            memory = (_model_peak_mb(args, *specs[n], architecture, batch, length, device)
                      if getattr(args, "memory", False) and n in specs else None)
            # ratio here is throughput relative to sinusoidal (higher is better), a stack's over all its runs
            out.append(Result(n, shape, med, t, memory, base / med_per_run, measured))
        del fns
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if architecture == "decoder_only":
        out += bench_generation(args, device, dtype)
    return out


def _add_stacked(args, extra: dict, name: str, solo, spec, architecture: str, batch: int, length: int, device):
    """--stack K: `name`'s step for K runs stacked into one model (core/stack.py), beside the
    solo step; both get the aten ops they dispatch per run-step (analysis/ops.py), the stack's the
    ops of its step over K."""
    scheme, impl, random_len = spec
    models = []
    for seed in range(args.stack):
        torch.manual_seed(seed)
        models.append(build_model(args, scheme, impl, random_len=random_len).to(device).train())
    src = torch.randint(4, 8000, (args.stack, batch, length), device=device)
    tgt = torch.randint(4, 8000, (args.stack, batch, length + 1), device=device)
    step = ops.stacked_step(models, partial(_family_loss, architecture), (src, tgt), max_grad_norm=0.0)
    extra[name]["ops_per_run_step"] = ops.count_ops(solo).total
    extra[name + f"-stack{args.stack}"] = {"ops_per_run_step": ops.count_ops(step).total / args.stack,
                                             "gflop_per_token": extra[name]["gflop_per_token"]}
    return step


def _family_loss(architecture: str, model, src, tgt):
    """The label-smoothed loss of `model` on (src, tgt) as its family trains (tgt starts with BOS)."""
    if architecture == "encoder_only":
        logits = model(src, torch.full_like(src[:, 0], src.shape[1]), width=src.shape[1])
        return label_smoothed_loss(logits, tgt[:, 1:]).loss
    logits = model(tgt[:, :-1]) if architecture == "decoder_only" else model(src, tgt[:, :-1])
    return label_smoothed_loss(logits, tgt[:, 1:]).loss


def training_step(args, model, architecture: str, batch: int, length: int, device):
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


MODEL_PEAK_SNIPPET = """
import json, sys, types, torch
from relpos_lab.analysis.bench_model import build_model, training_step
from relpos_lab.analysis.candidates import peak_kb

spec = json.loads(sys.argv[1])
torch.set_num_threads(spec["threads"])
args, cpu = types.SimpleNamespace(**spec["args"]), torch.device("cpu")
torch.manual_seed(0)
model = build_model(args, spec["scheme"], spec["impl"], random_len=spec["random_len"]).train()
training_step(args, model, spec["architecture"], spec["batch"], 16, cpu)()  # weights, Adam's state, warm
base = peak_kb()
training_step(args, model, spec["architecture"], spec["batch"], spec["length"], cpu)()
print((peak_kb() - base) / 1024)
"""


def _model_peak_mb(args, scheme, impl, random_len, architecture, batch, length, device) -> float:
    """Peak memory of one training step beyond the weights and optimizer state: on CUDA the growth of
    max_memory_allocated over a step, on CPU of a fresh process's peak RSS (after a 16-token step)."""
    if device.type == "cuda":
        torch.manual_seed(0)
        model = build_model(args, scheme, impl, random_len=random_len).to(device).train()
        step = training_step(args, model, architecture, batch, length, device)
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


def build_model(args, scheme: str, impl: str, vocab: int = 8000, random_len: int | None = None) -> torch.nn.Module:
    positions = positions_config(scheme, args.max_distance)
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
        model = build_model(args, scheme, "auto").to(device=device, dtype=dtype).eval()
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
