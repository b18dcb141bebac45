"""Inspect a trained model (the `inspect` verb, and the end of training): where its attention goes
by relative offset, and what its position scheme learned.

Attention is measured teacher-forced (`Task.loss`, the training forward) on a split's examples
with a probe active (core/attention/capture.py): per attention site — encoder self-, decoder self-
and cross-attention, each layer and head — the mean mass at each offset j − i over real query rows.
For tasks with training lengths, the same is measured at the lengths the task names
(`Task.inspect_lengths`: lm's evaluation lengths) or else at the longest training length and at
the longest test length beside it. Examples are batched as evaluation batches them (by padded
tokens where the task says `max_tokens`, else data.eval_batch_size). The scheme's own drawings
(`RelativePositions.draw`) come from the per-layer modules; a content-dependent scheme also draws
what it adds on one batch of the longest examples measured (`RelativePositions.draw_content`, fed
by the probe). A scheme that draws nothing is said in one line (`InspectSummary.note`). Numbers go
to inspect.json, figures to plots/inspect/, both also to the run's W&B run (images and a table).
Here, not in analysis/, because training calls it on the model it has just evaluated.

inspect.json: {"run", "scheme", "split", "mass" (the definition), "sets": {set name ("valid",
"length 16", ...): {"split", "examples", "in_training_range" (length sets), "attention": {kind:
{"offsets", "query_rows", "mass" (layers × heads × offsets), "clipped" (Shaw: {"max_distance",
"mass" by clipped offset -k..k})}}}}, "drawings": {kind: {layer: {name: {"kind", "x", "values",
"xlabel", "ylabel", "spread" (curves with a band)}}}}, "content" (content-dependent schemes):
{"split", "examples" (the sample batch), "lengths", "drawings" (as "drawings")}, "not_drawn" (a
scheme that draws nothing: the line saying so)}.
"""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from relpos_lab.api.errors import UserError, shown_path
from relpos_lab.api.files import atomic_write
from relpos_lab.api.task import Task
from relpos_lab.core.attention.capture import AttentionProbe, capturing
from relpos_lab.core.compiling import unwrapped
from relpos_lab.core.embedding import positions_in_order
from relpos_lab.core.positions import RelativePositions
from relpos_lab.core.transformer import Decoder, Encoder, MultiHeadAttention
from relpos_lab.records.loggers import RunCSVLogger, build_loggers, close_loggers, log_images, log_samples
from relpos_lab.records.rundir import writable_directory
from relpos_lab.training.batching import TokenBatchSampler
from relpos_lab.training.checkpoints import (
    CHECKPOINTS,
    OVERRIDES_FIX,
    check_weights_fit,
    global_step_of,
    load_checkpoint,
    task_from_checkpoint,
)
from relpos_lab.training.inspect_figures import KINDS, attention_figures, attention_table, content_figures
from relpos_lab.training.module import RelposModule
from relpos_lab.training.progress import is_quiet
from relpos_lab.training.threads import use_cpu_threads

INSPECT_JSON = "inspect.json"
PLOTS = Path("plots") / "inspect"
MAX_EXAMPLES = 256
"""Examples per measured set at most (every n-th of the split): a smooth mean, seconds on CPU."""
MAX_DRAWN_OFFSET = 64
"""Scheme drawings span offsets up to the longest measured, at most this."""


@dataclass
class InspectSummary:
    out_dir: Path
    json: Path
    plots: list[Path] = field(default_factory=list)
    note: str | None = None  # one line for the user (a scheme that draws nothing), else None


def has_relative_positions(model: torch.nn.Module) -> bool:
    """Whether any attention of `model` carries a scheme's relative part (Shaw, RoPE, a bias)."""
    return any(isinstance(m, MultiHeadAttention) and type(m.relative) is not RelativePositions
               for m in model.modules())


def can_inspect(task: Task) -> bool:
    """Inspect groups examples by length (`example_length`: sequence-to-sequence tasks and `lm`
    have it); a task without it is not inspected."""
    return callable(getattr(task, "example_length", None))


