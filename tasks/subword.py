"""The subword vocabulary of a task over text: one SentencePiece model, trained once, cached.

Shared by translation (one joint model of both sides) and language modelling (a model of the
training stream; `src` is then an iterable of lines read lazily, `tgt` empty): the training text is
only ever iterated, never held whole, so a corpus of any size streams through the hash and the
trainer (which keeps `input_sentence_size` sampled lines).

SentencePiece rather than Hugging Face tokenizers, because:
- it works on raw text with no pre-tokenizer, and decoding inverts encoding (up to its Unicode
  normalisation), so hypotheses come back as plain detokenized text — what sacrebleu must score;
- unigram and BPE come from one C++ trainer that is already a dependency of relpos-lab;
- a model is one serialized protobuf (a few hundred KB), small enough to travel inside every
  checkpoint, which is what lets a checkpoint alone translate;
- its special ids can be set to the framework's (<pad> 0, <s> 1, </s> 2, <unk> 3, see
  `Vocabulary`), so piece ids are token ids with no mapping table.

One joint model is trained on the source and target sides of the training split together (so
names, numbers and format strings that are copied get the same pieces on both sides). It is cached
as ``<data_dir>/subword/spm-<key>.model``, where the key hashes the settings *and* the training
text: a rerun, another experiment on the same corpus, or another rank finds it and trains nothing,
while a change of corpus or vocabulary size can never pick up a stale model.

Under DDP only rank 0 trains; the other ranks wait for the file. A file lock also serialises
independent runs that share a data directory (two experiments started together), so a model is
trained once and written atomically.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import itertools
import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import sentencepiece as spm

from relpos_lab.api import UserError, Vocabulary, atomic_write

MODEL_TYPES = ("unigram", "bpe")


@dataclass
class SubwordConfig:
    vocab_size: int = 8000
    """an upper bound: a small corpus yields fewer pieces"""
    model_type: str = "unigram"
    """unigram | bpe"""
    character_coverage: float = 1.0
    """share of characters covered by pieces; the rest map to <unk>"""
    input_sentence_size: int = 2_000_000
    """sentences (both sides) sampled to train on; 0: all"""

    def validate(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"task.subword.model_type={self.model_type!r}; choose one of {', '.join(MODEL_TYPES)}")
        if self.vocab_size < len(Vocabulary.SPECIALS) + 1:
            raise ValueError(f"task.subword.vocab_size={self.vocab_size} must be > {len(Vocabulary.SPECIALS)}")
        if not 0.0 < self.character_coverage <= 1.0:
            raise ValueError(f"task.subword.character_coverage={self.character_coverage} must be in (0, 1]")
        if self.input_sentence_size < 0:
            raise ValueError(f"task.subword.input_sentence_size={self.input_sentence_size} must be >= 0")


class SubwordModel:
    """A trained SentencePiece model whose ids are the task's token ids."""

    def __init__(self, proto: bytes):
        self.proto = proto
        self.sp = spm.SentencePieceProcessor(model_proto=proto)
        specials = tuple(self.sp.id_to_piece(i) for i in range(len(Vocabulary.SPECIALS)))
        if specials != Vocabulary.SPECIALS:
            raise UserError(f"subword model has special pieces {specials}, expected {Vocabulary.SPECIALS}")

    def __len__(self) -> int:
        return self.sp.get_piece_size()

    def vocabulary(self) -> Vocabulary:
        return Vocabulary(self.sp.id_to_piece(i) for i in range(len(Vocabulary.SPECIALS), len(self)))

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.sp.encode(list(texts))

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The pieces of `ids` up to the first EOS, without pad and BOS: `Vocabulary.decode`'s contract."""
        size = len(self)
        return [self.sp.id_to_piece(i) if 0 <= i < size else Vocabulary.SPECIALS[3] for i in Vocabulary.content(ids)]

    def detokenize(self, ids: Iterable[int]) -> str:
        """The text of `ids` up to the first EOS: the pieces joined, SentencePiece's spaces restored."""
        return self.sp.decode(Vocabulary.content(ids))


def cache_key(cfg: SubwordConfig, src: Iterable[str], tgt: Iterable[str]) -> str:
    """Hash of the settings and the training text: what makes a cached model the right one."""
    digest = hashlib.sha256(json.dumps(asdict(cfg), sort_keys=True).encode())
    for side in (src, tgt):
        for line in side:
            digest.update(line.encode("utf-8"))
            digest.update(b"\n")
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def load_or_train(cfg: SubwordConfig, src: Iterable[str], tgt: Iterable[str], cache_dir: str | Path, *,
                  rank: int = 0, wait_seconds: float = 3600.0) -> tuple[SubwordModel, bool]:
    """The cached model for these settings and text, trained first if there is none.

    Returns (model, trained): `trained` is True only in the one process that trained it. `src`
    and `tgt` are iterated more than once (hash, then training): pass lists or re-iterable views.
    """
    cache_dir = Path(cache_dir)
    path = cache_dir / f"spm-{cache_key(cfg, src, tgt)}.model"
    if path.is_file():
        return SubwordModel(path.read_bytes()), False
    if rank != 0:
        return SubwordModel(_wait_for(path, wait_seconds)), False
    cache_dir.mkdir(parents=True, exist_ok=True)
    with locked(path.with_suffix(".lock")):
        if path.is_file():  # another run trained it while we waited for the lock
            return SubwordModel(path.read_bytes()), False
        proto = train(cfg, itertools.chain(src, tgt))
        atomic_write(path, proto)
        settings = {**asdict(cfg), "sentences": {"src": _count(src), "tgt": _count(tgt)}}
        atomic_write(path.with_suffix(".json"), json.dumps(settings, indent=2).encode())
    return SubwordModel(proto), True


def train(cfg: SubwordConfig, sentences: Iterable[str]) -> bytes:
    """Train a model on `sentences`; its specials are the framework's ids 0-3."""
    model = io.BytesIO()
    spm.set_random_generator_seed(0)  # the sentences sampled by input_sentence_size
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences), model_writer=model,
            vocab_size=cfg.vocab_size, model_type=cfg.model_type, character_coverage=cfg.character_coverage,
            input_sentence_size=cfg.input_sentence_size, shuffle_input_sentence=True,
            hard_vocab_limit=False, pad_id=0, bos_id=1, eos_id=2, unk_id=3,
            pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>",
            num_threads=min(4, os.cpu_count() or 1), minloglevel=2,
        )
    except RuntimeError as err:  # e.g. a vocabulary smaller than the corpus's character set
        raise UserError(f"cannot train the subword model: {str(err).strip().splitlines()[-1]}") from None
    return model.getvalue()


def _wait_for(path: Path, seconds: float) -> bytes:
    deadline = time.monotonic() + seconds
    while not path.is_file():
        if time.monotonic() > deadline:
            raise UserError(f"waited {seconds:.0f}s for rank 0 to train the subword model {path}; "
                            "did it fail? (see its log)")
        time.sleep(1.0)
    return path.read_bytes()


def _count(items: Iterable[str]) -> int:
    return len(items) if isinstance(items, Sequence) else sum(1 for _ in items)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive file lock: one process at a time builds a cache that several may want."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
