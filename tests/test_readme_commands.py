"""Every config a command in README or the guides names exists: `configs/...yaml` paths, experiment and
sweep names, GROUP=NAME selections, overlays and `extends:` entries (pages: tests/docs_text.py); and
the README's tour runs, command by command.

README's 'Submit a run' once used configs/experiment/reverse_shaw_gpu.yaml, which never existed, and
its tour once submitted with `cluster=mysite`, which exists only after docs/slurm.md's copy step.
So each page holds on its own: a config a command needs is shipped, or made by a `cp` earlier on the
same page (`cp configs/cluster/example.yaml configs/cluster/mysite.yaml`), whose commands the test
runs in order in an empty directory of the page's own; a file a page shows the user writing (a code
block or comment that starts `# mine.yaml`) is the user's. A command marked `needs a site` in its
comment submits for real (sbatch): its `cluster=` file is the reader's site, and nothing runs it.
"""
from __future__ import annotations

import re
import shlex
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from relpos_lab import cli
from relpos_lab.config.find import find_config, find_extended, find_in_group, is_name
from relpos_lab.config.load import OVERLAY, sections

import docs_text

REPO = Path(__file__).resolve().parents[1]
PAGES = {str(page.relative_to(REPO)): page.read_text() for page in docs_text.pages()}
VERBS = ("train", "config", "submit", "sweep")  # the verbs whose first argument is a config
FLAGS = ("--dry-run", "--slurm", "--list", "--reuse")  # options without a value
NEEDS_A_SITE = "needs a site"  # in a command's comment: it submits to a real SLURM cluster


class Command(NamedTuple):
    at: int  # where in the page
    verb: str
    args: list[str]
    line: str  # the whole line it stands on


def commands(text: str) -> list[Command]:
    """Every `relpos-lab VERB ...` in a page, prose and code alike, in page order."""
    found = []
    for match in re.finditer(rf"relpos-lab ({'|'.join(VERBS)})((?: +[^\s`#()]+)*)", text):
        start, end = text.rfind("\n", 0, match.start()) + 1, text.find("\n", match.start())
        found.append(Command(match.start(), match.group(1), match.group(2).split(), text[start:end]))
    return found


def copied(text: str) -> list[tuple[int, str, str]]:
    """(where, source, target) of each `cp configs/... configs/...` in a page."""
    pattern = r"\bcp (configs/\S+\.yaml) (configs/\S+\.yaml)"
    return [(m.start(), m.group(1), m.group(2)) for m in re.finditer(pattern, text)]


def users_files(text: str) -> set[str]:
    return set(re.findall(r"#\s+([\w.-]+\.yaml)\b", text))


def needs_a_site(command: Command) -> bool:
    return NEEDS_A_SITE in command.line.partition(" # ")[2]


def submits(command: Command) -> bool:
    """Whether the command sends a job to SLURM rather than printing it."""
    slurm = command.verb == "submit" or (command.verb == "sweep" and "--slurm" in command.args)
    return slurm and "--dry-run" not in command.args


def config_words(args: list[str]) -> list[str]:
    """The arguments that name configs or overrides: options and their values dropped."""
    words, skip = [], False
    for word in args:
        if skip and not word.startswith("-") and "=" not in word:
            skip = False
            continue
        skip = word.startswith("--") and word not in FLAGS
        if not word.startswith("-"):
            words.append(word)
    return words


def replay(page: str, root: Path) -> Iterator[Command]:
    """The page's commands in order, each yielded once `root` (an empty clone directory) holds what
    the page has made by then: the copies earlier on it, none from another page."""
    text = PAGES[page]
    copies = [(at, (source, target)) for at, source, target in copied(text)]
    for _, step in sorted([(c.at, c) for c in commands(text)] + copies, key=lambda step: step[0]):
        if isinstance(step, Command):
            yield step
            continue
        source, target = step
        (root / target).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / source, root / target)


def missing_configs(command: Command, root: Path, users: set[str]) -> list[str]:
    """What `command` names that neither ships nor exists in `root` (the page's clone so far)."""
    groups, missing = set(sections()), []
    words = config_words(command.args)
    if not words:
        return []
    first, rest = words[0], words[1:]
    if first.startswith("configs/"):
        if not (REPO / first).is_file() and not (root / first).is_file():
            missing.append(f"relpos-lab {command.verb} {first}: no such file")
    elif "<" not in first and first not in users and is_name(first):
        try:
            find_config(first, "sweep" if command.verb == "sweep" else "experiment")
        except Exception as err:  # noqa: BLE001 - reported with the others
            missing.append(f"relpos-lab {command.verb} {first}: {err}")
    for word in rest:
        key, eq, value = word.partition("=")
        if eq and key in groups and is_name(value):
            group, name = key, value
        elif not eq and is_name(word) and word not in users:
            group, name = OVERLAY, word
        else:
            continue
        if group == "cluster" and needs_a_site(command):
            continue  # the reader's own site
        if find_in_group(group, name) is None:
            missing.append(f"relpos-lab {command.verb} ... {word}: no configs/{group}/{name}.yaml")
    return missing


