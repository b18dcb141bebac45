"""A trained checkpoint from a script: `load_model` and what it returns, `LoadedModel`.

`load_model` is the api layer's one entry point into the layers above it (tests/test_layout.py
names it): a checkpoint's config is resolved by the config layer and its weights loaded by the
training layer, exactly as `relpos-lab translate` / `generate` load them
(`training/inference.load_for_inference`). They are imported inside the function, so importing
`relpos_lab.api` still loads neither the config layer nor Lightning.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from relpos_lab.api.task import Task

if TYPE_CHECKING:
    from omegaconf import DictConfig


class LoadedModel(NamedTuple):
    """What `load_model` returns; unpack it (`model, config, task = load_model(path)`) or read its fields.

    model: the trained core model (`EncoderDecoder`, `PrefixLM`, `DecoderLM` or a plugin task's own
        `nn.Module`), in eval mode, on the device asked for.
    config: the run's resolved experiment config (an OmegaConf `DictConfig`: `config.model`,
        `config.task`, `config.seed`, ...) as saved in the checkpoint, with the overrides on top.
    task: the task that trained it (vocabularies, `encode_input`, `decode`, `evaluate`), with its
        saved state (a subword model, say) restored: it needs neither the training data nor the run
        directory.
    """

    model: nn.Module
    config: DictConfig
    task: Task


def load_model(checkpoint: str | Path, overrides: Sequence[str] = (),
               device: str | torch.device = "cpu") -> LoadedModel:
    """The model a `relpos-lab train` checkpoint holds, with its config and task: a `LoadedModel`.

    checkpoint: a .ckpt file written by `relpos-lab train` (runs/<name>/<run>/checkpoints/last.ckpt,
        best-step=N.ckpt, a requeue's hpc_ckpt_N.ckpt).
    overrides: dot-list overrides of the checkpoint's config, as on the command line
        (``["decoding.beam_size=1", "task.test_lengths=[1,40]"]``); they may change lengths, sizes
        and decoding, not the model's shape.
    device: where the model's weights go.

    The model is in eval mode (no dropout) and its evaluation position draws (randomize_at_eval)
    restart from the run's seed, so it gives the outputs the run's own evaluation gave. Gradients
    stay on: wrap scoring in `torch.no_grad()`.

    A missing file, one torch cannot read, one that is not a relpos-lab checkpoint, or overrides that
    change the model's shape raise `UserError` with a one-line message naming the fix.
    """
    # The api layer's one upward import (tests/test_layout.py, LAZY_UPWARD): inside the function.
    from relpos_lab.training.inference import load_for_inference

    return load_for_inference(checkpoint, overrides, device)
