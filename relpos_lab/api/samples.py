"""The W&B samples table of one evaluation: rows spread across the split's lengths.

The first rows of a split sorted by length are its shortest examples, and a length
generalization run fails at the long ones; so each batch offers a few rows with a `length`
column (`Task.sample_rows`, which picks them across the batch's lengths with `spread`), and the
table shows the shortest length, the longest training length, the longest, and lengths evenly
between. A task whose rows have no `length` column gets its first batch's rows.
"""
from __future__ import annotations

LATER_ROWS = 2  # rows asked of each batch after the first: enough to reach lengths the first lacks


class SampleSpread:
    """Collects an evaluation's offered rows by length and gives n of them spread across the lengths."""

    def __init__(self, n: int, train_max: int | None = None):
        self.n, self.train_max = n, train_max
        self.columns: list[str] = []
        self.by_length: dict[int, list[list]] = {}
        self.unsorted: list[list] = []

    def add(self, columns: list[str], rows: list[list]) -> None:
        self.columns = list(columns)
        if "length" not in self.columns:
            self.unsorted.extend(rows[: self.n - len(self.unsorted)])
            return
        at = self.columns.index("length")
        for row in rows:
            self.by_length.setdefault(int(row[at]), []).append(row)
        # n lengths or more: the table takes one row of each chosen length, so one is all a length keeps
        keep = 1 if len(self.by_length) >= self.n else self.n
        for held in self.by_length.values():
            del held[keep:]

    def rows(self) -> list[list]:
        """At most n rows in order of length: one of each chosen length, then more of each in turn
        while the table has room (a split of few lengths)."""
        if not self.by_length:
            return self.unsorted
        chosen = spread(sorted(self.by_length), self.n, self.train_max)
        turns = [self.by_length[length][turn] for turn in range(self.n) for length in chosen
                 if turn < len(self.by_length[length])]
        at = self.columns.index("length")
        return sorted(turns[: self.n], key=lambda row: int(row[at]))


def spread(lengths: list[int], n: int, train_max: int | None = None) -> list[int]:
    """n of the sorted `lengths`: the first, the last, the one nearest `train_max`, evenly between."""
    if len(lengths) <= n:
        return list(lengths)
    if n < 2:
        return lengths[-1:][:n]
    picked = {round(i * (len(lengths) - 1) / (n - 1)) for i in range(n)}
    if train_max is not None:
        nearest = min(range(len(lengths)), key=lambda i: (abs(lengths[i] - train_max), i))
        if nearest not in picked:  # it replaces the evenly spaced pick nearest to it, never an end
            inner = sorted(picked - {0, len(lengths) - 1}, key=lambda i: abs(i - nearest))
            picked = (picked - set(inner[:1])) | {nearest}
    return [lengths[i] for i in sorted(picked)]


def pick_rows(lengths: list[int], n: int, train_max: int | None = None) -> list[int]:
    """Indices of n rows of a batch whose rows have `lengths`: the first row of each length `spread`
    picks, then the batch's other rows in order while fewer than n."""
    first: dict[int, int] = {}
    for i, length in enumerate(lengths):
        first.setdefault(length, i)
    picked = [first[length] for length in spread(sorted(first), n, train_max)]
    taken = set(picked)
    return picked + [i for i in range(len(lengths)) if i not in taken][: n - len(picked)]
