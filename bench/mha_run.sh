#!/bin/bash
# mha_run.sh: on the GPU machine, build trtllm_mha and what checks it, run its GPU tests (gpu-mha,
# the shared gpu-harness table), compute-sanitizer, and with --bench the timings.
# Usage (repo root, carry .deps): AP_COMMIT=sha bash bench/mha_run.sh [--tests] [--bench]
set -o pipefail
OUT=${OUT:-/tmp/mha_out}
B=/tmp/mha-build
mkdir -p "$OUT"
TESTS=0 BENCH=0
for a in "$@"; do
    case "$a" in --tests) TESTS=1 ;; --bench) BENCH=1 ;; esac
done
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
stamp build
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null &&
    ninja -C $B -j 16 backends/trtllm_mha/ap_trtllm_mha.so backends/cpu_ref/ap_cpu_ref.so \
        tests/gpu/gpu-mha tests/gpu/gpu-harness bench/attnplug-bench) >"$OUT/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error" "$OUT/build.log" | head -n 30; exit 1; }
P=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/trtllm_mha)
if [ $TESTS = 1 ]; then
    stamp gpu-mha
    timeout 150 $B/tests/gpu/gpu-mha "${P[@]}" >"$OUT/gpu-mha.log" 2>&1
    echo "gpu-mha exit $?"; grep -E "^(FAIL|summary)" "$OUT/gpu-mha.log" | head -n 40
    stamp gpu-harness
    timeout 150 $B/tests/gpu/gpu-harness trtllm_mha "${P[@]}" >"$OUT/gpu-harness.log" 2>&1
    echo "gpu-harness exit $?"; grep -E "^(FAIL|summary)" "$OUT/gpu-harness.log" | head -n 30
    stamp sanitize
    {
        timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 \
            $B/tests/gpu/gpu-mha --quick "${P[@]}"
        echo "memcheck exit $?"
        timeout 90 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 10 \
            $B/tests/gpu/gpu-mha --quick --filter g8 "${P[@]}"
        echo "racecheck exit $?"
    } >"$OUT/sanitize.log" 2>&1
    grep -E "ERROR SUMMARY|exit [0-9]|^summary|^FAIL" "$OUT/sanitize.log"
fi
if [ $BENCH = 1 ]; then
    stamp bench
    timeout 60 $B/bench/attnplug-bench --backend trtllm_mha --runs 50 --case decode "${P[@]}" \
        --json "$OUT/bench-ours.json" 2>&1 | tee "$OUT/bench.log" | grep -vE "^\s*$" | head -n 30
fi
stamp done
