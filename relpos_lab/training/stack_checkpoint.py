"""Where an interrupted stack resumes: its own checkpoint, beside its members' run directories.

A stack trains before any member's run directory exists (training/stacked.py), so a solo run's
checkpoints cannot carry it. This file does: the step, the stack's flat parameters, Adam's moments
and each member's stopping state, what each member's run will read (its losses so far, its weights
and moments at its validation and checkpoint steps), each member's place in its data stream, and
the random generators. It is written atomically at the steps the members' runs read, every
`trainer.checkpoint_every_minutes`, and on Ctrl-C or SIGTERM (at the end of the current step, as a
solo run's last.ckpt), under `<sweep dir>/stacks/`, with a JSON index naming its members and step.

A rerun finds the newest checkpoint holding every member of its stack (a stack stopped while its
members' runs were written is rerun with only the unfinished ones) and continues from it: the
same members in the same stack continue exactly; a subset continues with its rows (its dropout
draws then differ from the uninterrupted stack's, as a stack's are its own anyway). The files go
once every member's run is written.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from torch import Tensor

from relpos_lab.api.files import atomic_write, atomic_write_with
from relpos_lab.records.rundir import run_directory


@dataclass
class StackState:
    """A stack between two steps: everything its next step and its members' runs depend on."""

    step: int  # updates taken
    members: list[str]  # run directory names, in the stack's order
    optimizer: dict[str, Tensor]  # flat, exp_avg, exp_avg_sq, active, stopped_at: (K, ...) each
    records: list  # MemberRecord per member
    streams: list[dict]  # MemberStream.state_dict() per member
    rng: dict[str, Tensor]  # torch's generators (CPU, and CUDA where there is one)

    def rows(self, names: list[str]) -> StackState:
        """This state for `names` (all members of it), in that order."""
        index = [self.members.index(name) for name in names]
        return StackState(self.step, list(names), {k: v[index] for k, v in self.optimizer.items()},
                          [self.records[i] for i in index], [self.streams[i] for i in index], self.rng)


class StackCheckpoint:
    """The checkpoint files of one stack (`cfgs`, its members' configs)."""

    def __init__(self, cfgs: list[DictConfig]):
        self.members = [run_directory(cfg).name for cfg in cfgs]
        self.directory = run_directory(cfgs[0]).parent / "stacks"
        key = hashlib.sha256("\n".join(self.members).encode()).hexdigest()[:12]
        self.path = self.directory / f"stack-{key}.pt"

    def save(self, state: StackState) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        atomic_write_with(self.path, lambda f: torch.save(state, f))
        atomic_write(self.path.with_suffix(".json"),
                     json.dumps({"members": state.members, "step": state.step}, indent=1) + "\n")

    def find(self) -> StackState | None:
        """The newest saved state holding every member of this stack (None: it starts at step 0)."""
        best: tuple[int, Path] | None = None
        for index in self.directory.glob("stack-*.json"):
            try:
                saved = json.loads(index.read_text())
            except (OSError, ValueError):
                continue
            if set(self.members) <= set(saved["members"]) and (best is None or saved["step"] > best[0]):
                best = (saved["step"], index.with_suffix(".pt"))
        if best is None or not best[1].is_file():
            return None
        state: StackState = torch.load(best[1], map_location="cpu", weights_only=False)
        return state.rows(self.members)

    def remove(self) -> None:
        """Once this stack's members' runs are written (or failed, each with its run directory to
        resume alone): every file whose members all have one now, this stack's among them."""
        for index in self.directory.glob("stack-*.json"):
            try:
                members = json.loads(index.read_text())["members"]
            except (OSError, ValueError):
                continue
            if set(members) & set(self.members) and all((self.directory.parent / m).is_dir() for m in members):
                index.with_suffix(".pt").unlink(missing_ok=True)
                index.unlink(missing_ok=True)


def rng_state() -> dict[str, Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Tensor]) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
