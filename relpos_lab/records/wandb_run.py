"""The W&B logger of a run: fail-safe, with provenance, one W&B run per run directory.

Lightning's WandbLogger lets any W&B error (no network, a broken install, a crashed wandb-core)
propagate and kill training. `RunWandbLogger` turns each such error into one warning and goes on
without W&B. It also puts the resolved config and provenance (git commit, SLURM ids) in the W&B
run config, finishes the W&B run when a fit fails or SLURM requeues it (so everything logged so far
is flushed before the process is killed), and never silently logs into another run's W&B run. A
resumed run continues its W&B run without logging a step twice, and logs again, from metrics.csv,
what an interrupted attempt's W&B file lost (`wandb_resume_plan`).
"""
from __future__ import annotations

import functools
import hashlib
import numbers
import os
import socket
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path
from typing import Any, NamedTuple

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only, rank_zero_warn

from relpos_lab.api.files import atomic_write
from relpos_lab.config.schema import WANDB_MODES
from relpos_lab.records.metrics_csv import before_checkpoint, read_metric_rows
from relpos_lab.records.wandb_offline import STEP, find_run_files, history, read_run, wait_until_complete

WANDB_ID = ".wandb_id"  # a run directory's W&B run id when it is not the default (after a start over)


class _NullRun:
    """Stands in for a W&B run after W&B failed: every attribute and call is a no-op."""

    def __getattr__(self, _name: str) -> _NullRun:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


