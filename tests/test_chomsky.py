"""The tasks of Delétang et al. (2023) against brute-force solvers written independently of the
generators: Python's own arithmetic (eval, int(..., 2)), string operations, a stack simulation, a
recursive recogniser of the bracket grammar. Random examples must be solved correctly, small
lengths must reach every input the paper's generator can produce (and nothing else), and the
splits must hold the lengths the config asks for. Solve equation and missing duplicate know their
answer by construction: there the solver is the task's own `output_of`, which must agree with it.
tests/test_golden.py holds `output_of` against the reference generators' outputs."""
from __future__ import annotations

import functools
import itertools
import math
import random
import re
from collections import Counter

import pytest
import torch
from omegaconf import OmegaConf

from relpos_lab.api import Vocabulary
from relpos_lab.api.errors import ConfigError
from relpos_lab.api.registry import get_task_class
from relpos_lab.config import load_config
from relpos_lab.records.rundir import run_directory

MOD = 5


def digit_strings(alphabet, n):
    return ("".join(p) for p in itertools.product(alphabet, repeat=n))


# --- brute-force solvers: source symbols -> target symbols ------------------------------------

def even_pairs(src):
    return ["odd" if len(re.findall("(?=01|10)", "".join(src))) % 2 else "even"]


def parity_check(src):
    return ["odd" if "".join(src).count("1") % 2 else "even"]


def cycle_navigation(src):
    position = 0
    for move in src:
        position = (position + {"-1": 4, "0": 0, "+1": 1}[move]) % MOD
    return [str(position)]


def modular_arithmetic(src):
    return [str(eval("".join(src)) % MOD)]


def stack_manipulation(src):
    if len(src) == 1:
        return src
    stack = ""
    for s in src:
        if s in "01":
            stack += s
        elif s == "POP":
            stack = stack[:-1]
        else:
            stack += s[-1]
    return list(reversed(stack))


def modular_arithmetic_brackets(src):
    return [str(eval("".join(src)) % MOD)]


def output_of(name):
    """The task's own input→output function on symbols, for the tasks whose generator knows the
    answer by construction (solve equation, missing duplicate): the test checks that they agree."""
    def solve(src):
        t = default_task(name)
        source = [list(t.inputs()).index(s) for s in src]
        return [t.outputs()[i] for i in t.output_of(source)]
    return solve


def binary_operation(op):
    def solve(src):
        text = "".join(src)
        if op not in text:
            value = int(text[::-1], 2)
            return list(bin(value)[2:][::-1]) if op == "+" else ["0"] * (len(text) - 1)
        a, b = (int(part[::-1], 2) for part in text.split(op))
        return list(bin(a + b if op == "+" else a * b)[2:][::-1])
    return solve


def compute_sqrt(src):
    x = int("".join(src), 2)
    root = int(math.sqrt(x))  # a float guess, corrected by squaring in integers
    while root * root > x:
        root -= 1
    while (root + 1) ** 2 <= x:
        root += 1
    return list(format(root, "b").zfill(math.ceil(len(src) / 2)))


def odds_first_string(src):
    return [s for i, s in enumerate(src, start=1) if i % 2] + [s for i, s in enumerate(src, start=1) if not i % 2]


def bucket_sort(src):
    counts = Counter(src)
    return [s for s in "01234" for _ in range(counts[s])]


# --- what the paper's generators can produce at a small length --------------------------------

@functools.lru_cache(maxsize=None)
def in_grammar(text: str) -> bool:
    """The paper's bracket grammar, recognised: d | -d | (d) | (-d) | (E op E) for longer ones."""
    digit = lambda s: len(s) == 1 and s.isdigit() and int(s) < MOD
    if len(text) <= 4:
        return (digit(text) or (text[:1] == "-" and digit(text[1:])) or (text[:1] == "(" and text[-1:] == ")"
                and (digit(text[1:-1]) or (text[1:2] == "-" and digit(text[2:-1])))))
    if text[0] != "(" or text[-1] != ")":
        return False
    inner = text[1:-1]
    return any(inner[i] in "+-*" and in_grammar(inner[:i]) and in_grammar(inner[i + 1:])
               for i in range(1, len(inner) - 1))


