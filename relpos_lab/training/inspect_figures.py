"""What `inspect` draws from the numbers it measured (inspect.json's): the attention's figures by
offset, by length and on one example, the scheme's drawings, and the W&B table of the masses."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from relpos_lab.core.attention.capture import AttentionProbe
from relpos_lab.records import inspect_plots as plots

KINDS = ("encoder_self", "decoder_self", "cross")
"""The attention sites measured: encoder self-, decoder self- and cross-attention."""


def attention_figures(numbers: dict, example: AttentionProbe, tokens: dict, drawings: dict, folder: Path, who: str,
                      clip: int | None) -> list[Path]:
    """The attention's figures: by offset per layer and head, by input length, the longest example's maps
    (first and last layer), and the scheme's drawings; `clip` marks Shaw's clipping distance."""
    sets = numbers["sets"]
    main = numbers["split"]
    figures = []
    for kind in KINDS:
        if kind not in sets[main]["attention"]:
            continue
        a = sets[main]["attention"][kind]
        mass, offsets = np.asarray(a["mass"]), a["offsets"]
        kind_clip = clip if kind != "cross" else None  # cross-attention has no Shaw tables
        title = f"{who}\n{plots.KIND_TITLES[kind]}, {main} split ({sets[main]['examples']} examples)"
        if kind == "cross":
            title += f"\n{plots.CROSS_NOTE}"
        figures.append(plots.plot_offset_heatmaps({"rows: layer L, head H": (offsets, mass)},
                                                  folder / f"attention_{kind}.png", title, kind_clip))
        for layer in range(mass.shape[0]):
            figures.append(plots.plot_offset_lines(offsets, mass[layer], folder / f"lines_{kind}_layer{layer}.png",
                                                   f"{title}, layer {layer}", kind_clip))
        by_length = {}
        for name, entry in sets.items():
            if name.startswith("length ") and kind in entry["attention"]:
                inside = {True: "within training lengths", False: "beyond training lengths"}.get(
                    entry.get("in_training_range"), "")
                e = entry["attention"][kind]
                by_length[f"{name} ({inside})\n{entry['split']} split, {entry['examples']} examples"] = (
                    e["offsets"], np.asarray(e["mass"]))
        if by_length:
            figures.append(plots.plot_offset_heatmaps(by_length, folder / f"by_length_{kind}.png",
                                                      f"{who}\n{plots.KIND_TITLES[kind]} by input length"
                                                      + (f"\n{plots.CROSS_NOTE}" if kind == "cross" else ""),
                                                      kind_clip))
        layers = sorted(layer for k, layer in example.example if k == kind)
        sides = {"encoder_self": ("src", "src"), "decoder_self": ("tgt", "tgt"), "cross": ("tgt", "src")}[kind]
        names = {"src": "source", "tgt": "target"}
        for layer in dict.fromkeys((layers[0], layers[-1])):
            maps = example.example[(kind, layer)]
            figures.append(plots.plot_example_maps(
                maps.numpy(), folder / f"example_{kind}_layer{layer}.png",
                f"{who}\n{plots.KIND_TITLES[kind]}, layer {layer}, the longest {main} example ({_shape(maps)})",
                f"query: {names[sides[0]]} position i", f"key: {names[sides[1]]} position j",
                tokens.get(sides[0]), tokens.get(sides[1])))
    for kind, layers in drawings.items():
        for layer, found in layers.items():
            causal = "\ncausal: offsets j − i > 0 are never attended" if kind == "decoder_self" else ""
            figures.append(plots.plot_drawings(found, folder / f"scheme_{kind}_layer{layer}.png",
                                               f"{who}\nwhat the scheme learned: {plots.KIND_TITLES[kind]}, "
                                               f"layer {layer}{causal}"))
    return figures


def content_figures(numbers: dict, drawn: dict, folder: Path, who: str) -> list[Path]:
    """One figure per layer of what a content-dependent scheme adds on the sample batch."""
    if not drawn:
        return []
    sample = numbers["content"]
    span = "–".join(str(n) for n in dict.fromkeys((sample["lengths"][0], sample["lengths"][-1])))
    figures = []
    for kind, layers in drawn.items():
        for layer, found in layers.items():
            causal = "\ncausal: offsets j − i > 0 are never attended" if kind == "decoder_self" else ""
            figures.append(plots.plot_drawings(
                found, folder / f"content_{kind}_layer{layer}.png",
                f"{who}\nwhat the scheme adds on a sample batch ({sample['examples']} {sample['split']} examples of "
                f"length {span}, the longest): {plots.KIND_TITLES[kind]}, layer {layer}\nlines: mean over the "
                f"visible pairs at each offset; bands: ± one standard deviation{causal}"))
    return figures


def _shape(example) -> str:
    return f"{example.shape[-2]} queries × {example.shape[-1]} keys"


def attention_table(numbers: dict) -> tuple[list[str], list[list]]:
    """The W&B table of the masses: one row per set, site, layer, head and offset (masses above 1e-4)."""
    rows = []
    for name, entry in numbers["sets"].items():
        for kind, a in entry["attention"].items():
            for layer, heads in enumerate(a["mass"]):
                for head, values in enumerate(heads):
                    rows.extend([name, kind, layer, head, offset, v]
                                for offset, v in zip(a["offsets"], values) if v > 1e-4)
    return ["set", "attention", "layer", "head", "offset", "mass"], rows
