"""Config loading: schema defaults, extends, overrides, and one-line errors for bad input."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab.api.errors import ConfigError
from relpos_lab.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ALL_YAML = sorted(CONFIGS.rglob("*.yaml"))
EXPERIMENTS = sorted((CONFIGS / "experiment").glob("*.yaml"))


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def error_of(path: Path, overrides: list[str] = ()) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    message = str(info.value)
    assert "\n" not in message
    return message


# --- the shipped configs -------------------------------------------------------------------------


def test_configs_directory_has_the_main_experiments():
    assert {p.name for p in EXPERIMENTS} >= {"reverse_shaw.yaml", "copy_shaw.yaml"}


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONFIGS)))
def test_every_config_file_validates_against_the_schema(path: Path):
    if path.parent.name == "experiment":
        cfg = load_config(path)
        assert OmegaConf.missing_keys(cfg) == set()
    elif path.parent.name == "sweep":  # every grid point is a whole experiment: each axis label checked once
        from relpos_lab.launch.sweep import load_sweep

        sweep = load_sweep(path, only=0)
        covering = {next(p.index for p in sweep.points if p.labels[axis] == label)
                    for axis in sweep.axes for label in dict.fromkeys(p.labels[axis] for p in sweep.points)}
        for index in sorted(covering):
            assert OmegaConf.missing_keys(sweep.config(index)) == set()
    else:  # shared pieces (model/, trainer/, ...) are partial experiments
        load_config(path, partial=True)


@pytest.mark.parametrize("path", sorted((CONFIGS / "sweep").glob("*.yaml")), ids=lambda p: p.name)
def test_every_point_of_every_sweep_validates_and_has_its_own_run_directory(path: Path):
    from relpos_lab.launch.sweep import load_sweep

    assert load_sweep(path).points  # load_sweep refuses two points with one run directory


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: p.name)
def test_every_experiment_starts_with_the_command_that_runs_it(path: Path):
    first = path.read_text().splitlines()[0]  # paper-scale experiments are cluster jobs: submit
    assert first in (f"# relpos-lab {verb} configs/experiment/{path.name}" for verb in ("train", "submit"))


@pytest.mark.parametrize("path", sorted((CONFIGS / "sweep").glob("*.yaml")), ids=lambda p: p.name)
def test_every_sweep_starts_with_the_command_that_runs_it(path: Path):
    first = path.read_text().splitlines()[0]
    assert first.startswith(f"# relpos-lab sweep configs/sweep/{path.name}")


# --- composition ---------------------------------------------------------------------------------


def test_file_overrides_schema_defaults_and_command_line_overrides_file(tmp_path):
    path = write(tmp_path, "exp.yaml", "task: {name: reverse}\noptim: {lr: 0.01, warmup_steps: 7}\n")
    cfg = load_config(path, ["optim.lr=0.5", "task.test_lengths=[1,64]"])
    assert cfg.optim.lr == 0.5  # command line over file
    assert cfg.optim.warmup_steps == 7  # file over default
    assert tuple(cfg.optim.betas) == (0.9, 0.98)  # schema default
    assert list(cfg.task.test_lengths) == [1, 64]


def test_extends_lays_the_base_down_first_relative_to_the_extending_file(tmp_path):
    write(tmp_path, "pieces/model.yaml", "model: {d_model: 32, n_heads: 2}\n")
    write(tmp_path, "base/base.yaml", "extends: ../pieces/model.yaml\ntask: {name: copy}\nseed: 3\n")
    path = write(tmp_path, "exp/child.yaml", "extends: ../base/base.yaml\nseed: 5\n")
    cfg = load_config(path)
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.task.name, cfg.seed) == (32, 2, "copy", 5)


def test_name_defaults_to_the_experiment_file_stem(tmp_path):
    assert load_config(write(tmp_path, "my_exp.yaml", "task: {name: copy}\n")).name == "my_exp"
    assert load_config(write(tmp_path, "b.yaml", "name: given\ntask: {name: copy}\n")).name == "given"


def test_task_section_takes_the_chosen_tasks_defaults(tmp_path):
    cfg = load_config(write(tmp_path, "e.yaml", "task: {name: reverse, alphabet_size: 4}\n"))
    assert cfg.task.alphabet_size == 4 and list(cfg.task.train_lengths) == [1, 16]


def test_an_experiment_naming_another_kind_of_task_replaces_the_task_it_extends(tmp_path):
    write(tmp_path, "base.yaml", "task: {name: reverse, train_lengths: [1, 4]}\nseed: 3\n")
    cfg = load_config(write(tmp_path, "mt.yaml", "extends: base.yaml\ntask: {name: translation, corpus: tsv}\n"))
    assert cfg.task.name == "translation" and cfg.task.corpus == "tsv" and "train_lengths" not in cfg.task
    assert cfg.seed == 3  # everything but the task section still comes from the base
    # a task with the same config class keeps the options (a sweep over task.name relies on it)
    cfg = load_config(tmp_path / "base.yaml", ["task.name=copy"])
    assert cfg.task.name == "copy" and list(cfg.task.train_lengths) == [1, 4]


def test_interpolations_are_resolved(tmp_path):
    path = write(tmp_path, "e.yaml",
                 "task: {name: copy}\ntrainer: {max_steps: 300, val_every_n_steps: '${trainer.max_steps}'}\n")
    assert load_config(path).trainer.val_every_n_steps == 300


# --- errors: one line naming key, source and valid choices ---------------------------------------


def test_unknown_key_names_key_file_and_closest_valid_key(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: copy}\noptim: {lrr: 0.1}\n")
    message = error_of(path)
    assert "e.yaml" in message and "'optim.lrr'" in message
    assert "did you mean 'optim.lr'" in message and "warmup_steps" in message


def test_unknown_key_in_an_extended_file_names_that_file(tmp_path):
    write(tmp_path, "base.yaml", "trainer: {max_step: 10}\n")
    message = error_of(write(tmp_path, "e.yaml", "extends: base.yaml\ntask: {name: copy}\n"))
    assert message.startswith(str(tmp_path / "base.yaml")) or "base.yaml:" in message
    assert "did you mean 'trainer.max_steps'" in message


def test_a_removed_key_says_why_and_what_replaces_it(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: binary_addition, loss_per_example: true}\n")
    message = error_of(path)
    assert "e.yaml" in message and "'task.loss_per_example' was removed" in message
    assert "task.loss_on_padding=true" in message and "did you mean" not in message


def test_unknown_override_names_the_command_line(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\n"), ["model.d_modle=64"])
    assert message.startswith("command line:") and "did you mean 'model.d_model'" in message


def test_task_keys_are_checked_against_the_tasks_own_config(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: reverse, alphabet_sise: 4}\n"))
    assert "'task.alphabet_sise'" in message and "did you mean 'task.alphabet_size'" in message
    assert "train_lengths" in message


def test_wrong_type_names_key_and_file(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\ntrainer: {max_steps: many}\n"))
    assert "e.yaml" in message and "'trainer.max_steps'" in message and "many" in message


def test_value_outside_its_choices_suggests_the_closest(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\n"), ["trainer.precision=bf16"])
    assert message.startswith("command line:") and "did you mean 'bf16-mixed'" in message and "16-mixed" in message


def test_missing_task_lists_the_available_tasks(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "seed: 1\n"))
    assert "task.name" in message and "copy" in message and "reverse" in message


def test_misspelled_task_suggests_the_closest_task(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: revers}\n"))
    assert "e.yaml" in message and "unknown task 'revers'" in message
    assert "did you mean 'reverse'" in message and "copy" in message


def test_impossible_model_shape_is_a_config_error_naming_its_source(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: copy}\nmodel: {d_model: 30, n_heads: 4}\n")
    message = error_of(path)
    assert message.startswith(str(path.name)) or "e.yaml" in message
    assert "model.d_model=30 is not divisible by model.n_heads=4" in message


def test_task_validation_rejects_an_empty_length_range(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\n"), ["task.train_lengths=[5,2]"])
    assert message.startswith("command line:") and "task.train_lengths=[5, 2]" in message


def test_missing_config_file_is_one_line(tmp_path):
    assert "config file not found" in error_of(tmp_path / "nope.yaml")


def test_override_without_equals_sign_is_rejected(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\n"), ["optim.lr"])
    assert "key=value" in message


def test_circular_extends_is_reported(tmp_path):
    write(tmp_path, "a.yaml", "extends: b.yaml\n")
    write(tmp_path, "b.yaml", "extends: a.yaml\n")
    assert "circular extends" in error_of(tmp_path / "a.yaml")


def test_invalid_yaml_names_file_and_line(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "task: {name: copy}\noptim: [unclosed\n"))
    assert "e.yaml" in message and "line" in message


def test_a_section_given_as_a_value_in_one_file_and_a_mapping_in_another_is_reported(tmp_path):
    write(tmp_path, "base.yaml", "task: reverse\n")
    message = error_of(write(tmp_path, "e.yaml", "extends: base.yaml\ntask: {name: copy}\n"))
    assert "task" in message


def test_shared_pieces_are_validated_too(tmp_path):
    piece = write(tmp_path, "model/odd.yaml", "model: {d_model: 30, n_heads: 4}\n")
    with pytest.raises(ConfigError, match="odd.yaml: model.d_model=30 is not divisible"):
        load_config(piece, partial=True)


# --- what each key means: attribute docstrings, shown by --help-keys and in unknown-key errors ---

def _sections(cls, prefix=""):
    """Every (dotted path, dataclass) of a config tree."""
    from relpos_lab.config.help import subsections

    yield prefix, cls
    for name, section in subsections(cls).items():
        yield from _sections(section, f"{prefix}.{name}".lstrip("."))


def test_every_key_of_every_shipped_schema_says_what_it_means():
    import dataclasses

    from relpos_lab.api import registry
    from relpos_lab.config import ExperimentConfig
    from relpos_lab.config.help import field_help

    roots = [("", ExperimentConfig)] + [("task", registry.get_task_class(n).config_class)
                                        for n in ("reverse", "duplicate", "translation")]
    for root, cls in roots:
        for path, section in _sections(cls, root):
            helps = field_help(section)
            missing = [f.name for f in dataclasses.fields(section) if not helps.get(f.name)]
            assert not missing, f"{path or 'top level'} ({section.__name__}): no help for {missing}"


def test_field_help_reads_attribute_docstrings_and_metadata_and_subclasses_override():
    from dataclasses import dataclass, field

    from relpos_lab.config.help import field_help

    @dataclass
    class Base:
        width: int = 4
        """how wide"""
        depth: int = field(default=2, metadata={"help": "how deep"})
        plain: int = 0

    @dataclass
    class Child(Base):
        width: int = 8
        """how wide, doubled"""

    assert field_help(Base) == {"width": "how wide", "depth": "how deep"}
    assert field_help(Child) == {"width": "how wide, doubled", "depth": "how deep"}


def test_an_unknown_key_error_says_what_the_suggested_key_means(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("task: {name: reverse}\nmodel: {n_head: 4}\n")
    with pytest.raises(ConfigError, match=r"did you mean 'model.n_heads' \(attention heads per layer; must divide "
                                          r"d_model\)\?"):
        load_config(path)


def test_help_keys_of_the_positions_follow_the_scheme_chosen_on_the_command_line(capsys):
    from relpos_lab import cli

    assert cli.main(["config", "--help-keys", "model.positions", "model.positions.scheme=rope"]) == 0
    out = capsys.readouterr().out
    assert "model.positions.rope_base" in out and "max_distance" not in out
    assert cli.main(["config", "reverse_shaw", "model.positions.scheme=alibi", "--help-keys", "model.positions"]) == 0
    assert "alibi:" in capsys.readouterr().out
    assert cli.main(["config", "--help-keys", "model.positions", "model.positions.scheme=rop"]) == 2
    assert "did you mean 'rope'?" in capsys.readouterr().err


def test_help_keys_lists_a_section_with_types_defaults_and_help(tmp_path, capsys):
    from relpos_lab import cli

    assert cli.main(["config", "--help-keys", "model.positions"]) == 0
    out = capsys.readouterr().out
    assert "model.positions.max_distance (int, default 16)\n    Shaw's clipping distance k: 2k+1 labels" in out
    assert cli.main(["config", "--help-keys", "task", "--task", "reverse"]) == 0
    out = capsys.readouterr().out
    assert "task.train_lengths (list[int], default [1, 16])" in out
    assert "task.decoding (section: relpos-lab config --help-keys task.decoding)" in out
    (tmp_path / "exp.yaml").write_text("task: {name: translation}\n")
    assert cli.main(["config", "--help-keys", "task.subword", str(tmp_path / "exp.yaml")]) == 0
    assert "task.subword.vocab_size (int, default 8000)" in capsys.readouterr().out
    assert cli.main(["config", "--help-keys", "model.postions"]) == 2
    assert "did you mean 'model.positions'?" in capsys.readouterr().err


# --- configs by name: ./configs first, then the ones shipped with the package ---------------------

SHIPPED = sorted(p for p in CONFIGS.glob("*/*.yaml"))


def resolved(capsys, *argv: str) -> str:
    from relpos_lab import cli

    assert cli.main(["config", *argv]) == 0
    return capsys.readouterr().out


def cli_error(capsys, *argv: str) -> str:
    from relpos_lab import cli

    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: ")
    return err


def test_the_shipped_configs_are_the_repositorys_configs_directory():
    from relpos_lab.config.find import shipped_root

    assert shipped_root().resolve() == CONFIGS


def test_an_experiment_is_found_by_name_from_an_empty_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shipped = resolved(capsys, str(CONFIGS / "experiment" / "reverse_shaw.yaml"))
    assert shipped.startswith("# run directory: runs/reverse_shaw/reverse-shaw-k16-")
    assert resolved(capsys, "reverse_shaw") == shipped
    assert resolved(capsys, "reverse_shaw.yaml") == shipped
    assert resolved(capsys, "reverse_shaw", "optim.lr=0.5") == resolved(
        capsys, str(CONFIGS / "experiment" / "reverse_shaw.yaml"), "optim.lr=0.5")
    assert list(tmp_path.iterdir()) == []


def test_a_misspelled_name_says_where_it_looked_and_what_was_meant(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "config", "revers_shaw")
    assert "config file not found: revers_shaw; no experiment named 'revers_shaw' in " in err
    assert f"{CONFIGS}/experiment/" in err and "did you mean 'reverse_shaw'?" in err
    err = cli_error(capsys, "sweep", "positions_revers", "--list")
    assert "sweep file not found: positions_revers" in err and "did you mean 'positions_reverse'?" in err
    assert "config file not found: sub/reverse_shaw.yaml" in cli_error(capsys, "config", "sub/reverse_shaw.yaml")


def test_a_local_config_comes_before_the_shipped_one_of_the_same_name(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "configs/experiment/reverse_shaw.yaml", "extends: copy_shaw.yaml\nseed: 7\n")
    write(tmp_path, "configs/model/shaw_small.yaml", "model: {d_model: 32}\n")
    cfg = load_config("reverse_shaw", ["model=shaw_small"])
    assert (cfg.task.name, cfg.seed, cfg.model.d_model) == ("copy", 7, 32)  # copy_shaw: shipped (no local one)
    assert cfg.model.n_encoder_layers == 2  # the shipped shaw_small, under the local one
    assert load_config("copy_shaw", ["model=shaw_small"]).model.d_model == 32


def test_extends_falls_back_to_the_shipped_configs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "mine.yaml", "extends: reverse_shaw.yaml\nname: reverse_shaw\noptim: {lr: 0.01}\n")
    write(tmp_path, "pieces.yaml", "extends: [model/shaw_small.yaml, ../trainer/cpu.yaml]\ntask: {name: copy}\n")
    shipped = load_config(CONFIGS / "experiment" / "reverse_shaw.yaml", ["optim.lr=0.01"])
    assert load_config("mine.yaml") == shipped
    pieces = load_config("pieces.yaml")
    assert (pieces.model.d_model, pieces.trainer.accelerator) == (64, "cpu")
    # A copy of a shipped experiment works as it is: its ../model/... entries fall back to the shipped ones.
    for name in ("reverse_shaw.yaml", "shaw2018_small_relative.yaml"):
        (tmp_path / name).write_text((CONFIGS / "experiment" / name).read_text())
        assert resolved(capsys, name) == resolved(capsys, str(CONFIGS / "experiment" / name))
    # A file of the same name beside the extending file wins.
    write(tmp_path, "reverse_shaw.yaml", "task: {name: duplicate}\n")
    assert load_config("mine.yaml").task.name == "duplicate"


def test_an_extends_entry_found_nowhere_names_both_places(tmp_path):
    message = error_of(write(tmp_path, "e.yaml", "extends: revers_shaw.yaml\n"))
    assert message.startswith("config file not found: ") and "(extended by " in message
    assert "nor among the shipped configs" in message and "did you mean 'reverse_shaw'?" in message
    message = error_of(write(tmp_path, "f.yaml", "extends: model/shaw_big.yaml\n"))
    assert "no model named 'shaw_big'" in message and "did you mean 'shaw_small'?" in message


def test_a_user_file_extending_a_shipped_experiment_with_a_group_on_the_command_line(tmp_path, monkeypatch, capsys):
    """The issue's example, from a directory outside the clone."""
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "mine.yaml", "extends: reverse_shaw.yaml\ntrainer: {max_steps: 50}\n")
    out = resolved(capsys, "mine.yaml", "model=shaw_small")
    assert out.startswith("# run directory: runs/mine/reverse-shaw-k16-") and "  max_steps: 50\n" in out


