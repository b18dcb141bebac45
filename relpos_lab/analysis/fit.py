"""Did a cell learn its task on the training lengths? A cell that never fits them reads, in a table
of out-of-distribution scores, as "fails to generalize"; the report shows the in-distribution score
beside it and marks a cell below `FIT_THRESHOLD` as "did not fit", out of the row's best.
"""
from __future__ import annotations

FIT_THRESHOLD = 0.9
"""In-distribution accuracy below which a cell did not fit its training lengths (the papers' models
solve their tasks in distribution; --fit-threshold changes it)."""
FIT_METRICS = ("accuracy", "token_accuracy", "exact_match")
"""The metrics a fit is judged by: fractions in [0, 1], higher better."""


def in_distribution_key(split: str, metric: str, keys: set[str]) -> str | None:
    """Where a run's results hold `metric` on its training lengths: the split's own `_id` part, else
    the validation split's (which the protocols draw from the training lengths)."""
    base = metric.removesuffix("_ood")
    if base not in FIT_METRICS:
        return None
    return next((k for k in (f"{split}/{base}_id", f"valid/{base}_id", f"valid/{base}") if k in keys), None)


def fit_cell(value: float, threshold: float) -> str:
    """What a leaderboard cell adds: its in-distribution score, and whether it fitted."""
    return f" (id {value:.3f}{'' if value >= threshold else ', did not fit'})"


def in_distribution(groups, split: str, metric: str, combine) -> dict[str, float]:
    """Each group's in-distribution `metric` (by label), its runs' values made one by `combine`
    (the report's aggregate); {} where the runs report none or the metric is not a fraction."""
    key = in_distribution_key(split, metric, {k for g in groups for r in g.results for k in r["metrics"]})
    if key is None:
        return {}
    values = {g.label: [r["metrics"][key] for r in g.results if key in r["metrics"]] for g in groups}
    return {label: combine(v) for label, v in values.items() if v}
