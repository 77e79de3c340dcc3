#!/usr/bin/env bash
# The multi-GPU run on one host of N GPUs (default 2), after the compiled kernels are built in place
# (sageattention/bench/device_run.sh builds them). The engines and the packages they import that a torch image lacks
# travel as wheels in .whl/ (multigpu/fetch_wheels.sh fetches them): they are unpacked into a folder on PYTHONPATH, no
# pip and no network needed.
# Writes $OUT/multigpu.json (multigpu/run_engines.py), $OUT/merge_tests.log and $OUT/engines.log.
# usage: bash multigpu/run.sh [run_engines.py args...]
set -o pipefail
export OUT=${OUT:-/tmp/out} ENGINES_DIR=${ENGINES_DIR:-/tmp/engines} PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$ENGINES_DIR"
python3 - <<'EOF'
import glob, os, zipfile
wheels = sorted(glob.glob(".whl/*.whl"))
for w in wheels:
    zipfile.ZipFile(w).extractall(os.environ["ENGINES_DIR"])
print(f"unpacked {len(wheels)} wheels")
EOF
export PYTHONPATH=$PWD:$PWD/sageattention3_blackwell:$ENGINES_DIR
# the one-GPU merge tests again, now that yunchang is importable
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/sageattention/test_lse_merge.py >"$OUT/merge_tests.log" 2>&1
tail -n 3 "$OUT/merge_tests.log"
timeout 480 python3 -m torch.distributed.run --nproc_per_node "${NPROC:-2}" multigpu/run_engines.py --out "$OUT" "$@" 2>&1 \
  | tee "$OUT/engines.log" | grep -v '^{' | tail -n 40
