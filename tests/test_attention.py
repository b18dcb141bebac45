"""relative_attention: every implementation equals the paper's equations, written out as loops."""
import math
import subprocess
import sys
import textwrap

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from relpos_lab.core.attention import banded, flex, gather, relative_attention
from relpos_lab.core.attention.masks import relative_labels

from tests.attention_cases import CASES, EMPTY_FIRST, SMALL, TILED, Case, build, definition, names

EXACT_IMPLS = ["naive", "batched", "gather", "flex", "auto"]


def by_the_equations(q, k, v, rel_k, rel_v, max_distance, mask, causal, offset, bias=None, rel_bias=None):
    """e_ij = q_i·(k_j + a^K_ij)/sqrt(D) + b_ij; z_i = Σ_j softmax(e)_ij (v_j + a^V_ij), element by
    element: the paper's equations as loops, which `definition` (tests/attention_cases.py) is checked
    against. b_ij = rel_bias[h, label] plus the dense bias[b, h, i, j]."""
    B, H, Lq, D = q.shape
    Lk = k.shape[2]
    out = torch.zeros(B, H, Lq, v.shape[-1], dtype=torch.float64)

    def table(t, h, label):
        return t[label] if t.dim() == 2 else t[h, label]

    for b in range(B):
        for h in range(H):
            for i in range(Lq):
                pos_i = offset + i
                visible, logits = [], []
                for j in range(Lk):
                    if mask is not None and not bool(mask.expand(B, H, Lq, Lk)[b, h, i, j]):
                        continue
                    if causal and j > pos_i:
                        continue
                    label = max(-max_distance, min(max_distance, j - pos_i)) + max_distance
                    key = k[b, h, j].double()
                    if rel_k is not None:
                        key = key + table(rel_k, h, label).double()
                    e = float(q[b, h, i].double() @ key) / math.sqrt(D)
                    if rel_bias is not None:
                        e += float(rel_bias[h, label])
                    if bias is not None:
                        e += float(bias.expand(B, H, Lq, Lk)[b, h, i, j])
                    visible.append((j, label))
                    logits.append(e)
                if not visible:
                    continue
                weights = torch.softmax(torch.tensor(logits, dtype=torch.float64), 0)
                for w, (j, label) in zip(weights, visible):
                    value = v[b, h, j].double()
                    if rel_v is not None:
                        value = value + table(rel_v, h, label).double()
                    out[b, h, i] += w * value
    return out


