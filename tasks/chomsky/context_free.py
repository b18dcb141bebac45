"""The deterministic context-free tasks of Delétang et al. (2023): stack manipulation, reverse
string, modular arithmetic with brackets, solve equation. A pushdown automaton solves each."""
from __future__ import annotations

import random
from collections.abc import Sequence

from relpos_lab_tasks.chomsky.base import ChomskyTask, bits


class StackManipulationTask(ChomskyTask):
    """DCF: run POP / PUSH 0 / PUSH 1 on a given stack, output the final stack (Delétang et al.).

    Input: a stack of binary digits, bottom to top, of a length uniform in 1..n-1, then n minus
    that many actions uniform over "POP", "PUSH0", "PUSH1" (a POP on an empty stack does
    nothing). Output: the final stack, top to bottom, then the paper's termination token (our
    EOS, which is scored). Length 1, as in the paper: a single digit, whose output is itself.
    """

    scores_eos = True
    input_symbols = ("0", "1", "POP", "PUSH0", "PUSH1")
    output_symbols = ("0", "1")

    def output_length(self, source_length: int) -> int:
        return source_length + 1  # the longest stack, then the termination token

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        if length == 1:
            digit = bits(rng, 1)
            return digit, self.output_of(digit)
        stack = bits(rng, rng.randint(1, length - 1))
        actions = rng.choices((2, 3, 4), k=length - len(stack))
        return stack + actions, self.output_of(stack + actions)

    def output_of(self, source: list[int]) -> list[int]:
        """The digits before the first action are the stack, bottom to top; the actions run on it."""
        first_action = next((i for i, symbol in enumerate(source) if symbol >= 2), len(source))
        final = source[:first_action]
        for action in source[first_action:]:
            if action == 2:
                if final:
                    final.pop()
            else:
                final.append(action - 3)
        return final[::-1]


class StringTask(ChomskyTask):
    """A uniform random string over `vocab_size` symbols, mapped to its output by `output_of`."""

    paper_vocab_size = 2

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size or self.paper_vocab_size

    def inputs(self) -> list[str]:
        return [str(i) for i in range(self.vocab_size)]

    outputs = inputs

    def output_length(self, source_length: int) -> int:
        return source_length

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        s = rng.choices(range(self.vocab_size), k=length)
        return s, self.output_of(s)


class ReverseStringTask(StringTask):
    """DCF: reverse a binary string (Delétang et al.'s reverse string; `reverse` is ours, any alphabet)."""

    def output_of(self, source: list[int]) -> list[int]:
        return source[::-1]


def bracketed_expression(length: int, modulus: int, ops: str, rng: random.Random) -> tuple[list[str], int]:
    """An expression of exactly `length` symbols and its value modulo `modulus`, the paper's
    grammar: d, -d, (d), (-d) for lengths 1-4; longer ones are (left op right) with the left's
    length uniform over what leaves the right at least one symbol."""
    if length <= 4:
        d = rng.randrange(modulus)
        value = -d if length in (2, 4) else d
        text = {1: [str(d)], 2: ["-", str(d)], 3: ["(", str(d), ")"], 4: ["(", "-", str(d), ")"]}[length]
        return text, value % modulus
    left_length = rng.randint(1, length - 4)
    left, a = bracketed_expression(left_length, modulus, ops, rng)
    right, b = bracketed_expression(length - 3 - left_length, modulus, ops, rng)
    op = ops[rng.randrange(len(ops))]
    value = a + b if op == "+" else a - b if op == "-" else a * b
    return ["(", *left, op, *right, ")"], value % modulus


