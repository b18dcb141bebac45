"""Using a trained checkpoint on new text: what `relpos-lab translate` runs.

A checkpoint rebuilds its task — with the task's saved state, such as its subword model — and its
model, so translating needs neither the training corpus nor the run directory. Each input line
is encoded by the task (`Task.encode_input`), lines are batched by length (the same token batches
as training, so a long file does not pad every sentence to its longest one), decoded with the
task's decoding settings (`Task.decode`: beam search with the checkpoint's beam size and length
penalty unless overridden), and returned in input order as text (`Task.decode_output`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import SequentialSampler

from relpos_lab.api.task import Task
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.checkpoints import load_checkpoint, task_from_checkpoint
from relpos_lab.training.module import RelposModule


def load_for_inference(checkpoint: str | Path, overrides: Sequence[str] = (),
                       device: str | torch.device = "cpu") -> tuple[Task, nn.Module]:
    """The task and the trained model (in eval mode, on `device`) of a checkpoint."""
    cfg, task = task_from_checkpoint(checkpoint, list(overrides))
    module = RelposModule(cfg, task)
    module.load_state_dict(load_checkpoint(Path(checkpoint))["state_dict"])
    return task, module.model.to(device).eval()


@torch.no_grad()
def translate(task: Task, model: nn.Module, lines: Sequence[str], max_tokens: int = 4096) -> list[str]:
    """The model's output for each line, in input order; an empty line gives an empty output."""
    device = next(model.parameters()).device
    sources = [task.encode_input(line) if line.strip() else None for line in lines]
    todo = [i for i, s in enumerate(sources) if s is not None and len(s) > 0]
    outputs = [""] * len(lines)
    sizes = [len(sources[i]) for i in todo]
    batches = TokenBatchSampler(SequentialSampler(todo), sizes, max_tokens, even=False)
    for batch in batches:
        rows = [todo[j] for j in batch]
        inputs = {key: value.to(device) for key, value in task.input_batch([sources[i] for i in rows]).items()}
        hyps = task.decode(model, inputs)
        for i, hyp in zip(rows, hyps.cpu()):
            outputs[i] = task.decode_output(hyp)
    return outputs
