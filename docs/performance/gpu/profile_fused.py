"""Where the fused kernel's time goes on a GPU: its three kernels beside a FlashAttention-2 control.

    python docs/performance/gpu/profile_fused.py [--lengths 2048 8192] [--tokens 32768] [--config 64 64 4 3 [capped]]

One config for every kernel (no autotuning, so that a lease spends its minutes timing, not
compiling; 64/64, 4 warps, 3 stages is what the autotuner picked on an H200 at L = 2048; a fifth
value caps the registers a thread holds, maxnreg: a number, or `capped` for the forward's and dk/dv's
own caps, fused_tuning.REGISTER_CAPS, as their capped configs have them). Prints:
the largest gradient errors of impl="triton" in bf16 against gather in float32; per length, forward
and forward + backward times (triton.testing.do_bench, Shaw a^K + a^V, k = 16, H = 8, D = 64, bf16)
beside SDPA's, the host time per call, the CUDA time per call of every kernel (torch.profiler), and
the project's FlashAttention-2 control (relpos_lab/analysis/flash_control.py) per kernel in the same
config; causal attention without and with dropout 0.1 at the first length beside SDPA's, with the
host's time per step; where the host's time goes (cProfile); the registers, spills and shared
memory of every kernel compiled; then the forward at the first length with a^K alone, a^V alone,
and k = 4 and 63.
"""
import argparse
import os
import time

import torch
import torch.nn.functional as F
import triton
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from relpos_lab.analysis import flash_control
from relpos_lab.core.attention import fused_tuning, relative_attention

parser = argparse.ArgumentParser()
parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 8192])
parser.add_argument("--tokens", type=int, default=32768)
parser.add_argument("--no-variants", action="store_true", help="skip the forward's variants (each compiles anew)")
parser.add_argument("--config", nargs="+", default=["64", "64", "4", "3"],
                    help="BM BN WARPS STAGES [MAXNREG, or capped: each kernel's fused_tuning.REGISTER_CAPS]")
args = parser.parse_args()
if len(args.config) not in (4, 5):
    parser.error("--config takes BM BN WARPS STAGES [MAXNREG or capped]")
BM, BN, WARPS, STAGES = (int(x) for x in args.config[:4])
H, D, K = 8, 64, 16
os.environ[fused_tuning.CONFIG_VARIABLE] = ",".join(map(str, args.config))


def tensors(batch, length, k, dtype, with_k=True, with_v=True):
    make = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype).requires_grad_()
    q, kk, v = (make(batch, H, length, D) for _ in range(3))
    return q, kk, v, make(2 * k + 1, D) if with_k else None, make(2 * k + 1, D) if with_v else None


def shaw(q, kk, v, rel_k, rel_v, k, impl="triton"):
    return relative_attention(q, kk, v, rel_k=rel_k, rel_v=rel_v, max_distance=k, impl=impl)


def check():
    base = tensors(1, 2048, K, torch.float32)
    grad_out = torch.randn_like(base[0])
    grads = {}
    for impl, dtype in (("triton", torch.bfloat16), ("gather", torch.float32)):
        leaves = [t.detach().to(dtype).requires_grad_() for t in base]
        shaw(*leaves, K, impl).backward(grad_out.to(dtype))
        grads[impl] = [t.grad.float() for t in leaves]
    for name, ours, reference in zip(("q", "k", "v", "rel_k", "rel_v"), grads["triton"], grads["gather"]):
        print(f"grad {name}: max abs error {(ours - reference).abs().max().item():.3g} "
              f"(max abs {reference.abs().max().item():.3g})", flush=True)


def kernel_times(step, calls=3) -> dict:
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            step()
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        self_time = getattr(event, "self_device_time_total", None)
        if self_time is None:
            self_time = event.self_cuda_time_total
        if self_time > 0:
            times[event.key[:60]] = self_time / calls / 1000
    return dict(sorted(times.items(), key=lambda item: -item[1]))


def host_and_kernels(label, step, steps=20):
    """The host's time to issue `steps` steps (the GPU left to queue) beside their wall time, then
    the CUDA time per step of every kernel."""
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    issued = time.perf_counter()
    torch.cuda.synchronize()
    print(f"{label} host per fwd+bwd {(issued - started) / steps * 1e3:.3f} ms "
          f"(wall {(time.perf_counter() - started) / steps * 1e3:.3f} ms)", flush=True)
    for name, ms in kernel_times(step).items():
        print(f"{label}   {ms:7.3f} ms  {name}", flush=True)