def test_a_group_on_the_command_line_lays_its_file_over_that_section_in_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config("shaw2018_small_relative", ["model=shaw_small"])
    assert (cfg.model.d_model, cfg.model.n_encoder_layers) == (64, 2)  # shaw_small's
    assert cfg.model.norm_first is True and cfg.task.max_tokens == 8192  # what shaw_small does not set stays
    assert load_config("reverse_shaw", ["model.d_model=32", "model=shaw_small"]).model.d_model == 64
    assert load_config("reverse_shaw", ["model=shaw_small.yaml", "model.d_model=32"]).model.d_model == 32
    gpu = load_config("reverse_shaw", ["trainer=gpu", "cluster=example"])
    assert (gpu.trainer.accelerator, gpu.trainer.devices, gpu.cluster.partition) == ("gpu", 4, "gpu")
    task = load_config("translation_gettext_shaw", ["task=translation_gettext"])
    assert task == load_config("translation_gettext_shaw")
    assert load_config("reverse_shaw", ["name=model", "seed=3"]).name == "model"  # keys that are no group


def test_a_group_selection_that_does_not_fit_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "config", "reverse_shaw", "model=shaw_smal")
    assert "command line: model=shaw_smal: no model named 'shaw_smal' in " in err
    assert f"{CONFIGS}/model/" in err and "did you mean 'shaw_small'?" in err
    assert "no optim named 'adam'" in cli_error(capsys, "config", "reverse_shaw", "optim=adam")
    assert "'model' must be a mapping" in cli_error(capsys, "config", "reverse_shaw", "model=3")  # as before
    write(tmp_path, "configs/model/odd.yaml", "model: {d_model: 30}\n")
    err = cli_error(capsys, "config", "reverse_shaw", "model=odd")
    assert "configs/model/odd.yaml: model.d_model=30 is not divisible by model.n_heads=4" in err  # its provenance
    write(tmp_path, "configs/model/greedy.yaml", "model: {d_model: 32}\noptim: {lr: 0.1}\n")
    err = cli_error(capsys, "config", "reverse_shaw", "model=greedy")
    assert "configs/model/greedy.yaml: selected by model=greedy on the command line, it may set only 'model'" in err


