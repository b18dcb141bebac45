"""Where banded's time goes on CUDA: eager vs compiled core, band block sizes, a profile of each.

    python docs/performance/gpu/profile_banded.py [--length 2048] [--tokens 32768] [--mask none]

Prints median fwd+bwd times (bf16, H=8, D=64, k=16) side by side with the flash kernel, the
largest relative error of each variant's output and gradients against eager banded, and the top
CUDA kernels of each variant from torch.profiler.
"""
import argparse
import statistics

import torch

from relpos_lab.analysis.bench_timing import interleaved
from relpos_lab.analysis.candidates import attention_candidate
from relpos_lab.core.attention import banded, relative_attention

parser = argparse.ArgumentParser()
parser.add_argument("--length", type=int, default=2048)
parser.add_argument("--tokens", type=int, default=32768)
parser.add_argument("--mask", default="none")
parser.add_argument("--blocks", type=int, nargs="+", default=[16, 64], help="band block sizes (eager)")
parser.add_argument("--compiled", action="store_true", help="also the compiled core (fails on torch 2.11 CUDA)")
args = parser.parse_args()
dev, dtype, L = torch.device("cuda"), torch.bfloat16, args.length
B, H, D, K = max(1, args.tokens // L), 8, 64, 16


def variant(compile_core, block):
    run = attention_candidate("shaw-banded", B, H, L, D, K, dtype, dev, mask=args.mask)

    def fn():
        banded.BANDED_COMPILE, banded.BAND_BLOCK = compile_core, block
        run()
    return fn


VARIANTS = [(f"eager-{b}", False, b) for b in args.blocks] + \
    ([(f"compiled-{b}", True, b) for b in args.blocks] if args.compiled else [])
fns = {"flash": attention_candidate("flash", B, H, L, D, K, dtype, dev, mask=args.mask)}
for name, compile_core, block in VARIANTS:
    fns[f"banded-{name}"] = variant(compile_core, block)

# Exactness of each variant against eager banded (same inputs, fp32 to see the arithmetic).
g = torch.Generator(device="cpu").manual_seed(1)
x = [torch.randn(*s, generator=g).to(dev).requires_grad_(True) for s in [(2, H, 700, D)] * 3 + [(2 * K + 1, D)] * 2]
keys, causal = (torch.arange(700, device=dev)[None] < torch.tensor([[600], [700]], device=dev))[:, None, None], False
results = {}
for name, compile_core, block in VARIANTS:
    banded.BANDED_COMPILE, banded.BAND_BLOCK = compile_core, block
    out = relative_attention(*x[:3], rel_k=x[3], rel_v=x[4], max_distance=K, attn_mask=keys, impl="banded")
    results[name] = [out] + list(torch.autograd.grad(out.square().sum(), x))
for name, vals in results.items():
    err = max(((a - b).norm() / b.norm()).item() for a, b in zip(vals, results[VARIANTS[0][0]]))
    print(f"exactness {name} vs {VARIANTS[0][0]} (fp32, padding): max relative error {err:.2e}")

times = interleaved(fns, repeats=10, warmup=3, device=dev)
base = statistics.median(times["flash"])
print(f"\nB={B} H={H} L={L} D={D} k={K} bf16 mask={args.mask}: median ms, ratio to flash")
for name, t in times.items():
    print(f"  {name:22s} {statistics.median(t):8.3f} ms  {statistics.median(t) / base:6.2f}x")

from torch.profiler import ProfilerActivity, profile  # noqa: E402

for name in [f"banded-{VARIANTS[0][0]}"]:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            fns[name]()
        torch.cuda.synchronize()
    print(f"\n--- {name}: top CUDA kernels over 3 fwd+bwd")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
