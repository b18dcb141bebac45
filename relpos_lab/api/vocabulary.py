"""Symbols and their ids, with the four specials first so that pad is 0 as the model core expects."""
from __future__ import annotations

from collections.abc import Iterable


class Vocabulary:
    """Symbols and their ids; the four specials come first, so pad is 0 as ModelConfig expects."""

    SPECIALS = ("<pad>", "<s>", "</s>", "<unk>")
    pad_id, bos_id, eos_id, unk_id = 0, 1, 2, 3

    def __init__(self, symbols: Iterable[str]):
        self.symbols = list(self.SPECIALS) + list(symbols)
        self.index = {s: i for i, s in enumerate(self.symbols)}
        if len(self.index) != len(self.symbols):
            raise ValueError("vocabulary symbols must be unique and must not repeat the specials")

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, tokens: Iterable[str]) -> list[int]:
        return [self.index.get(t, self.unk_id) for t in tokens]

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The symbols of `ids` up to the first EOS, without pad and BOS (an unknown id: <unk>): the
        contract of every vocabulary's `decode`. Their text is `detokenize`."""
        return [self.symbols[i] if 0 <= i < len(self.symbols) else self.SPECIALS[3] for i in self.content(ids)]

    def detokenize(self, ids: Iterable[int]) -> str:
        """The text of `ids`: `decode`'s symbols joined by spaces."""
        return " ".join(self.decode(ids))

    @classmethod
    def content(cls, ids: Iterable[int]) -> list[int]:
        """`ids` up to the first EOS, without pad and BOS: the ids `decode` and `detokenize` read."""
        out = []
        for i in ids:
            i = int(i)
            if i == cls.eos_id:
                break
            if i not in (cls.pad_id, cls.bos_id):
                out.append(i)
        return out
