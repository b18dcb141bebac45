"""The fused Triton kernel (`impl="triton"`) against the float64 definition.

On CPU the very kernel code runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET
before triton is imported), so these prove exactness without a GPU: outputs and the gradients of
q, k, v, rel_k, rel_v and rel_bias, over lengths that are not multiples of the block (16 here),
cross lengths with a query offset, per-head tables, each term alone, k = 0, 1, 16 and k ≥ L,
padding, causality and rows that see nothing; the band in tiles of 8 and of 16. The cases are
tests/attention_cases.py's SMALL and TILED, and the tests' own built from its records. On a GPU
the same tests run compiled (-m cuda).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from relpos_lab.core.attention import fused, fused_tuning, relative_attention
from relpos_lab.core.attention.masks import offset_bias
from relpos_lab.core.positions import builtin_config
from relpos_lab.core.transformer import EncoderDecoder, ModelConfig

from tests.attention_cases import CASES, SMALL, TILED, WHOLE_LAST, Case, build, definition

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    fused.unsupported(*([torch.zeros(1, 1, 2, 16, device=DEVICE)] * 3), rel_k=None, rel_v=None, rel_bias=None,
                      max_distance=0, attn_mask=None, is_causal=False, query_offset=0, dropout_p=0.0, attn_bias=None)
    is not None, reason="triton is not installed, or neither CUDA nor TRITON_INTERPRET=1")


def make(case: Case, dtype=torch.float32, seed=0):
    """q, k, v and the keyword arguments of `case` on DEVICE, every floating tensor a leaf."""
    return build(case, dtype=dtype, device=DEVICE, seed=seed, requires_grad=True)


def tiled(name, B=2, H=3, L=37, Lk=None, D=24, max_distance=4, rel_bias=True, **fields) -> Case:
    """A case of TILED's usual sizes and terms (Lq = L, Lk = L unless given), for a test's own inputs."""
    return Case(name, B=B, H=H, Lq=L, Lk=L if Lk is None else Lk, D=D, max_distance=max_distance, rel_bias=rel_bias,
                **fields)


def leaves(q, k, v, kw) -> dict:
    """The inputs that have gradients, by name: q, k, v and whichever of rel_k, rel_v, rel_bias are given."""
    named = dict(q=q, k=k, v=v, rel_k=kw["rel_k"], rel_v=kw["rel_v"], rel_bias=kw["rel_bias"])
    return {name: t for name, t in named.items() if t is not None}


def check_against_definition(q, k, v, kw, atol=2e-5, rtol=1e-4):
    """Output and the gradient of every input of impl="triton" against the float64 definition."""
    out = relative_attention(q, k, v, **kw, impl="triton")
    want = definition(q, k, v, **kw)
    assert out.dtype == q.dtype
    torch.testing.assert_close(out.double(), want, atol=atol, rtol=rtol)
    named = leaves(q, k, v, kw)
    grad_out = torch.randn_like(out)
    got = torch.autograd.grad(out, list(named.values()), grad_out)
    expected = torch.autograd.grad(want, list(named.values()), grad_out.double())
    for name, a, e in zip(named, got, expected):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a.double(), e.double(), atol=atol * max(1.0, e.abs().max().item()), rtol=rtol,
                                   msg=lambda m, name=name: f"gradient of {name}: {m}")


def check_case(case: Case):
    check_against_definition(*make(case))


INTERPRETED_CASES = [case.name for case in SMALL + TILED if not case.attn_bias]
"""The shared table's cases this tier runs: LONG would take minutes here, and the kernel refuses a
dense attn_bias (rel_bias stands for it)."""


@pytest.mark.parametrize("name", INTERPRETED_CASES)
def test_matches_the_float64_definition_with_gradients(name):
    check_case(CASES[name])


@pytest.mark.parametrize("name", ["all_terms_tiled", "padding_causal_tiled", "cross_lengths_tiled"])
def test_a_band_in_whole_blocks_matches_too(name, monkeypatch):
    """The interpreter cuts the band's 16-blocks in two, with plain fringe tiles beside it (as
    128-key blocks are cut on a GPU); configs whose BN is the cap keep them whole, and compile no
    fringe: that path, here with the band uncut."""
    monkeypatch.setattr(fused_tuning, "BAND_CAP", {"forward": 16, "dq": 16})
    check_case(CASES[name])


NARROW_FRINGE_CASES = {
    **{name: CASES[name] for name in ("all_terms_tiled", "k16_tiled", "cross_lengths_tiled", "padding_causal_tiled",
                                      "padding_tiled", "values_only_tiled", "offset_beyond_band_tiled")},
    "full_blocks": tiled("full_blocks", B=1, L=64),  # lengths that fill the blocks: the band ends at Lk
    "full_blocks_padding": tiled("full_blocks_padding", L=64, padding=WHOLE_LAST),
}


@pytest.mark.parametrize("name", NARROW_FRINGE_CASES)
def test_a_band_from_a_narrow_fringes_boundary_matches_too(name, monkeypatch):
    """On a GPU the band's 64-key tiles start at a multiple of 32, with 32-key fringes beside
    them, and end at Lk where the lengths fill the blocks; here 16-key band tiles from a
    multiple of 8, in 32-key blocks: band, wide and narrow fringes and the band moved back from
    Lk, as compiled. The forward runs both narrow fringes as one tile, or LEFT's alone beside
    −inf where RIGHT's is none (`fringe_pair`): both occur here."""
    monkeypatch.setattr(fused, "_INTERPRETER_BLOCKS", {"BLOCK_M": 16, "BLOCK_N": 32})
    monkeypatch.setattr(fused_tuning, "BAND_CAP", {"forward": 16, "dq": 16})
    check_case(NARROW_FRINGE_CASES[name])


