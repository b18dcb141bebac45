"""`relpos-lab bench attention` and `bench layer`: the attention op, and one self-attention module,
each against a baseline without positions timed in the same run (layer: and OpenNMT-py's attention
as an optional peer). What each attention candidate runs is candidates.py.
"""
from __future__ import annotations

import statistics
import sys

import torch

from relpos_lab.analysis.bench_model import positions_config
from relpos_lab.analysis.bench_timing import Result, interleaved
from relpos_lab.analysis.candidates import attention_candidate, peak_memory_mb
from relpos_lab.core.positions import position_scheme_of
from relpos_lab.core.transformer import ModelConfig, MultiHeadAttention


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


def bench_layer(args, device, dtype) -> list[Result]:
    results = []
    for length in args.length:
        shape = dict(batch=args.batch, length=length, d_model=args.d_model, heads=args.heads, k=args.max_distance)
        fns = {}
        for scheme in ("none", "shaw"):
            cfg = ModelConfig(d_model=args.d_model, n_heads=args.heads, attention_dropout=0.0,
                              positions=positions_config(scheme, args.max_distance))
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
