"""Deprecated since 0.2.0, removed in 0.3.0: the pre-0.2 path of the model (see CHANGELOG.md).

The Transformer now lives in `relpos_lab.core.transformer`, the loss in `relpos_lab.core.loss`
(`LossOutput` and `label_smoothed_loss` are also in `relpos_lab.api`).
"""
import warnings

from relpos_lab.core.loss import LossOutput, label_smoothed_loss
from relpos_lab.core.transformer import (
    MODEL_IMPLS,
    Decoder,
    DecoderCache,
    DecoderLayer,
    DecoderLM,
    Embedding,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    FeedForward,
    ModelConfig,
    MultiHeadAttention,
    Sublayer,
)

__all__ = [
    "MODEL_IMPLS", "Decoder", "DecoderCache", "DecoderLM", "DecoderLayer", "Embedding", "Encoder", "EncoderDecoder",
    "EncoderLayer", "FeedForward", "LossOutput", "ModelConfig", "MultiHeadAttention", "Sublayer",
    "label_smoothed_loss",
]

warnings.warn("relpos_lab.transformer is deprecated; import the model from relpos_lab.core.transformer, "
              "LossOutput and label_smoothed_loss from relpos_lab.api (see CHANGELOG.md)",
              DeprecationWarning, stacklevel=2)
