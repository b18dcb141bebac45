"""`relpos-lab bench`: speed and memory measured side by side in one run.

Every claim about performance comes from here: candidates are interleaved (each repeat runs all of
them in turn, after warm-up), times are medians, and ratios are taken against a baseline measured
in the same run. Peak memory on CPU is the growth of the process's peak RSS while running one
candidate in a fresh subprocess (the only honest CPU peak); on CUDA it is max_memory_allocated.

This module is the verb: its options, the results table and --json. What each measurement runs
is its own module: bench_attention.py (attention, layer), bench_model.py (model),
bench_decode.py (decode), bench_sweep.py (sweep), kernel_static.py (kernel); bench_timing.py
times them all alike.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING

import torch

from relpos_lab.analysis.bench_attention import bench_attention, bench_layer
from relpos_lab.analysis.bench_decode import bench_decode
from relpos_lab.analysis.bench_model import bench_model
from relpos_lab.analysis.bench_sweep import PAPER_SWEEPS, bench_sweeps
from relpos_lab.analysis.bench_timing import Result, combine_runs
from relpos_lab.analysis.candidates import MASKS
from relpos_lab.analysis.throughput import PEAK_BF16
from relpos_lab.core.compiling import MODES as COMPILE_MODES
from relpos_lab.training.threads import use_cpu_threads

if TYPE_CHECKING:  # a type name only: rich loads when the table is printed
    from rich.table import Table


THROUGHPUT = (("tokens_per_s", "tokens/s", "{:,.0f}"), ("host_ms", "host ms", "{:.3g}"),
              ("gflop_per_token", "GFLOP/token", "{:.3g}"), ("mfu", "MFU", "{:.1%}"),
              ("ops_per_run_step", "ops/run-step", "{:,.1f}"))
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
    parser.add_argument("--stack", type=int, default=None, metavar="K",
                        help="model: each candidate also as K runs stacked into one model (sweep --stack), "
                             "with the aten ops each dispatches per run-step; tokens/s and ratio count all K runs")
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