def test_an_invalid_combination_is_blamed_on_the_source_that_made_it_invalid(tmp_path, monkeypatch, capsys):
    """n_heads=5 on the command line used to be blamed on configs/model/shaw_small.yaml, where
    the (valid) d_model=64 comes from; the last source merged leads, the others are named after."""
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "config", "reverse_shaw", "model.n_heads=5")
    assert err == ("relpos-lab: error: command line: model.d_model=64 is not divisible by model.n_heads=5; "
                   f"pick n_heads from [1, 2, 4, 8, 16, 32] (model.d_model: from {CONFIGS}/model/shaw_small.yaml)\n")
    err = cli_error(capsys, "config", "reverse_shaw", "model.n_heads=3", "model.d_model=32")
    assert err.startswith("relpos-lab: error: command line: model.d_model=32 is not divisible by model.n_heads=3;")
    assert err.endswith("pick n_heads from [1, 2, 4, 8, 16, 32]\n")  # both keys from the command line


def test_a_bad_position_option_names_its_full_key_and_source(tmp_path, monkeypatch, capsys):
    """max_distance=-1 used to be reported as `config: positions.max_distance` (no model., no source)."""
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "config", "reverse_shaw", "model.positions.max_distance=-1")
    assert err == ("relpos-lab: error: command line: model.positions.max_distance=-1 must be >= 0: it is the "
                   "clipping distance k (the paper uses 16; 0 ignores relative positions)\n")
    path = write(tmp_path, "e.yaml", "extends: reverse_shaw.yaml\nmodel: {positions: {scheme: rope, per_head: true}}\n")
    assert error_of(path).startswith("e.yaml: model.positions.per_head=true is a field of scheme 'shaw', not of 'rope'")


