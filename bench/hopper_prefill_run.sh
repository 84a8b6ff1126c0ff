#!/bin/bash
# hopper_prefill_run.sh: one device call for the kit's Hopper prefill kernel, from the repo root:
# build (meson: the check with the kit entry, the GPU suites' programs), the check against the
# double reference and its timing, a non-persistent build checked and timed too (the peers, torch
# SDPA and FlashInfer, run beside the kernel through `.ci/gpu-run --backend fa_varlen`),
# compute-sanitizer (memcheck, racecheck) on the small cases, and the GPU suites (--quick) of the kit's callers.
# Logs under $OUT. Device: carry the worktree and .deps (see .ci/gpu-run).
set -u
OUT=${OUT:-/tmp/hopper-out}
B=/tmp/hopper-build
mkdir -p "$OUT"
source .ci/gpu-deps.sh && gpu_deps_use
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }
meson setup "$B" -Dbuildtype=debugoptimized -Dcuda=enabled >"$OUT/build.log" 2>&1 &&
    meson compile -C "$B" -j 16 hopper_prefill_check gpu-harness gpu-mla ap_cpu_ref \
        ap_flashinfer_like ap_trtllm_mla >>"$OUT/build.log" 2>&1
stamp "build rc=$?"
grep -E "error|FAILED" "$OUT/build.log" | head -20
timeout 150 "$B/bench/hopper_prefill_check" >"$OUT/check.log" 2>&1
stamp "check rc=$?"
nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -DAP_HOPPER_PERSISTENT=0 \
    -o /tmp/check2 bench/hopper_prefill_check.cu &&
    timeout 150 /tmp/check2 2>&1 | sed "s/^/non-persistent: /" >>"$OUT/check.log"
stamp "non-persistent rc=$?"
timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 "$B/bench/hopper_prefill_check" \
    --quick >"$OUT/san.log" 2>&1
stamp "memcheck rc=$?"
timeout 150 compute-sanitizer --tool racecheck --error-exitcode 3 \
    "$B/bench/hopper_prefill_check" --quick >"$OUT/race.log" 2>&1
stamp "racecheck rc=$?"
P=(--plugin-dir "$B/backends/cpu_ref")
timeout 150 "$B/tests/gpu/gpu-harness" flashinfer_like --quick "${P[@]}" \
    --plugin-dir "$B/backends/flashinfer_like" >"$OUT/gpu-harness.log" 2>&1
stamp "gpu-harness flashinfer_like rc=$?"
timeout 120 "$B/tests/gpu/gpu-mla" --quick "${P[@]}" --plugin-dir "$B/backends/trtllm_mla" \
    >"$OUT/gpu-mla.log" 2>&1
stamp "gpu-mla rc=$?"
grep -E "^(non-persistent: )?(FAIL|ALL|SOME|hopper)|kit entry" "$OUT/check.log"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/san.log" "$OUT/race.log"
grep -E "^(summary|FAIL)" "$OUT/gpu-harness.log" "$OUT/gpu-mla.log" | head -20
