"""Dropout at evaluation, as the reference code evaluates.

DeepMind's reference code (neural_networks_chomsky_hierarchy, randomized_positional_encodings)
applies its model in range evaluation with a fresh random key, so every `hk.dropout` of the model
is active at test time: the papers' numbers were measured with dropout on. `dropout_at_eval(model,
True)` turns on every dropout of a model in evaluation mode and nothing else: randomized positions,
RoPE scaling and the rest still behave as at evaluation. The trainer seeds the masks
(training/module.py), so a rerun gives the same number; they depend on how the batches are cut, as
the reference's do.
"""
from __future__ import annotations

from torch import nn


def dropout_at_eval(model: nn.Module, active: bool) -> None:
    """Every nn.Dropout of `model` on (`active`) or as the module's mode says, and attention
    dropout likewise (MultiHeadAttention reads `dropout_at_eval`)."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.train(active or module.training)
        if hasattr(module, "dropout_at_eval"):
            module.dropout_at_eval = active
