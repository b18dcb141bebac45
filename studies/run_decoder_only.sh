#!/usr/bin/env bash
# Regenerates the decoder-only studies of docs/study/decoder_only.md (issue 20): Kazemnejad et al.'s
# protocol on copy and reverse, and train-short-test-long perplexity on the built-in corpus; then
# their reports. Finished points are skipped, so an interrupted study continues where it stopped.
# One thread per run, two runs at a time (about 4 min per copy/reverse run, 6 min per LM run).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
relpos-lab sweep configs/sweep/kazemnejad2023_decoder_only.yaml --max-parallel 2
relpos-lab sweep configs/sweep/lm_train_short_test_long.yaml --max-parallel 2
relpos-lab report runs/kazemnejad2023_decoder_only --over seed --out studies/kazemnejad2023
relpos-lab report runs/lm_train_short_test_long --out studies/lm_train_short_test_long
