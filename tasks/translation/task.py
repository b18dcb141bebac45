"""Machine translation: the paper's headline task, at a scale a CPU can train.

A corpus of sentence pairs (corpora.py: aligned files, TSV, Hugging Face datasets; or the
machine's own gettext catalogs, gettext_corpus.py, the built-in corpus that needs no download) is
encoded with one joint SentencePiece model trained on its training split (subword.py), batched by
tokens with length bucketing (`max_tokens`, the framework's TokenBatchSampler), and evaluated by
beam search (beam 4, length penalty 0.6, as in the paper) with sacrebleu's corpus BLEU and chrF on
the detokenized output (bleu.py) — per source-length bucket too, the view a position study wants.

Training pairs longer than `max_len` subword tokens on either side, or whose lengths differ by
more than `max_len_ratio` (Moses' clean-corpus rule), are filtered out, and counted in the log.
Valid and test are never length-filtered: every reference sentence with a non-empty source and
reference is scored (pairs with an empty side are skipped in every split, and counted in the log:
corpora.from_pairs).

The checkpoint carries the subword model (`state_dict`), so `relpos-lab translate CHECKPOINT`
and `relpos-lab eval` need no cache. This module uses only relpos_lab's public API and is
registered through the ``relpos_lab.tasks`` entry points like any plugin.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import NamedTuple

import torch
from sacrebleu.metrics import BLEU, CHRF
from torch import Tensor, nn
from torchmetrics import MetricCollection

from relpos_lab.api import Batch, DecodingConfig, Evaluation, Seq2SeqTask, TaskConfig, UserError
from relpos_lab.api.samples import pick_rows
from relpos_lab.core.loss import label_smoothed_loss
from relpos_lab_tasks.subword import SubwordConfig, SubwordModel, load_or_train
from relpos_lab_tasks.translation.bleu import CorpusEvaluation, CorpusScore, data_signature
from relpos_lab_tasks.translation.corpora import ParallelText, read_aligned, read_hf, read_tsv
from relpos_lab_tasks.translation.gettext import build_corpus

CORPORA = ("gettext", "files", "tsv", "hf")
DEBUG_SENTENCES = 64  # valid and test pairs under the `debug` overlay (TranslationConfig.for_debug)
DEBUG_TRAIN_SENTENCES = 2000  # ... and training pairs, which the subword model is trained on too
DEBUG_MAX_TOKENS = 1024  # ... and padded tokens per training batch (the overlay's data.batch_size is for examples)
HF_SPLITS = {"train": "train", "valid": "validation", "test": "test"}


@dataclass
class TranslationConfig(TaskConfig):
    corpus: str = "gettext"
    """gettext | files | tsv | hf"""
    data_dir: str = "data/gettext-en-de"
    """the corpus files (files, tsv) and the cached subword model"""
    src_lang: str = "en"
    """source language code (file suffix, gettext: en)"""
    tgt_lang: str = "de"
    """target language code (file suffix, gettext catalog language)"""
    split_names: dict[str, str] = field(default_factory=dict)
    """File stem (files: <stem>.<lang>, tsv: <stem>.tsv) or HF split of each split, where it is not
    the split's own name (HF: valid -> validation); e.g. {valid: newstest2013, test: newstest2014}."""
    hf_dataset: str | None = None
    """corpus=hf: e.g. wmt14, iwslt2017"""
    hf_config: str | None = None
    """corpus=hf: e.g. de-en, iwslt2017-en-de"""
    locale_dir: str = "/usr/share/locale"
    """corpus=gettext: catalogs of <locale_dir>/<tgt_lang>/LC_MESSAGES"""
    valid_size: int = 1000
    """corpus=gettext: messages held out for valid"""
    test_size: int = 2000
    """corpus=gettext: messages held out for test"""
    max_chars: int = 200
    """corpus=gettext: longer messages (option tables, licences) are left out"""
    subword: SubwordConfig = field(default_factory=SubwordConfig)
    """the SentencePiece model trained on the corpus"""
    max_len: int = 128
    """training pairs with a side longer than this (subword tokens) are filtered"""
    max_len_ratio: float = 3.0
    """... or with (longer + 1) / (shorter + 1) above this"""
    max_tokens: int = 4096
    """padded tokens per training batch (per process)"""
    eval_max_tokens: int = 4096
    """padded tokens per evaluation batch (beam search multiplies them)"""
    train_sentences: int = 0
    """read only the first this many training pairs (corpus=hf streams them); 0: all (`debug` sets it)"""
    eval_sentences: int = 0
    """score the first this many pairs of valid and test (corpus=hf streams them); 0: all (`debug` sets it)"""
    length_buckets: list[int] = field(default_factory=lambda: [1, 6, 11, 21, 41])
    """by_length: lower bounds of source-length buckets (subword tokens) for BLEU/chrF by length;
    [] for none"""
    decoding: DecodingConfig = field(default_factory=lambda: DecodingConfig(
        beam_size=4, length_penalty=0.6, max_len_a=1.5, max_len_b=10))
    """beam search of 4, as in the paper"""

    def for_debug(self) -> TranslationConfig:
        """DEBUG_SENTENCES pairs of valid and test scored (gettext's held-out sets cut to as many),
        DEBUG_TRAIN_SENTENCES training pairs read, in batches of DEBUG_MAX_TOKENS."""
        return dataclasses.replace(self, max_tokens=min(self.max_tokens, DEBUG_MAX_TOKENS),
                                   valid_size=min(self.valid_size, DEBUG_SENTENCES),
                                   test_size=min(self.test_size, DEBUG_SENTENCES),
                                   eval_sentences=min(self.eval_sentences or DEBUG_SENTENCES, DEBUG_SENTENCES),
                                   train_sentences=min(self.train_sentences or DEBUG_TRAIN_SENTENCES,
                                                       DEBUG_TRAIN_SENTENCES))

    def validate(self) -> None:
        super().validate()
        if self.corpus not in CORPORA:
            raise ValueError(f"task.corpus={self.corpus!r}; choose one of {', '.join(CORPORA)}")
        if self.corpus == "gettext" and self.src_lang != "en":
            raise ValueError(f"task.src_lang={self.src_lang!r}: gettext catalogs translate from English (en)")
        if self.corpus == "hf" and not self.hf_dataset:
            raise ValueError("task.hf_dataset=None: corpus=hf needs a dataset name, e.g. task.hf_dataset=wmt14")
        unknown = sorted(set(self.split_names) - set(HF_SPLITS))
        if unknown:
            raise ValueError(f"task.split_names={dict(self.split_names)} names unknown splits {unknown}; "
                             f"splits: {', '.join(HF_SPLITS)}")
        for name in ("valid_size", "test_size", "max_chars", "max_len", "max_tokens", "eval_max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 1")
        for name in ("train_sentences", "eval_sentences"):
            if getattr(self, name) < 0:
                raise ValueError(f"task.{name}={getattr(self, name)} must be >= 0 (0: all)")
        if self.max_len_ratio < 1:
            raise ValueError(f"task.max_len_ratio={self.max_len_ratio} must be >= 1")
        if list(self.length_buckets) != sorted(set(self.length_buckets)) or any(b < 1 for b in self.length_buckets):
            raise ValueError(f"task.length_buckets={list(self.length_buckets)} must be increasing lower bounds >= 1")
        self.subword.validate()


