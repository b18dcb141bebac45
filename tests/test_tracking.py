"""The run directory and its files, and the CSV + W&B loggers in real (tiny) Lightning fits."""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import lightning as L
import pytest
import torch
import wandb
from omegaconf import OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from relpos_lab.config import LoggingConfig
from relpos_lab.records import loggers as run_loggers, wandb_run
from relpos_lab.records.loggers import (
    RunCSVLogger,
    RunWandbLogger,
    build_loggers,
    close_loggers,
    cut_metrics,
    log_samples,
    read_metric_rows,
    resolve_wandb_mode,
    resume_plan,
    wandb_run_id,
)
from relpos_lab.records.plots import groups_figure, plot_curves, plot_groups
from relpos_lab.records.results import plot_by_length, write_results
from relpos_lab.records.rundir import run_directory, save_resolved_config
from relpos_lab.records.wandb_offline import find_run_files, read_run, read_runs
from relpos_lab.records.wandb_run import start_wandb_lineage

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


pytestmark = pytest.mark.usefixtures("offline_wandb")  # tests/conftest.py


def _cfg(tmp_path, **overrides):
    base = {
        "name": "exp",
        "seed": 1,
        "resume": False,
        "task": {"name": "reverse", "vocab": 10},
        "model": {"d_model": 32, "n_heads": 4, "positions": {"scheme": "shaw", "max_distance": 4}},
        "trainer": {"max_steps": 10, "enable_progress_bar": False},
        "cluster": {"partition": "gpu", "time": "01:00:00"},
        "logging": OmegaConf.to_container(OmegaConf.structured(LoggingConfig)),
    }
    base["logging"]["root"] = str(tmp_path / "runs")
    cfg = OmegaConf.create(base)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()]))


# --- run directory --------------------------------------------------------------------------


def test_run_directory_is_a_readable_deterministic_path(tmp_path):
    first, second = run_directory(_cfg(tmp_path)), run_directory(_cfg(tmp_path))
    assert first == second
    assert first.parent == tmp_path / "runs" / "exp"
    assert first.name.startswith("reverse-shaw-k4-") and len(first.name.split("-")[-1]) == 8


def test_run_directory_names_the_model_family_when_it_is_not_the_default(tmp_path):
    decoder_only = run_directory(_cfg(tmp_path, **{"model.architecture": "decoder_only"}))
    assert decoder_only.name.startswith("reverse-shaw-k4-decoder_only-")
    assert "encoder_decoder" not in run_directory(_cfg(tmp_path)).name


def test_a_run_started_before_the_family_was_named_keeps_its_directory(tmp_path):
    cfg = _cfg(tmp_path, **{"model.architecture": "decoder_only"})
    new = run_directory(cfg)
    old = new.with_name(new.name.replace("-decoder_only", ""))
    old.mkdir(parents=True)
    assert run_directory(cfg) == old
    new.mkdir()  # both exist: the named one wins
    assert run_directory(cfg) == new


def test_run_directory_changes_with_an_experiment_key(tmp_path):
    base = run_directory(_cfg(tmp_path))
    assert run_directory(_cfg(tmp_path, **{"model.d_model": 64})) != base
    assert run_directory(_cfg(tmp_path, seed=2)) != base


def test_run_directory_ignores_resume_logging_cluster_and_display_keys(tmp_path):
    base = run_directory(_cfg(tmp_path))
    same = _cfg(tmp_path, resume=True, **{
        "logging.wandb.mode": "disabled", "logging.wandb.tags": "[a,b]", "cluster.partition": "cpu",
        "cluster.time": "02:00:00", "trainer.enable_progress_bar": True,
    })
    assert run_directory(same) == base


def test_run_directory_hashes_resolved_values_not_interpolations(tmp_path):
    direct = _cfg(tmp_path, **{"model.d_ff": 128})
    interpolated = _cfg(tmp_path, **{"model.d_ff": 128})
    interpolated.model.d_ff = "${oc.decode:'128'}"
    assert run_directory(direct) == run_directory(interpolated)


def test_run_directory_accepts_a_minimal_config():
    assert run_directory(OmegaConf.create({"a": 1})).parent.as_posix() == "runs/default"


