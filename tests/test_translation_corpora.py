"""Reading parallel corpora: aligned files, TSV, HF rows, gettext catalogs — and every bad input."""
from __future__ import annotations

import gettext
import sys
from pathlib import Path

import pytest

from relpos_lab.api.errors import UserError
from relpos_lab_tasks.translation.corpora import from_hf_rows, read_aligned, read_hf, read_tsv
from relpos_lab_tasks.translation.gettext import build_corpus, clean_message, read_mo

from toy_translation import mo_bytes

MACHINE_CATALOGS = Path("/usr/share/locale/de/LC_MESSAGES")


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


# --- aligned plain-text files ---------------------------------------------------------------------


def test_aligned_files_pair_line_i_with_line_i(tmp_path):
    text = read_aligned(write(tmp_path / "train.en", "Hello\nOpen file\n"),
                        write(tmp_path / "train.de", "Hallo\nDatei öffnen\n"))
    assert (text.src, text.tgt) == (["Hello", "Open file"], ["Hallo", "Datei öffnen"])
    assert text.report() == f"{tmp_path}/train.en + {tmp_path}/train.de: 2 sentence pairs"


def test_a_missing_aligned_file_is_named(tmp_path):
    write(tmp_path / "train.en", "Hello\n")
    with pytest.raises(UserError, match=r"missing corpus file: .*train\.de \(an aligned corpus is the pair"):
        read_aligned(tmp_path / "train.en", tmp_path / "train.de")


def test_unequal_line_counts_name_both_files_and_counts(tmp_path):
    src, tgt = write(tmp_path / "a.en", "1\n2\n3\n"), write(tmp_path / "a.de", "1\n2\n")
    with pytest.raises(UserError, match=r"a\.en has 3 lines but .*a\.de has 2: aligned files must have the same"):
        read_aligned(src, tgt)


def test_empty_lines_are_skipped_counted_and_reported_with_line_numbers(tmp_path):
    src = write(tmp_path / "t.en", "one\n\nthree\nfour\n  \n")
    tgt = write(tmp_path / "t.de", "eins\nzwei\n\nvier\nfünf\n")
    text = read_aligned(src, tgt)
    assert text.src == ["one", "four"] and text.tgt == ["eins", "vier"]
    assert text.empty_lines == [2, 3, 5]
    assert text.report().endswith(": 2 sentence pairs; skipped 3 with an empty side (line 2, 3, 5)")


def test_a_corpus_of_only_empty_lines_is_an_error(tmp_path):
    with pytest.raises(UserError, match="no sentence pairs"):
        read_aligned(write(tmp_path / "t.en", "\n\n"), write(tmp_path / "t.de", "x\n\n"))


def test_windows_line_ends_and_a_missing_final_newline_are_accepted(tmp_path):
    text = read_aligned(write(tmp_path / "t.en", "a\r\nb"), write(tmp_path / "t.de", "x\r\ny"))
    assert (text.src, text.tgt) == (["a", "b"], ["x", "y"])


def test_bytes_that_are_not_utf8_are_reported_with_their_line(tmp_path):
    src = write(tmp_path / "t.en", "ok\nGr\xfc\xdfe\n".encode("latin-1"))
    with pytest.raises(UserError, match=r"t\.en:2: not UTF-8"):
        read_aligned(src, write(tmp_path / "t.de", "a\nb\n"))


# --- TSV ----------------------------------------------------------------------------------------


def test_tsv_reads_source_tab_target(tmp_path):
    text = read_tsv(write(tmp_path / "train.tsv", "Hello\tHallo\n\nYes\t\nNo\tNein\n"))
    assert (text.src, text.tgt) == (["Hello", "No"], ["Hallo", "Nein"])
    assert text.empty_lines == [2, 3]


def test_a_tsv_line_without_two_fields_names_file_and_line(tmp_path):
    path = write(tmp_path / "train.tsv", "a\tb\nc\td\te\n")
    with pytest.raises(UserError, match=r"train\.tsv:2: expected 2 tab-separated fields .* found 3"):
        read_tsv(path)
    with pytest.raises(UserError, match=r"train\.tsv:1: expected 2 .* found 1"):
        read_tsv(write(tmp_path / "train.tsv", "no tab here\n"))


def test_a_missing_tsv_is_named(tmp_path):
    with pytest.raises(UserError, match=r"missing corpus file: .*valid\.tsv"):
        read_tsv(tmp_path / "valid.tsv")


# --- Hugging Face datasets ----------------------------------------------------------------------


def test_hf_rows_in_the_translation_format_and_as_columns():
    rows = [{"translation": {"en": "Hello", "de": "Hallo"}}, {"translation": {"en": "", "de": "leer"}}]
    text = from_hf_rows("wmt14[train]", rows, "en", "de")
    assert (text.src, text.tgt, text.empty_lines) == (["Hello"], ["Hallo"], [2])
    assert from_hf_rows("x", [{"en": "a", "de": "b", "id": 1}], "en", "de").src == ["a"]


def test_hf_rows_without_the_languages_list_what_they_have():
    with pytest.raises(UserError, match=r"row 1 has no 'en' and 'fr' fields \(it has: en, de\)"):
        from_hf_rows("wmt14[train]", [{"translation": {"en": "a", "de": "b"}}], "en", "fr")