@pytest.mark.parametrize("case", names(SMALL, TILED))  # LONG's loops would take a minute
def test_the_shared_definition_is_the_papers_equations_element_by_element(case):
    q, k, v, kw = build(CASES[case])
    want = by_the_equations(q, k, v, kw["rel_k"], kw["rel_v"], kw["max_distance"], kw["attn_mask"],
                            kw["is_causal"], kw["query_offset"], kw["attn_bias"], kw["rel_bias"])
    torch.testing.assert_close(definition(q, k, v, **kw), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("impl", EXACT_IMPLS)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_the_definition(case, impl):
    q, k, v, kw = build(CASES[case])
    want = definition(q, k, v, **kw)
    got = relative_attention(q, k, v, impl=impl, **kw)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("impl", ["naive", "batched", "gather", "flex"])
def test_float32_agrees_with_naive_within_1e5(impl):
    q, k, v, kw = build(Case("float32", B=2, H=4, Lq=33, Lk=40, D=16, max_distance=4, offset=7, causal=True,
                             padding=EMPTY_FIRST), dtype=torch.float32)
    want = relative_attention(q, k, v, impl="naive", **kw)
    torch.testing.assert_close(relative_attention(q, k, v, impl=impl, **kw), want, atol=1e-5, rtol=1e-5)


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v, kw = build(CASES["padding_with_empty_row"])
    for impl in EXACT_IMPLS:
        out = relative_attention(q, k, v, impl=impl, **kw)
        assert torch.isfinite(out).all()
        assert out[0].abs().max() == 0


@pytest.mark.parametrize("block", [1, 3])
@pytest.mark.parametrize("lq,lk,max_distance,offset", [(37, 37, 3, 0), (13, 50, 2, 37), (1, 40, 4, 39), (20, 20, 25, 0),
                                               (9, 30, 0, 5)])
def test_label_maps_over_row_blocks_equal_gather_and_scatter_add(monkeypatch, block, lq, lk, max_distance, offset):
    # Small blocks put every row block's left tail, window and right tail to work.
    monkeypatch.setattr(gather, "_LABEL_BLOCK", block)
    g = torch.Generator().manual_seed(lq * lk + max_distance)
    labels = relative_labels(lq, lk, max_distance, offset).expand(2, 3, lq, lk)
    x = torch.randn(2, 3, lq, lk, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, lq, 2 * max_distance + 1, generator=g, dtype=torch.float64)
    torch.testing.assert_close(gather.add_by_label(x.clone(), w, max_distance, offset), x + w.gather(-1, labels))
    torch.testing.assert_close(gather.sum_by_label(x, max_distance, offset),
                               torch.zeros_like(w).scatter_add(-1, labels, x))


@pytest.mark.parametrize("case", ["square", "rect_offset_causal", "padding_with_empty_row", "per_head_causal_offset",
                                  "k1", "keys_only", "values_only"])
def test_gather_over_many_row_blocks_matches_the_reference_with_gradients(monkeypatch, case):
    monkeypatch.setattr(gather, "_LABEL_BLOCK", 1)  # blocks of max(1, 2k) rows
    q, k, v, kw = build(CASES[case])
    want = definition(q, k, v, **kw)
    torch.testing.assert_close(relative_attention(q, k, v, impl="gather", **kw), want, atol=1e-10, rtol=1e-10)
    leaves = [t.requires_grad_(True) for t in (q, k, v, kw["rel_k"], kw["rel_v"]) if t is not None]
    grads = []
    for impl in ("naive", "gather"):
        out = relative_attention(q, k, v, impl=impl, **kw)
        grads.append(torch.autograd.grad((out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum(),
                                         leaves))
    for g_ref, g in zip(*grads):
        torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)


GRAD_CASES = ["rect_offset_causal", "padding_with_empty_row", "per_head", "k_beyond_length", "keys_only", "values_only"]


@pytest.mark.parametrize("case", GRAD_CASES)
def test_gradients_agree_across_implementations(case):
    q, k, v, kw = build(CASES[case])
    leaves = [t for t in (q, k, v, kw["rel_k"], kw["rel_v"]) if t is not None]
    grads = {}
    for impl in ("naive", "batched", "gather"):
        for t in leaves:
            t.requires_grad_(True)
            t.grad = None
        out = relative_attention(q, k, v, impl=impl, **kw)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[impl] = [t.grad.clone() for t in leaves]
    for impl in ("batched", "gather"):
        for g_ref, g in zip(grads["naive"], grads[impl]):
            torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("impl", ["gather", "batched"])
@pytest.mark.parametrize("per_head", [False, True])
def test_gradcheck(impl, per_head):
    q, k, v, kw = build(Case("gradcheck", B=1, H=2, Lq=3, Lk=4, D=4, max_distance=1, offset=1, causal=True,
                             per_head=per_head))
    rel_k, rel_v = kw.pop("rel_k"), kw.pop("rel_v")
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, rel_k, rel_v))

    def f(q, k, v, rel_k, rel_v):
        return relative_attention(q, k, v, rel_k=rel_k, rel_v=rel_v, impl=impl, **kw)

    assert torch.autograd.gradcheck(f, inputs)


def test_gradcheck_through_masks_and_a_row_that_sees_nothing():
    """The masked logits pass their gradient through (it is zero there): checked numerically."""
    q, k, v, kw = build(Case("gradcheck", B=2, H=1, Lq=4, Lk=4, D=4, max_distance=1, causal=True,
                             padding=EMPTY_FIRST))
    assert not kw["attn_mask"][0].any()  # sequence 0: every row fully masked
    rel_k, rel_v = kw.pop("rel_k"), kw.pop("rel_v")
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, rel_k, rel_v))
    for impl in ("gather", "naive"):
        assert torch.autograd.gradcheck(
            lambda *x: relative_attention(*x[:3], rel_k=x[3], rel_v=x[4], impl=impl, **kw), inputs)