def test_t5_buckets_too_few_for_an_encoder_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """t5_num_buckets=2 used to pass validation and raise ZeroDivisionError in the first encoder layer."""
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "train", "reverse_shaw", "model.positions.scheme=t5_bias",
                    "model.positions.t5_num_buckets=2")
    assert err == ("relpos-lab: error: command line: model.positions.t5_num_buckets=2 is too few: set it to 4 or more "
                   "(bidirectional attention, an encoder's or a bidirectional prefix's, keeps num_buckets // 4 = 0 "
                   "exact distances per direction, and needs 1)\n")
    assert not any(tmp_path.iterdir())
    cfg = load_config("reverse_shaw", ["model.positions.scheme=t5_bias", "model.positions.t5_num_buckets=4",
                                       "model.positions.t5_max_distance=3"])
    assert (cfg.model.positions.t5_num_buckets, cfg.model.positions.t5_max_distance) == (4, 3)


def test_the_debug_overlay_makes_any_experiment_tiny_and_keeps_its_task(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("reverse_shaw", "translation_gettext_shaw", "shaw2018_base_relative"):
        full, debug = load_config(name), load_config(name, ["debug"])
        assert (debug.model.d_model, debug.model.n_encoder_layers, debug.trainer.max_steps) == (16, 1, 30)
        assert ((debug.trainer.devices, debug.trainer.enable_progress_bar, debug.logging.wandb.mode)
                == (1, False, "offline"))
        assert debug.model.positions == full.model.positions  # the task too, with its data cut small:
        assert debug.task == OmegaConf.structured(OmegaConf.to_object(full.task).for_debug())
    assert load_config("reverse_shaw", ["debug", "trainer.max_steps=5"]).trainer.max_steps == 5
    assert load_config("reverse_shaw", ["trainer.max_steps=5", "debug"]).trainer.max_steps == 30


def test_an_unknown_bare_word_is_neither_override_nor_overlay(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    err = cli_error(capsys, "config", "reverse_shaw", "debgu")
    assert "'debgu' is neither an override of the form key=value" in err and "did you mean 'debug'?" in err


def test_a_sweep_is_found_by_name_and_takes_an_overlay_after_its_options(tmp_path, monkeypatch, capsys):
    from relpos_lab import cli

    monkeypatch.chdir(tmp_path)
    write(tmp_path, "configs/sweep/mine.yaml", "experiment: reverse_shaw.yaml\ngrid: {seed: [1, 2]}\n")
    assert cli.main(["sweep", "mine", "--list", "--max-parallel", "1", "debug"]) == 0
    import json

    manifest = json.loads((tmp_path / "runs" / "mine" / "sweep.json").read_text())
    assert manifest["experiment"] == str(CONFIGS / "experiment" / "reverse_shaw.yaml")
    assert manifest["overrides"] == ["debug"] and len(manifest["points"]) == 2


def test_configs_lists_every_group_with_descriptions_local_ones_first(tmp_path, monkeypatch, capsys):
    from relpos_lab import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")

    def listing() -> str:
        assert cli.main(["configs"]) == 0
        return capsys.readouterr().out

    out = listing()
    rows = {tuple(cell.strip() for cell in line.split("│")[1:4]) for line in out.splitlines() if "│" in line}
    for path in SHIPPED:
        assert (path.parent.name, path.stem, "shipped") in rows
    assert "A tiny model trained for a few steps" in out  # overlay/debug.yaml's first comment line
    assert "relpos-lab train configs/experiment" not in out  # a command is no description
    write(tmp_path, "configs/experiment/reverse_shaw.yaml", "# My own reverse.\nextends: copy_shaw.yaml\n")
    lines = [line for line in listing().splitlines() if "│ reverse_shaw " in line]
    assert len(lines) == 2 and "local" in lines[0] and "My own reverse." in lines[0]
    assert "shipped (hidden by the local one)" in lines[1]


# --- position schemes: each validated against its own config class -----------------------------


def test_a_scheme_takes_only_its_own_fields(tmp_path):
    cfg = load_config(write(tmp_path, "e.yaml",
                            "task: {name: copy}\nmodel: {positions: {scheme: rope, rope_base: 500}}\n"))
    assert dict(cfg.model.positions) == {"scheme": "rope", "max_random_len": None, "randomize_at_eval": False,
                                         "redraw_per_layer": False, "random_distances": False, "rope_base": 500.0,
                                         "rope_fraction": 1.0,
                                         "rope_scaling": "none", "rope_scaling_factor": 0.0, "rope_train_length": 0,
                                         "yarn_beta_fast": 32.0, "yarn_beta_slow": 1.0}
    cfg = load_config(write(tmp_path, "s.yaml",
                            "task: {name: copy}\nmodel: {positions: {max_distance: 4, max_distance_left: 2}}\n"))
    assert cfg.model.positions.scheme == "shaw" and cfg.model.positions.max_distance_left == 2


def test_an_unknown_field_names_the_valid_fields_of_that_scheme(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: copy}\nmodel: {positions: {scheme: rope, rope_bse: 500}}\n")
    message = error_of(path)
    assert "unknown key 'model.positions.rope_bse'; did you mean 'model.positions.rope_base'" in message
    assert ("valid keys at 'model.positions' (scheme rope): scheme, max_random_len, randomize_at_eval, "
            "redraw_per_layer, random_distances, rope_base" in message)


def test_a_field_of_another_scheme_is_one_line_naming_its_scheme(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: copy}\nmodel: {positions: {scheme: rope, max_distance: 4}}\n")
    assert error_of(path) == (f"{path}: model.positions.max_distance=4 is a field of scheme 'shaw', not of 'rope'; "
                              "fields of rope: max_random_len, random_distances, randomize_at_eval, redraw_per_layer, "
                              "rope_base, "
                              "rope_fraction, rope_scaling, rope_scaling_factor, rope_train_length, yarn_beta_fast, "
                              "yarn_beta_slow "
                              "(`relpos-lab positions`)")


def test_an_invalid_scheme_value_and_an_unknown_scheme_are_one_line_each(tmp_path):
    path = write(tmp_path, "e.yaml", "task: {name: copy}\n")
    assert error_of(path, ["model.positions.max_distance=-1"]).startswith(
        "command line: model.positions.max_distance=-1 must be >= 0: it is the clipping distance k")
    message = error_of(path, ["model.positions.scheme=shw"])
    assert message.startswith("command line: model.positions.scheme: unknown position scheme 'shw'; "
                              "did you mean 'shaw'?")
    assert "(see `relpos-lab positions`)" in message


def test_switching_scheme_drops_the_fields_of_the_scheme_before(tmp_path):
    write(tmp_path, "base.yaml", "task: {name: copy}\nmodel: {positions: {scheme: shaw, max_distance: 4}}\n")
    cfg = load_config(write(tmp_path, "e.yaml", "extends: base.yaml\nmodel: {positions: {scheme: alibi}}\n"))
    unrandomized = {"max_random_len": None, "randomize_at_eval": False, "redraw_per_layer": False,
                    "random_distances": False}
    assert dict(cfg.model.positions) == {"scheme": "alibi", "left_offset": 0.0, **unrandomized}  # no max_distance
    none = load_config(tmp_path / "base.yaml", ["model.positions.scheme=none"]).model.positions
    assert dict(none) == {"scheme": "none", **unrandomized}


OLD_RUN_CONFIGS = sorted(Path(__file__).resolve().parents[1].glob("studies/*/runs/*/*/config.yaml"))


def test_resolved_configs_from_before_schemes_were_plugins_still_load_into_their_run_directories():
    """Committed runs' config.yaml hold every built-in scheme's fields at once (the old flat form);
    they load, and the run directory they name is still theirs (so they resume, and sweeps reuse them)."""
    from relpos_lab.records.rundir import run_directory

    assert len(OLD_RUN_CONFIGS) > 20
    schemes = set()
    for path in OLD_RUN_CONFIGS:
        raw = OmegaConf.load(path)
        cfg = load_config(path)
        assert run_directory(cfg).name == path.parent.resolve().name, path
        assert cfg.model.positions.scheme == raw.model.positions.scheme
        for key, value in cfg.model.positions.items():  # the scheme's own fields keep their values
            assert raw.model.positions.get(key, value) == value, (path, key)
        schemes.add(cfg.model.positions.scheme)
    assert {"shaw", "sinusoidal"} <= schemes


def test_tables_piped_without_a_terminal_are_not_cut_at_80_columns():
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-m", "relpos_lab", "positions"], capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, env=env).stdout
    from rich.cells import cell_len  # columns on screen: γ̂ is two code points in one column

    assert 80 < max(cell_len(line) for line in out.splitlines()) <= 160


def test_listings_piped_from_a_narrow_terminal_cut_nothing(monkeypatch, capsys):
    """`relpos-lab configs > file` (or `| less` at an 80-column terminal) cut 42 descriptions and
    class paths with "…": class paths and names stay whole, each config's
    description is its comment's whole first sentence, wrapped in its cell. (Captured, stdout is
    no terminal, as in a pipe.)"""
    from relpos_lab import cli
    from relpos_lab.api import registry

    monkeypatch.setenv("COLUMNS", "80")

    def listing(verb: str) -> str:
        assert cli.main([verb]) == 0
        out = capsys.readouterr().out
        assert "…" not in out, verb
        return out

    for verb, kind in (("tasks", registry.TASKS), ("positions", registry.POSITIONS)):
        out = listing(verb)
        for entry in registry.discover(kind):
            assert f"│ {entry.target} " in out, entry.target
    descriptions: dict[str, list[str]] = {}
    for line in listing("configs").splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if len(cells) == 4 and cells[0] != "group":
            if cells[1]:
                name = f"{cells[0]}/{cells[1]}"
            descriptions.setdefault(name, []).append(cells[3])
    assert " ".join(descriptions["cluster/example"]) == (
        "A site's SLURM settings: copy to configs/cluster/<site>.yaml, edit, and select it on the command line with "
        "cluster=<site> (or pull it into an experiment with `extends: [..., ../cluster/<site>.yaml]`); `relpos-lab "
        "submit CONFIG cluster=<site> --dry-run` shows the job.")
    assert " ".join(descriptions["experiment/shaw2018_base_absolute"]) == (  # "et al. 2018" ends no sentence
        "Shaw et al. 2018, Table 1, base model with absolute sinusoidal positions (paper: 26.5 BLEU on newstest2014): "
        "shaw2018_base_relative.yaml with the positions of \"Attention Is All You Need\".")
    assert " ".join(descriptions["sweep/positions_copy"]) == (  # the first sentence, not the line
        "The position-scheme study on copy: 11 schemes × 3 seeds, trained on lengths 1–16 and tested "
        "on 1–32.")