def stack_inputs(src):
    if len(src) == 1:
        return src[0] in "01"
    k = next((i for i, s in enumerate(src) if s not in "01"), len(src))
    return 1 <= k < len(src) and all(s in ("POP", "PUSH0", "PUSH1") for s in src[k:])


def binary_inputs(op):
    def valid(text):
        if len(text) <= 2:
            return op not in text and text != "1" * len(text)
        parts = text.split(op)
        return len(parts) == 2 and all(p and int(p[::-1], 2) > 0 for p in parts)
    return valid


def missing_duplicate_inputs(text):
    if len(text) == 1:
        return text == "1"
    body = text[:-1] if len(text) % 2 else text
    half = len(body) // 2
    return ((len(text) % 2 == 0 or text[-1] == "#") and body.count("?") == 1 and "#" not in body
            and any(body.replace("?", b)[:half] == body.replace("?", b)[half:] for b in "01"))


def equation_inputs(n):
    """Every expression of n - 2 symbols of the grammar, with any one of its numbers replaced by x."""
    symbols = [str(i) for i in range(MOD)] + list("+-()")
    out = set()
    for expr in digit_strings(symbols, n - 2):
        if in_grammar(expr):
            for i, c in enumerate(expr):
                if c.isdigit():
                    out.add(f"{expr[:i]}x{expr[i + 1:]}={eval(expr) % MOD}")
    return out


def filtered(alphabet, valid, joined=True):
    def inputs(n):
        if joined:
            return {s for s in digit_strings(alphabet, n) if valid(s)}
        return {" ".join(p) for p in itertools.product(alphabet, repeat=n) if valid(list(p))}
    return inputs


BITS = ("0", "1")
DIGITS = [str(i) for i in range(MOD)]
# name: (solver, source symbols, target symbols, inputs(n) the generator can produce at length n, lengths checked)
SPECS = {
    "even_pairs": (even_pairs, BITS, ("even", "odd"), filtered(BITS, bool), [1, 2, 5]),
    "parity_check": (parity_check, BITS, ("even", "odd"), filtered(BITS, bool), [1, 4]),
    "cycle_navigation": (cycle_navigation, ("-1", "0", "+1"), DIGITS,
                         filtered(("-1", "0", "+1"), bool, joined=False), [1, 4]),
    "modular_arithmetic": (modular_arithmetic, DIGITS + ["+", "-", "*"], DIGITS,
                           filtered(DIGITS + ["+", "-", "*"],
                                    lambda s: all(c.isdigit() == (i % 2 == 0) for i, c in enumerate(s))),
                           [1, 3]),
    "stack_manipulation": (stack_manipulation, ("0", "1", "POP", "PUSH0", "PUSH1"), BITS,
                           filtered(("0", "1", "POP", "PUSH0", "PUSH1"), stack_inputs, joined=False), [1, 2, 3]),
    "reverse_string": (lambda s: s[::-1], BITS, BITS, filtered(BITS, bool), [1, 4]),
    "modular_arithmetic_brackets": (modular_arithmetic_brackets, DIGITS + list("+-*()"), DIGITS,
                                    filtered(DIGITS + list("+-*()"), in_grammar), [1, 2, 3, 4, 5]),
    "solve_equation": (output_of("solve_equation"), DIGITS + list("+-()x="), DIGITS, equation_inputs, [3, 4, 7]),
    "duplicate_string": (lambda s: s + s, BITS, BITS, filtered(BITS, bool), [1, 4]),
    "missing_duplicate_string": (output_of("missing_duplicate_string"), ("0", "1", "?", "#"), BITS,
                                 filtered(("0", "1", "?", "#"), missing_duplicate_inputs), [1, 4, 5]),
    "odds_first_string": (odds_first_string, BITS, BITS, filtered(BITS, bool), [1, 5]),
    "binary_addition": (binary_operation("+"), ("0", "1", "+"), BITS, filtered("01+", binary_inputs("+")),
                        [1, 2, 3, 5]),
    "binary_multiplication": (binary_operation("*"), ("0", "1", "*"), BITS, filtered("01*", binary_inputs("*")),
                              [1, 2, 3, 5]),
    "compute_sqrt": (compute_sqrt, BITS, BITS, filtered(BITS, lambda s: "1" in s), [1, 4]),
    "bucket_sort": (bucket_sort, DIGITS, DIGITS, filtered(DIGITS, bool), [1, 3]),
}
TASKS = sorted(SPECS)


