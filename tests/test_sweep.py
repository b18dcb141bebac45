"""Sweeps and reports: grid expansion, a real 2 schemes × 2 seeds sweep on CPU, exact aggregation."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.analysis.report import write_report
from relpos_lab.api.errors import ConfigError, UserError
from relpos_lab.config import load
from relpos_lab.launch.sweep import link_identical_runs, load_sweep
from relpos_lab.records.rundir import run_directory

TINY_EXPERIMENT = """\
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 3], valid_lengths: [1, 3], test_lengths: [1, 5], train_size: 200, eval_size_per_length: 2}
trainer: {max_steps: 12, val_every_n_steps: 6, log_every_n_steps: 3}
logging: {wandb: {mode: disabled}}
"""

TINY_SWEEP = """\
experiment: tiny.yaml
name: tiny_study
overrides: [optim.lr=0.003]
grid:
  scheme:
    none: {model.positions.scheme: none}
    shaw_k2: {model.positions.scheme: shaw, model.positions.max_distance: 2}
  seed: [1, 2]
"""


def write_sweep(tmp_path: Path, sweep: str = TINY_SWEEP) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY_EXPERIMENT
                                        + f"logging: {{root: {tmp_path / 'runs'}, wandb: {{mode: disabled}}}}\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep)
    return path


def test_grid_is_the_product_of_axes_with_labels_and_overrides(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path), ["trainer.max_steps=5"])
    assert [p.labels for p in sweep.points] == [
        {"scheme": "none", "seed": "1"}, {"scheme": "none", "seed": "2"},
        {"scheme": "shaw_k2", "seed": "1"}, {"scheme": "shaw_k2", "seed": "2"}]
    cfg = sweep.config(3)
    assert (cfg.model.positions.scheme, cfg.model.positions.max_distance, cfg.seed) == ("shaw", 2, 2)
    assert cfg.name == "tiny_study" and cfg.optim.lr == 0.003 and cfg.trainer.max_steps == 5
    assert list(cfg.logging.wandb.tags) == ["scheme=shaw_k2", "seed=2"]
    assert len({p.run_dir for p in sweep.points}) == 4
    assert sweep.directory == tmp_path / "runs" / "tiny_study"


def test_excluded_combinations_are_no_points(tmp_path):
    """A combination that a config refuses (a scheme a format cannot take) is left out of the grid."""
    text = TINY_SWEEP.replace("grid:", "exclude:\n  - {scheme: shaw_k2, seed: [2]}\ngrid:")
    sweep = load_sweep(write_sweep(tmp_path, text))
    assert [p.labels for p in sweep.points] == [
        {"scheme": "none", "seed": "1"}, {"scheme": "none", "seed": "2"}, {"scheme": "shaw_k2", "seed": "1"}]
    assert [p.index for p in sweep.points] == [0, 1, 2]


@pytest.mark.parametrize("rule,message", [
    ("{schemes: none}", "no axis of the grid"), ("{scheme: shaw}", "'shaw', which is no label"),
    ("[scheme]", "mappings"),
])
def test_bad_exclusions_are_clear_errors(tmp_path, rule, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_sweep(tmp_path, TINY_SWEEP.replace("grid:", f"exclude: [{rule}]\ngrid:")))


def test_a_worker_resolves_only_its_own_point(tmp_path):
    """`sweep --point N` checks point N alone (a grid of 700 points took each worker a minute)."""
    path = write_sweep(tmp_path)
    full, one = load_sweep(path), load_sweep(path, only=2)
    assert [p.run_dir for p in one.points] == ["", "", full.points[2].run_dir, ""]
    assert one.overrides_of(2) == full.overrides_of(2) and one.directory == full.directory


@pytest.mark.parametrize("text,message", [
    ("experiment: tiny.yaml\ngrid: {seed: [1]}\nseeds: 3\n", "unknown sweep key 'seeds'"),
    ("grid: {seed: [1]}\n", "missing required key 'experiment'"),
    ("experiment: nowhere.yaml\ngrid: {seed: [1]}\n", "experiment file not found"),
    ("experiment: tiny.yaml\ngrid: {seed: []}\n", "grid.seed must be a non-empty list"),
    ("experiment: tiny.yaml\ngrid: {seed: [1, 1]}\n", "same config"),
    ("experiment: tiny.yaml\ngrid: {model.positions.shceme: [none]}\n", "shceme"),
    ("experiment: tiny.yaml\ngrid: {seed: [1]}\nreference: {metric: bleu, values: {a: 1}}\n",
     "exactly the keys source, metric, split, values"),
    ("experiment: tiny.yaml\ngrid: {optim.lr: [0.1, 0.2], seed: [1]}\n"
     "reference: {source: paper, metric: bleu, split: test, values: {'0.1': 1, '0.3': 2}}\n",
     "names '0.3', which is no group"),
])
def test_bad_sweep_files_are_clear_errors(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_sweep(tmp_path, text))


def test_tiny_sweep_runs_end_to_end_and_the_report_aggregates_it(tmp_path):
    path = write_sweep(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, "-m", "relpos_lab", "sweep", str(path), "--max-parallel", "2"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    sweep = load_sweep(path)
    results = [json.loads((Path(p.run_dir) / "results.json").read_text()) for p in sweep.points]
    # the time a point took, as the sweep says it and as the report averages it: its process's, to its results
    said = {int(i): s for i, s in re.findall(r"point (\d+) .*: done in (\d+)s", res.stdout)}
    assert said == {i: f"{r['wall_seconds']:.0f}" for i, r in enumerate(results)}, res.stdout

    again = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "4 already finished; running 0" in again.stdout

    report = write_report(sweep.directory, tmp_path / "report")
    rows = {r["group"]: r for r in csv.DictReader(open(tmp_path / "report" / "summary.csv"))}
    assert set(rows) == {"none", "shaw_k2"}
    for i, group in enumerate(("none", "shaw_k2")):
        seeds = [results[2 * i]["metrics"]["test/exact_match"], results[2 * i + 1]["metrics"]["test/exact_match"]]
        mean = sum(seeds) / 2
        std = abs(seeds[0] - seeds[1]) / 2 ** 0.5  # sample std of two values
        assert float(rows[group]["exact_match_mean"]) == pytest.approx(mean, abs=1e-6)
        assert float(rows[group]["exact_match_std"]) == pytest.approx(std, abs=1e-6)
        assert rows[group]["n_runs"] == "2"
    by_length = list(csv.DictReader(open(tmp_path / "report" / "by_length.csv")))
    five = [r for r in by_length if r["group"] == "shaw_k2" and r["metric"] == "exact_match" and r["length"] == "5"]
    want = (results[2]["by_length"]["test"]["5"]["exact_match"]
            + results[3]["by_length"]["test"]["5"]["exact_match"]) / 2
    assert float(five[0]["mean"]) == pytest.approx(want, abs=1e-6)
    text = report.read_text()
    assert "training lengths 1–3" in text and "| shaw_k2 | 2 |" in text
    minutes = [r["wall_seconds"] / 60 for r in results]
    assert (f"wall time {sum(minutes) / 4:.1f} min per run ({min(minutes):.1f}–{max(minutes):.1f}, "
            "4 runs not resumed)") in text
    assert (tmp_path / "report" / "exact_match_by_length.png").stat().st_size > 5000


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="a process's start is read from /proc")
def test_a_runs_wall_time_counts_from_its_process_start():
    """A point's wall_seconds count from its process's start (interpreter and imports included), so
    the report's wall time per run is the time the sweep waited for it."""
    code = ("import time; time.sleep(1.5); from relpos_lab.cli.runs import process_started; "
            "print(time.time() - process_started())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert 1.5 <= float(out.stdout) < 60


def _fake_run(root: Path, name: str, exact: float, by_len: dict, seed: int, **extra) -> str:
    run = root / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"seed: {seed}\ntask: {{train_lengths: [1, 2]}}\n")
    (run / "results.json").write_text(json.dumps({
        "metrics": {"test/exact_match": exact},
        "by_length": {"test": {str(n): {"exact_match": v, "n": 4} for n, v in by_len.items()}}, **extra}))
    return str(run)


