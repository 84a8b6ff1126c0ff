#!/bin/bash
# nvfp4dec_run.sh: on the GPU machine, check and time trtllm_mha's nvfp4 decode in one call.
# Usage (repo root, carry .deps): bash bench/nvfp4dec_run.sh [--sanitize] [--ncu] [--no-tests]
# Always: build (the plugin, cpu_ref, the tests and the benchmarks), gpu-mha against cpu_ref and
# the shared gpu-harness table (--quick), mha-bench's decode cases with the keys-on-M kernel
# (auto) and its nvfp4 cases without it (nvfp4_keys_m=off) and over two KV heads a CTA
# (nvfp4_keys_m=v2) in the same call, attnplug-bench's
# decode cases (bf16, fp8, nvfp4), nvfp4-bench on trtllm_mha (append, extend).
# --sanitize: memcheck and racecheck on gpu-mha's nvfp4 cases. --ncu: one B64 L4096 nvfp4
# decode launch under ncu (speed of light, warp states, occupancy), auto and off. --no-tests:
# neither gpu-mha nor gpu-harness (a second call on a warm machine).
set -o pipefail
OUT=${OUT:-/tmp/nvfp4dec_out}
B=/tmp/nvfp4dec-build
mkdir -p "$OUT"
SAN=0 NCU=0 TESTS=1
for a in "$@"; do
    case "$a" in --sanitize) SAN=1 ;; --ncu) NCU=1 ;; --no-tests) TESTS=0 ;; esac
done
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
stamp build
# a warm machine keeps $B: the second call only relinks what changed
({ [ -f $B/build.ninja ] || meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null; } &&
    ninja -C $B -j 16 backends/trtllm_mha/ap_trtllm_mha.so backends/cpu_ref/ap_cpu_ref.so \
        tests/gpu/gpu-mha tests/gpu/gpu-harness bench/attnplug-bench bench/mha-bench \
        bench/nvfp4-bench) \
    >"$OUT/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error" "$OUT/build.log" | head -n 30; exit 1; }
P=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/trtllm_mha)
if [ $TESTS = 1 ]; then
    stamp gpu-mha
    timeout 150 $B/tests/gpu/gpu-mha "${P[@]}" >"$OUT/gpu-mha.log" 2>&1
    echo "gpu-mha exit $?"
    grep -E "^(FAIL|summary)" "$OUT/gpu-mha.log" | head -n 30
    grep -E "nvfp4" "$OUT/gpu-mha.log" | head -n 40 >"$OUT/gpu-mha-nvfp4.txt"
    timeout 100 $B/tests/gpu/gpu-harness trtllm_mha --quick "${P[@]}" >"$OUT/gpu-harness.log" 2>&1
    echo "gpu-harness exit $?"
    grep -E "^(FAIL|summary)" "$OUT/gpu-harness.log" | head -n 20
fi
stamp mha-bench
timeout 60 $B/bench/mha-bench "${P[@]}" --only decode_ 2>&1 | tee "$OUT/mha-bench-auto.log"
timeout 40 $B/bench/mha-bench "${P[@]}" --only nvfp4 --option nvfp4_keys_m=off 2>&1 |
    tee "$OUT/mha-bench-off.log"
timeout 40 $B/bench/mha-bench "${P[@]}" --only nvfp4 --option nvfp4_keys_m=v2 2>&1 |
    tee "$OUT/mha-bench-v2.log"
stamp attnplug-bench
timeout 90 $B/bench/attnplug-bench --backend trtllm_mha --case decode_b --runs 50 "${P[@]}" \
    --json "$OUT/attnplug-bench.json" 2>&1 | tee "$OUT/attnplug-bench.log" | tail -n 12
stamp nvfp4-bench
timeout 60 $B/bench/nvfp4-bench --backend trtllm_mha "${P[@]}" 2>&1 |
    tee "$OUT/nvfp4-bench.log" | tail -n 12
if [ $SAN = 1 ]; then
    stamp sanitize
    for tool in memcheck racecheck; do
        timeout 100 compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 10 \
            $B/tests/gpu/gpu-mha --quick --filter nvfp4 "${P[@]}" >"$OUT/sanitize-$tool.log" 2>&1
        echo "$tool exit $?"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^summary" "$OUT/sanitize-$tool.log"
    done
fi
if [ $NCU = 1 ]; then
    stamp ncu
    for keys_m in auto off; do
        timeout 60 ncu --clock-control none --kernel-name regex:mha_decode_kernel \
            --launch-skip 8 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
            --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
            $B/bench/mha-bench "${P[@]}" --only decode_b64_l4096_nvfp4 \
            --option nvfp4_keys_m=$keys_m >"$OUT/ncu-$keys_m.log" 2>&1
        echo "ncu ($keys_m) exit $?"
        grep -E "Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Stall|Warp Cycles Per Issued" \
            "$OUT/ncu-$keys_m.log" | head -n 24
    done
fi
stamp done