def task(name, seed=0, **fields):
    cls = get_task_class(name)
    return cls(cls.config_class(name=name, **fields), seed=seed)


@functools.lru_cache(maxsize=None)
def default_task(name):
    return task(name)


def symbols(t, pair):
    return t.src_vocab.decode(pair.src), t.tgt_vocab.decode(pair.tgt)


@pytest.mark.parametrize("name", TASKS)
def test_random_examples_match_the_brute_force_solver(name):
    solve = SPECS[name][0]
    t = task(name, test_lengths=[1, 24], eval_size_per_length=12, train_size=400, train_lengths=[1, 24])
    for split in ("train", "test"):
        for pair in t.dataset(split):
            src, tgt = symbols(t, pair)
            assert tgt == solve(src), (split, src, tgt)


@pytest.mark.parametrize("name", TASKS)
def test_small_lengths_reach_exactly_the_inputs_the_paper_generates(name):
    _, source, target, inputs, lengths = SPECS[name]
    t = task(name)
    rng = random.Random(0)
    joined = name not in ("cycle_navigation", "stack_manipulation")
    for n in lengths:
        seen = set()
        for _ in range(4000):
            src, tgt = t.sample(n, rng)
            seen.add(("" if joined else " ").join(source[i] for i in src))
        assert seen == inputs(n), (n, sorted(seen ^ inputs(n))[:10])


@pytest.mark.parametrize("name", TASKS)
def test_vocabularies_are_the_papers_alphabets(name):
    _, source, target, _, _ = SPECS[name]
    t = task(name)
    specials = list(Vocabulary.SPECIALS)
    assert t.src_vocab.symbols == specials + list(source)
    assert t.tgt_vocab.symbols == specials + list(target)
    assert (t.src_vocab is t.tgt_vocab) == (list(source) == list(target))


@pytest.mark.parametrize("name", TASKS)
def test_lengths_are_uniform_in_training_and_equal_per_length_in_evaluation(name):
    t = task(name, train_lengths=[2, 7], test_lengths=[3, 12], train_size=6000, eval_size_per_length=5)
    counts = Counter(len(p.src) for p in t.dataset("train"))
    expected = Counter()
    for n in range(2, 8):
        expected[t.source_length(n)] += 1000
    assert set(counts) == set(expected)
    assert all(abs(counts[n] - expected[n]) < 0.15 * expected[n] for n in expected), counts
    test = Counter(len(p.src) for p in t.dataset("test"))
    assert test == Counter(t.source_length(n) for n in range(3, 13) for _ in range(5))
    assert t.length_buckets("test") == sorted(test)


def test_modular_arithmetic_makes_even_lengths_odd_so_odd_buckets_hold_two_lengths():
    t = task("modular_arithmetic", test_lengths=[3, 12], eval_size_per_length=5)
    assert Counter(len(p.src) for p in t.dataset("test")) == {3: 10, 5: 10, 7: 10, 9: 10, 11: 10}
    assert t.length_buckets("test") == [3, 5, 7, 9, 11] and t.train_length_range() == (1, 16)