def test_logging_config_is_a_structured_config():
    cfg = OmegaConf.merge(OmegaConf.structured(LoggingConfig), {"wandb": {"tags": ["x"], "entity": "me"}})
    assert (cfg.root, cfg.wandb.mode, cfg.wandb.project, cfg.wandb.entity, cfg.wandb.tags) == (
        "runs", "auto", "relpos_lab", "me", ["x"])
    with pytest.raises(Exception, match="num_samples"):
        OmegaConf.merge(OmegaConf.structured(LoggingConfig), {"num_samples": "many"})


# --- files in the run directory ---------------------------------------------------------------


def test_results_json_holds_metrics_by_length_and_extra(tmp_path):
    path = write_results(
        tmp_path, {"acc": torch.tensor(0.5), "steps": 10},
        by_length={"test": {12: {"acc": 0.25}, "13": {"acc": 0.0}}}, extra={"checkpoint": "last.ckpt"},
    )
    assert json.loads(path.read_text()) == {
        "metrics": {"acc": 0.5, "steps": 10},
        "by_length": {"test": {"12": {"acc": 0.25}, "13": {"acc": 0.0}}},
        "checkpoint": "last.ckpt",
    }


@pytest.mark.parametrize("bad", [math.nan, math.inf, "0.5", True, None, torch.tensor([0.1, 0.2])])
def test_results_refuse_a_non_finite_or_non_numeric_metric_and_keep_the_old_file(tmp_path, bad):
    write_results(tmp_path, {"acc": 0.5})
    with pytest.raises(ValueError, match=r"metrics\['loss'\]"):
        write_results(tmp_path, {"acc": 0.9, "loss": bad})
    assert json.loads((tmp_path / "results.json").read_text()) == {"metrics": {"acc": 0.5}}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temporary file left


def test_results_refuse_a_bad_per_length_value_naming_where(tmp_path):
    with pytest.raises(ValueError, match=r"by_length\['test'\]\[7\]\['acc'\]"):
        write_results(tmp_path, {"acc": 0.5}, by_length={"test": {7: {"acc": math.nan}}})
    with pytest.raises(ValueError, match="not an integer"):
        write_results(tmp_path, {"acc": 0.5}, by_length={"test": {"long": {"acc": 0.1}}})


def test_results_extra_cannot_overwrite_a_section(tmp_path):
    with pytest.raises(ValueError, match="overwrite"):
        write_results(tmp_path, {"acc": 0.5}, extra={"metrics": {}})


def test_saved_config_is_resolved_yaml(tmp_path):
    cfg = _cfg(tmp_path)
    cfg.model.d_ff = "${model.d_model}"
    saved = OmegaConf.load(save_resolved_config(cfg, tmp_path / "run"))
    assert saved.model.d_ff == 32 and saved.task.name == "reverse"


def test_plot_by_length_writes_one_png_per_metric(tmp_path):
    by_length = {
        split: {n: {"acc": 1.0 / n, "exact_match": 0.5 / n} for n in range(lo, hi)}
        for split, (lo, hi) in {"valid": (2, 9), "test": (2, 17)}.items()
    }
    paths = plot_by_length(tmp_path, by_length, train_range=(2, 8), title="reverse")
    assert sorted(p.name for p in paths) == ["by_length_acc.png", "by_length_exact_match.png"]
    for path in paths:
        assert path.parent == tmp_path / "plots"
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 10_000


def test_plot_curves_accepts_json_length_keys(tmp_path):
    curves = {"shaw k=4": {"10": 0.9, "2": 1.0, "30": 0.1}, "sinusoidal": {"2": 1.0, "10": 0.5}}
    path = plot_curves(curves, tmp_path / "sweep.png", train_range=(2, 10), ylabel="exact match")
    assert path.read_bytes()[:8] == PNG_MAGIC


