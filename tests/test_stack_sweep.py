"""`relpos-lab sweep --stack K`: points that differ only in what a stack varies train as one stacked
model, and each member is the ordinary run its solo sweep point makes: the same run directory,
config, metrics.csv, checkpoints and results.json, opened by `eval` and `load_model` as any run's."""
from __future__ import annotations

import csv
import json
import math
import os
import re
import shutil
import signal
import time
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch
import yaml

from relpos_lab import cli
from relpos_lab.analysis.report import write_report
from relpos_lab.api import registry
from relpos_lab.api.errors import UserError
from relpos_lab.config import load_config
from relpos_lab.launch.sweep import load_sweep, stack_groups
from relpos_lab.records.rundir import run_directory
from relpos_lab.training import stacked

# The shipped reverse experiment made tiny (test_sweep.py's), without dropout: a member's random draws
# are its own, not its solo run's (core/stack.py), so only a run without them is its solo twin.
# Without the projections' biases: a key bias has no gradient but rounding noise, which Adam scales
# up to a step of the full rate either way (outputs do not depend on it; the checkpoints would).
TINY_EXPERIMENT = """\
extends: [reverse_shaw.yaml, overlay/debug.yaml]
task: {train_lengths: [1, 3], valid_lengths: [1, 3], test_lengths: [1, 5], train_size: SIZE, eval_size_per_length: 2}
model: {dropout: 0.0, attention_dropout: 0.0, architecture: ARCH, attention_bias: false}
data: {batch_size: 4}  # a few examples a batch: members' batches often differ in width
trainer: {max_steps: 16, val_every_n_steps: 8, log_every_n_steps: 4}
logging: {wandb: {mode: disabled}}
"""

# Seeds, rates, schedules and clipping apart: all a stack lets members keep of their own.
TINY_SWEEP = """\
experiment: tiny.yaml
name: stacked_study
grid:
  run:
    a: {seed: 1, optim.lr: 0.01}
    b: {seed: 2, optim.lr: 0.003, optim.warmup_steps: 2}
    c: {seed: 3, optim.lr: 0.02, trainer.gradient_clip_val: 0.5, optim.weight_decay: 0.01}
"""

# Each family, with a fixed training set, and the papers' family with fresh examples at every step
# (train_size=0, as Delétang et al. train), where members' batches differ in width and are padded.
FAMILIES = [pytest.param("encoder_only", 0, id="encoder_only-streamed"),
            pytest.param("encoder_only", 96, marks=pytest.mark.slow, id="encoder_only"),
            pytest.param("encoder_decoder", 96, marks=pytest.mark.slow, id="encoder_decoder"),
            pytest.param("decoder_only", 96, marks=pytest.mark.slow, id="decoder_only")]


def _write_sweep(tmp_path: Path, architecture: str, sweep: str = TINY_SWEEP, train_size: int = 96) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY_EXPERIMENT.replace("ARCH", architecture)
                                        .replace("SIZE", str(train_size)))
    path = tmp_path / "sweep.yaml"
    path.write_text(sweep)
    return path


