#!/usr/bin/env bash
# Regenerates the position-scheme study of docs/study/README.md: both sweeps, then the report.
# Finished points are skipped, so an interrupted study continues where it stopped.
set -euo pipefail
cd "$(dirname "$0")/.."
for task in reverse copy; do
    relpos-lab sweep "configs/sweep/positions_${task}.yaml" --max-parallel 2
    relpos-lab report "runs/positions_${task}" --out "studies/${task}"
done
