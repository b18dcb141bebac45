"""`python -m relpos_lab ...` is the `relpos-lab` command."""
from .cli import run

raise SystemExit(run())
