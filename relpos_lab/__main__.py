"""`python -m relpos_lab ...` is the `relpos-lab` command."""
from relpos_lab.cli import run

raise SystemExit(run())
