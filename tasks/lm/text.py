"""Where a language model's text comes from, read lazily: plain files, the built-in corpus, HF datasets.

A `TextSource` is a re-iterable stream of `Piece`s (a stretch of text and whether it ends a line),
never the whole text: a file is read in blocks through an incremental UTF-8 decoder, so memory
stays bounded by `BLOCK` + `MAX_CHARS` whatever the file's size or line lengths. A line longer than that is cut
at its last space before the limit (so SentencePiece does not see a word split in two), or at the limit.

The built-in corpus is the Python documentation's topic texts (`pydoc_data.topics`, the text
`help("if")` prints): about 465,000 characters of real English prose about the language, with
code examples, in 79 documents. It ships with every CPython (Debian's `libpython3.x-stdlib`,
installed with python3), needs no download and no root, and is three times the size of what
/usr/share/common-licenses offers (264 KB of largely repetitive legal text). Its exact text
depends on the Python version, so the data signature records the version and the text's sha256.
Documents are assigned to train / valid / test whole (builtin_splits), so no held-out document
was seen in part in training.
"""
from __future__ import annotations

import codecs
import hashlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from relpos_lab.api import UserError

MAX_CHARS = 4000  # SentencePiece skips training sentences over 4192 bytes; a piece stays below
BLOCK = 1 << 16  # bytes read at a time


class Piece(NamedTuple):
    text: str
    ends_line: bool  # an end-of-line token (EOS) follows this piece


def read_pieces(path: Path, max_chars: int = MAX_CHARS, block: int = BLOCK) -> Iterator[Piece]:
    """The pieces of one UTF-8 file, read `block` bytes at a time. Bad files are one-line `UserError`s
    (a decoding error names its byte offset and line)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise UserError(f"{path}: no such file; check the task's *_files paths") from None
    except OSError as err:
        raise UserError(f"{path}: cannot read ({err.strerror})") from None
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, line_no, buffer = 0, 1, ""
    with handle:
        while True:
            data = handle.read(block)
            pending = decoder.getstate()[0]
            try:
                buffer += decoder.decode(data, final=not data)
            except UnicodeDecodeError as err:
                at = offset - len(pending) + err.start
                line = line_no + err.object[: err.start].count(b"\n")
                raise UserError(f"{path}: not UTF-8 text at byte {at} (line {line}): {err.reason}; convert it, "
                                "e.g. iconv -f latin1 -t utf-8") from None
            offset += len(data)
            line_no += data.count(b"\n")
            lines = buffer.split("\n")
            buffer = lines.pop()  # the unfinished last line
            for line in lines:
                yield from _cut(line.removesuffix("\r"), max_chars, ends_line=True)
            if len(buffer) > max_chars:  # a line longer than a piece: send its beginning on
                *whole, buffer = _cut(buffer, max_chars, ends_line=False)
                yield from whole
                buffer = buffer.text
            if not data:
                if buffer:
                    yield from _cut(buffer, max_chars, ends_line=True)
                return


def _cut(text: str, max_chars: int, ends_line: bool) -> list[Piece]:
    """`text` as pieces of at most max_chars, cut after the last space before the limit (or at it);
    the last piece ends the line when `ends_line`."""
    pieces = []
    while len(text) > max_chars:
        cut = text.rfind(" ", 1, max_chars + 1) + 1 or max_chars
        pieces.append(Piece(text[:cut].rstrip(" "), False))
        text = text[cut:]
    pieces.append(Piece(text, ends_line))
    return pieces


@dataclass
class TextSource:
    """A named, re-iterable stream of pieces, and what identifies its text for the caches."""

    name: str  # e.g. "train: 2 files", shown in messages
    pieces: Callable[[], Iterator[Piece]]  # a fresh stream on every call
    identity: str  # changes whenever the text may have changed (cache key material)
    details: dict  # source, sizes, version: for the data signature

    def __iter__(self) -> Iterator[Piece]:
        return self.pieces()

    def lines(self) -> Iterable[str]:
        """A re-iterable view of the pieces' text (what the subword model is trained on)."""
        return _Texts(self)


class _Texts:
    def __init__(self, source: TextSource):
        self.source = source

    def __iter__(self) -> Iterator[str]:
        return (piece.text for piece in self.source)


