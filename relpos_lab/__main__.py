"""`python -m relpos_lab ...` is the `relpos-lab` command."""
from .cli import main

raise SystemExit(main())
