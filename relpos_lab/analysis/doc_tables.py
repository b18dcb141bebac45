"""`relpos-lab tables DOC`: the summary tables of generated reports, kept current inside a Markdown
document, so that the numbers a reader sees are the ones `relpos-lab report` wrote."""
from __future__ import annotations

import re
from pathlib import Path

from relpos_lab.api.errors import UserError

TABLE_BLOCK = re.compile(r"(<!-- report: (\S+) -->\n)(.*?)(<!-- /report -->)", re.DOTALL)


def summary_table(report_dir: Path) -> str:
    """The summary table of a generated report: from its `| group | runs |` header to the blank line."""
    path = report_dir / "report.md"
    if not path.is_file():
        raise UserError(f"{path} not found: run `relpos-lab report` into {report_dir} first")
    lines = path.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("| group | runs |")), None)
    if start is None:
        raise UserError(f"{path} has no summary table (| group | runs | ...)")
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def refresh_tables(doc: str | Path) -> tuple[str, int]:
    """The text of Markdown file `doc` with each `<!-- report: DIR -->` ... `<!-- /report -->` block
    holding DIR/report.md's summary table (DIR relative to the doc), and the number of blocks: the
    tables a reader sees are the generated ones."""
    doc = Path(doc)
    text = doc.read_text()
    blocks = TABLE_BLOCK.findall(text)
    if not blocks:
        raise UserError(f"{doc} has no <!-- report: DIR --> ... <!-- /report --> block to refresh")
    return (TABLE_BLOCK.sub(lambda m: m.group(1) + summary_table(doc.parent / m.group(2)) + m.group(4), text),
            len(blocks))
