"""What `relpos-lab bench attention` measures: one closure per attention candidate (SDPA, flash,
FlexAttention, each `impl` of relative_attention, the unfused reference) on the masks training
uses, and a candidate's peak memory (on CPU in a fresh subprocess, the only honest CPU peak)."""
from __future__ import annotations

import json
import math
import resource
import subprocess
import sys

import torch
import torch.nn.functional as F

from relpos_lab.core.attention import relative_attention
from relpos_lab.core.attention.flex import flex_attention_lse, flex_block_mask
from relpos_lab.core.attention.masks import visibility_mask

MASKS = ("none", "padding", "causal")


def attention_mask(mask: str, b: int, length: int, device) -> tuple[torch.Tensor | None, bool]:
    """(key mask, is_causal) of a batch as training sees it: `padding` gives the sequences lengths
    from `length` down to about 3/4 of it (an encoder's self-attention); `causal` adds causality
    (a decoder's)."""
    if mask not in MASKS:
        raise ValueError(f"unknown mask {mask!r}; choose one of {', '.join(MASKS)}")
    if mask == "none":
        return None, False
    lengths = torch.tensor([length - (length // 4) * i // max(b - 1, 1) for i in range(b)], device=device)
    keys = (torch.arange(length, device=device)[None, :] < lengths[:, None])[:, None, None, :]
    return keys, mask == "causal"


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor | None, causal: bool,
          allowed: torch.Tensor | None):
    """torch's attention with no more mask than the case needs (none: CUDA may pick its flash kernel)."""
    def forward():
        if allowed is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=False)
        if keys is None and causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    return forward


def attention_candidate(name: str, b, h, length, d, k, dtype, device, backward=True, mask="none"):
    """A closure running one forward(+backward) of attention candidate `name`."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def leaf(*shape):
        return torch.randn(*shape, generator=g).to(device=device, dtype=dtype).requires_grad_(backward)

    q, kk, v = leaf(b, h, length, d), leaf(b, h, length, d), leaf(b, h, length, d)
    rel_k, rel_v = leaf(2 * k + 1, d), leaf(2 * k + 1, d)
    keys, causal = attention_mask(mask, b, length, device)
    allowed = visibility_mask(keys, causal, length, length, 0, device)

    if name == "sdpa":
        forward = _sdpa(q, kk, v, keys, causal, allowed)
    elif name == "flash":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def forward():  # flash attention without positions; padding cannot be expressed, causality can
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return F.scaled_dot_product_attention(q, kk, v, is_causal=causal)
    elif name == "flex-bias":
        bias = leaf(h, 2 * k + 1).detach().mul_(0.1).requires_grad_(backward)
        block_mask = flex_block_mask(keys, causal, length, length, 0, None, k, device)
        clip = torch.full((), k, device=device)

        def score_mod(score, bi, hi, q_idx, kv_idx):  # a learned bias per head and clipped distance
            return score + bias[hi, torch.clamp(kv_idx - q_idx, -clip, clip) + clip]

        def forward():
            return flex_attention_lse(q, kk, v, d ** -0.5, score_mod, block_mask)[0]
    elif name == "triton-bias":  # the same learned bias as rel_bias in the fused kernel
        bias = leaf(h, 2 * k + 1).detach().mul_(0.1).requires_grad_(backward)

        def forward():
            return relative_attention(q, kk, v, rel_bias=bias, max_distance=k, impl="triton", attn_mask=keys,
                                      is_causal=causal)
    elif name == "unfused":
        def forward():
            s = (q @ kk.transpose(-2, -1)).float() / math.sqrt(d)
            if allowed is not None:
                s = s.masked_fill(~allowed, torch.finfo(s.dtype).min)
            return torch.softmax(s, dim=-1).to(dtype) @ v
    else:
        impl = name.removeprefix("shaw-")

        def forward():
            return relative_attention(q, kk, v, rel_k=rel_k, rel_v=rel_v, max_distance=k, impl=impl,
                                      attn_mask=keys, is_causal=causal)

    grad = torch.randn(b, h, length, d, generator=g).to(device=device, dtype=dtype)

    def run():
        out = forward()
        if backward:
            out.backward(grad)
            for t in (q, kk, v, rel_k, rel_v):
                t.grad = None
    return run


# The peak comes from /proc/self/status (VmHWM, this process's own high-water mark) where there is
# one: on Linux, ru_maxrss of a child starts at its parent's peak, so after the timings of a long
# benchmark it hides the child's growth completely (every candidate read 0 MB).
def peak_kb() -> int:
    """This process's peak resident memory so far, in KiB (the only honest CPU peak)."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def peak_in_subprocess(snippet: str, args: dict, what: str) -> float:
    """MiB that `snippet` (run with `args` as JSON in a fresh interpreter) prints as its peak's growth."""
    res = subprocess.run([sys.executable, "-c", snippet, json.dumps(args)], capture_output=True, text=True)
    if res.returncode:
        raise RuntimeError(f"peak-memory probe for {what} failed:\n{res.stderr[-2000:]}")
    return float(res.stdout.strip().splitlines()[-1])


PEAK_SNIPPET = """
import json, sys, torch
from relpos_lab.analysis.candidates import attention_candidate, peak_kb

args = json.loads(sys.argv[1])
torch.set_num_threads(args.pop("threads"))
dtype = getattr(torch, args.pop("dtype"))
small = attention_candidate(args["name"], args["b"], args["h"], 16, args["d"], args["k"], dtype, torch.device("cpu"),
                            mask=args["mask"])
small()
base = peak_kb()
run = attention_candidate(args["name"], args["b"], args["h"], args["length"], args["d"], args["k"], dtype,
                          torch.device("cpu"), mask=args["mask"])
run()
print((peak_kb() - base) / 1024)
"""


def peak_memory_mb(name, b, h, length, d, k, dtype, device, threads, mask="none") -> float:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        attention_candidate(name, b, h, length, d, k, dtype, device, mask=mask)()
        torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    args = dict(name=name, b=b, h=h, length=length, d=d, k=k, dtype=str(dtype).removeprefix("torch."), threads=threads,
                mask=mask)
    return peak_in_subprocess(PEAK_SNIPPET, args, name)