HALF = Case("half", B=2, H=2, Lq=16, Lk=16, D=16, max_distance=3, causal=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("impl", ["naive", "batched", "gather"])
def test_half_inputs_give_half_outputs_close_to_float32(impl, dtype):
    q, k, v, kw = build(HALF, dtype=torch.float32)
    want = relative_attention(q, k, v, impl="naive", **kw)
    half = {n: (t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t) for n, t in kw.items()}
    got = relative_attention(q.to(dtype), k.to(dtype), v.to(dtype), impl=impl, **half)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


@pytest.mark.parametrize("impl", ["naive", "batched", "gather", "flex"])
def test_half_inputs_with_float32_tables(impl):
    """A training loop without autocast: bf16 activations, the position tables still float32."""
    q, k, v, kw = build(HALF, dtype=torch.float32)
    want = relative_attention(q, k, v, impl="naive", **kw)
    got = relative_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), impl=impl, **kw)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want, atol=5e-2, rtol=5e-2)


def test_flex_runs_on_cpu_with_the_default_settings():
    """FLEX_COMPILE stays on: torch's CPU compiler cannot return the log-sum-exp, so CPU runs eager."""
    assert flex.FLEX_COMPILE
    q, k, v, kw = build(Case("flex", B=1, H=2, Lq=8, Lk=8, D=8, max_distance=2, causal=True), dtype=torch.float32)
    torch.testing.assert_close(relative_attention(q, k, v, impl="flex", **kw),
                               relative_attention(q, k, v, impl="naive", **kw), atol=1e-5, rtol=1e-5)


class SoftmaxDtypes(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.dtypes = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten._softmax, torch.ops.aten._safe_softmax):
            self.dtypes.add(args[0].dtype)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("impl", ["naive", "batched", "gather"])
@pytest.mark.parametrize("dtype,acc", [(torch.bfloat16, torch.float32), (torch.float16, torch.float32),
                                       (torch.float32, torch.float32), (torch.float64, torch.float64)])
def test_softmax_runs_in_at_least_float32(impl, dtype, acc):
    q, k, v, kw = build(CASES["per_head"], dtype=dtype)
    with SoftmaxDtypes() as probe:
        relative_attention(q, k, v, impl=impl, **kw)
    assert probe.dtypes == {acc}


def test_dropout_hits_both_value_terms_identically_across_impls():
    q, k, v, kw = build(CASES["square"])
    outs = []
    for impl in ("naive", "batched", "gather"):
        torch.manual_seed(123)
        outs.append(relative_attention(q, k, v, impl=impl, dropout_p=0.5, **kw))
    torch.testing.assert_close(outs[1], outs[0])
    torch.testing.assert_close(outs[2], outs[0])
    torch.manual_seed(7)
    assert not torch.allclose(relative_attention(q, k, v, impl="naive", dropout_p=0.5, **kw), outs[0])


def test_auto_without_tables_equals_plain_attention_with_offset_causality():
    q, k, v, kw = build(Case("plain", B=2, H=2, Lq=3, Lk=6, D=4, max_distance=0, offset=3, causal=True,
                             padding=EMPTY_FIRST, use_k=False, use_v=False), dtype=torch.float32)
    torch.testing.assert_close(relative_attention(q, k, v, impl="auto", **kw),
                               relative_attention(q, k, v, impl="naive", **kw), atol=1e-6, rtol=1e-6)


