#!/usr/bin/env bash
# Regenerates docs/paper-reproduction.md's tables and plots: the three *_small sweeps of Shaw et
# al. 2018 on this machine's gettext EN→DE corpus, two runs at a time (one core each), then one
# `relpos-lab report` per sweep. Finished points are skipped and interrupted ones resume, so the
# script can be stopped and restarted; a report lists the points that are still missing. Points
# shared between sweeps (relative k=16 with a^K and a^V is in all three) train once (--reuse).
#
# The runs live in studies/paper-reproduction/runs/<sweep>/, committed without their checkpoints and
# W&B files (runs/.gitignore): the reports are regenerated from them, and a machine's work tree
# is not kept from one session to the next. Commit a run directory once it has results.json; an
# unfinished one is only worth its checkpoint, which is not committed.
# Usage: studies/paper-reproduction/run.sh [abs_vs_rel clipping ablation]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=studies/paper-reproduction
sweeps=("$@")
[ ${#sweeps[@]} -eq 0 ] && sweeps=(abs_vs_rel clipping ablation)
for sweep in "${sweeps[@]}"; do
    relpos-lab sweep "configs/sweep/shaw2018_${sweep}_small.yaml" --max-parallel 2 --reuse logging.root=$out/runs
    # the split is the sweep file's reference.split: test for Table 1 (newstest2014), valid for
    # Tables 2-3 (newstest2013, the paper's dev set)
    relpos-lab report "$out/runs/shaw2018_${sweep}_small" --metric bleu chrf --out "$out/$sweep"
done
relpos-lab tables docs/paper-reproduction.md   # the summary tables in the doc, from the reports
