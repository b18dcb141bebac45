"""Digit positions for arithmetic: abacus embeddings and position coupling, counted from the tokens.

Both give each digit a learned embedding of where it sits in its number (a maximal run of digit
tokens), added to the token embedding, so that the digits to be added together look alike however
long the numbers are. Which tokens are digits comes from the task's vocabulary (`with_vocabulary`:
the symbols "0"-"9"); a digit's place from its neighbours, so the embedding module reads the token
ids of every position so far (`PositionScheme.reads_tokens`).

A digit's significance (0 = units) follows the direction the numbers are written in:

- before the separator (the source: an encoder's input, a prefix LM's prompt), numbers are written
  most significant digit first, so a digit's significance is its distance to the end of its run;
- from the separator on (the target, after its BOS, which is the prefix LM's separator), numbers
  are written least significant digit first (the addition task's `reversed_output`), so it is its
  index from the start of its run, known as soon as the digit is generated.

"123+4567" → significances 2 1 0 · 3 2 1 0 ("·" the "+", no digit); a target "<s> 0 9 6 4" → · 0 1 2 3.

With places by significance (position coupling, abacus with `order=significance`), cached
decoding equals the full pass when every number of the source arrives in one call (an encoder sees
its source whole; PrefixLM prefills its source in one call, and that is how both families decode),
since the first digit of a source number needs the number's end. Feeding the source itself token
by token (a plain DecoderLM stream) would place its digits differently, so they declare
supports_cache=False; the target side is causal and exact. Abacus's default `order=written` counts
from each number's first digit only, so it is exact however the tokens arrive.

Checked against the papers' code through the search tool (read, not copied):

- McLeish et al. (2024), "Transformers Can Do Arithmetic with the Right Embeddings", abacus.py of
  mcleish7/arithmetic (as quoted in several public copies): an nn.Embedding of max_seq_length=1024
  rows; a digit's index is 1 + its index from the start of its run (numbers reversed, "Integers
  must be reversed for this to work correctly"), non-digits 0; in training one k =
  random.randint(0, max_k) per forward pass (max_k 99 in the code; the paper says k up to 100) is
  added to every digit's index. `abacus` does that with `order=written`; `order=significance`
  counts places as above, which is what their reversed operands give, for this task's operands
  written most significant digit first.
- Cho et al. (2024), "Position Coupling", HanseulJo/position-coupling, src/data/addition.py
  (AdditionDatasetWithCoupledPositions) and configs/task/addition_coupled.yaml: learned absolute
  position embeddings whose ids are start + max_len - significance for digits (max_len: the longer
  operand's length), the token after each operand ("+", and the one closing the prompt) gets the
  id one past the units digit, and in training `start` is drawn per example so that the example's
  ids stay within max_position (evaluation: start 1). `position_coupling` mirrors the
  ids (start + 1 + significance, every non-digit token at `start`, the slot next to the units),
  which couples the same tokens, and draws the start per example the same way.

Not checked: the paper texts themselves (only their code and project pages were reachable), how
McLeish et al. place BOS/EOS, and whether Cho et al. give BOS/EOS the operator's id (we give every
non-digit token the same id); both papers zero-pad operands in some setups, our task does not.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from relpos_lab.core.positions.base import PositionConfig, PositionScheme

DIGIT_SYMBOLS = tuple(str(d) for d in range(10))
DEFAULT_DIGIT_IDS = tuple(range(4, 14))
"""Where relpos_lab.api.Vocabulary puts "0"-"9" when they are its first symbols (after its 4 specials)."""
SEPARATOR_ID = 1
"""The target's BOS in relpos_lab.api.Vocabulary, which a prefix LM puts between source and target."""


def digit_places(ids: Tensor, digits: Tensor, separator: int) -> tuple[Tensor, Tensor, Tensor]:
    """For token ids (B, L): whether each is a digit (bool), its index from the start of its run of
    digits (0 first), and its significance by the direction rule of the module docstring (both
    long, meaningless at non-digits); all (B, L)."""
    is_digit = (ids[..., None] == digits).any(-1)  # not torch.isin: vmap (a stack of runs) has no rule for it
    n = ids.shape[1]
    i = torch.arange(n, device=ids.device).expand_as(ids)
    before = torch.nn.functional.pad(is_digit[:, :-1], (1, 0))
    after = torch.nn.functional.pad(is_digit[:, 1:], (0, 1))
    start = torch.where(is_digit & ~before, i, 0).cummax(1).values
    end = torch.where(is_digit & ~after, i, n).flip(1).cummin(1).values.flip(1)
    from_start = i - start
    in_target = (ids == separator).cumsum(1) > 0
    return is_digit, from_start, torch.where(in_target, from_start, end - i)


