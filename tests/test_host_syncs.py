"""A training step waits on nothing: its forward, loss and backward read no device tensor back to the
host (`.item()`, `int(t)`, `if t.any():`, `.tolist()`), so an accelerator's queue never drains
mid-step. Checked on the meta device, whose tensors hold no values: any such read raises there, as
`torch.cuda.set_sync_debug_mode("error")` makes it raise on a GPU (tests/test_cuda.py runs that).
The batch is the task's own collate, which counts what the step needs (encoder-only slots) on the host.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from relpos_lab.api import registry
from relpos_lab.api.testing import tiny_model_config
from relpos_lab.core.positions import BUILTIN, builtin_config, position_scheme_of

ARCHITECTURES = ("encoder_decoder", "decoder_only", "encoder_only")


def _task():
    cls = registry.get_task_class("reverse")
    cfg = cls.config_class(name="reverse", train_lengths=[1, 6], valid_lengths=[1, 6], test_lengths=[1, 8],
                           train_size=32, eval_size_per_length=2)
    return cls(cfg, seed=0)


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("scheme", BUILTIN)
def test_a_training_step_reads_nothing_back_from_the_device(scheme, architecture):
    cfg = tiny_model_config(builtin_config(scheme), architecture, vocab=0, dropout=0.1, attention_dropout=0.1)
    if False in cfg.self_attention_causal and not position_scheme_of(cfg.positions).supports_bidirectional:
        pytest.skip(f"{scheme} is causal-only")
    task = _task()
    model = task.build_model(dataclasses.replace(cfg, src_vocab_size=0, tgt_vocab_size=0)).train()
    batch = task.collate(task.dataset("train")[:8])
    model.to("meta")
    batch = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    out = task.loss(model, batch, label_smoothing=0.1)
    out.loss.backward()
    assert out.loss.device.type == "meta"