def test_group_figure_shows_every_run_and_the_reference_on_its_own_axis(tmp_path):
    panels = {"bleu": {"0": [20.0, 24.0], "16": [35.0]}, "chrf": {"0": [40.0, 44.0], "16": [54.0]}}
    fig = groups_figure(panels, reference=("bleu", {"0": 12.5, "16": 25.8, "64": 25.9}, "paper bleu"), xlabel="k")
    bleu, paper, chrf = fig.axes  # the reference gets a twin axis on the bleu panel only
    def drawn(marker):
        return [list(line.get_ydata()) for line in bleu.lines if line.get_marker() == marker]

    assert drawn("o") == [[20.0, 24.0], [35.0]]  # each run a dot
    assert drawn("s") == [[22.0], [35.0]]  # the group means
    assert [t.get_text() for t in bleu.get_xticklabels()] == ["0", "16"] and bleu.get_xlabel() == "k"
    (published,) = paper.lines
    assert list(published.get_ydata()) == [12.5, 25.8]  # groups without results (64) are not drawn
    span = lambda axis: axis.get_ylim()[1] - axis.get_ylim()[0]  # noqa: E731
    assert span(paper) == pytest.approx(span(bleu))  # one scale: effects compare by eye
    assert not any(line.get_label() == "paper bleu" for line in chrf.lines)
    with pytest.raises(ValueError, match="no values"):
        groups_figure({"bleu": {}})
    assert plot_groups(panels, tmp_path / "groups.png").read_bytes()[:8] == PNG_MAGIC


# --- W&B mode and loggers -----------------------------------------------------------------------


def test_wandb_is_offline_unless_online_is_asked_for(monkeypatch):
    monkeypatch.delenv("WANDB_MODE")
    assert resolve_wandb_mode("auto") == "offline"
    assert resolve_wandb_mode("online") == "online"
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert resolve_wandb_mode("auto") == "online"
    assert resolve_wandb_mode("offline") == "offline"  # explicit (the debug overlay's): no server, key or not
    assert resolve_wandb_mode("disabled") == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_wandb_mode("auto") == "offline"
    with pytest.raises(ValueError, match="logging.wandb.mode"):
        resolve_wandb_mode("cloud")


def test_disabled_wandb_leaves_only_the_csv_logger(tmp_path):
    loggers = build_loggers(_cfg(tmp_path, **{"logging.wandb.mode": "disabled"}), tmp_path / "run")
    assert [type(lg) for lg in loggers] == [RunCSVLogger]


def test_a_run_directorys_wandb_id_lasts_its_attempts_and_a_new_directory_gets_a_new_one(tmp_path):
    cfg = _cfg(tmp_path)
    run_dir = run_directory(cfg)
    first = build_loggers(cfg, run_dir)[1]
    _fit([first], run_dir, epochs=1)
    close_loggers([first])
    again = build_loggers(cfg, run_dir)[1]  # a requeued or re-launched attempt
    assert again._id == first._id == wandb_run_id(run_dir) == (run_dir / ".wandb_id").read_text().strip()
    shutil.rmtree(run_dir)  # deleted, and run again: its history must not sync into the old run
    assert build_loggers(cfg, run_dir)[1]._id != first._id


def test_a_directory_from_before_stored_ids_keeps_its_path_hash(tmp_path):
    (tmp_path / "a" / "wandb").mkdir(parents=True)  # an attempt logged W&B under the hash of the path
    assert start_wandb_lineage(tmp_path / "a") == wandb_run_id(tmp_path / "x" / ".." / "a")
    assert not (tmp_path / "a" / ".wandb_id").exists()


def test_csv_logger_appends_to_an_existing_metrics_file_and_merges_columns(tmp_path):
    first = RunCSVLogger(tmp_path)
    first.log_metrics({"loss": 1.0}, step=0)
    first.finalize("success")
    second = RunCSVLogger(tmp_path)
    second.log_metrics({"loss": 0.5, "acc": 0.25}, step=1)
    second.finalize("success")
    with open(tmp_path / "metrics.csv") as file:
        rows = list(csv.DictReader(file))
    assert rows == [{"acc": "", "loss": "1.0", "step": "0"}, {"acc": "0.25", "loss": "0.5", "step": "1"}]


class TinyRegression(L.LightningModule):
    """Smallest model that logs a training and a validation metric every step."""

    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(loggers, run_dir, epochs=2):
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    trainer = L.Trainer(
        max_epochs=epochs, logger=loggers, accelerator="cpu", devices=1, log_every_n_steps=1,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=run_dir,
    )
    trainer.fit(TinyRegression(), DataLoader(data, batch_size=4), DataLoader(data, batch_size=8))
    return trainer


