"""A sweep's runs of one model shape trained as one stack, each then written as the ordinary run it is.

`train_stacked(configs)` runs in two parts:

1. **The stack trains.** Each member's task and model are built exactly as its solo run builds them
   (`experiment.task_and_module`: the run's seed, then its task, then its model), and its batches
   come from its own `TaskDataModule` train loader, epoch after epoch as Lightning's fit serves them
   (the sampler's epoch set at each pass). One step pads the members' batches to a common shape
   with the task's pad id (the batch-invariance contract makes that exact), runs `task.loss` for
   every member at once (`Stack.apply`) and updates them with `StackedAdamW`: each member's own
   peak rate, schedule (`optim.lr_factor`), betas, eps, weight decay and clipping norm
   (`trainer.gradient_clip_val`). It keeps each member's losses and, at the steps its run
   validates or saves a checkpoint, its weights; at those steps and on Ctrl-C or SIGTERM it saves
   its own checkpoint (training/stack_checkpoint.py), where a rerun of the sweep resumes it.
2. **Each member's run is written by the solo pipeline.** `experiment.train` runs the member's own
   config with a `ReplayModule`: Lightning's fit goes through the member's steps with its own data
   loader, callbacks and loggers, but takes no optimizer step; it logs the stack's losses and loads
   the stack's weights at the steps where they are read (validation, checkpoints). So the run
   directory, config.yaml, metrics.csv, best and last checkpoints, the final evaluation on
   `Task.evaluate` and results.json are made by the code that makes a solo run's, and `eval`,
   `load_model` and `report` cannot tell them apart.

A member whose loss or gradient goes non-finite stops alone (StackedAdamW.active): its run says
so (results.json's `stopped`), and one that cannot be written fails alone (`MemberFailed`).

Exact up to float32 rounding without dropout or randomized positions (core/stack.py): the stack's
batched matmuls add in another order than a solo run's. A member's checkpoints hold its Adam
moments from the stack, so a member resumed alone continues as its solo run. `trainer.compile`
compiles the stack's forward with its backward, and its update, each as one graph.
"""
from __future__ import annotations

import os
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig
from torch import Tensor
from torch.nn.functional import pad

from relpos_lab.api.errors import UserError, shown_path
from relpos_lab.api.task import Task
from relpos_lab.core.compiling import compile_function
from relpos_lab.core.stack import Stack
from relpos_lab.records.rundir import run_directory
from relpos_lab.training.data import TaskDataModule
from relpos_lab.training.experiment import task_and_module, train
from relpos_lab.training.interrupt import StopRequests
from relpos_lab.training.module import RelposModule
from relpos_lab.training.optim import lr_factor
from relpos_lab.training.planning import RunSummary
from relpos_lab.training.requeue import requeue_now
from relpos_lab.training.stack_checkpoint import StackCheckpoint, StackState, rng_state, set_rng_state
from relpos_lab.training.stacking import StackedAdamW
from relpos_lab.training.threads import use_cpu_threads


@dataclass
class MemberRecord:
    """What the stack leaves of one member: its (loss, nll) at each step, its weights where read."""

    losses: list[tuple[float, float]] = field(default_factory=list)  # index: the step taken (0 first)
    weights: dict[int, dict[str, Tensor]] = field(default_factory=dict)  # global step after it -> state_dict
    moments: dict[int, dict[str, tuple[Tensor, Tensor]]] = field(default_factory=dict)  # Adam's, by parameter
    stopped_at: int | None = None  # the step where its loss or gradient went non-finite and it stopped

    def notes(self) -> dict:
        """What results.json says of a member that stopped (nothing of one that trained through)."""
        if self.stopped_at is None:
            return {}
        return {"stopped": {"at_step": self.stopped_at,
                            "why": "its loss or gradient went non-finite in the stack; it took no update from "
                                   "there, so its parameters are those of that step (the other members trained on)"}}


@dataclass
class MemberFailed:
    """A member whose run could not be written (its metrics not finite, say): the others were."""

    run_dir: Path
    error: Exception