@dataclass
class DigitRunsConfig(PositionConfig):
    """The fields of a scheme that places digits by their runs: which ids are digits, and the separator."""

    digit_ids: list[int] | None = None
    """token ids of the digits; None: the task's symbols "0"-"9", filled in when the task builds the
    model (a model built without a task: 4-13, where relpos_lab.api.Vocabulary puts "0"-"9" first)"""
    separator_id: int = SEPARATOR_ID
    """the token from which numbers are written least significant digit first (the target's BOS)"""

    @property
    def counts_significance(self) -> bool:
        """Whether target digits are placed by significance, so the target must be written least
        significant digit first (a task refuses the scheme otherwise: addition's reversed_output)."""
        return True

    def with_vocabulary(self, symbols: list[str]) -> DigitRunsConfig:
        if self.digit_ids is not None:
            return self
        missing = [d for d in DIGIT_SYMBOLS if d not in symbols]
        if missing:
            raise ValueError(f"model.positions.scheme={self.scheme} places digits, and the task's vocabulary has no "
                             f"symbol {missing[0]!r}; use it with a task of decimal numbers (addition) or set "
                             "model.positions.digit_ids")
        return replace(self, digit_ids=[symbols.index(d) for d in DIGIT_SYMBOLS])

    def validate(self) -> None:
        if self.digit_ids is not None and (not self.digit_ids or any(i < 0 for i in self.digit_ids)):
            raise ValueError(f"model.positions.digit_ids={self.digit_ids} must be token ids (>= 0), "
                             "or None for the task's '0'-'9'")


class DigitRunsScheme(PositionScheme):
    """Base of the schemes of this module: they read token ids and need the digits' ids."""

    reads_tokens = True
    positions_from_content = True
    supports_cache = False  # exact when each source number arrives in one call (module docstring)

    def digits(self) -> Tensor:
        ids = DEFAULT_DIGIT_IDS if self.cfg.digit_ids is None else self.cfg.digit_ids
        return torch.tensor(ids, dtype=torch.long)


class DigitEmbedding(nn.Module):
    """A learned table indexed by each token's digit place (`index`); forward(x, offset, ids) adds
    the rows of the new positions (ids: every position's token so far, the last x.shape[1] new)."""

    def __init__(self, d_model: int, rows: int, digits: Tensor, separator: int, size_field: str):
        super().__init__()
        self.embedding = nn.Embedding(rows, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)
        self.register_buffer("digits", digits, persistent=False)
        self.separator, self.size_field = separator, size_field

    def index(self, ids: Tensor) -> Tensor:
        raise NotImplementedError

    def forward(self, x: Tensor, offset: int, ids: Tensor) -> Tensor:
        if ids.shape[1] != offset + x.shape[1]:
            raise ValueError(f"{type(self).__name__} needs the ids of every position so far: got {ids.shape[1]} "
                             f"ids for {offset} cached and {x.shape[1]} new positions")
        index = self.index(ids)[:, offset:]
        rows, advice = self.embedding.num_embeddings, "raise it (numbers longer than in training need it)"
        if getattr(self, "stacked", False):  # a stack of runs (core/stack.py): vmap batches no assert
            pass
        elif index.numel() and (torch.compiler.is_compiling() or index.device.type != "cpu"):
            # No host sync: an accelerator's queue (or a compiled graph) checks it asynchronously.
            torch._assert_async(index.max() < rows, f"a digit's place id reaches beyond "
                                f"model.positions.{self.size_field}={rows}; {advice}")
        elif index.numel() and (top := int(index.max())) >= rows:
            raise ValueError(f"a digit reaches place id {top}, beyond model.positions.{self.size_field}={rows}; "
                             f"{advice}")
        return x + self.embedding(index).to(x.dtype)


# --- abacus -------------------------------------------------------------------------------------


ABACUS_ORDERS = ("written", "significance")


