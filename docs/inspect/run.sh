#!/usr/bin/env bash
# Regenerates the figures of docs/inspect.md: Shaw k=4 and k=16 on reverse (the README's default
# experiment, about two minutes each on one core), inspected at the end of training, then compared.
set -euo pipefail
cd "$(dirname "$0")/../.."
for k in 4 16; do
    relpos-lab train reverse_shaw "model.positions.max_distance=$k" logging.root=runs/inspect_docs
done
python docs/inspect/compare.py runs/inspect_docs/reverse_shaw/reverse-shaw-k4-*/ runs/inspect_docs/reverse_shaw/reverse-shaw-k16-*/
