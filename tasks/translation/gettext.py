"""A real English→X parallel corpus with no download: the gettext catalogs of the machine.

Every Debian/Ubuntu system carries human translations of its software's messages as compiled
gettext catalogs, ``/usr/share/locale/<lang>/LC_MESSAGES/*.mo`` (a typical machine: ~85 catalogs,
~70,000 English→German messages: error messages, option help, language and country names). This
module turns them into a deduplicated parallel corpus with a deterministic train/valid/test split.

The .mo format (a header, then two tables of (length, offset) pairs pointing at NUL-terminated
strings) is read here rather than with `gettext.GNUTranslations`: that class answers lookups but
has no public way to enumerate a catalog, folds plural forms into its private dict, and rejects a
whole catalog whose header is not UTF-8 (net-tools.mo on Debian 12). Tests check this reader
against `gettext` on every catalog `gettext` can read.

Cleaning, in order (each step counted in the report):
- plural entries (msgid\\0msgid_plural), the header (empty msgid) and untranslated entries are
  dropped; a message context (msgctxt\\x04msgid, e.g. "Stock label") is removed from the source;
- GTK mnemonics are removed: a single ``_`` before a letter ("_Open" → "Open", "S_chließen" →
  "Schließen"); strings with several underscores are identifiers and are kept as they are;
- whitespace runs (newlines of multi-line help texts, tabs) become one space;
- messages without words ("%s: %s", "%d%%") and sources longer than `max_chars` (option tables,
  licence texts) are dropped;
- the same source in several catalogs keeps its most frequent translation (ties: the first
  catalog by file name), so no source sentence is in two splits.

The split orders the pairs by a hash of the source text: the first `test_size` are test, the next
`valid_size` valid, the rest train. It depends on nothing but the messages themselves.
"""
from __future__ import annotations

import hashlib
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from relpos_lab.api import UserError
from relpos_lab_tasks.translation.corpora import ParallelText

MAGIC = 0x950412DE
CONTEXT_SEPARATOR = "\x04"
MNEMONIC = re.compile(r"(?<!%)_(?=[^\W\d_])")  # an underscore before a letter, not a %_H format flag
PLACEHOLDER = re.compile(r"%[-+ #0'*\d.$hlLqjzt]*[a-zA-Z]|\{\w*\}")  # printf / brace formats
CHARSET = re.compile(r"charset=([\w.:-]+)", re.IGNORECASE)


class Message(NamedTuple):
    context: str | None  # msgctxt, e.g. "Stock label"; it is not part of the sentence
    msgid: str
    msgstr: str


@dataclass
class Catalog:
    """The singular messages of one .mo file, decoded, and what could not be used."""

    path: Path
    messages: list[Message] = field(default_factory=list)
    plural: int = 0
    untranslated: int = 0
    undecodable: int = 0


def read_mo(path: str | Path) -> Catalog:
    """Parse a compiled gettext catalog; ValueError if it is not one."""
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 20:
        raise ValueError("too short for a .mo file")
    for order in "<>":
        if struct.unpack(f"{order}I", data[:4])[0] == MAGIC:
            break
    else:
        raise ValueError("not a .mo file (bad magic number)")
    _, count, originals, translations = struct.unpack(f"{order}4I", data[4:20])

    def strings(table: int) -> list[bytes]:
        out = []
        for i in range(count):
            length, offset = struct.unpack(f"{order}2I", data[table + 8 * i: table + 8 * i + 8])
            if offset + length > len(data):
                raise ValueError(f"string {i} lies outside the file")
            out.append(data[offset: offset + length])
        return out

    try:
        pairs = list(zip(strings(originals), strings(translations)))
    except struct.error:
        raise ValueError("truncated string table") from None
    header = next((t for o, t in pairs if o == b""), b"")
    charset = CHARSET.search(header.decode("ascii", "replace"))
    encoding = charset.group(1) if charset and charset.group(1).upper() != "CHARSET" else "utf-8"
    catalog = Catalog(path)
    for msgid, msgstr in pairs:
        if msgid == b"":
            continue
        if b"\0" in msgid:
            catalog.plural += 1
            continue
        if not msgstr.strip(b"\0 \t\n"):
            catalog.untranslated += 1
            continue
        try:
            source, target = msgid.decode(encoding), msgstr.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            catalog.undecodable += 1
            continue
        context, separator, source = source.rpartition(CONTEXT_SEPARATOR)
        catalog.messages.append(Message(context if separator else None, source, target))
    return catalog