@dataclass
class AbacusConfig(DigitRunsConfig):
    scheme: str = "abacus"
    """abacus: a learned embedding of each digit's place in its number (McLeish et al., 2024)"""
    order: str = "written"
    """written: a digit's index from its number's first digit as written (the paper's rule, for
    numbers written least significant digit first); significance: its place value (source numbers
    counted from their end, target numbers from their start: what the paper's reversed numbers give
    for operands written most significant digit first)"""
    max_offset: int = 100
    """k: in training a random offset in [0, k], one per batch, is added to every digit's index (0: none)"""
    max_len: int = 1024
    """rows of the table: indices 1 .. max_len - 1 (0 is every non-digit token)"""

    @property
    def counts_significance(self) -> bool:
        return self.order == "significance"

    def validate(self) -> None:
        super().validate()
        if self.order not in ABACUS_ORDERS:
            raise ValueError(f"model.positions.order={self.order!r}; choose one of {', '.join(ABACUS_ORDERS)}")
        if self.max_offset < 0:
            raise ValueError(f"model.positions.max_offset={self.max_offset} must be >= 0 (the paper uses 100)")
        if self.max_len < self.max_offset + 2:
            raise ValueError(f"model.positions.max_len={self.max_len} must exceed max_offset + 1 = "
                             f"{self.max_offset + 1}: the offset would push one-digit numbers past the table")


class AbacusEmbedding(DigitEmbedding):
    """1 + a digit's index (its significance, or its index as written), + k in training; 0 elsewhere."""

    def __init__(self, d_model: int, cfg: AbacusConfig, digits: Tensor):
        super().__init__(d_model, cfg.max_len, digits, cfg.separator_id, "max_len")
        self.by_significance, self.max_offset = cfg.order == "significance", cfg.max_offset

    def index(self, ids: Tensor) -> Tensor:
        is_digit, from_start, significance = digit_places(ids, self.digits, self.separator)
        index = 1 + (significance if self.by_significance else from_start)
        if self.training and self.max_offset:
            index = index + torch.randint(0, self.max_offset + 1, (), device=ids.device)  # one per batch
        return torch.where(is_digit, index, 0)


class Abacus(DigitRunsScheme):
    """Abacus embeddings (McLeish et al., 2024): a learned embedding of each digit's place in its number."""

    config_class = AbacusConfig
    supports_cache = True  # order=written counts from each number's start; order=significance: see __init__

    def __init__(self, cfg: AbacusConfig):
        super().__init__(cfg)
        self.supports_cache = cfg.order == "written"

    def embedding(self, d_model):
        return AbacusEmbedding(d_model, self.cfg, self.digits())


# --- position coupling --------------------------------------------------------------------------


@dataclass
class PositionCouplingConfig(DigitRunsConfig):
    scheme: str = "position_coupling"
    """position_coupling: learned absolute positions shared by digits of equal significance (Cho et al., 2024)"""
    max_position: int = 128
    """rows of the table: ids 0 .. max_position - 1; a test number may have up to max_position - 2
    digits (the paper's max_pos: the longest test operand + 2)"""

    def validate(self) -> None:
        super().validate()
        if self.max_position < 3:
            raise ValueError(f"model.positions.max_position={self.max_position} must be >= 3 "
                             "(a one-digit sum with its carry needs ids 0..2)")


class PositionCouplingEmbedding(DigitEmbedding):
    """start + 1 + significance for digits, start for every other token; start is 0 in evaluation
    and, in training, uniform per example over the starts that keep its ids below max_position."""

    def __init__(self, d_model: int, cfg: PositionCouplingConfig, digits: Tensor):
        super().__init__(d_model, cfg.max_position, digits, cfg.separator_id, "max_position")

    def index(self, ids: Tensor) -> Tensor:
        is_digit, _, significance = digit_places(ids, self.digits, self.separator)
        index = torch.where(is_digit, 1 + significance, 0)
        if self.training:
            room = (self.embedding.num_embeddings - 1 - index.amax(1, keepdim=True)).clamp_min(0)
            index = index + (torch.rand(room.shape, device=ids.device) * (room + 1)).long()
        return index


class PositionCoupling(DigitRunsScheme):
    """Position coupling (Cho et al., 2024): digits of equal significance share one learned position id."""

    config_class = PositionCouplingConfig

    def embedding(self, d_model):
        return PositionCouplingEmbedding(d_model, self.cfg, self.digits())