class RunWandbLogger(WandbLogger):
    """WandbLogger for one run directory: fail-safe, with provenance, one W&B run per run id.

    `run_config` (the resolved config and provenance) is merged into the W&B run config right
    after ``wandb.init`` rather than passed to it, with changes allowed: a resumed run may differ
    in keys such as ``resume`` or the SLURM job id. Extra keyword arguments go to ``wandb.init``
    as in Lightning's WandbLogger.
    """

    def __init__(self, *, run_config: dict[str, Any] | None = None, resume: ResumePlan | None = None,
                 rewind: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        if self._wandb_init.get("anonymous") is None:  # wandb 0.31 warns about the key even when None
            self._wandb_init.pop("anonymous", None)
        self._run_config = run_config or {}
        self._failure: str | None = None
        self._plain_resume: dict[str, Any] | None = None
        self._resume = resume
        self._backfill = list(resume.backfill) if resume else []  # rows the W&B history lacks, logged first
        self._held: dict[int, frozenset[str]] = {}  # training step -> metric names not to log again
        self._next_step: int | None = None  # the _step of the next row, when this logger numbers them
        if resume is not None and rewind and resume.rewind_to is not None and self._id is not None:
            # W&B's rewind: the run's history is cut after _step `rewind_to` and continues from
            # there (recorded offline as the run's branch point; applied by the server on sync).
            self._plain_resume = dict(self._wandb_init, resume="allow")
            self._wandb_init.pop("resume", None)
            self._wandb_init["resume_from"] = f"{self._id}?_step={resume.rewind_to}"
        elif resume is not None:
            self._wandb_init["resume"] = "allow"
            self._resume_plainly()

    def _resume_plainly(self) -> None:
        """A plain resume: W&B keeps what the run holds, so rows for it are left out, and the rows
        are numbered after its last one (offline, W&B itself would start again at _step 0)."""
        self._held, self._next_step = dict(self._resume.held), self._resume.next_step

    @property
    def failed(self) -> bool:
        """True once W&B raised: the logger then drops everything sent to it."""
        return self._failure is not None

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        if self._failure is not None:
            return _NullRun()
        try:
            if self._experiment is None:
                self._finish_other_run()
                try:
                    super().experiment
                except Exception as err:
                    if self._plain_resume is not None:
                        # A server without rewind support: continue the run as W&B resumes one.
                        rank_zero_warn(f"W&B: could not rewind run {self._id!r} ({type(err).__name__}: {err}); "
                                       "continuing it as logging.wandb.resume=allow does")
                        self._wandb_init, self._plain_resume, self._experiment = self._plain_resume, None, None
                        self._resume_plainly()
                    elif self._wandb_init.get("mode") == "online":
                        # The server did not answer in init_timeout: the same run, offline, to sync later.
                        rank_zero_warn(f"W&B: could not start run {self._id!r} online ({type(err).__name__}: "
                                       f"{str(err).splitlines()[0] if str(err) else ''}); logging offline to "
                                       f"{self._save_dir}/wandb (to sync later: {sync_command(self._save_dir)})")
                        self._wandb_init["mode"], self._experiment = "offline", None
                        _drop_wandb_service()
                    else:
                        raise
                    super().experiment
                self._experiment.config.update(self._run_config, allow_val_change=True)
                if self._wandb_init.get("mode") == "online" and getattr(self._experiment, "url", None):
                    print(f"W&B: {self._experiment.url}", flush=True)  # where the dashboard is
                if self._next_step is not None:  # online, W&B knows where the run's history ends
                    self._next_step = max(self._next_step, int(self._experiment.step or 0))
                backfill, self._backfill = self._backfill, []
                for step, metrics in backfill:  # as WandbLogger.log_metrics logs a row
                    self._log_row({**metrics, STEP: step})
            return self._experiment
        except Exception as err:  # any W&B problem must leave training running
            self._fail(f"could not start W&B run {self._id!r}", err)
            return _NullRun()

    @property
    def version(self) -> str | None:
        return self._id if self._failure is not None else super().version

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self._guard("log hyperparameters", super().log_hyperparams, params)

    @rank_zero_only
    def log_metrics(self, metrics: Any, step: int | None = None) -> None:
        # log_table, log_text, log_image, ... all go through here.
        if step is not None and step in self._held:  # a plain resume: what W&B holds is not logged again,
            held = {k: v for k, v in metrics.items() if k in self._held[step]}  # but the summary has its last value
            last = {k: v for k, v in held.items() if isinstance(v, numbers.Number)}
            if last:
                self._guard("update the summary", lambda: self.experiment.summary.update(last))
            metrics = {k: v for k, v in metrics.items() if k not in held}
            if not metrics:
                return
        if self._next_step is None:
            self._guard("log metrics", super().log_metrics, metrics, step)
        else:
            self._guard("log metrics", self._log_row, dict(metrics, **({STEP: step} if step is not None else {})))

    def _log_row(self, row: dict[str, Any]) -> None:
        """Log one history row, numbered by this logger after a plain resume."""
        if self._next_step is None:
            self.experiment.log(row)
        else:
            self.experiment.log(row, step=self._next_step)
            self._next_step += 1

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        self._guard("record a checkpoint", super().after_save_checkpoint, checkpoint_callback)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the W&B run when the process is about to end abnormally.

        Lightning calls finalize("success") after every fit/validate/test; the run stays open
        then, so a test after a fit continues the same W&B run (close() or interpreter exit ends
        it). "failed" (an exception) and "finished" (SLURM's requeue signal) finish it now, because
        the process may be killed before exit handlers run.
        """
        self._guard("finalize", super().finalize, status)
        if status == "finished":
            self.close(preempted=True)
        elif status == "failed":
            self.close(exit_code=1)

    def close(self, exit_code: int = 0, preempted: bool = False) -> None:
        """Finish this logger's W&B run; logging afterwards resumes the same run id."""
        if self._experiment is None or self._failure is not None:
            return
        run, self._experiment = self._experiment, None
        run_file = Path(run.dir).parent / f"run-{run.id}.wandb"
        try:
            if preempted:
                run.mark_preempting()
            run.finish(exit_code=exit_code)
        except Exception as err:
            self._fail("could not finish the W&B run", err)
            return
        if run_file.is_file():  # offline: the run directory is complete when the command returns
            wait_until_complete(run_file)
        if preempted:  # SLURM stops this job step, W&B's service with it: let go of the service now
            _drop_wandb_service()

    def _finish_other_run(self) -> None:
        """Finish a different W&B run left open in this process (an earlier run of a sweep).

        Lightning would log into whatever run is open; our run id is a function of the run
        directory, so writing into another run would mix two experiments.
        """
        import wandb

        if wandb.run is not None and self._id is not None and wandb.run.id != self._id:
            rank_zero_warn(f"finishing W&B run {wandb.run.id!r} left open before starting {self._id!r}")
            wandb.run.finish()

    def _guard(self, action: str, fn: Any, *args: Any) -> None:
        if self._failure is not None:
            return
        try:
            fn(*args)
        except Exception as err:
            self._fail(f"could not {action}", err)

    def _fail(self, action: str, err: Exception) -> None:
        self._failure = f"{type(err).__name__}: {err}"
        self._experiment = None
        rank_zero_warn(
            f"W&B: {action} ({self._failure}); training continues without W&B. "
            "The run directory (metrics.csv, results.json, plots/) has everything logged."
        )
        _drop_wandb_service()


def _drop_wandb_service() -> None:
    """Let go of W&B's service process after a failure or before SLURM's requeue, so that wandb's
    own exit hook does not try to reach it again and print a traceback at exit (its usual end when
    SLURM's SIGTERM has already stopped the service: scancel, requeue, preemption). A later run in
    the same process starts a new service."""
    import wandb

    try:
        wandb.teardown()
    except Exception:  # the service is gone: nothing left to tear down
        pass


# --- the loggers of a run -----------------------------------------------------------------------


def resolve_wandb_mode(configured: str = "auto") -> str:
    """The W&B mode a run uses.

    ``offline``, ``online`` and ``disabled`` in the config are explicit choices and win (the
    ``debug`` overlay's ``offline`` keeps a debug run off the server). The default, ``auto``, yields
    to the ``WANDB_MODE`` environment variable (so ``WANDB_MODE=online`` on a cluster works without
    editing configs), then to an available API key (``WANDB_API_KEY`` or a ``wandb login`` entry in
    ~/.netrc) meaning online, and otherwise is offline: never attempting the network on a machine
    that has none.
    """
    if configured not in WANDB_MODES:
        raise ValueError(f"logging.wandb.mode={configured!r} is not one of {', '.join(WANDB_MODES)}")
    if configured != "auto":
        return configured
    env = os.environ.get("WANDB_MODE")
    if env:
        return {"dryrun": "offline", "run": "online"}.get(env, env)
    return "online" if _has_api_key() else "offline"


def sync_command(run_dir: str | Path) -> str:
    """The command that uploads a run directory's offline W&B runs."""
    return f"wandb sync {Path(run_dir) / 'wandb'}/offline-run-*"


class WandbServer(NamedTuple):
    """The W&B server this process's runs would talk to (`wandb_server`)."""

    url: str
    source: str  # where that comes from, as a message names it


def wandb_server() -> WandbServer:
    """The server ``wandb.init`` would use, found as wandb itself finds it: ``WANDB_BASE_URL``,
    else the ``base_url`` of wandb's settings files (``./wandb/settings`` over the global one that
    ``wandb login --host`` writes, ``$WANDB_CONFIG_DIR/settings``, by default
    ``~/.config/wandb/settings``), else the installed wandb's default. Read with a fresh
    ``wandb.Settings`` and its own readers and URL validation, not wandb's process-wide settings:
    loading those now would make a later ``wandb.init`` ignore changes to the environment."""
    try:
        import wandb
        from wandb.sdk.lib.settings_file import SettingsFiles
    except ImportError:  # no wandb: nothing will log to a server
        return WandbServer(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai", "no wandb installed")
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or Path("~", ".config", "wandb")).expanduser()
    settings = wandb.Settings(settings_system=str(config_dir / "settings"))
    chosen = None
    if os.environ.get("WANDB_BASE_URL"):
        chosen = WandbServer(os.environ["WANDB_BASE_URL"], "WANDB_BASE_URL")
    else:
        for path in (Path(settings.settings_workspace), Path(settings.settings_system)):
            base_url = SettingsFiles(global_settings=None, local_settings=path).all().get("base_url")
            if base_url:
                chosen = WandbServer(base_url, f"base_url in {path}")
                break
    if chosen is None:
        return WandbServer(settings.base_url, f"wandb {wandb.__version__}'s default")
    try:  # as wandb normalizes it (a Forge proxy URL to its API, no trailing slash)
        return chosen._replace(url=wandb.Settings(base_url=chosen.url).base_url)
    except (ValueError, TypeError):  # one wandb refuses: its own start will say why
        return chosen


def server_unreachable(timeout: float = 5.0) -> str | None:
    """Why the W&B server (`wandb_server`) cannot be reached from this process (None: it
    answered), asked once per process and server: a compute node without internet then logs
    offline at once, instead of waiting in ``wandb.init`` (about 90 s) for each run. Any HTTP
    answer counts as reachable."""
    return _unreachable(wandb_server(), timeout)


@functools.cache
def _unreachable(server: WandbServer, timeout: float) -> str | None:
    try:
        urllib.request.urlopen(server.url, timeout=timeout).close()  # noqa: S310 - W&B's own server
    except urllib.error.HTTPError:
        return None  # it answered
    except (OSError, ValueError) as err:
        return (f"{server.url} ({server.source}) is not reachable from {socket.gethostname()} "
                f"({getattr(err, 'reason', err)})")
    return None


def _has_api_key() -> bool:
    """An API key for the server wandb would use: WANDB_API_KEY, or its entry in ~/.netrc (where
    ``wandb login`` writes it), read by wandb's own reader (a Forge host also by its W&B API host)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        from wandb.sdk.lib.wbauth import read_netrc_auth
    except ImportError:
        return False
    try:
        return read_netrc_auth(host=wandb_server().url) is not None
    except Exception:  # a malformed entry (wandb warns about it): no key to go online with
        return False


def wandb_run_id(run_dir: str | Path) -> str:
    """W&B run id of a run directory: the one in ``<run dir>/.wandb_id``, drawn when the directory's
    first attempt starts (`start_wandb_lineage`), so every resumed or requeued attempt continues it
    and a directory deleted and run again is a new W&B run rather than a second history synced into
    the old one. A directory made before ids were stored has the hash of its absolute path."""
    chosen = Path(run_dir) / WANDB_ID
    if chosen.is_file():
        return chosen.read_text().strip()
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def start_wandb_lineage(run_dir: str | Path) -> str:
    """The W&B run id of `run_dir`, a new one if no attempt has logged to W&B there yet."""
    run_dir = Path(run_dir)
    if (run_dir / WANDB_ID).is_file() or (run_dir / "wandb").exists():
        return wandb_run_id(run_dir)
    return new_wandb_run_id(run_dir)


def new_wandb_run_id(run_dir: str | Path) -> str:
    """Give a run directory that starts over a W&B run id of its own (the old run keeps the old one)."""
    run_dir = Path(run_dir)
    seed = f"{run_dir.resolve()}:{time.time_ns()}"
    run_id = hashlib.sha256(seed.encode()).hexdigest()[:16]
    atomic_write(run_dir / WANDB_ID, run_id + "\n")
    return run_id


class ResumePlan(NamedTuple):
    """How a resumed attempt continues its W&B run (`wandb_resume_plan`)."""

    rewind_to: int | None  # the _step of W&B's last row before the checkpoint (None: none)
    backfill: list[tuple[int, dict[str, float]]]  # metrics.csv rows before the checkpoint that W&B lacks
    held: dict[int, frozenset[str]]  # training step -> the metric names W&B holds that a resumed fit logs again
    next_step: int  # the _step after W&B's last row


def wandb_resume_plan(run_dir: str | Path, step: int) -> ResumePlan:
    """How a run resumed at training step `step` continues its W&B history, from the W&B files
    of its earlier attempts and metrics.csv.

    Usually the earlier attempts' W&B files hold every row up to the checkpoint, and an interrupted
    attempt's rows after it. SLURM's SIGTERM (scancel, requeue, preemption) also reaches W&B's
    service process, which dies without flushing: that attempt's file ends early or is empty.
    metrics.csv, flushed at every checkpoint, holds those rows: the resumed attempt logs the rows
    W&B lacks from metrics.csv before it trains (`backfill`), so W&B ends with every step once, as
    metrics.csv. Then either W&B's history is rewound to its last row before the checkpoint
    (`rewind_to`) and the attempt logs everything again from there, or (a plain resume) the
    attempt leaves out what W&B holds (`held`) and numbers its rows from `next_step`.
    """
    run_id = wandb_run_id(run_dir)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a killed attempt's file ends inside a record
        attempts = []
        for path in find_run_files(Path(run_dir) / "wandb", online=True):
            try:
                run = read_run(path)
            except Exception:  # an attempt killed before its run record: nothing logged
                continue
            if run.run_id == run_id:
                attempts.append(run)
    attempts.sort(key=lambda r: r.start_time)
    return resume_plan(history(attempts), read_metric_rows(run_dir), step)


def resume_plan(logged: list[dict[str, Any]], rows: list[tuple[int, dict[str, float]]], step: int) -> ResumePlan:
    """`wandb_resume_plan` given the W&B history (`history`'s rows) and metrics.csv's rows.

    W&B's file is a prefix of what was logged, in step order, so only its newest step can be
    partial: of that step, the rows with a metric W&B lacks are logged again too.
    """
    rows = [(s, metrics) for s, metrics in rows if before_checkpoint(s, metrics, step)]
    keys_logged: dict[int, set[str]] = {}  # training step before the checkpoint -> the metric names W&B holds
    held: dict[int, set[str]] = {}  # training step -> the metric names of W&B's rows after the checkpoint
    last_row: dict[int, int] = {}  # training step before the checkpoint -> the _step of its last W&B row
    current = None
    for row in logged:
        current = row.get(STEP, current)  # rows without a training step belong to the row before
        if current is None or "_step" not in row:
            continue
        if before_checkpoint(current, row, step):
            last_row[current] = int(row["_step"])
            keys_logged.setdefault(current, set()).update(row)
        else:  # what the resumed attempt would log again: training from the checkpoint on, the final test
            held.setdefault(current, set()).update(k for k in row if not k.startswith("_") and k != STEP)
    next_step = max((int(row["_step"]) + 1 for row in logged if "_step" in row), default=0)
    frozen = {s: frozenset(k) for s, k in held.items()}
    if not last_row:
        return ResumePlan(None, rows, frozen, next_step)
    newest = max(last_row)
    lacking = [(s, m) for s, m in rows if s > newest or (s == newest and not m.keys() <= keys_logged[newest])]
    return ResumePlan(last_row[newest], lacking, frozen, next_step)
