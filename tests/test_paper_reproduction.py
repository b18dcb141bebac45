"""The committed small reproduction of Shaw et al. (2018) is what its runs say.

studies/paper-reproduction/runs/ holds the run directories (without checkpoints); the reports beside
them are what `relpos-lab report` makes of those runs (studies/paper-reproduction/run.sh). These
tests regenerate every report and compare, so neither a hand edit of a report nor a run committed
without regenerating it can land unnoticed.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from relpos_lab import cli
from relpos_lab.analysis.doc_tables import refresh_tables
from relpos_lab.analysis.report import write_report
from relpos_lab.records.rundir import run_directory

ROOT = Path(__file__).resolve().parents[1]
DOCS = Path("studies/paper-reproduction")  # relative, as run.sh names it: the reports print the path
SWEEPS = sorted(p.parent.name for p in (ROOT / DOCS / "runs").glob("*/sweep.json"))


def _report_dir(sweep: str) -> Path:
    """shaw2018_<table>_small -> studies/paper-reproduction/<table>, where run.sh writes its report."""
    return DOCS / sweep.removeprefix("shaw2018_").removesuffix("_small")


def _runs(sweep: str) -> list[Path]:
    return sorted(p for p in (ROOT / DOCS / "runs" / sweep).iterdir() if p.is_dir() and p.name != "logs")


def test_the_three_small_sweeps_have_committed_runs():
    assert {"shaw2018_abs_vs_rel_small", "shaw2018_clipping_small", "shaw2018_ablation_small"} <= set(SWEEPS)


@pytest.mark.parametrize("sweep", SWEEPS)
def test_committed_report_is_what_the_runs_regenerate(sweep, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    write_report(DOCS / "runs" / sweep, tmp_path, metrics=("bleu", "chrf"))
    for name in ("report.md", "summary.csv", "by_length.csv"):
        assert (tmp_path / name).read_text() == (ROOT / _report_dir(sweep) / name).read_text(), (
            f"{_report_dir(sweep) / name} is not what its runs give: rerun studies/paper-reproduction/run.sh")


def test_the_tables_in_the_doc_are_the_reports_tables():
    doc = ROOT / "docs" / "paper-reproduction.md"
    text, blocks = refresh_tables(doc)
    assert blocks == 3
    assert text == doc.read_text(), "docs/paper-reproduction.md: run relpos-lab tables docs/paper-reproduction.md"


def test_tables_refreshes_a_stale_doc_and_check_reports_it(tmp_path, capsys):
    report = tmp_path / "study" / "report.md"
    report.parent.mkdir()
    report.write_text("# a report\n\n| group | runs | bleu |\n|---|---|---|\n| rel | 2 | 25.1 |\n\n## more\n")
    doc = tmp_path / "paper.md"
    doc.write_text("Intro.\n<!-- report: study -->\n| old | table |\n<!-- /report -->\nEnd.\n")
    assert cli.main(["tables", str(doc), "--check"]) == 1
    assert "old" in doc.read_text()
    assert cli.main(["tables", str(doc)]) == 0
    assert doc.read_text() == ("Intro.\n<!-- report: study -->\n| group | runs | bleu |\n|---|---|---|\n"
                               "| rel | 2 | 25.1 |\n<!-- /report -->\nEnd.\n")
    assert cli.main(["tables", str(doc), "--check"]) == 0
    (tmp_path / "bare.md").write_text("no markers\n")
    assert cli.main(["tables", str(tmp_path / "bare.md")]) == 2
    assert "no <!-- report: DIR -->" in capsys.readouterr().err


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_committed_run_is_finished_and_its_config_names_its_directory(sweep):
    for run in _runs(sweep):
        assert (run / "results.json").is_file(), f"{run} is unfinished: commit a run once it has results.json"
        config = OmegaConf.load(run / "config.yaml")
        assert run_directory(config).name == run.resolve().name, f"{run}/config.yaml is not the config of {run.name}"


def test_every_run_scored_the_same_sentences_and_trained_on_the_same_ones():
    """The gettext corpus is built from the machine's catalogs: a package that ships one more
    (rsync's libpopt0 adds popt.mo) changes every split. Runs older than the training data's
    signature carry only the scored sentences' one."""
    signatures: dict[tuple[str, str], set[str]] = {}
    for sweep in SWEEPS:
        for run in _runs(sweep):
            details = json.loads((run / "results.json").read_text()).get("details", {})
            for split in ("valid", "test"):
                assert "data_signature" in details[split], f"{run}: no data_signature for {split}"
                for name, value in details[split].items():
                    if name.endswith("data_signature"):
                        signatures.setdefault((split, name), set()).add(value)
    assert signatures and all(len(values) == 1 for values in signatures.values()), signatures
