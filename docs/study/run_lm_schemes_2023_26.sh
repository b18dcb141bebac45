#!/usr/bin/env bash
# Regenerates docs/study/lm_schemes_2023_26/ (docs/study/decoder_only.md, section 3): the LM
# train-short-test-long sweep with the schemes of 2023-26. This session ran seed 1 of every scheme
# (sweep points 0, 3, ..., 45); the whole grid (3 seeds) is the second line's default. Finished
# points are skipped. One thread per run, two runs at a time, about 4 min per run.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
seeds_1_only=${SEED1_ONLY:-0}
if [ "$seeds_1_only" = 1 ]; then
  relpos-lab sweep lm_train_short_test_long --list > /dev/null
  seq 0 3 45 | xargs -P 2 -I{} relpos-lab sweep lm_train_short_test_long --point {}
else
  relpos-lab sweep lm_train_short_test_long --max-parallel 2
fi
relpos-lab report runs/lm_train_short_test_long --out docs/study/lm_schemes_2023_26
