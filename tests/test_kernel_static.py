"""`bench kernel --static`: the fused kernel compiled for Hopper on this CPU, read back from SASS.

The flash control is checked to compute attention (in Triton's interpreter) so the ratios are
against a real FlashAttention-2. The static checks compile the Shaw default (k = 16, D = 64,
bf16) for sm_90 in the config the kernels use most (128/64, 8 warps, 3 stages) and hold it to
its budget against the control (no spills, each stage a loop, a tile off the band as cheap as a
flash tile, the forward and backward within a ratio of the control's instructions), and the
forward and dq in 64/128 (where the band is cut); the whole table is
`relpos-lab bench kernel --static --sm 90 80`.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("length", [32, 37])
def test_the_flash_control_computes_attention_and_its_gradients(causal, length, padding):
    from relpos_lab.analysis import flash_control
    from relpos_lab.core.attention import fused
    if not fused.INTERPRETED:
        pytest.skip("runs in Triton's interpreter (TRITON_INTERPRET=1, as tests/conftest.py sets) or on a GPU")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, length, 24, generator=g) for _ in range(3))
    keep = torch.ones(3, length, dtype=torch.bool)
    if padding:
        keep[1, length // 2:] = False
        keep[2, 1::3] = False
    out, dq, dk, dv = flash_control.attention(q, k, v, causal=causal, mask=keep.to(torch.uint8) if padding else None)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    allowed = keep[:, None, :].expand(3, length, length)
    if causal:
        allowed = allowed & torch.ones(length, length, dtype=torch.bool).tril()
    want = F.scaled_dot_product_attention(*leaves, attn_mask=allowed)
    want.backward(torch.ones_like(want))
    torch.testing.assert_close(out, want, atol=2e-5, rtol=1e-4)
    for got, leaf in zip((dq, dk, dv), leaves):
        torch.testing.assert_close(got, leaf.grad, atol=2e-5, rtol=1e-4)


def test_tile_loops_are_the_backward_branches_of_the_sass():
    from relpos_lab.analysis.kernel_static import tile_loops
    sass = """
        /*0000*/                   MOV R1, R2 ;
        /*0010*/                   IADD R1, R1, 1 ;
        /*0020*/               @P0 BRA 0x10 ;
        /*0030*/                   BRA 0x50 ;
        /*0040*/                   NOP ;
        /*0050*/                   FADD R3, R3, R4 ;
        /*0060*/                   FMUL R3, R3, R4 ;
        /*0070*/               @P1 BRA 0x50 ;
        /*0080*/                   EXIT ;
    """
    assert tile_loops(sass) == ([2, 3], 9)


@pytest.fixture(scope="module")
def shaw_default():
    """The Shaw default's three kernels and the flash control's, compiled for sm_90 in the first
    config (~1 min). In a subprocess: this session's triton runs interpreted (conftest.py)."""
    return compiled_records("90")


def compiled_records(arguments: str) -> dict:
    """default_config_records(arguments), compiled in a subprocess without TRITON_INTERPRET."""
    return compiled_subprocess("import json; from relpos_lab.analysis.kernel_static import default_config_records "
                               f"as r; print(json.dumps(r({arguments})))")