def test_missing_points_collapse_an_axis_missing_whole():
    from relpos_lab.analysis.report import missing_patterns

    labels = [{"seed": s, "task": t, "scheme": c} for s in "12" for t in ("even", "odd") for c in ("a", "b", "c")]
    manifest = {"axes": ["seed", "task", "scheme"], "points": [{"labels": l} for l in labels]}
    done = [{"seed": "1", "task": "even", "scheme": "a"}, {"seed": "1", "task": "odd", "scheme": "a"},
            {"seed": "1", "task": "even", "scheme": "b"}]
    missing = [{"labels": l} for l in labels if l not in done]
    assert missing_patterns(manifest, missing) == [
        {"seed": "1", "task": "*", "scheme": "c"}, {"seed": "1", "task": "odd", "scheme": "b"},
        {"seed": "2", "task": "*", "scheme": "*"}]


def test_report_numbers_on_hand_made_results(tmp_path):
    root = tmp_path / "runs" / "hand"
    points = [
        ({"scheme": "a", "seed": "1"}, _fake_run(root, "a1", 0.5, {1: 1.0, 3: 0.0}, 1)),
        ({"scheme": "a", "seed": "2"}, _fake_run(root, "a2", 0.7, {1: 1.0, 3: 0.5}, 2)),
        ({"scheme": "a", "seed": "3"}, _fake_run(root, "a3", 0.9, {1: 0.5, 3: 1.0}, 3)),
        ({"scheme": "b", "seed": "1"}, str(root / "b1-never-ran")),
    ]
    (root / "sweep.json").write_text(json.dumps({
        "name": "hand", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                           for i, (l, d) in enumerate(points)]}))
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "| a | 3 | 0.700 ± 0.200 |" in text  # mean of .5 .7 .9, sample std .2
    assert "Missing (1 points without results):** scheme=b seed=1" in text
    assert "| a | 0.83±0.29 | 0.50±0.50 |" in text  # length 1: 1, 1, .5; length 3: 0, .5, 1
    assert "seeds 1, 2, 3" in text and "training lengths 1–2" in text
    assert "| a | 2 | 0.700 | `a2` |" in text  # every run listed with its seed
    assert "b1-never-ran" not in text.split("## Runs")[1]
    assert (tmp_path / "out" / "groups.png").stat().st_size > 5000