def evaluate(symbols: Sequence[str], modulus: int) -> int:
    """The value modulo `modulus` of an expression of digits, +, -, *, brackets and a unary minus,
    * before + and -, left to right: the bracket grammar's expressions (any other too)."""
    pos = 0

    def operand() -> int:  # a digit, -operand or (expression)
        nonlocal pos
        symbol = symbols[pos]
        pos += 1
        if symbol == "-":
            return -operand() % modulus
        if symbol == "(":
            value = expression()
            if symbols[pos] != ")":
                raise ValueError(f"unbalanced brackets in {''.join(symbols)!r}")
            pos += 1
            return value
        return int(symbol) % modulus

    def product() -> int:
        nonlocal pos
        value = operand()
        while pos < len(symbols) and symbols[pos] == "*":
            pos += 1
            value = value * operand() % modulus
        return value

    def expression() -> int:
        nonlocal pos
        value = product()
        while pos < len(symbols) and symbols[pos] in ("+", "-"):
            sign = 1 if symbols[pos] == "+" else -1
            pos += 1
            value = (value + sign * product()) % modulus
        return value

    value = expression()
    if pos != len(symbols):
        raise ValueError(f"not an expression: {''.join(symbols)!r}")
    return value


class ModularArithmeticBracketsTask(ChomskyTask):
    """DCF: reduce a bracketed expression of numbers and +, -, * modulo 5 (Delétang et al.).

    Input: an expression of exactly n symbols from the paper's grammar (bracketed_expression):
    numbers 0..4, +, -, *, brackets, and unary minus on a number. Output: its value modulo 5.
    With * by default (`task.multiplication`): the paper's constants (experiments/constants.py)
    build this task with mult=True, although the generator class defaults to mult=False.
    """

    @property
    def ops(self) -> str:
        return "+-*" if self.cfg.multiplication else "+-"

    def inputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)] + ["+", "-", "*", "(", ")"]

    def outputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)]

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        text, _ = bracketed_expression(length, self.cfg.modulus, self.ops, rng)
        index = {s: i for i, s in enumerate(self.inputs())}
        source = [index[s] for s in text]
        return source, self.output_of(source)

    def output_of(self, source: list[int]) -> list[int]:
        return [evaluate([self.inputs()[i] for i in source], self.cfg.modulus)]


class SolveEquationTask(ChomskyTask):
    """DCF: solve a bracketed linear equation in x modulo 5 (Delétang et al.'s solve equation).

    Input: a bracketed expression of n - 2 symbols over +, - (no *, as in the paper) in which
    one number is replaced by "x", then "=" and the expression's value. The replaced number is
    the first one at or after a uniformly drawn position, wrapping around (the paper's choice,
    not uniform over the numbers). Output: the replaced number. Lengths 1 and 2, as in the
    paper: n zeros, answer 0.
    """

    def inputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)] + ["+", "-", "(", ")", "x", "="]

    def outputs(self) -> list[str]:
        return [str(i) for i in range(self.cfg.modulus)]

    def sample(self, length: int, rng: random.Random) -> tuple[list[int], list[int]]:
        if length < 3:
            return [0] * length, [0]
        text, value = bracketed_expression(length - 2, self.cfg.modulus, "+-", rng)
        i = rng.randrange(len(text))
        while not text[i].isdigit():
            i = (i + 1) % len(text)
        solution = int(text[i])
        index = {s: k for k, s in enumerate(self.inputs())}
        equation = [*text[:i], "x", *text[i + 1:], "=", str(value)]
        return [index[s] for s in equation], [solution]  # tests/test_chomsky.py: output_of agrees

    def output_of(self, source: list[int]) -> list[int]:
        """The x in 0..modulus-1 for which the two sides agree (one: the left side is ±x + c);
        0 for the paper's lengths 1 and 2, which are zeros without an equation."""
        symbols = [self.inputs()[i] for i in source]
        if "=" not in symbols:
            return [0]
        equals = symbols.index("=")
        right = evaluate(symbols[equals + 1:], self.cfg.modulus)
        left = symbols[:equals]
        (x,) = [x for x in range(self.cfg.modulus)
                if evaluate([str(x) if s == "x" else s for s in left], self.cfg.modulus) == right]
        return [x]
