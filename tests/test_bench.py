"""`relpos-lab bench` runs every benchmark end to end and records what it measured (no timing asserts)."""
import json

import pytest
import torch

from relpos_lab import cli, terminal
from relpos_lab.analysis import bench, bench_decode, bench_timing, candidates

TINY = ["--batch", "1", "--heads", "2", "--head-dim", "8", "--d-model", "16", "--d-ff", "32",
        "--layers", "1", "--length", "16", "--max-distance", "2", "--repeats", "2", "--warmup", "1"]


@pytest.mark.parametrize("what", ["attention", "layer", "model", "decode"])
def test_bench_writes_a_result_per_candidate(what, tmp_path):
    out = tmp_path / "bench.json"
    extra = ["--steps", "8"] if what == "decode" else []
    bench.main([what, *TINY, *extra, "--json", str(out)])
    payload = json.loads(out.read_text())
    names = {r["name"] for r in payload["results"]}
    expected = {
        "attention": {"sdpa", "unfused", "shaw-gather", "shaw-batched"},
        "layer": {"layer-none", "layer-shaw"},
        "model": {"model-sinusoidal", "model-shaw-auto"},
        "decode": {"decode-recompute", "decode-cached"},
    }[what]
    assert names == expected
    for r in payload["results"]:
        assert len(r["times_ms"]) == 2 and r["median_ms"] > 0 and r["ratio"] > 0
    assert payload["machine"]["threads"] >= 1


def test_decoder_only_model_bench_trains_the_lm_and_times_cached_generation(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["model", *TINY, "--architecture", "decoder_only", "--new-tokens", "8", "--json", str(out)])
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"model-sinusoidal", "model-shaw-auto", "generate-sinusoidal-recompute",
                            "generate-sinusoidal-cached", "generate-shaw-recompute", "generate-shaw-cached"}
    assert results["model-shaw-auto"]["shape"]["architecture"] == "decoder_only"
    assert results["generate-shaw-cached"]["shape"]["new_tokens"] == 8
    assert results["generate-shaw-recompute"]["ratio"] == 1.0 and results["generate-shaw-cached"]["ratio"] > 0


def test_model_bench_trains_shaw_at_randomized_positions_beside_the_plain_model(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["model", *TINY, "--impl", "gather", "--max-random-len", "64", "--json", str(out)])
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"model-sinusoidal", "model-shaw-gather", "model-shaw-gather-random64"}
    assert results["model-shaw-gather-random64"]["ratio"] > 0


@pytest.mark.slow  # a subprocess per scheme for its peak memory: 40-110 s
def test_model_bench_randomizes_every_scheme_and_measures_a_steps_memory(tmp_path):
    """--max-random-len reaches the --schemes candidates too; --memory gives each a training step's peak,
    which grows with the length (a subprocess per candidate on CPU)."""
    peaks = {}
    for length in ("16", "96"):
        out = tmp_path / f"bench{length}.json"
        bench.main(["model", *TINY, "--length", length, "--architecture", "encoder_only", "--impl", "gather",
                    "--schemes", "transformer_xl", "--max-random-len", "256", "--memory", "--json", str(out)])
        peaks[length] = {r["name"]: r["peak_mb"] for r in json.loads(out.read_text())["results"]}
    assert set(peaks["96"]) == {"model-sinusoidal", "model-transformer_xl", "model-transformer_xl-random256",
                                "model-shaw-gather", "model-shaw-gather-random256"}
    assert all(peak is not None and peak >= 0 for peak in peaks["96"].values())
    assert sum(peaks["96"].values()) > sum(peaks["16"].values())


def test_attention_bench_measures_peak_memory_in_a_subprocess(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["attention", *TINY, "--impl", "gather", "--memory", "--json", str(out)])
    peaks = {r["name"]: r["peak_mb"] for r in json.loads(out.read_text())["results"]}
    assert set(peaks) == {"sdpa", "unfused", "shaw-gather"}
    assert all(p is not None and p >= 0 for p in peaks.values())


