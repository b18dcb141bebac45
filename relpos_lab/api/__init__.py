"""What plugin authors and scripts import: the Task contract, the sequence-to-sequence defaults,
evaluation, vocabularies, the loss, the position-scheme contract and the attention op its hooks
feed, the models with their config, decoding and its KV cache (`DecoderCache`), a trained
checkpoint's model, config and task (`load_model`), errors, and the file helper for caches.
`relpos_lab.api.registry` finds tasks and position schemes.

This is the stable surface: a name exported here keeps working for a release after it moves
(with a DeprecationWarning naming the new import), and CHANGELOG.md says how to migrate. Every
name README's examples import from relpos_lab is here (tests/test_api.py).

`load_model` and `LoadedModel` live with the checkpoint loader in the training layer
(training/inference.py). Every name here is imported when first asked for (`__getattr__`), so
importing `relpos_lab.api` or one of its modules (`relpos_lab.api.errors`, as the CLI does before
it knows what it will run) costs nothing: `from relpos_lab.api import Task` loads what Task needs,
`from relpos_lab.api import load_model` the config and training layers and Lightning. So the face
of the api sits above training (tests/test_layout.py), and the layers below import the api's
modules, not this face."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what tools see; at run time each name is imported on first use
    from relpos_lab.api.errors import ConfigError, ContractError, UserError
    from relpos_lab.api.evaluation import EvalResult, Evaluation
    from relpos_lab.api.files import atomic_write
    from relpos_lab.api.seq2seq import Pair, Seq2SeqTask
    from relpos_lab.api.task import Batch, DecodingConfig, Task, TaskConfig
    from relpos_lab.api.vocabulary import Vocabulary
    from relpos_lab.core.attention import relative_attention
    from relpos_lab.core.attention.masks import max_offset
    from relpos_lab.core.cache import DecoderCache
    from relpos_lab.core.decoding import beam_search, greedy_search, sample
    from relpos_lab.core.encoder_only import EncoderOnly
    from relpos_lab.core.loss import LossOutput, label_smoothed_loss
    from relpos_lab.core.positions import (
        Drawing,
        KeyState,
        PositionConfig,
        PositionScheme,
        RelativePositions,
        builtin_config,
    )
    from relpos_lab.core.prefix_lm import PrefixLM
    from relpos_lab.core.transformer import DecoderLM, EncoderDecoder, ModelConfig
    from relpos_lab.training.inference import LoadedModel, load_model

__all__ = [
    "Batch", "ConfigError", "ContractError", "DecoderCache", "DecoderLM", "DecodingConfig", "Drawing", "EncoderDecoder",
    "EncoderOnly", "EvalResult", "Evaluation", "KeyState", "LoadedModel", "LossOutput", "ModelConfig", "Pair",
    "PositionConfig", "PositionScheme", "PrefixLM", "RelativePositions", "Seq2SeqTask", "Task", "TaskConfig",
    "UserError", "Vocabulary",
    "atomic_write", "beam_search", "builtin_config", "greedy_search", "label_smoothed_loss", "load_model",
    "max_offset", "relative_attention", "sample",
]

HOMES = {
    "relpos_lab.api.errors": ("ConfigError", "ContractError", "UserError"),
    "relpos_lab.api.evaluation": ("EvalResult", "Evaluation"),
    "relpos_lab.api.files": ("atomic_write",),
    "relpos_lab.api.seq2seq": ("Pair", "Seq2SeqTask"),
    "relpos_lab.api.task": ("Batch", "DecodingConfig", "Task", "TaskConfig"),
    "relpos_lab.api.vocabulary": ("Vocabulary",),
    "relpos_lab.core.attention": ("relative_attention",),
    "relpos_lab.core.attention.masks": ("max_offset",),
    "relpos_lab.core.cache": ("DecoderCache",),
    "relpos_lab.core.decoding": ("beam_search", "greedy_search", "sample"),
    "relpos_lab.core.encoder_only": ("EncoderOnly",),
    "relpos_lab.core.loss": ("LossOutput", "label_smoothed_loss"),
    "relpos_lab.core.positions": ("Drawing", "KeyState", "PositionConfig", "PositionScheme", "RelativePositions",
                                  "builtin_config"),
    "relpos_lab.core.prefix_lm": ("PrefixLM",),
    "relpos_lab.core.transformer": ("DecoderLM", "EncoderDecoder", "ModelConfig"),
    "relpos_lab.training.inference": ("LoadedModel", "load_model"),
}
"""Where each exported name is defined: its module is imported when the name is first asked for."""
HOME = {name: module for module, names in HOMES.items() for name in names}


def __getattr__(name: str):
    if name not in HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(HOME[name]), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
