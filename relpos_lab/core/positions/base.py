"""What a position scheme is: a config dataclass with only its own fields, and a class that says
where the scheme contributes.

A scheme may add a module to the token embeddings (absolute positions), and a module to each
self-attention layer that rotates q and k (RoPE), returns keyword arguments for
`relative_attention` (Shaw's tables, a score bias), and/or computes a content-dependent score bias
from the layer's q, k and input (`content_bias`: CoPE's gated counts, FoX's forget gates, DAPE's
MLP over the logits). Every
per-layer module takes the absolute position of the first query row (and `attention_kwargs` and
`content_bias` the q and k attention will see), which is what keeps cached decoding and
multi-token prefill exact; what `content_bias` must remember about cached keys it keeps in a
`KeyState`, which the KV cache carries.

A per-layer module may also draw itself (`RelativePositions.draw`): what it learned as a function
of distance, which `relpos-lab inspect` plots beside the attention it measured; a content-dependent
one also what it adds on a sample batch (`RelativePositions.draw_content`, by default its
content_bias's mean and spread by offset).

contract.py checks both when a model is built and on the modules' first call: a scheme that
contributes nothing without declaring it, or a hook that returns what `relative_attention` does not
take, is a one-line error naming the scheme.

Third-party schemes subclass `PositionScheme` and `PositionConfig` and register the scheme class
under the ``relpos_lab.positions`` entry-point group, exactly as the built-in ones do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from relpos_lab.core.attention.masks import relative_labels


@dataclass
class Drawing:
    """One panel of what a scheme learned, for `relpos-lab inspect`.

    kind "curves": `values` (lines, len(x)), one line per row (a head, or "all heads"), against x,
    each with a band ±`spread` (lines, len(x)) around it where given (e.g. a standard deviation);
    kind "matrix": `values` (len(x), len(x)) over x × x (e.g. cosine similarity between offsets);
    kind "bars": `values` (n,) at x (e.g. ALiBi's slope per head). `x` holds relative offsets
    j − i (or head numbers for bars); `xlabel`, `ylabel` name them with their units.
    """

    kind: str
    values: Tensor
    x: Tensor
    ylabel: str
    xlabel: str = "relative offset j − i (key − query, tokens)"
    line_label: str = "head"
    title: str = ""  # the panel's title; default: its name in the dict `draw` returns
    spread: Tensor | None = None  # "curves": the half-width of each line's band, as `values`

    @classmethod
    def by_offset(cls, values: Tensor, visible: Tensor | None, query_offset: int, max_offset: int, ylabel: str,
                  **fields) -> Drawing:
        """Curves of `values` (B, H, Lq, Lk), one per head: their mean over the pairs `visible`
        counts (bool, broadcastable to it; None: all) at each offset j − i, with the standard
        deviation as the band, at the offsets within ±max_offset that hold a counted pair for
        every head. Query row r sits at query_offset + r, key j at j, as in `content_bias`."""
        values = values.detach().to(torch.float64)
        counted = torch.ones((), dtype=torch.bool, device=values.device) if visible is None else visible.bool()
        shape = torch.broadcast_shapes(values.shape, counted.shape, (1, 1, 1, 1))  # (B, H, Lq, Lk)
        lq, lk = shape[-2:]
        max_distance = query_offset + lq + lk  # no pair is further apart: every offset keeps its own label
        labels = relative_labels(lq, lk, max_distance, query_offset, values.device)
        labels = labels.expand(shape).reshape(*shape[:-2], -1)
        weight = counted.expand(shape).reshape(labels.shape).to(torch.float64)
        values = values.expand(shape).reshape(labels.shape) * weight

        def per_offset(t: Tensor) -> Tensor:  # (…, H, Lq·Lk) -> (H, 2·max_distance+1), summed over the batch
            sums = t.new_zeros(*t.shape[:-1], 2 * max_distance + 1).scatter_add_(-1, labels, t)
            return sums.reshape(-1, *sums.shape[-2:]).sum(0)

        n, total, squares = per_offset(weight), per_offset(values), per_offset(values * values)
        offsets = torch.arange(-max_distance, max_distance + 1, device=values.device)
        keep = (n > 0).all(0) & (offsets.abs() <= max_offset)
        n = n[:, keep]
        mean = total[:, keep] / n
        spread = (squares[:, keep] / n - mean * mean).clamp_min(0).sqrt()
        return cls("curves", mean.float().cpu(), offsets[keep].cpu(), ylabel, spread=spread.float().cpu(), **fields)


@dataclass
class PositionConfig:
    """Base of every scheme's config: `scheme` names it; a scheme's own fields go in a subclass."""

    scheme: str = "shaw"
    """the position scheme: a name `relpos-lab positions` lists"""

    max_random_len: int | None = None
    """randomized positions (Ruoss et al., 2023): in training, an ordered random subset of
    [0, max_random_len) instead of 0..L-1; None: off"""

    randomize_at_eval: bool = False
    """with max_random_len: draw the positions at evaluation and decoding too, as Ruoss et al.'s
    code does (reproducibly, from the run's seed); false: evaluate at 0..L-1"""

    redraw_per_layer: bool = False
    """with max_random_len, model.architecture=encoder_only: each encoder layer draws its own positions, as
    Ruoss et al.'s code draws them anew in each attention layer; false: one draw per forward pass, shared"""

    random_distances: bool = False
    """with max_random_len, model.architecture=encoder_only, for ALiBi and Transformer-XL: each encoder layer
    draws the distances its offsets stand for instead of positions, as Ruoss et al.'s code does for those two:
    offsets 1..L-1 to the right take an increasing random subset of [1, max_random_len), those to the left
    their negatives"""

    scheme_class: ClassVar[type[PositionScheme] | None] = None  # set when a scheme claims the class

    def validate(self) -> None:
        """Raise ValueError naming a bad field (as model.positions.<field>) and the fix."""

    def with_vocabulary(self, symbols: list[str]) -> PositionConfig:
        """The config to build with, once the task's symbols (by id) are known: a scheme that reads
        token ids learns here which ids it looks for (digits.py: the digits'). This one by default."""
        return self


@dataclass
class KeyState:
    """What a content-dependent scheme remembers per key, (B, H, Lk, ...) beside the KV cache's
    keys, so that a cached step computes what the full pass computes. Without a cache the core
    hands `content_bias` an empty one, so the module's code is the same either way.

    Two kinds of state, one entry per key either way:

    - appended per key: a key's entry is fixed once the key is seen (FoX: the cumulative log forget
      gate c_j). `append(new)` adds the new positions' entries after the cached ones.
    - rewritten per key: every key's entry changes as queries arrive (a running sum over the
      queries so far, F_j = Σ_{t ≤ i} S_tj, as selective attention keeps). `replace(new)` sets the
      entry of every key, cached and new.

    Read the state through `value` (None while empty) and write it only through `append` or
    `replace`: the cache hands the module the same KeyState on every step, but a module must not
    rely on that by assigning `value` itself. Beam search's `reorder` keeps the chosen rows of
    either kind, as it does the keys. The KV cache has no truncation; a state rewritten per key
    could not be cut back to fewer keys anyway (its sums include the later queries)."""

    value: Tensor | None = None

    def append(self, new: Tensor) -> Tensor:
        """Add the new positions' state (B, H, Lq, ...); returns the state of every key."""
        self.value = new if self.value is None else torch.cat((self.value, new), dim=2)
        return self.value

    def replace(self, new: Tensor) -> Tensor:
        """Set the state of every key, (B, H, Lk, ...): the cached keys' entries (rewritten) and the
        new positions' after them; returns it. For a state that changes per key as queries arrive."""
        if not isinstance(new, Tensor):
            raise TypeError(f"KeyState.replace takes the state of every key as a tensor (B, H, Lk, ...), "
                            f"got {type(new).__name__}")
        if self.value is not None and (new.shape[:2] != self.value.shape[:2] or new.shape[2] < self.value.shape[2]
                                       or new.shape[3:] != self.value.shape[3:]):
            raise ValueError(f"KeyState.replace got a state of shape {tuple(new.shape)}; it holds "
                             f"{tuple(self.value.shape)}, so expected (B, H, Lk, ...) with the same B, H and "
                             f"trailing dimensions and Lk >= {self.value.shape[2]} (every cached key, then the new)")
        self.value = new
        return new

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index`, as the keys do (either kind of state)."""
        if self.value is not None:
            self.value = self.value.index_select(0, index)


class RelativePositions(nn.Module):
    """A scheme's part in one self-attention layer; this base leaves attention as it is."""

    def rotate(self, q: Tensor, k: Tensor, offset: int) -> tuple[Tensor, Tensor]:
        """q and k (B, H, L, D) of the new positions, which start at absolute position `offset`."""
        return q, k

    def attention_kwargs(self, q: Tensor, k: Tensor, query_offset: int) -> dict:
        """What the scheme adds to `relative_attention` (rel_k/rel_v/rel_bias/max_distance, attn_bias).

        q (B, H, Lq, D) and k (B, H, Lk, D) are what attention will see (after `rotate`; k with
        the cached keys); query row r sits at absolute position query_offset + r, key j at j.
        Most schemes need only their shapes; a bias may depend on them (Transformer-XL)."""
        return {}

    def attention_kwargs_at(self, q: Tensor, k: Tensor, positions: Tensor) -> dict | None:
        """Optional, for randomized positions: `attention_kwargs` for the L tokens of q and k
        (B, H, L, D) at `positions` (L,), increasing, without spreading them over the
        positions[-1] + 1 slots first (a dense bias over every slot is O(max_random_len²) a layer).
        None (this default): the layer spreads them and calls `rotate` and `attention_kwargs`.
        A scheme that defines it must leave `rotate` as the identity."""
        return None

    def attention_kwargs_at_distances(self, q: Tensor, k: Tensor, distances: Tensor) -> dict | None:
        """Optional, for `random_distances`: `attention_kwargs` for self-attention over L tokens at
        0..L-1 whose offsets j - i stand for other distances: `distances` (2L - 1,), increasing, the
        distance of offset j - i at index j - i + L - 1 (0 at the middle); in training (B, 2L - 1),
        each row of a padded batch its own (Embedding.random_distances_of). None (this default): the
        scheme cannot, and a config asking for it is refused."""
        return None

    def content_bias(self, q: Tensor, k: Tensor, x: Tensor, query_offset: int, visible: Tensor | None,
                     state: KeyState) -> Tensor:
        """A score bias that depends on the tokens, (B, H, Lq, Lk) (or broadcastable to it), added
        to the scaled logits q·k/√D (as `attn_bias`).

        q (B, H, Lq, D), k (B, H, Lk, D): what attention will see (k with the cached keys; query
        row r at absolute position query_offset + r). x (B, Lq, d_model): the layer's input at the
        new positions, for the module's own projections (FoX's forget gate). visible: bool,
        broadcastable to (B, H, Lq, Lk), True where query r may see key j (masks and causality
        combined), or None for all. state: what the module keeps per key across cached steps
        (`KeyState.append` the new positions' part; empty without a cache). Only modules that
        override it are called, on the eager path; its cost is the module's own (FoX: O(B·H·Lq·Lk);
        CoPE: one more q·k, O(B·H·Lq·Lk·D), like attention's own; DAPE: that and an MLP per pair),
        and a dense bias keeps the call off the fused kernel."""
        raise NotImplementedError

    def draw(self, max_offset: int) -> dict[str, Drawing]:
        """Optional: what this layer's module learned, by name, over offsets -max_offset..max_offset
        (e.g. {"bias": Drawing("curves", bias per head, offsets, "score bias")}); {} draws nothing."""
        return {}

    def draw_content(self, q: Tensor, k: Tensor, x: Tensor, query_offset: int, visible: Tensor | None,
                     max_offset: int) -> dict[str, Drawing]:
        """Optional, for a module with a `content_bias`: what it adds on a sample batch, by name,
        over offsets -max_offset..max_offset. `relpos-lab inspect` calls it once per layer (only on
        modules that override `content_bias`), without gradients, with the arguments `content_bias`
        got in the forward pass over one batch of the longest examples it measures (a full pass: no
        cache, so no state here); `visible` also hides the rows of padding queries, so the pairs it
        allows are the ones to count.

        By default: the bias itself, its mean and standard deviation per head at each offset
        (`Drawing.by_offset`). Override it to draw more of what the bias is made of (CoPE: its
        gated counts p_ij by offset), keeping super()'s panels."""
        bias = self.content_bias(q, k, x, query_offset, visible, KeyState())
        return {"content_bias": Drawing.by_offset(bias, visible, query_offset, max_offset,
                                                  "score bias added to the logit",
                                                  title="content bias on a sample batch: mean ± std per head")}


class PositionScheme:
    """A position scheme: `config_class` holds its fields; the methods build what it adds."""

    config_class: ClassVar[type[PositionConfig]] = PositionConfig
    supports_cache: ClassVar[bool] = True  # cached decoding and multi-token prefill equal a full pass
    supports_bidirectional: ClassVar[bool] = True
    """False declares a causal-only scheme: its `attention(..., causal=False)` is never called. A model
    with a bidirectional self-attention layer (model.architecture=encoder_decoder: the encoder's;
    model.bidirectional_prefix=true: every decoder layer) refuses it when its config is validated;
    decoder-only models without a bidirectional prefix (task lm, prefix LMs) use it."""
    positions_from_content: ClassVar[bool] = False
    """True declares a scheme whose positions are counted from the tokens alone (CoPE, FoX): token
    indices never reach it, so randomized positions (max_random_len) would change nothing and are
    refused."""
    reads_tokens: ClassVar[bool] = False
    """True declares a scheme whose embedding module is called as forward(x, offset, ids), where ids
    (B, offset + L) are the token ids of every position so far (the cached ones, then the new), since
    where a token sits may depend on its neighbours (a digit's place in its number, digits.py)."""
    reads_width: ClassVar[bool] = False
    """True declares a scheme whose arithmetic at evaluation reads how many positions a call holds
    (RoPE's dynamic scaling): a right-padded batch would then give a short row its longest
    neighbour's width. A stack with such a scheme evaluates each group of equal-length rows on its
    own, cut to that length (core/length_groups.py); the conformance kit's batch-invariance check
    names the first example of an undeclared one."""
    contributes_nothing: ClassVar[bool] = False
    """True declares a scheme that adds no positions on purpose (NoPE). Any other scheme whose
    embedding() and attention() give nothing (a misnamed hook) is refused when a model is built
    (contract.py), rather than training silently without positions."""

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        config = cls.__dict__.get("config_class")
        if config is not None:
            owner = config.__dict__.get("scheme_class")
            if owner is not None and owner is not cls:
                raise TypeError(f"{config.__name__} is already the config of {owner.__name__}; "
                                f"give {cls.__name__} its own config_class")
            config.scheme_class = cls

    def __init__(self, cfg: PositionConfig):
        self.cfg = cfg

    @classmethod
    def describe(cls) -> str:
        """One line for `relpos-lab positions`: the first line of the class docstring."""
        return (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""

    def embedding(self, d_model: int) -> nn.Module | None:
        """A module `x, offset -> x + positions` (`x, offset, ids` with `reads_tokens`), added to
        token embeddings; None: no absolute part."""
        return None

    def attention(self, head_dim: int, n_heads: int, causal: bool) -> RelativePositions | None:
        """The scheme's module for one self-attention layer; None: nothing relative.

        causal=True: the layer's queries see only keys at or before their own position (decoder
        layers); causal=False: they may also see later keys (encoder layers, and every layer of a
        decoder-only model with model.bidirectional_prefix=true, whose source attends to all of
        itself). A scheme that declares supports_bidirectional = False is only asked for causal=True."""
        return None

    def check(self, d_model: int, n_heads: int) -> None:
        """Raise ValueError for a model shape the scheme cannot use (e.g. RoPE needs an even head dim)."""


def position_scheme_of(cfg: PositionConfig) -> PositionScheme:
    """The PositionScheme of a config (the object that builds the scheme's modules; `cfg.scheme` is its
    name): an instance of the scheme class that claimed the config's class."""
    cls = type(cfg).scheme_class
    if cls is None:
        raise ValueError(f"{type(cfg).__name__} belongs to no position scheme; use a scheme's config class "
                         "(e.g. ShawConfig) or load the config through relpos_lab.config")
    return cls(cfg)
