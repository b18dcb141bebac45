"""The fused kernels as launched: the configs the autotuner tries (blocks, warps, stages, register
caps), the constexprs each launch derives from its config (the band's and fringes' tile sizes, the
forward's LOW_REGISTERS, which tiles need no bounds checks), and the spill check that keeps the
autotuner from timing a config that spills. fused.py launches the kernels `get_kernels` returns;
how the configs were chosen, with measurements, is docs/dev/fused-kernel.md.
"""
from __future__ import annotations

import importlib.util
import os
import warnings

import torch

HAS_TRITON = importlib.util.find_spec("triton") is not None
INTERPRETED = False
"""Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 set before triton was imported)."""

if HAS_TRITON:
    import triton

    from relpos_lab.core.attention import fused_kernels as kernels

    INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


CONFIG_VARIABLE = "RELPOS_LAB_TRITON_CONFIG"
"""``BM,BN,WARPS,STAGES[,MAXNREG]`` (e.g. 64,64,4,3 or 64,64,4,3,168): every kernel runs that
one config, untuned (MAXNREG caps the registers a thread may hold; 0 or absent: no cap; ``capped``:
each kernel's own cap, REGISTER_CAPS). For tests and profiles on a GPU, where autotuning each
shape would spend minutes compiling."""


REGISTER_CAPS = {"forward": 128, "dkdv": 168}
"""Registers a thread may hold in the forward's and dk/dv's capped 64/64, 4-warp configs: 128 lets
4 blocks share an SM's 65,536, 168 lets 3; what the FlashAttention-2 control's forward and dk/dv
fit in that config on Hopper (`bench kernel --static`'s blocks column)."""


def configs(kernel: str) -> list:
    """Block sizes, warps, stages and register caps the autotuner tries once per shape class on
    a GPU (Hopper, Ampere), for the "forward", "dq" or "dkdv" kernel. 128/32 with 8 warps is the
    one that does not spill with causality and dropout (`bench kernel --static`). The forward
    and dk/dv also try 64/64 capped (REGISTER_CAPS): at 128 and 168 registers 4 and 3 blocks
    share an SM, as the FlashAttention-2 control's do, where uncapped they fit fewer and have
    fewer warps to hide latency with; dq fits as many as the control uncapped. Capped, they
    compile without spilling with the forward's band in 32-key tiles (`band_block`) and dk/dv's
    in tiles of half the block's rows (`band_rows`). dk/dv also tries 64/64 in two stages: with
    causality and dropout on sm_80 it is the one config that does not spill (the control spills
    in all). The dk/dv kernel takes WINDOW, the power of two holding a tile's BM + BN − 1
    diagonals (a wide rel_bias's gradient). Measurements: docs/dev/fused-kernel.md."""
    choices = ((128, 64, 8, 3, 0), (64, 64, 4, 3, 0), (128, 32, 4, 3, 0), (64, 128, 4, 2, 0), (128, 32, 8, 2, 0))
    if kernel == "dkdv":
        choices += ((64, 64, 4, 2, 0),)
    if kernel in REGISTER_CAPS:
        choices += ((64, 64, 4, 3, REGISTER_CAPS[kernel]),)
    if os.environ.get(CONFIG_VARIABLE):
        try:
            fields = os.environ[CONFIG_VARIABLE].split(",")
            if len(fields) not in (4, 5):
                raise ValueError
            *blocks, cap = (fields + ["0"])[:5]
            choices = ((*(int(x) for x in blocks), REGISTER_CAPS.get(kernel, 0) if cap == "capped" else int(cap)),)
        except ValueError:
            raise ValueError(f"{CONFIG_VARIABLE}={os.environ[CONFIG_VARIABLE]!r}: expected BM,BN,WARPS,STAGES "
                             "[,MAXNREG or capped] such as 64,64,4,3") from None
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, **({"WINDOW": window(bm, bn)} if kernel == "dkdv" else {})},
                          num_warps=w, num_stages=s, maxnreg=cap or None)
            for bm, bn, w, s, cap in choices]


MIN_BLOCK_N = 16
"""At most the smallest key block of any config: a wide rel_bias's gradient has a row per key block."""


