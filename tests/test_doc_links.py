"""README is a front door: short, and every guide in docs/ is reachable from it. Every relative link in
README.md, CONTRIBUTING.md and every page under docs/ (the guides, docs/design.md, the developer's and
the studies' pages, and the reports under studies/ they link to) leads to a file, and a link to a
heading (`page.md#anchor`) to a heading that exists, so moving a file or a section cannot leave a dead
link behind. docs/ holds pages: what a study measured lives in studies/, so docs/ stays small."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import docs_text

REPO = docs_text.REPO
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").rglob("*.md")),
         *sorted((REPO / "studies").rglob("*.md"))]
DOCS_LIMIT_BYTES = 5 * 2**20
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lowercase, punctuation dropped, spaces as hyphens."""
    text = docs_text.FENCE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#+ (.+)$", text, re.M)}


def links(page: Path) -> list[str]:
    return [m.group(1) for m in LINK.finditer(docs_text.FENCE.sub("", page.read_text()))
            if not m.group(1).startswith(("http://", "https://", "mailto:"))]


def test_the_readme_is_a_front_door_of_at_most_300_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_the_readme_links_every_guide_and_contributing():
    linked = {(REPO / link.partition("#")[0]).resolve() for link in links(REPO / "README.md")}
    guides = [page for page in PAGES if page.parent.name == "docs"]
    assert len(guides) >= 10
    missing = [str(page.relative_to(REPO)) for page in [*guides, REPO / "CONTRIBUTING.md"]
               if page.resolve() not in linked]
    assert not missing, f"README does not link {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_leads_to_a_file_and_heading(page):
    dead = []
    for link in links(page):
        target, _, anchor = link.partition("#")
        path = (page.parent / target) if target else page
        if not path.exists():
            dead.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            dead.append(f"{link}: no heading with that anchor")
    assert not dead, f"{page.relative_to(REPO)}: " + "; ".join(dead)


def test_the_design_is_cited_where_it_lives():
    """The design document is docs/design.md, in the repository: no page, module or test cites the
    one that used to live outside it, which no reader of the repository could open."""
    old = "DESIGN" + ".md"
    files = [*PAGES, *sorted((REPO / "relpos_lab").rglob("*.py")), *sorted((REPO / "tests").rglob("*.py"))]
    citing = [str(path.relative_to(REPO)) for path in files if old in path.read_text()]
    assert not citing, f"{', '.join(citing)} cite {old}: point them to docs/design.md"
    assert (REPO / "docs" / "design.md").resolve() in {
        (REPO / link.partition("#")[0]).resolve() for link in links(REPO / "CONTRIBUTING.md")}


def test_docs_holds_pages_under_5_mb():
    """docs/ is the pages and the figures they show; runs, CSVs and reports go in studies/<name>/."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "docs"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files of docs/ are unknown")
    files = [REPO / name for name in listed.decode().split("\0") if name]
    sizes = {f: f.lstat().st_size for f in files if f.is_symlink() or f.exists()}
    total = sum(sizes.values())
    largest = sorted(sizes, key=sizes.get, reverse=True)[:5]
    assert total < DOCS_LIMIT_BYTES, (
        f"docs/ holds {total / 2**20:.1f} MB of tracked files (limit 5 MB); the largest: "
        + ", ".join(f"{f.relative_to(REPO)} ({sizes[f] / 2**20:.1f} MB)" for f in largest)
        + ": move study outputs to studies/<name>/")
