"""The translation task end to end through the CLI, on a generated toy language pair.

Train (one process and 2-process DDP), the files a run leaves (hypotheses and references whose
sacrebleu score is the reported one), `eval`, `translate`, the copy baseline, and bad corpora.
"""
from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

from relpos_lab import cli
from relpos_lab.records.wandb_offline import find_run_files, read_run
from relpos_lab_tasks.translation import baseline as translation_baseline
from relpos_lab_tasks.translation.bleu import data_signature
from relpos_lab_tasks.translation.corpora import read_aligned

from toy_translation import write_toy_files

TOY = """
task: {name: translation, corpus: files, data_dir: data/toy, src_lang: en, tgt_lang: xx,
       subword: {vocab_size: 200}, max_tokens: 600, eval_max_tokens: 1200, length_buckets: [1, 10, 20]}
model: {d_model: 32, n_heads: 2, d_ff: 64, n_encoder_layers: 1, n_decoder_layers: 1, dropout: 0.0,
        attention_dropout: 0.0, positions: {scheme: shaw, max_distance: 8}}
optim: {lr: 0.005, warmup_steps: 20}
trainer: {accelerator: cpu, max_steps: 300, val_every_n_steps: 150, log_every_n_steps: 10,
          num_sanity_val_steps: 0, enable_progress_bar: false, enable_model_summary: false}
logging: {root: runs}
"""


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    return subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("translation")
    write_toy_files(root / "data" / "toy")
    (root / "toy.yaml").write_text(TOY)
    return root


@pytest.fixture(scope="module")
def trained(toy):
    out = run_cli("train", "toy.yaml", cwd=toy)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = (toy / "runs" / "toy").iterdir()
    return run_dir, json.loads((run_dir / "results.json").read_text()), out


