"""Language modelling: a decoder-only Transformer on a token stream, scored by perplexity by length.

The protocol of the ALiBi paper's Figure 1 (Press et al., 2022): train on windows of
`train_length` tokens, evaluate perplexity on windows of several lengths (default 1×, 2×, 4×, 8×
the training length), so one sweep over position schemes draws perplexity against evaluation
length for each. Evaluation is non-overlapping by default (`eval_stride: 0`: each window scored
whole, positions 0..L-1, the setting that tests extrapolation; ALiBi's Figure 1 too);
`eval_stride: S` scores sliding windows, each token with at least L - S tokens of context.
results.json's `by_length` gives, per evaluation length, loss, ppl, ppl per token-position bucket
and the number of tokens scored; `valid/ppl` (the main metric) is the perplexity at the training
length, and `ppl_id` / `ppl_ood` summarise the lengths within and beyond it.

Text: the built-in corpus — the Python documentation's topic texts (`pydoc_data.topics`, ~465,000
characters of real English prose with code examples), chosen because every CPython ships it, so it
needs no download, and it is larger and less repetitive than /usr/share/common-licenses (text.py);
its signature records the Python version and the text's sha256 — or plain files of any size
(read lazily), or a Hugging Face dataset (wikitext-103, PG-19) where `datasets` and the data are
available. A SentencePiece model of the training text (the same cached machinery as
translation, ../subword.py) gives the ids, cached with the token streams under `data_dir`.

The task needs `model.architecture=decoder_only` and builds the core `DecoderLM` (causal, no
source): it says so in one line otherwise, rather than silently training something else.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from relpos_lab.api import Batch, ConfigError, Task, TaskConfig, UserError
from relpos_lab.core.loss import LossOutput, label_smoothed_loss
from relpos_lab.core.transformer import DecoderLM, ModelConfig
from relpos_lab_tasks.lm.metrics import PerplexityEvaluation
from relpos_lab_tasks.lm.text import TextSource, builtin_source, file_source, hf_source
from relpos_lab_tasks.lm.tokens import ConcatWindows, TokenStream, Window, Windows, load_or_build, signature
from relpos_lab_tasks.subword import SubwordConfig, SubwordModel, load_or_train

CORPORA = ("builtin", "files", "hf")
DEBUG_TOKENS = 2048  # what the `debug` overlay scores of each evaluation stream (LMConfig.for_debug)
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}
PAD, EOS = 0, 2  # the framework's specials (Vocabulary.SPECIALS), which the subword model keeps


@dataclass
class LMConfig(TaskConfig):
    corpus: str = "builtin"
    """builtin (Python's documentation, no download) | files | hf"""
    train_files: list[str] = field(default_factory=list)
    """corpus=files: UTF-8 text files (or glob patterns) of the training stream, read in order"""
    valid_files: list[str] = field(default_factory=list)
    """corpus=files: the validation stream"""
    test_files: list[str] = field(default_factory=list)
    """corpus=files: the test stream"""
    hf_dataset: str | None = None
    """corpus=hf: e.g. wikitext, pg19"""
    hf_config: str | None = None
    """corpus=hf: e.g. wikitext-103-raw-v1"""
    hf_text_field: str = "text"
    """corpus=hf: the column holding the text"""
    valid_percent: int = 10
    """corpus=builtin: share of the characters held out for valid, as whole documents"""
    test_percent: int = 10
    """corpus=builtin: share of the characters held out for test, as whole documents"""
    data_dir: str = "data/lm"
    """where the subword model and the token streams are cached"""
    subword: SubwordConfig = field(default_factory=lambda: SubwordConfig(vocab_size=4000))
    """the SentencePiece model trained on the training stream"""
    train_length: int = 64
    """tokens per training window (the model never sees a longer context in training)"""
    eval_lengths: list[int] = field(default_factory=list)
    """evaluation window lengths; must include train_length; []: 1x, 2x, 4x and 8x train_length"""
    eval_stride: int = 0
    """0: non-overlapping windows (default); S: sliding windows S apart, scoring each token once
    with >= L - S tokens of context (S < the shortest evaluation length)"""
    eval_tokens: int = 0
    """score at most this many tokens of each evaluation stream (its beginning); 0: all"""
    eval_max_tokens: int = 8192
    """padded tokens per evaluation batch"""

    def for_debug(self) -> LMConfig:
        """The first DEBUG_TOKENS tokens of each evaluation stream scored."""
        return dataclasses.replace(self, eval_tokens=min(self.eval_tokens or DEBUG_TOKENS, DEBUG_TOKENS))

    def validate(self) -> None:
        super().validate()
        if self.corpus not in CORPORA:
            raise ValueError(f"task.corpus={self.corpus!r}; choose one of {', '.join(CORPORA)}")
        if self.corpus == "hf" and not self.hf_dataset:
            raise ValueError("task.hf_dataset=None: corpus=hf needs a dataset name, e.g. task.hf_dataset=wikitext")
        if self.train_length < 1:
            raise ValueError(f"task.train_length={self.train_length} must be >= 1")
        lengths = self.lengths()
        if any(n < 1 for n in lengths) or len(set(lengths)) != len(lengths):
            raise ValueError(f"task.eval_lengths={list(self.eval_lengths)} must be distinct lengths >= 1")
        if self.train_length not in lengths:
            raise ValueError(f"task.eval_lengths={list(self.eval_lengths)} must include task.train_length="
                             f"{self.train_length} (the main metric's length)")
        if not 0 <= self.eval_stride <= min(lengths):
            raise ValueError(f"task.eval_stride={self.eval_stride} must be 0 (non-overlapping) or at most the "
                             f"shortest evaluation length {min(lengths)}")
        for name in ("valid_percent", "test_percent"):
            if not 0 < getattr(self, name) < 50:
                raise ValueError(f"task.{name}={getattr(self, name)} must be in 1..49")
        for name in ("eval_tokens", "eval_max_tokens"):
            if getattr(self, name) < 0 or (name == "eval_max_tokens" and self.eval_max_tokens < 1):
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= {int(name == 'eval_max_tokens')}")
        self.subword.validate()

    def lengths(self) -> list[int]:
        return sorted(self.eval_lengths) if self.eval_lengths else [self.train_length * m for m in (1, 2, 4, 8)]


class LMTask(Task):
    """Language modelling on a token stream (built-in corpus, text files, HF); perplexity by length."""

    config_class = LMConfig
    main_metric = "ppl"
    main_metric_mode = "min"
    cfg: LMConfig

    def __init__(self, cfg: LMConfig, *, seed: int = 0):
        super().__init__(cfg, seed=seed)
        self._streams: dict[str, TokenStream] = {}
        self._scored: dict[str, str] = {}  # split -> its text in words (TextSource.name)

    # --- text, vocabulary, token streams -----------------------------------------------------

    def source(self, split: str) -> TextSource:
        self.check_split(split)
        c = self.cfg
        if c.corpus == "builtin":
            return builtin_source(split, c.valid_percent, c.test_percent)
        if c.corpus == "files":
            return file_source(split, list(getattr(c, f"{split}_files")))
        return hf_source(split, c.hf_dataset, c.hf_config, HF_SPLITS[split], c.hf_text_field)

    @property
    def data_dir(self) -> Path:
        return Path(self.cfg.data_dir)

    @cached_property
    def subword(self) -> SubwordModel:
        """The subword model of the training stream: cached on disk, trained by rank 0 once."""
        train = self.source("train")
        model, trained = load_or_train(self.cfg.subword, train.lines(), [], self.data_dir / "subword", rank=_rank())
        _info(f"subword model: {'trained' if trained else 'reused the cached'} {self.cfg.subword.model_type} "
              f"model with {len(model)} pieces in {self.data_dir / 'subword'}")
        return model

    def stream(self, split: str) -> TokenStream:
        """The split's token ids (a memmap), tokenised once and cached under data_dir/tokens."""
        if split not in self._streams:
            source = self.source(split)
            stream, built = load_or_build(source, self.subword, self.data_dir / "tokens", split)
            self._scored[split] = source.name.removeprefix(f"{split}: ")
            _info(f"[{split}] {'tokenised' if built else 'cached'} {source.name}: {stream.info['tokens']} tokens, "
                  f"{stream.info['lines']} lines")
            self._streams[split] = stream
        return self._streams[split]

    def prepare_data(self) -> None:
        for split in self.splits:
            self.stream(split)

    def state_dict(self) -> dict:
        return {"sentencepiece": self.subword.proto}

    def load_state_dict(self, state: dict) -> None:
        if "sentencepiece" in state:
            self.__dict__["subword"] = SubwordModel(state["sentencepiece"])

    # --- windows and batches -------------------------------------------------------------------

    def dataset(self, split: str):
        self.check_split(split)
        c, stream = self.cfg, self.stream(split)
        n = len(stream.ids)
        lengths = [c.train_length] if split == "train" else c.lengths()
        longest = max(lengths)
        if n < longest + 1:
            what = "one training window" if split == "train" else f"one window at evaluation length {longest}"
            fix = "task.train_length" if split == "train" else "task.eval_lengths"
            raise UserError(f"[{split}] {self.source(split).name} has {n} tokens, fewer than {what} "
                            f"({longest} + 1): use more text or a smaller {fix}")
        if split == "train":
            return Windows(stream.ids, c.train_length)
        limit = c.eval_tokens or None
        if limit is not None and limit < longest + 1:
            raise UserError(f"task.eval_tokens={limit} is less than one window at evaluation length {longest} "
                            f"(+1): raise it or set 0 (all)")
        return ConcatWindows([Windows(stream.ids, n_, c.eval_stride or n_, limit) for n_ in lengths])

    def collate(self, examples: Sequence[Window]) -> Batch:
        """Windows as input (B, L), target (B, L), right-padded (causal attention never sees the
        padding to the right of a token); score_from and length per row."""
        ids = [w.ids for w in examples]
        return {"input": pad_sequence([x[:-1] for x in ids], batch_first=True, padding_value=PAD),
                "target": pad_sequence([x[1:] for x in ids], batch_first=True, padding_value=PAD),
                "length": torch.tensor([w.length for w in examples], dtype=torch.long),
                "score_from": torch.tensor([w.score_from for w in examples], dtype=torch.long)}

    def max_tokens(self, split: str) -> int | None:
        return None if split == "train" else self.cfg.eval_max_tokens

    def num_tokens(self, example: Window) -> int:
        return example.length

    def length_buckets(self, split: str) -> list[int]:
        return self.cfg.lengths()

    def train_length_range(self) -> tuple[int, int]:
        return (1, self.cfg.train_length)

    def example_length(self, example: Window) -> int:
        """A window's evaluation length (what `relpos-lab inspect` groups windows by)."""
        return example.length

    def inspect_lengths(self, split: str) -> list[int]:
        """Every evaluation length: attention by offset within the training length and beyond it."""
        return self.cfg.lengths()

    # --- model, loss, evaluation -------------------------------------------------------------

    def build_model(self, cfg: ModelConfig) -> nn.Module:
        if cfg.architecture != "decoder_only" or cfg.bidirectional_prefix:
            raise ConfigError(f"task 'lm' trains a causal decoder-only language model: set model.architecture="
                              f"decoder_only (now {cfg.architecture}) and model.bidirectional_prefix=false")
        if getattr(type(cfg.positions).scheme_class, "reads_tokens", False):
            raise ConfigError(f"model.positions.scheme={cfg.positions.scheme} places the digits of decimal numbers, "
                              "and task 'lm' reads subword pieces; pick another scheme (relpos-lab positions)")
        size = len(self.subword)
        for key in ("src_vocab_size", "tgt_vocab_size"):
            if getattr(cfg, key) not in (0, size):
                raise ConfigError(f"model.{key}={getattr(cfg, key)} but task 'lm' has a vocabulary of {size} "
                                  "pieces; leave it 0 to take the task's size")
        return DecoderLM(dataclasses.replace(cfg, src_vocab_size=size, tgt_vocab_size=size, pad_id=PAD))

    def loss(self, model: nn.Module, batch: Batch, label_smoothing: float) -> LossOutput:
        return label_smoothed_loss(model(batch["input"]), batch["target"], smoothing=label_smoothing, ignore_index=PAD)

    def build_evaluation(self, split: str) -> PerplexityEvaluation:
        return PerplexityEvaluation(self.cfg.lengths(), self.cfg.train_length, details=lambda: self._signatures(split))

    def _signatures(self, split: str) -> dict[str, str]:
        """Which text was scored, and which the model learned from (when this process read it); `data`
        says it in words for the run's closing summary (valid and test are different texts)."""
        out = {}
        for name, key in ((split, "data_signature"), ("train", "train_data_signature")):
            if name in self._streams:
                out[key] = signature(self._streams[name].info)
        if split in self._scored:
            out["data"] = f"{self._scored[split]}, {self._streams[split].info['tokens']:,} tokens"
        return out

    def evaluate(self, model: nn.Module, batch: Batch, evaluation: PerplexityEvaluation) -> None:
        logits = model(batch["input"]).float()
        target = batch["target"]
        nll = F.cross_entropy(logits.transpose(1, 2), target, reduction="none")
        position = torch.arange(target.shape[1], device=target.device)[None, :]
        mask = (position >= batch["score_from"][:, None]) & (position < batch["length"][:, None])
        evaluation.update(nll, mask, batch["length"])
        return None

    # --- text in and out (`relpos-lab generate`) ----------------------------------------------

    def encode_input(self, line: str) -> Tensor:
        """A prompt's ids: its lines, each but the last ended by EOS (an empty prompt: one EOS,
        the start of a line)."""
        lines = line.split("\n")
        ids: list[int] = []
        for i, text in enumerate(lines):
            ids.extend(self.subword.encode([text])[0] if text else [])
            if i < len(lines) - 1:
                ids.append(EOS)
        return torch.tensor(ids or [EOS], dtype=torch.long)

    def detokenize(self, ids: Tensor) -> str:
        """Generated ids as text, EOS as a line break."""
        lines, current = [], []
        for i in ids.tolist():
            if i == EOS:
                lines.append(current)
                current = []
            elif i != PAD:
                current.append(i)
        lines.append(current)
        return "\n".join(self.subword.detokenize(piece) for piece in lines)


def _info(message: str) -> None:
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    rank_zero_info(message)


def _rank() -> int:
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank
