"""The fused Triton kernel (`impl="triton"`) against the float64 definition.

On CPU the very kernel code runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET
before triton is imported), so these prove exactness without a GPU: outputs and the gradients of
q, k, v, rel_k, rel_v and rel_bias, over lengths that are not multiples of the block (16 here),
cross lengths with a query offset, per-head tables, each term alone, k = 0, 1, 16 and k ≥ L,
padding, causality and rows that see nothing; the band in tiles of 8 and of 16. On a GPU the same tests run
compiled (-m cuda).
"""
from __future__ import annotations

import pytest
import torch

from relpos_lab.core.attention import fused, relative_attention
from relpos_lab.core.attention.masks import offset_bias
from relpos_lab.core.positions import builtin_config
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig

from tests import attention_cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    fused.unsupported(*([torch.zeros(1, 1, 2, 16, device=DEVICE)] * 3), rel_k=None, rel_v=None, rel_bias=None,
                      max_distance=0, attn_mask=None, is_causal=False, query_offset=0, dropout_p=0.0, attn_bias=None)
    is not None, reason="triton is not installed, or neither CUDA nor TRITON_INTERPRET=1")


def definition(q, k, v, rel_k, rel_v, rel_bias, kmax, keep, causal, offset, dropped=None, dropout_p=0.0,
               dense_mask=None):
    """tests/attention_cases.py's float64 definition, with this file's arguments: `keep` (B, Lk) the
    real keys, `dense_mask` a mask broadcastable to (B, H, Lq, Lk) beside it."""
    mask = keep[:, None, None, :] if keep is not None else None
    if dense_mask is not None:
        mask = dense_mask if mask is None else mask & dense_mask
    return attention_cases.definition(q, k, v, rel_k=rel_k, rel_v=rel_v, rel_bias=rel_bias, max_distance=kmax,
                                      attn_mask=mask, is_causal=causal, query_offset=offset, dropped=dropped,
                                      dropout_p=dropout_p)


def make(b=2, h=3, lq=37, lk=None, d=24, kmax=4, per_head=False, use_k=True, use_v=True, use_bias=True,
         padding=False, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    lk = lq if lk is None else lk

    def leaf(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE).requires_grad_()

    table = (h, 2 * kmax + 1, d) if per_head else (2 * kmax + 1, d)
    keep = None
    if padding:
        lengths = torch.randint(1, lk + 1, (b,), generator=g)
        lengths[0] = lk
        keep = (torch.arange(lk)[None, :] < lengths[:, None]).to(DEVICE)
    return dict(q=leaf(b, h, lq, d), k=leaf(b, h, lk, d), v=leaf(b, h, lk, d),
                rel_k=leaf(*table) if use_k else None, rel_v=leaf(*table) if use_v else None,
                rel_bias=leaf(h, 2 * kmax + 1) if use_bias else None, keep=keep)


def check_against_definition(case, kmax, causal=False, offset=0, atol=2e-5, rtol=1e-4):
    q, k, v, rel_k, rel_v, rel_bias, keep = (case[n] for n in ("q", "k", "v", "rel_k", "rel_v", "rel_bias", "keep"))
    mask = keep[:, None, None, :] if keep is not None else None
    out = relative_attention(q, k, v, rel_k=rel_k, rel_v=rel_v, rel_bias=rel_bias, max_distance=kmax,
                             attn_mask=mask, is_causal=causal, query_offset=offset, impl="triton")
    want = definition(q, k, v, rel_k, rel_v, rel_bias, kmax, keep, causal, offset)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)
    leaves = [t for t in (q, k, v, rel_k, rel_v, rel_bias) if t is not None]
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad_out)
    expected = torch.autograd.grad(want, leaves, grad_out.double())
    for name, a, e in zip(("q", "k", "v", "rel_k", "rel_v", "rel_bias"), got, expected):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), e.double(), atol=atol * max(1.0, e.abs().max().item()), rtol=rtol,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


