"""Task lm without training: lazy reading, windows, perplexity on hand-computable toys, per-length
and per-position metrics, bad input as one clear line each, and cached sampling."""
from __future__ import annotations

import math
import pickle
import sys
import tracemalloc
import types

import numpy as np
import pytest
import torch
from torch import nn

from relpos_lab.api import UserError
from relpos_lab.core.decoding import next_token, sample
from relpos_lab.core.prefix_lm import PrefixLM
from relpos_lab.core.transformer import ModelConfig
from relpos_lab.training.inference import generate
from relpos_lab_tasks.lm import LMConfig, LMTask
from relpos_lab_tasks.lm.metrics import PerplexityEvaluation, position_buckets
from relpos_lab_tasks.lm.text import MAX_CHARS, builtin_documents, builtin_splits, hf_source, read_pieces
from relpos_lab_tasks.lm.tokens import TokenStream, Windows, load_or_build
from relpos_lab_tasks.subword import SubwordConfig

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex jumbled boxes".split()
SMALL = SubwordConfig(vocab_size=60)


def text_file(path, lines=200, seed=0):
    rng = np.random.default_rng(seed)
    path.write_text("".join(" ".join(rng.choice(WORDS, 8)) + "\n" for _ in range(lines)), encoding="utf-8")
    return path


def files_task(tmp_path, **kw) -> LMTask:
    paths = {s: text_file(tmp_path / f"{s}.txt", seed=i) for i, s in enumerate(("train", "valid", "test"))}
    fields = dict(name="lm", corpus="files", data_dir=str(tmp_path / "cache"), subword=SMALL, train_length=8,
                  eval_lengths=[8, 16], **{f"{s}_files": [str(p)] for s, p in paths.items()})
    fields.update(kw)
    cfg = LMConfig(**fields)
    cfg.validate()
    return LMTask(cfg)


# --- reading ------------------------------------------------------------------------------------

