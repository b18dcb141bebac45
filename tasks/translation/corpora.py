"""Reading parallel corpora: aligned plain-text files, TSV files, and Hugging Face datasets.

Preprocessed MT data (WMT, IWSLT) usually comes as two aligned files, one sentence per line
(``train.en`` / ``train.de``); small corpora often as one tab-separated file; public benchmarks
also through Hugging Face ``datasets`` (an optional extra: ``pip install -e ".[hf]"``, imported
only when used). Each reader returns a `ParallelText`: the sentence pairs and an account of what
was dropped, because silent data loss is the classic way for an MT result to be wrong.

Mistakes in the data are `UserError`s that name the file and the numbers: a missing file, two
"aligned" files with different line counts, a TSV line without exactly two fields, bytes that are
not UTF-8. A pair with an empty side (a blank line) cannot be trained on or scored; it is skipped,
counted, and reported with its line numbers — the one repair that is safe to make silently.
"""
from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from relpos_lab.api import UserError

SHOWN_LINES = 5  # line numbers quoted in a report


@dataclass
class ParallelText:
    """Sentence pairs of one split, with where they came from and what was skipped."""

    origin: str  # e.g. "data/train.en + data/train.de"
    src: list[str] = field(default_factory=list)
    tgt: list[str] = field(default_factory=list)
    empty_lines: list[int] = field(default_factory=list)  # 1-based lines skipped for an empty side

    def __len__(self) -> int:
        return len(self.src)

    def head(self, limit: int) -> ParallelText:
        """The first `limit` pairs (0: all)."""
        if not 0 < limit < len(self):
            return self
        return ParallelText(f"{self.origin} (first {limit})", self.src[:limit], self.tgt[:limit], self.empty_lines)

    def report(self) -> str:
        line = f"{self.origin}: {len(self)} sentence pairs"
        if self.empty_lines:
            shown = ", ".join(map(str, self.empty_lines[:SHOWN_LINES]))
            more = ", ..." if len(self.empty_lines) > SHOWN_LINES else ""
            line += f"; skipped {len(self.empty_lines)} with an empty side (line {shown}{more})"
        return line


def from_pairs(origin: str, pairs: Iterable[tuple[str, str]]) -> ParallelText:
    """Pairs (line 1, 2, ...) with surrounding whitespace removed; empty sides are skipped."""
    text = ParallelText(origin)
    for number, (src, tgt) in enumerate(pairs, start=1):
        src, tgt = src.strip(), tgt.strip()
        if not src or not tgt:
            text.empty_lines.append(number)
        else:
            text.src.append(src)
            text.tgt.append(tgt)
    if not text.src:
        raise UserError(f"{origin}: no sentence pairs (every line has an empty side)" if text.empty_lines
                        else f"{origin}: no sentence pairs (empty)")
    return text


def read_aligned(src_path: str | Path, tgt_path: str | Path) -> ParallelText:
    """Two files with one sentence per line, line i of one translating line i of the other."""
    src_path, tgt_path = Path(src_path), Path(tgt_path)
    missing = [str(p) for p in (src_path, tgt_path) if not p.is_file()]
    if missing:
        raise UserError(f"missing corpus file{'s' * (len(missing) > 1)}: {', '.join(missing)} "
                        f"(an aligned corpus is the pair {src_path} and {tgt_path})")
    src, tgt = _lines(src_path), _lines(tgt_path)
    if len(src) != len(tgt):
        raise UserError(f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: aligned files "
                        "must have the same number of lines (line i of one translates line i of the other)")
    return from_pairs(f"{src_path} + {tgt_path}", zip(src, tgt))


def read_tsv(path: str | Path) -> ParallelText:
    """One pair per line: source TAB target (no quoting; a tab cannot occur inside a sentence)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"missing corpus file: {path} (a TSV corpus has one 'source<TAB>target' pair per line)")
    pairs = []
    for number, line in enumerate(_lines(path), start=1):
        row = line.split("\t")
        if not line.strip():
            pairs.append(("", ""))  # a blank line: counted as a pair with empty sides
        elif len(row) != 2:
            raise UserError(f"{path}:{number}: expected 2 tab-separated fields (source, target), found {len(row)}")
        else:
            pairs.append((row[0], row[1]))
    return from_pairs(str(path), pairs)


def read_hf(name: str, config: str | None, split: str, src_lang: str, tgt_lang: str, *,
            limit: int = 0) -> ParallelText:
    """A split of a Hugging Face dataset: rows {"translation": {src_lang: ..., tgt_lang: ...}}
    (wmt14, iwslt2017, opus...) or with the two languages as columns. With a `limit`, its first
    `limit` rows, streamed (nothing else downloaded)."""
    try:
        import datasets
    except ImportError:
        raise UserError("task.corpus=hf needs the Hugging Face datasets library: "
                        'pip install -e ".[hf]" (or pip install datasets)') from None
    origin = f"{name}{'/' + config if config else ''}[{split}]"
    try:
        rows = datasets.load_dataset(name, config, split=split, streaming=limit > 0)
    except Exception as err:  # no network, unknown name or split: say which
        raise UserError(f"cannot load Hugging Face dataset {origin}: {type(err).__name__}: {err}") from None
    if limit:
        rows, origin = itertools.islice(rows, limit), f"{origin} (first {limit})"
    return from_hf_rows(origin, rows, src_lang, tgt_lang)


def from_hf_rows(origin: str, rows: Iterable[dict], src_lang: str, tgt_lang: str) -> ParallelText:
    def pairs():
        for number, row in enumerate(rows, start=1):
            pair = row.get("translation", row)
            if src_lang not in pair or tgt_lang not in pair:
                raise UserError(f"{origin} row {number} has no '{src_lang}' and '{tgt_lang}' fields "
                                f"(it has: {', '.join(map(str, pair))}); set task.src_lang / task.tgt_lang")
            yield pair[src_lang] or "", pair[tgt_lang] or ""

    return from_pairs(origin, pairs())


def _lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file, without line ends (only \\n ends a line, as in MT corpora)."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise UserError(f"{path}:{line}: not UTF-8 ({err.reason} at byte {err.start})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":  # the final newline ends the last line, it does not start one
        lines.pop()
    return lines