def test_the_pages_hold_the_commands_this_test_reads():
    everything = "\n".join(PAGES.values())
    assert {c.verb for c in commands(everything)} == set(VERBS) and len(commands(everything)) > 20
    assert [(s, t) for _, s, t in copied(PAGES["docs/slurm.md"])] == [
        ("configs/cluster/example.yaml", "configs/cluster/mysite.yaml")]
    assert {"mine.yaml", "shift.yaml", "reverse_shaw_gpu.yaml"} <= users_files(everything)
    assert sum(needs_a_site(c) for c in commands(everything)) >= 9


@pytest.mark.parametrize("page", PAGES)
def test_every_config_a_command_names_exists_on_its_own_page(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # ./configs is where find_in_group looks first: the page's copies only
    users = users_files(PAGES[page])
    missing = [f"{page}: {m}" for command in replay(page, tmp_path) for m in missing_configs(command, tmp_path, users)]
    assert not missing, "commands in the docs name configs the page has not made:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", PAGES)
def test_every_configs_path_on_a_page_ships_or_is_copied_there_first(page):
    text = PAGES[page]
    made = {target: at for at, _, target in copied(text)}
    missing = sorted({m.group() for m in re.finditer(r"\bconfigs/[a-z0-9_./-]+\.yaml\b", text)
                      if not (REPO / m.group()).is_file() and made.get(m.group(), len(text)) > m.start()})
    assert not missing, f"{page} names configs that neither ship nor are copied on it first: {missing}"


def test_a_command_that_submits_for_real_is_marked_and_only_those():
    """Marked: what a reader without a cluster cannot run; unmarked: what runs anywhere."""
    wrong = [f"{page}: {c.line.strip()}" for page, text in PAGES.items() for c in commands(text)
             if "```" not in c.line and c.line.lstrip().startswith("relpos-lab") and needs_a_site(c) != submits(c)]
    assert not wrong, f"a fenced command that submits to SLURM says `# {NEEDS_A_SITE}`, no other:\n" + "\n".join(wrong)


def test_every_extends_entry_resolves_from_a_users_file_on_its_page(tmp_path):
    checked = 0
    for page, text in PAGES.items():
        root = tmp_path / page.replace("/", "_")
        root.mkdir()
        for _, source, target in copied(text):
            (root / target).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(REPO / source, root / target)
        for match in re.finditer(r"^extends: (.+)$", text, re.MULTILINE):
            made = {target for at, _, target in copied(text) if at < match.start()}
            for entry in (e.strip() for e in match.group(1).split("#")[0].strip().strip("[]").split(",")):
                path = find_extended(entry, root / "mine.yaml")
                assert path.is_file() and (root not in path.parents or str(path.relative_to(root)) in made), \
                    f"{page}: extends: {entry} resolves from neither the shipped configs nor a copy made earlier"
                checked += 1
    assert checked > 2


# --- the README's tour, run -----------------------------------------------------------------------

(TOUR,) = [b for b in docs_text.blocks("bash") if "# train a shipped experiment, by name" in b.text.partition("\n")[0]]
TINY = ["debug", "task.train_lengths=[1,4]", "task.valid_lengths=[1,4]", "task.test_lengths=[1,6]",
        "task.train_size=256", "task.eval_size_per_length=4", "logging.wandb.mode=disabled"]
"""Laid over each training command of the tour: conftest's tiny reverse run (any scheme), seconds on a CPU."""


def tour_commands() -> list[list[str]]:
    """The tour's commands as argv after `relpos-lab`, comments dropped, in order."""
    return [shlex.split(line.replace("<run>", "{run}"), comments=True) for line in TOUR.text.splitlines()
            if line.startswith("relpos-lab ")]


def as_run_here(argv: list[str], run: str | None) -> list[list[str]]:
    """What the test runs for one tour command: training made tiny (a sweep: its grid listed, which
    records the sweep, and its first point trained, which `report` then reads), `<run>` the first
    run's directory, SLURM's only as a dry run. A command that would submit for real fails here."""
    verb, *args = argv[1:]
    args = [a.format(run=run) for a in args]
    if verb == "train":
        return [[verb, *args, *TINY]]
    if verb == "sweep" and "--slurm" not in args:
        return [[verb, *args, "--list", *TINY], [verb, *args, "--point", "0", *TINY]]
    assert (verb != "submit" and "--slurm" not in args) or "--dry-run" in args, f"the tour submits: {argv}"
    return [[verb, *args]]


def test_the_readme_tour_runs_on_a_fresh_clone(tmp_path, monkeypatch, capsys):
    """Pasted line by line into a fresh clone (an empty directory here: every name it uses ships), each
    command exits 0: the tour uses no file that another page makes."""
    assert TOUR.page == "README.md" and len(tour_commands()) == 10
    monkeypatch.chdir(tmp_path)
    run = None
    for argv in tour_commands():
        for here in as_run_here(argv, run):
            capsys.readouterr()
            status = cli.main(here)
            out = capsys.readouterr()
            assert status == 0, f"relpos-lab {shlex.join(here)} exited {status}:\n{out.err[-2000:]}"
        if run is None and argv[1] == "train":
            (run,) = [p.name for p in (tmp_path / "runs" / argv[2]).iterdir()]
