"""Task discovery through entry points: built-ins, a real third-party plugin, broken plugins."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

from relpos_lab.api import registry
from relpos_lab.api.errors import UserError

import docs_text

PLUGIN_DIST = "relpos-lab-throwaway-plugin"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250", "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


# --- discovery, with fake entry points -----------------------------------------------------------


def with_entry_points(monkeypatch, *extra: EntryPoint) -> None:
    real = registry.entry_points(group=registry.GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [*real, *extra])


def test_builtin_tasks_come_from_this_distributions_entry_points():
    entries = {e.name: e for e in registry.discover()}
    assert entries["reverse"].target == "relpos_lab_tasks.synthetic:ReverseTask"
    assert entries["copy"].distribution == "relpos-lab" and entries["copy"].error is None


def test_unknown_task_lists_available_tasks_and_the_closest():
    with pytest.raises(UserError, match=r"unknown task 'cpy'; did you mean 'copy'\? available tasks: .*reverse"):
        registry.get_task_class("cpy")


def test_a_plugin_that_fails_to_import_is_recorded_and_the_others_still_load(monkeypatch):
    with_entry_points(monkeypatch, EntryPoint("ghost", "no_such_module_xyz:Task", registry.GROUP))
    entries = {e.name: e for e in registry.discover()}
    assert "ModuleNotFoundError" in entries["ghost"].error and entries["ghost"].cls is None
    assert entries["reverse"].cls is not None
    with pytest.raises(UserError, match="task 'ghost' .* failed to load: ModuleNotFoundError"):
        registry.get_task_class("ghost")


def test_an_entry_point_that_is_not_a_task_is_rejected(monkeypatch):
    with_entry_points(monkeypatch, EntryPoint("notatask", "relpos_lab.api.errors:UserError", registry.GROUP))
    entry = {e.name: e for e in registry.discover()}["notatask"]
    assert "not a subclass of relpos_lab.api.Task" in entry.error


def test_two_plugins_claiming_one_name_is_reported(monkeypatch):
    with_entry_points(monkeypatch, EntryPoint("copy", "relpos_lab_tasks.synthetic:ReverseTask", registry.GROUP))
    assert "claimed by several plugins" in {e.name: e for e in registry.discover()}["copy"].error


# --- a real plugin distribution, pip-installed into this environment -------------------------------
# The plugin is the task guide's "Add a task" example (docs/tasks.md), read from the page itself: what
# users copy works.
BROKEN_DIST = "relpos-lab-throwaway-broken"
BROKEN_PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{BROKEN_DIST}"
version = "0.0.1"

[project.entry-points."relpos_lab.tasks"]
throwaway_broken = "relpos_throwaway_broken:BrokenTask"

[tool.setuptools]
py-modules = ["relpos_throwaway_broken"]
"""


def readme_block(first_line: str) -> str:
    """The fenced code block of the guides (docs/tasks.md, docs/positions.md) whose first line is `first_line`."""
    return docs_text.block(first_line + "\n").text


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """pip-install the task guide's plugin and a broken one (each its own distribution); uninstall after."""
    good, broken = tmp_path_factory.mktemp("plugin"), tmp_path_factory.mktemp("broken")
    (good / "pyproject.toml").write_text(readme_block("# pyproject.toml of your distribution"))
    (good / "my_tasks.py").write_text(readme_block("# my_tasks.py"))
    (broken / "pyproject.toml").write_text(BROKEN_PYPROJECT)
    (broken / "relpos_throwaway_broken.py").write_text('raise ImportError("this plugin is broken on purpose")\n')
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(good), str(broken)], check=True,
                   timeout=300, capture_output=True)
    try:
        yield good
    finally:
        subprocess.run([*pip, "uninstall", "-y", "my-tasks", BROKEN_DIST], check=True, timeout=300,
                       capture_output=True)