def test_aggregate_max_reports_each_groups_best_run_and_its_curve(tmp_path, capsys):
    """The papers' best-of over seeds: the best run's score, and by length that run's whole curve
    (a3, the best on exact match), not the best at each length; the header says which it is."""
    root = tmp_path / "runs" / "hand"
    points = [({"scheme": "a", "seed": str(i)}, _fake_run(root, f"a{i}", score, curve, i))
              for i, (score, curve) in enumerate([(0.5, {1: 1.0, 3: 0.0}), (0.7, {1: 1.0, 3: 0.5}),
                                                  (0.9, {1: 0.5, 3: 1.0})], start=1)]
    (root / "sweep.json").write_text(json.dumps({
        "name": "hand", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                           for i, (l, d) in enumerate(points)]}))
    assert cli.main(["report", str(root), "--out", str(tmp_path / "out"), "--metric", "exact_match",
                 "--aggregate", "max"]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "**The best run** over seed" in text and "Mean ± sample std" not in text
    assert "| a | 3 | 0.900 |" in text
    assert "| a | 0.50 | 1.00 |" in text  # a3's curve; the best at each length would be 1.00, 1.00
    summary = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert summary[0]["exact_match_best"] == "0.900000" and "exact_match_std" not in summary[0]
    assert "**The best run**" in capsys.readouterr().out
    with pytest.raises(UserError, match="--aggregate median: expected one of mean, max"):
        write_report(root, tmp_path / "other", how="median")


def test_report_shows_budget_signatures_and_the_published_numbers(tmp_path):
    root = tmp_path / "runs" / "paper"
    budget = {"global_step": 600, "parameters": 2_404_000}
    sig = {"details": {"test": {"bleu_signature": "nrefs:1|tok:13a"}}}
    points = [
        ({"k": "0", "seed": "1"}, _fake_run(root, "k0", 0.1, {}, 1, wall_seconds=600.0, **budget, **sig)),
        ({"k": "16", "seed": "1"}, _fake_run(root, "k16", 0.3, {}, 1, wall_seconds=900.0,
                                             **{**budget, "parameters": 2_431_000}, **sig)),
        ({"k": "16", "seed": "2"}, _fake_run(root, "k16b", 0.5, {}, 2, wall_seconds=1.0, started_at_step=500,
                                             **budget, **sig)),  # a resumed attempt: not a run's wall time
    ]
    (root / "sweep.json").write_text(json.dumps({
        "name": "paper", "sweep_file": "x.yaml",
        "reference": {"source": "Table 2", "metric": "bleu", "values": {"0": 12.5, "16": 25.8, "64": 25.9}},
        "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d} for i, (l, d) in enumerate(points)]}))
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "| group | runs | exact_match | paper bleu |" in text
    assert "| 0 | 1 | 0.100 | 12.5 |" in text and "| 16 | 2 | 0.400 ± 0.141 | 25.8 |" in text
    assert "Column *paper bleu*: Table 2" in text
    assert ("Budget: 600 steps; 2.40–2.43 M parameters; wall time 12.5 min per run "
            "(10.0–15.0, 2 runs not resumed).") in text
    assert "Signatures: bleu_signature: `nrefs:1|tok:13a`." in text
    assert "differ" not in text


def test_report_calls_out_runs_that_scored_different_data(tmp_path):
    root = tmp_path / "runs" / "mixed"
    points = [({"k": "16", "seed": str(seed)},
               _fake_run(root, f"r{seed}", 0.5, {}, seed,
                         details={"test": {"data_signature": f"sentences:2000|sha256:{digest}"}}))
              for seed, digest in ((1, "aaa"), (2, "bbb"))]
    (root / "sweep.json").write_text(json.dumps({
        "name": "mixed", "sweep_file": "x.yaml",
        "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d} for i, (l, d) in enumerate(points)]}))
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "data_signature: `sentences:2000|sha256:aaa` / `sentences:2000|sha256:bbb`" in text
    assert "**The runs differ in data_signature** (2 values)" in text


def _hand_sweep(root: Path, exact: float, reference=None) -> None:
    """A one-point sweep whose manifest names its run relative to the directory it started in."""
    _fake_run(root / "runs" / "s", "r1", exact, {}, 1)
    (root / "runs" / "s" / "sweep.json").write_text(json.dumps({
        "name": "s", "sweep_file": "x.yaml", "axes": ["k", "seed"], "reference": reference,
        "points": [{"index": 0, "labels": {"k": "0", "seed": "1"}, "overrides": [], "run_dir": "runs/s/r1"}]}))


def test_report_reads_its_own_runs_from_any_working_directory(tmp_path, monkeypatch):
    _hand_sweep(tmp_path / "a", 0.1)
    _hand_sweep(tmp_path / "b", 0.9)  # a copy of the same sweep elsewhere, e.g. rsynced from a cluster
    monkeypatch.chdir(tmp_path / "b")
    text = write_report(tmp_path / "a" / "runs" / "s", tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "| 0 | 1 | 0.100 |" in text


def test_the_report_shows_every_metric_but_the_loss_by_default(tmp_path):
    run = tmp_path / "runs" / "s" / "r1"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("seed: 1\n")
    (run / "results.json").write_text(json.dumps({"metrics": {"test/bleu": 30.0, "test/chrf": 50.0, "test/loss": 2.0,
                                                              "test/ppl": 7.4, "valid/bleu": 31.0}}))
    (tmp_path / "runs" / "s" / "sweep.json").write_text(json.dumps({
        "name": "s", "sweep_file": "x.yaml", "axes": ["seed"],
        "points": [{"index": 0, "labels": {"seed": "1"}, "overrides": [], "run_dir": str(run)}]}))
    text = write_report(tmp_path / "runs" / "s", tmp_path / "out").read_text()
    assert "| group | runs | bleu | chrf |\n" in text and "| s | 1 | 30.000 | 50.000 |" in text


def test_a_language_models_perplexity_is_reported_and_drawn_by_length_by_default(tmp_path):
    """Task lm's main metric is ppl: the report shows it, and ppl_by_length.png has one curve per
    scheme against evaluation length (the ALiBi paper's Figure 1)."""
    root, points = tmp_path / "runs" / "lm", []
    for i, (scheme, ppl) in enumerate((("alibi", 20.0), ("sinusoidal", 25.0))):
        run = root / scheme
        run.mkdir(parents=True)
        (run / "config.yaml").write_text("seed: 1\n")
        (run / "results.json").write_text(json.dumps({
            "main_metric": "valid/ppl", "train_lengths": [1, 64],
            "metrics": {"test/ppl": ppl, "test/loss": 3.0, "test/ppl_ood": ppl * 2},
            "by_length": {"test": {"64": {"ppl": ppl, "n": 100}, "128": {"ppl": ppl * 2, "n": 100}}}}))
        points.append({"index": i, "labels": {"scheme": scheme}, "overrides": [], "run_dir": str(run)})
    (root / "sweep.json").write_text(json.dumps({"name": "lm", "sweep_file": "x.yaml", "axes": ["scheme"],
                                                "points": points}))
    text = write_report(root, tmp_path / "out").read_text()
    assert "| group | runs | ppl | ppl_ood |" in text and "| alibi | 1 | 20.000 | 40.000 |" in text
    assert (tmp_path / "out" / "ppl_by_length.png").stat().st_size > 5000


def test_report_refuses_an_unknown_axis_to_average_over(tmp_path):
    _hand_sweep(tmp_path, 0.5)
    with pytest.raises(UserError, match="--over seeds: no such axis in sweep s; its axes are k, seed"):
        write_report(tmp_path / "runs" / "s", tmp_path / "out", over=("seeds",))


def test_a_sweep_without_a_seed_axis_reports_each_grid_point_as_its_own_group(tmp_path, monkeypatch, capsys):
    """It used to fail: `--over seed: no such axis`, with seed the default of --over."""
    from relpos_lab import cli

    root = tmp_path / "runs" / "noseed"
    points = [({"k": "0"}, _fake_run(root, "k0", 0.1, {1: 0.2}, 1)),
              ({"k": "16"}, _fake_run(root, "k16", 0.3, {1: 0.4}, 1))]
    (root / "sweep.json").write_text(json.dumps({
        "name": "noseed", "sweep_file": "x.yaml", "axes": ["k"],
        "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d} for i, (l, d) in enumerate(points)]}))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "runs/noseed", "--out", "out", "--metric", "exact_match"]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert ("(2 runs; sweep file `x.yaml`). Each grid point is its own group: the sweep has no `seed` axis to average "
            "over (a grid axis `seed: [1, 2, 3]` gives mean ± std); split `test`") in text
    assert "| 0 | 1 | 0.100 |" in text and "| 16 | 1 | 0.300 |" in text
    assert "| 16 | 0.40 |" in text  # by length
    capsys.readouterr()
    assert cli.main(["report", "runs/noseed", "--out", "out", "--over", "seed"]) == 2  # asked for: still an error
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: --over seed: no such axis in sweep noseed; "
                                                      "its axes are k (without --over, a sweep with no seed axis")


def test_published_numbers_are_shown_only_beside_their_own_split(tmp_path):
    _hand_sweep(tmp_path, 0.5,
                reference={"source": "Table 2", "metric": "bleu", "split": "test", "values": {"0": 12.5}})
    sweep_dir = tmp_path / "runs" / "s"
    # default: the reference's split
    text = write_report(sweep_dir, tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "split `test`" in text and "| 0 | 1 | 0.500 | 12.5 |" in text
    text = write_report(sweep_dir, tmp_path / "out", split="valid", metrics=("exact_match",)).read_text()
    assert "paper bleu" not in text and "compare with split `test`, not `valid`: not shown" in text


@pytest.mark.slow  # ~40 s: two sweeps trained; the default run keeps the link checks below
def test_reuse_links_a_point_that_another_sweep_already_trained(tmp_path):
    write_sweep(tmp_path, "")
    (tmp_path / "first.yaml").write_text("experiment: tiny.yaml\nname: first\ngrid: {seed: [1]}\n")
    (tmp_path / "second.yaml").write_text("experiment: tiny.yaml\nname: second\ngrid: {seed: [1, 2]}\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}

    def sweep(*args):
        res = subprocess.run([sys.executable, "-m", "relpos_lab", "sweep", *args], capture_output=True, text=True,
                             env=env, cwd=tmp_path, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout

    sweep("first.yaml")
    (trained,) = (tmp_path / "runs" / "first").glob("*/results.json")
    out = sweep("second.yaml", "--reuse")
    assert "point 0 seed=1: the same experiment finished in" in out
    assert "1 already finished; running 1" in out
    second = load_sweep(tmp_path / "second.yaml")
    linked, fresh = (Path(p.run_dir) for p in second.points)
    assert linked.is_symlink() and linked.resolve() == trained.parent.resolve()
    assert not fresh.is_symlink() and (fresh / "results.json").is_file()
    assert "nothing to train" in sweep("second.yaml", "--point", "0")
    assert "running 0" in sweep("first.yaml", "--reuse")  # nothing to link back: its point is trained
    write_report(second.directory, tmp_path / "report")
    (row,) = csv.DictReader(open(tmp_path / "report" / "summary.csv"))
    assert row["n_runs"] == "2"


def test_reuse_removes_a_link_whose_run_was_withdrawn_so_the_point_trains_again(tmp_path):
    grid = load_sweep(write_sweep(tmp_path, "experiment: tiny.yaml\nname: s\ngrid: {seed: [1]}\n"))
    run_dir = Path(grid.points[0].run_dir)
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to("../other/translation-deleted")
    said = []
    assert link_identical_runs(grid, echo=said.append) == 0
    assert not run_dir.is_symlink() and not run_dir.exists()
    assert said == ["  point 0 seed=1: linked to a run that is gone: link removed"]


def test_training_a_point_whose_link_dangles_says_how_to_fix_it(tmp_path):
    path = write_sweep(tmp_path, "experiment: tiny.yaml\nname: s\ngrid: {seed: [1]}\n")
    run_dir = Path(load_sweep(path).points[0].run_dir)
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to("../other/translation-deleted")
    res = subprocess.run([sys.executable, "-m", "relpos_lab", "sweep", str(path), "--point", "0"],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode != 0
    assert "links to a run that is gone; rerun with --reuse (it removes the link) or delete the link" in res.stderr
    assert run_dir.is_symlink()  # nothing was written through it


def test_dry_run_without_slurm_runs_nothing_and_names_list(tmp_path, monkeypatch, capsys):
    from relpos_lab import cli

    sweep = write_sweep(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", str(sweep), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--dry-run goes with --slurm" in err and "--list" in err
    assert not any(tmp_path.glob("runs/*/*/results.json")) and not (tmp_path / "runs").exists()

def _inspect_json(run: str, mass: list) -> None:
    """A hand-made inspect.json: one layer, heads x offsets -1..1, on split valid."""
    (Path(run) / "inspect.json").write_text(json.dumps({"split": "valid", "sets": {"valid": {"attention": {
        "encoder_self": {"offsets": [-1, 0, 1], "mass": [mass]}}}}}))


def test_report_draws_each_groups_mean_attention_by_offset(tmp_path):
    root = tmp_path / "runs" / "att"
    points = [({"scheme": s, "seed": str(i)}, _fake_run(root, f"{s}{i}", 0.5, {1: 1.0}, i))
              for s in ("shaw", "none") for i in (1, 2)]
    _inspect_json(points[0][1], [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # shaw: heads mean (.5, .5, 0)
    _inspect_json(points[1][1], [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])  # mean (0, 0, 1)
    (root / "sweep.json").write_text(json.dumps({
        "name": "att", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                          for i, (l, d) in enumerate(points)]}))
    from relpos_lab.analysis.report import load_groups
    from relpos_lab.analysis.report_figures import attention_curves

    _, groups, _, _ = load_groups(root)
    curves = attention_curves(groups)
    assert curves == {"encoder_self": {"shaw": ([-1, 0, 1], [0.25, 0.25, 0.5])}}  # "none" has no inspect.json
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    assert "## Attention by relative offset" in text and "![encoder_self](attention_encoder_self.png)" in text
    assert (tmp_path / "out" / "attention_encoder_self.png").stat().st_size > 5000


def test_a_two_axis_sweep_gets_a_leaderboard_of_tasks_by_schemes(tmp_path):
    root = tmp_path / "runs" / "suite"
    points = []
    for task, scores in (("parity", {"rope": (0.5, 0.7), "shaw": (0.9, 0.9)}), ("reverse", {"rope": (0.6, 0.6)})):
        for scheme, values in scores.items():
            for seed, value in enumerate(values, start=1):
                run = _fake_run(root, f"{task}-{scheme}-{seed}", value, {1: value}, seed)
                points.append(({"seed": str(seed), "task": task, "scheme": scheme}, run))
    (root / "sweep.json").write_text(json.dumps({
        "name": "suite", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                            for i, (l, d) in enumerate(points)]}))
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    board = text.split("## Leaderboard: exact_match")[1].split("##")[0]
    assert "| task | rope | shaw |" in board
    assert "| parity | 0.600 ± 0.141 | **0.900 ± 0.000** |" in board
    assert "| reverse | **0.600 ± 0.000** |  |" in board
    assert "| mean over tasks | 0.600 | — |" in board  # rope: (0.6 + 0.6) / 2; shaw has no reverse run
    assert (tmp_path / "out" / "exact_match_by_length_per_task.png").stat().st_size > 5000  # a panel per task
    assert "![exact_match per task](exact_match_by_length_per_task.png)" in text
    one_axis = _fake_run(tmp_path / "runs" / "one", "a1", 0.5, {1: 0.5}, 1)
    (tmp_path / "runs" / "one" / "sweep.json").write_text(json.dumps({
        "name": "one", "sweep_file": "x.yaml", "points": [{"index": 0, "labels": {"scheme": "a", "seed": "1"},
                                                          "overrides": [], "run_dir": one_axis}]}))
    assert "Leaderboard" not in write_report(tmp_path / "runs" / "one", tmp_path / "out1").read_text()


def test_the_leaderboard_shows_in_distribution_beside_and_marks_a_cell_that_did_not_fit(tmp_path):
    """The papers' suites test only longer lengths; their validation split holds the training ones.
    A cell below the threshold there is marked and is no row's best, however it scores beyond."""
    root = tmp_path / "runs" / "suite"
    points = []
    for scheme, test, valid in (("rope", 0.7, 0.62), ("shaw", 0.6, 0.98)):
        run = _fake_run(root, f"parity-{scheme}", test, {}, 1)
        results = json.loads((Path(run) / "results.json").read_text())
        results["metrics"]["valid/exact_match"] = valid
        (Path(run) / "results.json").write_text(json.dumps(results))
        points.append(({"seed": "1", "task": "parity", "scheme": scheme}, run))
    (root / "sweep.json").write_text(json.dumps({
        "name": "suite", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                            for i, (l, d) in enumerate(points)]}))
    board = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text().split("## Leaderboard")[1]
    assert "| parity | 0.700 (id 0.620, did not fit) | **0.600** (id 0.980) |" in board
    assert "| fitted (id ≥ 0.9) | 0/1 | 1/1 |" in board
    lenient = write_report(root, tmp_path / "out2", metrics=("exact_match",), fit_threshold=0.5).read_text()
    assert "| parity | **0.700** (id 0.620) | 0.600 (id 0.980) |" in lenient


def _suite_with_reference(root: Path, reference: dict) -> Path:
    """Tasks parity × schemes rope, shaw (both run) and reverse × rope (run), shaw (never ran)."""
    points = []
    for task, scheme, value in (("parity", "rope", 0.6), ("parity", "shaw", 0.9), ("reverse", "rope", 0.5)):
        points.append(({"seed": "1", "task": task, "scheme": scheme},
                       _fake_run(root, f"{task}-{scheme}", value, {}, 1)))
    points.append(({"seed": "1", "task": "reverse", "scheme": "shaw"}, str(root / "never-ran")))
    (root / "sweep.json").write_text(json.dumps({
        "name": "suite", "sweep_file": "x.yaml", "reference": reference,
        "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d} for i, (l, d) in enumerate(points)]}))
    return root


def test_the_leaderboard_puts_the_published_number_after_ours_and_says_where_there_is_none(tmp_path):
    root = _suite_with_reference(tmp_path / "runs" / "suite", {
        "source": "Paper, Table 1, at another scale", "metric": "exact_match", "split": "test",
        "values": {"parity rope": 0.55, "reverse shaw": 0.7}})
    text = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text()
    board = text.split("## Leaderboard: exact_match")[1].split("##")[0]
    assert ("After ·: Paper, Table 1, at another scale (published; not computed here; —: no number there for "
            "that cell).") in board
    assert "| parity | 0.600 · 0.55 | **0.900** · — |" in board
    assert "| reverse | **0.500** · — | not run · 0.7 |" in board
    assert "| parity shaw | 1 | 0.900 | — |" in text  # the summary table says it too
    assert "(published; not computed here). —: no number there for that group." in text


def test_published_numbers_of_another_metric_stay_out_of_the_leaderboard(tmp_path):
    root = _suite_with_reference(tmp_path / "runs" / "suite", {
        "source": "Paper", "metric": "accuracy_ood", "split": "test", "values": {"parity rope": 0.55}})
    board = write_report(root, tmp_path / "out", metrics=("exact_match",)).read_text().split("## Leaderboard")[1]
    assert "·" not in board.split("## Runs")[0] and "| parity | 0.600 | **0.900** |" in board


@pytest.mark.parametrize("name", ["deletang2023_chomsky.yaml"])
def test_the_suite_sweeps_published_numbers_are_keyed_by_task_and_scheme(tmp_path, name):
    """Their `reference:` compares with the leaderboard's metric; a number goes under "<task> <scheme>"."""
    shipped = Path(__file__).parents[1] / "configs" / "sweep" / name
    reference = load_sweep(shipped, only=0).reference
    assert reference["metric"] == "accuracy_ood" and reference["split"] == "test"
    text = shipped.read_text()
    (tmp_path / name).write_text(text.replace("values: {}", "values: {even_pairs sin_cos: 0.5}"))
    assert load_sweep(tmp_path / name, only=0).reference["values"] == {"even_pairs sin_cos": 0.5}
    (tmp_path / name).write_text(text.replace("values: {}", "values: {even_pairs sinusoidal: 0.5}"))
    with pytest.raises(ConfigError, match="names 'even_pairs sinusoidal', which is no group"):
        load_sweep(tmp_path / name, only=0)


def test_a_points_wandb_run_is_grouped_by_its_grid_cell_and_labelled(tmp_path, offline_wandb):
    """W&B groups the seeds of one cell (not the whole sweep as one line); its config holds the
    labels (sweep.<axis>) to filter by, and the run name the seed."""
    from relpos_lab.records.loggers import build_loggers, close_loggers
    from relpos_lab.records.wandb_offline import find_run_files, read_run, wait_until_complete

    sweep = load_sweep(write_sweep(tmp_path))
    cfg = sweep.config(3)
    assert cfg.logging.wandb.group == "tiny_study/shaw_k2"
    assert dict(cfg.logging.wandb.labels) == {"scheme": "shaw_k2", "seed": "2"}
    cfg.logging.wandb.mode = "offline"
    run_dir = sweep.points[3].run_dir
    logger = build_loggers(cfg, run_dir)[1]
    logger.log_metrics({"x": 1.0}, step=0)
    close_loggers([logger])
    (path,) = find_run_files(run_dir)
    wait_until_complete(path)
    run = read_run(path)
    assert run.group == "tiny_study/shaw_k2" and run.name.endswith("-seed2")
    assert run.config["sweep"] == {"name": "tiny_study", "group": "tiny_study/shaw_k2", "scheme": "shaw_k2",
                                   "seed": "2"}


def test_report_wandb_logs_the_leaderboard_a_chart_per_task_and_the_files(tmp_path, offline_wandb):
    """`report --wandb`: one W&B run in the sweep's group, read back from its offline file."""
    from relpos_lab.records.wandb_offline import find_run_files, read_run

    root = tmp_path / "runs" / "hand"
    points = [({"task": task, "scheme": scheme, "seed": str(seed)},
               _fake_run(root, f"{task}-{scheme}{seed}", 0.1 * seed + (scheme == "b"), {1: 1.0, 3: 0.1 * seed}, seed))
              for task in ("copy", "reverse") for scheme in ("a", "b") for seed in (1, 2)]
    (root / "sweep.json").write_text(json.dumps({
        "name": "hand", "sweep_file": "x.yaml", "points": [{"index": i, "labels": l, "overrides": [], "run_dir": d}
                                                           for i, (l, d) in enumerate(points)]}))
    assert cli.main(["report", str(root), "--out", str(tmp_path / "out"), "--metric", "exact_match",
                     "--wandb"]) == 0
    (path,) = find_run_files(tmp_path / "out" / "wandb")
    run = read_run(path)
    assert run.config["sweep"] == "hand"
    (row,) = [r for r in run.history if "leaderboard" in r]
    files = path.parent / "files"
    leaderboard = json.loads((files / row["leaderboard"]["path"]).read_text())
    summary = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert [r[0] for r in leaderboard["data"]] == [r["group"] for r in summary] == [
        "copy a", "copy b", "reverse a", "reverse b"]
    assert [r[2] for r in leaderboard["data"]] == pytest.approx([float(r["exact_match_mean"]) for r in summary])
    charts = sorted(k for k in row if k.startswith("by_length/"))
    assert charts == ["by_length/exact_match/copy_table", "by_length/exact_match/reverse_table"]
    copy = json.loads((files / row["by_length/exact_match/copy_table"]["path"]).read_text())
    assert sorted(r[0] for r in copy["data"]) == ["copy a", "copy a", "copy b", "copy b"]  # lengths 1 and 3
    # the artifact's manifest, recorded in the run's file for sync: the report's files by name
    recorded = path.read_bytes()
    assert b"hand-report-test" in recorded and all(name.encode() in recorded for name in ("report.md", "summary.csv"))


@pytest.mark.parametrize("name", ["deletang2023_paper", "ruoss2023_paper", "zhou2024_addition"])
def test_each_point_resolves_as_its_own_composition_would(name):
    """The fast expansion (config/variations.py: one composition per shape) gives each point the
    resolved config and run directory that composing it alone gives, so existing runs resume in place.
    A spread sample of points is composed alone (all of them take minutes); repr tells 1 from 1.0."""
    sweep = load_sweep(name)
    resolved = dict(sweep.resolved())
    step = max(1, len(sweep.points) // 20)
    for point in [*sweep.points[::step], sweep.points[-1]]:
        alone = sweep.config(point.index)
        assert repr(resolved[point.index]) == repr(OmegaConf.to_container(alone, resolve=True)), point.shown
        assert point.run_dir == str(run_directory(alone)), point.shown


def test_a_slurm_dry_run_of_the_largest_sweep_composes_once_a_shape_of_point_not_once_a_point(
        tmp_path, monkeypatch, capsys):
    """`sweep --slurm --dry-run` of ruoss2023_paper (5,850 points, docs/slurm.md's packed array)
    composes a config once for each shape of point (config/variations.py: 10 here) and once for the
    array's first point, not once a point, which took minutes. Counted, not timed (`bench sweep`
    prints the time)."""
    monkeypatch.chdir(tmp_path)
    composed = []
    original = load.compose

    def counting(*args, **kwargs):
        composed.append(1)
        return original(*args, **kwargs)

    for module in [m for name, m in sys.modules.items() if name.startswith("relpos_lab")]:
        if getattr(module, "compose", None) is original:  # load.compose and each module that imported it
            monkeypatch.setattr(module, "compose", counting)
    assert cli.main(["sweep", "ruoss2023_paper", "--slurm", "--dry-run", "trainer=gpu1", "cluster=example",
                     "cluster.runs_per_gpu=8", "cluster.cpus_per_task=2"]) in (0, None)
    assert "#SBATCH --array=0-731%8\n" in capsys.readouterr().out  # ceil(5,850 / 8) tasks
    assert 1 < len(composed) <= 20, f"{len(composed)} compositions for 5,850 points"


# Not debug: a debug config is composed in full for every point, so its points share nothing.
VARIED_EXPERIMENT = TINY_EXPERIMENT.replace("[reverse_shaw.yaml, overlay/debug.yaml]", "reverse_shaw.yaml")


@pytest.mark.parametrize("axis,message", [
    ("trainer.precision: ['32', '64-bogus']", "'64-bogus' is not a valid choice"),
    ("model.n_heads: [4, 5]", "model.n_heads=5"),
    ("trainer.max_steps: [10, ten]", "trainer.max_steps"),
])
def test_a_point_that_only_sets_a_value_is_checked_as_if_composed_alone(tmp_path, axis, message):
    """Points that differ only in a value share one composition, yet a bad value is refused with
    the message composing that point alone gives, naming the point."""
    path = write_sweep(tmp_path, f"experiment: tiny.yaml\ngrid: {{{axis}}}\n")
    (tmp_path / "tiny.yaml").write_text(VARIED_EXPERIMENT + f"logging: {{root: {tmp_path / 'runs'}}}\n")
    with pytest.raises(ConfigError, match=message) as raised:
        load_sweep(path)
    assert "point 1" in str(raised.value)
    with pytest.raises(ConfigError) as alone:
        load_sweep(path, only=1)
    assert str(alone.value) == str(raised.value)