CASES = {
    "odd length, shared tables and bias": (dict(lq=37), dict(kmax=4)),
    "per-head tables": (dict(lq=29, per_head=True), dict(kmax=3)),
    "keys only": (dict(lq=33, use_v=False, use_bias=False), dict(kmax=4)),
    "values only": (dict(lq=33, use_k=False, use_bias=False), dict(kmax=4)),
    "bias only": (dict(lq=33, use_k=False, use_v=False), dict(kmax=4)),
    "no relative terms": (dict(lq=21, use_k=False, use_v=False, use_bias=False), dict(kmax=2)),
    "k = 0": (dict(lq=23), dict(kmax=0)),
    "k = 1, many tiles off the band": (dict(lq=70, b=1, h=2), dict(kmax=1)),
    "k = 16": (dict(lq=45, b=1), dict(kmax=16)),
    "k >= L": (dict(lq=20, b=1), dict(kmax=50)),
    "head dimension 64": (dict(lq=19, d=64, b=1, h=2), dict(kmax=3)),
    "padding": (dict(lq=37, padding=True), dict(kmax=4)),
    "causal": (dict(lq=37), dict(kmax=4, causal=True)),
    "padding and causal": (dict(lq=37, padding=True), dict(kmax=4, causal=True)),
    "cross lengths": (dict(lq=13, lk=40, b=1), dict(kmax=5)),
    "prefill on a cache": (dict(lq=7, lk=40, b=1, per_head=True), dict(kmax=5, causal=True, offset=33)),
    "offset beyond the band, not causal": (dict(lq=9, lk=45, b=1), dict(kmax=2, offset=30)),
}


@pytest.mark.parametrize("name", CASES)
def test_matches_the_float64_definition_with_gradients(name):
    make_kwargs, check_kwargs = CASES[name]
    check_against_definition(make(kmax=check_kwargs["kmax"], **make_kwargs), **check_kwargs)


@pytest.mark.parametrize("name", ["odd length, shared tables and bias", "padding and causal", "cross lengths"])
def test_a_band_in_whole_blocks_matches_too(name, monkeypatch):
    """The interpreter cuts the band's 16-blocks in two, with plain fringe tiles beside it (as
    128-key blocks are cut on a GPU); configs whose BN is the cap keep them whole, and compile no
    fringe: that path, here with the band uncut."""
    monkeypatch.setattr(fused, "BAND_CAP", {"forward": 16, "dq": 16})
    make_kwargs, check_kwargs = CASES[name]
    check_against_definition(make(kmax=check_kwargs["kmax"], **make_kwargs), **check_kwargs)


NARROW_FRINGE_CASES = {
    **{name: CASES[name] for name in ("odd length, shared tables and bias", "k = 16", "cross lengths",
                                      "padding and causal", "padding", "values only",
                                      "offset beyond the band, not causal")},
    "lengths that fill the blocks": (dict(lq=64, b=1), dict(kmax=4)),
    "lengths that fill the blocks, with padding": (dict(lq=64, padding=True), dict(kmax=4)),
}


@pytest.mark.parametrize("name", NARROW_FRINGE_CASES)
def test_a_band_from_a_narrow_fringes_boundary_matches_too(name, monkeypatch):
    """On a GPU the band's 64-key tiles start at a multiple of 32, with 32-key fringes beside
    them, and end at Lk where the lengths fill the blocks; here 16-key band tiles from a
    multiple of 8, in 32-key blocks: band, wide and narrow fringes and the band moved back from
    Lk, as compiled. The forward runs both narrow fringes as one tile, or LEFT's alone beside
    −inf where RIGHT's is none (`fringe_pair`): both occur here."""
    monkeypatch.setattr(fused, "_INTERPRETER_BLOCKS", {"BLOCK_M": 16, "BLOCK_N": 32})
    monkeypatch.setattr(fused, "BAND_CAP", {"forward": 16, "dq": 16})
    make_kwargs, check_kwargs = NARROW_FRINGE_CASES[name]
    check_against_definition(make(kmax=check_kwargs["kmax"], **make_kwargs), **check_kwargs)


@pytest.mark.parametrize("shared", ["rel_k", "rel_v"])
def test_a_table_per_head_beside_one_the_heads_share(shared):
    """Both tables' gradients come from one launch of label_sums_kernel and one reduction over its
    shares; a table the heads share is summed over them too, one per head is not."""
    case = make(lq=29, per_head=True, kmax=3)
    g = torch.Generator().manual_seed(5)
    case[shared] = torch.randn(7, 24, generator=g).to(DEVICE).requires_grad_()
    check_against_definition(case, kmax=3)


