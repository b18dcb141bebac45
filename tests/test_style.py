"""The code's style, checked by ruff with pyproject.toml's [tool.ruff] rules (line length 120, pyflakes,
import order): `ruff check .` from the repository root, as a developer runs it; `ruff check --fix .`
sorts the imports."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_ruff_check_passes():
    pytest.importorskip("ruff", reason="ruff is in the dev extra: pip install -e '.[dev]'")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"ruff check . failed:\n{out.stdout}{out.stderr}"