@pytest.mark.parametrize("shared", ["rel_k", "rel_v"])
def test_a_table_per_head_beside_one_the_heads_share(shared):
    """Both tables' gradients come from one launch of label_sums_kernel and a reduction per table over its
    shares; a table the heads share is summed over them too, one per head is not."""
    q, k, v, kw = make(CASES["per_head_tiled"])
    g = torch.Generator().manual_seed(5)
    kw[shared] = torch.randn(7, 24, generator=g).to(DEVICE).requires_grad_()
    check_against_definition(q, k, v, kw)


@pytest.mark.parametrize("name", ["all_terms_tiled", "padding_causal_tiled"])
def test_a_register_capped_forward_writes_the_same_tables(name, monkeypatch):
    """With w^K and w^V the forward writes each interior logit over the logit term it has read;
    under a register cap at the address it computes again (fused_tuning.low_registers), else at the
    load's: that other path, here."""
    monkeypatch.setattr(fused_tuning, "low_registers", lambda meta: True)
    check_case(CASES[name])


@pytest.mark.parametrize("name", ["all_terms_tiled", *(pytest.param(n, marks=pytest.mark.slow) for n in (
    "padding_causal_tiled", "k16_tiled", "per_head_causal_offset_tiled", "wide_causal_padding"))])