def test_bad_arguments_are_clear_errors():
    q, k, v, kw = build(CASES["square"])
    with pytest.raises(ValueError, match="unknown attention impl 'fast'"):
        relative_attention(q, k, v, impl="fast", **kw)
    with pytest.raises(ValueError, match="rel_k has shape"):
        relative_attention(q, k, v, rel_k=torch.zeros(3, 4, dtype=q.dtype), max_distance=2)
    with pytest.raises(TypeError, match="must be bool"):
        relative_attention(q, k, v, attn_mask=torch.zeros(5, 5))
    with pytest.raises(ValueError, match="dropout"):
        relative_attention(q, k, v, impl="flex", dropout_p=0.1, **kw)


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op (forward or backward) produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("per_head", [False, True])
def test_gather_never_materialises_an_lq_lk_d_tensor(per_head):
    B, H, L, D, K = 1, 2, 64, 32, 4
    q, k, v, kw = build(Case("long", B=B, H=H, Lq=L, Lk=L, D=D, max_distance=K, causal=True, per_head=per_head),
                        dtype=torch.float32)
    sizes = {}
    for impl in ("naive", "gather"):
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v, kw["rel_k"], kw["rel_v"])]
        with LargestTensor() as probe:
            out = relative_attention(*leaves[:3], impl=impl, **{**kw, "rel_k": leaves[3], "rel_v": leaves[4]})
            out.sum().backward()
        sizes[impl] = probe.largest
    assert sizes["naive"] >= L * L * D
    assert sizes["gather"] <= B * H * L * L  # the attention matrix itself is the largest tensor


PEAK_SCRIPT = textwrap.dedent("""
    import resource, sys, torch
    from relpos_lab.core.attention import relative_attention
    torch.set_num_threads(1)
    L, D, K = 1024, 64, 16
    q, k, v = (torch.randn(1, 1, L, D, requires_grad=True) for _ in range(3))
    rk, rv = (torch.randn(2 * K + 1, D, requires_grad=True) for _ in range(2))
    def step(n):
        out = relative_attention(q[..., :n, :], k[..., :n, :], v[..., :n, :], rel_k=rk, rel_v=rv,
                                 max_distance=K, is_causal=True, impl=sys.argv[1])
        out.sum().backward()
    step(64)  # warm up allocator and kernels
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    step(L)
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024)
""")


def test_gather_peak_memory_is_far_below_naive_at_long_length():
    """Real peak RSS of forward+backward at L=1024, D=64: naive holds L·L·D floats (256 MiB)."""
    peaks = {}
    for impl in ("naive", "gather"):
        res = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, impl], capture_output=True, text=True, check=True)
        peaks[impl] = int(res.stdout.strip().splitlines()[-1])
    assert peaks["naive"] > 256 * 2**20
    assert peaks["gather"] < peaks["naive"] / 4, peaks


BANDED_CASES = {case.name: case for case in (  # banded's own: Lq = Lk, no offset, 1 <= k < L
    Case("bidirectional", B=2, H=3, Lq=13, Lk=13, D=4, max_distance=2),
    Case("bidirectional_padding", B=3, H=2, Lq=11, Lk=11, D=4, max_distance=3, padding=EMPTY_FIRST),
    Case("causal_padding", B=3, H=2, Lq=11, Lk=11, D=4, max_distance=2, padding=EMPTY_FIRST, causal=True),
    Case("causal_k1", B=2, H=2, Lq=9, Lk=9, D=4, max_distance=1, causal=True),
    Case("per_head_values_only", B=2, H=3, Lq=10, Lk=10, D=4, max_distance=4, per_head=True, use_k=False),
    Case("keys_only_long_k", B=1, H=2, Lq=40, Lk=40, D=4, max_distance=17, use_v=False),
)}


@pytest.mark.parametrize("case", list(BANDED_CASES))
def test_banded_matches_the_definition_and_naive_gradients(case):
    q, k, v, kw = build(BANDED_CASES[case])
    want = definition(q, k, v, **kw)
    leaves = [t for t in (q, k, v, kw["rel_k"], kw["rel_v"]) if t is not None]
    grads = {}
    for impl in ("naive", "banded"):
        for t in leaves:
            t.requires_grad_(True)
            t.grad = None
        out = relative_attention(q, k, v, impl=impl, **kw)
        if impl == "banded":
            torch.testing.assert_close(out.detach(), want, atol=1e-10, rtol=1e-10)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        grads[impl] = [t.grad.clone() for t in leaves]
    for g_ref, g in zip(grads["naive"], grads["banded"]):
        torch.testing.assert_close(g, g_ref, atol=1e-10, rtol=1e-10)


