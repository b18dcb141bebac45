"""The RoPE family: q and k rotated by their absolute positions, so scores see only j − i.

RoPE (Su et al., 2021) rotates pair t of a head, dims (t, t + D/2), by the angle n·θ_t at position
n, θ_t = base^(−2t/D), t = 0..D/2−1. Its options here:

- p-RoPE (Barbero et al., 2024, "Round and Round We Go!"): `rope_fraction` p keeps the highest
  ⌊p·D/2⌋ frequencies and sets the others (the lowest) to θ = 0, pairs left unrotated; p = 1 is
  RoPE, p = 0 NoPE. (Kept frequencies keep RoPE's values base^(−2t/D); the count's rounding is
  ours — unverified against the authors' code.)
- Scaling at evaluation (`rope_scaling`), for contexts longer than the training one, L = rope_train_length:
  linear = position interpolation (Chen et al., 2023) θ'_t = θ_t / s; ntk = "NTK-aware" scaling
  (bloc97, 2023) base' = base · s^(D/(D−2)); yarn = YaRN (Peng et al., 2023) as its authors' code
  (jquesnelle/yarn, scaled_rope/LlamaYaRNScaledRotaryEmbedding.py) and Hugging Face transformers'
  `yarn` rope (modeling_rope_utils._compute_yarn_parameters) compute it: the pair whose θ turns r
  times over the training context is t(r) = D·ln(L/(2π·r)) / (2·ln base); the correction range is
  low = max(⌊t(β_fast)⌋, 0), high = min(⌈t(β_slow)⌉, D − 1); the ramp γ_t = clamp((t − low)/(high − low),
  0, 1) is linear in the pair index t (high − low = 0 counts as 0.001, as there), and
  θ'_t = γ_t·θ_t/s + (1 − γ_t)·θ_t: pairs up to low keep θ_t, pairs from high on are interpolated.
  q and k are each multiplied by √(1/t) = 0.1·ln s + 1 (the logits by (0.1·ln s + 1)², §3.4 with the
  authors' errata). The paper's text (§3.2, "NTK-by-parts") writes the ramp linear in the rotation
  count r_t = L·θ_t/2π instead (linear in base^(−2t/D), not in t); its models were extended with
  the code, and we know no implementation of the r-linear ramp, so it is not offered (at D = 64,
  L = 64, s = 4 the two differ by up to 129% in θ'_t: pair 0 weighs θ_0 (against θ_0/s) 1 in the code,
  0.296 in r). As in the code, a training context of L ≤ 2π·β_slow·base^(−2/D) positions
  (4.7 at D = 64 with the defaults) puts high below low, and every pair then keeps θ_t.

  When it applies: only in evaluation mode (module.eval(): validation, test, decoding), in a call
  whose positions reach beyond the training context (offset + Lq > rope_train_length); then with
  s = rope_scaling_factor, or when that is 0 with s = (offset + Lq) / rope_train_length (YaRN's
  "dynamic scaling", §3.3). Training, and evaluation within the training length, are plain RoPE.
  With a KV cache a key keeps the rotation of the call that added it, so cached decoding equals a
  full pass when every call uses the same frequencies: always without scaling, and with a fixed
  factor once the prefill already reaches beyond rope_train_length; dynamic scaling changes s at
  every step (the paper notes the cache would then have to hold keys before rotation).

xPos (Sun et al., 2023, "A Length-Extrapolatable Transformer") is RoPE with an exponential decay:
q at position n is multiplied per pair by ζ_t^(n/γ), k at m by ζ_t^(−m/γ), ζ_t = (t/(D/2) + γ̂)/(1 + γ̂),
so a score carries ζ_t^((n−m)/γ) ≤ 1 for keys behind the query. The paper defines it for causal
attention; a key ahead (m > n) would be amplified without bound, so bidirectional attention
(encoders, a bidirectional prefix) gets the rotation alone, plain RoPE — our choice, not the paper's.
The blockwise-causal attention the paper evaluates with is not part of xPos here. The scales are
exponentials of absolute positions: float32 holds them up to ~70·γ positions (ζ_0^(−n/γ) < 3e38;
36,000 at γ = 512)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from relpos_lab.core.positions.base import Drawing, PositionConfig, PositionScheme, RelativePositions

SCALINGS = ("none", "linear", "ntk", "yarn")


@dataclass
class RopeConfig(PositionConfig):
    scheme: str = "rope"
    """rope: rotary position embeddings (Su et al., 2021)"""
    rope_base: float = 10000.0
    """base of the rotation frequencies"""
    rope_fraction: float = 1.0
    """p-RoPE (Barbero et al., 2024): the fraction of frequencies kept, the highest; the lowest
    are set to 0 (unrotated). 1: RoPE, 0: no rotation at all"""
    rope_scaling: str = "none"
    """none | linear (position interpolation) | ntk (NTK-aware base) | yarn: frequency scaling applied
    only in evaluation, to calls reaching beyond rope_train_length positions"""
    rope_scaling_factor: float = 0.0
    """the scale s of rope_scaling; 0: dynamic, s = (positions in the call) / rope_train_length"""
    rope_train_length: int = 0
    """the training context length L that rope_scaling extends (the lm task's task.train_length)"""
    yarn_beta_fast: float = 32.0
    """yarn: pairs below the one turning this many times over L (rounded down) keep θ (YaRN's β)"""
    yarn_beta_slow: float = 1.0
    """yarn: pairs from the one turning this many times over L (rounded up) are interpolated, θ/s (YaRN's α)"""

    def validate(self) -> None:
        if self.rope_base <= 1:
            raise ValueError(f"model.positions.rope_base={self.rope_base} must be > 1")
        if not 0.0 <= self.rope_fraction <= 1.0:
            raise ValueError(f"model.positions.rope_fraction={self.rope_fraction} must be in [0, 1] "
                             "(1: RoPE, 0.75: p-RoPE's usual choice)")
        if self.rope_scaling not in SCALINGS:
            raise ValueError(f"model.positions.rope_scaling={self.rope_scaling!r}; choose one of {', '.join(SCALINGS)}")
        if self.rope_scaling != "none" and self.rope_train_length < 1:
            raise ValueError(f"model.positions.rope_scaling={self.rope_scaling} needs "
                             "model.positions.rope_train_length "
                             "(the training context length, e.g. the lm task's train_length), "
                             f"got {self.rope_train_length}")
        if self.rope_scaling_factor != 0 and self.rope_scaling_factor < 1:
            raise ValueError(f"model.positions.rope_scaling_factor={self.rope_scaling_factor} must be >= 1 "
                             "(0: dynamic)")
        if not 0 < self.yarn_beta_slow < self.yarn_beta_fast:
            raise ValueError(f"model.positions.yarn_beta_slow={self.yarn_beta_slow} and yarn_beta_fast="
                             f"{self.yarn_beta_fast} must satisfy 0 < beta_slow < beta_fast (YaRN: 1 and 32)")


def rope_frequencies(head_dim: int, base: float, fraction: float = 1.0) -> Tensor:
    """θ_t = base^(−2t/D) for the D/2 pairs, float64; p-RoPE zeroes all but the ⌊p·D/2⌋ highest."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    theta[math.floor(fraction * (head_dim // 2) + 1e-9):] = 0.0  # 1e-9: 0.29 · 100 is 28.999…
    return theta


def scaled_frequencies(theta: Tensor, head_dim: int, base: float, cfg: RopeConfig, s: float) -> tuple[Tensor, float]:
    """The evaluation frequencies θ'_t of rope_scaling at scale s, and the factor on q and k."""
    if cfg.rope_scaling == "linear":
        return theta / s, 1.0
    if cfg.rope_scaling == "ntk":
        ntk = ((base * s ** (head_dim / (head_dim - 2)))
               ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        return torch.where(theta > 0, ntk, theta), 1.0  # p-RoPE's unrotated pairs stay unrotated
    ramp = yarn_ramp(head_dim, base, cfg.rope_train_length, cfg.yarn_beta_fast, cfg.yarn_beta_slow)
    return ramp * theta / s + (1 - ramp) * theta, 0.1 * math.log(s) + 1.0


def yarn_ramp(head_dim: int, base: float, train_length: int, beta_fast: float, beta_slow: float) -> Tensor:
    """YaRN's γ_t per pair (D/2,), float64: 0 (θ_t kept) below the pair that turns beta_fast times over
    the training context, rounded down, 1 (θ_t/s) from the one that turns beta_slow times, rounded up,
    linear in t between (the module docstring; the authors' code and Hugging Face's `yarn`)."""
    def pair_turning(rotations: float) -> float:
        return head_dim * math.log(train_length / (2 * math.pi * rotations)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
    t = torch.arange(head_dim // 2, dtype=torch.float64)
    return ((t - low) / ((high - low) or 0.001)).clamp(0, 1)


def apply_rotation(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate pair t = dims (t, t + D/2) of x (…, L, D) by angles (L, D/2)."""
    cos, sin = angles.cos().repeat(1, 2).to(x.dtype), angles.sin().repeat(1, 2).to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class RotaryPositions(RelativePositions):
    """Rotate q and k by their absolute positions; dot products then depend on j - i only."""

    def __init__(self, head_dim: int, base: float, cfg: RopeConfig | None = None):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"rope needs an even head dimension, got d_model/n_heads={head_dim}")
        self.cfg = cfg or RopeConfig(rope_base=base)
        self.head_dim, self.base = head_dim, base
        self.register_buffer("theta", rope_frequencies(head_dim, base, self.cfg.rope_fraction), persistent=False)

    def scale(self, length: int) -> float | None:
        """The scale s of rope_scaling for a call whose positions end at `length`; None: plain RoPE."""
        cfg = self.cfg
        if cfg.rope_scaling == "none" or self.training or length <= cfg.rope_train_length:
            return None
        return cfg.rope_scaling_factor or length / cfg.rope_train_length

    def frequencies(self, length: int) -> tuple[Tensor, float]:
        """θ (D/2,) float64 and the factor on q and k, for a call whose positions end at `length`."""
        s = self.scale(length)
        if s is None:
            return self.theta, 1.0
        return scaled_frequencies(self.theta, self.head_dim, self.base, self.cfg, s)

    def _rotate_at(self, x: Tensor, offset: int, theta: Tensor | None = None) -> Tensor:
        """x (…, L, D) at positions offset.. rotated by θ (default: the training frequencies)."""
        theta = (self.theta if theta is None else theta).double()  # float64 even in a model cast to half
        pos = torch.arange(offset, offset + x.shape[-2], device=theta.device, dtype=torch.float64)
        return apply_rotation(x, pos[:, None] * theta[None, :])  # float64 angles: exact at long positions

    def rotate(self, q, k, offset):
        # New keys sit at the same absolute positions as the new queries; cached keys were
        # rotated when they were new.
        theta, factor = self.frequencies(offset + q.shape[-2])
        q, k = self._rotate_at(q, offset, theta), self._rotate_at(k, offset, theta)
        return (q, k) if factor == 1.0 else (q * factor, k * factor)

    def draw(self, max_offset):
        """The score a query and key of equal unit pairs get by offset, mean_t cos((j − i)·θ_t)
        (RoPE's long-term decay; p-RoPE's unrotated pairs add a constant), in training and, with
        rope_scaling, in evaluation at 4× the training length (times YaRN's factor²)."""
        d = torch.arange(-max_offset, max_offset + 1, dtype=torch.float64)
        ylabel = "score of equal unit q, k: mean_t cos((j − i)·θ_t)"
        drawn = {"score": Drawing("curves", (d[:, None] * self.theta).cos().mean(-1)[None].float(), d.long(), ylabel,
                                  line_label="training", title="RoPE score by offset")}
        if self.cfg.rope_scaling != "none":
            length = 4 * self.cfg.rope_train_length
            was = self.training
            self.eval()
            theta, factor = self.frequencies(length)
            self.train(was)
            score = factor ** 2 * (d[:, None] * theta).cos().mean(-1)
            drawn["score_scaled"] = Drawing("curves", score[None].float(), d.long(), ylabel,
                                            line_label=f"evaluation at {length}",
                                            title=f"RoPE score by offset, {self.cfg.rope_scaling} scaling at {length}")
        return drawn


class Rope(PositionScheme):
    """Rotary position embeddings: q and k rotated by position (Su et al., 2021); p-RoPE, PI/NTK/YaRN scaling."""

    config_class = RopeConfig

    @property
    def reads_width(self) -> bool:
        """rope_scaling switches on, and sizes its factor, from the positions a call holds."""
        return self.cfg.rope_scaling != "none"

    def attention(self, head_dim, n_heads, causal):
        return RotaryPositions(head_dim, self.cfg.rope_base, self.cfg)

    def check(self, d_model, n_heads):
        if (d_model // n_heads) % 2:
            raise ValueError(f"rope needs an even head dimension; d_model/n_heads = {d_model // n_heads}")
        if self.cfg.rope_scaling == "ntk" and d_model // n_heads < 4:
            raise ValueError("rope_scaling=ntk needs a head dimension >= 4 (base · s^(D/(D−2)))")


@dataclass
class XposConfig(PositionConfig):
    scheme: str = "xpos"
    """xpos: RoPE with an exponential decay by distance (Sun et al., 2023)"""
    rope_base: float = 10000.0
    """base of the rotation frequencies"""
    xpos_gamma_hat: float = 0.4
    """γ̂ of ζ_t = (t/(D/2) + γ̂)/(1 + γ̂); the strongest decay, ζ_0 = γ̂/(1 + γ̂), is on the
    highest-frequency pair (paper: 0.4)"""
    xpos_scale_base: float = 512.0
    """γ: positions are divided by it in the exponent, ζ^(n/γ) (paper: 512)"""

    def validate(self) -> None:
        if self.rope_base <= 1:
            raise ValueError(f"model.positions.rope_base={self.rope_base} must be > 1")
        if self.xpos_gamma_hat <= 0 or self.xpos_scale_base <= 0:
            raise ValueError(f"model.positions.xpos_gamma_hat={self.xpos_gamma_hat} and xpos_scale_base="
                             f"{self.xpos_scale_base} must be > 0 (the paper's: 0.4 and 512)")


class XposPositions(RotaryPositions):
    """RoPE's rotation with q·ζ^(n/γ) and k·ζ^(−m/γ) in causal attention; rotation alone in bidirectional."""

    def __init__(self, head_dim: int, cfg: XposConfig, causal: bool):
        super().__init__(head_dim, cfg.rope_base)
        self.causal, self.scale_base = causal, cfg.xpos_scale_base
        t = torch.arange(head_dim // 2, dtype=torch.float64)
        self.register_buffer("zeta", (t / (head_dim / 2) + cfg.xpos_gamma_hat) / (1 + cfg.xpos_gamma_hat),
                             persistent=False)

    def rotate(self, q, k, offset):
        q, k = super().rotate(q, k, offset)
        if not self.causal:
            return q, k
        pos = torch.arange(offset, offset + q.shape[-2], device=q.device, dtype=torch.float64)
        decay = self.zeta.double()[None, :] ** (pos[:, None] / self.scale_base)  # (L, D/2)
        decay = decay.repeat(1, 2)
        return q * decay.to(q.dtype), k * decay.reciprocal().to(k.dtype)

    def draw(self, max_offset):
        """The score of equal unit pairs by offset, mean_t ζ_t^(−(j − i)/γ)·cos((j − i)·θ_t), keys
        behind the query (causal; the rotation alone in bidirectional attention), and ζ_t^(d/γ) per
        pair at d = max_offset."""
        d = torch.arange(-max_offset, 1, dtype=torch.float64)
        rope = (d[:, None] * self.theta).cos()
        decay = self.zeta[None, :] ** (-d[:, None] / self.scale_base) if self.causal else torch.ones_like(rope)
        pairs = torch.arange(len(self.zeta))
        return {"score": Drawing("curves", (decay * rope).mean(-1)[None].float(), d.long(),
                                 "score of equal unit q, k", line_label="xPos" if self.causal else "rotation alone",
                                 title="xPos score by offset (causal)" if self.causal else
                                 "xPos in bidirectional attention: the rotation alone"),
                "decay": Drawing("bars", (self.zeta ** (max_offset / self.scale_base)).float(), pairs,
                                 f"ζ_t^({max_offset}/γ)", xlabel="rotation pair t (high → low frequency)",
                                 title=f"xPos decay per pair at distance {max_offset}")}


class Xpos(PositionScheme):
    """xPos: RoPE with an exponential decay by distance in causal attention (Sun et al., 2023)."""

    config_class = XposConfig

    def attention(self, head_dim, n_heads, causal):
        return XposPositions(head_dim, self.cfg, causal)

    def check(self, d_model, n_heads):
        if (d_model // n_heads) % 2:
            raise ValueError(f"xpos needs an even head dimension; d_model/n_heads = {d_model // n_heads}")