def _metrics_csv(run_dir: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(run_dir / "metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _same_checkpoint(solo: Path, stacked: Path) -> None:
    """The same weights, Adam moments and step counts, and a schedule at the same point: a member
    resumed alone from its checkpoint continues as its solo run."""
    a, b = (torch.load(path, map_location="cpu", weights_only=False) for path in (solo, stacked))
    assert a.keys() == b.keys() and a["global_step"] == b["global_step"]
    torch.testing.assert_close(b["state_dict"], a["state_dict"], rtol=1e-4, atol=1e-6)
    (opt_a,), (opt_b,) = a["optimizer_states"], b["optimizer_states"]
    assert opt_a["param_groups"] == opt_b["param_groups"]
    torch.testing.assert_close(opt_b["state"], opt_a["state"], rtol=1e-3, atol=1e-7)
    assert a["lr_schedulers"] == b["lr_schedulers"]


def _flat(tree: dict, prefix: str = "") -> dict[str, float]:
    out = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}{key}/") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def _close(a: str | float, b: str | float) -> bool:
    if a == b:
        return True
    return math.isclose(float(a), float(b), rel_tol=1e-4, abs_tol=1e-5)


@pytest.mark.parametrize(("architecture", "train_size"), FAMILIES)
def test_a_stacked_sweeps_members_are_their_solo_runs(tmp_path, monkeypatch, capsys, architecture, train_size):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    path = _write_sweep(tmp_path, architecture, train_size=train_size)
    solo_root, stack_root = tmp_path / "solo", tmp_path / "stacked"
    for index in range(3):  # each point alone, as a sweep's worker trains it
        assert cli.main(["sweep", str(path), "--point", str(index), f"logging.root={solo_root}"]) == 0
    assert cli.main(["sweep", str(path), "--stack", "3", f"logging.root={stack_root}"]) == 0
    out = capsys.readouterr().out
    assert "stack of 3: points 0 1 2" in out and out.count("(stacked)") == 3, out

    solo_sweep = load_sweep(path, [f"logging.root={solo_root}"])
    stack_sweep = load_sweep(path, [f"logging.root={stack_root}"])
    for solo_point, stack_point in zip(solo_sweep.points, stack_sweep.points):
        solo, stacked = Path(solo_point.run_dir), Path(stack_point.run_dir)
        assert stacked.name == solo.name  # the run directory its solo run would get
        configs = [yaml.safe_load((d / "config.yaml").read_text()) for d in (solo, stacked)]
        for config in configs:
            config["logging"].pop("root")  # the one difference: where each sweep keeps its runs
        assert configs[0] == configs[1]
        a, b = (json.loads((d / "results.json").read_text()) for d in (solo, stacked))
        assert a["checkpoint"] == b["checkpoint"] and a["checkpoint_step"] == b["checkpoint_step"]
        assert a["metrics"].keys() == b["metrics"].keys()
        different = {k: (v, b["metrics"][k]) for k, v in a["metrics"].items() if not _close(v, b["metrics"][k])}
        assert not different, (stack_point.shown, different)
        assert _flat(a["by_length"]) == pytest.approx(_flat(b["by_length"]), rel=1e-4, abs=1e-5)
        assert sorted(p.name for p in (stacked / "checkpoints").iterdir()) == \
            sorted(p.name for p in (solo / "checkpoints").iterdir())
        _same_checkpoint(solo / "checkpoints" / "last.ckpt", stacked / "checkpoints" / "last.ckpt")
        (columns, rows), (solo_columns, solo_rows) = _metrics_csv(stacked), _metrics_csv(solo)
        assert columns == solo_columns and len(rows) == len(solo_rows)
        for row, solo_row in zip(rows, solo_rows):
            assert all(_close(row[c], solo_row[c]) for c in columns if row[c] or solo_row[c]), (row, solo_row)

    # report reads both sweeps alike: the same tables, but for the wall time a run took
    solo_sweep.write_manifest()
    reports = [write_report(s.directory).read_text() for s in (solo_sweep, stack_sweep)]
    reports = [re.sub(r"wall time [^\n]*", "", r).replace(str(solo_root), "ROOT").replace(str(stack_root), "ROOT")
               for r in reports]
    assert reports[0] == reports[1]

    # eval and load_model open a member's checkpoint as any run's
    member = Path(stack_sweep.points[2].run_dir)
    results = json.loads((member / "results.json").read_text())
    checkpoint = member / results["checkpoint"]
    assert cli.main(["eval", str(checkpoint), "--output", str(tmp_path / "eval")]) == 0
    evaluated = json.loads((tmp_path / "eval" / "results.json").read_text())["metrics"]
    assert evaluated["test/exact_match"] == pytest.approx(results["metrics"]["test/exact_match"])
    assert evaluated["test/loss"] == pytest.approx(results["metrics"]["test/loss"], rel=1e-5)
    from relpos_lab.api import load_model
    loaded = load_model(checkpoint)
    assert loaded.config.seed == 3 and loaded.config.trainer.gradient_clip_val == 0.5


def test_points_group_by_what_a_stack_cannot_vary(tmp_path, capsys):
    """Seeds, rates and clipping stack; another scheme or another dropout trains alone; no stack
    holds more than K points."""
    text = TINY_SWEEP.replace("grid:", "grid:\n  scheme:\n    shaw: {}\n    none: {model.positions.scheme: none}"
                              "\n    drop: {model.dropout: 0.1}")
    sweep = load_sweep(_write_sweep(tmp_path, "encoder_only", text))
    groups = stack_groups(sweep, sweep.points, 2)
    shown = [[p.shown for p in group] for group in groups]
    assert shown == [["scheme=shaw run=a", "scheme=shaw run=b"], ["scheme=shaw run=c"],
                     ["scheme=none run=a", "scheme=none run=b"], ["scheme=none run=c"],
                     ["scheme=drop run=a", "scheme=drop run=b"], ["scheme=drop run=c"]]
    out = capsys.readouterr().out
    assert "stack of 2: points 0 1" in out and "alone: point 2 scheme=shaw run=c" in out


def test_a_stack_stopped_while_its_members_are_written_writes_the_rest_from_its_checkpoint(tmp_path, monkeypatch,
                                                                                           capsys):
    """A member stopped while its run is written holds checkpoints of the weights last loaded, not
    of its step: its directory goes, the members finished before it stay, and a rerun of the rest
    takes the stack, trained to the end, from its checkpoint instead of training it again."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    sweep = load_sweep(_write_sweep(tmp_path, "encoder_only", train_size=0),
                       ["trainer.max_steps=4", "trainer.val_every_n_steps=2", f"logging.root={tmp_path / 'runs'}"])
    cfgs = [load_config(sweep.experiment, sweep.overrides_of(i)) for i in (0, 1)]
    replay = stacked.ReplayModule.optimizer_step

    def stopped_in_the_second(module, *args, **kwargs):
        if module.cfg.seed == 2 and module.global_step == 3:  # after its checkpoint of step 2
            raise KeyboardInterrupt
        return replay(module, *args, **kwargs)

    monkeypatch.setattr(stacked.ReplayModule, "optimizer_step", stopped_in_the_second)
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        stacked.train_stacked(cfgs)
    assert (run_directory(cfgs[0]) / "results.json").is_file()
    assert not run_directory(cfgs[1]).exists()
    monkeypatch.setattr(stacked.ReplayModule, "optimizer_step", replay)
    (summary,) = stacked.train_stacked(cfgs[1:])
    assert "stack of 1: resuming at step 4 from " in capsys.readouterr().out
    assert (summary.run_dir / "results.json").is_file()
    assert not list((run_directory(cfgs[0]).parent / "stacks").iterdir())  # every member written: gone


def test_a_scheme_that_does_not_stack_is_refused_at_the_first_step_naming_the_fix(tmp_path, monkeypatch):
    """A plugin that reads a tensor's value on the host (test_compile's) cannot run under vmap:
    the stack says which scheme, how to find out why, and to sweep without --stack."""
    extra = EntryPoint("host_read", "test_compile:HostReadScheme", registry.POSITIONS.group)
    real = registry.entry_points
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: [*real(group=group), *([extra] if group == extra.group else [])])
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(_write_sweep(tmp_path, "encoder_only", train_size=0),
                       ["trainer.max_steps=2", "model.positions.scheme=host_read", f"logging.root={tmp_path / 'runs'}"])
    cfgs = [load_config(sweep.experiment, sweep.overrides_of(i)) for i in (0, 1)]
    with pytest.raises(UserError, match=r"scheme 'host_read' do not stack .*`relpos-lab check-scheme host_read` "
                                        r"says why; run this sweep without --stack"):
        stacked.fit_stack(cfgs)


def test_a_member_that_diverges_stops_alone_is_reported_and_the_others_are_written(tmp_path, monkeypatch, capsys):
    """Member b's gradient turns NaN at its third update: it stops with the parameters of step 2 and
    its run says so. Member c, at a rate of 1e30, goes off the floats: its run cannot be written (no
    finite metric, as alone) and fails alone. Member a is the run it is alone."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    sweep = load_sweep(_write_sweep(tmp_path, "encoder_only", train_size=0),
                       ["trainer.max_steps=4", "trainer.val_every_n_steps=2", f"logging.root={tmp_path / 'runs'}"])
    cfgs = [load_config(sweep.experiment, sweep.overrides_of(i) + (["optim.lr=1e30"] if i == 2 else []))
            for i in (0, 1, 2)]
    step = stacked.StackedAdamW.step

    def nan_for_b_at_its_third(optimizer, grad, *args, **kwargs):
        if optimizer.steps == 2:
            grad = grad.clone()
            grad[1, 0] = float("nan")
        return step(optimizer, grad, *args, **kwargs)

    monkeypatch.setattr(stacked.StackedAdamW, "step", nan_for_b_at_its_third)
    began = time.time()
    a, b, c = stacked.train_stacked(cfgs)
    elapsed = time.time() - began
    out = capsys.readouterr().out
    a_results, b_results = (json.loads((s.run_dir / "results.json").read_text()) for s in (a, b))
    assert "stopped" not in a_results and all(math.isfinite(v) for v in a_results["metrics"].values())
    assert b_results["stopped"]["at_step"] == 2 and "non-finite" in b_results["stopped"]["why"]
    assert isinstance(c, stacked.MemberFailed) and "is not finite" in str(c.error)
    for cfg, at in ((cfgs[1], "at step 2"), (cfgs[2], "at step")):
        assert f"stack member {run_directory(cfg).name}: its loss or gradient went non-finite {at}" in out
    assert f"stack member {run_directory(cfgs[2]).name}: FAILED (ValueError" in out
    # each written member's wall time is its share of the stack's training plus its own writing: they add
    # up to at most the whole call, where each counted from the stack's start would add up to more
    assert 0 < a_results["wall_seconds"] and a_results["wall_seconds"] + b_results["wall_seconds"] <= elapsed


