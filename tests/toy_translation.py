"""Test data for the translation task: a rule-based toy language pair and hand-made .mo files.

The toy "language" translates word by word with a fixed dictionary and reorders every clause
(adjectives follow their noun, the verb goes last: SVO -> SOV), so a model must use where words
are, not only which words there are. Everything is generated from a seed: no files are shipped.
"""
from __future__ import annotations

import random
import struct
from pathlib import Path

NOUNS = {"cat": "kato", "dog": "hundo", "bird": "birdo", "fish": "fiso", "horse": "cevalo", "mouse": "muso",
         "child": "infano", "teacher": "instruisto", "farmer": "farmisto", "king": "rego"}
ADJECTIVES = {"red": "ruga", "small": "malgranda", "big": "granda", "old": "malnova", "happy": "felica",
              "green": "verda"}
VERBS = {"sees": "vidas", "likes": "satas", "follows": "sekvas", "feeds": "nutras", "finds": "trovas"}
DETERMINERS = {"the": "la", "a": "unu"}


def _phrase(rng: random.Random) -> tuple[list[str], list[str]]:
    det, noun = rng.choice(list(DETERMINERS)), rng.choice(list(NOUNS))
    adjectives = rng.sample(list(ADJECTIVES), rng.randint(0, 2))
    src = [det, *adjectives, noun]
    tgt = [DETERMINERS[det], NOUNS[noun], *(ADJECTIVES[a] for a in adjectives)]
    return src, tgt


def toy_pair(rng: random.Random) -> tuple[str, str]:
    """One sentence pair of one or two clauses (SVO source, SOV target)."""
    src, tgt = [], []
    for clause in range(rng.randint(1, 2)):
        subject, obj = _phrase(rng), _phrase(rng)
        verb = rng.choice(list(VERBS))
        if clause:
            src.append("and")
            tgt.append("kaj")
        src += [*subject[0], verb, *obj[0]]
        tgt += [*subject[1], *obj[1], VERBS[verb]]
    return " ".join(src), " ".join(tgt)


def toy_corpus(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    pairs = [toy_pair(rng) for _ in range(n)]
    return [s for s, _ in pairs], [t for _, t in pairs]


def write_toy_files(directory: Path, sizes: dict[str, int] | None = None, seed: int = 0) -> Path:
    """train/valid/test.{en,xx} of the toy language in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, (split, n) in enumerate((sizes or {"train": 2000, "valid": 40, "test": 60}).items()):
        src, tgt = toy_corpus(n, seed + i)
        (directory / f"{split}.en").write_text("".join(f"{s}\n" for s in src))
        (directory / f"{split}.xx").write_text("".join(f"{t}\n" for t in tgt))
    return directory


def mo_bytes(entries: list[tuple[str, str]], charset: str = "UTF-8", big_endian: bool = False) -> bytes:
    """A compiled gettext catalog (what msgfmt writes), header first, entries sorted as msgfmt does.

    `entries` are (msgid, msgstr) as they appear in the file: a context is "ctx\\x04msgid", a
    plural entry "singular\\0plural" -> "form0\\0form1".
    """
    header = f"Content-Type: text/plain; charset={charset}\nPlural-Forms: nplurals=2; plural=(n != 1);\n"
    items = sorted([("", header), *entries], key=lambda e: e[0].encode(charset))
    ids = [k.encode(charset) for k, _ in items]
    strs = [v.encode(charset) for _, v in items]
    order = ">" if big_endian else "<"
    n = len(items)
    originals, translations = 28, 28 + 8 * n
    data_start = 28 + 16 * n
    blob, table_o, table_t = b"", b"", b""
    for table, strings in ((0, ids), (1, strs)):
        for s in strings:
            entry = struct.pack(f"{order}2I", len(s), data_start + len(blob))
            if table == 0:
                table_o += entry
            else:
                table_t += entry
            blob += s + b"\0"
    head = struct.pack(f"{order}7I", 0x950412DE, 0, n, originals, translations, 0, 0)
    return head + table_o + table_t + blob
