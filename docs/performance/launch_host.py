"""The host's time per call of impl="triton", measured on a CPU: its launch code and Triton's.

On an H200 the host took 1.3-1.9 ms to issue one forward + backward of the fused path, and the
models' training steps were bound by it (docs/dev/fused-kernel.md). Most of that is
Python, which runs the same here: the fused path's own code (fused.py: tables, buffers, strides),
torch's small ops, and Triton's launch path (autotuner, heuristics, the binder that specialises
some fifty arguments, the kernel cache's key). This script runs exactly that with a stand-in for
the one thing that needs a GPU, Triton's driver: the kernels compile for sm_90 as they would on an
H100 (`bench kernel --static` does the same), and their launch does nothing. The tensors are small
CPU tensors, so torch's ops cost their dispatch, not their arithmetic.

    python docs/performance/launch_host.py [--length 256] [--steps 200] [--repeats 7]

Prints the time per forward + backward, then cProfile's own time per step grouped by where the code
lives (Triton, relpos_lab, torch, the rest), then the functions with the most own time. A GPU's host
adds the real launches and CUDA's allocator, so its total is larger; the split says what to cut.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

os.environ["RELPOS_LAB_TRITON_CONFIG"] = "64,64,4,3"  # one config: no autotuning, which would time kernels

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _Utils:
    def load_binary(self, name, kernel, shared, device):
        return "module", "function", 128, 0, 1024  # module, function, registers, spills, max threads

    def get_device_properties(self, device):
        return {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}


class NoLaunchDriver:
    """Triton's driver for an H100 that is not here: the kernels compile for sm_90 and every launch
    returns at once."""
    utils = _Utils()

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def launcher_cls(self, src, metadata):
        return lambda *args: None


def step_function(length: int, max_distance: int = 16):
    from relpos_lab.core.attention import fused

    def leaf(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, dtype=dtype).requires_grad_()

    q, k, v = (leaf(1, 8, length, 64) for _ in range(3))
    # float32 tables, as bf16-mixed training holds its parameters
    rel_k, rel_v = (leaf(2 * max_distance + 1, 64, dtype=torch.float32) for _ in range(2))

    def step():  # the gradients returned, not accumulated into .grad (CPU arithmetic, not launch work)
        out = fused.attend(q, k, v, rel_k=rel_k, rel_v=rel_v, rel_bias=None, max_distance=max_distance,
                           attn_mask=None, is_causal=False, query_offset=0, dropout_p=0.0, attn_bias=None,
                           scale=64 ** -0.5)
        torch.autograd.grad(out, (q, k, v, rel_k, rel_v), torch.zeros_like(out))

    return step


def layer(path: str, name: str) -> str:
    where = path if path != "~" else name
    for part in ("triton", "relpos_lab", "torch"):
        if part in where:
            return part
    return "the rest (builtins)"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args(argv)
    driver.set_active(NoLaunchDriver())
    step = step_function(args.length)
    started = time.perf_counter()
    step()
    print(f"first call (compiles the kernels for sm_90): {time.perf_counter() - started:.1f} s")
    for _ in range(20):
        step()
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for _ in range(args.steps):
            step()
        times.append((time.perf_counter() - started) / args.steps * 1e3)
    print(f"host time per forward + backward: {statistics.median(times):.3f} ms, the median of {args.repeats} runs "
          f"of {args.steps} (min {min(times):.3f}; Shaw k = 16, bf16 inputs, float32 tables, 1 x 8 heads x "
          f"{args.length} x 64, launches that do nothing)")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.steps):
        step()
    profiler.disable()
    rows = pstats.Stats(profiler).stats.items()
    per_step = lambda seconds: seconds / args.steps * 1e3
    by_layer: dict[str, float] = {}
    for (path, _, name), (_, _, own, _, _) in rows:
        by_layer[layer(path, name)] = by_layer.get(layer(path, name), 0.0) + own
    print("own time per step by where the code lives (under cProfile, which slows Python calls):")
    for name, seconds in sorted(by_layer.items(), key=lambda item: -item[1]):
        print(f"  {per_step(seconds):7.3f} ms  {name}")
    print(f"the {args.top} functions with the most own time per step:")
    for (path, line, name), (_, calls, own, cumulative, _) in sorted(rows, key=lambda item: -item[1][2])[:args.top]:
        print(f"  own {per_step(own):6.3f} ms  with callees {per_step(cumulative):6.3f} ms  "
              f"calls {calls // args.steps:3d}  {name} ({os.path.basename(path)}:{line})")


if __name__ == "__main__":
    main()