def test_recompute_baseline_agrees_with_cached_greedy():
    import torch

    from relpos_lab.core.decoding import greedy_search
    from relpos_lab.core.transformer import EncoderDecoder, ModelConfig

    torch.manual_seed(0)
    model = EncoderDecoder(ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                                       n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)).eval()
    src = torch.randint(4, 20, (3, 5))
    cached = greedy_search(model, src, bos_id=1, eos_id=-1, pad_id=0, max_len_a=0.0, max_len_b=12)
    # The budget forces EOS (-1, never predicted) as the 12th token; the 11 before must agree.
    assert torch.equal(bench_decode.greedy_recompute(model, src, 12)[:, :11], cached[:, :11])


def test_bench_is_a_relpos_lab_verb(tmp_path):
    from relpos_lab.cli import main

    out = tmp_path / "decode.json"
    assert main(["bench", "decode", *TINY, "--steps", "4", "--json", str(out)]) == 0
    assert {r["name"] for r in json.loads(out.read_text())["results"]} == {"decode-recompute", "decode-cached"}


def test_bench_sweep_prints_how_long_the_largest_shipped_sweep_takes_to_expand(capsys, tmp_path, monkeypatch):
    """The measured numbers, of the expansion and of `sweep --slurm --dry-run` with docs/slurm.md's
    packed array, are shown in the test run too (no timing assert): a slower expansion shows."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["bench", "sweep", "ruoss2023_paper"]) in (0, None)
    expanded, dry_run = capsys.readouterr().out.splitlines()
    assert expanded.startswith("sweep ruoss2023_paper: 5,850 points expanded in ") and expanded.endswith(" ms a point)")
    assert dry_run.startswith("sweep ruoss2023_paper --slurm --dry-run trainer=gpu1 cluster=example "
                              "cluster.runs_per_gpu=8 cluster.cpus_per_task=2: ") and dry_run.endswith(" s CPU)")
    with capsys.disabled():
        print(f"\n{expanded}\n{dry_run}")


def test_a_missing_opennmt_peer_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no onmt/modules/multi_headed_attn.py there; unpack an OpenNMT-py wheel"):
        bench.main(["layer", *TINY, "--opennmt", str(tmp_path)])


def test_peak_memory_is_the_candidates_own_even_after_a_large_parent_peak():
    # On Linux a child's ru_maxrss starts at its parent's peak: after a big benchmark every
    # candidate's growth read 0 MB. The probe must see the candidate's own growth regardless.
    import torch

    ballast = torch.ones(96 * 2**20)  # 384 MiB touched in this (parent) process
    del ballast
    # unfused forward+backward at B=2, H=4, L=1024 holds several 32 MiB attention matrices
    peak = candidates.peak_memory_mb("unfused", 2, 4, 1024, 16, 2, torch.float32, torch.device("cpu"), 1)
    assert peak > 64, peak


def test_attention_bench_with_masks_compares_masked_candidates(tmp_path):
    import torch

    keys, causal = candidates.attention_mask("causal", 4, 16, torch.device("cpu"))
    assert causal and keys.shape == (4, 1, 1, 16)
    assert keys.sum(-1).flatten().tolist() == [16, 15, 14, 12]  # unequal lengths, the longest unpadded
    out = tmp_path / "bench.json"
    bench.main(["attention", *TINY, "--impl", "gather", "--mask", "causal", "--json", str(out)])
    results = json.loads(out.read_text())["results"]
    assert {r["name"] for r in results} == {"sdpa", "unfused", "shaw-gather"}
    assert all(r["shape"]["mask"] == "causal" for r in results)


def test_several_runs_report_the_spread_of_the_per_run_ratios(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["attention", *TINY, "--runs", "3", "--json", str(out)])
    for r in json.loads(out.read_text())["results"]:
        low, high = r["extra"]["ratio_range"]
        assert low <= r["ratio"] <= high and len(r["times_ms"]) == 3 * 2


def test_combining_runs_takes_medians_and_ranges():
    def result(ratio, ms):
        return bench_timing.Result("x", {"length": 8}, ms, [ms], None, ratio, {"speedup_over_opennmt": ratio})
    (combined,) = bench_timing.combine_runs([[result(1.0, 4.0)], [result(3.0, 8.0)], [result(2.0, 5.0)]])
    assert combined.ratio == 2.0 and combined.median_ms == 5.0 and combined.extra["ratio_range"] == [1.0, 3.0]
    assert combined.extra["speedup_over_opennmt_range"] == [1.0, 3.0] and combined.times_ms == [4.0, 8.0, 5.0]


@pytest.mark.slow  # inductor's C++ compiles: 20-50 s
def test_model_bench_times_each_candidate_compiled_beside_eager(tmp_path, capsys, monkeypatch):
    """--compile: a compiled twin per candidate, its compile time apart; FLOPs counted per token
    (Shaw's label terms add to sinusoidal's), host time per step; no MFU on a CPU. Piped at 80
    columns (`relpos-lab bench model --compile | cat`), every row still names its candidate whole:
    rich had cut them all to `model-…`, eager and compiled alike."""
    monkeypatch.setattr(terminal.console, "width", 80)
    out = tmp_path / "bench.json"
    assert cli.main(["bench", "model", *TINY, "--architecture", "encoder_only", "--impl", "gather", "--compile",
                     "--json", str(out)]) == 0
    results = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(results) == {"model-sinusoidal", "model-sinusoidal-compiled", "model-shaw-gather",
                            "model-shaw-gather-compiled"}
    rows = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.startswith("│ model-")]
    assert sorted(rows) == sorted(results)
    for name, r in results.items():
        extra = r["extra"]
        assert extra["host_ms"] > 0 and extra["tokens_per_s"] > 0 and "mfu" not in extra
        assert ("compile_s" in extra) == name.endswith("-compiled") and len(r["times_ms"]) == 2
        assert extra["gflop_per_token"] == results[name.removesuffix("-compiled")]["extra"]["gflop_per_token"]
    assert results["model-shaw-gather"]["extra"]["gflop_per_token"] > results["model-sinusoidal"]["extra"][
        "gflop_per_token"] > 0


def test_model_bench_trains_other_schemes_beside_sinusoidal_and_shaw(tmp_path):
    out = tmp_path / "bench.json"
    bench.main(["model", *TINY, "--schemes", "rope", "alibi", "--json", str(out)])
    names = [r["name"] for r in json.loads(out.read_text())["results"]]
    assert names == ["model-sinusoidal", "model-rope", "model-alibi", "model-shaw-auto"]


def test_mfu_is_counted_flops_per_second_over_the_gpus_peak():
    from relpos_lab.analysis.throughput import PEAK_BF16, mfu, step_flops

    weight = torch.randn(32, 64)
    assert step_flops(lambda: torch.randn(8, 32) @ weight) == 2 * 8 * 32 * 64
    assert mfu(989e12 * 0.5, 1000.0, PEAK_BF16["H200"]) == pytest.approx(0.5)


def test_model_bench_prints_a_stacks_ops_per_run_step_beside_the_solo_step(tmp_path):
    """`bench model --stack K`: each candidate also as K runs stacked into one model; both rows carry
    the aten ops dispatched per run-step, the stack's a fraction of the solo step's."""
    out = tmp_path / "r.json"
    bench.main(["model", *TINY, "--architecture", "encoder_only", "--impl", "gather", "--stack", "4",
                "--json", str(out)])
    rows = {r["name"]: r for r in json.loads(out.read_text())["results"]}
    assert set(rows) == {"model-sinusoidal", "model-sinusoidal-stack4", "model-shaw-gather", "model-shaw-gather-stack4"}
    for solo in ("model-sinusoidal", "model-shaw-gather"):
        assert rows[solo + "-stack4"]["extra"]["ops_per_run_step"] < rows[solo]["extra"]["ops_per_run_step"] / 2