def train_stacked(cfgs: list[DictConfig], echo: Callable[[str], None] = print) -> list[RunSummary | MemberFailed]:
    """Train `cfgs` (configs that differ only in what a stack varies) as one stack, then write each
    member's run directory with the solo pipeline; returns each member's summary, or why it failed
    (as a solo run would have: a member that stopped on a non-finite loss may have no finite metric)."""
    started = time.time()
    use_cpu_threads(cfgs[0].trainer.threads, 1)
    new = [run_directory(cfg) for cfg in cfgs if not run_directory(cfg).exists()]
    records = fit_stack(cfgs, echo)
    share = (time.time() - started) / len(cfgs)  # each member's part of the stack's training time
    for cfg, record in zip(cfgs, records):
        if record.stopped_at is not None:
            echo(f"stack member {run_directory(cfg).name}: its loss or gradient went non-finite at step "
                 f"{record.stopped_at}; it stopped there, the others trained on (results.json: 'stopped')")
    outcomes: list[RunSummary | MemberFailed] = []
    try:
        for cfg, record in zip(cfgs, records):
            try:
                # wall_seconds: its share of the stack's training, then its own writing and evaluation
                outcomes.append(train(cfg, echo, started=time.time() - share,
                                      build_module=partial(ReplayModule, record=record)))
            except Exception as err:  # noqa: BLE001 - one member's failure leaves the others to be written
                echo(f"stack member {run_directory(cfg).name}: FAILED ({type(err).__name__}: {err})")
                outcomes.append(MemberFailed(run_directory(cfg), err))
    except BaseException:
        # A member stopped while its run was written (Ctrl-C, SIGTERM) holds checkpoints of the
        # weights last loaded, not of its step: its directory goes, and a rerun writes it again
        # from the stack's checkpoint (trained to the end), as it does the members not yet written.
        for run_dir in new:
            if run_dir.is_dir() and not (run_dir / "results.json").exists():
                shutil.rmtree(run_dir, ignore_errors=True)
        raise
    StackCheckpoint(cfgs).remove()
    return outcomes


def fit_stack(cfgs: list[DictConfig], echo: Callable[[str], None] = print) -> list[MemberRecord]:
    """Train the members together for their common trainer.max_steps, from the stack's checkpoint
    where an earlier attempt left one; returns what each run reads."""
    total = _common_steps(cfgs)
    members = [task_and_module(cfg, Path(), None) for cfg in cfgs]
    device = _device(cfgs[0])
    stack = Stack([module.model.to(device) for _, module in members])
    tasks = [task for task, _ in members]
    del members  # the stack holds the weights now: the members' own copies go
    optimizer = _optimizer(stack, cfgs)
    loss = partial(_member_loss, tasks[0].loss, float(cfgs[0].optim.label_smoothing))
    mode = cfgs[0].trainer.compile  # one graph for the forward and backward, one for the update
    forward = compile_function(partial(stack.apply, loss), mode)
    update = compile_function(optimizer.step, mode)
    streams = [MemberStream(TaskDataModule(t, cfg.data), total) for t, cfg in zip(tasks, cfgs)]
    records = [MemberRecord() for _ in cfgs]
    checkpoint = StackCheckpoint(cfgs)
    start = _restore(checkpoint, stack, optimizer, records, streams, echo)
    kept = [_read_steps(cfg) for cfg in cfgs]
    every = 60 * float(cfgs[0].trainer.checkpoint_every_minutes or 0.0)
    saved_at, logged = time.monotonic(), []
    with StopRequests(signal.SIGUSR1 if "SLURM_JOB_ID" in os.environ else None) as stop:
        for step in range(start, total):
            batched, shared = _stacked_batch([next(s) for s in streams], _pad_id(tasks[0]), device)
            losses, nlls = (_first(forward, batched, shared, cfgs[0]) if step == start
                            else forward(batched, shared=(shared,)))
            factors = [lr_factor(step, scheduler=o.scheduler, warmup_steps=o.warmup_steps, total_steps=total,
                                 min_lr_ratio=o.min_lr_ratio) for o in (cfg.optim for cfg in cfgs)]
            update(stack.flat_grad(losses), torch.tensor(factors, device=device), losses.detach())
            logged.append(torch.stack([losses, nlls]).detach())  # read back at a save: no wait per step
            _keep(stack, optimizer, records, kept, step + 1)
            due = any(step + 1 in k for k in kept) or (every and time.monotonic() - saved_at > every)
            if due or stop.signum is not None:
                _flush(logged, records)
                checkpoint.save(_state(step + 1, checkpoint, stack, optimizer, records, streams))
                saved_at = time.monotonic()
                stop.raise_if_requested(f"the stack stopped after step {step + 1} of {total}, its checkpoint "
                                        f"{shown_path(checkpoint.path)}: rerun the sweep to resume it", echo,
                                        requeue=partial(requeue_now, "requeue signal", "the next attempt resumes it"))
    _flush(logged, records)
    for record, stopped in zip(records, optimizer.stopped_at.tolist()):
        record.stopped_at = stopped if stopped >= 0 else None
    return records


def _common_steps(cfgs: list[DictConfig]) -> int:
    steps = {int(cfg.trainer.max_steps) for cfg in cfgs}
    if len(steps) != 1:
        raise ValueError(f"stacked runs train for one number of steps, not {sorted(steps)}")
    return steps.pop()


