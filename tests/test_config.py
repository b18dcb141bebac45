"""Config loading: schema defaults, extends, overrides, and one-line errors for bad input."""
from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab.config import load_config
from relpos_lab.api.errors import ConfigError

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
    elif path.parent.name == "sweep":  # every grid point is a whole experiment
        from relpos_lab.launch.sweep import load_sweep

        assert load_sweep(path).points
    else:  # shared pieces (model/, trainer/, ...) are partial experiments
        load_config(path, partial=True)


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
    path = write(tmp_path, "e.yaml", "task: {name: copy}\ntrainer: {max_steps: 300, val_every_n_steps: '${trainer.max_steps}'}\n")
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
