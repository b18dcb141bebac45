"""The Markdown pages users and contributors read, for the tests that check what those pages show.

README.md is the front door; the guides live in docs/ and the layout in CONTRIBUTING.md. A test
that runs an example or checks a command finds it by its content in any of these pages, so a
block that moves from one page to another is still tested.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^( *)```([\w-]*)\n(.*?)^\1```", re.S | re.M)  # a fence may be indented (in a list)


class Block(NamedTuple):
    page: str  # relative to the repository, e.g. docs/tasks.md
    lang: str  # the fence's info string ("" when none)
    text: str  # the lines between the fences, each ending in a newline, the fence's indent removed


def pages() -> list[Path]:
    """README.md, CONTRIBUTING.md and every page under docs/, in that order."""
    return [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md"))]


def text() -> str:
    """Every page's text, one after the other."""
    return "\n".join(page.read_text() for page in pages())


def blocks(lang: str | None = None) -> list[Block]:
    """The fenced code blocks of every page (only those whose info string is `lang`, if given)."""
    found = []
    for page in pages():
        for match in FENCE.finditer(page.read_text()):
            indent, info, body = match.groups()
            if lang is None or info == lang:
                body = "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))
                found.append(Block(str(page.relative_to(REPO)), info, body))
    return found


def block(start: str) -> Block:
    """The one fenced block, on whichever page, whose text starts with `start`."""
    matching = [b for b in blocks() if b.text.startswith(start)]
    assert matching, f"no page has a code block starting with {start!r}"
    assert len(matching) == 1, f"several code blocks start with {start!r}: {[b.page for b in matching]}"
    return matching[0]


def page_with(marker: str) -> str:
    """The text of the one page that holds `marker`."""
    holding = [page for page in pages() if marker in page.read_text()]
    assert len(holding) == 1, f"{marker!r} is on {len(holding)} pages: {[str(p) for p in holding]}"
    return holding[0].read_text()