def test_the_reader_is_lazy_memory_stays_far_below_the_file_size(tmp_path):
    path = tmp_path / "big.txt"
    line = "lorem ipsum dolor sit amet " * 40 + "\n"
    with open(path, "w") as f:
        for _ in range(8 * 2**20 // len(line)):  # 8 MiB
            f.write(line)
    tracemalloc.start()
    chars = sum(len(p.text) + p.ends_line for p in read_pieces(path))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert chars == path.stat().st_size
    assert peak < 512 * 1024, f"reading an 8 MiB file peaked at {peak / 2**20:.1f} MiB of Python memory"


def test_long_lines_are_cut_at_spaces_and_reassemble(tmp_path):
    path = tmp_path / "long.txt"
    words = [f"w{i}" for i in range(3 * MAX_CHARS // 4)]
    path.write_text(" ".join(words) + "\nshort\nlast line without newline", encoding="utf-8")
    pieces = list(read_pieces(path, block=1000))
    assert pieces == list(read_pieces(path))
    assert all(len(p.text) <= MAX_CHARS for p in pieces)
    assert [p.ends_line for p in pieces].count(True) == 3 and pieces[-1].ends_line
    first_line = [p.text for p in pieces[: len(pieces) - 2]]
    assert " ".join(first_line).split() == words  # no word split in two
    assert [p.text for p in pieces[-2:]] == ["short", "last line without newline"]


def test_the_token_cache_is_built_lazily_and_reused(tmp_path):
    task = files_task(tmp_path)
    tracemalloc.start()
    stream = task.stream("train")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert isinstance(stream.ids, np.memmap) and stream.info["lines"] == 200
    assert stream.ids[stream.ids == 2].size == 200  # one EOS per line
    assert peak < 8 * 2**20
    again, built = load_or_build(task.source("train"), task.subword, task.data_dir / "tokens", "train")
    assert not built and np.array_equal(np.asarray(again.ids), np.asarray(stream.ids))
    text = (tmp_path / "train.txt").read_text().splitlines()[0]
    assert task.subword.detokenize(list(stream.ids[: list(stream.ids).index(2)])) == text
    windows = task.dataset("train")
    blob = pickle.dumps(windows)  # what a spawned loader worker receives: the file's name, not its tokens
    assert len(blob) < 1000 and torch.equal(pickle.loads(blob)[3].ids, windows[3].ids)


def test_the_builtin_corpus_is_split_by_whole_documents():
    docs = builtin_documents()
    splits = builtin_splits(docs, 10, 10)
    sizes = {s: sum(len(docs[n]) for n in docs if splits[n] == s) for s in ("train", "valid", "test")}
    total = sum(sizes.values())
    assert total > 300_000 and 0.08 < sizes["valid"] / total < 0.16 and 0.08 < sizes["test"] / total < 0.16


# --- windows and perplexity -----------------------------------------------------------------------

def test_non_overlapping_windows_cover_the_stream_once():
    ids = np.arange(21)
    w = Windows(ids, 4)
    assert len(w) == 5 and [int(w[i].ids[0]) for i in range(5)] == [0, 4, 8, 12, 16]
    assert all(w[i].score_from == 0 and len(w[i].ids) == 5 for i in range(5))
    assert len(Windows(np.arange(20), 4)) == 4  # the last window needs its target: 16..20 is missing
    assert len(Windows(np.arange(4), 4)) == 0


def test_sliding_windows_score_every_token_once_with_context():
    ids = np.arange(30)
    w = Windows(ids, 8, stride=3)
    scored = []
    for i in range(len(w)):
        win = w[i]
        targets = win.ids[1:].tolist()
        scored += targets[win.score_from:]
        assert i == 0 or win.score_from == 5  # at least 5 tokens of context
    assert scored == list(range(1, len(scored) + 1))


class Uniform(nn.Module):
    """Logits that give every one of V tokens the same probability: perplexity V exactly."""

    def __init__(self, vocab):
        super().__init__()
        self.vocab = vocab

    def forward(self, tokens):
        return torch.zeros(*tokens.shape, self.vocab)


class Successor(nn.Module):
    """P(next = token + 1 mod V) = p, the rest uniform: NLL -log p on a counting stream."""

    def __init__(self, vocab, p):
        super().__init__()
        self.vocab, self.p = vocab, p

    def forward(self, tokens):
        rest = (1 - self.p) / (self.vocab - 1)
        probs = torch.full((*tokens.shape, self.vocab), rest)
        probs.scatter_(-1, ((tokens + 1) % self.vocab)[..., None], self.p)
        return probs.log()


def toy_task(ids, **kw) -> LMTask:
    cfg = LMConfig(name="lm", train_length=4, eval_lengths=[4, 8], **kw)
    cfg.validate()
    task = LMTask(cfg)
    for split in ("train", "valid", "test"):
        task._streams[split] = TokenStream(ids, {"tokens": len(ids), "lines": 0, "chars": 0, "sha256": "0" * 64,
                                                 "source": {"source": "toy"}})
    return task


def evaluate(task, model, split="valid"):
    data = task.dataset(split)
    evaluation = task.build_evaluation(split)
    batch = task.collate([data[i] for i in range(len(data))])  # both lengths in one padded batch
    task.evaluate(model, batch, evaluation)
    return evaluation.compute()


@pytest.mark.parametrize("stride", [0, 2])
def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(stride):
    ids = np.arange(4, 37) % 11 + 4  # 33 tokens
    result = evaluate(toy_task(ids, eval_stride=stride), Uniform(17))
    assert result.metrics["ppl"] == pytest.approx(17.0)
    for length, row in result.by_length.items():
        assert row["ppl"] == pytest.approx(17.0) and row["loss"] == pytest.approx(math.log(17))
    if stride == 0:  # windows 0-4, 4-8, ..., 28-32 at length 4; 0-8, ..., 24-32 at length 8
        assert result.by_length[4]["n"] == 32 and result.by_length[8]["n"] == 32
    else:  # every target from 1 to 32 once, whatever the window length
        assert result.by_length[4]["n"] == 32 and result.by_length[8]["n"] == 32


def test_perplexity_by_length_and_position_bucket_is_hand_computable():
    vocab = 10
    ids = np.arange(41) % vocab
    ids[20] = 5  # breaks the successor rule twice: target 20 (after 9) and target 21 (after 5)
    p = 0.5
    result = evaluate(toy_task(ids), Successor(vocab, p))
    rest = (1 - p) / (vocab - 1)
    hit, miss = -math.log(p), -math.log(rest)
    # length 4: windows start at 0, 4, ..., 36: 40 targets; targets 20 and 21 miss.
    assert result.by_length[4]["n"] == 40
    assert result.by_length[4]["loss"] == pytest.approx((38 * hit + 2 * miss) / 40)
    # length 8: windows start 0, 8, 16, 24, 32; target 20 is position 3, target 21 position 4 of window 16.
    row = result.by_length[8]
    assert row["n"] == 40
    assert row["ppl_pos0-3"] == pytest.approx(math.exp((19 * hit + miss) / 20))
    assert row["ppl_pos4-7"] == pytest.approx(math.exp((19 * hit + miss) / 20))
    assert result.metrics["loss"] == pytest.approx(result.by_length[4]["loss"])


def test_per_length_metrics_sum_over_batches_and_keep_buckets_apart():
    evaluation = PerplexityEvaluation([4, 8, 16], train_length=4)
    assert evaluation.bounds == position_buckets(4, 16) == [0, 4, 8]
    nll = torch.arange(16, dtype=torch.float).repeat(2, 1)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[0, :8] = True
    mask[1, :] = True
    evaluation.update(nll[:1, :8], mask[:1, :8], torch.tensor([8]))
    evaluation.update(nll[1:], mask[1:], torch.tensor([16]))
    result = evaluation.compute()
    assert 4 not in result.by_length and result.metrics == {}  # nothing at the training length
    assert result.by_length[8]["loss"] == pytest.approx(3.5) and result.by_length[8]["n"] == 8
    assert result.by_length[16]["ppl_pos8-15"] == pytest.approx(math.exp(11.5))
    assert result.by_length[16]["ppl_pos0-3"] == pytest.approx(math.exp(1.5))
    evaluation.reset()
    assert evaluation.compute().by_length == {}


# --- bad input: one line each --------------------------------------------------------------------

def one_line_error(fn, match):
    with pytest.raises(UserError, match=match) as info:
        fn()
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_missing_file_is_one_line(tmp_path):
    task = files_task(tmp_path, valid_files=[str(tmp_path / "nope.txt")])
    one_line_error(lambda: task.source("valid"), r"nope.txt: no such file; check task.valid_files")


def test_an_empty_file_is_one_line(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    task = files_task(tmp_path, test_files=[str(tmp_path / "empty.txt")])
    one_line_error(lambda: task.source("test"), r"empty.txt: empty file")


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    (tmp_path / "latin1.txt").write_bytes("one line\nzwei Gr\u00fc\u00dfe\n".encode("latin-1"))
    for block in (4, 1 << 16):  # the offset counts across blocks
        one_line_error(lambda: list(read_pieces(tmp_path / "latin1.txt", block=block)),
                       r"latin1.txt: not UTF-8 text at byte 16 \(line 2\).*iconv")


def test_a_text_shorter_than_one_window_is_one_line(tmp_path):
    text_file(tmp_path / "tiny.txt", lines=1)
    task = files_task(tmp_path, valid_files=[str(tmp_path / "tiny.txt")])
    one_line_error(lambda: task.dataset("valid"), r"\[valid\] valid: 1 file has \d+ tokens, fewer than one window "
                                                  r"at evaluation length 16 \(16 \+ 1\)")
    task = files_task(tmp_path, train_length=4096, eval_lengths=[4096])
    one_line_error(lambda: task.dataset("train"), r"fewer than one training window .*task.train_length")


def test_config_mistakes_are_named():
    for kw, message in [({"eval_lengths": [16, 32]}, "must include task.train_length=64"),
                        ({"eval_stride": 100}, "eval_stride=100"), ({"corpus": "web"}, "choose one of")]:
        with pytest.raises(ValueError, match=message):
            LMConfig(name="lm", **kw).validate()


def test_the_task_needs_a_decoder_only_model(tmp_path):
    task = files_task(tmp_path)
    with pytest.raises(UserError, match="set model.architecture=decoder_only"):
        task.build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32))


def test_the_task_refuses_a_scheme_that_places_digits(tmp_path):
    from relpos_lab.core.positions import AbacusConfig

    task = files_task(tmp_path)
    with pytest.raises(UserError, match="task 'lm' reads subword pieces"):
        task.build_model(ModelConfig(d_model=16, n_heads=2, d_ff=32, architecture="decoder_only",
                                     positions=AbacusConfig()))


# --- generation -----------------------------------------------------------------------------------

def test_top_k_and_temperature():
    logits = torch.tensor([[0.0, 5.0, 4.0, -1.0]])
    assert next_token(logits, temperature=0).item() == 1
    gen = torch.Generator().manual_seed(0)
    draws = {next_token(logits, 1.0, top_k=2, generator=gen).item() for _ in range(200)}
    assert draws == {1, 2}


def test_generate_continues_a_prompt_and_refuses_a_seq2seq_model(tmp_path):
    task = files_task(tmp_path)
    model = task.build_model(ModelConfig(architecture="decoder_only", d_model=16, n_heads=2, d_ff=32,
                                         n_decoder_layers=1, dropout=0.0, attention_dropout=0.0)).eval()
    a = generate(task, model, "the quick", max_new_tokens=6, top_k=5, seed=3)
    assert a == generate(task, model, "the quick", max_new_tokens=6, top_k=5, seed=3) and a
    prompt = task.encode_input("the quick\nbrown")
    assert (prompt == 2).sum() == 1  # the line break is the stream's EOS
    new, _ = sample(model, prompt[None], 4, temperature=0)
    assert new.shape == (1, 4)
    seq2seq = PrefixLM(ModelConfig(architecture="decoder_only", src_vocab_size=9, tgt_vocab_size=9, d_model=16,
                                   n_heads=2, d_ff=32, n_decoder_layers=1), shared_vocab=True)
    one_line_error(lambda: generate(task, seq2seq, "x"), "sequence-to-sequence model.*relpos-lab translate")


# --- Hugging Face datasets (no network: a stand-in module) -----------------------------------------

def test_hf_without_the_datasets_package_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    one_line_error(lambda: hf_source("train", "wikitext", "wikitext-103-raw-v1", "train", "text"),
                   r"needs the Hugging Face datasets package: pip install 'relpos-lab\[hf\]'")


def test_hf_rows_stream_as_lines_and_failures_are_one_line(monkeypatch):
    class Rows(list):
        column_names = ["text"]
        _fingerprint = "abc"

    def load_dataset(name, config, split):
        if name == "offline":
            raise ConnectionError("Couldn't reach 'offline' on the Hub (LocalEntryNotFoundError)\nmore detail")
        return Rows([{"text": " = Title = \n"}, {"text": "first line\nsecond line"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    source = hf_source("valid", "wikitext", "wikitext-103-raw-v1", "validation", "text")
    assert [p.text for p in source] == [" = Title = ", "first line", "second line"]
    assert "abc" in source.identity and source.details["rows"] == 2
    one_line_error(lambda: hf_source("train", "offline", None, "train", "text"), r"cannot load Hugging Face dataset "
                   r"offline/None split train: Couldn't reach")
    one_line_error(lambda: hf_source("train", "wikitext", None, "train", "body"), r"no column 'body'.*text")
