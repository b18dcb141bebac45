"""The README's main job, as a user runs it: configs/experiment/reverse_shaw.yaml on CPU."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_reverse_shaw_trains_to_high_in_distribution_accuracy(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "relpos_lab", "train", str(REPO / "configs/experiment/reverse_shaw.yaml"),
         f"logging.root={tmp_path / 'runs'}", "trainer.enable_progress_bar=false"],
        cwd=tmp_path, env={**os.environ, "WANDB_MODE": "offline"}, capture_output=True, text=True, timeout=900,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    (results,) = (tmp_path / "runs" / "reverse_shaw").glob("*/results.json")
    data = json.loads(results.read_text())
    assert data["metrics"]["valid/exact_match"] > 0.9
    assert sorted(int(n) for n in data["by_length"]["test"]) == list(range(1, 25))
