"""Model FLOPs and MFU for `bench model`: how much of its GPU's arithmetic a training step uses.

FLOPs are counted, not estimated: torch's FlopCounterMode over one training step (forward and
backward) of the very model measured, so attention's matmuls at the step's length, Shaw's label
terms and the output projection are all in, and what has no matmul (softmax, norms, Adam) is not.
MFU is those FLOPs per second over the GPU's dense bf16 peak from its datasheet (PEAK_BF16).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch.utils.flop_counter import FlopCounterMode

PEAK_BF16 = {"A100": 312e12, "H100": 989e12, "H200": 989e12}
"""Dense bf16 tensor-core FLOP/s by GPU (NVIDIA datasheets: A100 SXM; H100 and H200 SXM)."""


def step_flops(step: Callable[[], None]) -> int:
    """FLOPs of one call of `step` (a training step: forward, backward, optimizer)."""
    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return counter.get_total_flops()


def peak_flops(device: torch.device) -> tuple[str, float] | None:
    """(GPU name, its dense bf16 peak) for a GPU in PEAK_BF16; None elsewhere (a CPU has no entry)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next(((gpu, peak) for gpu, peak in PEAK_BF16.items() if gpu in name), None)


def mfu(flops_per_step: float, step_ms: float, peak: float) -> float:
    return flops_per_step / (step_ms / 1e3) / peak
