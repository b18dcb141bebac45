"""`debug` makes every built-in experiment small: a tiny model for 30 steps (configs/overlay/debug.yaml)
on a little data, cut by each task config's `for_debug()` before any of it is generated or read."""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.api import registry
from relpos_lab.config import load_config
from relpos_lab_tasks.lm.task import LMConfig
from relpos_lab_tasks.synthetic import LengthsConfig
from relpos_lab_tasks.translation.corpora import read_hf
from relpos_lab_tasks.translation.task import TranslationConfig

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parent.parent / "configs" / "experiment").glob("*.yaml"))
# Fixed caps, not the tasks' constants: a debug run that grows past them fails here.
MAX_STEPS, MAX_EVAL_LENGTHS, MAX_PER_LENGTH, MAX_TRAIN = 30, 9, 16, 2000
MAX_LM_EVAL_TOKENS, MAX_EVAL_SENTENCES = 2048, 64


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_debug_makes_every_experiment_small(name):
    cfg = load_config(name, ["debug"])
    assert cfg.debug is True and cfg.trainer.max_steps <= MAX_STEPS and cfg.model.d_model <= 16
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.devices == 1 and cfg.data.num_workers == 0
    task_cfg = OmegaConf.to_object(cfg.task)
    if isinstance(task_cfg, LengthsConfig):  # the data the run makes: cheap to make here, now
        task = registry.create_task(task_cfg, seed=0)
        for split in ("valid", "test"):  # a few lengths spanning the split's range
            lengths, (lo, hi) = task.length_buckets(split), task.lengths(split)
            assert len(lengths) <= MAX_EVAL_LENGTHS and {lo, hi} <= set(lengths), (split, lengths)
            assert len(task.dataset(split)) <= MAX_EVAL_LENGTHS * MAX_PER_LENGTH
        train = task.dataset("train")
        assert isinstance(train, list) and len(train) <= MAX_TRAIN or task_cfg.train_size == 0  # 0: a stream
    elif isinstance(task_cfg, LMConfig):
        assert 0 < task_cfg.eval_tokens <= MAX_LM_EVAL_TOKENS
    elif isinstance(task_cfg, TranslationConfig):
        assert 0 < task_cfg.eval_sentences <= MAX_EVAL_SENTENCES and 0 < task_cfg.train_sentences <= MAX_TRAIN
    else:
        pytest.fail(f"{name}: no cap known for {type(task_cfg).__name__}")


def test_without_debug_the_data_is_the_experiments():
    cfg = load_config("deletang2023_chomsky", [])
    assert cfg.debug is False and cfg.task.eval_size_per_length == 128 and cfg.task.eval_length_step == 1
    assert load_config("shaw2018_base_relative", []).task.train_sentences == 0


def test_a_capped_hf_split_streams_only_its_first_rows(monkeypatch):
    """WMT14's 4.5M training pairs would be downloaded whole: debug streams the first few."""
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append(streaming)
        return iter([{"translation": {"en": f"a{i}", "de": f"b{i}"}} for i in range(10)])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    text = read_hf("wmt14", "de-en", "train", "en", "de", limit=3)
    assert (text.src, calls, text.origin) == (["a0", "a1", "a2"], [True], "wmt14/de-en[train] (first 3)")
    assert len(read_hf("wmt14", "de-en", "train", "en", "de")) == 10 and calls[-1] is False


def test_the_encoder_only_deletang_example_finishes_at_once_and_says_each_validation(tmp_path, monkeypatch, capsys):
    """It ran 6 minutes in silence: every length 41-500, 128 examples each, and no progress."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "deletang2023_chomsky", "task.name=reverse_string", "model.architecture=encoder_only",
                     "debug", "logging.wandb.mode=disabled"]) == 0
    out = capsys.readouterr().out
    assert "step 15/30 valid  exact_match " in out and "step 30/30 valid  exact_match " in out
    (results,) = tmp_path.glob("runs/deletang2023_chomsky/*/results.json")
    by_length = json.loads(results.read_text())["by_length"]["test"]
    assert len(by_length) <= MAX_EVAL_LENGTHS and {"41", "500"} <= set(by_length)
    assert all(row["n"] <= MAX_PER_LENGTH for row in by_length.values())
