"""Streamed training data, task.train_size=0: fresh examples at every step,
reproducible, resumable at the same stream position, and the same under DDP as on one process."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn
from omegaconf import OmegaConf

from relpos_lab.api import ConfigError, Vocabulary, registry
from relpos_lab.api.stream import Stream, StreamBatches
from relpos_lab.config import DataConfig, config_from_container
from relpos_lab.training.data import TaskDataModule

from tests.test_resume_data import TINY as RESUME_TINY, _fit


def create(name: str, **fields):
    cls = registry.get_task_class(name)
    cfg = cls.config_class(name=name, **fields)
    cfg.validate()
    return cls(cfg, seed=0)


def rows(examples) -> list[tuple[list[int], list[int]]]:
    return [(e.src.tolist(), e.tgt.tolist()) for e in examples]


def test_a_streamed_example_is_a_function_of_the_seed_and_its_index():
    stream = create("parity_check", train_size=0, train_lengths=[1, 40]).dataset("train")
    assert isinstance(stream, Stream)
    first = rows(stream[i] for i in range(300))
    assert rows(stream[i] for i in reversed(range(300)))[::-1] == first  # order of drawing does not matter
    assert rows(create("parity_check", train_size=0, train_lengths=[1, 40]).dataset("train")[i]
                for i in range(300)) == first
    other = create("parity_check", train_size=0, train_lengths=[1, 40], data_seed=1).dataset("train")
    assert rows(other[i] for i in range(300)) != first
    lengths = [len(src) for src, _ in first]
    assert min(lengths) == 1 and max(lengths) == 40 and len(set(lengths)) > 30  # uniform over 1..40
    first_id = len(Vocabulary.SPECIALS)
    for src, tgt in first:  # the task's own answer: "even" / "odd" ones
        assert tgt == [first_id + sum(s - first_id for s in src) % 2]


def test_one_length_per_step_with_length_per_batch():
    stream = create("reverse_string", train_size=0, train_lengths=[1, 40], length_per_batch=True).dataset("train")
    stream.per_step = 32
    steps = [[len(stream[s * 32 + j].src) for j in range(32)] for s in range(20)]
    assert all(len(set(step)) == 1 for step in steps)
    assert len({step[0] for step in steps}) > 5


def test_the_ranks_batches_of_a_step_are_one_process_batch_of_the_global_size():
    one = list(StreamBatches(batch_size=8, steps=5))
    two = [list(StreamBatches(batch_size=4, steps=5, world=2, rank=r)) for r in range(2)]
    assert [a + b for a, b in zip(*two)] == one
    assert len(StreamBatches(4, 5, 2, 1)) == 5


def loader(task, batch_size: int, world: int, rank: int):
    data = TaskDataModule(task, OmegaConf.structured(DataConfig(batch_size=batch_size)))
    data.trainer = SimpleNamespace(world_size=world, global_rank=rank, max_steps=6,
                                   state=SimpleNamespace(fn=TrainerFn.FITTING))
    return data.train_dataloader()


def test_two_ranks_draw_together_what_one_process_draws_at_twice_the_batch():
    """Exact under DDP, with one length per step too: the global batch is the same examples."""
    make = lambda: create("duplicate_string", train_size=0, train_lengths=[1, 20], length_per_batch=True)  # noqa: E731
    one = [b["src"] for b in loader(make(), 16, 1, 0)]
    ranks = [[b["src"] for b in loader(make(), 8, 2, r)] for r in range(2)]
    assert len(one) == 6
    for whole, a, b in zip(one, *ranks):
        assert torch.equal(whole[:8, :a.shape[1]], a) and torch.equal(whole[8:, :b.shape[1]], b)
        assert a.shape[1] == b.shape[1] == whole.shape[1]  # one length for the whole step


TINY = {**RESUME_TINY, "task": {**RESUME_TINY["task"], "train_size": 0}}  # the resume test's run, streamed


def test_a_streamed_fit_resumed_from_a_checkpoint_continues_the_stream_and_ends_with_the_same_weights(tmp_path):
    cfg = config_from_container(TINY, "tiny")
    whole, weights = _fit(cfg, tmp_path, checkpoint_at=20)
    resumed, resumed_weights = _fit(cfg, tmp_path, resume_from=tmp_path / "at-step=20.ckpt")
    assert len(whole) == 30 and len(resumed) == 10
    assert all(torch.equal(a, b) for a, b in zip(resumed, whole[20:]))
    distinct = {tuple(row.tolist()) for batch in whole for row in batch}
    assert len(distinct) > 200  # fresh examples (of 4 symbols' strings up to length 4) rather than one epoch again
    assert all(torch.equal(weights[k], resumed_weights[k]) for k in weights)


def test_a_longer_budget_continues_the_same_stream(tmp_path):
    cfg = config_from_container(TINY, "tiny")
    short, _ = _fit(cfg, tmp_path)
    longer = config_from_container({**TINY, "trainer": {**TINY["trainer"], "max_steps": 40}}, "tiny")
    long, _ = _fit(longer, tmp_path / "long")
    assert all(torch.equal(a, b) for a, b in zip(short, long[:30]))


def test_a_task_that_cannot_draw_one_example_refuses_to_stream_in_one_line():
    with pytest.raises(ConfigError) as err:
        create("addition", train_size=0).dataset("train")
    assert str(err.value) == ("task.train_size=0 streams fresh training examples, and task 'addition' draws no single "
                              "example (it defines no example_of_length); give task.train_size > 0")


def test_length_per_batch_needs_a_stream():
    with pytest.raises(ValueError, match="task.length_per_batch=true draws one length per step of a stream"):
        create("reverse_string", length_per_batch=True)