@pytest.mark.parametrize("name", ["odd length, shared tables and bias", "padding and causal"])
def test_a_register_capped_forward_writes_the_same_tables(name, monkeypatch):
    """With w^K and w^V the forward writes each interior logit over the logit term it has read;
    under a register cap at the address it computes again (fused.low_registers), else at the
    load's: that other path, here."""
    monkeypatch.setattr(fused, "low_registers", lambda meta: True)
    make_kwargs, check_kwargs = CASES[name]
    check_against_definition(make(kmax=check_kwargs["kmax"], **make_kwargs), **check_kwargs)


@pytest.mark.parametrize("name", ["odd length, shared tables and bias", "padding and causal", "k = 16",
                                  "prefill on a cache", "wide bias, causal with padding"])
def test_dkdv_in_half_height_band_tiles_matches(name, monkeypatch):
    """Under a register cap dk/dv runs its band in tiles of half the block's rows
    (fused.band_rows): that path, here, a wide rel_bias's diagonals included."""
    monkeypatch.setattr(fused, "band_rows", lambda meta: meta["BLOCK_M"] // 2)
    if name.startswith("wide bias"):
        monkeypatch.setattr(fused, "MAX_LABELS", 16)
        make_kwargs, check_kwargs = WIDE_CASES["causal with padding"]
        make_kwargs = {**make_kwargs, "use_k": False, "use_v": False}
    else:
        make_kwargs, check_kwargs = CASES[name]
    check_against_definition(make(kmax=check_kwargs["kmax"], **make_kwargs), **check_kwargs)


@pytest.mark.parametrize("shape", ["prefix (B, 1, Lq, Lk)", "per head (B, H, Lq, Lk)", "shared (Lq, Lk)"])
def test_dense_masks_are_read_tile_by_tile(shape):
    """A prefix LM's mask (the source sees all of itself, the target is causal) and arbitrary masks."""
    case = make(lq=30, lk=30)
    g = torch.Generator().manual_seed(4)
    if shape.startswith("prefix"):
        prefix = torch.tensor([9, 17])
        j, i = torch.arange(30)[None, None, :], torch.arange(30)[None, :, None]
        mask = ((j <= i) | (j < prefix[:, None, None]))[:, None]
    elif shape.startswith("per head"):
        mask = torch.rand(2, 3, 30, 30, generator=g) < 0.7
    else:
        mask = torch.rand(30, 30, generator=g) < 0.7
    mask = mask.to(DEVICE)
    leaves = [case[n] for n in ("q", "k", "v", "rel_k", "rel_v", "rel_bias")]
    out = relative_attention(*leaves[:3], rel_k=case["rel_k"], rel_v=case["rel_v"], rel_bias=case["rel_bias"],
                             max_distance=4, attn_mask=mask, impl="triton")
    want = definition(*leaves, 4, None, False, 0, dense_mask=mask)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    grad_out = torch.randn_like(out)
    for a, e in zip(torch.autograd.grad(out, leaves, grad_out), torch.autograd.grad(want, leaves, grad_out.double())):
        torch.testing.assert_close(a.double(), e.double(), atol=2e-5 * max(1.0, e.abs().max().item()), rtol=1e-4)


WIDE_CASES = {
    "every offset": (dict(lq=37), dict(kmax=40)),
    "clipped": (dict(lq=37, padding=True), dict(kmax=12)),
    "causal with padding": (dict(lq=37, padding=True), dict(kmax=20, causal=True)),
    "prefill on a cache": (dict(lq=9, lk=41, b=1), dict(kmax=45, causal=True, offset=32)),
    "cross lengths, offset": (dict(lq=21, lk=50, b=1), dict(kmax=60, offset=7)),
}


@pytest.mark.parametrize("name", WIDE_CASES)
def test_a_wide_rel_bias_alone_is_read_per_tile_and_reduced_along_diagonals(name, monkeypatch):
    """Tables too wide for the label space in registers (here: wider than 16 labels): the bias is
    loaded per tile and its gradient summed along each tile's diagonals."""
    monkeypatch.setattr(fused, "MAX_LABELS", 16)
    make_kwargs, check_kwargs = WIDE_CASES[name]
    case = make(kmax=check_kwargs["kmax"], use_k=False, use_v=False, **make_kwargs)
    assert fused._bias_is_wide(None, None, case["rel_bias"], check_kwargs["kmax"])
    check_against_definition(case, **check_kwargs)


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_of_minus_inf_edge_biases_matches(causal):
    """rel_bias −inf at labels 0 and 2k: every key farther than k − 1 is out of reach. The stages
    off the band keep their row maximum less that term (floored at −2²⁰), and give nothing."""
    case = make(lq=45, b=1, kmax=4)
    with torch.no_grad():
        case["rel_bias"][:, 0] = float("-inf")
        case["rel_bias"][:, -1] = float("-inf")
    check_against_definition(case, kmax=4, causal=causal)


def test_rows_that_see_nothing_are_zero_with_zero_gradients():
    case = make(lq=17, lk=17, b=2)
    keep = torch.ones(2, 17, dtype=torch.bool, device=DEVICE)
    keep[1] = False  # the second sequence: every key is padding
    out = relative_attention(case["q"], case["k"], case["v"], rel_k=case["rel_k"], rel_v=case["rel_v"],
                             rel_bias=case["rel_bias"], max_distance=4, attn_mask=keep[:, None, None, :],
                             impl="triton")
    assert out[1].abs().max() == 0
    grads = torch.autograd.grad(out.sum(), [case["q"], case["k"], case["v"]])
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0][1].abs().max() == 0 and grads[1][1].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_stay_within_half_rounding(dtype):
    if dtype == torch.bfloat16 and fused.INTERPRETED:
        pytest.skip("Triton 3.6's interpreter computes bfloat16 dots wrongly (numpy has no bfloat16); -m cuda")
    case = make(lq=33, padding=True, dtype=dtype)
    out = relative_attention(case["q"], case["k"], case["v"], rel_k=case["rel_k"], rel_v=case["rel_v"],
                             rel_bias=case["rel_bias"], max_distance=4,
                             attn_mask=case["keep"][:, None, None, :], impl="triton")
    want = definition(case["q"], case["k"], case["v"], case["rel_k"], case["rel_v"], case["rel_bias"], 4,
                      case["keep"], False, 0)
    assert out.dtype == dtype
    assert (out.double() - want).norm() / want.norm() < 2e-2


