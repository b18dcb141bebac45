"""Launching many runs: sweeps (a grid of experiments, run locally) and SLURM jobs and job arrays
(rendering from the sbatch template shipped beside slurm.py, submission, requeue)."""