def _csv_rows(run_dir):
    with open(run_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def test_offline_wandb_records_what_training_logged_and_resumes_the_same_run(tmp_path):
    cfg = _cfg(tmp_path, **{"logging.wandb.tags": "[shaw,smoke]"})
    run_dir = run_directory(cfg)
    loggers = build_loggers(cfg, run_dir)
    assert [type(lg) for lg in loggers] == [RunCSVLogger, RunWandbLogger]
    _fit(loggers, run_dir)
    close_loggers(loggers)

    [path] = find_run_files(run_dir)
    run = read_run(path)
    logged = {(int(r["step"]), float(r["train/loss"])) for r in _csv_rows(run_dir) if r["train/loss"]}
    recorded = {(r["trainer/global_step"], r["train/loss"]) for r in run.history if "train/loss" in r}
    assert len(logged) == 8 and recorded == logged
    assert len(run.metric("val/loss")) == 2
    assert run.run_id == wandb_run_id(run_dir) and run.name == f"{run_dir.name}-seed1"
    assert (run.group, run.job_type, run.tags) == ("exp", "reverse", ["shaw", "smoke"])
    assert run.config["model"]["positions"]["max_distance"] == 4
    assert run.config["provenance"]["run_dir"] == str(run_dir.resolve())

    second = build_loggers(cfg, run_dir)  # a re-launch of the same config: same directory
    _fit(second, run_dir, epochs=1)
    close_loggers(second)
    assert list(read_runs(run_dir)) == [run.run_id]
    assert [len(part.metric("train/loss")) for part in read_runs(run_dir)[run.run_id]] == [8, 4]
    assert len([r for r in _csv_rows(run_dir) if r["train/loss"]]) == 12  # earlier rows kept


# metrics.csv of a run logging lr and loss as two rows per step (as LearningRateMonitor and the
# training step do), steps 0-5; W&B rows as `history` returns them, numbered by _step.
CSV_ROWS = [(s, m) for s in range(6) for m in ({"lr-AdamW": 0.1 * s}, {"train/loss": 1.0 / (s + 1), "epoch": 0})]


def _wandb_rows(rows):
    return [{**m, "trainer/global_step": s, "_step": i} for i, (s, m) in enumerate(rows)]


def test_a_complete_wandb_history_is_rewound_to_the_checkpoint_and_nothing_is_logged_again():
    assert resume_plan(_wandb_rows(CSV_ROWS), CSV_ROWS, step=4)[:2] == (7, [])  # _step 7: step 3's last row


def test_rows_a_killed_attempts_wandb_file_lacks_are_logged_again_from_metrics_csv():
    # the file ends after step 1's lr row: step 1's loss row and steps 2-3 are missing
    assert resume_plan(_wandb_rows(CSV_ROWS[:3]), CSV_ROWS, step=4)[:2] == (2, [CSV_ROWS[3], *CSV_ROWS[4:8]])
    # an empty file (wandb-core killed before it wrote a row): every row before the checkpoint
    assert resume_plan([], CSV_ROWS, step=4)[:2] == (None, CSV_ROWS[:8])
    # rows without a training step (a plot) belong to the step before them
    logged = [*_wandb_rows(CSV_ROWS[:4]), {"by_length/acc_table": {}, "_step": 4}]
    assert resume_plan(logged, CSV_ROWS, step=4)[:2] == (4, CSV_ROWS[4:8])


def test_a_plain_resume_leaves_out_what_wandb_holds_after_the_checkpoint_and_numbers_rows_after_its_last():
    # the interrupted attempt logged steps 0-5; the checkpoint is step 4; its file ends after step 5's lr row
    plan = resume_plan(_wandb_rows(CSV_ROWS[:11]), CSV_ROWS, step=4)
    assert (plan.backfill, plan.next_step) == ([], 11)
    assert plan.held == {4: {"lr-AdamW", "train/loss", "epoch"}, 5: {"lr-AdamW"}}  # the fit's steps 4-5 only
    tested = [*_wandb_rows(CSV_ROWS), {"test/acc": 0.5, "trainer/global_step": 2, "_step": 12}]
    assert resume_plan(tested, CSV_ROWS, step=4).held[2] == {"test/acc"}  # a final test is never logged twice
    assert resume_plan([], CSV_ROWS, step=4)[2:] == ({}, 0)


# Steps 3-5 of CSV_ROWS with the validation of step 4's checkpoint, logged at step 4 (before the
# lr and loss rows of the batch that step 4's weights train on, which are logged at step 4 too).
VALIDATED = [*CSV_ROWS[:8], (4, {"valid/acc": 0.5}), *CSV_ROWS[8:]]


def test_the_validation_of_the_checkpoints_step_is_kept_on_resume(tmp_path):
    """A validation belongs to the checkpoint of the step it validated: a run resumed from that
    checkpoint keeps it (it does not validate that step again) and trains, and logs, the rest again."""
    assert resume_plan(_wandb_rows(VALIDATED), VALIDATED, step=4)[:2] == (8, [])  # _step 8: the validation
    assert resume_plan(_wandb_rows(VALIDATED[:8]), VALIDATED, step=4)[:2] == (7, [VALIDATED[8]])
    header = "epoch,lr-AdamW,step,train/loss,valid/acc\n"
    (tmp_path / "metrics.csv").write_text(header + ",0.3,3,,\n0,,3,0.25,\n,,4,,0.5\n,0.4,4,,\n0,,4,0.2,\n")
    assert cut_metrics(tmp_path, 4) == 2
    assert (tmp_path / "metrics.csv").read_text() == header + ",0.3,3,,\n0,,3,0.25,\n,,4,,0.5\n"


def test_metric_rows_read_back_from_metrics_csv_without_empty_cells(tmp_path):
    (tmp_path / "metrics.csv").write_text("epoch,lr-AdamW,step,train/loss\n,0.5,0,\n0,,0,2.25\n1,,1,1.5\n")
    assert read_metric_rows(tmp_path) == [(0, {"lr-AdamW": 0.5}), (0, {"epoch": 0, "train/loss": 2.25}),
                                          (1, {"epoch": 1, "train/loss": 1.5})]
    assert read_metric_rows(tmp_path / "missing") == []


def test_per_length_plot_and_samples_reach_wandb(tmp_path):
    cfg = _cfg(tmp_path)
    run_dir = run_directory(cfg)
    loggers = build_loggers(cfg, run_dir)
    by_length = {"test": {n: {"acc": 1.0 / n} for n in range(2, 6)}}
    plot_by_length(run_dir, by_length, train_range=(2, 3), loggers=loggers)
    log_samples(loggers, "samples/valid", ["source", "target", "prediction"], [["a b", "b a", "b a"]], step=5)
    close_loggers(loggers)

    history = read_run(find_run_files(run_dir)[0]).history
    chart = next(r["by_length/acc_table"] for r in history if "by_length/acc_table" in r)
    table = next(r["samples/valid"] for r in history if "samples/valid" in r)
    assert (chart["nrows"], table["nrows"]) == (4, 1)
    files = next(run_dir.glob("wandb/offline-run-*/files"))
    assert json.loads((files / table["path"]).read_text())["data"] == [["a b", "b a", "b a"]]
    assert sorted(json.loads((files / chart["path"]).read_text())["data"]) == [
        ["test", n, 1.0 / n] for n in range(2, 6)]


def test_requeue_signal_finishes_the_wandb_run_so_nothing_is_lost(tmp_path):
    run_dir = tmp_path / "run"
    [_, wb] = build_loggers(_cfg(tmp_path), run_dir)
    wb.log_metrics({"train/loss": 0.5}, step=3)
    wb.finalize("finished")  # what Lightning's SLURM handler calls before requeueing
    run = read_run(find_run_files(run_dir)[0])
    assert run.exit_code == 0 and run.metric("train/loss") == [0.5]


def test_a_new_run_in_the_same_process_never_logs_into_the_previous_wandb_run(tmp_path):
    [_, first] = build_loggers(_cfg(tmp_path), tmp_path / "first")
    first.log_metrics({"x": 1.0}, step=0)  # left open, as a crashed sweep point might
    [_, second] = build_loggers(_cfg(tmp_path), tmp_path / "second")
    with pytest.warns(UserWarning, match="left open"):
        second.log_metrics({"x": 2.0}, step=0)
    close_loggers([first, second])
    assert {run_id: parts[0].metric("x") for run_id, parts in read_runs(tmp_path).items()} == {
        wandb_run_id(tmp_path / "first"): [1.0], wandb_run_id(tmp_path / "second"): [2.0]}


def test_wandb_config_records_git_commit_and_slurm_ids(tmp_path, monkeypatch):
    for var, value in (("SLURM_JOB_ID", "4242"), ("SLURM_ARRAY_JOB_ID", "4240"), ("SLURM_ARRAY_TASK_ID", "2")):
        monkeypatch.setenv(var, value)
    run_dir = tmp_path / "run"
    loggers = build_loggers(_cfg(tmp_path), run_dir)
    loggers[1].log_metrics({"x": 1.0}, step=0)
    close_loggers(loggers)
    provenance = read_run(find_run_files(run_dir)[0]).config["provenance"]
    assert provenance["slurm"] == {"job_id": "4242", "array_job_id": "4240", "array_task_id": "2"}
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(run_loggers.__file__).parent,
                          capture_output=True, text=True)
    assert provenance.get("git_commit") == (head.stdout.strip() if head.returncode == 0 else None)