def test_float32_tables_with_half_inputs_are_cast_as_the_kernels_load_them():
    """Under autocast w^K and w^V are float32 parameters and q, k, v half: the kernels cast the
    tables as they load them, the same rounding as casting them first, and the tables' gradients
    come back in their own dtype."""
    case = make(lq=29, kmax=3, use_bias=False)
    runs = {}
    for table_dtype in (torch.float32, torch.float16):
        q, k, v = (case[n].detach().half().requires_grad_() for n in ("q", "k", "v"))
        rel_k, rel_v = (case[n].detach().to(table_dtype).requires_grad_() for n in ("rel_k", "rel_v"))
        out = relative_attention(q, k, v, rel_k=rel_k, rel_v=rel_v, max_distance=3, impl="triton")
        grads = torch.autograd.grad(out, (q, k, v, rel_k, rel_v), torch.ones_like(out))
        runs[table_dtype] = out, grads
    (out32, grads32), (out16, grads16) = runs[torch.float32], runs[torch.float16]
    assert torch.equal(out32, out16)
    for a, b in zip(grads32[:3], grads16[:3]):
        assert torch.equal(a, b)
    assert grads32[3].dtype == torch.float32 and torch.equal(grads32[3].half(), grads16[3])
    assert grads32[4].dtype == torch.float32 and torch.equal(grads32[4].half(), grads16[4])


def test_rel_bias_equals_the_dense_bias_it_stands_for_in_every_impl():
    case = make(lq=19, use_k=False, use_v=False)
    dense = offset_bias(case["rel_bias"], 19, 19, 4)
    want = relative_attention(case["q"], case["k"], case["v"], attn_bias=dense, max_distance=4, impl="naive")
    for impl in ("naive", "batched", "gather", "triton", "auto"):
        got = relative_attention(case["q"], case["k"], case["v"], rel_bias=case["rel_bias"], max_distance=4,
                                 impl=impl)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=lambda m, impl=impl: f"{impl}: {m}")


def test_refusals_name_what_is_unsupported():
    case = make(lq=8, use_bias=False)
    q, k, v = case["q"], case["k"], case["v"]
    with pytest.raises(ValueError, match=r"impl='triton' does not support a dense attn_bias"):
        relative_attention(q, k, v, rel_k=case["rel_k"], max_distance=4, attn_bias=torch.zeros(8, 8), impl="triton")
    with pytest.raises(ValueError, match=r"rel_bias has shape \(3, 5\); expected .* \(3, 9\)"):
        relative_attention(q, k, v, rel_bias=torch.zeros(3, 5), max_distance=4, impl="triton")