def file_source(split: str, patterns: Sequence[str]) -> TextSource:
    """The concatenation of the files (paths or glob patterns, in the order given) of one split."""
    if not patterns:
        raise UserError(f"task.{split}_files is empty: corpus=files needs at least one text file for {split}")
    paths: list[Path] = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            found = sorted(Path().glob(pattern)) if not Path(pattern).is_absolute() else sorted(
                Path(pattern).parent.glob(Path(pattern).name))
            if not found:
                raise UserError(f"task.{split}_files: {pattern} matches no file")
            paths.extend(found)
        else:
            paths.append(Path(pattern))
    identity = []
    for path in paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            raise UserError(f"{path}: no such file; check task.{split}_files") from None
        if stat.st_size == 0:
            raise UserError(f"{path}: empty file; give task.{split}_files text to read")
        identity.append(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}")

    def pieces() -> Iterator[Piece]:
        for path in paths:
            yield from read_pieces(path)
    return TextSource(f"{split}: {len(paths)} file{'s' if len(paths) > 1 else ''}", pieces, "\n".join(identity),
                      {"source": "files", "files": [str(p) for p in paths],
                       "bytes": sum(p.stat().st_size for p in paths)})


def builtin_documents() -> dict[str, str]:
    """The built-in corpus: pydoc_data's topic texts, by topic name."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its documentation
        raise UserError("the built-in corpus (pydoc_data.topics) is missing from this Python; "
                        "use task.corpus=files with text files of your own") from None
    return dict(topics)


def builtin_splits(docs: dict[str, str], valid_percent: int, test_percent: int) -> dict[str, str]:
    """Each topic's split: topics in the order of a hash of their names fill test, then valid, up
    to their share of the characters (a topic that would overfill one by a quarter goes on); the
    rest is train. Whole documents, no seed needed."""
    total, filled, out = sum(map(len, docs.values())), {"test": 0, "valid": 0}, {}
    shares = {"test": total * test_percent / 100, "valid": total * valid_percent / 100}
    for name in sorted(docs, key=lambda n: hashlib.sha256(n.encode()).hexdigest()):
        size = len(docs[name])
        split = next((s for s in ("test", "valid") if filled[s] + size <= 1.25 * shares[s]), "train")
        if split != "train":
            filled[split] += size
        out[name] = split
    return out


def builtin_source(split: str, valid_percent: int, test_percent: int) -> TextSource:
    docs = builtin_documents()
    assigned = builtin_splits(docs, valid_percent, test_percent)
    names = sorted(n for n in docs if assigned[n] == split)
    if not names:
        raise UserError(f"the built-in corpus has no topic in split {split} at task.valid_percent={valid_percent}, "
                        f"test_percent={test_percent}; raise them")
    text = "\n".join(docs[n].rstrip("\n") for n in names) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()

    def pieces() -> Iterator[Piece]:
        for line in text.splitlines():
            start = 0
            while len(line) - start > MAX_CHARS:  # none in practice; kept for the contract
                yield Piece(line[start:start + MAX_CHARS], False)
                start += MAX_CHARS
            yield Piece(line[start:], True)
    version = ".".join(map(str, sys.version_info[:3]))
    return TextSource(f"{split}: {len(names)} pydoc topics", pieces, f"builtin:{version}:{digest}",
                      {"source": f"pydoc_data.topics (Python {version})", "documents": len(names),
                       "chars": len(text), "sha256": digest[:16]})


def hf_source(split: str, dataset: str, config: str | None, hf_split: str, field: str) -> TextSource:
    """A Hugging Face dataset's text column (e.g. wikitext / wikitext-103-raw-v1, or pg19), one
    row after another; streamed rows are not kept."""
    try:
        import datasets
    except ImportError:
        raise UserError("task.corpus=hf needs the Hugging Face datasets package: "
                        "pip install 'relpos-lab[hf]'") from None
    try:
        data = datasets.load_dataset(dataset, config, split=hf_split)
    except Exception as err:  # no network, unknown name: the library's own message, on one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise UserError(f"cannot load Hugging Face dataset {dataset}/{config} split {hf_split}: {first}") from None
    if field not in data.column_names:
        raise UserError(f"Hugging Face dataset {dataset} has no column {field!r}; set task.hf_text_field to one of "
                        f"{', '.join(data.column_names)}")

    def pieces() -> Iterator[Piece]:
        for row in data:
            for line in str(row[field]).splitlines():
                yield Piece(line[:MAX_CHARS], True)
    fingerprint = getattr(data, "_fingerprint", "")
    return TextSource(f"{split}: {dataset}/{config}:{hf_split}", pieces,
                      f"hf:{dataset}:{config}:{hf_split}:{fingerprint}",
                      {"source": f"hf:{dataset}/{config}:{hf_split}", "rows": len(data)})