def _optimizer(stack: Stack, cfgs: list[DictConfig]) -> StackedAdamW:
    """Each member's own AdamW and clipping, from its config."""
    optim = [cfg.optim for cfg in cfgs]
    return StackedAdamW(stack, lr=[o.lr for o in optim], betas=([o.betas[0] for o in optim],
                                                                [o.betas[1] for o in optim]),
                        eps=[o.eps for o in optim], weight_decay=[o.weight_decay for o in optim],
                        max_grad_norm=[cfg.trainer.gradient_clip_val or 0.0 for cfg in cfgs])


def _keep(stack: Stack, optimizer: StackedAdamW, records: list[MemberRecord], kept: list[set[int]], step: int):
    """Each member's weights and Adam moments at the steps its run reads them."""
    for k, record in enumerate(records):
        if step in kept[k]:
            record.weights[step] = {n: t.cpu() for n, t in stack.member_state_dict(k).items()}
            record.moments[step] = _moments(stack, optimizer, k)


def _flush(logged: list[Tensor], records: list[MemberRecord]) -> None:
    """The (loss, nll) of the steps since the last flush, read back from the device once."""
    values = torch.stack(logged).tolist() if logged else []  # (steps, 2, K)
    for k, record in enumerate(records):
        record.losses += [(loss[k], nll[k]) for loss, nll in values]
    logged.clear()


def _state(step: int, checkpoint: StackCheckpoint, stack: Stack, optimizer: StackedAdamW,
           records: list[MemberRecord], streams: list[MemberStream]) -> StackState:
    tensors = {"flat": stack.flat, "exp_avg": optimizer.exp_avg, "exp_avg_sq": optimizer.exp_avg_sq,
               "active": optimizer.active, "stopped_at": optimizer.stopped_at}
    return StackState(step, checkpoint.members, {k: v.detach().cpu() for k, v in tensors.items()}, records,
                      [s.state_dict() for s in streams], rng_state())


def _restore(checkpoint: StackCheckpoint, stack: Stack, optimizer: StackedAdamW, records: list[MemberRecord],
             streams: list[MemberStream], echo: Callable[[str], None]) -> int:
    """The step an earlier attempt's checkpoint left the stack at (0: none), its state loaded."""
    state = checkpoint.find()
    if state is None:
        return 0
    with torch.no_grad():
        stack.flat.copy_(state.optimizer["flat"])
    for name in ("exp_avg", "exp_avg_sq", "active", "stopped_at"):
        getattr(optimizer, name).copy_(state.optimizer[name])
    optimizer.steps = state.step
    records[:] = state.records
    for stream, saved in zip(streams, state.streams):
        stream.load_state_dict(saved)
    set_rng_state(state.rng)
    echo(f"stack of {len(records)}: resuming at step {state.step} from {shown_path(checkpoint.directory)}")
    return state.step


def _moments(stack: Stack, optimizer: StackedAdamW, k: int) -> dict[str, tuple[Tensor, Tensor]]:
    """Member k's Adam moments by parameter name (the stack's flat layout cut back into parameters)."""
    out, start = {}, 0
    for name, shape in stack.shapes.items():
        end = start + shape.numel()
        out[name] = tuple(m[k, start:end].reshape(shape).cpu().clone()
                          for m in (optimizer.exp_avg, optimizer.exp_avg_sq))
        start = end
    return out


def _member_loss(task_loss, smoothing: float, model, batch: dict, shared: dict) -> tuple[Tensor, Tensor]:
    out = task_loss(model, batch | shared, smoothing)
    return out.loss, out.nll_sum / out.n_tokens.clamp_min(1)


def _read_steps(cfg: DictConfig) -> set[int]:
    """The global steps at which a run reads its weights: each validation, each periodic checkpoint,
    the last step."""
    t = cfg.trainer
    every = {t.val_every_n_steps, t.checkpoint_every_n_steps or t.val_every_n_steps}
    return {s for s in range(1, t.max_steps + 1) if any(s % n == 0 for n in every if n)} | {t.max_steps}


def _first(forward: Callable, batched, shared, cfg: DictConfig):
    """The first stacked step, where a plugin that vmap cannot batch fails: said as what to do."""
    try:
        return forward(batched, shared=(shared,))
    except Exception as err:  # noqa: BLE001 - whatever vmap refuses
        scheme = cfg.model.positions.scheme
        raise UserError(f"the runs of scheme {scheme!r} do not stack ({type(err).__name__}: {err}); "
                        f"`relpos-lab check-scheme {scheme}` says why; run this sweep without --stack") from err


def _device(cfg: DictConfig) -> torch.device:
    """Where the stack trains: the GPU where the member's Trainer would take one."""
    wants = cfg.trainer.accelerator in ("auto", "gpu", "cuda")
    return torch.device("cuda" if wants and torch.cuda.is_available() else "cpu")


