#!/usr/bin/env bash
# Regenerates studies/deletang2023_chomsky_small/ (docs/study/deletang2023_chomsky_small.md), or
# with SWEEP=deletang2023_paper_small the encoder-only study beside it (docs/study/deletang2023_paper_small.md):
# the sweep's points of the seeds in SEEDS and the schemes in SCHEMES (labels of its scheme axis),
# seed by seed, PARALLEL (default 2) runs at a time with one thread each (~50 s per run), then the reports. Finished
# points are skipped, so the study grows by reruns with other SEEDS/SCHEMES (REPORT=0: no reports).
#   SEEDS="1 2" SCHEMES="none shaw_k4 alibi" bash studies/run_deletang2023_chomsky_small.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
seeds=${SEEDS:-1 2 3}
schemes=${SCHEMES:-}
sweep=${SWEEP:-deletang2023_chomsky_small}
out=${OUT:-studies/$sweep}
mkdir -p logs
relpos-lab sweep "$sweep" --list > /dev/null  # writes runs/$sweep/sweep.json
python - "$seeds" "$schemes" "$sweep" > "logs/${sweep}_points.txt" <<'PY'
import json, os, sys
seeds, schemes = sys.argv[1].split(), sys.argv[2].split()
points = json.load(open(f"runs/{sys.argv[3]}/sweep.json"))["points"]
for seed in seeds:
    for p in points:
        finished = os.path.exists(os.path.join(p["run_dir"], "results.json"))  # no process start to skip it
        if p["labels"]["seed"] == seed and (not schemes or p["labels"]["scheme"] in schemes) and not finished:
            print(p["index"])
PY
xargs -P ${PARALLEL:-2} -I{} sh -c "relpos-lab sweep $sweep --point {} > logs/$sweep-point-{}.log 2>&1 || echo \"point {} failed: logs/$sweep-point-{}.log\"" < "logs/${sweep}_points.txt"
[ "${REPORT:-1}" = 0 ] && exit 0
relpos-lab report "runs/$sweep" --metric accuracy --out "$out"
relpos-lab report "runs/$sweep" --metric accuracy --split valid --out "$out/valid"