@pytest.mark.slow
def test_a_compiled_stack_trains_its_members_as_the_eager_stack_does(tmp_path, monkeypatch):
    """trainer.compile on a stacked sweep: the stack's forward and update compile (inductor) with no
    graph break, and each member's results are the eager stack's up to float32 rounding."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    path = _write_sweep(tmp_path, "encoder_only", train_size=0)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for root, mode in (("eager", "none"), ("compiled", "default")):
        args = ["sweep", str(path), "--stack", "3", f"logging.root={tmp_path / root}", f"trainer.compile={mode}"]
        assert cli.main(args) == 0
    assert not torch._dynamo.utils.counters["graph_break"]
    sweeps = (load_sweep(path, [f"logging.root={tmp_path / root}"]) for root in ("eager", "compiled"))
    for eager, compiled in zip(*(sweep.points for sweep in sweeps)):
        a, b = (json.loads((Path(p.run_dir) / "results.json").read_text()) for p in (eager, compiled))
        different = {k: (v, b["metrics"][k]) for k, v in a["metrics"].items() if not _close(v, b["metrics"][k])}
        assert not different, (eager.shown, different)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stack_interrupted_in_training_resumes_where_it_stopped_as_if_never_stopped(tmp_path, monkeypatch,
                                                                                     capsys, signum):
    """Ctrl-C or SIGTERM in the third of eight steps: the stack saves at that step's end and stops
    (SIGTERM with 143); the rerun resumes at step 3, and every member's results and last checkpoint
    are those of a stack never stopped."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "disabled")
    path = _write_sweep(tmp_path, "encoder_only", train_size=0)
    steps = ["trainer.max_steps=8", "trainer.val_every_n_steps=4"]
    twins = {}
    for root in ("whole", "stopped"):
        sweep = load_sweep(path, [*steps, f"logging.root={tmp_path / root}"])
        twins[root] = [load_config(sweep.experiment, sweep.overrides_of(i)) for i in (0, 1)]
    whole = stacked.train_stacked(twins["whole"])
    keep = stacked._keep

    def signalled_in_the_third(stack, optimizer, records, kept, step):
        if step == 3:
            os.kill(os.getpid(), signum)  # the real signal, through the stack's handler
        return keep(stack, optimizer, records, kept, step)

    monkeypatch.setattr(stacked, "_keep", signalled_in_the_third)
    with pytest.raises(KeyboardInterrupt if signum == signal.SIGINT else SystemExit) as stop:
        stacked.train_stacked(twins["stopped"])
    assert signum == signal.SIGINT or stop.value.code == 143
    out = capsys.readouterr().out
    assert "the stack stopped after step 3 of 8, its checkpoint " in out and "rerun the sweep to resume it" in out
    assert not any(run_directory(cfg).exists() for cfg in twins["stopped"])
    monkeypatch.setattr(stacked, "_keep", keep)
    resumed = stacked.train_stacked(twins["stopped"])
    assert "stack of 2: resuming at step 3 from " in capsys.readouterr().out
    for a, b in zip(whole, resumed):
        results = [json.loads((s.run_dir / "results.json").read_text()) for s in (a, b)]
        assert results[0]["metrics"] == results[1]["metrics"] and results[0]["by_length"] == results[1]["by_length"]
        ckpts = [torch.load(s.run_dir / "checkpoints" / "last.ckpt", weights_only=False) for s in (a, b)]
        assert all(torch.equal(ckpts[0]["state_dict"][k], v) for k, v in ckpts[1]["state_dict"].items())


def test_with_dropout_each_member_draws_its_own_masks_and_a_rerun_repeats_them(tmp_path, monkeypatch):
    """Dropout 0.3 in a stack of two: the members' losses differ from a dropout-free stack's, and
    training the same stack again (its checkpoint removed, or it would resume) repeats every loss
    and weight."""
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep(_write_sweep(tmp_path, "encoder_only", train_size=0),
                       ["trainer.max_steps=3", "model.dropout=0.3", f"logging.root={tmp_path / 'runs'}"])
    cfgs = [load_config(sweep.experiment, sweep.overrides_of(i)) for i in (0, 1)]
    first = stacked.fit_stack(cfgs)
    shutil.rmtree(run_directory(cfgs[0]).parent / "stacks")  # its checkpoint at the last step: start over
    again = stacked.fit_stack(cfgs)
    for a, b in zip(first, again):
        assert a.losses == b.losses
        assert all(torch.equal(a.weights[3][k], v) for k, v in b.weights[3].items())
    plain = stacked.fit_stack([load_config(sweep.experiment, [*sweep.overrides_of(i), "model.dropout=0.0"])
                               for i in (0, 1)])
    assert all(a.losses[0] != p.losses[0] for a, p in zip(first, plain))  # the masks were drawn