def inspect_checkpoint(checkpoint: str | Path, split: str = "valid", lengths: Sequence[int] | None = None,
                       out: str | Path | None = None, overrides: Sequence[str] = ()) -> InspectSummary:
    """`relpos-lab inspect`: rebuild the model of `checkpoint` and inspect it into its run
    directory (or `out`), logging to the run's W&B run."""
    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint)
    cfg, task = task_from_checkpoint(checkpoint, list(overrides), state)
    if not can_inspect(task):
        raise UserError(f"inspect groups examples by length, and task {cfg.task.name!r} defines no "
                        "example_length(example) (see Task.inspect_lengths)")
    use_cpu_threads(cfg.trainer.threads)
    task.check_split(split)
    module = RelposModule(cfg, task)
    check_weights_fit(checkpoint, state, module, cfg, OVERRIDES_FIX + ". Nothing was written")
    module.load_state_dict(state["state_dict"])
    model = module.model
    run_dir = (checkpoint.resolve().parent.parent if checkpoint.parent.name == CHECKPOINTS
               else checkpoint.resolve().parent)
    for directory in (Path(out) if out else run_dir, (Path(out) if out else run_dir) / PLOTS):
        writable_directory(directory, "write the figures and inspect.json to another directory with --out DIR "
                           "(nothing is then logged to W&B). Nothing was written")
    # The run's W&B run continues after its last row, as a resumed fit's does (build_loggers numbers
    # the rows: offline, W&B would start them again at _step 0).
    loggers = [lg for lg in build_loggers(cfg, run_dir, resume_step=sys.maxsize, quiet=is_quiet())
               if not isinstance(lg, RunCSVLogger)] if out is None else []
    try:
        return inspect_model(model, task, cfg, Path(out) if out else run_dir, split, lengths, loggers,
                             run_name=run_dir.name, step=global_step_of(checkpoint))
    finally:
        close_loggers(loggers)


def inspect_model(model: torch.nn.Module, task: Task, cfg: DictConfig, out_dir: Path, split: str = "valid",
                  lengths: Sequence[int] | None = None, loggers: Sequence = (), run_name: str | None = None,
                  echo: Callable[[str], None] | None = None, step: int | None = None) -> InspectSummary:
    """Measure, draw and write everything into `out_dir` (inspect.json, plots/inspect/); W&B rows
    at training step `step` (the checkpoint's). A `torch.compile` wrapper is looked through: the
    probes find the attention layers by their names in the module and watch its eager forward."""
    model = unwrapped(model)
    out_dir = Path(out_dir)
    run_name = run_name or out_dir.name
    scheme = _scheme_name(cfg)
    clip = _clip(cfg)
    batch_size = int(OmegaConf.select(cfg, "data.eval_batch_size", default=64) or 64)
    sets = _example_sets(task, split, lengths)
    train_range = task.train_length_range()
    content = any(isinstance(m, MultiHeadAttention) and m.content for m in model.modules())
    sample = _sample(task, sets[split][1], batch_size, task.max_tokens(split)) if content else []
    was_training = model.training
    model.eval()
    try:
        with positions_in_order(model):  # offsets j − i are token distances, also with randomize_at_eval
            probes = {name: _measure(model, task, examples, batch_size, max_tokens=task.max_tokens(where))
                      for name, (where, examples) in sets.items()}
            ids: dict = {}  # the example's token ids by side, for the maps' tick labels
            example = _measure(model, task, [max(sets[split][1], key=task.example_length)], 1, ids)
            sampled = _measure(model, task, sample, len(sample), keep_content=True) if sample else None
    finally:
        model.train(was_training)
    numbers = {"run": run_name, "scheme": scheme, "split": split,
               "mass": "mean over real query rows of the attention probability at each offset j - i (key - query)",
               "sets": {}, "drawings": {}}
    for name, (where, examples) in sets.items():
        entry = {"split": where, "examples": len(examples), "attention": _attention_numbers(probes[name])}
        if name.startswith("length ") and train_range:
            entry["in_training_range"] = train_range[0] <= int(name.split()[1]) <= train_range[1]
        numbers["sets"][name] = entry
    widest = max(len(a["offsets"]) for s in numbers["sets"].values() for a in s["attention"].values()) // 2
    max_offset = min(max(widest, 1), MAX_DRAWN_OFFSET)
    drawings = _drawings(model, max_offset)
    numbers["drawings"] = _drawings_json(drawings)
    drawn_content = _content_drawings(model, sampled, max_offset) if sampled is not None else {}
    if drawn_content:
        numbers["content"] = {"split": split, "examples": len(sample),
                              "lengths": sorted({task.example_length(e) for e in sample}),
                              "drawings": _drawings_json(drawn_content)}
    note = None if drawings or drawn_content else _nothing_drawn(model)
    if note:
        numbers["not_drawn"] = note
    path = out_dir / INSPECT_JSON
    atomic_write(path, json.dumps(numbers, indent=1) + "\n")
    figures = attention_figures(numbers, example, _tokens(task, ids), drawings, out_dir / PLOTS,
                                f"{run_name} ({scheme})", clip)
    figures += content_figures(numbers, drawn_content, out_dir / PLOTS, f"{run_name} ({scheme})")
    log_images(loggers, {f"inspect/{p.stem}": p for p in figures}, step=step)
    log_samples(loggers, "inspect/attention_by_offset", *attention_table(numbers), step=step)
    if echo:
        if note:
            echo(note)
        echo(f"inspect: {len(figures)} figures in {shown_path(out_dir / PLOTS)}, numbers in {shown_path(path)}")
    return InspectSummary(out_dir, path, figures, note)


