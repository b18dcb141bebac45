"""Transformer-XL (Dai et al., 2019): content and position terms with global biases u and v.

    e_ij = [ (q_i + u)·k_j + (q_i + v)·(W_R R_{i-j}) ] / sqrt(D)

R_{i-j} is the sinusoidal encoding of the distance i - j (query position minus key position; with
a cache i = query_offset + r), W_R a learned d_model -> d_model projection split into heads, u and
v learned per head (H, D). relative_attention computes q·k/sqrt(D); the rest is its `attn_bias`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions


@dataclass
class TransformerXLConfig(PositionConfig):
    scheme: str = "transformer_xl"
    """transformer_xl: sinusoidal relative encodings projected by W_R, biases u, v (Dai et al., 2019)"""

    noisy_lookup: str = "distance"
    """with random_distances: "distance", R at the distance each offset stands for; "clamped", R where
    Ruoss et al.'s code reads it (compute_attention_with_noisy_relative_encodings): their table holds
    positions 0..max_random_len − 1 only, so a key at drawn distance d left of the query reads
    position max_random_len − d, and the query itself and every key to its right read past the
    table's end, which JAX clamps to its last row"""

    def validate(self) -> None:
        if self.noisy_lookup not in ("distance", "clamped"):
            raise ValueError(f"model.positions.noisy_lookup={self.noisy_lookup!r}: set it to distance or clamped")
        if self.noisy_lookup == "clamped" and not self.random_distances:
            raise ValueError("model.positions.noisy_lookup=clamped reads drawn distances: set "
                             "model.positions.random_distances=true (with max_random_len), or noisy_lookup=distance")