def profile_length(length):
    batch = max(1, args.tokens // length)
    q, kk, v, rel_k, rel_v = tensors(batch, length, K, torch.bfloat16)
    grad_out = torch.randn_like(q)
    forward = lambda: shaw(q, kk, v, rel_k, rel_v, K)
    step = lambda: forward().backward(grad_out)
    sdpa = lambda: F.scaled_dot_product_attention(q, kk, v).backward(grad_out)
    started = time.time()
    step()
    torch.cuda.synchronize()
    print(f"L={length} B={batch}: first call {time.time() - started:.1f} s", flush=True)
    for name, fn in (("shaw fwd", forward), ("shaw fwd+bwd", step), ("sdpa fwd+bwd", sdpa)):
        print(f"L={length} {name}: {do_bench(fn, warmup=5, rep=50):.3f} ms", flush=True)
    host_and_kernels(f"L={length}", step)
    flat = [t.detach().reshape(batch * H, length, D).contiguous() for t in (q, kk, v)]
    for kernel, grid, launch_args, meta in flash_control.launches(*flat, False, 0.0, {"BLOCK_M": BM, "BLOCK_N": BN}):
        ms = do_bench(lambda: kernel[grid](*launch_args, **meta, num_warps=WARPS, num_stages=STAGES), warmup=5, rep=50)
        print(f"L={length}   {ms:7.3f} ms  flash control {kernel.fn.__name__}", flush=True)


def host_profile(length, steps=20, top=25):
    """Where the host's time per fwd+bwd goes (cProfile over `steps` steps, the GPU left to
    queue): our launch code, Triton's launchers (autotuner, heuristics, binder), torch's ops."""
    import cProfile
    import pstats

    batch = max(1, args.tokens // length)
    q, kk, v, rel_k, rel_v = tensors(batch, length, K, torch.bfloat16)
    grad_out = torch.randn_like(q)
    step = lambda: shaw(q, kk, v, rel_k, rel_v, K).backward(grad_out)
    step()
    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        step()
    profiler.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(profiler)
    print(f"L={length} host profile, per fwd+bwd ({steps} steps), the {top} largest by own time:", flush=True)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])[:top]
    for (path, line, name), (_, calls, own, cumulative, _) in rows:
        print(f"L={length}   own {own / steps * 1e3:7.3f} ms  with callees {cumulative / steps * 1e3:7.3f} ms  "
              f"calls {calls // steps:4d}  {name} ({os.path.basename(path)}:{line})", flush=True)


def compiled_resources():
    """Registers, spills and shared memory of every kernel compiled so far, as the GPU's driver
    loaded them: the check on `bench kernel --static`'s blocks per SM, compiled on the CPU."""
    from relpos_lab.core.attention import fused_kernels

    for jit in (fused_kernels.forward_kernel, fused_kernels.backward_dq_kernel, fused_kernels.backward_dkdv_kernel,
                fused_kernels.label_sums_kernel):
        for kernel_cache, *_ in jit.device_caches.values():
            for compiled in kernel_cache.values():
                compiled = compiled.result() if hasattr(compiled, "result") else compiled  # (an async compile's)
                meta = compiled.metadata
                print(f"compiled {jit.fn.__name__}: {getattr(compiled, 'n_regs', '?')} registers, "
                      f"{getattr(compiled, 'n_spills', '?')} spilled, {meta.shared} shared bytes, "
                      f"{meta.num_warps} warps, {meta.num_stages} stages", flush=True)


def forward_variants(length):
    batch = max(1, args.tokens // length)
    for k, with_k, with_v in ((K, True, False), (K, False, True), (K, True, True), (4, True, True), (63, True, True)):
        q, kk, v, rel_k, rel_v = (t.detach() if t is not None else None
                                  for t in tensors(batch, length, k, torch.bfloat16, with_k, with_v))
        ms = do_bench(lambda: shaw(q, kk, v, rel_k, rel_v, k), warmup=5, rep=40)
        print(f"L={length} forward k={k} a^K={int(with_k)} a^V={int(with_v)}: {ms:.3f} ms", flush=True)


def causal(length, dropout_p):
    """Causal attention, as a decoder trains: Shaw fwd+bwd and SDPA's (flash draws its dropout mask
    in the kernel too), the host's time to issue a step, then the kernels' times: whether the
    host or the kernels bound a step, and what dropout's draws cost beside the softmax."""
    batch = max(1, args.tokens // length)
    q, kk, v, rel_k, rel_v = tensors(batch, length, K, torch.bfloat16)
    grad_out = torch.randn_like(q)
    ours = lambda: relative_attention(q, kk, v, rel_k=rel_k, rel_v=rel_v, max_distance=K, is_causal=True,
                                      dropout_p=dropout_p, impl="triton").backward(grad_out)
    sdpa = lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True, dropout_p=dropout_p).backward(grad_out)
    label = f"L={length} causal dropout {dropout_p}"
    for name, fn in (("shaw", ours), ("sdpa", sdpa)):
        print(f"{label} {name} fwd+bwd: {do_bench(fn, warmup=5, rep=50):.3f} ms", flush=True)
    host_and_kernels(label, ours)


cap = args.config[4] if args.config[4:] else None
capped = "" if cap is None else f", registers capped at {fused_tuning.REGISTER_CAPS if cap == 'capped' else cap}"
print(f"config {BM}/{BN}, {WARPS} warps, {STAGES} stages{capped}; "
      f"torch {torch.__version__}, triton {triton.__version__}, "
      f"{torch.cuda.get_device_name()}", flush=True)
check()
for length in args.lengths:
    profile_length(length)
for dropout_p in (0.0, 0.1):
    causal(args.lengths[0], dropout_p)
host_profile(args.lengths[0])
try:
    compiled_resources()
except Exception as error:  # Triton's internals: a lease's later steps must still run
    print(f"compiled kernels' resources: not read ({error!r})", flush=True)
if not args.no_variants:
    forward_variants(args.lengths[0])