# --- which examples -------------------------------------------------------------------------


def _example_sets(task: Task, split: str, lengths: Sequence[int] | None) -> dict[str, tuple[str, list]]:
    """What is measured, by name: the split's examples, then each length's ("length N"), each with
    the split it comes from; lengths None: the task's `inspect_lengths`, else a default spread."""
    data = _Examples(task)
    sets = {split: (split, data.of(split))}
    if not sets[split][1]:
        raise UserError(f"split '{split}' of task '{task.cfg.name}' has no examples to inspect; pick another --split")
    if lengths is None:
        named = task.inspect_lengths(split)
        lengths = data.default_lengths(task.train_length_range(), split) if named is None else list(named)
    for length in lengths:
        where = data.split_with(split, length)
        sets[f"length {length}"] = (where, data.of(where, length))
    return sets

class _Examples:
    """A task's splits, each read once, by length."""

    def __init__(self, task: Task):
        self.task, self._splits = task, {}

    def of(self, split: str, length: int | None = None) -> list:
        if split not in self._splits:
            self._splits[split] = list(self.task.dataset(split))
        data = self._splits[split]
        if length is not None:
            data = [e for e in data if self.task.example_length(e) == length]
        step = -(-len(data) // MAX_EXAMPLES)  # evenly spread: splits are often sorted by length
        return data[::step] if data else data

    def lengths(self, split: str) -> list[int]:
        self.of(split)
        return sorted({self.task.example_length(e) for e in self._splits[split]})

    def default_lengths(self, train_range, split: str) -> list[int]:
        """The longest training length and, beside it, the longest test length past it: those
        that `split` or the test split hold (a small split may have neither)."""
        if not train_range or "test" not in self.task.splits:
            return []
        held = set(self.lengths("test")) | set(self.lengths(split))
        longer = [n for n in held if n > train_range[1]]
        return [n for n in [train_range[1]] if n in held] + ([max(longer)] if longer else [])

    def split_with(self, split: str, length: int) -> str:
        """`split` if it holds examples of `length`, else "test" if that does."""
        for where in dict.fromkeys((split, "test")):
            if where in self.task.splits and length in self.lengths(where):
                return where
        known = self.lengths(split)
        span = f"{known[0]}–{known[-1]}" if known else "none"
        raise UserError(f"no example of length {length} in split '{split}' (its lengths: {span}) or in 'test'; "
                        "pick --lengths among the lengths the task's splits hold")


def _sample(task: Task, examples: list, batch_size: int, max_tokens: int | None) -> list:
    """One evaluation batch of the longest `examples` (those measured of the split): what a
    content-dependent scheme draws on."""
    ranked = sorted(examples, key=task.example_length, reverse=True)[:batch_size]
    if max_tokens is not None and ranked:
        ranked = ranked[:max(1, max_tokens // max(task.num_tokens(e) for e in ranked))]
    return ranked


# --- measuring --------------------------------------------------------------------------------

def _batches(task: Task, examples: list, batch_size: int, max_tokens: int | None) -> list[list]:
    """`examples` in batches as evaluation makes them: by padded tokens (`max_tokens`), else
    `batch_size` at a time."""
    if max_tokens is None:
        return [examples[start:start + batch_size] for start in range(0, len(examples), batch_size)]
    sampler = TokenBatchSampler(range(len(examples)), [task.num_tokens(e) for e in examples], max_tokens, even=False)
    return [[examples[i] for i in batch] for batch in sampler.batches() if batch]


def _measure(model, task: Task, examples: list, batch_size: int, ids: dict | None = None,
             max_tokens: int | None = None, keep_content: bool = False) -> AttentionProbe:
    """A probe's sums over `examples`, teacher-forced; `ids` gets the first example's real token
    ids by side ("src", "tgt"); `keep_content`: the probe keeps each site's first content_bias
    arguments."""
    probe = AttentionProbe(keep_content)
    pad_id = getattr(getattr(model, "cfg", None), "pad_id", 0)
    handles = _attach(model, probe, pad_id, ids)
    try:
        with capturing(probe), torch.no_grad():
            for examples_of_batch in _batches(task, examples, batch_size, max_tokens):
                batch = task.collate(examples_of_batch)
                device = next(model.parameters()).device
                task.loss(model, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}, 0.0)
    except ValueError as err:
        if "beyond model.positions.max_len" in str(err):
            raise UserError(f"{err}; inspect lengths the model's learned positions cover (--lengths)") from None
        raise
    finally:
        for handle in handles:
            handle.remove()
    return probe


def site_of(name: str) -> tuple[str, int]:
    """(kind, layer) of an attention module from its name in the model, e.g.
    "decoder.layers.1.cross_attn.inner" -> ("cross", 1)."""
    layer = re.search(r"layers\.(\d+)\.", name)
    kind = "cross" if "cross" in name else "encoder_self" if name.startswith("encoder") else "decoder_self"
    return kind, int(layer.group(1)) if layer else 0


def _attach(model, probe: AttentionProbe, pad_id: int, ids: dict | None = None) -> list:
    """Forward pre-hooks that tell the probe which site runs and which query and key rows are
    real (tokens other than padding): the model itself is not changed."""
    masks: dict = {}
    handles = []

    def remember(side):
        def hook(module, args):
            masks[side] = args[0] != pad_id
            if ids is not None and side not in ids:
                ids[side] = args[0][0][masks[side][0]].tolist()
        return hook

    def enter(kind, layer):
        def hook(module, args):
            probe.where = (kind, layer)
            probe.query_mask = masks.get("src" if kind == "encoder_self" else "tgt")
            probe.key_mask = masks.get("tgt" if kind == "decoder_self" else "src")
        return hook

    for name, module in model.named_modules():
        if isinstance(module, Encoder):
            handles.append(module.register_forward_pre_hook(remember("src")))
        elif isinstance(module, Decoder):
            handles.append(module.register_forward_pre_hook(remember("tgt")))
        elif isinstance(module, MultiHeadAttention):
            handles.append(module.register_forward_pre_hook(enter(*site_of(name))))
    return handles


def _attention_numbers(probe: AttentionProbe) -> dict:
    """Per kind: offsets, query rows, mass (layers × heads × offsets) and, for Shaw, by clipped offset."""
    out = {}
    for kind in KINDS:
        layers = sorted(layer for k, layer in probe.mass if k == kind)
        if not layers:
            continue
        width = max((probe.mass[(kind, layer)].shape[-1] - 1) // 2 for layer in layers)
        mass = np.zeros((len(layers), probe.mass[(kind, layers[0])].shape[0], 2 * width + 1))
        for i, layer in enumerate(layers):
            offsets, m = probe.mean_by_offset((kind, layer))
            mass[i, :, width + offsets[0]: width + offsets[-1] + 1] = m.numpy()
        entry = {"offsets": list(range(-width, width + 1)), "query_rows": probe.rows[(kind, layers[0])],
                 "mass": _rounded(mass)}
        clipped = [probe.mean_by_clipped_offset((kind, layer)) for layer in layers]
        if all(c is not None for c in clipped):
            entry["clipped"] = {"max_distance": (clipped[0].shape[-1] - 1) // 2,
                                "mass": _rounded(np.stack([c.numpy() for c in clipped]))}
        out[kind] = entry
    return out


def _rounded(a: np.ndarray) -> list:
    return np.round(a, 6).tolist()


# --- what the scheme learned ----------------------------------------------------------------

def _drawings(model, max_offset: int) -> dict:
    out: dict = {}
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention) and hasattr(module.relative, "draw"):
            found = module.relative.draw(max_offset)
            if found:
                kind, layer = site_of(name)
                out.setdefault(kind, {})[layer] = found
    return out


def _content_drawings(model, probe: AttentionProbe, max_offset: int) -> dict:
    """What each content-dependent module draws of its bias on the probe's batch (draw_content)."""
    out: dict = {}
    for name, module in model.named_modules():
        where = site_of(name)
        if isinstance(module, MultiHeadAttention) and module.content and where in probe.content:
            with torch.no_grad():
                found = module.relative.draw_content(*probe.content[where], max_offset)
            if found:
                out.setdefault(where[0], {})[where[1]] = found
    return out


def _nothing_drawn(model) -> str:
    """The line saying that the scheme draws nothing, and why."""
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    own = sorted({type(m.relative).__name__ for m in layers if type(m.relative) is not RelativePositions})
    why = (f"its per-layer module {', '.join(own)} gives no panels from draw() and has no content_bias" if own
           else "it has no module in the attention layers to draw")
    label = layers[0].scheme_label if layers else "the position scheme"
    return f"inspect: {label} draws nothing: {why}; attention by offset is measured all the same"


def _drawings_json(drawings: dict) -> dict:
    return {kind: {str(layer): {name: _drawing_json(d) for name, d in found.items()} for layer, found in layers.items()}
            for kind, layers in drawings.items()}


def _drawing_json(d) -> dict:
    out = {"kind": d.kind, "x": d.x.tolist(), "values": _rounded(d.values.detach().cpu().numpy()),
           "xlabel": d.xlabel, "ylabel": d.ylabel}
    if getattr(d, "spread", None) is not None:
        out["spread"] = _rounded(d.spread.detach().cpu().numpy())
    return out


# --- the names a figure shows --------------------------------------------------------------------

def _tokens(task: Task, ids: dict) -> dict:
    """{side: symbols} of the example, where the task has a vocabulary for that side (else {})."""
    out = {}
    for side, values in ids.items():
        symbols = getattr(getattr(task, f"{side}_vocab", None), "symbols", None)
        if symbols is not None:
            out[side] = [symbols[i] if 0 <= i < len(symbols) else "?" for i in values]
    return out


def _scheme_name(cfg: DictConfig) -> str:
    scheme = OmegaConf.select(cfg, "model.positions.scheme", default="?")
    return f"shaw k={_clip(cfg)}" if scheme == "shaw" else str(scheme)


def _clip(cfg: DictConfig) -> int | None:
    if OmegaConf.select(cfg, "model.positions.scheme", default=None) != "shaw":
        return None
    return int(OmegaConf.select(cfg, "model.positions.max_distance", default=16))
