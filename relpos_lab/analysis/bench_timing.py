"""How every `relpos-lab bench` measurement is timed: candidates interleaved (each repeat runs all
of them in turn, after warm-up), medians, and whole runs combined into one result per candidate.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field

import torch


@dataclass
class Result:
    name: str
    shape: dict
    median_ms: float
    times_ms: list[float]
    peak_mb: float | None = None
    ratio: float | None = None  # median time / baseline's median time
    extra: dict = field(default_factory=dict)


def sync(device):
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
            sync(device)
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
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name].append((time.perf_counter() - start) * 1e3)
            if host is not None:
                host.setdefault(name, []).append(times[name][-1])
    return times


def first_call_s(step, device) -> float:
    """Seconds of a freshly compiled model's first step: compiling it, and the step itself."""
    sync(device)
    start = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - start


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
