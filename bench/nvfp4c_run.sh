#!/bin/bash
# nvfp4c_run.sh: on the GPU machine, check and time trtllm_mha's nvfp4 decode v2 (option
# nvfp4_keys_m: v2, and v2p: v2 with 256-byte L2 prefetches) against auto and off in one call.
# Usage (repo root, carry .deps): bash bench/nvfp4c_run.sh [--ncu] [--no-tests]
# Build (the plugin, cpu_ref, gpu-mha, mha-bench), gpu-mha's nvfp4 cases on v2 (--option; v2p
# on the quick ones), then mha-bench: bf16 and fp8 once, nvfp4 with auto, v2, v2p, off, and v2
# with split_kv=off, on decode_b64_l4096, decode_b8_l32768 and probe_hk1. --ncu: one B64 L4096
# nvfp4 launch under ncu, auto, v2 and v2p (instructions, issue, DRAM). --no-tests: no gpu-mha
# (a second call on a warm machine).
set -o pipefail
OUT=${OUT:-/tmp/nvfp4c_out}
B=/tmp/nvfp4c-build
mkdir -p "$OUT"
NCU=0 TESTS=1
for a in "$@"; do
    case "$a" in --ncu) NCU=1 ;; --no-tests) TESTS=0 ;; esac
done
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
stamp build
({ [ -f $B/build.ninja ] || meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null; } &&
    ninja -C $B -j 16 backends/trtllm_mha/ap_trtllm_mha.so backends/cpu_ref/ap_cpu_ref.so \
        tests/gpu/gpu-mha bench/mha-bench) >"$OUT/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error" "$OUT/build.log" | head -n 30; exit 1; }
P=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/trtllm_mha)
if [ $TESTS = 1 ]; then
    stamp gpu-mha
    # every nvfp4 case on v2 (D64 and > 8 rows take their usual kernels; v2_* are v2's own
    # cases); auto's kernels are byte-identical to 7aeeabb's, so not run again here
    timeout 120 $B/tests/gpu/gpu-mha "${P[@]}" --filter nvfp4 --option nvfp4_keys_m=v2 \
        >"$OUT/gpu-mha-v2.log" 2>&1
    echo "gpu-mha nvfp4 (v2) exit $?"
    grep -E "^(FAIL|summary)" "$OUT/gpu-mha-v2.log" | head -n 20
    timeout 60 $B/tests/gpu/gpu-mha "${P[@]}" --quick --filter nvfp4 --option nvfp4_keys_m=v2p \
        >"$OUT/gpu-mha-v2p.log" 2>&1
    echo "gpu-mha nvfp4 quick (v2p) exit $?"
    grep -E "^(FAIL|summary)" "$OUT/gpu-mha-v2p.log" | head -n 20
fi
stamp mha-bench
M=(timeout 60 $B/bench/mha-bench "${P[@]}")
NV=(decode_b64_l4096_nvfp4 decode_b8_l32768_nvfp4 probe_hk1_b512_l4096_nvfp4)
# bf16, fp8 and nvfp4 (auto) of the three shapes
for c in decode_b64_l4096 decode_b8_l32768 probe_hk1; do
    "${M[@]}" --only $c 2>&1 | tee -a "$OUT/mha-bench-auto.log"
done
for o in nvfp4_keys_m=v2 nvfp4_keys_m=v2p nvfp4_keys_m=off; do
    for c in "${NV[@]}"; do
        "${M[@]}" --only $c --option $o 2>&1 | tee -a "$OUT/mha-bench-$o.log"
    done
done
# v2 without the split (512 CTAs in one wave of 528 slots at B64: no combine)
for c in decode_b64_l4096_nvfp4 decode_b8_l32768_nvfp4; do
    "${M[@]}" --only $c --option nvfp4_keys_m=v2 --option split_kv=off 2>&1 |
        tee -a "$OUT/mha-bench-v2-nosplit.log"
done
# auto again: the drift of the call
"${M[@]}" --only decode_b64_l4096_nvfp4 2>&1 | tee -a "$OUT/mha-bench-auto.log"
if [ $NCU = 1 ]; then
    stamp ncu
    for keys_m in auto v2 v2p; do
        timeout 60 ncu --clock-control none --kernel-name regex:mha_decode_kernel \
            --launch-skip 8 --launch-count 1 --section SpeedOfLight --section WarpStateStats \
            --section Occupancy --section LaunchStats --section InstructionStats \
            --section MemoryWorkloadAnalysis \
            $B/bench/mha-bench "${P[@]}" --only decode_b64_l4096_nvfp4 \
            --option nvfp4_keys_m=$keys_m >"$OUT/ncu-$keys_m.log" 2>&1
        echo "ncu ($keys_m) exit $?"
        grep -E "Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Instructions|Warp Cycles Per Issued" \
            "$OUT/ncu-$keys_m.log" | head -n 24
    done
fi
stamp done
