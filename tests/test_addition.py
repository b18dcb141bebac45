"""Multi-digit addition (Zhou et al. 2024) against Python's integers: answers in every format,
index hints naming each digit's place, the operand lengths of each split, and its buckets."""
from __future__ import annotations

from collections import Counter

import pytest

from relpos_lab_tasks.addition import AdditionConfig, AdditionTask


def task(seed=0, **fields):
    return AdditionTask(AdditionConfig(name="addition", **fields), seed=seed)


def read(symbols, hints):
    """Digits of a symbol list, hints checked and dropped: (digits as written, their places)."""
    if not hints:
        return symbols, None
    assert all(h.startswith("p") for h in symbols[0::2]) and all(d.isdigit() for d in symbols[1::2])
    return symbols[1::2], [int(h[1:]) for h in symbols[0::2]]


@pytest.mark.parametrize("reversed_output", [False, True])
@pytest.mark.parametrize("index_hints", [False, True])
def test_every_target_is_the_sum_python_computes(reversed_output, index_hints):
    t = task(reversed_output=reversed_output, index_hints=index_hints, train_lengths=[1, 12], train_size=500,
             test_lengths=[1, 30], eval_size_per_length=4)
    for split in ("train", "test"):
        for pair in t.dataset(split):
            src, tgt = t.vocab.decode(pair.src), t.vocab.decode(pair.tgt)
            plus = src.index("+")
            (a, a_places), (b, b_places) = read(src[:plus], index_hints), read(src[plus + 1:], index_hints)
            digits, places = read(tgt, index_hints)
            total = int("".join(a)) + int("".join(b))
            assert "".join(digits[::-1] if reversed_output else digits) == str(total)
            if index_hints:  # every digit's hint names its place value: 0 for the units
                assert a_places == list(range(len(a) - 1, -1, -1)) and b_places == list(range(len(b) - 1, -1, -1))
                assert places == (list(range(len(digits))) if reversed_output else list(range(len(digits) - 1, -1, -1)))
            assert all(len(x) == 1 or x[0] != "0" for x in (a, b))  # no leading zeros


def test_training_draws_each_operand_length_uniformly_and_buckets_by_the_longer():
    t = task(train_lengths=[1, 4], train_size=8000)
    shapes = Counter()
    for pair in t.dataset("train"):
        src = t.vocab.decode(pair.src)
        n, m = src.index("+"), len(src) - src.index("+") - 1
        shapes[n, m] += 1
        assert t.example_length(pair) == max(n, m)
    assert set(shapes) == {(n, m) for n in range(1, 5) for m in range(1, 5)}
    assert all(abs(c - 500) < 100 for c in shapes.values()), shapes


def test_evaluation_adds_two_n_digit_numbers_per_length():
    t = task(index_hints=True, test_lengths=[18, 21], eval_size_per_length=3)
    test = t.dataset("test")
    assert Counter(t.example_length(p) for p in test) == {18: 3, 19: 3, 20: 3, 21: 3}
    for pair in test:
        src = t.vocab.decode(pair.src)
        assert src.index("+") == len(src) - src.index("+") - 1
    assert t.length_buckets("test") == [18, 19, 20, 21] and t.train_length_range() == (1, 16)


def test_index_hints_need_a_symbol_for_the_carry_of_the_longest_operand():
    with pytest.raises(ValueError, match="task.max_digits=100"):
        AdditionConfig(name="addition", index_hints=True, test_lengths=[1, 100], max_digits=100).validate()
    AdditionConfig(name="addition", index_hints=True, test_lengths=[1, 100], max_digits=101).validate()
    assert len(task(index_hints=True).vocab) == len(task().vocab) + 129
