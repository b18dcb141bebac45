"""Shaw, Uszkoreit & Vaswani (2018): learned edge vectors a^K, a^V per clipped relative distance."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from relpos_lab.core.positions.absolute import SinusoidalEmbedding
from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


@dataclass
class ShawConfig(PositionConfig):
    scheme: str = "shaw"
    """shaw: relation-aware self-attention (Shaw et al., 2018)"""
    max_distance: int = 16
    """Shaw's clipping distance k: 2k+1 labels"""
    max_distance_left: int | None = None
    """clip j - i below at -left instead of -k (asymmetric clipping, as fairseq2 offers); None: k"""
    max_distance_right: int | None = None
    """clip j - i above at +right instead of +k; None: k"""
    use_keys: bool = True
    """a^K (the paper's ablation switches these off)"""
    use_values: bool = True
    """a^V"""
    per_head: bool = False
    """the paper shares tables across heads"""
    add_sinusoids: bool = False
    """Shaw on top of absolute sinusoids"""

    @property
    def left(self) -> int:
        return self.max_distance if self.max_distance_left is None else self.max_distance_left

    @property
    def right(self) -> int:
        return self.max_distance if self.max_distance_right is None else self.max_distance_right

    def validate(self) -> None:
        for name in ("max_distance", "max_distance_left", "max_distance_right"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"model.positions.{name}={value} must be >= 0: it is the clipping distance k "
                                 "(the paper uses 16; 0 ignores relative positions)")


class ShawPositions(RelativePositions):
    """w^K and w^V: one learned vector per clipped distance clip(j - i, -left, right), shared across
    heads unless per_head. Symmetric clipping (the paper) is the 2k+1-row table the attention takes
    directly; asymmetric clipping is spread onto that label space, k = max(left, right), by index."""

    def __init__(self, cfg: ShawConfig, head_dim: int, n_heads: int):
        super().__init__()
        self.max_distance, self.left = max(cfg.left, cfg.right), cfg.left
        rows = cfg.left + cfg.right + 1
        shape = ((n_heads,) if cfg.per_head else ()) + (rows, head_dim)
        self.rel_k = nn.Parameter(torch.randn(shape) * head_dim**-0.5) if cfg.use_keys else None
        self.rel_v = nn.Parameter(torch.randn(shape) * head_dim**-0.5) if cfg.use_values else None
        symmetric = cfg.left == cfg.right
        labels = torch.arange(-self.max_distance, self.max_distance + 1).clamp(-cfg.left, cfg.right) + cfg.left
        self.register_buffer("labels", None if symmetric else labels, persistent=False)

    def _table(self, table):
        if table is None or self.labels is None:
            return table
        return table.index_select(-2, self.labels)

    def attention_kwargs(self, q, k, query_offset):
        return {"rel_k": self._table(self.rel_k), "rel_v": self._table(self.rel_v), "max_distance": self.max_distance}

    def draw(self, max_offset):
        """Per table: the norm of w_d by offset d (one line per head with per-head tables), and the
        cosine similarity between offsets (mean over heads): rows that learned the same vector are
        offsets the model does not tell apart, whatever k allows."""
        drawings = {}
        for name, table in (("key", self.rel_k), ("value", self.rel_v)):
            if table is None:
                continue
            w = table.detach().float()
            rows = w.shape[-2]
            offsets = torch.arange(rows) - self.left  # row r is offset r - left
            norms = w.norm(dim=-1)
            unit = torch.nn.functional.normalize(w, dim=-1)
            cosine = unit @ unit.transpose(-1, -2)
            tag = "K" if name == "key" else "V"
            shared = norms.dim() == 1
            drawings[f"{name}_norm"] = Drawing(
                "curves", norms[None] if shared else norms, offsets, f"‖w^{tag}_d‖ (L2 norm)",
                xlabel="offset d = clip(j − i) (tokens)", line_label="shared by all heads" if shared else "head",
                title=f"a^{tag} table: norm of w^{tag}_d per offset")
            drawings[f"{name}_cosine"] = Drawing(
                "matrix", cosine if shared else cosine.mean(0), offsets, f"cos(w^{tag}_d, w^{tag}_d′)",
                xlabel="offset d (tokens)", title=f"a^{tag} table: cosine between offsets"
                + ("" if shared else " (mean over heads)"))
        return drawings


class Shaw(PositionScheme):
    """Relation-aware self-attention: learned a^K, a^V per clipped distance (Shaw et al., 2018)."""

    config_class = ShawConfig

    def embedding(self, d_model):
        return SinusoidalEmbedding(d_model) if self.cfg.add_sinusoids else None

    def attention(self, head_dim, n_heads, causal):
        return ShawPositions(self.cfg, head_dim, n_heads)
