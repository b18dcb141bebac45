"""`sweep --list --step-times`: a sweep priced from the step times of a real `bench model --json` file."""
from __future__ import annotations

import json

import pytest

from relpos_lab import cli
from relpos_lab.analysis import bench
from relpos_lab.analysis.estimate import StepTimes, estimate
from relpos_lab.api.errors import UserError
from relpos_lab.launch.sweep import load_sweep

from test_sweep import TINY_SWEEP, write_sweep


def bench_json(tmp_path, *args: str) -> str:
    """`bench model` at the tiny sweep's shape (the debug overlay's d_model 16, 2 heads, d_ff 32), timed for real."""
    path = tmp_path / f"bench{len(list(tmp_path.glob('bench*.json')))}.json"
    bench.main(["model", "--d-model", "16", "--heads", "2", "--d-ff", "32", "--layers", "1", "--batch", "2",
                "--length", "8", "--max-distance", "2", "--repeats", "1", "--warmup", "0", "--threads", "1",
                "--schemes", "none", "--json", str(path), *args])
    return str(path)


def configs(sweep_path, *overrides: str):
    grid = load_sweep(sweep_path, list(overrides))
    return [grid.config(p.index) for p in grid.points]


def test_a_point_costs_its_steps_at_its_schemes_measured_step(tmp_path):
    times = StepTimes.read(bench_json(tmp_path))
    assert {"model-sinusoidal", "model-none", "model-shaw-auto"} <= set(times.eager_ms)
    sweep = write_sweep(tmp_path)  # none and shaw k=2, seeds 1 and 2, 12 steps each
    priced = estimate(configs(sweep), times)
    assert priced.priced == 4 and not priced.missing and not priced.other_shape
    ms = times.eager_ms["model-none"] + times.eager_ms["model-shaw-auto"]
    assert priced.eager_hours == pytest.approx(2 * 12 * ms / 3.6e6)
    assert priced.compiled_hours is None  # the bench ran without --compile
    assert estimate(configs(sweep, "trainer.max_steps=36"), times).eager_hours == pytest.approx(
        3 * priced.eager_hours)


def test_compiled_steps_add_their_compile_once_per_run(tmp_path):
    path = bench_json(tmp_path)
    data = json.loads(open(path).read())
    for row in list(data["results"]):  # the rows --compile writes, at twice the eager step
        data["results"].append({**row, "name": row["name"] + "-compiled", "median_ms": 2 * row["median_ms"],
                                "extra": {**row["extra"], "compile_s": 30.0}})
    (tmp_path / "compiled.json").write_text(json.dumps(data))
    priced = estimate(configs(write_sweep(tmp_path)), StepTimes.read(tmp_path / "compiled.json"))
    assert priced.compiled_hours == pytest.approx(2 * priced.eager_hours + 4 * 30 / 3600)


def test_schemes_the_bench_lacks_and_another_shape_are_named(tmp_path, capsys):
    sweep = write_sweep(tmp_path, TINY_SWEEP.replace("none: {model.positions.scheme: none}",
                                                     "alibi: {model.positions.scheme: alibi}"))
    priced = estimate(configs(sweep, "model.d_model=128"), StepTimes.read(bench_json(tmp_path)))
    assert priced.priced == 2 and priced.missing == {"model-alibi": 2}
    assert priced.other_shape == {"d_model": (16, {128})}
    assert cli.main(["sweep", str(sweep), "--list", "--step-times", bench_json(tmp_path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "estimated on cpu: " in out
    assert "eager (no compiled step times: bench model --compile), for 2 point(s)" in out
    assert "no step time for model-alibi (2 points): add the scheme to bench model" in out


def test_step_times_need_list_and_a_bench_model_file(tmp_path, capsys):
    sweep = write_sweep(tmp_path)
    assert cli.main(["sweep", str(sweep), "--step-times", "bench.json"]) != 0
    assert "--step-times goes with --list" in capsys.readouterr().err
    (tmp_path / "other.json").write_text(json.dumps({"bench": "attention", "results": []}))
    assert cli.main(["sweep", str(sweep), "--list", "--step-times", str(tmp_path / "other.json")]) != 0
    assert "not a `relpos-lab bench model --json` file (it is a `bench attention` file)" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"missing.json: No such file or directory; write the file with"):
        StepTimes.read(tmp_path / "missing.json")


def test_a_stacked_sweep_costs_one_stacked_step_a_stack_and_says_its_ops(tmp_path, capsys):
    """`--list --stack 2` with a `bench model --stack 2` file: each scheme's two seeds are one stack
    at the measured two-run step; the bench's ops per run-step are printed beside."""
    path = bench_json(tmp_path, "--stack", "2")
    times = StepTimes.read(path)
    assert {"model-none", "model-shaw-auto"} <= set(times.stacked) and times.stacked["model-none"][0] == 2
    assert times.ops["model-none"] > times.ops["model-none-stack2"] > 0
    sweep = write_sweep(tmp_path)  # none and shaw k=2, seeds 1 and 2, 12 steps each
    assert cli.main(["sweep", str(sweep), "--list", "--stack", "2", "--step-times", path,
                     "cluster.runs_per_gpu=4"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "with --stack 2: stack of 2: points 0 1 stack of 2: points 2 3" in out
    stacked_ms = times.stacked["model-none"][1] + times.stacked["model-shaw-auto"][1]
    priced = estimate(configs(sweep), times, [[0, 1], [2, 3]])
    assert priced.stacked.hours == pytest.approx(12 * stacked_ms / 3.6e6) and priced.stacked.stacks == 2
    assert "stacked (--stack): " in out and "2 stack(s) at the stacked step bench model measured " \
        "(model-none K=2, model-shaw-auto K=2), 0 point(s) alone" in out
    assert f"model-none {times.ops['model-none']:,.0f} alone, {times.ops['model-none-stack2']:,.1f} stacked at K=2" \
        in out
    assert priced.packed_by == 1 and estimate(configs(sweep, "cluster.runs_per_gpu=4"), times).packed_by == 4
    assert ", packed 4 a GPU at best " in out


def test_list_stack_without_step_times_shows_the_stacks_and_how_to_price_them(tmp_path, capsys):
    assert cli.main(["sweep", str(write_sweep(tmp_path)), "--list", "--stack", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "with --stack 8: stack of 2: points 0 1 stack of 2: points 2 3" in out
    assert "price it with --step-times, from `relpos-lab bench model --stack 8 --json FILE`" in out
