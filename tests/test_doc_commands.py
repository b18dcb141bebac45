"""Every `relpos-lab VERB ...` command in a fenced block of README.md, CONTRIBUTING.md or docs/ parses
as `relpos-lab` reads it: the verb exists and its parser takes the flags and their values, and any
word argparse leaves over is an override (key=value or an overlay's name), as cli.main accepts.
`bench` is parsed by bench's own parser (`bench kernel` by kernel_static's). Nothing runs: a flag
renamed in the code fails here, not in a user's shell. Which configs the commands name is
tests/test_readme_commands.py.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex

import pytest

from relpos_lab import cli

import docs_text

NOT_SHELL = ("python", "toml", "yaml", "json")  # blocks whose lines are not shell commands
SEPARATORS = {"|", "||", "&&", ";", "&"}
REDIRECTS = {"<", ">", ">>", "2>", "&>"}
PLACEHOLDER = re.compile(r"<([A-Za-z][\w.-]*)>")  # <run>, <hash>: a word the reader fills in, not a redirection


def shell_words(line: str) -> list[list[str]]:
    """The simple commands of one shell line, as words: comments dropped, cut at pipes and `&&`,
    redirections and their targets left out. A placeholder (`runs/x/<run>/last.ckpt`) stays a word."""
    line = PLACEHOLDER.sub(r"{\1}", line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands, words, skip = [], [], False
    for token in lexer:
        if skip:
            skip = False
        elif token in SEPARATORS:
            commands.append(words)
            words = []
        elif token in REDIRECTS:
            skip = True
        else:
            words.append(token)
    return [c for c in [*commands, words] if c]


def fenced_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after `relpos-lab`) for every relpos-lab command in the pages' fenced blocks."""
    found = []
    for block in docs_text.blocks():
        if block.lang in NOT_SHELL:
            continue
        for n, line in enumerate(block.text.replace("\\\n", " ").splitlines(), 1):
            if "relpos-lab" not in line or line.lstrip().startswith("#"):
                continue
            try:
                commands = shell_words(line.removeprefix("$ "))
            except ValueError:  # not a shell line (unbalanced quotes): output, not a command
                continue
            for words in commands:
                while words and "=" in words[0] and not words[0].startswith("-"):
                    words = words[1:]  # VAR=value before the command
                if words and words[0].rsplit("/", 1)[-1] == "relpos-lab":
                    found.append((f"{block.page}: {line.strip()}", words[1:]))
    return found


COMMANDS = fenced_commands()


def parse(argv: list[str]) -> str | None:
    """None if `relpos-lab *argv` parses; else what argparse (or cli.main) would say."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args, extra = cli.build_parser().parse_known_args(argv)
            if args.verb == "bench":
                return parse_bench(args.bench_args)
    except SystemExit:
        return stderr.getvalue().strip().splitlines()[-1]
    words = [e for e in extra if not cli._is_override(e)]
    return f"unrecognized arguments: {' '.join(words)}" if words else None


def parse_bench(argv: list[str]) -> None:
    if argv[:1] == ["kernel"]:
        from relpos_lab.analysis import kernel_static

        kernel_static.parse(argv[1:])
        return None
    from relpos_lab.analysis import bench

    parser = argparse.ArgumentParser(prog="relpos-lab bench")
    bench.add_arguments(parser)
    parser.parse_args(argv)
    return None


def test_the_pages_hold_the_commands_this_test_parses():
    verbs = {argv[0] for _, argv in COMMANDS if argv}
    assert len(COMMANDS) > 50
    assert {"train", "config", "configs", "eval", "inspect", "sweep", "report", "submit", "bench", "positions",
            "translate", "generate"} <= verbs


def test_the_parser_here_refuses_what_relpos_lab_refuses():
    assert parse(["train", "reverse_shaw", "optim.lr=1e-3", "debug"]) is None
    assert parse(["eval", "x.ckpt", "--split", "test", "task.test_lengths=[1,48]"]) is None
    assert "unrecognized arguments: --bogus" in parse(["train", "reverse_shaw", "--bogus"])
    assert "invalid choice" in parse(["trian", "reverse_shaw"])
    assert "unrecognized arguments: --lenght" in parse(["bench", "attention", "--lenght", "512"])
    assert "--static" in parse(["bench", "kernel", "--sm", "90"])
    assert shell_words('echo "a b" | relpos-lab translate C --beam 1 > out.txt  # note') == [
        ["echo", "a b"], ["relpos-lab", "translate", "C", "--beam", "1"]]
    assert shell_words("relpos-lab eval runs/x/<run>/last.ckpt < in.txt") == [
        ["relpos-lab", "eval", "runs/x/{run}/last.ckpt"]]


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[where for where, _ in COMMANDS])
def test_every_fenced_relpos_lab_command_parses(where, argv):
    error = parse(argv)
    assert error is None, f"{where}\n  relpos-lab {shlex.join(argv)}: {error}"
