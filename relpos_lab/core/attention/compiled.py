"""What ptxas makes of a Triton kernel, without a GPU: compile for any CUDA target on the CPU
and read the cubin back with the cuobjdump that the triton wheel ships. `bench kernel --static`
measures the fused kernel this way, and the fused path's autotuner uses it to offer only configs
that do not spill (`fused_tuning.spill_free`)."""
from __future__ import annotations

import os
import re
import subprocess
import tempfile

import torch


def _tools() -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_for(kernel, args: tuple, constexprs: dict, sm: int, num_warps: int, num_stages: int,
                maxnreg: int | None = None):
    """Compile a @triton.jit kernel for CUDA sm_<sm>, specialising the arguments as a launch would
    (`maxnreg`: the registers a thread may hold, as triton.Config's)."""
    import triton
    from triton.backends.compiler import BaseBackend, GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.jit import MockTensor, native_specialize_impl

    signature, attrs, constants = {}, {}, {}
    for index, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name], constants[name] = "constexpr", constexprs[name]
            continue
        value = args[index] if index < len(args) else None
        if isinstance(value, torch.Tensor):
            value = MockTensor(value.dtype)
        kind, attr = native_specialize_impl(BaseBackend, value, False, True, True)
        signature[name] = kind
        if kind == "constexpr":
            constants[name] = attr
        elif attr:
            attrs[(index,)] = BaseBackend.parse_attr(attr)
    source = ASTSource(kernel, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", sm, 32),
                          options={"num_warps": num_warps, "num_stages": num_stages,
                                   **({"maxnreg": maxnreg} if maxnreg else {})})


def cuobjdump(compiled, *flags: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        return subprocess.run([os.path.join(_tools(), "cuobjdump"), *flags, f.name], capture_output=True,
                              text=True, check=True).stdout


def resources(compiled) -> tuple[int, int]:
    """(registers, stack bytes) per thread, as ptxas allocated them."""
    usage = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump(compiled, "--dump-resource-usage"))
    return int(usage.group(1)), int(usage.group(2))
