"""The built-in copy and reverse tasks: deterministic data, length ranges, batches."""
from __future__ import annotations

import pytest
import torch

from relpos_lab.api import Vocabulary
from relpos_lab.api.errors import UserError
from relpos_lab.api.registry import get_task_class
from relpos_lab_tasks.synthetic import CopyTask, ReverseTask, SyntheticConfig


def task(cls=ReverseTask, seed=0, **fields):
    return cls(SyntheticConfig(name="reverse", **fields), seed=seed)


def test_builtin_tasks_are_the_registered_ones():
    assert get_task_class("copy") is CopyTask and get_task_class("reverse") is ReverseTask


def test_targets_are_the_source_reversed_or_copied():
    for pair in task(ReverseTask).dataset("valid")[:50]:
        assert pair.tgt.tolist() == pair.src.flip(0).tolist()
    for pair in task(CopyTask).dataset("valid")[:50]:
        assert pair.tgt.tolist() == pair.src.tolist()


def test_same_seed_gives_the_same_data_and_another_seed_other_data():
    a, b, c = task(seed=1).dataset("train"), task(seed=1).dataset("train"), task(seed=2).dataset("train")
    assert all(torch.equal(x.src, y.src) for x, y in zip(a, b))
    assert not all(torch.equal(x.src, y.src) for x, y in zip(a, c) if len(x.src) == len(y.src))


def test_data_seed_fixes_the_data_across_experiment_seeds():
    a, b = task(seed=1, data_seed=7).dataset("test"), task(seed=2, data_seed=7).dataset("test")
    assert all(torch.equal(x.src, y.src) for x, y in zip(a, b))


def test_splits_hold_their_configured_lengths_and_sizes():
    t = task(train_lengths=[2, 5], test_lengths=[1, 12], train_size=300, eval_size_per_length=3, alphabet_size=4)
    train, test = t.dataset("train"), t.dataset("test")
    assert len(train) == 300 and {len(p.src) for p in train} == {2, 3, 4, 5}
    assert sorted(len(p.src) for p in test) == [n for n in range(1, 13) for _ in range(3)]
    first = len(Vocabulary.SPECIALS)
    assert all(first <= int(s) < first + 4 for p in train for s in p.src)
    assert t.length_buckets("test") == list(range(1, 13)) and t.train_length_range() == (2, 5)


def test_unknown_split_is_a_user_error_with_suggestion():
    with pytest.raises(UserError, match="did you mean 'test'"):
        task().dataset("tset")


def test_collate_adds_bos_and_eos_and_pads():
    t = task()
    v = t.vocab
    batch = t.collate([t.dataset("valid")[0], t.dataset("valid")[-1]])
    n = int(batch["length"][1])
    assert batch["src"].shape == (2, n) and batch["tgt_in"].shape == (2, n + 1)
    assert (batch["tgt_in"][:, 0] == v.bos_id).all()
    assert batch["tgt_out"][1, n] == v.eos_id and batch["tgt_out"][0, 1] == v.eos_id
    assert batch["src"][0, 1:].eq(v.pad_id).all()


def test_vocabulary_decodes_up_to_eos():
    v = Vocabulary(["x", "y"])
    assert v.decode([v.bos_id, 4, 5, v.eos_id, 4]) == ["x", "y"]
    assert v.encode(["y", "zz"]) == [5, v.unk_id]


@pytest.mark.parametrize("field,value", [("alphabet_size", 1), ("train_lengths", [0, 3]), ("test_lengths", [4, 2])])
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"task.{field}="):
        SyntheticConfig(name="copy", **{field: value}).validate()


def test_string_transformations_of_the_other_tasks():
    from relpos_lab_tasks.synthetic import DuplicateConfig, DuplicateTask, OddsFirstConfig, OddsFirstTask, SortTask

    src = torch.tensor([7, 4, 9, 5, 4])
    assert DuplicateTask(DuplicateConfig(name="duplicate")).transform(src).tolist() == [7, 4, 9, 5, 4] * 2
    assert SortTask(SyntheticConfig(name="sort")).transform(src).tolist() == [4, 4, 5, 7, 9]
    assert OddsFirstTask(OddsFirstConfig(name="odds_first")).transform(src).tolist() == [7, 9, 4, 4, 5]
    assert OddsFirstTask(OddsFirstConfig(name="odds_first", order="code")).transform(src).tolist() == [4, 5, 7, 9, 4]
    with pytest.raises(ValueError, match="task.order='odd'; choose one of paper, code"):
        OddsFirstConfig(name="odds_first", order="odd").validate()
    assert DuplicateConfig(name="duplicate").decoding.max_len_a == 2.0
    for name in ("duplicate", "sort", "odds_first"):
        assert get_task_class(name).__module__ == "relpos_lab_tasks.synthetic"


def test_eval_length_step_thins_long_probes_but_keeps_the_longest():
    t = task(test_lengths=[41, 500], eval_length_step=50, eval_size_per_length=2)
    assert t.length_buckets("test") == [41, 91, 141, 191, 241, 291, 341, 391, 441, 491, 500]
    assert sorted({len(p.src) for p in t.dataset("test")}) == t.length_buckets("test")
    assert len(t.dataset("test")) == 2 * 11
