"""The two figures of docs/inspect.md from two inspected runs (Shaw k=4, then k=16): encoder
self-attention by offset beyond the training lengths, side by side, and the k=16 run's tables."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np

from relpos_lab.records.inspect_plots import plot_offset_heatmaps

here = Path(__file__).parent
runs = [Path(p) for p in sys.argv[1:3]]
numbers = [json.loads((run / "inspect.json").read_text()) for run in runs]
length = [name for name in numbers[0]["sets"] if name.startswith("length ")][-1]  # the longest test length
panels = {}
for run, n in zip(runs, numbers):
    entry = n["sets"][length]
    a = entry["attention"]["encoder_self"]
    panels[f"{n['scheme']}: {run.name}\n{length}, {entry['split']} split, {entry['examples']} examples"] = (
        a["offsets"], np.asarray(a["mass"]))
plot_offset_heatmaps(panels, here / "reverse_shaw_k4_vs_k16_encoder_beyond_training.png",
                     f"reverse, trained on lengths 1–16: encoder self-attention by offset at {length} "
                     "(beyond training)")
shutil.copy(runs[1] / "plots" / "inspect" / "scheme_encoder_self_layer0.png",
            here / "reverse_shaw_k16_tables_layer0.png")
