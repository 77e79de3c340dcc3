#!/usr/bin/env bash
# One GPU machine run from a source checkout's root: environment, GPU tests, correctness pass, parallel compile
# (warm), benchmark. Logs land in $OUT, results in $OUT/<gpu_dir>/.
# usage: bash sageattention/bench/device_run.sh [quick|full|tests] [pytest args...]   (tests: GPU tests and
#        correctness pass only)
#        bash sageattention/bench/device_run.sh suite [pytest args...]   (every test, GPU-marked or not, on the GPU;
#        default: the sageattention and sageattn3 tests, 12 workers)
#        bash sageattention/bench/device_run.sh hopper   (the sm90 kernel: its GPU tests and memcheck, throughput
#        against the Triton path and cuDNN, the time split between quantization and attention, and an ncu report)
#        bash sageattention/bench/device_run.sh models [models args...]   (the real-model benchmark only; default
#        arguments: --first-call --spread 3)
#        bash sageattention/bench/device_run.sh record   (the results of record of docs/performance.md: the FA3 and
#        B4 H32 suites with every column, the real-model shapes with first calls, the accuracy table)
# Time limits, for a machine that takes a run away after a while: PYTEST_LIMIT (seconds) interrupts pytest with SIGINT
# so that it still names its failures, BENCH_LIMIT each benchmark or profiling step. Unset (the default): no limit.
# SAGE_BENCH_COMMIT: the commit the results record (set it where the tree's .git is not the code's, or absent).
# The compiled kernels are built in place first (TORCH_CUDA_ARCH_LIST = this GPU; ninja keeps later runs incremental).
set -o pipefail
mode=${1:-quick}; shift || true
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/sageattention3_blackwell${PYTHONPATH:+:$PYTHONPATH} OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
limited() {  # limited SECONDS CMD...: CMD, interrupted after SECONDS when SECONDS is set
  local limit=$1; shift
  if [ -n "$limit" ]; then timeout -s INT -k 30 "$limit" "$@"; else "$@"; fi
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
# One process per family, each in its own build directories: setuptools builds a process's modules one at a time.
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$arch} MAX_JOBS=${MAX_JOBS:-6} SAGE_BUILD_CUDA=1
families=$(python3 -c "import build_rules as b, os
print(' '.join(b.families_for(b.parse_arch_list(os.environ['TORCH_CUDA_ARCH_LIST']))))")
for f in $families; do
  SAGE_BUILD_FAMILIES=$f python3 setup.py build_ext --inplace --build-temp "build/temp_$f" --build-lib "build/lib_$f" \
    >"$OUT/build_$f.log" 2>&1 &
done
for f in $families; do wait -n || { tail -n 30 "$OUT"/build_*.log; exit 1; }; done
# One build log instead of one per family: each family's last lines.
for f in $families; do echo "== $f"; tail -n 5 "$OUT/build_$f.log"; done >"$OUT/build.log"; rm -f "$OUT"/build_*.log
echo "built $families in ${SECONDS} s"
if [ "$mode" = record ]; then
  python3 -m sageattention.bench.warm >"$OUT/warm.log" 2>&1
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.run --suite fa3 --suite b4h32 --out "$OUT" \
    --methods "sm90 wgmma e2e,sm89 mma.sync e2e,sage triton e2e,sage e2e,sdpa flash bf16,sdpa cudnn bf16" 2>&1 |
    tee "$OUT/bench.log"
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.models --out "$OUT" --no-warm --first-call \
    --methods "sdpa,sdpa cudnn,sageattn" 2>&1 | tee "$OUT/models.log"
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.accuracy --out "$OUT" --methods "sageattn,sdpa bf16" \
    --models flux,sdxl,cogvideox,wan,llm-gqa 2>&1 | tee "$OUT/accuracy.log"
  exit
fi
if [ "$mode" = models ]; then
  [ "$#" -gt 0 ] || set -- --first-call --spread 3
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.models --out "$OUT" "$@" 2>&1 | tee "$OUT/models.log"
  exit
fi
pytest_named() {  # pytest, then its failures and totals from the log (the log keeps every test's line)
  limited "${PYTEST_LIMIT:-}" python3 -m pytest -v -rfE --tb=line -p no:cacheprovider "$@" >"$OUT/pytest.log" 2>&1
  grep -E "^(FAILED|ERROR) |[0-9]+ (passed|failed)" "$OUT/pytest.log" | tail -80
}
if [ "$mode" = hopper ]; then
  # --timeout: a kernel that hangs (a barrier phase gone wrong) is named instead of eating the run (memcheck: ~90 s)
  pytest_named -n 8 --timeout 150 tests/sageattention/test_cuda_kernels.py tests/sageattention/test_compile.py
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.run --quick --suite fa3 --out "$OUT" \
    --methods "sm90 wgmma e2e,sage e2e,sdpa cudnn bf16" 2>&1 | tee "$OUT/bench.log"
  limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.profile --family sm90 >"$OUT/profile.log" 2>&1
  # ncu: the attention kernel's stall reasons and pipe utilization, then the two preparation kernels' speed of light
  stalls='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio'
  pipes='regex:sm__(pipe_.*_cycles_active|inst_executed_pipe_.*)\.avg\.pct_of_peak_sustained_active'
  ! command -v ncu >/dev/null || { limited "${BENCH_LIMIT:-}" ncu --section SpeedOfLight --section LaunchStats \
    --metrics "$stalls,$pipes" -k regex:attention_sm90 -c 1 python3 -m sageattention.bench.profile --family sm90
    limited "${BENCH_LIMIT:-}" ncu --section SpeedOfLight -k regex:prepare -c 2 \
      python3 -m sageattention.bench.profile --family sm90; } >"$OUT/ncu.log" 2>&1
  exit
fi
if [ "$mode" = suite ]; then
  [ "$#" -gt 0 ] || set -- -n 12 tests/sageattention sageattention3_blackwell/tests
  pytest_named "$@"
  exit
fi
if [ "$#" -gt 0 ]; then pytest_named -m gpu "$@"; fi
python3 -m sageattention.bench.gpu_check 2>&1 | tee "$OUT/gpu_check.log"
[ "$mode" = quick ] && python3 -m sageattention.bench.profile 2>&1 | tee "$OUT/profile.log"
case "$mode" in
  full|quick)
    quick=(); [ "$mode" = quick ] && quick=(--quick)
    python3 -m sageattention.bench.warm "${quick[@]}" >"$OUT/warm.log" 2>&1
    limited "${BENCH_LIMIT:-}" python3 -m sageattention.bench.run "${quick[@]}" --out "$OUT" 2>&1 | tee "$OUT/bench.log" ;;
esac
