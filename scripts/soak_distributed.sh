#!/usr/bin/env bash
# Run the 2-rank checks N times in a row, at low priority: `pytest tests/distributed` and the parity benchmark
# (benchmarks/ds_cpu_parity.py), one line per round. A failed round keeps its logs (and any core file) in
# OUT/round-K; a clean one is deleted. The CPU ranks must never flake (docs/scale-out.md, "Checks").
#
#     scripts/soak_distributed.sh 50 /tmp/soak      # then: cat /tmp/soak/summary
set -uo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-50}
OUT=${2:-.cache/soak}
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
ulimit -c unlimited
export PYTHONFAULTHANDLER=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$PWD/.cache/torch_extensions}
for k in $(seq 1 "$ROUNDS"); do
  dir="$OUT/round-$k"
  mkdir -p "$dir"
  start=$(date +%s)
  nice -n 10 timeout 1800 "$PYTHON" -m pytest -q -s -p no:cacheprovider tests/distributed --basetemp="$dir/tmp" \
    > "$dir/pytest.log" 2>&1
  tests=$?
  nice -n 10 timeout 1200 "$PYTHON" benchmarks/ds_cpu_parity.py --steps 1 > "$dir/parity.out" 2> "$dir/parity.err"
  parity=$?
  echo "round $k: tests exit $tests ($(tail -1 "$dir/pytest.log")), parity exit $parity, $(( $(date +%s) - start )) s" \
    | tee -a "$OUT/summary"
  if [[ $tests == 0 && $parity == 0 ]]; then rm -rf "$dir"; else mv core* "$dir/" 2>/dev/null; fi
done