def test_results_hold_bleu_chrf_by_length_and_the_sacrebleu_signatures(trained):
    _, results, out = trained
    assert results["main_metric"] == "valid/bleu"
    for split in ("valid", "test"):
        assert {f"{split}/bleu", f"{split}/chrf", f"{split}/loss"} <= set(results["metrics"])
        assert results["details"][split]["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
        assert set(results["by_length"][split]) <= {"1", "10", "20"}
    assert "subword model: trained unigram model" in out.stderr
    assert "[train] data/toy/train.en + data/toy/train.xx: 2000 sentence pairs" in out.stderr


def test_results_name_the_sentences_scored_and_trained_on(trained, toy):
    _, results, _ = trained
    data = toy / "data" / "toy"
    train = read_aligned(data / "train.en", data / "train.xx")
    for split in ("valid", "test"):
        text = read_aligned(data / f"{split}.en", data / f"{split}.xx")
        assert results["details"][split]["data_signature"] == data_signature(text.src, text.tgt)
        assert results["details"][split]["train_data_signature"] == data_signature(train.src, train.tgt)


def test_the_model_learns_to_translate_the_toy_language(trained):
    _, results, _ = trained
    assert results["metrics"]["test/bleu"] > 10  # copying the source scores 0: no word is shared


def test_the_hypothesis_file_scores_the_reported_bleu_with_sacrebleu(trained, toy):
    run_dir, results, _ = trained
    outputs = run_dir / "outputs"
    hyps, refs = lines(outputs / "test.hyp"), lines(outputs / "test.ref")
    assert (refs == lines(toy / "data" / "toy" / "test.xx")
            and lines(outputs / "test.src") == lines(toy / "data" / "toy" / "test.en"))
    assert sacrebleu.corpus_bleu(hyps, [refs]).score == results["metrics"]["test/bleu"]
    assert sacrebleu.corpus_chrf(hyps, [refs]).score == results["metrics"]["test/chrf"]


def test_wandb_holds_a_table_of_sample_translations(trained):
    run_dir, _, _ = trained
    history = read_run(find_run_files(run_dir)[0]).history
    table = next(r["samples/test"] for r in history if "samples/test" in r)
    files = next(run_dir.glob("wandb/offline-run-*/files"))
    logged = json.loads((files / table["path"]).read_text())
    assert logged["columns"] == ["length", "source", "reference", "hypothesis"]
    _, source, reference, _ = logged["data"][0]
    test_src, test_ref = lines(run_dir / "outputs" / "test.src"), lines(run_dir / "outputs" / "test.ref")
    assert test_ref[test_src.index(source)] == reference


def test_eval_reproduces_the_final_test_scores(trained, toy, monkeypatch):
    run_dir, results, _ = trained
    monkeypatch.chdir(toy)
    assert cli.main(["eval", str(run_dir / results["checkpoint"]), "--output", "eval_out"]) == 0
    evaluated = json.loads((toy / "eval_out" / "results.json").read_text())
    assert evaluated["metrics"]["test/bleu"] == results["metrics"]["test/bleu"]
    assert lines(toy / "eval_out" / "outputs" / "test.hyp") == lines(run_dir / "outputs" / "test.hyp")


def test_translate_gives_the_evaluations_hypotheses_for_a_file(trained, toy, monkeypatch):
    run_dir, results, _ = trained
    monkeypatch.chdir(toy)
    checkpoint = str(run_dir / results["checkpoint"])
    assert cli.main(["translate", checkpoint, "--input", str(run_dir / "outputs" / "test.src"),
                     "--output", "hyp.txt"]) == 0
    assert lines(toy / "hyp.txt") == lines(run_dir / "outputs" / "test.hyp")


def test_translate_reads_stdin_and_keeps_empty_lines(trained, monkeypatch, capsys):
    run_dir, results, _ = trained
    source = lines(run_dir / "outputs" / "test.src")[:2]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{source[0]}\n\n{source[1]}\n"))
    assert cli.main(["translate", str(run_dir / results["checkpoint"]), "--beam", "1"]) == 0
    first, empty, second = capsys.readouterr().out.splitlines()
    assert empty == "" and first and second


def test_translate_warns_once_with_a_count_when_input_is_unknown_to_the_vocabulary(trained, monkeypatch, capsys):
    """Characters the training corpus never had used to become <unk> silently."""
    run_dir, results, _ = trained
    checkpoint = str(run_dir / results["checkpoint"])
    source = lines(run_dir / "outputs" / "test.src")[:2]
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{source[0]}\nthe 日本 cat\n{source[1]} ß\n"))
    assert cli.main(["translate", checkpoint, "--beam", "1"]) == 0
    out, err = capsys.readouterr()
    assert len(out.splitlines()) == 3
    (line,) = err.splitlines()  # once, however many lines hold unknown tokens
    assert re.fullmatch(r"relpos-lab: warning: \d+ input tokens in 2 of 3 lines are unknown to the checkpoint's "
                        r"vocabulary and read as <unk> \(first in line 2\); their translation will be missing or "
                        r"wrong: check that the input is in the language and script the model was trained on", line)
    monkeypatch.setattr(sys, "stdin", io.StringIO(f"{source[0]}\n{source[1]}\n"))
    assert cli.main(["translate", checkpoint, "--beam", "1"]) == 0
    assert capsys.readouterr().err == ""  # known input: no warning


def test_the_copy_baseline_is_sacrebleus_score_of_the_sources(toy, monkeypatch, capsys):
    monkeypatch.chdir(toy)
    assert translation_baseline.main(["toy.yaml"]) == 0
    baseline = json.loads(capsys.readouterr().out)
    src, ref = lines(toy / "data" / "toy" / "test.en"), lines(toy / "data" / "toy" / "test.xx")
    assert baseline["bleu"] == sacrebleu.corpus_bleu(src, [ref]).score and baseline["sentences"] == len(ref)


@pytest.mark.integration
@pytest.mark.slow  # ~25 s: three processes start; tests/test_translation_bleu.py checks DDP == 1 process fast
def test_a_two_process_ddp_evaluation_scores_what_one_process_scores(toy, monkeypatch):
    out = run_cli("train", "toy.yaml", "name=toy_ddp", "trainer.devices=2", "trainer.strategy=ddp",
                  "trainer.max_steps=40", "trainer.val_every_n_steps=20", "logging.wandb.mode=disabled", cwd=toy)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = (toy / "runs" / "toy_ddp").iterdir()
    ddp = json.loads((run_dir / "results.json").read_text())
    monkeypatch.chdir(toy)
    assert cli.main(["eval", str(run_dir / ddp["checkpoint"]), "--output", "ddp_eval"]) == 0
    one = json.loads((toy / "ddp_eval" / "results.json").read_text())
    for metric in ("bleu", "chrf"):
        assert ddp["metrics"][f"test/{metric}"] == one["metrics"][f"test/{metric}"]
    assert lines(run_dir / "outputs" / "test.hyp") == lines(toy / "ddp_eval" / "outputs" / "test.hyp")
    assert len(lines(run_dir / "outputs" / "test.hyp")) == 60  # every sentence once, none repeated


def test_a_missing_test_file_stops_the_run_before_training(toy, tmp_path, monkeypatch, capsys):
    data = write_toy_files(tmp_path / "no_test", {"train": 30, "valid": 5, "test": 5})
    (data / "test.xx").unlink()
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", str(toy / "toy.yaml"), f"task.data_dir={data}", "logging.wandb.mode=disabled"]) == 2
    err = capsys.readouterr().err
    assert "missing corpus file" in err and "test.xx" in err
    assert not list(tmp_path.glob("runs/*/*/checkpoints/*.ckpt"))  # nothing was trained


def test_a_corpus_with_misaligned_files_is_one_line_naming_the_files(toy, tmp_path, monkeypatch, capsys):
    data = write_toy_files(tmp_path / "bad", {"train": 30, "valid": 5, "test": 5})
    (data / "train.xx").write_text("".join(f"{line}\n" for line in lines(data / "train.xx")[:-1]))
    monkeypatch.chdir(tmp_path)
    assert cli.main(["train", str(toy / "toy.yaml"), f"task.data_dir={data}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("relpos-lab: error: ")
    assert "train.en has 30 lines but" in err and "train.xx has 29: aligned files must have the same" in err


@pytest.fixture(scope="module")
def small_splits(tmp_path_factory) -> Path:
    """A toy corpus with valid/test files of 1, 3 and 100 sentences (`small<n>.en/.xx`)."""
    root = tmp_path_factory.mktemp("small_splits")
    data = write_toy_files(root / "data" / "toy", {"train": 300, "small1": 1, "small3": 3, "small100": 100})
    (root / "toy.yaml").write_text(TOY.replace("data_dir: data/toy", f"data_dir: {data}"))
    return root


@pytest.mark.integration
# 1 sentence is the edge case (a rank without any); 3 and 100 run with `-m slow` (test_distributed
# covers 1, 3 and 100 on the synthetic task by default).
@pytest.mark.slow  # ~25 s each; DDP evaluation itself is test_distributed's, in the default tier
@pytest.mark.parametrize("sentences", [1, 3, 100])
def test_two_process_ddp_evaluates_splits_smaller_than_the_world_as_one_process_does(small_splits, sentences,
                                                                                      monkeypatch):
    """One token batch and two processes: rank 1 has no batch. It used to crash the final
    validation (`DataLoader within local rank has zero length`); it must join the gather, and
    the scores must be one process's on the same checkpoint."""
    split = f"small{sentences}"
    name = f"ddp_small{sentences}"
    out = run_cli("train", "toy.yaml", f"name={name}", f"task.split_names={{valid: {split}, test: {split}}}",
                  "trainer.devices=2", "trainer.strategy=ddp", "trainer.max_steps=40",
                  "trainer.val_every_n_steps=20", "logging.wandb.mode=disabled", cwd=small_splits)
    assert out.returncode == 0, out.stderr[-4000:]
    (run_dir,) = (small_splits / "runs" / name).iterdir()
    ddp = json.loads((run_dir / "results.json").read_text())
    monkeypatch.chdir(small_splits)
    for part in ("valid", "test"):
        assert cli.main(["eval", str(run_dir / ddp["checkpoint"]), "--split", part, "--output", f"{name}_{part}"]) == 0
        one = json.loads((small_splits / f"{name}_{part}" / "results.json").read_text())
        for metric in ("bleu", "chrf", "loss"):
            assert ddp["metrics"][f"{part}/{metric}"] == pytest.approx(one["metrics"][f"{part}/{metric}"],
                                                                      rel=1e-6), metric
        assert ddp["by_length"][part] == one["by_length"][part]  # sacrebleu on the same text: exact
        hyps = lines(run_dir / "outputs" / f"{part}.hyp")
        assert hyps == lines(small_splits / f"{name}_{part}" / "outputs" / f"{part}.hyp")
        assert len(hyps) == sentences  # every sentence once, none repeated
