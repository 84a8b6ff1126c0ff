#!/bin/bash
# nvfp4ap2_run.sh: on the GPU machine, one call for the nvfp4 KV append, round 2 (issue 11):
# build, gpu-append for both MHA backends (every cache byte and scale against cpu_ref), the nvfp4
# test, memcheck / racecheck / synccheck on the append_nvfp4 cases, nvfp4-bench (append rows
# beside bf16 / fp8 caches and a copy). Usage (repo root, .deps carried; logs under $OUT):
#   OUT=... bash bench/nvfp4ap2_run.sh
set -o pipefail
B=/tmp/nvfp4ap2-build
t0=$(date +%s); stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh; gpu_deps_use || echo "no .deps"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
T=(backends/cpu_ref/ap_cpu_ref.so backends/flashinfer_like/ap_flashinfer_like.so
   backends/trtllm_mha/ap_trtllm_mha.so tests/gpu/gpu-append tests/gpu/test_gpu_nvfp4 bench/nvfp4-bench)
stamp build
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null && ninja -C $B -j 16 "${T[@]}") \
  > $OUT/build.log 2>&1 || { echo build failed; grep error $OUT/build.log | head -30; exit 1; }
C=(--plugin-dir $B/backends/cpu_ref)
F=("${C[@]}" --plugin-dir $B/backends/flashinfer_like)
stamp tests
{ for be in flashinfer_like trtllm_mha; do timeout 120 $B/tests/gpu/gpu-append $be "${C[@]}" --plugin-dir $B/backends/$be; echo "gpu-append $be exit $?"; done
  timeout 60 $B/tests/gpu/test_gpu_nvfp4; echo "test_gpu_nvfp4 exit $?"
} > $OUT/tests.log 2>&1
grep -E "exit [0-9]|^FAIL|summary" $OUT/tests.log | tail -n 20
stamp bench
timeout 60 $B/bench/nvfp4-bench --runs 100 "${F[@]}" > $OUT/bench.log 2>&1
echo "nvfp4-bench exit $?"; grep -E "append|copy" $OUT/bench.log
stamp sanitize
{ for tool in memcheck racecheck synccheck; do
    timeout 60 compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-append flashinfer_like --filter append_nvfp4 "${F[@]}"
    echo "$tool gpu-append append_nvfp4 exit $?"; done
} > $OUT/sanitize.log 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit [0-9]" $OUT/sanitize.log
stamp done
