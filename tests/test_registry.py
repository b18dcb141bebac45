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
    assert "ModuleNotFoundError" in entries["ghost"].error and entries["ghost"].task_class is None
    assert entries["reverse"].task_class is not None
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

PLUGIN_MODULE = '''
"""A third-party task written against relpos_lab's public API only."""
from dataclasses import dataclass

import torch

from relpos_lab.api import Pair, Seq2SeqTask, TaskConfig, Vocabulary


@dataclass
class ShiftConfig(TaskConfig):
    alphabet_size: int = 6
    """symbols the strings are made of"""
    length: int = 4
    size: int = 128


class ShiftTask(Seq2SeqTask):
    """Replace every symbol by the next one in the alphabet."""

    config_class = ShiftConfig

    def build_vocab(self):
        return Vocabulary(str(i) for i in range(self.cfg.alphabet_size))

    def dataset(self, split):
        self.check_split(split)
        gen = torch.Generator().manual_seed(self.seed + self.splits.index(split))
        n = self.cfg.size if split == "train" else 16
        src = torch.randint(0, self.cfg.alphabet_size, (n, self.cfg.length), generator=gen)
        first = len(Vocabulary.SPECIALS)
        return [Pair(s + first, (s + 1) % self.cfg.alphabet_size + first) for s in src]
'''

PLUGIN_PYPROJECT = f'''
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{PLUGIN_DIST}"
version = "0.0.1"

[project.entry-points."relpos_lab.tasks"]
throwaway_shift = "relpos_throwaway_plugin:ShiftTask"
throwaway_broken = "relpos_throwaway_broken:BrokenTask"

[tool.setuptools]
py-modules = ["relpos_throwaway_plugin", "relpos_throwaway_broken"]
'''

PLUGIN_EXPERIMENT = """
task: {name: throwaway_shift, length: 3}
model: {d_model: 16, n_heads: 2, d_ff: 32, n_encoder_layers: 1, n_decoder_layers: 1, dropout: 0.0,
        attention_dropout: 0.0, positions: {scheme: shaw, max_distance: 2}}
data: {batch_size: 16, eval_batch_size: 16}
optim: {lr: 0.003, warmup_steps: 5}
trainer: {accelerator: cpu, max_steps: 16, val_every_n_steps: 8, num_sanity_val_steps: 0, log_every_n_steps: 4,
          enable_progress_bar: false, enable_model_summary: false}
logging: {root: runs, wandb: {mode: disabled}}
"""


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """Build and pip-install a throw-away plugin distribution; uninstall it afterwards."""
    src = tmp_path_factory.mktemp("plugin")
    (src / "pyproject.toml").write_text(PLUGIN_PYPROJECT)
    (src / "relpos_throwaway_plugin.py").write_text(PLUGIN_MODULE)
    (src / "relpos_throwaway_broken.py").write_text('raise ImportError("this plugin is broken on purpose")\n')
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", str(src)], check=True, timeout=300,
                   capture_output=True)
    try:
        yield src
    finally:
        subprocess.run([*pip, "uninstall", "-y", PLUGIN_DIST], check=True, timeout=300, capture_output=True)


@pytest.mark.integration
def test_tasks_command_lists_builtins_the_plugin_and_the_broken_plugin(installed_plugin, tmp_path):
    out = run_cli("tasks", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for name in ("copy", "reverse", "throwaway_shift", "throwaway_broken"):
        assert name in out.stdout
    assert "Replace every symbol by the next one" in out.stdout
    assert "failed to load: ImportError: this plugin is broken on purpose" in out.stdout


@pytest.mark.integration
def test_an_installed_plugins_keys_explain_themselves(installed_plugin, tmp_path):
    out = run_cli("config", "--help-keys", "task", "--task", "throwaway_shift", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "task.alphabet_size (int, default 6)\n    symbols the strings are made of" in out.stdout
    (tmp_path / "typo.yaml").write_text("task: {name: throwaway_shift, alphabet_sise: 3}\n")
    out = run_cli("config", "typo.yaml", cwd=tmp_path)
    assert "did you mean 'task.alphabet_size' (symbols the strings are made of)?" in out.stderr


@pytest.mark.integration
def test_an_installed_plugin_trains_through_the_cli(installed_plugin, tmp_path):
    (tmp_path / "shift.yaml").write_text(PLUGIN_EXPERIMENT)
    out = run_cli("train", "shift.yaml", cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (results,) = (tmp_path / "runs" / "shift").glob("*/results.json")
    data = json.loads(results.read_text())
    assert data["task"] == "throwaway_shift"
    assert 0.0 <= data["metrics"]["test/exact_match"] <= 1.0 and "by_length" not in data
