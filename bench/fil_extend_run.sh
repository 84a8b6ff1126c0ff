#!/bin/bash
# fil_extend_run.sh: on the GPU machine, check and time flashinfer_like's extend kernel in one go.
# Usage: bench/fil_extend_run.sh [binary]   (build it with bench/fil_extend_build.sh; logs in $OUT)
# FIL_EXTEND_HARNESS=1 also runs the plugin's GPU test suite (.ci/gpu-run --tests-only --quick;
# needs .deps carried).
set -o pipefail
OUT=${OUT:-/tmp/fil_extend_out}
BIN=${1:-build-d2/fil_extend_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
"$BIN" test 2>&1 | tee "$OUT/test.log"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" small >"$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; tail -n 2 "$OUT/memcheck.log"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN" tiny >"$OUT/racecheck.log" 2>&1
echo "racecheck rc $?"; tail -n 2 "$OUT/racecheck.log"
"$BIN" bench 2>&1 | tee "$OUT/bench.log"
PYTHONUNBUFFERED=1 timeout 120 python3 bench/fil_extend_torch.py 2>&1 | tee "$OUT/torch.log"
if [ "${FIL_EXTEND_HARNESS:-0}" = 1 ]; then
    OUT=/tmp/harness timeout 150 bash .ci/gpu-run --tests-only --quick >"$OUT/harness.log" 2>&1
    echo "harness rc $?"; cp /tmp/harness/tests.log "$OUT/harness-tests.log" 2>/dev/null
    tail -n 12 /tmp/harness/summary.txt 2>/dev/null
fi
grep -h "TFLOP/s" "$OUT/bench.log" "$OUT/torch.log"
grep -c "^ok" "$OUT/test.log"; grep "FAIL\|PASSED" "$OUT/test.log"