def test_hf_without_the_datasets_library_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # what an absent package looks like to import
    with pytest.raises(UserError, match=r'needs the Hugging Face datasets library: pip install -e "\.\[hf\]"'):
        read_hf("wmt14", "de-en", "train", "en", "de")


# --- gettext catalogs ---------------------------------------------------------------------------

ENTRIES = [
    ("Open file", "Datei öffnen"),
    ("_Save", "_Speichern"),
    ("Stock label\x04_Close", "S_chließen"),
    ("%d file\x00%d files", "%d Datei\x00%d Dateien"),  # plural: left out
    ("Untranslated", ""),
    ("Usage:\n  tool [OPTION]\n", "Aufruf:\n  tool [OPTION]\n"),
    ("%s: %s", "%s: %s"),  # no words: left out
]


@pytest.mark.parametrize("big_endian", [False, True])
def test_read_mo_returns_singular_translated_messages_without_context(tmp_path, big_endian):
    catalog = read_mo(write(tmp_path / "app.mo", mo_bytes(ENTRIES, big_endian=big_endian)))
    assert set(catalog.messages) == set([
        (None, "Open file", "Datei öffnen"), (None, "_Save", "_Speichern"), ("Stock label", "_Close", "S_chließen"),
        (None, "Usage:\n  tool [OPTION]\n", "Aufruf:\n  tool [OPTION]\n"), (None, "%s: %s", "%s: %s")])
    assert (catalog.plural, catalog.untranslated) == (1, 1)


def test_read_mo_agrees_with_pythons_gettext(tmp_path):
    path = write(tmp_path / "app.mo", mo_bytes(ENTRIES))
    assert_agrees_with_gettext(path)


def assert_agrees_with_gettext(path: Path) -> int:
    with open(path, "rb") as handle:
        reference = gettext.GNUTranslations(handle)
    messages = read_mo(path).messages
    for context, msgid, msgstr in messages:
        expected = reference.pgettext(context, msgid) if context is not None else reference.gettext(msgid)
        assert expected == msgstr, (path.name, context, msgid)
    return len(messages)


def test_read_mo_decodes_the_charset_of_the_header(tmp_path):
    catalog = read_mo(write(tmp_path / "old.mo", mo_bytes([("Size", "Größe")], charset="ISO-8859-1")))
    assert catalog.messages == [(None, "Size", "Größe")]


def test_a_file_that_is_not_a_catalog_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="bad magic number"):
        read_mo(write(tmp_path / "x.mo", b"\0" * 64))


@pytest.mark.parametrize("raw, clean", [
    ("_Open Link", "Open Link"), ("S_chließen", "Schließen"), ("max_wal_size too big", "max_wal_size too big"),
    ("%_H hour", "%_H hour"), ("Usage:\n  tool\t[OPTION]\n", "Usage: tool [OPTION]"),
])
def test_clean_message_drops_mnemonics_and_folds_whitespace(raw, clean):
    assert clean_message(raw) == clean


def test_gettext_corpus_is_deduplicated_split_deterministically_and_reported(tmp_path):
    locale = tmp_path / "locale"
    messages = [(f"Message number {i}", f"Nachricht Nummer {i}") for i in range(40)]
    write(locale / "de" / "LC_MESSAGES" / "a.mo", mo_bytes(messages[:30] + ENTRIES + [("Shared", "Geteilt")]))
    write(locale / "de" / "LC_MESSAGES" / "b.mo", mo_bytes(messages[25:] + [("Shared", "Gemeinsam"), ("Shared ", "x")]))
    write(locale / "de" / "LC_MESSAGES" / "broken.mo", b"not a catalog at all, just text")
    corpus = build_corpus(locale, "de", valid_size=5, test_size=10, max_chars=18)
    pairs = {s: t for split in corpus.splits.values() for s, t in zip(split.src, split.tgt)}
    assert len(pairs) == sum(len(s) for s in corpus.splits.values())  # no source in two splits
    assert pairs["Save"] == "Speichern" and pairs["Close"] == "Schließen"
    assert pairs["Shared"] == "Geteilt"  # a tie between catalogs: the first catalog by name wins
    assert "Usage: tool [OPTION]" not in pairs  # 20 characters, over max_chars=18
    assert [len(corpus.splits[s]) for s in ("train", "valid", "test")] == [len(pairs) - 15, 5, 10]
    again = build_corpus(locale, "de", valid_size=5, test_size=10, max_chars=18)
    assert again.splits["test"].src == corpus.splits["test"].src
    assert "1 plural" in corpus.report and "1 untranslated" in corpus.report and "1 without words" in corpus.report
    assert "unreadable catalogs skipped: broken.mo" in corpus.report


def test_gettext_corpus_without_catalogs_is_an_error(tmp_path):
    with pytest.raises(UserError, match=r"no gettext catalogs \(\*\.mo\) in .*xx/LC_MESSAGES"):
        build_corpus(tmp_path, "xx", valid_size=1, test_size=1, max_chars=100)


@pytest.mark.skipif(not list(MACHINE_CATALOGS.glob("*.mo")), reason="this machine has no German gettext catalogs")
def test_read_mo_agrees_with_gettext_on_every_catalog_of_this_machine():
    compared = 0
    for path in sorted(MACHINE_CATALOGS.glob("*.mo")):
        try:
            compared += assert_agrees_with_gettext(path)
        except UnicodeDecodeError:  # gettext rejects a catalog whose header is not UTF-8; read_mo reads it
            assert read_mo(path).messages
    assert compared > 1000
