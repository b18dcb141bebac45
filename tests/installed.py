"""A plugin as pip would leave it, for tests that run `relpos-lab` in a subprocess: its module and a
.dist-info with METADATA and entry_points.txt in a site directory the subprocess gets on its path,
so the CLI finds the plugin through its entry points like any other."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def install_scheme(site: Path, distribution: str, module: str, source: str, entry: str) -> None:
    """`module`.py holding `source`, registered as position scheme `entry` ("name = module:Class")."""
    info = site / f"{distribution.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (site / f"{module}.py").write_text(source)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[relpos_lab.positions]\n{entry}\n")


def run_cli(root: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`relpos-lab *args` in `root`, with `root`/site on the path (where install_scheme puts plugins)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "250", "PYTHONPATH": str(root / "site")}
    return subprocess.run([sys.executable, "-m", "relpos_lab", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)