# alibi takes t5_bias's wide-bias path with a fixed bias; t5_bias's kernels are checked against
# float64 with gradients above (bias only): both slow only (20-30 s in the interpreter)
@pytest.mark.parametrize("scheme", ["shaw", pytest.param("alibi", marks=pytest.mark.slow),
                                    pytest.param("t5_bias", marks=pytest.mark.slow)])
def test_a_few_training_steps_match_gather_in_loss_and_gradients(scheme, monkeypatch):
    """The kernel inside the model: encoder padding, decoder causality, cross attention without
    tables; Shaw's tables, ALiBi's fixed and T5's learned rel_bias (wide: read per tile)."""
    monkeypatch.setattr(fused, "MAX_LABELS", 16)  # ALiBi and T5 take the wide path at these lengths
    fields = {"shaw": {"max_distance": 3}, "t5_bias": {"t5_num_buckets": 8, "t5_max_distance": 12}}.get(scheme, {})

    def model(impl):
        torch.manual_seed(0)
        cfg = ModelConfig(src_vocab_size=11, tgt_vocab_size=11, d_model=32, n_heads=2, d_ff=64, n_encoder_layers=1,
                          n_decoder_layers=1, dropout=0.0, attention_dropout=0.0, attention_impl=impl,
                          positions=builtin_config(scheme, **fields))
        return EncoderDecoder(cfg).to(DEVICE)

    models = {impl: model(impl) for impl in ("gather", "triton")}
    opts = {impl: torch.optim.SGD(m.parameters(), lr=0.1) for impl, m in models.items()}
    g = torch.Generator().manual_seed(1)
    for _ in range(2):
        src = torch.randint(3, 11, (3, 19), generator=g).to(DEVICE)
        src[1, 13:] = 0  # padding
        tgt = torch.randint(3, 11, (3, 18), generator=g).to(DEVICE)
        losses, grads = {}, {}
        for impl, m in models.items():
            logits = m(src, tgt[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten())
            opts[impl].zero_grad()
            loss.backward()
            losses[impl] = loss.item()
            grads[impl] = [p.grad.clone() for p in m.parameters()]
            opts[impl].step()
        assert losses["triton"] == pytest.approx(losses["gather"], abs=1e-5)
        for a, b in zip(grads["triton"], grads["gather"]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def dropout_run(case, seed, dropout_p=0.3, **kw):
    torch.manual_seed(seed)
    return relative_attention(case["q"], case["k"], case["v"], rel_k=case["rel_k"], rel_v=case["rel_v"],
                              rel_bias=case["rel_bias"], max_distance=4, dropout_p=dropout_p, impl="triton", **kw)


def test_dropout_is_reproducible_from_the_seed():
    case = make(lq=21)
    first, again, other = dropout_run(case, 7), dropout_run(case, 7), dropout_run(case, 8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("causal, length, narrow_fringes, half_band",
                         [(False, 26, False, False), (True, 26, False, False), (False, 64, True, False),
                          (True, 26, False, True)])
def test_dropout_matches_the_definition_with_the_kernels_own_mask(causal, length, narrow_fringes, half_band,
                                                                  monkeypatch):
    """Outputs and every gradient, with the mask the kernels drew rebuilt by `fused.dropout_keep`:
    the backward redraws exactly the forward's mask, and both value terms see it (the forward's
    interior masses from the pairs its band kept). Also with the band from a narrow fringe's
    boundary (see test_a_band_from_a_narrow_fringes_boundary_matches_too), and with dk/dv's band
    in half-height tiles (test_dkdv_in_half_height_band_tiles_matches)."""
    if half_band:
        monkeypatch.setattr(fused, "band_rows", lambda meta: meta["BLOCK_M"] // 2)
    if narrow_fringes:
        monkeypatch.setattr(fused, "_INTERPRETER_BLOCKS", {"BLOCK_M": 16, "BLOCK_N": 32})
        monkeypatch.setattr(fused, "BAND_CAP", {"forward": 16, "dq": 16})
    case = make(lq=length, padding=True)
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**30, (1,)).item())  # the draw fused.attend makes after the same seed
    out = dropout_run(case, 3, attn_mask=case["keep"][:, None, None, :], is_causal=causal)
    kept = fused.dropout_keep(seed, 2, 3, length, length, 0.3, DEVICE)
    assert 0.6 < kept.float().mean() < 0.8
    leaves = [case[n] for n in ("q", "k", "v", "rel_k", "rel_v", "rel_bias")]
    want = definition(*leaves, 4, case["keep"], causal, 0, dropped=kept, dropout_p=0.3)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    grad_out = torch.randn_like(out)
    for a, e in zip(torch.autograd.grad(out, leaves, grad_out), torch.autograd.grad(want, leaves, grad_out.double())):
        torch.testing.assert_close(a.double(), e.double(), atol=2e-5 * max(1.0, e.abs().max().item()), rtol=1e-4)


def test_dropout_keeps_one_minus_p_of_the_pairs_independently():
    """The draws behind the mask: one Philox draw serves eight keys as 16-bit halves, so check
    the keep rate, per position of a key within its eight, and that neighbours are uncorrelated."""
    kept = fused.dropout_keep(11, 1, 4, 128, 128, 0.1, DEVICE).float().reshape(-1, 128)
    assert abs(kept.mean().item() - 0.9) < 0.005  # 65,536 pairs: 5 standard deviations
    for position in range(8):
        assert abs(kept[:, position::8].mean().item() - 0.9) < 0.015
    centred = kept - kept.mean()
    for shift in (1, 2, 4, 8, 128):  # the next key, the same key's next draw word, the next row
        a, b = centred.flatten()[:-shift], centred.flatten()[shift:]
        assert abs((a * b).mean().item() / centred.var().item()) < 0.03


@pytest.mark.slow  # 40 s in the interpreter; the mask itself is checked exactly by the tests above
def test_dropout_averages_to_the_dropout_free_output():
    """Each (batch, head) draws its own mask: 256 copies of one sequence in one call average out."""
    one = make(b=1, h=1, lq=12, d=16)
    many = {n: (t.detach().expand(256, *t.shape[1:]).contiguous() if n in ("q", "k", "v") else t)
            for n, t in one.items()}
    mean = dropout_run(many, 5, dropout_p=0.2).mean(0, keepdim=True)
    exact = relative_attention(one["q"], one["k"], one["v"], rel_k=one["rel_k"], rel_v=one["rel_v"],
                               rel_bias=one["rel_bias"], max_distance=4, impl="triton")
    spread = (mean - exact).abs().max() / exact.abs().max()
    assert spread < 0.1


def test_one_config_from_the_environment_replaces_the_autotuners_list(monkeypatch):
    """RELPOS_LAB_TRITON_CONFIG pins every kernel to one config (tests and profiles on a GPU);
    a malformed value names the expected form."""
    monkeypatch.setenv(fused.CONFIG_VARIABLE, "64,32,4,2")
    (config,) = fused._configs("dkdv")
    assert (config.kwargs, config.num_warps, config.num_stages, config.maxnreg) == (
        {"BLOCK_M": 64, "BLOCK_N": 32, "WINDOW": 128}, 4, 2, None)
    assert fused._spill_free(None)([config], {}) == [config]  # nothing to choose: no static compile
    assert fused._configs("forward")[0].kwargs == {"BLOCK_M": 64, "BLOCK_N": 32}
    monkeypatch.setenv(fused.CONFIG_VARIABLE, "64,64,4,3,168")
    assert [(c.kwargs, c.maxnreg) for c in fused._configs("dq")] == [({"BLOCK_M": 64, "BLOCK_N": 64}, 168)]
    monkeypatch.setenv(fused.CONFIG_VARIABLE, "64,64,4,3,capped")  # each kernel's own cap, or none
    assert [fused._configs(name)[0].maxnreg for name in ("forward", "dq", "dkdv")] == [
        fused.REGISTER_CAPS["forward"], None, fused.REGISTER_CAPS["dkdv"]]
    for bad in ("64x64", "64,64,4", "64,64,4,3,most"):
        monkeypatch.setenv(fused.CONFIG_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"RELPOS_LAB_TRITON_CONFIG='{bad}': expected BM,BN,WARPS,STAGES"):
            fused._configs("dq")
    monkeypatch.delenv(fused.CONFIG_VARIABLE)
    # The autotuner's list: the forward and dk/dv also time 64/64 with their registers capped, dk/dv
    # 64/64 in two stages (its one spill-free config on sm_80 with causality and dropout); dq neither.
    assert [c.maxnreg for c in fused._configs("forward")] == [None] * 5 + [fused.REGISTER_CAPS["forward"]]
    assert len(fused._configs("dq")) == 5
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.maxnreg)
            for c in fused._configs("dkdv")][5:] == [(64, 64, 4, 2, None), (64, 64, 4, 3, fused.REGISTER_CAPS["dkdv"])]
    assert not any(c.maxnreg for c in fused._configs("dq") + fused._configs("dkdv")[:6])