def clean_message(text: str) -> str:
    """One line of plain text: the GTK mnemonic removed, whitespace runs made one space."""
    if text.count("_") == 1:
        text = MNEMONIC.sub("", text)
    return " ".join(text.split())


@dataclass
class GettextCorpus:
    """The train/valid/test splits built from a locale's catalogs, with the account of how."""

    splits: dict[str, ParallelText]
    report: str


def build_corpus(locale_dir: str | Path, lang: str, *, valid_size: int, test_size: int,
                 max_chars: int) -> GettextCorpus:
    """English→`lang` pairs from ``<locale_dir>/<lang>/LC_MESSAGES/*.mo``, split by source hash."""
    folder = Path(locale_dir) / lang / "LC_MESSAGES"
    paths = sorted(folder.glob("*.mo"))
    if not paths:
        raise UserError(f"no gettext catalogs (*.mo) in {folder}; install some translated packages "
                        "or choose another task.gettext_lang / task.corpus")
    counts: Counter[str] = Counter()
    unreadable: list[str] = []
    translations: dict[str, Counter[str]] = {}
    for path in paths:
        try:
            catalog = read_mo(path)
        except (OSError, ValueError) as err:
            unreadable.append(f"{path.name} ({err})")
            continue
        counts.update(plural=catalog.plural, untranslated=catalog.untranslated,
                      undecodable=catalog.undecodable, messages=len(catalog.messages))
        for _, msgid, msgstr in catalog.messages:
            source, target = clean_message(msgid), clean_message(msgstr)
            if not _has_words(source) or not _has_words(target):
                counts["without words"] += 1
            elif len(source) > max_chars:
                counts[f"over {max_chars} characters"] += 1
            else:
                translations.setdefault(source, Counter())[target] += 1
    pairs = sorted(((s, t.most_common(1)[0][0]) for s, t in translations.items()), key=lambda p: _key(p[0]))
    duplicates = sum(sum(t.values()) for t in translations.values()) - len(pairs)
    if len(pairs) <= valid_size + test_size:
        raise UserError(f"{folder}: only {len(pairs)} usable messages, not enough for "
                        f"valid_size={valid_size} + test_size={test_size} and a training set")
    bounds = {"test": (0, test_size), "valid": (test_size, test_size + valid_size),
              "train": (test_size + valid_size, len(pairs))}
    splits = {}
    for split, (lo, hi) in bounds.items():
        text = ParallelText(f"gettext {folder} [{split}]")
        text.src, text.tgt = [s for s, _ in pairs[lo:hi]], [t for _, t in pairs[lo:hi]]
        splits[split] = text
    dropped = ", ".join(f"{n} {what}" for what, n in counts.items() if what != "messages" and n)
    report = (f"gettext {folder}: {len(paths) - len(unreadable)} catalogs, {counts['messages']} messages "
              f"(dropped {dropped or 'none'}; {duplicates} repeated sources merged) -> {len(pairs)} pairs: "
              + ", ".join(f"{s} {len(t)}" for s, t in splits.items()))
    if unreadable:
        report += f"; unreadable catalogs skipped: {', '.join(unreadable)}"
    return GettextCorpus(splits, report)


def _has_words(text: str) -> bool:
    """Whether a letter is left once format placeholders (%s, %-10lu, {name}) are removed."""
    return any(c.isalpha() for c in PLACEHOLDER.sub("", text))


def _key(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()
