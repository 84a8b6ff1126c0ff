#!/bin/bash
# hopper_widen_run.sh: one device call for the widened Hopper prefill kernel (qk 192 / v 128),
# from the repo root: build, hopper_prefill_check (double reference on every element and LSE,
# D128 and qk192 cases, then its timings incl. MLA prefill B1 S4096 H128), compute-sanitizer
# memcheck on its small cases, the kit callers' GPU suites (gpu-harness flashinfer_like and
# fa_varlen --quick, gpu-mla's prefill cases), then mla-bench's MLA prefill rows beside torch
# SDPA cuDNN (bench/mla_peer_torch.py) in the same call. Logs tarred into $OUT/logs.tgz.
set -u
OUT=${OUT:-/tmp/hopper-out}
B=/tmp/hopper-build
L=/tmp/hopper-logs
mkdir -p "$OUT" "$L"
source .ci/gpu-deps.sh && gpu_deps_use
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*"; }
meson setup "$B" -Dbuildtype=debugoptimized -Dcuda=enabled >"$L/build.log" 2>&1 &&
    meson compile -C "$B" -j 16 hopper_prefill_check gpu-harness gpu-mla mla-bench ap_cpu_ref \
        ap_flashinfer_like ap_trtllm_mla ap_fa_varlen >>"$L/build.log" 2>&1
stamp "build rc=$?"
grep -E "error|FAILED" "$L/build.log" | head -20
timeout 120 "$B/bench/hopper_prefill_check" >"$L/check.log" 2>&1
stamp "check rc=$?"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 "$B/bench/hopper_prefill_check" \
    --quick >"$L/san.log" 2>&1
stamp "memcheck rc=$?"
P=(--plugin-dir "$B/backends/cpu_ref")
timeout 90 "$B/tests/gpu/gpu-mla" "${P[@]}" --plugin-dir "$B/backends/trtllm_mla" \
    --filter prefill >"$L/gpu-mla.log" 2>&1
stamp "gpu-mla prefill rc=$?"
timeout 60 "$B/tests/gpu/gpu-harness" flashinfer_like --quick "${P[@]}" \
    --plugin-dir "$B/backends/flashinfer_like" >"$L/gpu-harness-fil.log" 2>&1
stamp "gpu-harness flashinfer_like rc=$?"
timeout 60 "$B/tests/gpu/gpu-harness" fa_varlen --quick "${P[@]}" \
    --plugin-dir "$B/backends/fa_varlen" >"$L/gpu-harness-fav.log" 2>&1
stamp "gpu-harness fa_varlen rc=$?"
timeout 45 "$B/bench/mla-bench" --runs 50 --only "MLA prefill" "${P[@]}" \
    --plugin-dir "$B/backends/trtllm_mla" >"$L/mla-bench.log" 2>&1
stamp "mla-bench rc=$?"
PYTHONUNBUFFERED=1 timeout 60 python3 bench/mla_peer_torch.py --only prefill --runs 50 \
    >"$L/mla-torch.log" 2>&1
stamp "torch cudnn rc=$?"
tar czf "$OUT/logs.tgz" -C "$L" .
grep -E "^(FAIL|ALL|SOME|hopper)|kit entry" "$L/check.log" | grep -v "^PASS"
grep -cE "^PASS" "$L/check.log"
grep -E "ERROR SUMMARY" "$L/san.log"
grep -E "^(summary|FAIL)" "$L/gpu-mla.log" "$L/gpu-harness-fil.log" "$L/gpu-harness-fav.log" |
    head -20
grep -iE "prefill" "$L/mla-bench.log" "$L/mla-torch.log" | head -12
