"""The W&B samples table's choice of rows (api/samples.py): across the lengths, not the first batch."""
from __future__ import annotations

from relpos_lab.api.samples import SampleSpread, pick_rows, spread


def test_spread_keeps_both_ends_and_the_training_maximum():
    lengths = list(range(1, 101))
    assert spread(lengths, 8) == [1, 15, 29, 43, 58, 72, 86, 100]
    with_train = spread(lengths, 8, train_max=40)
    assert len(with_train) == 8 and {1, 40, 100} <= set(with_train)
    assert spread([3, 5], 8) == [3, 5] and spread(lengths, 1) == [100]


def test_a_batch_offers_its_lengths_first_then_its_other_rows():
    lengths = [1, 1, 1, 2, 2, 9, 9, 9]
    assert pick_rows(lengths, 3) == [0, 3, 5]
    assert pick_rows(lengths, 5) == [0, 3, 5, 1, 2]
    assert pick_rows([4] * 10, 4) == [0, 1, 2, 3]


def rows(*lengths):
    return [[length, f"example {length}.{i}"] for i, length in enumerate(lengths)]


def test_an_evaluation_table_spans_its_batches_lengths():
    table = SampleSpread(4, train_max=10)
    for first in range(1, 41, 4):  # ten batches of four lengths each, two rows offered per batch
        table.add(["length", "text"], rows(first, first + 1))
    assert [row[0] for row in table.rows()] == [1, 10, 26, 38]  # a shortest, the training maximum, the longest seen
    assert all(len(held) == 1 for held in table.by_length.values())  # n lengths seen: one row each is enough


def test_a_split_of_few_lengths_fills_the_table_in_turns():
    table = SampleSpread(5)
    table.add(["length", "text"], rows(2, 2, 2, 7, 7, 7))
    assert [row[0] for row in table.rows()] == [2, 2, 2, 7, 7]


def test_rows_without_a_length_are_the_first_ones_offered():
    table = SampleSpread(3)
    table.add(["source", "target"], [["a", "b"], ["c", "d"]])
    table.add(["source", "target"], [["e", "f"], ["g", "h"]])
    assert table.rows() == [["a", "b"], ["c", "d"], ["e", "f"]]