@pytest.mark.parametrize("name, dropout_p", [("odd length, shared tables and bias", 0.0), ("per-head tables", 0.0),
                                             ("keys only", 0.0), ("padding", 0.0), ("padding", 0.3)])
def test_the_fused_op_passes_torch_library_opcheck(name, dropout_p):
    """The torch.library op a compiled model calls: schema, fake shapes, autograd registration, and
    its traced forms (make_fx, AOTAutograd) against the real kernels; with dropout, its seed tensor."""
    from relpos_lab.core.attention import fused_op

    make_kw, _ = CASES[name]
    case = make(**{**make_kw, "lq": min(make_kw.get("lq", 37), 17), "b": 1, "h": 2})
    mask = case["keep"][:, None, None, :].view(torch.uint8) if case["keep"] is not None else None
    seed = torch.tensor([7], dtype=torch.int32, device=DEVICE) if dropout_p else None
    args = (case["q"], case["k"], case["v"], case["rel_k"], case["rel_v"], case["rel_bias"], mask,
            4, False, 0, case["q"].shape[-1] ** -0.5, seed, dropout_p)
    torch.library.opcheck(fused_op.fused_attention, args)


@pytest.mark.parametrize("scheme", ["shaw", "alibi"])
def test_a_compiled_model_runs_the_fused_op_in_its_graph(scheme):
    """impl=triton under torch.compile (fullgraph: the op is a node of the graph), gradients as eager's."""
    from relpos_lab.api.testing import tiny_model_config

    torch.manual_seed(0)
    positions = builtin_config(scheme, **({"max_distance": 3} if scheme == "shaw" else {}))
    model = EncoderDecoder(tiny_model_config(positions, attention_impl="triton")).to(DEVICE).train()
    src, tgt = torch.randint(3, 12, (2, 9), device=DEVICE), torch.randint(3, 12, (2, 7), device=DEVICE)
    src[1, 6:] = 0

    def grads(call):
        model.zero_grad()
        call(src, tgt).log_softmax(-1).mean().neg().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    eager = grads(model)
    compiled = grads(torch.compile(model, backend="aot_eager_decomp_partition", fullgraph=True))
    torch._dynamo.reset()
    assert compiled.keys() == eager.keys()
    for name, want in eager.items():
        torch.testing.assert_close(compiled[name], want, atol=1e-5 * max(1.0, want.abs().max().item()), rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")


def test_a_compiled_model_with_attention_dropout_keeps_the_kernels_in_its_graph():
    """With dropout the seed is a tensor drawn in the graph: fullgraph compiles, each call draws a
    fresh mask, and after the same torch.manual_seed the compiled model draws eager's masks (the
    aot_eager backend runs torch's generator), so outputs and gradients equal eager's."""
    from relpos_lab.api.testing import tiny_model_config

    torch.manual_seed(0)
    cfg = tiny_model_config(builtin_config("shaw", max_distance=3), attention_impl="triton", attention_dropout=0.5)
    model = EncoderDecoder(cfg).to(DEVICE).train()
    src, tgt = torch.randint(3, 12, (2, 9), device=DEVICE), torch.randint(3, 12, (2, 7), device=DEVICE)
    compiled = torch.compile(model, backend="aot_eager_decomp_partition", fullgraph=True)

    def run(call):
        torch.manual_seed(5)
        model.zero_grad()
        out = call(src, tgt)
        out.log_softmax(-1).mean().neg().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    (eager, eager_grads), (out, grads) = run(model), run(compiled)
    assert not torch.equal(compiled(src, tgt), compiled(src, tgt))  # a fresh mask per call, not one baked in
    torch._dynamo.reset()
    torch.testing.assert_close(out, eager)
    assert grads.keys() == eager_grads.keys() and "encoder.layers.0.self_attn.inner.relative.rel_k" in grads
    for name, want in eager_grads.items():
        torch.testing.assert_close(grads[name], want, atol=1e-5 * max(1.0, want.abs().max().item()), rtol=1e-4,
                                   msg=lambda m, name=name: f"{name}: {m}")
