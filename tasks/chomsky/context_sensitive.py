"""The context-sensitive tasks of Delétang et al. (2023): duplicate string, missing duplicate,
odds first, binary addition, binary multiplication, compute sqrt, bucket sort. A linear bounded
automaton solves each; the paper's Transformers do not generalize on any of them."""
from __future__ import annotations

import math
import random

from relpos_lab_tasks.chomsky.base import ChomskyTask, bits
from relpos_lab_tasks.chomsky.context_free import StringTask


class DuplicateStringTask(StringTask):
    """CS: write a binary string twice (Delétang et al.'s duplicate string; `duplicate` is ours, any alphabet)."""

    def output_of(self, source: list[int]) -> list[int]:
        return source + source

    def output_length(self, source_length: int) -> int:
        return 2 * source_length


class OddsFirstStringTask(StringTask):
    """CS: a binary string's 1st, 3rd, ... symbols, then its 2nd, 4th, ... (Delétang et al.'s odds first).

    As the paper's text and its code's docstring example define it (`odds_first` is the same on
    any alphabet): input 001 gives 010. The published generator (tasks/cs/odds_first.py) computes
    the 2nd, 4th, ... first (0-based odd indices, s[1::2] + s[0::2]), against its own example:
    001 gives 001 there. `task.order=code` gives the code's order, `paper` (the default) the text's.
    """

    def output_of(self, source: list[int]) -> list[int]:
        return source[1::2] + source[0::2] if self.cfg.order == "code" else source[0::2] + source[1::2]


class BucketSortTask(StringTask):
    """CS: sort a string over 5 symbols (Delétang et al.'s bucket sort; `sort` is ours, any alphabet)."""

    paper_vocab_size = 5

    def output_of(self, source: list[int]) -> list[int]:
        return sorted(source)


class MissingDuplicateTask(ChomskyTask):
    """CS: the symbol hidden in a binary string written twice (Delétang et al.'s missing duplicate).

    Input: a uniform binary string of n // 2 digits written twice, one position of the two
    copies (uniform) replaced by "?", then "#" (the paper's empty token) when n is odd. Output:
    the hidden digit. Length 1, as in the paper: input "1", output "1".
    """

    input_symbols = ("0", "1", "?", "#")
    output_symbols = ("0", "1")

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        if length == 1:
            return [1], [1]
        doubled = bits(rng, length // 2) * 2
        i = rng.randrange(len(doubled))
        hidden, doubled[i] = doubled[i], 2
        return doubled + [3] * (length % 2), [hidden]  # tests/test_chomsky.py: output_of agrees

    def output_of(self, source: list[int]) -> list[int]:
        """The digit at the other copy's place of the "?"; "1" for the paper's length 1 (input "1")."""
        if source == [1]:
            return [1]
        body = source[:-1] if source[-1] == 3 else source
        half, i = len(body) // 2, body.index(2)
        return [body[i + half] if i < half else body[i - half]]


def little_endian(x: int, width: int = 0) -> list[int]:
    """The binary digits of x, least significant first, at least `width` of them (0 is [0])."""
    return [int(c) for c in reversed(f"{x:b}".zfill(width))]


def from_little_endian(digits: list[int]) -> int:
    """The number whose binary digits, least significant first, are `digits`."""
    return int("".join(map(str, reversed(digits))), 2)


class BinaryOperationTask(ChomskyTask):
    """Two binary numbers, little-endian, around an operator; the output is their `combine`d
    value, little-endian without trailing zeros, then the paper's termination token (EOS, scored).

    The paper's sampling: the first number takes a length uniform in 1..n-2, the second the
    remaining n-1-that; each is uniform over 1 .. 2^length - 1 written with exactly that many
    digits (so its most significant digits may be zeros). Lengths 1 and 2, as in the paper: the
    input is one number uniform in 0 .. 2^n - 2, without an operator (`degenerate` output).
    """

    scores_eos = True
    output_symbols = ("0", "1")

    def combine(self, a: int, b: int) -> int:
        raise NotImplementedError

    def degenerate(self, x: int, length: int) -> list[int]:
        raise NotImplementedError

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        if length <= 2:
            source = little_endian(rng.randint(0, 2**length - 2), length)
            return source, self.output_of(source)
        n = rng.randint(1, length - 2)
        m = length - 1 - n
        a, b = rng.randint(1, 2**n - 1), rng.randint(1, 2**m - 1)
        source = little_endian(a, n) + [2] + little_endian(b, m)
        return source, self.output_of(source)

    def output_of(self, source: list[int]) -> list[int]:
        if 2 not in source:  # the paper's lengths 1 and 2: one number, no operator
            return self.degenerate(from_little_endian(source), len(source))
        i = source.index(2)
        return little_endian(self.combine(from_little_endian(source[:i]), from_little_endian(source[i + 1:])))


class BinaryAdditionTask(BinaryOperationTask):
    """CS: add two little-endian binary numbers (Delétang et al.'s binary addition).

    See BinaryOperationTask for the sampling; at lengths 1 and 2 the output is the input number.
    """

    input_symbols = ("0", "1", "+")

    def output_length(self, source_length: int) -> int:
        return source_length + 1  # the reference's: the sum's digits, the termination token, zeros

    def combine(self, a: int, b: int) -> int:
        return a + b

    def degenerate(self, x: int, length: int) -> list[int]:
        return little_endian(x)


class BinaryMultiplicationTask(BinaryOperationTask):
    """CS: multiply two little-endian binary numbers (Delétang et al.'s binary multiplication).

    See BinaryOperationTask for the sampling; at lengths 1 and 2 the output is n - 1 zeros (none
    at length 1), the paper's arbitrary choice.
    """

    input_symbols = ("0", "1", "*")

    def output_length(self, source_length: int) -> int:
        return source_length  # the reference's: the product has at most n - 1 digits, then termination

    def combine(self, a: int, b: int) -> int:
        return a * b

    def degenerate(self, x: int, length: int) -> list[int]:
        return [0] * (length - 1)


class ComputeSqrtTask(ChomskyTask):
    """CS: the floor of the square root of a binary number (Delétang et al.'s compute sqrt).

    Input: a number uniform in 1 .. 2^n - 1, big-endian with exactly n digits (leading zeros
    kept). Output: its integer square root, big-endian with exactly ceil(n / 2) digits.
    """

    input_symbols = ("0", "1")
    output_symbols = ("0", "1")

    def output_length(self, source_length: int) -> int:
        return (source_length + 1) // 2

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        x = rng.randint(1, 2**length - 1)
        source = little_endian(x, length)[::-1]
        return source, self.output_of(source)

    def output_of(self, source: list[int]) -> list[int]:
        root = math.isqrt(from_little_endian(source[::-1]))
        return little_endian(root, (len(source) + 1) // 2)[::-1]
