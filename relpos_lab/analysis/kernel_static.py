"""`relpos-lab bench kernel --static`: the fused kernel compiled for a GPU that is not here.

Triton compiles for any target on the CPU (`triton.compile(..., target=GPUTarget("cuda", 90, 32))`)
and its wheel ships cuobjdump and nvdisasm, so registers, spills (stack bytes) and the SASS of
every kernel can be read without a GPU. From the SASS: the instruction count of each tile loop
(a loop is a backward branch; its body is executed once per tile) and of everything else (once
per program). With the kernels' own stage bounds (`key_stages` / `query_stages`, evaluated in
Python) that gives warp-instructions per (batch, head) at a length, against the plain
FlashAttention-2 control (flash_control.py) compiled the same way.

What the estimate is not: a time. It says nothing of latency, memory traffic or how well the
tensor cores are fed; it counts every instruction alike. It does catch what a GPU cannot hide:
spills, and work per tile that a plain flash kernel does not do. Occupancy, the blocks an SM
holds at once, is reported beside it (`blocks_per_sm`), not in it: with fewer blocks than the
control's a kernel has fewer warps to hide latency with, which the count does not see
(docs/performance.md).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field

import torch

from relpos_lab.core.attention.compiled import compile_for, cuobjdump, resources

CONTROL = "flash"


@dataclass(frozen=True)
class Case:
    """One call shape: which relative terms, and how the call is masked."""
    name: str
    terms: str = "shaw"  # shaw (a^K + a^V), bias (a learned rel_bias (H, 2k+1)), wide (a rel_bias of every offset)
    max_distance: int = 16
    head_dim: int = 64
    dtype: str = "bfloat16"
    causal: bool = False
    dropout_p: float = 0.0
    padding: bool = False


@dataclass
class Record:
    kernel: str  # forward, dq, dkdv
    case: str
    config: str  # BM/BN/warps/stages, "/r<N>" where registers are capped at N (maxnreg), "/low": LOW_REGISTERS
    sm: int
    registers: int
    stack_bytes: int
    shared_bytes: int
    loops: dict  # stage -> instructions per tile
    outside: int  # instructions outside the tile loops (once per program)
    blocks_per_sm: int = 0  # blocks of this config an SM holds at once (`blocks_per_sm`)
    estimate: dict = field(default_factory=dict)  # length -> warp-instructions per (batch, head)


SM_RESOURCES = {80: (65536, 64, 32, 164 * 1024), 90: (65536, 64, 32, 228 * 1024)}
"""Registers, warps, blocks and shared-memory bytes an SM holds (CUDA's table per compute capability)."""


def blocks_per_sm(registers: int, warps: int, shared_bytes: int, sm: int) -> int:
    """How many blocks of a kernel an SM runs at once, by the rules of CUDA's occupancy calculator:
    registers are allocated per warp in units of 256, and each block reserves 1 KiB of shared
    memory beside its own. A block fewer than the control's leaves the SM fewer warps to hide
    latency with, a cost the instruction count does not see (docs/dev/fused-kernel.md)."""
    register_file, max_warps, max_blocks, shared = SM_RESOURCES[sm]
    per_warp = -(-registers * 32 // 256) * 256
    return min(max_blocks, max_warps // warps, register_file // per_warp // warps, shared // (shared_bytes + 1024))


_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);")


def tile_loops(sass: str) -> tuple[list[int], int]:
    """([instructions in each loop's body, in code order], instructions in all). A loop is a
    branch back to an earlier address; its body, target to branch, runs once per iteration."""
    instructions = [(int(m.group(1), 16), m.group(2)) for m in _INSTRUCTION.finditer(sass)]
    loops = []
    for address, text in instructions:
        target = re.search(r"\bBRA (?:\S+ )?0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < address:
            loops.append(sum(1 for a, _ in instructions if int(target.group(1), 16) <= a <= address))
    return loops, len(instructions)


def measure(kernel, name: str, case: Case, args: tuple, constexprs: dict, config, sm: int,
            stages: list[str]) -> Record:
    """Compile one kernel in one config and read it back. `stages`: the tile loops' names in
    code order; a stage whose range the compiler proved empty has no loop and is dropped, from
    the end (the causal kernels' last stage)."""
    compiled = compile_for(kernel, args, {**constexprs, **config.kwargs}, sm, config.num_warps, config.num_stages,
                           config.maxnreg)
    registers, stack = resources(compiled)
    loops, total = tile_loops(cuobjdump(compiled, "-sass"))
    if len(loops) > len(stages):
        raise RuntimeError(f"{name}: {len(loops)} tile loops, expected at most {len(stages)} ({stages})")
    body = dict(zip(stages, loops))
    label = (f"{config.kwargs['BLOCK_M']}/{config.kwargs['BLOCK_N']}/{config.num_warps}/{config.num_stages}"
             + (f"/r{config.maxnreg}" if config.maxnreg else "")
             + ("/low" if config.kwargs.get("LOW_REGISTERS") else ""))
    shared = compiled.metadata.shared
    return Record(name, case.name, label, sm, registers, stack, shared, body, total - sum(loops),
                  blocks_per_sm(registers, config.num_warps, shared, sm))


def _meta_tensors(case: Case, length: int, batch: int = 2, heads: int = 8):
    dtype = getattr(torch, case.dtype)
    shape = (batch, heads, length, case.head_dim)
    q, k, v = (torch.empty(shape, device="meta", dtype=dtype, requires_grad=True) for _ in range(3))
    n_labels = 2 * case.max_distance + 1
    rel_k = rel_v = rel_bias = None
    if case.terms == "shaw":
        rel_k, rel_v = (torch.empty(n_labels, case.head_dim, device="meta", dtype=dtype, requires_grad=True)
                        for _ in range(2))
    else:
        rel_bias = torch.empty(heads, n_labels, device="meta", dtype=torch.float32, requires_grad=True)
    mask = torch.empty(batch, 1, 1, length, device="meta", dtype=torch.bool) if case.padding else None
    return q, k, v, rel_k, rel_v, rel_bias, mask


class _Recorder:
    """Stands in for an autotuned kernel: keeps the launch's arguments instead of running it."""

    def __init__(self, kernel, calls: list):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((self.kernel, args, kwargs))


def fused_launches(case: Case, length: int) -> list:
    """[(kernel, args, constexprs)] of the fused kernel's forward, dq and dk/dv for one call,
    made by the real launch code (fused.attend) on meta tensors, with the launches recorded (the
    tables' gradient sums after them, a reduction over rows, are left out)."""
    from relpos_lab.core.attention import fused, fused_kernels as kernels, fused_tuning

    calls: list = []
    saved = fused_tuning._kernels
    fused_tuning._kernels = tuple(_Recorder(k, calls) for k in
                           (kernels.forward_kernel, kernels.backward_dq_kernel, kernels.backward_dkdv_kernel,
                            kernels.label_sums_kernel))
    try:
        q, k, v, rel_k, rel_v, rel_bias, mask = _meta_tensors(case, length)
        max_distance = case.max_distance if case.terms != "wide" else length - 1
        if case.terms == "wide":
            rel_bias = torch.empty(q.shape[1], 2 * max_distance + 1, device="meta", requires_grad=True)
        out = fused.attend(q, k, v, rel_k=rel_k, rel_v=rel_v, rel_bias=rel_bias, max_distance=max_distance,
                           attn_mask=mask, is_causal=case.causal, query_offset=0, dropout_p=case.dropout_p,
                           attn_bias=None, scale=case.head_dim ** -0.5)
        out.backward(torch.empty_like(out))
    finally:
        fused_tuning._kernels = saved
    return calls[:3]


def _derived(kernel, args: tuple, constexprs: dict, config) -> dict:
    """The launch's constexprs with what the kernel's heuristics derive from them and the config."""
    from relpos_lab.core.attention import fused_tuning

    known = {**dict(zip(kernel.arg_names, args)), **constexprs, **config.all_kwargs()}
    return {**constexprs, **{name: rule(known) for name, rule in fused_tuning.heuristics(kernel).items()}}


KEY_LOOPS = [  # (stage, its first key, past its last, tile width): KeyStages fields and constexpr names
    ("band", "band_lo", "band_hi", "BAND_BLOCK"),
    ("left fringe", "left_hi", "left_narrow", "BAND_BLOCK"),
    ("left narrow fringe", "left_narrow", "band_lo", "FRINGE_BLOCK"),
    ("left", "lo", "left_hi", "BLOCK_N"),
    ("right narrow fringe", "band_hi", "right_wide", "FRINGE_BLOCK"),
    ("right fringe", "right_wide", "right_lo", "BAND_BLOCK"),
    ("right", "right_lo", "hi", "BLOCK_N"),
]
"""The forward's and dq's key loops in the order the kernels run them (`backward_dq_kernel`)."""


def key_loops(name: str, causal: bool, block_n: int, band_block: int, fringe_block: int) -> list[str]:
    """The key loops that kernel `name` (forward, dq) compiles for these blocks, in code order."""
    from relpos_lab.core.attention import fused_kernels as kernels

    wide = kernels.has_wide_fringes(block_n, band_block)
    narrow = kernels.has_narrow_fringes(causal, band_block, fringe_block)
    compiled = {"band": True, "left fringe": wide, "left narrow fringe": narrow, "left": True,
                "right narrow fringe": narrow, "right fringe": wide and not causal, "right": not causal}
    stages = [stage for stage, *_ in KEY_LOOPS if compiled[stage]]
    if name == "forward" and narrow:  # both narrow fringes as one tile, right after the band
        stages = [stages[0], FRINGE_PAIR, *(stage for stage in stages[1:] if "narrow" not in stage)]
    return stages


FRINGE_PAIR = "fringe pair"
"""The forward's tile for both narrow fringes (fused_kernels.fringe_pair), after the band."""
CONTROL_STAGES = ["full", "diagonal"]


def measure_fused(case: Case, sm: int, length: int = 2048) -> list[Record]:
    """Every kernel of the fused path in every config the autotuner may try."""
    from relpos_lab.core.attention import fused_tuning

    records = []
    for (kernel, args, kwargs), name in zip(fused_launches(case, length), ("forward", "dq", "dkdv")):
        for config in fused_tuning.configs(name):
            records.append(_measure_fused_kernel(kernel, name, case, args, kwargs, config, sm))
            spilled = name == "forward" and records[-1].stack_bytes
            variant = fused_tuning.low_register_variant(config) if spilled else None
            if variant is not None:  # what the autotuner is offered instead (fused_tuning.spill_free)
                records.append(_measure_fused_kernel(kernel, name, case, args, kwargs, variant, sm))
    return records


def _measure_fused_kernel(kernel, name: str, case: Case, args: tuple, kwargs: dict, config, sm: int) -> Record:
    constexprs = _derived(kernel, args, kwargs, config)
    stages = ["band", "left", "right"]
    if name != "dkdv":
        stages = key_loops(name, case.causal, config.kwargs["BLOCK_N"], constexprs["BAND_BLOCK"],
                           constexprs["FRINGE_BLOCK"])
    return measure(kernel, name, case, args, constexprs, config, sm, stages)


def measure_control(case: Case, sm: int, length: int = 2048) -> list[Record]:
    """The plain FlashAttention-2 control, same shapes, in each kernel's configs (the lists both
    sides share)."""
    from relpos_lab.analysis import flash_control
    from relpos_lab.core.attention import fused_tuning

    dtype = getattr(torch, case.dtype)
    q, k, v = (torch.empty(16, length, case.head_dim, device="meta", dtype=dtype) for _ in range(3))
    mask = torch.empty(16, length, device="meta", dtype=torch.uint8) if case.padding else None
    records = []
    for index, name in enumerate(("forward", "dq", "dkdv")):
        for config in fused_tuning.configs(name):
            if config.maxnreg:  # our register cap: the control is far below it
                continue
            blocks = {"BLOCK_M": config.kwargs["BLOCK_M"], "BLOCK_N": config.kwargs["BLOCK_N"]}
            kernel, _, args, meta = flash_control.launches(q, k, v, case.causal, case.dropout_p, blocks, mask)[index]
            meta = {key: value for key, value in meta.items() if key not in blocks}
            record = measure(kernel, name, case, args, meta, config, sm, CONTROL_STAGES)
            record.case = f"{CONTROL} ({case.name})"
            records.append(record)
    return records


def _tiles(name: str, stage_fn, length: int, max_distance: int, causal: bool, block_m: int, block_n: int,
           control: bool, maxnreg: int = 0) -> list[dict]:
    """Per program of one (batch, head): how many tiles each stage runs, from the kernels' own bounds."""
    from relpos_lab.core.attention import fused_kernels as kernels
    from relpos_lab.core.attention.fused_tuning import band_block, band_rows, fringe_block

    out = []
    if name in ("forward", "dq"):
        for m0 in range(0, length, block_m):
            if control:
                diagonal_lo, hi = stage_fn(m0, length, causal, block_m, block_n)
                out.append({"full": -(-diagonal_lo // block_n), "diagonal": -(-(hi - diagonal_lo) // block_n)})
            else:
                bb, fb = band_block(block_n, name, bool(maxnreg)), fringe_block(block_n, name, bool(maxnreg))
                keys = stage_fn(m0, 0, length, max_distance, causal, block_m, block_n, bb, fb)
                width = {"BAND_BLOCK": bb, "FRINGE_BLOCK": fb, "BLOCK_N": block_n}
                tiles = {stage: max(-(-(getattr(keys, end) - getattr(keys, start)) // width[size]), 0)
                         for stage, start, end, size in KEY_LOOPS}
                if name == "forward" and kernels.has_narrow_fringes(causal, bb, fb):  # one tile for both
                    tiles[FRINGE_PAIR] = int(tiles.pop("left narrow fringe") + tiles.pop("right narrow fringe") > 0)
                out.append(tiles)
    else:
        for n0 in range(0, length, block_n):
            if control:
                lo, diagonal_hi = stage_fn(n0, length, causal, block_m, block_n)
                out.append({"diagonal": -(-(diagonal_hi - lo) // block_m),
                            "full": -(-(length - diagonal_hi) // block_m)})
            else:
                lo, band_lo, band_hi = stage_fn(n0, 0, length, max_distance, causal, block_m, block_n)
                rows = band_rows({"BLOCK_M": block_m, "maxnreg": maxnreg})
                out.append({"band": -(-(band_hi - band_lo) // rows), "left": -(-(length - band_hi) // block_m),
                            "right": -(-(band_lo - lo) // block_m)})
    return out


def estimate(record: Record, length: int, max_distance: int, causal: bool) -> int:
    """Warp-instructions per (batch, head) at `length`: for each program, everything outside the
    loops once plus each stage's loop body once per tile, times the warps."""
    from relpos_lab.analysis import flash_control
    from relpos_lab.core.attention import fused_kernels as kernels

    control = record.case.startswith(CONTROL)
    bm, bn, warps = (int(x) for x in record.config.split("/")[:3])
    maxnreg = next((int(part[1:]) for part in record.config.split("/")[4:] if part.startswith("r")), 0)
    module = flash_control if control else kernels
    stage_fn = (module.key_stages if record.kernel in ("forward", "dq") else module.query_stages).fn
    total = 0
    for tiles in _tiles(record.kernel, stage_fn, length, max_distance, causal, bm, bn, control, maxnreg):
        total += record.outside + sum(record.loops.get(stage, 0) * count for stage, count in tiles.items())
    return total * warps


DEFAULT_CASES = [
    Case("shaw k=16"),
    Case("shaw k=16 causal", causal=True),
    Case("shaw k=16 causal dropout 0.1", causal=True, dropout_p=0.1),
    Case("t5/alibi bias k=16", terms="bias"),
    Case("shaw k=16 padding", padding=True),
]
FULL_CASES = [
    *(Case(f"shaw k={k} D={d} {dt}{' causal' if c else ''}{' dropout' if p else ''}", max_distance=k, head_dim=d,
           dtype=dt, causal=c, dropout_p=p)
      for k in (4, 16, 32, 63) for d in (64, 128) for dt in ("bfloat16", "float16")
      for c, p in ((False, 0.0), (True, 0.1))),
    Case("shaw k=16 padding", padding=True),
    Case("t5/alibi bias k=16", terms="bias"),
    Case("wide bias (every offset)", terms="wide"),
]
LENGTHS = (512, 2048, 8192)


def _offered(records: list[Record], kernel: str) -> list[Record]:
    """The configs of a kernel the autotuner may choose: those that do not spill (all, if every one does)."""
    of_kernel = [r for r in records if r.kernel == kernel]
    return [r for r in of_kernel if r.stack_bytes == 0] or of_kernel


def run(cases: list[Case], sms: list[int], lengths=LENGTHS) -> dict:
    """Records of every case and config, with estimates and ratios to the control's best config."""
    results = {"records": [], "summary": []}
    for sm in sms:
        for case in cases:
            ours = measure_fused(case, sm)
            control = measure_control(case, sm)
            for record in ours + control:
                record.estimate = {n: estimate(record, n, case.max_distance, case.causal) for n in lengths}
            results["records"] += [asdict(r) for r in ours + control]
            results["summary"].append(summarize(case.name, sm, ours, control, lengths))
    return results


def summarize(case: str, sm: int, ours: list[Record], control: list[Record], lengths=LENGTHS) -> dict:
    """Per length, our cheapest offered configs' estimate over the control's (forward; backward =
    dq + dk/dv); the blocks per SM of the configs each side takes at L = 2048; how many configs
    of each kernel do not spill."""
    kernel_names = ("forward", "dq", "dkdv")
    sides = {"ours": ours, "control": control}
    summary = {"case": case, "sm": sm, "ratios": {}}
    for phase, kernels in (("forward", ("forward",)), ("backward", ("dq", "dkdv"))):
        for n in lengths:
            best = {side: sum(min(r.estimate[n] for r in _offered(recs, kname)) for kname in kernels)
                    for side, recs in sides.items()}
            summary["ratios"][f"{phase} L={n}"] = round(best["ours"] / best["control"], 3)
    if 2048 in lengths:
        summary["blocks per SM at L=2048"] = {
            kname: "/".join(str(min(_offered(recs, kname), key=lambda r: r.estimate[2048]).blocks_per_sm)
                            for recs in sides.values())
            for kname in kernel_names}
    summary["spill-free configs"] = {
        kname: f"{sum(1 for r in ours if r.kernel == kname and r.stack_bytes == 0)} of "
               f"{sum(1 for r in ours if r.kernel == kname)}"
        for kname in kernel_names}
    return summary


def format_table(results: dict) -> str:
    lines = ["Per kernel and config: registers, stack bytes (spills), blocks an SM holds at once, instructions "
             "per tile by stage, and outside the loops (once per program).", ""]
    header = (f"{'sm':>3} {'case':<34} {'kernel':<8} {'config':<12} {'regs':>4} {'stack':>5} {'blocks':>6} "
              f"{'outside':>7}  loops")
    lines += [header, "-" * len(header)]
    for r in results["records"]:
        loops = " ".join(f"{k}={v}" for k, v in r["loops"].items())
        lines.append(f"{r['sm']:>3} {r['case'][:34]:<34} {r['kernel']:<8} {r['config']:<12} {r['registers']:>4} "
                     f"{r['stack_bytes']:>5} {r['blocks_per_sm']:>6} {r['outside']:>7}  {loops}")
    lines += ["", "Estimated warp-instructions per (batch, head), the fused kernel's cheapest spill-free config "
              "over the flash control's cheapest (forward; backward = dq + dk/dv):", ""]
    for s in results["summary"]:
        ratios = "  ".join(f"{k} {v:.2f}x" for k, v in s["ratios"].items())
        free = ", ".join(f"{kernel} {count}" for kernel, count in s["spill-free configs"].items())
        blocks = ", ".join(f"{kernel} {both}" for kernel, both in s.get("blocks per SM at L=2048", {}).items())
        lines.append(f"sm_{s['sm']} {s['case']:<34} {ratios}  spill-free configs: {free}"
                     + (f"  blocks per SM at L=2048, ours/control: {blocks}" if blocks else ""))
    return "\n".join(lines)


def main(args) -> dict:
    cases = FULL_CASES if args.all_cases else DEFAULT_CASES
    results = run(cases, args.sm)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return results


def parse(argv: list[str]):
    import argparse
    parser = argparse.ArgumentParser(prog="relpos-lab bench kernel", description=__doc__.splitlines()[0])
    parser.add_argument("--static", action="store_true", required=True,
                        help="compile for a GPU target and read the SASS (no GPU needed); timing the kernel on a "
                             "GPU is `bench attention --impl triton`")
    parser.add_argument("--sm", type=int, nargs="+", default=[90],
                        help="CUDA compute capabilities (90: H100, 80: A100)")
    parser.add_argument("--all-cases", action="store_true",
                        help="every k in 4 16 32 63, D 64 and 128, bf16 and fp16, plain and causal+dropout, padding, "
                             "bias alone, the wide bias (default: the Shaw default, causal, causal+dropout, bias, "
                             "padding)")
    parser.add_argument("--json", default=None, help="also write the records here")
    return parser.parse_args(argv)


def default_config_records(sm: int = 90, length: int = 2048, config_index: int = 0,
                           kernels=("forward", "dq", "dkdv")) -> dict:
    """The Shaw default's `kernels` and the flash control's, each in one config of `fused_tuning.configs`
    (by default the first, the one the kernels use most), with estimates: the CI test's measurement."""
    from relpos_lab.analysis import flash_control
    from relpos_lab.core.attention import fused_tuning

    case = Case("shaw k=16")
    out = {}
    for (kernel, args, kwargs), name in zip(fused_launches(case, length), ("forward", "dq", "dkdv")):
        if name in kernels:
            config = fused_tuning.configs(name)[config_index]
            out[name] = _measure_fused_kernel(kernel, name, case, args, kwargs, config, sm)
    config = fused_tuning.configs("dq")[config_index]
    blocks = {"BLOCK_M": config.kwargs["BLOCK_M"], "BLOCK_N": config.kwargs["BLOCK_N"]}
    q = torch.empty(16, length, case.head_dim, device="meta", dtype=torch.bfloat16)
    for (kernel, _, args, meta), name in zip(flash_control.launches(q, q, q, False, 0.0, blocks),
                                             ("forward", "dq", "dkdv")):
        if name not in kernels:
            continue
        record = measure(kernel, name, case, args, {k: v for k, v in meta.items() if k not in blocks}, config, sm,
                         CONTROL_STAGES)
        record.case = f"{CONTROL} ({case.name})"
        out[f"control {name}"] = record
    for record in out.values():
        record.estimate = {n: estimate(record, n, case.max_distance, case.causal) for n in LENGTHS}
    return {name: asdict(record) for name, record in out.items()}
