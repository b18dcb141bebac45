"""`debug` makes every built-in experiment small: a tiny model for 30 steps (configs/overlay/debug.yaml)
on a little data, cut by each task config's `for_debug()` before any of it is generated or read."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.api import registry
from relpos_lab.config import load_config
from relpos_lab_tasks.lm.task import DEBUG_TOKENS, LMConfig
from relpos_lab_tasks.synthetic import DEBUG_LENGTHS, DEBUG_PER_LENGTH, DEBUG_TRAIN, LengthsConfig
from relpos_lab_tasks.translation.task import DEBUG_SENTENCES, TranslationConfig

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).parent.parent / "configs" / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_debug_makes_every_experiment_small(name):
    cfg = load_config(name, ["debug"])
    assert cfg.debug is True and cfg.trainer.max_steps <= 30 and cfg.model.d_model <= 16
    task_cfg = OmegaConf.to_object(cfg.task)
    if isinstance(task_cfg, LengthsConfig):
        task = registry.create_task(task_cfg, seed=0)
        for split in ("valid", "test"):  # the lengths evaluated: a few
            lengths = task.length_buckets(split)
            assert len(lengths) <= DEBUG_LENGTHS + 1, (split, lengths)
        assert task_cfg.eval_size_per_length <= DEBUG_PER_LENGTH and task_cfg.train_size <= DEBUG_TRAIN
    elif isinstance(task_cfg, LMConfig):
        assert 0 < task_cfg.eval_tokens <= DEBUG_TOKENS
    elif isinstance(task_cfg, TranslationConfig):
        assert 0 < task_cfg.eval_sentences <= DEBUG_SENTENCES
    else:
        pytest.fail(f"{name}: no cap known for {type(task_cfg).__name__}")


def test_without_debug_the_data_is_the_experiments():
    cfg = load_config("deletang2023_chomsky", [])
    assert cfg.debug is False and cfg.task.eval_size_per_length == 128 and cfg.task.eval_length_step == 1


def test_the_encoder_only_delectang_example_finishes_at_once_and_says_each_validation(tmp_path, monkeypatch, capsys):
    """It ran 6 minutes in silence: every length 41-500, 128 examples each, and no progress."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", "deletang2023_chomsky", "task.name=reverse_string", "model.architecture=encoder_only",
                     "debug", "logging.wandb.mode=disabled"]) == 0
    out = capsys.readouterr().out
    assert "step 15/30 valid  exact_match " in out and "step 30/30 valid  exact_match " in out
    (results,) = tmp_path.glob("runs/deletang2023_chomsky/*/results.json")
    by_length = json.loads(results.read_text())["by_length"]["test"]
    assert len(by_length) <= DEBUG_LENGTHS + 1 and {"41", "500"} <= set(by_length)
    assert all(row["n"] <= DEBUG_PER_LENGTH for row in by_length.values())
