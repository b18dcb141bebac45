"""A sweep's report as one W&B run (`relpos-lab report --wandb`): what a sweep's reader opens.

The sweep's runs each hold their own numbers; the leaderboard across them is the report's. This
logs it to a run of its own in the sweep's W&B group (job_type `report`): the summary table
(`leaderboard`), one length curve chart per task and metric (`by_length/<metric>/<task>`, a line
per group), and the report's files as an artifact of type `report`. Offline (the default without
an API key) the run sits in `<report dir>/wandb/` until `wandb sync` uploads it.
"""
from __future__ import annotations

import os
from pathlib import Path

from relpos_lab.config.schema import WandbConfig
from relpos_lab.records.wandb_offline import wait_until_complete
from relpos_lab.records.wandb_run import resolve_wandb_mode

TASK = "task"  # the sweep axis that splits the length charts, when the sweep has one


def publish_report(out: Path, name: str, split: str, how: str, names: list[str], rows: list[dict],
                   curves: dict[str, dict[str, dict[int, tuple]]], axes: dict[str, dict[str, str]]) -> Path:
    """Log the report in `out` (its rows and curves, as write_report computed them) to W&B; return the
    directory W&B wrote to. `axes`: each group's sweep axes, {group label: {axis: value}}."""
    import wandb

    columns = ("mean", "std") if how == "mean" else ("best",)
    mode = resolve_wandb_mode("auto")
    run = wandb.init(project=os.environ.get("WANDB_PROJECT") or WandbConfig.project, group=name, job_type="report",
                     name=f"{name}-report-{split}", dir=str(out), mode=mode, reinit="create_new",
                     config={"sweep": name, "split": split, "aggregate": how})
    try:
        header = ["group", "n_runs"] + [f"{m}_{c}" for m in names for c in columns]
        data = [[row["group"], row["n"]] + [row[m][i] if m in row else None
                                            for m in names for i in range(len(columns))] for row in rows]
        charts = {"leaderboard": wandb.Table(columns=header, data=data)}
        task_of = {label: values.get(TASK, name) for label, values in axes.items()}
        for metric, table in curves.items():
            for task in sorted(set(task_of.values())):
                points = [[label, n, value] for label, curve in table.items() if task_of.get(label) == task
                          for n, (value, *_) in curve.items()]
                if points:
                    lines = wandb.Table(columns=["group", "length", metric], data=points)
                    charts[f"by_length/{metric}/{task}"] = wandb.plot.line(
                        lines, x="length", y=metric, stroke="group", title=f"{task}: {metric} by length ({split})")
        run.log(charts)
        artifact = wandb.Artifact(f"{name}-report-{split}", type="report")
        for path in sorted(out.iterdir()):
            if path.is_file():
                artifact.add_file(str(path))
        run.log_artifact(artifact)
    finally:
        run_file = Path(run.dir).parent / f"run-{run.id}.wandb"
        run.finish()
        if run_file.is_file():  # offline: the file is complete when the command returns (as RunWandbLogger.close)
            wait_until_complete(run_file)
    return out / "wandb"