def test_banded_gradcheck_through_the_flash_log_sum_exp():
    q, k, v, kw = build(Case("gradcheck", B=1, H=1, Lq=5, Lk=5, D=2, max_distance=1, padding=EMPTY_FIRST))
    kw["attn_mask"][0] = True
    rel_k, rel_v = kw.pop("rel_k"), kw.pop("rel_v")
    inputs = tuple(t.requires_grad_(True) for t in (q, k, v, rel_k, rel_v))
    assert torch.autograd.gradcheck(
        lambda *x: relative_attention(x[0], x[1], x[2], rel_k=x[3], rel_v=x[4], impl="banded", **kw), inputs,
        fast_mode=True)


def test_banded_refuses_what_it_cannot_compute():
    q, k, v, kw = build(CASES["rect_offset_causal"])
    with pytest.raises(ValueError, match="impl='banded' does not support Lq != Lk"):
        relative_attention(q, k, v, impl="banded", **kw)


@pytest.mark.parametrize("case", list(BANDED_CASES))
def test_banded_with_flex_tails_matches_the_definition(case):
    """CUDA's banded runs its tails through FlexAttention with block masks: the same core is
    checked here with eager flex on CPU (forward; flex's backward needs CUDA, tests/test_cuda.py)."""
    q, k, v, kw = build(BANDED_CASES[case])
    want = definition(q, k, v, **kw)
    n, max_distance, mask = q.shape[-2], kw["max_distance"], kw["attn_mask"]
    keep = mask.reshape(mask.shape[0], n).expand(q.shape[0], n) if mask is not None else None
    masks = tuple(flex.flex_block_mask(mask, False, n, n, 0, side, max_distance, "cpu") for side in ("left", "right"))
    got = banded._banded_core(q, k, v, kw["rel_k"], kw["rel_v"], max_distance, keep, kw["is_causal"],
                              q.shape[-1] ** -0.5, masks, False)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


def test_flex_block_masks_are_built_once_per_mask_tensor():
    """Layers share one padding mask per batch: its BlockMask is built once; a new tensor with
    the same values (or the same one changed in place) gets its own."""
    mask = torch.ones(2, 1, 1, 8, dtype=torch.bool)
    first = flex.flex_block_mask(mask, False, 8, 8, 0, "left", 2, "cpu")
    assert flex.flex_block_mask(mask, False, 8, 8, 0, "left", 2, "cpu") is first
    assert flex.flex_block_mask(mask.clone(), False, 8, 8, 0, "left", 2, "cpu") is not first
    mask[1, ..., 5:] = False
    changed = flex.flex_block_mask(mask, False, 8, 8, 0, "left", 2, "cpu")
    assert changed is not first
    assert flex.flex_block_mask(None, False, 8, 8, 0, None, 2, "cpu") is None


@pytest.mark.slow  # torch.compile on CPU, ~40 s, for an opt-in path (BANDED_COMPILE is off by default)
def test_banded_core_compiles_to_the_same_values_and_gradients():
    """banded's core compiles (BANDED_COMPILE) to what it computes eagerly (here on CPU)."""
    q, k, v, kw = build(Case("compiled", B=2, H=2, Lq=40, Lk=40, D=16, max_distance=4, padding=EMPTY_FIRST),
                        dtype=torch.float32)
    keep = kw["attn_mask"].reshape(2, 40)
    keep[0] = True
    inputs = [t.requires_grad_(True) for t in (q, k, v, kw["rel_k"], kw["rel_v"])]

    def core(fn):
        out = fn(*inputs, 4, keep, False, 0.25, None, False)
        return [out] + list(torch.autograd.grad(out.square().sum(), inputs))

    for got, want in zip(core(torch.compile(banded._banded_core)), core(banded._banded_core)):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