def test_dkdv_in_half_height_band_tiles_matches(name, monkeypatch):
    """Under a register cap dk/dv runs its band in tiles of half the block's rows
    (fused_tuning.band_rows): that path, here, a wide rel_bias's diagonals included."""
    monkeypatch.setattr(fused_tuning, "band_rows", lambda meta: meta["BLOCK_M"] // 2)
    if name in WIDE_CASES:
        monkeypatch.setattr(fused, "MAX_LABELS", 16)
    check_case({**CASES, **WIDE_CASES}[name])


@pytest.mark.parametrize("shape", ["prefix (B, 1, Lq, Lk)", "per head (B, H, Lq, Lk)", "shared (Lq, Lk)"])
def test_dense_masks_are_read_tile_by_tile(shape):
    """A prefix LM's mask (the source sees all of itself, the target is causal) and arbitrary masks."""
    q, k, v, kw = make(tiled("dense_mask", L=30))
    g = torch.Generator().manual_seed(4)
    if shape.startswith("prefix"):
        prefix = torch.tensor([9, 17])
        j, i = torch.arange(30)[None, None, :], torch.arange(30)[None, :, None]
        mask = ((j <= i) | (j < prefix[:, None, None]))[:, None]
    elif shape.startswith("per head"):
        mask = torch.rand(2, 3, 30, 30, generator=g) < 0.7
    else:
        mask = torch.rand(30, 30, generator=g) < 0.7
    kw["attn_mask"] = mask.to(DEVICE)
    inputs = list(leaves(q, k, v, kw).values())
    out = relative_attention(q, k, v, **kw, impl="triton")
    want = definition(q, k, v, **kw)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    grad_out = torch.randn_like(out)
    for a, e in zip(torch.autograd.grad(out, inputs, grad_out), torch.autograd.grad(want, inputs, grad_out.double())):
        torch.testing.assert_close(a.double(), e.double(), atol=2e-5 * max(1.0, e.abs().max().item()), rtol=1e-4)


WIDE_CASES = {case.name: case for case in (  # a rel_bias alone, as ALiBi's and T5's
    tiled("wide_every_offset", max_distance=40, use_k=False, use_v=False),
    tiled("wide_clipped", max_distance=12, padding=WHOLE_LAST, use_k=False, use_v=False),
    tiled("wide_causal_padding", max_distance=20, causal=True, padding=WHOLE_LAST, use_k=False, use_v=False),
    tiled("wide_prefill_on_a_cache", B=1, L=9, Lk=41, max_distance=45, causal=True, offset=32, use_k=False,
          use_v=False),
    tiled("wide_cross_lengths_offset", B=1, L=21, Lk=50, max_distance=60, offset=7, use_k=False, use_v=False),
)}


@pytest.mark.parametrize("name", WIDE_CASES)
def test_a_wide_rel_bias_alone_is_read_per_tile_and_reduced_along_diagonals(name, monkeypatch):
    """Tables too wide for the label space in registers (here: wider than 16 labels): the bias is
    loaded per tile and its gradient summed along each tile's diagonals."""
    monkeypatch.setattr(fused, "MAX_LABELS", 16)
    q, k, v, kw = make(WIDE_CASES[name])
    assert fused._bias_is_wide(None, None, kw["rel_bias"], kw["max_distance"])
    check_against_definition(q, k, v, kw)


@pytest.mark.parametrize("causal", [False, True])
def test_a_window_of_minus_inf_edge_biases_matches(causal):
    """rel_bias −inf at labels 0 and 2k: every key farther than k − 1 is out of reach. The stages
    off the band keep their row maximum less that term (floored at −2²⁰), and give nothing."""
    q, k, v, kw = make(tiled("window", B=1, L=45, causal=causal))
    with torch.no_grad():
        kw["rel_bias"][:, 0] = float("-inf")
        kw["rel_bias"][:, -1] = float("-inf")
    check_against_definition(q, k, v, kw)


def test_rows_that_see_nothing_are_zero_with_zero_gradients():
    q, k, v, kw = make(tiled("empty", L=17))
    keep = torch.ones(2, 17, dtype=torch.bool, device=DEVICE)
    keep[1] = False  # the second sequence: every key is padding
    out = relative_attention(q, k, v, **{**kw, "attn_mask": keep[:, None, None, :]}, impl="triton")
    assert out[1].abs().max() == 0
    grads = torch.autograd.grad(out.sum(), [q, k, v])
    assert all(torch.isfinite(g).all() for g in grads)
    assert grads[0][1].abs().max() == 0 and grads[1][1].abs().max() == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_stay_within_half_rounding(dtype):
    if dtype == torch.bfloat16 and fused.INTERPRETED:
        pytest.skip("Triton 3.6's interpreter computes bfloat16 dots wrongly (numpy has no bfloat16); -m cuda")
    q, k, v, kw = make(tiled("half", L=33, padding=WHOLE_LAST), dtype=dtype)
    out = relative_attention(q, k, v, **kw, impl="triton")
    want = definition(q, k, v, **kw)
    assert out.dtype == dtype
    assert (out.double() - want).norm() / want.norm() < 2e-2


def test_float32_tables_with_half_inputs_are_cast_as_the_kernels_load_them():
    """Under autocast w^K and w^V are float32 parameters and q, k, v half: the kernels cast the
    tables as they load them, the same rounding as casting them first, and the tables' gradients
    come back in their own dtype."""
    q, k, v, kw = make(tiled("autocast", L=29, max_distance=3, rel_bias=False))
    case = {"q": q, "k": k, "v": v, "rel_k": kw["rel_k"], "rel_v": kw["rel_v"]}
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
    q, k, v, kw = make(tiled("rel_bias", L=19, use_k=False, use_v=False))
    dense = offset_bias(kw["rel_bias"], 19, 19, 4)
    want = relative_attention(q, k, v, attn_bias=dense, max_distance=4, impl="naive")
    for impl in ("naive", "batched", "gather", "triton", "auto"):
        got = relative_attention(q, k, v, rel_bias=kw["rel_bias"], max_distance=4, impl=impl)
        torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4, msg=lambda m, impl=impl: f"{impl}: {m}")