def cdiv(a: int, b: int) -> int:
    """triton.cdiv as plain arithmetic: Triton's is a constexpr function, whose wrapper the host
    would pay on every launch (docs/performance/launch_host.py times the launch path)."""
    return -(-a // b)


def power_of_2_at_least(n: int) -> int:
    """triton.next_power_of_2 for n >= 1, as plain arithmetic (see _cdiv)."""
    return 1 << (n - 1).bit_length()


def window(block_m: int, block_n: int) -> int:
    return power_of_2_at_least(block_m + block_n - 1)


_TUNE_KEY = ["L_BUCKET", "LABEL_TILE", "BLOCK_D", "HAS_RK", "HAS_RV", "HAS_BIAS", "MASK", "CAUSAL", "HAS_DROPOUT"]
_EVEN = {"EVEN_M": lambda a: a["LQ"] % a["BLOCK_M"] == 0, "EVEN_N": lambda a: a["LK"] % a["BLOCK_N"] == 0,
         "EVEN_D": lambda a: a["D"] == a["BLOCK_D"]}
"""Tiles that the lengths fill need no bounds checks: decided per launch, after the config."""
BAND_CAP = {"forward": 8, "dq": 8} if HAS_TRITON and INTERPRETED else {"forward": 64, "dq": 32}
"""The forward's and dq's band tiles are at most this many keys (fringes of plain tiles as wide
join them to the BN tiles): the fewer keys the band holds, the less per-pair label work, but a
narrow tile pays the online softmax's per-tile cost on fewer keys. These minimise the estimate
of `bench kernel --static`. The interpreter cuts its 16-key blocks in two, so the tests run the
band, the fringes and the plain tiles."""


def band_block(block_n: int, kernel: str, capped: bool = False) -> int:
    """BAND_BLOCK of the "forward" or "dq" kernel in a config with `block_n`; under a register cap
    at most FRINGE_CAP keys, whose per-pair work fits fewer registers (the forward capped at 128
    spills with 64-key band tiles on sm_90, not with 32-key ones)."""
    return min(block_n, BAND_CAP[kernel], FRINGE_CAP if capped else block_n)


FRINGE_CAP = 8 if HAS_TRITON and INTERPRETED else 32
"""The narrow fringes' tiles are at most this many keys, and the band starts at a multiple of
it: with BAND_BLOCK 64, the band of a 64-row block with k = 16 is two tiles from a multiple of
32, not three from a multiple of 64 (`bench kernel --static`)."""


def fringe_block(block_n: int, kernel: str, capped: bool = False) -> int:
    """FRINGE_BLOCK of the "forward" or "dq" kernel in a config with `block_n`."""
    return min(band_block(block_n, kernel, capped), FRINGE_CAP)


def kernel_name(kernel) -> str:
    """"forward", "dq" or "dkdv": the name `configs` and `band_block` know a kernel by."""
    return {kernels.forward_kernel: "forward", kernels.backward_dq_kernel: "dq",
            kernels.backward_dkdv_kernel: "dkdv"}[kernel]


def heuristics(kernel) -> dict:
    """EVEN_* from the lengths and the config; the forward's and dq's band tile length, dk/dv's
    band tile height; the forward's LOW_REGISTERS."""
    name = kernel_name(kernel)
    if name == "dkdv":
        return {**_EVEN, "BAND_ROWS": lambda a: band_rows(a)}
    rules = {**_EVEN, "BAND_BLOCK": lambda a: band_block(a["BLOCK_N"], name, capped(a)),
             "FRINGE_BLOCK": lambda a: fringe_block(a["BLOCK_N"], name, capped(a))}
    if name == "forward":
        rules["LOW_REGISTERS"] = lambda a: low_registers(a)
    return rules


def capped(meta: dict) -> bool:
    """Whether a launch's config caps the registers a thread may hold (the autotuner passes a
    config's `maxnreg` with its kwargs)."""
    return bool(meta.get("maxnreg"))


def low_registers(meta: dict) -> bool:
    """Whether the forward's band computes the addresses of its interior stores again rather than
    keep its loads' (32 registers fewer): under a register cap (`capped`), or in a config's
    `low_register_variant`."""
    return bool(meta.get("LOW_REGISTERS", capped(meta)))


def band_rows(meta: dict) -> int:
    """dk/dv's band tile height: under a register cap half the block's rows. The band's per-pair
    work is what sets dk/dv's registers; capped at 168 (64/64, 4 warps) it spills with full-height
    band tiles and not with half-height ones (`bench kernel --static`)."""
    return meta["BLOCK_M"] // 2 if capped(meta) else meta["BLOCK_M"]


def low_register_variant(config):
    """The forward `config` with LOW_REGISTERS, which `spill_free` offers where the config spills
    (None where it has it already)."""
    if low_registers(config.all_kwargs()):
        return None
    return triton.Config({**config.kwargs, "LOW_REGISTERS": True}, num_warps=config.num_warps,
                         num_stages=config.num_stages, maxnreg=config.maxnreg)


_kernels = None

if HAS_TRITON:
    from triton.runtime.autotuner import Heuristics

    class _Derived(Heuristics):
        """triton.heuristics that makes the dict of a launch's arguments once for all its rules,
        where Triton's makes it for each (some fifty arguments; docs/performance/launch_host.py
        times the launch path). The rules read the arguments and the config, not one another's
        results."""

        def run(self, *args, **kwargs):
            known = {**dict(zip(self.arg_names, args)), **kwargs}
            kwargs.update({name: rule(known) for name, rule in self.values.items()})
            return self.fn.run(*args, **kwargs)


def get_kernels():
    """(forward, dq, dk/dv, label sums): the first three autotuned on a GPU, fixed small blocks
    under the interpreter (where autotuning would only multiply the run time)."""
    global _kernels
    if _kernels is None:
        plain = (kernels.forward_kernel, kernels.backward_dq_kernel, kernels.backward_dkdv_kernel)
        if INTERPRETED:
            _kernels = tuple(_Derived(kernel, kernel.arg_names, heuristics(kernel)) for kernel in plain)
        else:
            # The wide bias's gradient rows are read-modify-written: zeroed again before each
            # configuration the autotuner tries, or its trial runs would add up in them.
            _kernels = tuple(
                triton.autotune(configs=configs(kernel_name(kernel)), key=_TUNE_KEY,
                                prune_configs_by={"early_config_prune": spill_free(kernel)},
                                reset_to_zero=["DBIAS"] if kernel is kernels.backward_dkdv_kernel else None)(
                    _Derived(kernel, kernel.arg_names, heuristics(kernel)))
                for kernel in plain)
        _kernels = (*_kernels, kernels.label_sums_kernel)
    return _kernels


def spill_free(kernel, capability: tuple[int, int] | None = None):
    """The autotuner's early_config_prune for `kernel`: of the configs, those whose compiled
    kernel spills nothing to the stack on this GPU (`capability`: another one's), so that a
    config the autotuner times can never be one that spills (a forward config that spills is
    offered as its `low_register_variant` where that does not); all of them if every one does,
    or if the check cannot run. It compiles each config once more, statically (`compiled.py`),
    once per autotuning key and then from Triton's cache."""
    def prune(configs: list, nargs: dict, **kwargs) -> list:
        from relpos_lab.core.attention import compiled

        if len(configs) == 1:
            return configs
        try:
            major, minor = capability or torch.cuda.get_device_capability()

            def spills(config) -> bool:
                known = {**nargs, **kwargs, **config.all_kwargs()}
                constexprs = {**kwargs, **{name: rule(known) for name, rule in heuristics(kernel).items()},
                              **config.kwargs}
                binary = compiled.compile_for(kernel, tuple(nargs.values()), constexprs, 10 * major + minor,
                                              config.num_warps, config.num_stages, config.maxnreg)
                return compiled.resources(binary)[1] > 0

            free = []
            for config in configs:
                if spills(config):
                    variant = low_register_variant(config) if kernel is kernels.forward_kernel else None
                    if variant is None or spills(variant):
                        continue
                    config = variant  # the same blocks with the band's addresses recomputed
                free.append(config)
        except Exception as error:  # the check must never keep the kernel from running
            warnings.warn(f"impl='triton': could not check the autotune configs for spills ({error!r}); "
                          "all of them are timed", RuntimeWarning, stacklevel=2)
            return configs
        return free or configs

    return prune
