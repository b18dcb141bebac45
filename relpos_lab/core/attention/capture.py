"""Attention probabilities by relative offset, collected only while a probe is active (inspect).

`relative_attention` reads `ACTIVE` once per call: None (training, evaluation) costs one global
read and leaves every result bit-identical. While a probe is active, the call computes its
probabilities with `gather.probabilities` — the very function `gather` (the CPU default) trains
with, and equal to every other implementation's (tested) — and hands them to the probe. The fused
kernels (sdpa, flex, banded) never build the (Lq, Lk) probabilities, so inspecting them costs this
one extra pass; the call's own output is untouched either way.

The probe keeps sums, not tensors: per attention site (`where`, set by the caller, e.g.
("encoder_self", 0)) the probability mass at each offset j − i summed over real query rows
(`query_mask`, set by the caller; padded rows are excluded), the number of such rows, and the full
map of the longest example seen. The mean over rows is the curve over all offsets. With Shaw
tables the mass by *clipped* offset is also kept, from `gather.sum_by_label`, the 2k+1 label sums
gather uses for its value term (it equals the full curve folded at ±k; tested).

A probe made with `keep_content=True` also keeps, per site, the arguments of the first
`content_bias` call it is shown (`observe_content`, called by the attention layer of a
content-dependent scheme while a probe is active), so that the scheme can draw what it adds on that
batch (`RelativePositions.draw_content`).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from relpos_lab.core.attention.gather import sum_by_label

ACTIVE: AttentionProbe | None = None
"""The probe `relative_attention` reports to; None outside `capturing`."""


class AttentionProbe:
    """Sums of attention mass by relative offset, per attention site and head."""

    def __init__(self, keep_content: bool = False):
        self.where: object = None  # the site now running, set by the caller (hooks) before each call
        self.query_mask: Tensor | None = None  # (B, Lq) bool, True at real query rows; None: all real
        self.key_mask: Tensor | None = None  # (B, Lk) bool, True at real keys (crops the example map)
        self.mass: dict = {}  # where -> (H, 2W+1) float64: summed mass at offsets -W..W
        self.rows: dict = {}  # where -> real query rows summed
        self.clipped: dict = {}  # where -> (H, 2k+1) float64: summed mass by clipped offset
        self.example: dict = {}  # where -> (H, Lq, Lk) float32: the longest example's probabilities (the first of them)
        self.keep_content = keep_content
        self.content: dict = {}  # where -> (q, k, x, query_offset, visible): the first content_bias call's arguments

    def observe(self, p: Tensor, query_offset: int, max_distance: int) -> None:
        """Add one call's probabilities p (B, H, Lq, Lk); query row r sits at query_offset + r."""
        b, h, lq, lk = p.shape
        p = p.detach().to(torch.float64)
        rows = torch.ones(b, lq, dtype=torch.bool, device=p.device) if self.query_mask is None else \
            self.query_mask[:, -lq:].to(p.device)
        # Offsets do not depend on the example: sum the real rows over the batch first, so the
        # offset sums need (H, Lq, Lq+Lk) memory, not B times that.
        pooled = (p * rows.to(p.dtype)[:, None, :, None]).sum(0, keepdim=True)  # (1, H, Lq, Lk)
        first = query_offset + lq - 1  # offsets run from -first to lk - 1
        index = torch.arange(lk, device=p.device)[None, :] - torch.arange(lq, device=p.device)[:, None] + lq - 1
        by_offset = p.new_zeros(1, h, lq, lq + lk - 1).scatter_add_(-1, index.expand(1, h, lq, lk), pooled)
        self._add_mass(by_offset.sum((0, 2)).cpu(), -first)  # column c: offset c - first
        self.rows[self.where] = self.rows.get(self.where, 0) + int(rows.sum())
        if max_distance > 0:
            labels = sum_by_label(pooled, max_distance, query_offset).sum((0, 2)).cpu()
            self.clipped[self.where] = self.clipped.get(self.where, 0) + labels
        longest = int(rows.sum(1).argmax())
        if self.where not in self.example or self.example[self.where].shape[-2] < int(rows[longest].sum()):
            keys = lk if self.key_mask is None else int(self.key_mask[longest].sum())
            self.example[self.where] = p[longest, :, rows[longest], :keys].to(torch.float32).cpu()

    def observe_content(self, q: Tensor, k: Tensor, x: Tensor, query_offset: int, visible: Tensor | None) -> None:
        """Keep the site's first `content_bias` arguments (with `keep_content`); `visible` then
        also hides the rows of padding queries (`query_mask`), so it allows the pairs to count."""
        if not self.keep_content or self.where in self.content:
            return
        if self.query_mask is not None:
            rows = self.query_mask[:, None, -q.shape[-2]:, None].to(q.device)  # (B, 1, Lq, 1)
            visible = rows if visible is None else visible & rows
        self.content[self.where] = (q.detach(), k.detach(), x.detach(), query_offset, visible)

    def _add_mass(self, summed: Tensor, lowest: int) -> None:
        """Add `summed` (H, n), whose column c is offset lowest + c, into the site's -W..W array."""
        old = self.mass.get(self.where)
        width = max(-lowest, lowest + summed.shape[-1] - 1, 0 if old is None else (old.shape[-1] - 1) // 2)
        grown = summed.new_zeros(summed.shape[0], 2 * width + 1)
        if old is not None:
            ow = (old.shape[-1] - 1) // 2
            grown[:, width - ow: width + ow + 1] += old
        grown[:, width + lowest: width + lowest + summed.shape[-1]] += summed
        self.mass[self.where] = grown

    def mean_by_offset(self, where) -> tuple[list[int], Tensor]:
        """(offsets, (H, len(offsets)) mean mass per real query row) of one site."""
        mass = self.mass[where]
        width = (mass.shape[-1] - 1) // 2
        return list(range(-width, width + 1)), mass / max(self.rows[where], 1)

    def mean_by_clipped_offset(self, where) -> Tensor | None:
        """(H, 2k+1) mean mass by clipped offset -k..k (Shaw sites), else None."""
        if where not in self.clipped:
            return None
        return self.clipped[where] / max(self.rows[where], 1)


@contextmanager
def capturing(probe: AttentionProbe):
    """Make `probe` the one every `relative_attention` call reports to, for the block; a compiled
    model runs eagerly meanwhile (the probe's bookkeeping reads tensors on the host)."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("an attention probe is already capturing; they do not nest")
    ACTIVE = probe
    try:
        with torch.compiler.set_stance("force_eager"):
            yield probe
    finally:
        ACTIVE = None
