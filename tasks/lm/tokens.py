"""The token stream of a split, cached on disk once, and the windows a model trains and is scored on.

Why an on-disk cache read through np.memmap rather than an IterableDataset that tokenises on the fly:
windows then form an ordinary map-style dataset (window i = a slice of the memmap), so everything
the framework does for map-style data holds unchanged — DDP sharding by the data module, the
seeded shuffle, resuming mid-epoch at the same window, token batching of evaluation — and
tokenising is paid once per corpus and vocabulary, not once per epoch and rank. Memory is the
page cache's business: a window reads only its own bytes.

The cache is ``<data_dir>/tokens/<split>-<key>.bin`` (uint16 ids, int32 for vocabularies over
65,535) beside a JSON of what it holds (token and line counts, the text's sha256, the source's
details). The key hashes the text's identity (`TextSource.identity`) and the subword model, so a
changed file or vocabulary never picks up a stale stream. It is written atomically, under a file
lock, by whichever process gets there first; the others read it.

Every line of text ends with the end-of-sequence token, as fairseq's language-modelling data does,
so the model learns where lines end and generation can write several.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from relpos_lab.api import UserError, atomic_write
from relpos_lab.api.files import atomic_write_with
from relpos_lab_tasks.lm.text import TextSource
from relpos_lab_tasks.subword import SubwordModel, locked

ENCODE_BATCH = 512  # pieces encoded per SentencePiece call


class TokenStream(NamedTuple):
    ids: np.ndarray  # a read-only memmap of the split's token ids
    info: dict  # tokens, lines, sha256 of the text, source details


def cache_path(cache_dir: Path, split: str, source: TextSource, subword: SubwordModel) -> Path:
    key = hashlib.sha256(source.identity.encode() + b"\0" + hashlib.sha256(subword.proto).digest()).hexdigest()[:16]
    return Path(cache_dir) / f"{split}-{key}.bin"


def load_or_build(source: TextSource, subword: SubwordModel, cache_dir: Path, split: str) -> tuple[TokenStream, bool]:
    """The split's cached token stream, tokenised first if no process has yet; (stream, built)."""
    path = cache_path(cache_dir, split, source, subword)
    built = False
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path.with_suffix(".lock")):
            if not path.is_file():
                info = build(source, subword, path)
                atomic_write(path.with_suffix(".json"), json.dumps(info, indent=2))
                built = True
    info = json.loads(path.with_suffix(".json").read_text())
    if info["tokens"] == 0:
        raise UserError(f"{source.name}: the text holds no tokens")
    ids = np.memmap(path, dtype=np.dtype(info["dtype"]), mode="r", shape=(info["tokens"],))
    return TokenStream(ids, info), built


def build(source: TextSource, subword: SubwordModel, path: Path) -> dict:
    """Tokenise `source` piece by piece into `path`; the pieces' text is hashed on the way."""
    dtype = np.uint16 if len(subword) <= np.iinfo(np.uint16).max else np.int32
    eos = subword.sp.eos_id()
    counts = {"tokens": 0, "lines": 0, "chars": 0}
    digest = hashlib.sha256()

    def write(file) -> None:
        for batch in _batches(source):
            ids = subword.encode([p.text for p in batch])
            flat: list[int] = []
            for piece, piece_ids in zip(batch, ids):
                flat.extend(piece_ids)
                digest.update(piece.text.encode() + (b"\n" if piece.ends_line else b""))
                counts["chars"] += len(piece.text)
                if piece.ends_line:
                    flat.append(eos)
                    counts["lines"] += 1
            file.write(np.asarray(flat, dtype=dtype).tobytes())
            counts["tokens"] += len(flat)
    atomic_write_with(path, write)
    return {**counts, "dtype": np.dtype(dtype).name, "sha256": digest.hexdigest(), "source": source.details}


def _batches(source: TextSource) -> Iterator[list]:
    batch = []
    for piece in source:
        batch.append(piece)
        if len(batch) == ENCODE_BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


def signature(info: dict) -> str:
    """One line naming the scored text: source, size and hash (results.json details)."""
    source = info["source"]
    where = source.get("source", "?")
    sizes = f"tokens:{info['tokens']}|lines:{info['lines']}|chars:{info['chars']}"
    return f"{where}|{sizes}|sha256:{info['sha256'][:12]}"


# --- windows ----------------------------------------------------------------------------------

class Window(NamedTuple):
    """length + 1 consecutive ids (input = [:-1], target = [1:]); targets before `score_from` are
    context only (sliding-window evaluation)."""

    ids: Tensor
    length: int  # the evaluation length (window size) this window belongs to
    score_from: int


class Windows(Dataset):
    """Windows of `length` tokens over a stream, `stride` apart (stride == length: non-overlapping).

    With stride < length (sliding windows), each window after the first scores only its last
    `stride` targets, so every token is scored once, with at least length - stride tokens of context.
    Only whole windows are formed: a tail shorter than a window is not scored.
    """

    def __init__(self, ids: np.ndarray, length: int, stride: int | None = None, limit: int | None = None):
        stride = stride or length
        if not 1 <= stride <= length:
            raise ValueError(f"stride={stride} must be in [1, length={length}]")
        n = len(ids) if limit is None else min(len(ids), limit)
        self.ids, self.length, self.stride = ids, length, stride
        self.starts = range(0, max(n - length, 0), stride) if n > length else range(0)

    def __len__(self) -> int:
        return len(self.starts)

    def __getstate__(self) -> dict:
        """Pickled (to a spawned loader worker) as the memmap's file, not its contents."""
        state = dict(self.__dict__)
        if isinstance(self.ids, np.memmap):
            state["ids"] = ("memmap", self.ids.filename, self.ids.dtype.str, self.ids.shape)
        return state

    def __setstate__(self, state: dict) -> None:
        ids = state["ids"]
        if isinstance(ids, tuple):
            state["ids"] = np.memmap(ids[1], dtype=np.dtype(ids[2]), mode="r", shape=ids[3])
        self.__dict__.update(state)

    def __getitem__(self, i: int) -> Window:
        start = self.starts[i]
        ids = torch.from_numpy(np.asarray(self.ids[start:start + self.length + 1], dtype=np.int64))
        return Window(ids, self.length, 0 if i == 0 else self.length - self.stride)


class ConcatWindows(Dataset):
    """Several `Windows` (one per evaluation length) as one dataset, in order."""

    def __init__(self, parts: Sequence[Windows]):
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> Window:
        part = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[part][i - int(self.offsets[part])]
