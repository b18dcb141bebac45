"""Copy each report's summary table into docs/paper-reproduction.md (run.sh calls this).

The doc marks a table with `<!-- report: <table> -->` ... `<!-- /report -->`; the lines between
become the `| group | runs | ...` table of paper-reproduction/<table>/report.md, so the tables a
reader sees are the generated ones (tests/test_paper_reproduction.py checks that they are).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
DOC = HERE.parent / "paper-reproduction.md"
BLOCK = re.compile(r"(<!-- report: (\w+) -->\n)(.*?)(<!-- /report -->)", re.DOTALL)


def summary_table(table: str) -> str:
    """The summary table of a generated report: from its `| group | runs |` header to the blank line."""
    lines = (HERE / table / "report.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| group | runs |"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def synced(text: str) -> str:
    return BLOCK.sub(lambda m: m.group(1) + summary_table(m.group(2)) + m.group(4), text)


if __name__ == "__main__":
    DOC.write_text(synced(DOC.read_text()))
    sys.stdout.write(f"tables refreshed in {DOC}\n")