@pytest.mark.integration
def test_tasks_command_lists_builtins_the_plugin_and_the_broken_plugin(installed_plugin, tmp_path):
    out = run_cli("tasks", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for name in ("copy", "reverse", "shift", "throwaway_broken"):
        assert name in out.stdout
    assert "Replace every symbol by the next one" in out.stdout
    assert "failed to load: ImportError: this plugin is broken on purpose" in out.stdout


@pytest.mark.integration
def test_an_installed_plugins_keys_explain_themselves(installed_plugin, tmp_path):
    out = run_cli("config", "--help-keys", "task", "--task", "shift", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "task.alphabet_size (int, default 6)\n    symbols the strings are made of" in out.stdout
    (tmp_path / "typo.yaml").write_text("task: {name: shift, alphabet_sise: 3}\n")
    out = run_cli("config", "typo.yaml", cwd=tmp_path)
    assert "did you mean 'task.alphabet_size' (symbols the strings are made of)?" in out.stderr


@pytest.mark.integration
@pytest.mark.parametrize("architecture", ["encoder_decoder", pytest.param("decoder_only", marks=pytest.mark.slow)])
def test_an_installed_plugin_trains_through_the_cli_with_per_length_results(installed_plugin, tmp_path, architecture):
    """Unchanged plugin code, either model family (decoder_only: a prefix LM over its pairs)."""
    (tmp_path / "shift.yaml").write_text(readme_block("# shift.yaml"))  # extends the shipped reverse_shaw
    out = run_cli("train", "shift.yaml", "debug", f"model.architecture={architecture}", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs" / "shift").iterdir()
    data = json.loads((run_dir / "results.json").read_text())
    assert data["task"] == "shift" and data["train_lengths"] == [1, 6]
    assert sorted(data["by_length"]["test"], key=int) == [str(n) for n in range(1, 13)]
    for key in ("test/exact_match_id", "test/exact_match_ood", "test/token_accuracy_ood"):
        assert 0.0 <= data["metrics"][key] <= 1.0
    assert (run_dir / "plots" / "by_length_exact_match.png").is_file()


# --- a third-party position scheme: the scheme guide's "Add a position scheme", pip-installed ----


@pytest.fixture(scope="module")
def installed_scheme(tmp_path_factory):
    src = tmp_path_factory.mktemp("scheme")
    (src / "pyproject.toml").write_text(readme_block("# pyproject.toml of your scheme's distribution"))
    (src / "my_schemes.py").write_text(readme_block("# my_schemes.py"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(src)], check=True, timeout=300,
                   capture_output=True)
    try:
        yield src
    finally:
        subprocess.run([*pip, "uninstall", "-y", "my-schemes"], check=True, timeout=300, capture_output=True)


@pytest.mark.integration
def test_an_installed_scheme_is_listed_validated_and_trains(installed_scheme, tmp_path):
    out = run_cli("positions", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "distance_bias" in out.stdout and "A learned scalar bias per head" in out.stdout
    assert "max_distance=8" in out.stdout
    out = run_cli("config", "reverse_shaw", "model.positions.scheme=distance_bias", "model.positions.max_distanse=3",
                  cwd=tmp_path)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert ("did you mean 'model.positions.max_distance'" in out.stderr
            and "valid keys at 'model.positions' (scheme distance_bias): scheme, max_random_len, randomize_at_eval, "
                "redraw_per_layer, random_distances, max_distance" in out.stderr)
    out = run_cli("config", "reverse_shaw", "model.positions.scheme=distance_bias", "model.positions.max_distance=-2",
                  cwd=tmp_path)
    assert out.returncode == 2 and "model.positions.max_distance must be >= 0, got -2" in out.stderr
    command = readme_block("pip install -e .   # in your distribution's directory").splitlines()[-1].split()
    assert command[:3] == ["relpos-lab", "train", "reverse_shaw"]
    out = run_cli(*command[1:], "debug", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (run_dir,) = (tmp_path / "runs" / "reverse_shaw").iterdir()
    assert run_dir.name.startswith("reverse-distance_bias-")
    data = json.loads((run_dir / "results.json").read_text())
    assert 0.0 <= data["metrics"]["test/exact_match"] <= 1.0
    config = (run_dir / "config.yaml").read_text()
    assert "scheme: distance_bias" in config and "max_distance: 4" in config


def test_every_entry_point_pyproject_declares_names_a_current_class():
    """No built-in path loads through a renamed name's shim (it warns on every command that loads it)."""
    import importlib
    import tomllib
    import warnings
    from pathlib import Path

    declared = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]["entry-points"]
    targets = [target for group in declared.values() for target in group.values()]
    assert len(targets) > 20
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for target in targets:
            module, _, attr = target.partition(":")
            assert getattr(importlib.import_module(module), attr) is not None, target