class Sentence(NamedTuple):
    """One example: subword ids (no BOS/EOS) and the texts it came from."""

    src: Tensor
    tgt: Tensor
    index: int  # position in its split, which orders the hypotheses file
    src_text: str
    tgt_text: str  # the reference, as sacrebleu scores it


class TranslationTask(Seq2SeqTask):
    """Translate sentences (gettext catalogs, aligned files, TSV, HF datasets); SentencePiece, BLEU."""

    config_class = TranslationConfig
    main_metric = "bleu"
    cfg: TranslationConfig

    def __init__(self, cfg: TranslationConfig, *, seed: int = 0):
        super().__init__(cfg, seed=seed)
        self._texts: dict[str, ParallelText] = {}

    # --- text and vocabulary ----------------------------------------------------------------

    def text(self, split: str) -> ParallelText:
        """The sentence pairs of `split` (the first task.train_sentences / eval_sentences), read (and reported) once."""
        self.check_split(split)
        if split not in self._texts:
            c, name = self.cfg, self.cfg.split_names.get(split, split)
            if c.corpus == "gettext":
                self._texts.update({s: text.head(self._limit(s)) for s, text in self._gettext.splits.items()})
            elif c.corpus == "files":
                self._texts[split] = read_aligned(self.data_dir / f"{name}.{c.src_lang}",
                                                  self.data_dir / f"{name}.{c.tgt_lang}").head(self._limit(split))
            elif c.corpus == "tsv":
                self._texts[split] = read_tsv(self.data_dir / f"{name}.tsv").head(self._limit(split))
            else:
                hf_split = c.split_names.get(split, HF_SPLITS[split])
                self._texts[split] = read_hf(c.hf_dataset, c.hf_config, hf_split, c.src_lang, c.tgt_lang,
                                             limit=self._limit(split))
            if c.corpus != "gettext":
                rank_zero_info(f"[{split}] {self._texts[split].report()}")
        return self._texts[split]

    def _limit(self, split: str) -> int:
        return self.cfg.train_sentences if split == "train" else self.cfg.eval_sentences

    @cached_property
    def _gettext(self):
        c = self.cfg
        corpus = build_corpus(c.locale_dir, c.tgt_lang, valid_size=c.valid_size, test_size=c.test_size,
                              max_chars=c.max_chars)
        rank_zero_info(corpus.report)
        return corpus

    @property
    def data_dir(self) -> Path:
        return Path(self.cfg.data_dir)

    @cached_property
    def subword(self) -> SubwordModel:
        """The joint subword model of the training split: cached on disk, trained by rank 0 once."""
        train = self.text("train")
        model, trained = load_or_train(self.cfg.subword, train.src, train.tgt, self.data_dir / "subword",
                                       rank=_rank())
        rank_zero_info(f"subword model: {'trained' if trained else 'reused the cached'} "
                       f"{self.cfg.subword.model_type} model with {len(model)} pieces in {self.data_dir / 'subword'}")
        return model

    def prepare_data(self) -> None:
        self.subword  # noqa: B018 - trains and caches the model if no process has yet

    def build_vocab(self):
        return self.subword.vocabulary()

    def state_dict(self) -> dict:
        return {"sentencepiece": self.subword.proto}

    def load_state_dict(self, state: dict) -> None:
        if "sentencepiece" in state:
            self.__dict__["subword"] = SubwordModel(state["sentencepiece"])

    # --- examples and batches ----------------------------------------------------------------

    def dataset(self, split: str) -> list[Sentence]:
        text = self.text(split)
        src, tgt = self.subword.encode(text.src), self.subword.encode(text.tgt)
        keep = range(len(text))
        if split == "train":
            keep = [i for i in keep if self._fits(len(src[i]), len(tgt[i]))]
            if len(keep) < len(text):
                rank_zero_info(f"[train] filtered {len(text) - len(keep)} of {len(text)} pairs longer than "
                               f"task.max_len={self.cfg.max_len} subword tokens or with a length ratio over "
                               f"task.max_len_ratio={self.cfg.max_len_ratio}")
            if not keep:
                raise UserError(f"{text.origin}: every training pair was filtered by task.max_len / max_len_ratio")
        return [Sentence(torch.tensor(src[i]), torch.tensor(tgt[i]), i, text.src[i], text.tgt[i]) for i in keep]

    def _fits(self, n_src: int, n_tgt: int) -> bool:
        ratio = (max(n_src, n_tgt) + 1) / (min(n_src, n_tgt) + 1)
        return max(n_src, n_tgt) <= self.cfg.max_len and ratio <= self.cfg.max_len_ratio

    def max_tokens(self, split: str) -> int:
        return self.cfg.max_tokens if split == "train" else self.cfg.eval_max_tokens

    def collate(self, examples: Sequence[Sentence]) -> Batch:
        batch = super().collate(examples)
        batch["index"] = torch.tensor([e.index for e in examples], dtype=torch.long)
        batch["src_text"] = [e.src_text for e in examples]
        batch["tgt_text"] = [e.tgt_text for e in examples]
        return batch

    def length_buckets(self, split: str) -> list[int] | None:
        return list(self.cfg.length_buckets) or None

    def bucket_of(self, lengths: Tensor) -> Tensor:
        """Source length -> the lower bound of its bucket (the first bucket takes anything shorter)."""
        bounds = torch.tensor(self.cfg.length_buckets, device=lengths.device)
        return bounds[(torch.searchsorted(bounds, lengths, right=True) - 1).clamp_min(0)]

    # --- text in and out ----------------------------------------------------------------------

    def encode_input(self, line: str) -> Tensor:
        return torch.tensor(self.subword.encode([line.strip()])[0], dtype=torch.long)

    def detokenize(self, ids: Tensor) -> str:
        return self.subword.detokenize(ids.tolist())

    # --- evaluation ---------------------------------------------------------------------------

    def build_metrics(self) -> MetricCollection:
        return MetricCollection({"corpus": CorpusScore()})

    def build_evaluation(self, split: str) -> Evaluation:
        return CorpusEvaluation(self.build_metrics(), self.length_buckets(split), details=self._train_signature)

    def _train_signature(self) -> dict[str, str]:
        """Which training pairs the model learned from, when this process read them (a checkpoint
        evaluated on its own carries its vocabulary, not its training text)."""
        train = self._texts.get("train")
        return {"train_data_signature": data_signature(train.src, train.tgt)} if train is not None else {}

    def evaluate(self, model: nn.Module, batch: Batch, evaluation: Evaluation) -> Tensor:
        """Teacher-forced loss, then beam search scored as detokenized text against the reference."""
        forced = label_smoothed_loss(model(batch["src"], batch["tgt_in"]), batch["tgt_out"], smoothing=0.0,
                                     ignore_index=self.tgt_vocab.pad_id)
        evaluation.update_nll(forced.nll_sum, forced.n_tokens)
        hyps = self.predict(model, batch)
        texts = [self.detokenize(h) for h in hyps.cpu()]
        evaluation.update(texts, batch["tgt_text"], batch["index"], batch["src_text"],
                          lengths=self.bucket_of(batch["length"]))
        return hyps

    def sample_rows(self, batch: Batch, hyps: Tensor, n: int = 8) -> tuple[list[str], list[list]]:
        lengths = batch["length"].tolist()
        rows = [[lengths[i], batch["src_text"][i], batch["tgt_text"][i], self.detokenize(hyps[i].cpu())]
                for i in pick_rows(lengths, n)]
        return ["length", "source", "reference", "hypothesis"], rows

    def copy_baseline(self, split: str = "test") -> dict[str, float | str]:
        """BLEU and chrF of copying each source sentence unchanged: the trivial baseline to beat
        (names, numbers and format strings are often left untranslated in software messages)."""
        text = self.text(split)
        bleu, chrf = BLEU(), CHRF()
        return {"bleu": bleu.corpus_score(text.src, [text.tgt]).score,
                "chrf": chrf.corpus_score(text.src, [text.tgt]).score,
                "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature()),
                "sentences": len(text)}


def rank_zero_info(message: str) -> None:
    """Print once per job, through Lightning's logger (imported here: reading a config, which
    imports this module, must not load Lightning)."""
    from lightning.pytorch.utilities.rank_zero import rank_zero_info as info

    info(message)


def _rank() -> int:
    from lightning.pytorch.utilities.rank_zero import rank_zero_only

    return rank_zero_only.rank