def compiled_subprocess(code: str) -> dict:
    """The JSON that `code` prints last, run where triton compiles (not interprets)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def shaw_wide_keys():
    """The forward and dq in 64/128 (4 warps), the config the plain stages are cheapest in, where
    the band is cut in 64-key tiles in the forward, 32-key ones in dq (fused_tuning.band_block);
    compiled as above."""
    from relpos_lab.core.attention import fused_tuning

    configs = [(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.num_warps) for c in fused_tuning.configs("dq")]
    index = configs.index((64, 128, 4))
    return compiled_records(f"90, config_index={index}, kernels=('forward', 'dq')")


def test_a_band_cut_in_narrow_tiles_lets_128_key_tiles_run_without_spills(shaw_wide_keys):
    for name in ("forward", "dq"):
        assert shaw_wide_keys[name]["stack_bytes"] == 0, name
    # the band's tiles are half as long: it costs about what it costs in 64-key configs
    assert shaw_wide_keys["forward"]["loops"]["band"] < 1.6 * shaw_wide_keys["control forward"]["loops"]["full"]
    assert shaw_wide_keys["forward"]["loops"]["left"] <= 1.05 * shaw_wide_keys["control forward"]["loops"]["full"]


@pytest.mark.parametrize("index, name, cap, blocks", [(0, "forward", 128, 4), (2, "dkdv", 168, 3)])
def test_a_register_cap_fits_the_controls_blocks_per_sm_without_spilling(index, name, cap, blocks):
    """The forward's and dk/dv's capped configs (fused_tuning.REGISTER_CAPS, maxnreg) compile for sm_90
    without a stack (the forward's band in 32-key tiles, dk/dv's in half-height ones): 4 and 3
    blocks of 4 warps share an SM, as the control's forward and dk/dv do in that config."""
    code = f"""if True:
        import json
        from relpos_lab.analysis import kernel_static as ks
        from relpos_lab.core.attention import fused_tuning
        case = ks.Case("shaw k=16")
        kernel, args, kwargs = ks.fused_launches(case, 2048)[{index}]
        (capped,) = [c for c in fused_tuning.configs("{name}") if c.maxnreg]
        record = ks._measure_fused_kernel(kernel, "{name}", case, args, kwargs, capped, 90)
        print(json.dumps([record.config, record.registers, record.stack_bytes, record.blocks_per_sm]))
    """
    config, registers, stack, blocks_per_sm = compiled_subprocess(code)
    assert config == f"64/64/4/3/r{cap}" and registers <= cap and stack == 0
    assert blocks_per_sm == blocks


def test_the_summary_takes_each_sides_cheapest_config_that_does_not_spill():
    """Ratios of the cheapest offered configs, the blocks per SM of the ones taken at L = 2048,
    and the table that prints them (records made by hand: nothing is compiled)."""
    from relpos_lab.analysis.kernel_static import Record, format_table, summarize

    def record(kernel, config, estimate, stack=0, blocks=2):
        return Record(kernel, "x", config, 90, 128, stack, 0, {}, 0, blocks, {2048: estimate, 8192: 4 * estimate})

    ours = [record("forward", "a", 120), record("forward", "b", 100, stack=8, blocks=4),
            record("forward", "c", 115, blocks=3), record("dq", "a", 60), record("dkdv", "a", 90, blocks=1)]
    control = [record("forward", "a", 100, blocks=4), record("dq", "a", 50, blocks=3),
               record("dkdv", "a", 100, blocks=3)]
    summary = summarize("x", 90, ours, control, lengths=(2048, 8192))
    assert summary["ratios"] == {"forward L=2048": 1.15, "forward L=8192": 1.15, "backward L=2048": 1.0,
                                 "backward L=8192": 1.0}  # the spilling 100 is not offered
    assert summary["blocks per SM at L=2048"] == {"forward": "3/4", "dq": "2/3", "dkdv": "1/3"}
    assert summary["spill-free configs"] == {"forward": "2 of 3", "dq": "1 of 1", "dkdv": "1 of 1"}
    table = format_table({"records": [asdict(r) for r in ours + control], "summary": [summary]})
    assert "forward L=2048 1.15x" in table and "forward 3/4, dq 2/3, dkdv 1/3" in table


def test_blocks_per_sm_follows_cudas_occupancy_rules():
    """Registers allocated per warp in units of 256, 1 KiB of shared memory reserved per block,
    the SM's limits of 64 warps and 32 blocks."""
    from relpos_lab.analysis.kernel_static import blocks_per_sm

    assert blocks_per_sm(186, 4, 57344, 90) == 2  # 192 x 32 = 6,144 registers a warp: 10 warps of 65,536
    assert blocks_per_sm(168, 4, 57344, 90) == 3  # fused_tuning.REGISTER_CAPS["dkdv"]
    assert blocks_per_sm(107, 4, 57344, 90) == 4  # 4 x (56 + 1) KiB: Hopper's 228 KiB exactly
    assert blocks_per_sm(107, 4, 57345, 90) == 3
    assert blocks_per_sm(107, 4, 57344, 80) == 2  # Ampere's 164 KiB
    assert blocks_per_sm(32, 4, 0, 90) == 16  # the warps' limit
    assert blocks_per_sm(16, 1, 0, 90) == 32  # the blocks' limit