def test_the_same_seed_gives_the_same_data_and_data_seed_fixes_it():
    a, b = task("stack_manipulation", seed=1).dataset("test"), task("stack_manipulation", seed=1).dataset("test")
    c = task("stack_manipulation", seed=2).dataset("test")
    d = task("stack_manipulation", seed=3, data_seed=1).dataset("test")
    assert all(torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt) for x, y in zip(a, b))
    assert all(torch.equal(x.src, y.src) and torch.equal(x.tgt, y.tgt) for x, y in zip(a, d))
    assert not all(torch.equal(x.src, y.src) for x, y in zip(a, c))


def test_the_paper_accuracy_scores_the_termination_token_only_where_the_paper_has_one():
    for name, scores_eos in (("binary_addition", True), ("parity_check", False), ("reverse_string", False)):
        t = task(name)
        v = t.tgt_vocab
        metric = t.build_metrics()["accuracy"]
        target = torch.tensor([[4, 5, v.eos_id, v.pad_id]])
        metric.update(torch.tensor([[4, 4, v.eos_id, 5]]), target)
        assert float(metric.compute()) == pytest.approx(2 / 3 if scores_eos else 1 / 2)



@pytest.mark.parametrize("name", TASKS)
def test_the_papers_experiment_keeps_its_protocol_for_every_task(name):
    """One config class for the suite: switching task.name keeps the experiment's lengths and sizes."""
    cfg = load_config("deletang2023_chomsky", [f"task.name={name}"])
    assert ((list(cfg.task.train_lengths), list(cfg.task.test_lengths), cfg.task.train_size)
            == ([1, 40], [41, 500], 500000))


def test_task_specific_fields_change_the_alphabets():
    assert task("bucket_sort").src_vocab.symbols[4:] == list("01234")
    assert task("reverse_string", vocab_size=3).src_vocab.symbols[4:] == list("012")
    assert task("modular_arithmetic", modulus=7).tgt_vocab.symbols[4:] == list("0123456")
    src, _ = task("modular_arithmetic_brackets", multiplication=False).sample(200, random.Random(0))
    assert 7 not in src  # index of "*" among 0-4, +, -, *, (, )
    assert task("duplicate_string").cfg.decoding.max_len_a == 2.0


def test_odds_first_follows_the_papers_text_and_order_code_the_published_code():
    """The reference generator (tasks/cs/odds_first.py) outputs concatenate(s[:, 1::2], s[:, ::2]);
    its docstring's example, 00110101 -> 0100 0111, is the 1-based odd positions first (the text)."""
    paper, code = task("odds_first_string"), task("odds_first_string", order="code")
    assert paper.output_of([0, 0, 1]) == [0, 1, 0] and code.output_of([0, 0, 1]) == [0, 0, 1]
    s = [0, 0, 1, 1, 0, 1, 0, 1]
    assert paper.output_of(s) == [0, 1, 0, 0, 0, 1, 1, 1] and code.output_of(s) == [0, 1, 1, 1, 0, 1, 0, 0]
    for pair in code.dataset("test")[::37]:
        src, tgt = symbols(code, pair)
        assert tgt == src[1::2] + src[0::2]
    assert load_config("deletang2023_chomsky", ["task.name=odds_first_string", "task.order=code"]).task.order == "code"
    with pytest.raises(ConfigError, match=r"^command line: task.order='odd'; choose one of paper, code$"):
        load_config("deletang2023_chomsky", ["task.name=odds_first_string", "task.order=odd"])


def test_task_order_at_its_default_keeps_every_run_directory():
    """task.order came after runs of the suite existed: at `paper` it is left out of the hash."""
    cfg = load_config("deletang2023_chomsky", ["task.name=odds_first_string"])
    before = OmegaConf.to_container(cfg)
    del before["task"]["order"]
    assert run_directory(cfg) == run_directory(OmegaConf.create(before))
    assert run_directory(load_config("deletang2023_chomsky", ["task.name=odds_first_string", "task.order=code"])) \
        != run_directory(cfg)


def test_every_task_is_registered_with_a_one_line_description():
    for name in TASKS:
        cls = get_task_class(name)
        assert cls.__module__.startswith("relpos_lab_tasks.chomsky.") and "Delétang et al." in cls.describe()
