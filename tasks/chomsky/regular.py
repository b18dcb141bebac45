"""The regular tasks of Delétang et al. (2023): even pairs, modular arithmetic (simple), parity
check, cycle navigation. Each is a classification (a one-token output), solvable by a finite
automaton reading the input once."""
from __future__ import annotations

import random

from relpos_lab_tasks.chomsky.base import ChomskyTask, bits


class EvenPairsTask(ChomskyTask):
    """Regular: is the number of "01" and "10" pairs in a binary string even (Delétang et al.)?

    Input: n binary digits, uniform. Output: "even" or "odd", the parity of the number of unequal
    neighbours (the paper's classes 0 and 1). It is even exactly when the first and the last
    digit are equal.
    """

    input_symbols = ("0", "1")
    output_symbols = ("even", "odd")

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        s = bits(rng, length)
        return s, self.output_of(s)

    def output_of(self, source: list[int]) -> list[int]:
        return [sum(a != b for a, b in zip(source, source[1:])) % 2]


class ParityCheckTask(ChomskyTask):
    """Regular: is the number of 1s in a binary string even (Delétang et al.'s parity check)?

    Input: n binary digits, uniform. Output: "even" or "odd" (the paper's classes 0 and 1).
    """

    input_symbols = ("0", "1")
    output_symbols = ("even", "odd")

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        s = bits(rng, length)
        return s, self.output_of(s)

    def output_of(self, source: list[int]) -> list[int]:
        return [sum(source) % 2]


class CycleNavigationTask(ChomskyTask):
    """Regular: where a walk on a cycle of 5 ends (Delétang et al.'s cycle navigation).

    Input: n moves, uniform over "-1" (left), "0" (stay), "+1" (right), starting at 0. Output:
    the final position, "0" to "4" (the sum of the moves modulo 5).
    """

    input_symbols = ("-1", "0", "+1")
    output_symbols = tuple(str(i) for i in range(5))

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        moves = rng.choices((0, 1, 2), k=length)
        return moves, self.output_of(moves)

    def output_of(self, source: list[int]) -> list[int]:
        return [sum(m - 1 for m in source) % 5]


class ModularArithmeticTask(ChomskyTask):
    """Regular: reduce an expression of numbers and +, -, * without brackets, modulo 5 (Delétang et al.).

    Input: numbers and operators alternating, numbers uniform over 0..4 and operators uniform
    over +, *, -; always of odd length: the paper's length n becomes n - 1 when even (so the
    lengths 2k and 2k - 1 share one bucket, and every odd bucket holds twice the examples).
    Output: the value with the usual precedence (* before + and -, left to right), modulo 5.
    """

    operators = ("+", "*", "-")

    def inputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)] + ["+", "-", "*"]

    def outputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)]

    def source_length(self, length: int) -> int:
        return length if length % 2 else length - 1

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        m = self.cfg.modulus
        numbers = [rng.randrange(m) for _ in range(self.source_length(length) // 2 + 1)]
        ops = [rng.choice(self.operators) for _ in range(len(numbers) - 1)]
        src = [numbers[0]]
        for op, x in zip(ops, numbers[1:]):
            src += [m + ("+", "-", "*").index(op), x]
        return src, self.output_of(src)

    def output_of(self, source: list[int]) -> list[int]:
        # Evaluate as a sum of products: a product is closed by + or -, and the sign of the
        # operator before it goes to the whole product.
        m = self.cfg.modulus
        numbers, ops = source[0::2], [("+", "-", "*")[i - m] for i in source[1::2]]
        total, product, sign = 0, numbers[0], 1
        for op, x in zip(ops, numbers[1:]):
            if op == "*":
                product = product * x % m
            else:
                total += sign * product
                product, sign = x, (1 if op == "+" else -1)
        total += sign * product
        return [total % m]
