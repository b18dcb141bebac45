"""A model's shape and choices (`model.*`), validated before anything is built: every family
(transformer.py, prefix_lm.py, encoder_only.py) is built from one ModelConfig."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from relpos_lab.core.init import INITS
from relpos_lab.core.positions import (
    PositionConfig,
    PositionScheme,
    RelativePositions,
    ShawConfig,
    contract,
    position_scheme_of,
)

ARCHITECTURES = ("encoder_decoder", "decoder_only", "encoder_only")
"""encoder_decoder: EncoderDecoder; decoder_only: PrefixLM (prefix_lm.py), `source <sep> target` as one
sequence; encoder_only: EncoderOnly (encoder_only.py), `source <slot>…` read at the slots in one pass."""

MODEL_IMPLS = ("naive", "batched", "gather", "flex", "triton", "auto")
"""The attention impls a whole model can run on: every one of its attention calls (self-attention
with a KV cache, cross-attention) must be supported. 'banded' is self-attention only."""


@dataclass
class ModelConfig:
    architecture: str = "encoder_decoder"
    """encoder_decoder | decoder_only (a prefix LM over `source <sep> target <eos>`; n_encoder_layers is ignored) |
    encoder_only (the source then one blank slot per output token, Delétang et al.; n_decoder_layers is ignored)"""
    bidirectional_prefix: bool = False
    """decoder_only: the source attends to all of itself (a prefix LM); false: causal throughout"""
    src_vocab_size: int = 0
    """0: filled in from the task's vocabulary"""
    tgt_vocab_size: int = 0
    """0: filled in from the task's vocabulary"""
    d_model: int = 512
    """width of embeddings and residual stream"""
    n_heads: int = 8
    """attention heads per layer; must divide d_model"""
    d_ff: int = 2048
    """hidden width of the feed-forward sublayer"""
    n_encoder_layers: int = 6
    """encoder layers (encoder_decoder, encoder_only)"""
    n_decoder_layers: int = 6
    """decoder layers (encoder_decoder, decoder_only)"""
    dropout: float = 0.1
    """dropout on embeddings, sublayer outputs and the feed-forward hidden layer"""
    attention_dropout: float = 0.1
    """dropout on attention probabilities (triton draws it inside its kernel; flex and banded have none)"""
    embedding_dropout: float | None = None
    """dropout on the embeddings (tokens plus absolute positions); None: model.dropout (the reference code drops
    them with sin/cos positions only: 0 for the other schemes)"""
    ffn_dropout: float | None = None
    """dropout on the feed-forward hidden layer; None: model.dropout (DeepMind's reference code has none: 0)"""
    attention_bias: bool = True
    """biases in the query, key, value and output projections (the reference code's have none: false)"""
    output_bias: bool = False
    """a bias in the projection onto the target vocabulary (the reference code's head has one: true)"""
    init: str = "pytorch"
    """pytorch | haiku: how the Transformer's own weights start; haiku: as the reference code's (linear weights a
    normal cut at ±2σ, σ = 1/√fan_in, zero biases; token embeddings σ = 0.02; see core/init.py)"""
    norm_first: bool = False
    """False: post-LN as in the paper; True: pre-LN"""
    tie_embeddings: bool = True
    """decoder input embedding == output projection (encoder_only's projection has no input twin)"""
    share_src_tgt_embeddings: bool = False
    """one embedding table for source and target (equal vocabularies)"""
    pad_id: int = 0
    """token id of padding"""
    attention_impl: str = "auto"
    """the `impl` every attention call of the model passes to relative_attention: naive | batched | gather | flex |
    triton | auto (the fastest exact one for the call)"""
    positions: PositionConfig = field(default_factory=ShawConfig)
    """the position scheme (`relpos-lab positions` lists them) and that scheme's own fields"""

    def validate(self) -> None:
        """Raise ValueError naming the impossible setting and the fix: one check per concern."""
        self._check_shape()
        self._check_choices()
        self.positions.validate()
        position_scheme = position_scheme_of(self.positions)
        self._check_scheme_fits(position_scheme)
        self._check_randomized(position_scheme)
        if getattr(self.positions, "count_from_end", False) and self.architecture != "encoder_only":
            raise ValueError(f"model.positions.count_from_end needs each sequence whole, and model.architecture="
                             f"{self.architecture} decodes one token at a time; use model.architecture=encoder_only "
                             "or drop count_from_end")

    def _check_shape(self) -> None:
        """Widths, depths and rates a model can have."""
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
                f"pick n_heads from {[h for h in range(1, 33) if self.d_model % h == 0]}"
            )
        for name in ("d_model", "n_heads", "d_ff", "n_decoder_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.n_encoder_layers < 0:
            raise ValueError(f"model.n_encoder_layers must be >= 0, got {self.n_encoder_layers}")
        for name in ("dropout", "attention_dropout", "embedding_dropout", "ffn_dropout"):
            if getattr(self, name) is not None and not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")

    def _check_choices(self) -> None:
        """The named choices (init, architecture, attention impl) and the ones they rule out."""
        if self.init not in INITS:
            raise ValueError(f"model.init={self.init!r}; choose one of {', '.join(INITS)}")
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"model.architecture={self.architecture!r}; choose one of {', '.join(ARCHITECTURES)}")
        if self.bidirectional_prefix and self.architecture != "decoder_only":
            raise ValueError("model.bidirectional_prefix=true needs model.architecture=decoder_only "
                             "(an encoder already sees its whole source)")
        if self.attention_impl not in MODEL_IMPLS:
            raise ValueError(
                f"model.attention_impl={self.attention_impl!r}; choose one of {', '.join(MODEL_IMPLS)}"
                + (" ('banded' handles encoder self-attention only, without dropout: compare it with "
                   "`relpos-lab bench attention --impl gather banded`)" if self.attention_impl == "banded" else ""))
        if self.attention_impl == "flex" and self.attention_dropout > 0:
            raise ValueError(f"model.attention_impl='flex' has no attention dropout; set model.attention_dropout=0 "
                             f"(now {self.attention_dropout}) or use attention_impl=gather")
        if self.share_src_tgt_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("model.share_src_tgt_embeddings needs equal source and target vocabularies")

    def _check_scheme_fits(self, position_scheme: PositionScheme) -> None:
        """The scheme takes this model's shape and its layers' directions."""
        if not position_scheme.supports_bidirectional and False in self.self_attention_causal:
            setting, layers = (("model.bidirectional_prefix=true", "every decoder layer, whose source attends to all "
                                "of itself,") if self.bidirectional_prefix else
                               (f"model.architecture={self.architecture}", "the encoder's layers"))
            raise ValueError(f"{contract.scheme_label(self.positions)} is causal-only (supports_bidirectional = "
                             f"False), and {setting} builds {layers} with bidirectional self-attention; use "
                             "model.architecture=decoder_only with model.bidirectional_prefix=false, or another scheme")
        position_scheme.check(self.d_model, self.n_heads)
        contract.check_scheme(position_scheme, self.d_model, self.n_heads, self.self_attention_causal)

    def _check_randomized(self, position_scheme: PositionScheme) -> None:
        """Randomized positions (max_random_len) and the options that need them."""
        randomized = self.positions.max_random_len
        if randomized is not None:
            if randomized < 1:
                raise ValueError(f"model.positions.max_random_len={randomized} must be >= 1 (None: off)")
            if position_scheme.contributes_nothing:
                raise ValueError(f"model.positions.max_random_len randomizes positions, and scheme "
                                 f"'{self.positions.scheme}' has none; drop it or pick a scheme with positions")
            if position_scheme.positions_from_content:
                raise ValueError(f"model.positions.max_random_len randomizes token indices, and scheme "
                                 f"'{self.positions.scheme}' counts its positions from the tokens alone, so it would "
                                 "change nothing; drop it")
        if self.positions.redraw_per_layer and (randomized is None or self.architecture != "encoder_only"):
            raise ValueError("model.positions.redraw_per_layer=true draws each encoder layer's positions: it needs "
                             "model.positions.max_random_len and model.architecture=encoder_only (now "
                             f"max_random_len={randomized}, architecture={self.architecture})")
        if self.positions.random_distances:
            self._check_random_distances(position_scheme)
        if self.positions.randomize_at_eval and randomized is None:
            raise ValueError("model.positions.randomize_at_eval=true draws evaluation positions from "
                             "[0, max_random_len): set model.positions.max_random_len too (e.g. 256, above the "
                             "longest evaluated sequence), or drop randomize_at_eval")

    def _check_random_distances(self, position_scheme: PositionScheme) -> None:
        randomized = self.positions.max_random_len
        if randomized is None or self.architecture != "encoder_only" or self.positions.redraw_per_layer:
            raise ValueError("model.positions.random_distances=true draws each encoder layer's distances: it "
                             "needs model.positions.max_random_len and model.architecture=encoder_only, and "
                             f"replaces redraw_per_layer (now max_random_len={randomized}, architecture="
                             f"{self.architecture}, redraw_per_layer={self.positions.redraw_per_layer})")
        with torch.random.fork_rng(devices=[]):  # a model built from this config draws its weights as before
            module = position_scheme.attention(self.head_dim, self.n_heads, causal=False)
        if type(module).attention_kwargs_at_distances is RelativePositions.attention_kwargs_at_distances:
            raise ValueError(f"model.positions.random_distances=true: scheme '{self.positions.scheme}' cannot "
                             "place its offsets at other distances (attention_kwargs_at_distances); use alibi or "
                             "transformer_xl, or randomized positions alone (drop random_distances)")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def self_attention_causal(self) -> tuple[bool, ...]:
        """The `causal` flags this model's self-attention layers are built with (what the position
        scheme's `attention(head_dim, n_heads, causal)` is asked for): encoder_decoder (False, True),
        a bidirectional encoder and a causal decoder; encoder_only (False,); decoder_only (True,), or
        (False,) with bidirectional_prefix, where every decoder layer is built to see its whole source."""
        if self.architecture == "encoder_only":
            return (False,)
        if self.architecture != "decoder_only":
            return (False, True)
        return (False,) if self.bidirectional_prefix else (True,)