def test_the_autotuner_times_only_configs_that_do_not_spill():
    """fused_tuning.spill_free, the autotuner's early_config_prune, on dq of the Shaw default for sm_80
    (where some configs spill): it keeps exactly those that `bench kernel --static` finds spill-free."""
    code = """if True:
        import json
        from relpos_lab.analysis import kernel_static as ks
        from relpos_lab.core.attention import fused_tuning
        case = ks.Case("shaw k=16")
        kernel, args, kwargs = ks.fused_launches(case, 2048)[1]
        configs = fused_tuning.configs("dq")
        kept = fused_tuning.spill_free(kernel, capability=(8, 0))(configs, dict(zip(kernel.arg_names, args)), **kwargs)
        stacks = [ks._measure_fused_kernel(kernel, "dq", case, args, kwargs, c, 80).stack_bytes for c in configs]
        print(json.dumps({"kept": [configs.index(c) for c in kept], "stacks": stacks}))
    """
    out = compiled_subprocess(code)
    spill_free = [i for i, stack in enumerate(out["stacks"]) if stack == 0]
    assert 0 < len(spill_free) < len(out["stacks"]), out  # the case still tells the two apart
    assert out["kept"] == spill_free


@pytest.mark.slow  # five compiles for sm_80, ~30 s
def test_a_forward_config_that_spills_is_offered_with_the_bands_addresses_recomputed():
    """The forward keeps its band's load addresses for the stores over the logit table (32
    registers); with causality and dropout on sm_80 64/128 then spills, and the autotuner is
    offered its low_register_variant, which does not. The capped config, low already, is dropped."""
    code = """if True:
        import json
        from relpos_lab.analysis import kernel_static as ks
        from relpos_lab.core.attention import fused_tuning
        case = ks.Case("shaw k=16 causal dropout 0.1", causal=True, dropout_p=0.1)
        kernel, args, kwargs = ks.fused_launches(case, 2048)[0]
        configs = [c for c in fused_tuning.configs("forward") if c.kwargs["BLOCK_N"] == 128 or c.maxnreg]
        kept = fused_tuning.spill_free(kernel, capability=(8, 0))(configs, dict(zip(kernel.arg_names, args)), **kwargs)
        stacks = [ks._measure_fused_kernel(kernel, "forward", case, args, kwargs, c, 80).stack_bytes
                  for c in configs + kept]
        print(json.dumps({"kept": [[c.kwargs, c.maxnreg] for c in kept], "stacks": stacks}))
    """
    out = compiled_subprocess(code)
    assert out["stacks"][0] > 0 and out["stacks"][1] > 0, out  # 64/128 and the capped 64/64 spill
    assert out["kept"] == [[{"BLOCK_M": 64, "BLOCK_N": 128, "LOW_REGISTERS": True}, None]], out
    assert out["stacks"][2] == 0, out


def test_a_low_register_variant_keeps_the_blocks_and_a_capped_config_needs_none():
    from relpos_lab.core.attention import fused_tuning

    plain, capped = fused_tuning.configs("forward")[0], [c for c in fused_tuning.configs("forward") if c.maxnreg][0]
    variant = fused_tuning.low_register_variant(plain)
    assert variant.kwargs == {**plain.kwargs, "LOW_REGISTERS": True}
    assert (variant.num_warps, variant.num_stages, variant.maxnreg) == (plain.num_warps, plain.num_stages, None)
    assert fused_tuning.low_registers(variant.all_kwargs()) and fused_tuning.low_registers(capped.all_kwargs())
    assert not fused_tuning.low_registers(plain.all_kwargs()) and fused_tuning.low_register_variant(capped) is None