class MemberStream:
    """A member's training batches, epoch after epoch, as Lightning's fit serves them: the loader's
    sampler told each epoch before its pass (what Lightning's set_epoch does). Its place (epoch,
    batches served) is what the stack's checkpoint keeps; the loader resumes mid-epoch
    (training/resumable.py)."""

    def __init__(self, data: TaskDataModule, steps: int):
        data.prepare_data()
        # what the data module reads of the Trainer of a one-device fit of `steps` steps (a stream's length)
        data.trainer = SimpleNamespace(world_size=1, global_rank=0, max_steps=steps,
                                       state=SimpleNamespace(fn=TrainerFn.FITTING))
        self.loader = data.train_dataloader()
        self.epoch, self._batches = 0, None

    def __next__(self) -> dict:
        while True:
            if self._batches is None:
                for sampler in (self.loader.sampler, getattr(self.loader.batch_sampler, "sampler", None)):
                    if hasattr(sampler, "set_epoch"):
                        sampler.set_epoch(self.epoch)
                self._batches = iter(self.loader)
            try:
                return next(self._batches)
            except StopIteration:
                self.epoch, self._batches = self.epoch + 1, None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self._batches = int(state["epoch"]), None
        self.loader.load_state_dict(state["loader"])


def _pad_id(task: Task) -> int | None:
    vocab = getattr(task, "tgt_vocab", None)
    return vocab.pad_id if vocab is not None else getattr(task, "pad_id", None)


def _stacked_batch(batches: list[dict], pad_id: int | None, device: torch.device) -> tuple[dict, dict]:
    """The members' batches as one (K, …) batch, each tensor padded at its end to the widest
    member's with the pad id; what is no tensor must be alike and is passed to every member."""
    batched, shared = {}, {}
    for key, first in batches[0].items():
        values = [b[key] for b in batches]
        if not isinstance(first, Tensor):
            if any(v != first for v in values):
                raise ValueError(f"stacked members' batches differ in '{key}', which is no tensor")
            shared[key] = first
            continue
        if len({v.shape[0] for v in values}) > 1:
            raise ValueError("stacked members' batches hold different numbers of examples; stack runs "
                             "whose batches are counted in examples (data.batch_size), not tokens")
        if len({v.shape for v in values}) > 1:
            if pad_id is None:
                raise ValueError(f"stacked members' '{key}' differ in shape and the task names no pad id")
            width = [max(v.shape[d] for v in values) for d in range(first.dim())]
            values = [pad(v, [p for d in reversed(range(1, v.dim())) for p in (0, width[d] - v.shape[d])],
                          value=pad_id) for v in values]
        batched[key] = torch.stack(values).to(device)
    return batched, shared


class ReplayModule(RelposModule):
    """A stacked member's run through the solo pipeline: the fit steps through the run's batches but
    updates nothing; it logs the stack's losses for the step and loads the stack's weights after the
    steps where the run reads them (before the callbacks and the validation of that step)."""

    def __init__(self, cfg: DictConfig, task: Task, test_split: str = "test", *, record: MemberRecord):
        super().__init__(cfg, task, test_split)
        self.record = record

    def results_notes(self) -> dict:
        return self.record.notes()

    def training_step(self, batch: dict, batch_idx: int) -> Tensor:
        loss, nll = self.record.losses[self.global_step]
        size = next(v.shape[0] for v in batch.values() if isinstance(v, Tensor))
        self.log("train/loss", torch.tensor(loss), batch_size=size)
        self.log("train/nll", torch.tensor(nll), batch_size=size)
        return next(self.model.parameters()).sum() * 0.0  # a backward for Lightning; no update follows

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer, optimizer_closure=None) -> None:
        optimizer_closure()  # the training step and its backward, which Lightning expects to have run
        step = self.global_step + 1
        if step in self.record.weights:
            self.model.load_state_dict(self.record.weights[step])
            _set_adam_state(optimizer.optimizer, self.model, self.record.moments[step], step)

    def on_train_start(self) -> None:
        super().on_train_start()
        # the schedule advances each step although the optimizer never steps: what is logged as lr-*
        warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler.step\(\)` before")


def _set_adam_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module,
                    moments: dict[str, tuple[Tensor, Tensor]], step: int) -> None:
    """Put the stack's Adam moments for `model` into the member's torch AdamW, as its own `step`
    calls would have left them: the checkpoints then hold them, and a run resumed from one continues
    as its solo run would."""
    group = optimizer.param_groups[0]
    on_device = group.get("fused") or group.get("capturable")
    for name, p in model.named_parameters():
        exp_avg, exp_avg_sq = moments[name]
        optimizer.state[p] = {"step": torch.tensor(float(step), dtype=torch.float32,
                                                   device=p.device if on_device else "cpu"),
                              "exp_avg": exp_avg.to(p.device), "exp_avg_sq": exp_avg_sq.to(p.device)}
