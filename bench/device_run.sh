#!/usr/bin/env bash
# One device call: environment, GPU tests, correctness pass, parallel compile (bench.warm), benchmark. Logs and
# results land in $OUT.
# usage: bash bench/device_run.sh [quick|full|tests] [pytest args...]   (tests: GPU tests and correctness pass only)
set -o pipefail
mode=${1:-quick}; shift || true
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/sageattention3_blackwell OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ "$#" -gt 0 ]; then python3 -m pytest -m gpu -q -p no:cacheprovider "$@" 2>&1 | tee "$OUT/pytest_gpu.log"; fi
python3 -m bench.gpu_check 2>&1 | tee "$OUT/gpu_check.log"
[ "$mode" = quick ] && python3 -m bench.profile 2>&1 | tee "$OUT/profile.log"
case "$mode" in
  full) python3 -m bench.warm >"$OUT/warm.log" 2>&1; python3 -m bench.run --out "$OUT" 2>&1 | tee "$OUT/bench.log" ;;
  quick) python3 -m bench.warm --quick >"$OUT/warm.log" 2>&1; python3 -m bench.run --quick --out "$OUT" 2>&1 | tee "$OUT/bench.log" ;;
esac