def test_refusals_name_what_is_unsupported():
    q, k, v, kw = make(tiled("refused", L=8, rel_bias=False))
    with pytest.raises(ValueError, match=r"impl='triton' does not support a dense attn_bias"):
        relative_attention(q, k, v, rel_k=kw["rel_k"], max_distance=4, attn_bias=torch.zeros(8, 8), impl="triton")
    with pytest.raises(ValueError, match=r"rel_bias has shape \(3, 5\); expected .* \(3, 9\)"):
        relative_attention(q, k, v, rel_bias=torch.zeros(3, 5), max_distance=4, impl="triton")


# alibi takes t5_bias's wide-bias path with a fixed bias; t5_bias's kernels are checked against
# float64 with gradients above (bias only). Slow (20-60 s each in the interpreter): the default tier
# has the kernel inside a model in test_batch_invariance's triton cases and the compiled model below.
@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["shaw", "alibi", "t5_bias"])
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


def dropout_run(q, k, v, kw, seed, dropout_p=0.3):
    torch.manual_seed(seed)
    return relative_attention(q, k, v, **kw, dropout_p=dropout_p, impl="triton")


def test_dropout_is_reproducible_from_the_seed():
    case = make(tiled("dropout", L=21))
    first, again, other = dropout_run(*case, 7), dropout_run(*case, 7), dropout_run(*case, 8)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize("causal, length, narrow_fringes, half_band",
                         [(True, 26, False, False), *(pytest.param(*case, marks=pytest.mark.slow) for case in (
                             (False, 26, False, False), (False, 64, True, False), (True, 26, False, True)))])
def test_dropout_matches_the_definition_with_the_kernels_own_mask(causal, length, narrow_fringes, half_band,
                                                                  monkeypatch):
    """Outputs and every gradient, with the mask the kernels drew rebuilt by `fused.dropout_keep`:
    the backward redraws exactly the forward's mask, and both value terms see it (the forward's
    interior masses from the pairs its band kept). Also with the band from a narrow fringe's
    boundary (see test_a_band_from_a_narrow_fringes_boundary_matches_too), and with dk/dv's band
    in half-height tiles (test_dkdv_in_half_height_band_tiles_matches)."""
    if half_band:
        monkeypatch.setattr(fused_tuning, "band_rows", lambda meta: meta["BLOCK_M"] // 2)
    if narrow_fringes:
        monkeypatch.setattr(fused, "_INTERPRETER_BLOCKS", {"BLOCK_M": 16, "BLOCK_N": 32})
        monkeypatch.setattr(fused_tuning, "BAND_CAP", {"forward": 16, "dq": 16})
    q, k, v, kw = make(tiled("dropout", L=length, padding=WHOLE_LAST, causal=causal))
    torch.manual_seed(3)
    seed = int(torch.randint(0, 2**30, (1,)).item())  # the draw fused.attend makes after the same seed
    out = dropout_run(q, k, v, kw, 3)
    kept = fused.dropout_keep(seed, 2, 3, length, length, 0.3, DEVICE)
    assert 0.6 < kept.float().mean() < 0.8
    inputs = list(leaves(q, k, v, kw).values())
    want = definition(q, k, v, **kw, dropped=kept, dropout_p=0.3)
    torch.testing.assert_close(out.double(), want, atol=2e-5, rtol=1e-4)
    grad_out = torch.randn_like(out)
    for a, e in zip(torch.autograd.grad(out, inputs, grad_out), torch.autograd.grad(want, inputs, grad_out.double())):
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
    q, k, v, kw = make(tiled("one", B=1, H=1, L=12, D=16))
    many = [t.detach().expand(256, *t.shape[1:]).contiguous() for t in (q, k, v)]
    mean = dropout_run(*many, kw, 5, dropout_p=0.2).mean(0, keepdim=True)
    exact = relative_attention(q, k, v, **kw, impl="triton")
    spread = (mean - exact).abs().max() / exact.abs().max()
    assert spread < 0.1


def test_one_config_from_the_environment_replaces_the_autotuners_list(monkeypatch):
    """RELPOS_LAB_TRITON_CONFIG pins every kernel to one config (tests and profiles on a GPU);
    a malformed value names the expected form."""
    monkeypatch.setenv(fused_tuning.CONFIG_VARIABLE, "64,32,4,2")
    (config,) = fused_tuning.configs("dkdv")
    assert (config.kwargs, config.num_warps, config.num_stages, config.maxnreg) == (
        {"BLOCK_M": 64, "BLOCK_N": 32, "WINDOW": 128}, 4, 2, None)
    assert fused_tuning.spill_free(None)([config], {}) == [config]  # nothing to choose: no static compile
    assert fused_tuning.configs("forward")[0].kwargs == {"BLOCK_M": 64, "BLOCK_N": 32}
    monkeypatch.setenv(fused_tuning.CONFIG_VARIABLE, "64,64,4,3,168")
    assert [(c.kwargs, c.maxnreg) for c in fused_tuning.configs("dq")] == [({"BLOCK_M": 64, "BLOCK_N": 64}, 168)]
    monkeypatch.setenv(fused_tuning.CONFIG_VARIABLE, "64,64,4,3,capped")  # each kernel's own cap, or none
    assert [fused_tuning.configs(name)[0].maxnreg for name in ("forward", "dq", "dkdv")] == [
        fused_tuning.REGISTER_CAPS["forward"], None, fused_tuning.REGISTER_CAPS["dkdv"]]
    for bad in ("64x64", "64,64,4", "64,64,4,3,most"):
        monkeypatch.setenv(fused_tuning.CONFIG_VARIABLE, bad)
        with pytest.raises(ValueError, match=f"RELPOS_LAB_TRITON_CONFIG='{bad}': expected BM,BN,WARPS,STAGES"):
            fused_tuning.configs("dq")
    monkeypatch.delenv(fused_tuning.CONFIG_VARIABLE)
    # The autotuner's list: the forward and dk/dv also time 64/64 with their registers capped, dk/dv
    # 64/64 in two stages (its one spill-free config on sm_80 with causality and dropout); dq neither.
    assert [c.maxnreg for c in fused_tuning.configs("forward")] == [None] * 5 + [fused_tuning.REGISTER_CAPS["forward"]]
    assert len(fused_tuning.configs("dq")) == 5
    assert [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps, c.num_stages, c.maxnreg)
            for c in fused_tuning.configs("dkdv")][5:] == [
        (64, 64, 4, 2, None), (64, 64, 4, 3, fused_tuning.REGISTER_CAPS["dkdv"])]
    assert not any(c.maxnreg for c in fused_tuning.configs("dq") + fused_tuning.configs("dkdv")[:6])