class TransformerXLPositions(RelativePositions):
    """W_R, u and v of one layer (the paper's released code may share u, v across layers; here each
    layer has its own). No memory segments: the KV cache plays that part in decoding."""

    def __init__(self, head_dim: int, n_heads: int, clamped_at: int | None = None):
        super().__init__()
        d_model = head_dim * n_heads
        self.d_model = d_model
        self.clamped_at = clamped_at  # noisy_lookup=clamped: max_random_len, where the reference's table ends
        self.r_proj = nn.Linear(d_model, d_model, bias=False)  # W_R (the paper's code has no bias)
        self.u = nn.Parameter(torch.randn(n_heads, head_dim) * 0.02)
        self.v = nn.Parameter(torch.randn(n_heads, head_dim) * 0.02)

    def encoding(self, distance: Tensor) -> Tensor:
        """R: [sin(d·ω), cos(d·ω)] concatenated (as in the paper's code), ω_t = 10000^(-2t/d_model)."""
        inv_freq = 10000.0 ** (-torch.arange(0, self.d_model, 2, device=distance.device, dtype=distance.dtype)
                               / self.d_model)  # in the dtype of q: float64 tests are exact
        angles = distance[..., None] * inv_freq
        return torch.cat((angles.sin(), angles.cos()), dim=-1)

    def attention_kwargs(self, q, k, query_offset):
        lq, lk = q.shape[-2], k.shape[-2]
        # The Lq + Lk - 1 distinct distances i - j, largest first: index m holds offset + lq - 1 - m.
        return self._bias(q, k, torch.arange(query_offset + lq - 1, query_offset - lk, -1, device=q.device))

    def attention_kwargs_at_distances(self, q, k, distances):
        """Ruoss et al.'s noisy relative encodings: R at the distance each offset stands for. The
        distances are odd in the offset (the left ones the right ones' negatives), so i − j stands
        for −d(j − i): largest first, that is `distances` reversed. With noisy_lookup=clamped, a
        distance d > 0 (a key on the left) is read at d − M and every other at 1 − M (M =
        max_random_len): the reference's rows M − d and M − 1 (its R(p) is ours at −p, the sign a
        relabelling of W_R's sine columns)."""
        distance = distances.flip(-1).to(q.device)  # (2L − 1,), or (B, 2L − 1): each row its own
        if self.clamped_at is not None:
            distance = torch.where(distance > 0, distance - self.clamped_at, 1 - self.clamped_at)
        return self._bias(q, k, distance)

    def _bias(self, q: Tensor, k: Tensor, distance: Tensor) -> dict:
        """attn_bias for the Lq + Lk - 1 distances i - j of the query rows and keys, largest first."""
        b, h, lq, d = q.shape
        lk = k.shape[-2]
        r = self.r_proj(self.encoding(distance.to(q.dtype)))  # ([B,] Lq+Lk-1, d_model): per row if distance is
        r = r.view(*r.shape[:-1], h, d).transpose(-3, -2)  # ([B,] H, Lq+Lk-1, D)
        position = (q + self.v[:, None, :]) @ r.transpose(-1, -2)  # (B, H, Lq, Lq+Lk-1)
        # The exact relative shift: row r, key j has distance offset + r - j, at index lq - 1 - r + j.
        rows, keys = torch.arange(lq, device=q.device), torch.arange(lk, device=q.device)
        index = (lq - 1 - rows)[:, None] + keys[None, :]
        position = position.gather(-1, index.expand(b, h, lq, lk))
        content_bias = torch.einsum("hd,bhjd->bhj", self.u, k)[:, :, None, :]  # u·k_j
        return {"attn_bias": (content_bias + position) / math.sqrt(d)}

    def attention_kwargs_at(self, q, k, positions):
        """The same bias for tokens at `positions`, in O(L·d_model) memory: with a_i = (q_i + v)·W_R
        split into its sine and cosine halves, a_i·R(p_i − p_j) = Σ_t (a^s sin p_iω + a^c cos p_iω)
        cos p_jω + (a^c sin p_iω − a^s cos p_iω) sin p_jω, one matmul of L × d_model factors
        (sin(x − y) and cos(x − y) expanded), where the table over every distance of the spread
        slots was (B, H, P, 2P − 1)."""
        b, h, length, d = q.shape
        pos = positions.to(q.dtype)
        inv_freq = 10000.0 ** (-torch.arange(0, self.d_model, 2, device=q.device, dtype=q.dtype) / self.d_model)
        angles = pos[:, None] * inv_freq[None, :]  # (L, d_model / 2)
        sin, cos = angles.sin(), angles.cos()
        w = self.r_proj.weight.view(h, d, self.d_model)  # head h's rows of W_R
        a_sin, a_cos = torch.einsum("bhld,hde->bhle", q + self.v[:, None, :], w).chunk(2, dim=-1)
        left = torch.cat((a_sin * sin + a_cos * cos, a_cos * sin - a_sin * cos), dim=-1)  # (B, H, L, d_model)
        position = left @ torch.cat((cos, sin), dim=-1).transpose(0, 1)  # (B, H, L, L)
        content_bias = torch.einsum("hd,bhjd->bhj", self.u, k)[:, :, None, :]  # u·k_j
        return {"attn_bias": (content_bias + position) / math.sqrt(d)}

    def draw(self, max_offset):
        """The content-free part of the bias, v·W_R R_{i-j} / √D (q = 0, k = 0), per head: what
        the layer adds for distance alone."""
        n_heads, head_dim = self.u.shape
        like = dict(dtype=self.u.dtype, device=self.u.device)  # a float64 model draws too
        q, k = (torch.zeros(1, n_heads, 1, head_dim, **like),
                torch.zeros(1, n_heads, 2 * max_offset + 1, head_dim, **like))
        with torch.no_grad():
            bias = self.attention_kwargs(q, k, max_offset)["attn_bias"]
        return {"bias": Drawing("curves", bias.reshape(n_heads, -1).float(), torch.arange(-max_offset, max_offset + 1),
                                "v·W_R R_(i−j) / √D",
                                title="Transformer-XL position bias per head (content-free part)")}


class TransformerXL(PositionScheme):
    """Transformer-XL relative attention: projected sinusoidal R_{i-j}, biases u, v (Dai et al., 2019)."""

    config_class = TransformerXLConfig

    def attention(self, head_dim, n_heads, causal):
        clamped = self.cfg.noisy_lookup == "clamped"
        return TransformerXLPositions(head_dim, n_heads, self.cfg.max_random_len if clamped else None)

    def check(self, d_model, n_heads):
        if d_model % 2:
            raise ValueError(f"transformer_xl needs an even model.d_model for its sin/cos encoding; got {d_model}")
