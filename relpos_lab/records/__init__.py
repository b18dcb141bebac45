"""What a run leaves behind: the run directory (identity, lock), results.json and plots, the CSV
and W&B loggers with provenance, and a reader for offline W&B runs."""