OPCHECK_CASES = {name: CASES[name] for name in (
    "all_terms_tiled", "per_head_tiled", "keys_only_tiled", "values_only_tiled", "rel_bias_only_tiled",
    "neither_tiled", "causal_tiled", "padding_tiled", "padding_causal_tiled", "cross_lengths_tiled",
    "per_head_causal_offset_tiled", "per_head", "mask_2d_and_causal", "padding_with_empty_row")}
"""What a model's attention call can hand the fused ops: tables shared or per head, a^K, a^V, both,
a rel_bias alone or neither, causality, key padding (rows that see nothing among it), a dense mask,
lengths off the blocks, Lq ≠ Lk and a query offset (a prefill on a cache)."""
OPCHECK_DTYPES = {"float32": (torch.float32, torch.float32), "bfloat16": (torch.bfloat16, torch.bfloat16),
                  "bfloat16_float32_tables": (torch.bfloat16, torch.float32)}
"""(q, k, v; rel_k, rel_v): the last as under autocast, float32 parameters beside bfloat16 activations."""
OPCHECK_QUICK = {  # the default tier's (5-15 s each)
    "causal_tiled": ("float32", 0.0), "per_head": ("float32", 0.0), "padding_tiled": ("float32", 0.25)}
"""The cases opcheck once failed for: shared tables with causality, per-head tables with key
padding, both tables with dropout 0.25. The rest of the product (each term, mask and dtype) is
`slow`."""
OPCHECKS = [pytest.param(name, dtype, p, id=f"{name}-{dtype}-p{p}",
                         marks=() if OPCHECK_QUICK.get(name) == (dtype, p) else pytest.mark.slow)
            for name, case in OPCHECK_CASES.items() for dtype in OPCHECK_DTYPES for p in (0.0, 0.25)
            if dtype != "bfloat16_float32_tables" or case.use_k or case.use_v]