def test_training_completes_when_wandb_init_fails(tmp_path, monkeypatch):
    def broken_init(*args, **kwargs):
        raise RuntimeError("no route to api.wandb.ai")

    monkeypatch.setattr(wandb, "init", broken_init)
    cfg = _cfg(tmp_path)
    run_dir = run_directory(cfg)
    loggers = build_loggers(cfg, run_dir)
    with pytest.warns(UserWarning, match="no route to api.wandb.ai"):
        trainer = _fit(loggers, run_dir)
    close_loggers(loggers)
    assert trainer.global_step == 8 and loggers[1].failed
    assert len([r for r in _csv_rows(run_dir) if r["train/loss"]]) == 8
    log_samples(loggers, "samples", ["x"], [["y"]])  # still a no-op, not an error


def test_wandb_missing_entirely_leaves_csv_logging(tmp_path, monkeypatch):
    def unavailable(**kwargs):
        raise ModuleNotFoundError("No module named 'wandb'")

    monkeypatch.setattr(run_loggers, "RunWandbLogger", unavailable)
    with pytest.warns(UserWarning, match="CSV only"):
        loggers = build_loggers(_cfg(tmp_path), tmp_path / "run")
    assert [type(lg) for lg in loggers] == [RunCSVLogger]


def _online_with_a_key(monkeypatch, base_url: str):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", base_url)
    wandb_run._unreachable.cache_clear()


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when the block ends: connections are refused