@pytest.mark.slow  # one compile, ~1 min
def test_dkdv_has_a_config_that_does_not_spill_on_ampere_with_causality_and_dropout():
    """Causal with dropout, every 3-stage config of dk/dv (and of the control) spills on sm_80:
    the autotuner would have nothing spill-free to choose but for 64/64 in two stages."""
    code = """if True:
        import json
        from relpos_lab.analysis import kernel_static as ks
        from relpos_lab.core.attention import fused_tuning
        case = ks.Case("shaw k=16 causal dropout 0.1", causal=True, dropout_p=0.1)
        kernel, args, kwargs = ks.fused_launches(case, 2048)[2]
        (config,) = [c for c in fused_tuning.configs("dkdv") if c.num_stages == 2 and c.kwargs["BLOCK_N"] == 64]
        record = ks._measure_fused_kernel(kernel, "dkdv", case, args, kwargs, config, 80)
        print(json.dumps([record.config, record.stack_bytes]))
    """
    assert compiled_subprocess(code) == ["64/64/4/2", 0]


def test_the_shaw_default_compiles_for_hopper_with_every_stage_a_loop(shaw_default):
    """The forward's 64-key band tiles start at a multiple of 32: narrow fringes of plain 32-key
    tiles join them to the 64-key ones, both in one tile (fused_kernels.fringe_pair). dq's band
    is cut in 32-key tiles within 64-key ones: (wide) fringes of plain 32-key tiles join them."""
    assert set(shaw_default["dkdv"]["loops"]) == {"band", "left", "right"}
    assert set(shaw_default["forward"]["loops"]) == {"band", "fringe pair", "left", "right"}
    assert set(shaw_default["dq"]["loops"]) == {"band", "left fringe", "left", "right fringe", "right"}
    assert shaw_default["forward"]["config"] == "128/64/8/3"


def test_off_the_band_a_tile_costs_what_a_flash_tile_costs(shaw_default):
    """The edge labels are row offsets and row sums there: within 5% of the control's loop."""
    full = shaw_default["control forward"]["loops"]["full"]
    assert shaw_default["forward"]["loops"]["left"] <= 1.05 * full
    assert shaw_default["forward"]["loops"]["right"] <= 1.05 * full


def test_no_kernel_spills(shaw_default):
    for name in ("forward", "dq", "dkdv"):
        assert shaw_default[name]["stack_bytes"] == 0, name


def ratio(records, length, kernels):
    return (sum(records[k]["estimate"][str(length)] for k in kernels)
            / sum(records[f"control {k}"]["estimate"][str(length)] for k in kernels))


def test_the_forward_stays_within_1_15x_the_controls_instructions_at_2048_and_1_05x_at_8192(shaw_default):
    """The forward at most 1.15x the control's warp-instructions at L = 2048 and 1.05x at 8192
    in this config."""
    assert ratio(shaw_default, 2048, ["forward"]) <= 1.15
    assert ratio(shaw_default, 8192, ["forward"]) <= 1.05


def test_the_backward_stays_within_1_25x_the_controls_instructions_at_2048_and_1_1x_at_8192(shaw_default):
    """dq + dk/dv at most 1.25x the control's warp-instructions at L = 2048 and 1.1x at 8192."""
    assert ratio(shaw_default, 2048, ["dq", "dkdv"]) <= 1.25
    assert ratio(shaw_default, 8192, ["dq", "dkdv"]) <= 1.1


def test_the_host_time_of_a_call_is_measured_with_launches_that_do_nothing():
    """docs/performance/launch_host.py runs the fused path's launch code, Triton's included, with
    a stand-in driver (kernels compiled for sm_90, nothing launched) and splits its time."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    script = os.path.join(os.path.dirname(__file__), "..", "docs", "performance", "launch_host.py")
    done = subprocess.run([sys.executable, script, "--steps", "3", "--repeats", "1", "--top", "20"], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "host time per forward + backward:" in done.stdout
    layers = [line.split("ms")[-1].strip() for line in done.stdout.splitlines()[3:7]]
    assert {"triton", "torch", "relpos_lab"} <= set(layers), done.stdout
    assert "run (jit.py" in done.stdout  # Triton's launch path ran: 5 launches, 3 through the heuristics