def op_inputs(name: str, dtype: str, dropout_p: float) -> tuple[tuple, tuple]:
    """The forward op's arguments for a case, cut to one or two blocks, as fused_op.attend makes
    them (fused.prepare: tables cut to the band, the mask as bytes, the launch's scalars), and
    the backward op's as the forward's autograd formula passes them (detached: autograd's backward
    runs it without a graph)."""
    from relpos_lab.core.attention import fused_op

    case = OPCHECK_CASES[name]
    case = dataclasses.replace(case, B=2 if case.padding else 1, H=2, Lq=min(case.Lq, 13),
                               Lk=min(case.Lk, 17 + case.offset))
    inputs, tables = OPCHECK_DTYPES[dtype]
    q, k, v, kw = build(case, dtype=inputs, device=DEVICE, requires_grad=True)
    rel_k, rel_v = (kw[t].detach().to(tables).requires_grad_() if kw[t] is not None else None
                    for t in ("rel_k", "rel_v"))
    torch.manual_seed(0)
    prepared = fused.prepare(q, k, rel_k, rel_v, kw["rel_bias"], case.max_distance, kw["attn_mask"], case.causal,
                             case.offset, dropout_p, case.D ** -0.5)
    *tensors, launch = prepared
    forward = (q, k, v, *tensors, *launch)
    with torch.no_grad():
        o, lse, mass = fused_op.fused_attention(*forward)
    detached = [t.detach() if t is not None else None for t in (q, k, v, *tensors)]
    needs = (rel_k is not None, rel_v is not None, kw["rel_bias"] is not None)
    backward = (torch.randn_like(o), *detached, o, lse, mass, *launch, *needs)
    return forward, backward


def skip_interpreted_bfloat16_dropout(dtype: str, dropout_p: float):
    if dtype != "float32" and dropout_p and fused.INTERPRETED:
        pytest.skip("Triton 3.6's interpreter has no bfloat16 constants (tl.full(..., 1.0, tl.bfloat16) in the "
                    "dropout path: 'InterpreterBuilder' object has no attribute 'get_bf16'); -m cuda")


@pytest.mark.parametrize("name, dtype, dropout_p", OPCHECKS)
def test_the_fused_forward_op_passes_torch_library_opcheck(name, dtype, dropout_p):
    """The torch.library op a compiled model calls: schema, fake outputs (shapes, strides, storage
    offsets, dtypes) equal to the kernel's, autograd registration, and its traced forms (make_fx,
    AOTAutograd) against the real kernels; with dropout, its seed tensor."""
    from relpos_lab.core.attention import fused_op

    skip_interpreted_bfloat16_dropout(dtype, dropout_p)

    torch.library.opcheck(fused_op.fused_attention, op_inputs(name, dtype, dropout_p)[0])


@pytest.mark.parametrize("name, dtype, dropout_p", OPCHECKS)
def test_the_fused_backward_op_passes_torch_library_opcheck(name, dtype, dropout_p):
    """The backward's op, which a compiled graph calls for the forward's gradient and whose fake
    outputs inductor plans the gradients' buffers from: each gradient a fresh contiguous tensor,
    as the fake says, whichever tables it has."""
    from relpos_lab.core.attention import fused_op

    skip_interpreted_bfloat16_dropout(dtype, dropout_p)

    torch.library.opcheck(fused_op.fused_attention_backward, op_inputs(name, dtype, dropout_p)[1])


@pytest.mark.parametrize("scheme, backend", [
    ("shaw", "aot_eager_decomp_partition"), pytest.param("alibi", "aot_eager_decomp_partition", marks=pytest.mark.slow),
    pytest.param("shaw", "inductor", marks=pytest.mark.slow)])  # inductor's C++: ~150 s cold on 2 cores, ~11 s cached
def test_a_compiled_model_runs_the_fused_op_in_its_graph(scheme, backend):
    """impl=triton under torch.compile (fullgraph: the op is a node of the graph), gradients as eager's.

    Through inductor too: it lowers the rest of the graph (to C++ here, Triton on a GPU) and calls
    the ops as extern kernels, in the interpreter here. What that cannot show without a GPU: Triton's
    code for the rest, CUDA graphs and the compiled kernels (-m cuda); nor a fake output that
    disagrees with the kernel's in strides or storage offset, with which the CPU's gradients still
    come out right: opcheck's tests above catch that."""
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
    compiled = grads(torch.compile(model, backend=backend, fullgraph=True))
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
