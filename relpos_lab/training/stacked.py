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
   validates or saves a checkpoint, its weights.
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
compiles the stack's forward with its backward, and its update, each as one graph. Not supported
yet: resuming a stack as a stack.
"""
from __future__ import annotations

import shutil
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import DictConfig
from torch import Tensor
from torch.nn.functional import pad

from relpos_lab.api.errors import UserError
from relpos_lab.api.task import Task
from relpos_lab.core.compiling import compile_function
from relpos_lab.core.stack import Stack
from relpos_lab.records.rundir import run_directory
from relpos_lab.training.data import TaskDataModule
from relpos_lab.training.experiment import task_and_module, train
from relpos_lab.training.module import RelposModule
from relpos_lab.training.optim import lr_factor
from relpos_lab.training.planning import RunSummary
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
    records = fit_stack(cfgs)
    for cfg, record in zip(cfgs, records):
        if record.stopped_at is not None:
            echo(f"stack member {run_directory(cfg).name}: its loss or gradient went non-finite at step "
                 f"{record.stopped_at}; it stopped there, the others trained on (results.json: 'stopped')")
    outcomes: list[RunSummary | MemberFailed] = []
    try:
        for cfg, record in zip(cfgs, records):
            try:
                outcomes.append(train(cfg, echo, started=started, build_module=partial(ReplayModule, record=record)))
            except Exception as err:  # noqa: BLE001 - one member's failure leaves the others to be written
                echo(f"stack member {run_directory(cfg).name}: FAILED ({type(err).__name__}: {err})")
                outcomes.append(MemberFailed(run_directory(cfg), err))
    except BaseException:
        # A member stopped while its run was written (Ctrl-C, SIGTERM) holds checkpoints of the
        # weights last loaded, not of its step: this stack's unfinished members start over.
        for run_dir in new:
            if run_dir.is_dir() and not (run_dir / "results.json").exists():
                shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return outcomes


def fit_stack(cfgs: list[DictConfig]) -> list[MemberRecord]:
    """Train the members together for their common trainer.max_steps; returns what each run reads."""
    steps = {int(cfg.trainer.max_steps) for cfg in cfgs}
    if len(steps) != 1:
        raise ValueError(f"stacked runs train for one number of steps, not {sorted(steps)}")
    total = steps.pop()
    members = [task_and_module(cfg, Path(), None) for cfg in cfgs]
    device = _device(cfgs[0])
    stack = Stack([module.model.to(device) for _, module in members])
    tasks = [task for task, _ in members]
    del members  # the stack holds the weights now: the members' own copies go
    optim = [cfg.optim for cfg in cfgs]
    optimizer = StackedAdamW(stack, lr=[o.lr for o in optim], betas=([o.betas[0] for o in optim],
                                                                      [o.betas[1] for o in optim]),
                             eps=[o.eps for o in optim], weight_decay=[o.weight_decay for o in optim],
                             max_grad_norm=[cfg.trainer.gradient_clip_val or 0.0 for cfg in cfgs])
    task = tasks[0]
    loss = partial(_member_loss, task.loss, float(cfgs[0].optim.label_smoothing))
    mode = cfgs[0].trainer.compile  # one graph for the forward and backward, one for the update
    forward = compile_function(partial(stack.apply, loss), mode)
    update = compile_function(optimizer.step, mode)
    batches = [_endless(TaskDataModule(t, cfg.data), total) for t, cfg in zip(tasks, cfgs)]
    kept = [_read_steps(cfg) for cfg in cfgs]
    records, logged = [MemberRecord() for _ in cfgs], []
    for step in range(total):
        batched, shared = _stacked_batch([next(b) for b in batches], _pad_id(task), device)
        losses, nlls = _first(forward, batched, shared, cfgs[0]) if step == 0 else forward(batched, shared=(shared,))
        factors = [lr_factor(step, scheduler=o.scheduler, warmup_steps=o.warmup_steps, total_steps=total,
                             min_lr_ratio=o.min_lr_ratio) for o in optim]
        update(stack.flat_grad(losses), torch.tensor(factors, device=device), losses.detach())
        logged.append(torch.stack([losses, nlls]).detach())  # read back once, at the end: no wait per step
        for k, record in enumerate(records):
            if step + 1 in kept[k]:
                record.weights[step + 1] = {n: t.cpu() for n, t in stack.member_state_dict(k).items()}
                record.moments[step + 1] = _moments(stack, optimizer, k)
    values = torch.stack(logged).tolist() if logged else []  # (steps, 2, K)
    for k, (record, stopped) in enumerate(zip(records, optimizer.stopped_at.tolist())):
        record.losses = [(loss[k], nll[k]) for loss, nll in values]
        record.stopped_at = stopped if stopped >= 0 else None
    return records


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


def _endless(data: TaskDataModule, steps: int) -> Iterator[dict]:
    """A member's training batches, epoch after epoch, as Lightning's fit serves them: the loader's
    sampler told each epoch before its pass (what Lightning's set_epoch does)."""
    data.prepare_data()
    # what the data module reads of the Trainer of a one-device fit of `steps` steps (a stream's length)
    data.trainer = SimpleNamespace(world_size=1, global_rank=0, max_steps=steps,
                                   state=SimpleNamespace(fn=TrainerFn.FITTING))
    loader = data.train_dataloader()
    epoch = 0
    while True:
        for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


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