def test_a_key_without_a_reachable_server_logs_offline_at_once(tmp_path, monkeypatch):
    """A compute node with a key but no network: one line, then the whole history offline, to sync."""
    import time

    _online_with_a_key(monkeypatch, f"http://127.0.0.1:{_closed_port()}")
    cfg = _cfg(tmp_path)
    run_dir = run_directory(cfg)
    said = []
    started = time.monotonic()
    loggers = build_loggers(cfg, run_dir, echo=said.append)
    _fit(loggers, run_dir)
    close_loggers(loggers)
    assert time.monotonic() - started < 60
    (line,) = said
    assert "is not reachable" in line and f"wandb sync {run_dir / 'wandb'}/offline-run-*" in line
    [path] = find_run_files(run_dir)
    logged = {(int(r["step"]), float(r["train/loss"])) for r in _csv_rows(run_dir) if r["train/loss"]}
    assert {(r["trainer/global_step"], r["train/loss"]) for r in read_run(path).history if "train/loss" in r} \
        == logged and len(logged) == 8


class _AnyAnswer:
    """A real HTTP server on 127.0.0.1 that answers every request (200): a W&B server as far as
    the reachability probe can tell."""

    def __enter__(self) -> str:
        import http.server
        import threading

        class Answers(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _login_host(url: str) -> Path:
    """Write `url` as `wandb login --host URL` does, with wandb's own settings writer: the global
    settings file, $WANDB_CONFIG_DIR/settings (tests/conftest.py points it into tmp_path)."""
    from wandb.sdk.lib.settings_file import SettingsFiles

    path = Path(os.environ["WANDB_CONFIG_DIR"]) / "settings"
    files = SettingsFiles(global_settings=path, local_settings=Path("wandb", "settings"))
    files.set("base_url", url, globally=True)
    files.save()
    return path


def test_the_server_is_the_one_wandb_login_host_chose_and_an_unreachable_one_is_named(tmp_path, monkeypatch):
    """Without WANDB_BASE_URL, a run goes where `wandb login --host` pointed wandb: online when that
    server answers, else offline at once, the line naming that server and the file that chose it."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    cfg = _cfg(tmp_path)
    run_dir = run_directory(cfg)
    said = []
    with _AnyAnswer() as url:
        settings = _login_host(url)
        assert wandb_run.wandb_server() == (url, f"base_url in {settings}")
        assert run_loggers._wandb_mode(cfg, run_dir, said.append) == "online" and said == []
    closed = f"http://127.0.0.1:{_closed_port()}"
    _login_host(closed)
    assert run_loggers._wandb_mode(cfg, run_dir, said.append) == "offline"
    (line,) = said
    assert line.startswith(f"W&B: {closed} (base_url in {settings}) is not reachable from ")
    assert f"logging offline to {run_dir / 'wandb'}" in line


def test_wandb_base_url_wins_over_the_settings_file_and_wandbs_default_comes_last(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    assert wandb_run.wandb_server() == (wandb.Settings().base_url, f"wandb {wandb.__version__}'s default")
    _login_host("http://127.0.0.1:1")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:2/")
    assert wandb_run.wandb_server() == ("http://127.0.0.1:2", "WANDB_BASE_URL")  # as wandb normalizes it


def test_a_netrc_key_for_the_settings_files_server_means_online(tmp_path, monkeypatch):
    """`wandb login --host` keeps the key in ~/.netrc under that server's host: auto mode finds it there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)
    _login_host("http://127.0.0.1:8080")
    netrc = Path(os.environ["HOME"], ".netrc")
    netrc.parent.mkdir(parents=True, exist_ok=True)
    netrc.write_text(f"machine api.wandb.ai\n  login user\n  password {'y' * 40}\n")
    netrc.chmod(0o600)
    assert resolve_wandb_mode("auto") == "offline"  # a key, but for another server
    netrc.write_text(f"machine 127.0.0.1:8080\n  login user\n  password {'y' * 40}\n")
    assert resolve_wandb_mode("auto") == "online"


def test_an_online_start_that_fails_continues_the_same_run_offline(tmp_path, monkeypatch):
    """The server answers the probe but not W&B's start: the run falls back to offline, same id."""
    import http.server
    import threading

    class Answers(http.server.BaseHTTPRequestHandler):  # a proxy's error page for every request
        def do_GET(self):
            self.send_response(503)
            self.end_headers()

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _online_with_a_key(monkeypatch, f"http://127.0.0.1:{server.server_address[1]}")
        cfg = _cfg(tmp_path, **{"logging.wandb.init_timeout": 10})
        run_dir = run_directory(cfg)
        loggers = build_loggers(cfg, run_dir)
        fallback = r"could not start run .* online \(.*\); logging offline to .* \(to sync later: wandb sync"
        with pytest.warns(UserWarning, match=fallback):
            _fit(loggers, run_dir)
        close_loggers(loggers)
    finally:
        server.shutdown()
    [path] = find_run_files(run_dir)
    run = read_run(path)
    assert run.run_id == wandb_run_id(run_dir) and len(run.metric("train/loss")) == 8


def test_wandbs_own_variables_stand_where_the_config_keeps_its_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "lab-project")
    monkeypatch.setenv("WANDB_RUN_GROUP", "my-group")
    monkeypatch.setenv("WANDB_TAGS", "a,b")
    for overrides, want in (({}, ("lab-project", "my-group", ["a", "b"])),
                            ({"logging.wandb.project": "mine", "logging.wandb.group": "g",
                              "logging.wandb.tags": "[t]"}, ("mine", "g", ["t"]))):
        cfg = _cfg(tmp_path / str(len(overrides)), **overrides)
        run_dir = run_directory(cfg)
        loggers = build_loggers(cfg, run_dir)
        loggers[1].log_metrics({"x": 1.0}, step=0)
        close_loggers(loggers)
        run = read_run(find_run_files(run_dir)[0])
        assert (run.project, run.group, run.tags) == want
