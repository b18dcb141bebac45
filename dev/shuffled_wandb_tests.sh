#!/usr/bin/env bash
# The W&B tests in shuffled orders, in one worker and in two (issue 57): wandb keeps settings and a
# service per process, so a test that leaks them fails another that runs after it on its worker.
# Usage: bash dev/shuffled_wandb_tests.sh [SEEDS...]   (default seeds 1 2 3)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
files=(tests/test_wandb_offline.py tests/test_tracking.py)
ids=$("$python" -m pytest --co -q -p no:logging "${files[@]}" 2>/dev/null | grep "::")
for seed in "${@:-1 2 3}"; do
  for workers in 0 2; do
    order=$(echo "$ids" | "$python" -c "import random, sys; ids = sys.stdin.read().split(); \
random.Random($seed).shuffle(ids); print(' '.join(ids))")
    # shellcheck disable=SC2086  # one argument per test id
    echo "seed $seed, $workers workers: $("$python" -m pytest -q -p no:logging -n "$workers" $order 2>&1 | tail -1)"
  done
done
