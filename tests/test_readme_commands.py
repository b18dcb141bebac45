"""Every config a command in README or the guides names exists: `configs/...yaml` paths, experiment and
sweep names, GROUP=NAME selections, overlays and `extends:` entries (pages: tests/docs_text.py).

README's 'Submit a run' once used configs/experiment/reverse_shaw_gpu.yaml, which never existed.
What the pages' own commands create (`cp configs/cluster/example.yaml configs/cluster/mysite.yaml`)
exists once they ran, so the test runs those first, in an empty directory; a file a page shows the
user writing (a code block or comment that starts `# mine.yaml`) is the user's.
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from relpos_lab.config.find import find_config, find_extended, find_in_group, is_name
from relpos_lab.config.load import OVERLAY, sections

import docs_text

REPO = Path(__file__).resolve().parents[1]
DOCS = docs_text.text()  # README.md, CONTRIBUTING.md and docs/**/*.md
VERBS = ("train", "config", "submit", "sweep")  # the verbs whose first argument is a config
FLAGS = ("--dry-run", "--slurm", "--list", "--reuse")  # options without a value


def commands() -> list[tuple[str, list[str]]]:
    """(verb, arguments) of every `relpos-lab VERB ...` in the pages, prose and code alike."""
    found = []
    for match in re.finditer(rf"relpos-lab ({'|'.join(VERBS)})((?: +[^\s`#()]+)*)", DOCS):
        found.append((match.group(1), match.group(2).split()))
    return found


def copied() -> list[tuple[str, str]]:
    return re.findall(r"\bcp (configs/\S+\.yaml) (configs/\S+\.yaml)", DOCS)


def users_files() -> set[str]:
    return set(re.findall(r"#\s+([\w.-]+\.yaml)\b", DOCS))


@pytest.fixture
def clone(tmp_path, monkeypatch) -> Path:
    """An empty working directory after the pages' own cp commands."""
    monkeypatch.chdir(tmp_path)
    for source, target in copied():
        (tmp_path / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / source, tmp_path / target)
    return tmp_path


def test_readme_has_the_commands_this_test_reads():
    verbs = {verb for verb, _ in commands()}
    assert verbs == set(VERBS) and len(commands()) > 20
    assert copied() == [("configs/cluster/example.yaml", "configs/cluster/mysite.yaml")]
    assert {"mine.yaml", "shift.yaml", "reverse_shaw_gpu.yaml"} <= users_files()


def test_every_configs_path_in_readme_exists(clone):
    paths = set(re.findall(r"\bconfigs/[a-z0-9_./-]+\.yaml\b", DOCS))
    assert "configs/experiment/reverse_shaw.yaml" in paths
    made = {target for _, target in copied()}
    missing = sorted(p for p in paths if p not in made and not (REPO / p).is_file())
    assert not missing, f"the docs name configs that do not exist: {missing}"


def test_every_config_a_readme_command_names_exists(clone):
    groups, users = set(sections()), users_files()
    missing, checked = [], 0
    for verb, args in commands():
        words, skip = [], False
        for word in args:  # drop options and their values
            if skip and not word.startswith("-") and "=" not in word:
                skip = False
                continue
            skip = word.startswith("--") and word not in FLAGS
            if not word.startswith("-"):
                words.append(word)
        if not words:
            continue
        first, rest = words[0], words[1:]
        if first.startswith("configs/"):  # a path in the clone, the repository here
            checked += 1
            if not (REPO / first).is_file() and not (clone / first).is_file():
                missing.append(f"relpos-lab {verb} {first}: no such file")
        elif "<" not in first and first not in users and is_name(first):
            try:
                find_config(first, "sweep" if verb == "sweep" else "experiment")
                checked += 1
            except Exception as err:  # noqa: BLE001 - reported below, all at once
                missing.append(f"relpos-lab {verb} {first}: {err}")
        for word in rest:
            key, eq, value = word.partition("=")
            if eq and key in groups and is_name(value):
                group, name = key, value
            elif not eq and is_name(word) and word not in users:
                group, name = OVERLAY, word
            else:
                continue
            checked += 1
            if find_in_group(group, name) is None:
                missing.append(f"relpos-lab {verb} ... {word}: no configs/{group}/{name}.yaml")
    assert not missing, "commands in the docs name configs that do not exist:\n" + "\n".join(missing)
    assert checked > 20


def test_every_extends_entry_in_readme_resolves_from_a_users_file(clone):
    lines = [line.split("#")[0].strip() for line in re.findall(r"^extends: (.+)$", DOCS, re.MULTILINE)]
    entries = [e.strip() for line in lines for e in line.strip("[]").split(",")]
    assert "configs/cluster/mysite.yaml" in entries and "trainer/gpu.yaml" in entries
    for entry in entries:
        assert find_extended(entry, clone / "mine.yaml").is_file(), entry
