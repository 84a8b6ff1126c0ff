#!/bin/bash
# memwr_run.sh: on the GPU machine, one call for the memory-bound writers (issues 9 and 11):
# build, trtllm_mla's pack and append cases in gpu-mla, gpu-append for both MHA backends, the nvfp4
# tests, mla-bench's pack/append beside torch's eager pack, nvfp4-bench and attnplug-bench's append
# cases, memcheck on the changed kernels. Usage (repo root, .deps carried; logs under $OUT):
#   OUT=... AP_COMMIT=sha bash bench/memwr_run.sh
set -o pipefail
B=/tmp/memwr-build
t0=$(date +%s); stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh; gpu_deps_use || echo "no .deps"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
stamp build
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null && ninja -C $B -j 16 \
  backends/trtllm_mla/ap_trtllm_mla.so backends/cpu_ref/ap_cpu_ref.so backends/flashinfer_like/ap_flashinfer_like.so \
  backends/trtllm_mha/ap_trtllm_mha.so tests/gpu/gpu-mla tests/gpu/gpu-append tests/gpu/test_gpu_nvfp4 \
  tests/gpu/gpu-fil-nvfp4 bench/mla-bench bench/nvfp4-bench bench/attnplug-bench) > $OUT/build.log 2>&1 || { echo build failed; grep error $OUT/build.log | head -30; exit 1; }
C=(--plugin-dir $B/backends/cpu_ref)
M=("${C[@]}" --plugin-dir $B/backends/trtllm_mla)
stamp tests
{ for f in pack append; do timeout 120 $B/tests/gpu/gpu-mla --filter mla-$f "${M[@]}"; echo "gpu-mla $f exit $?"; done
  for be in flashinfer_like trtllm_mha; do timeout 120 $B/tests/gpu/gpu-append $be "${C[@]}" --plugin-dir $B/backends/$be; echo "gpu-append $be exit $?"; done
  timeout 120 $B/tests/gpu/test_gpu_nvfp4; echo "test_gpu_nvfp4 exit $?"
  timeout 120 $B/tests/gpu/gpu-fil-nvfp4 "${C[@]}" --plugin-dir $B/backends/flashinfer_like; echo "gpu-fil-nvfp4 exit $?"
} > $OUT/tests.log 2>&1
grep -E "exit [0-9]|^FAIL|summary|passed|failed" $OUT/tests.log | grep -v "^PASS" | tail -n 20
stamp bench
{ timeout 90 $B/bench/mla-bench --runs 100 --only pack "${M[@]}"; timeout 60 $B/bench/mla-bench --runs 100 --only append "${M[@]}"
  PYTHONUNBUFFERED=1 timeout 90 python3 bench/mla_peer_torch.py --runs 100 --only pack
  for be in flashinfer_like trtllm_mha; do timeout 60 $B/bench/nvfp4-bench --backend $be --runs 100 "${C[@]}" --plugin-dir $B/backends/$be; done
  for be in flashinfer_like trtllm_mha; do for c in append_t16384 append_t16384_fp8 append_t64_fp8; do timeout 30 $B/bench/attnplug-bench --backend $be --case $c --runs 100 "${C[@]}" --plugin-dir $B/backends/$be | grep -E "append"; done; done
} > $OUT/bench.log 2>&1
grep -E "pack|append|copy|GB/s" $OUT/bench.log | head -n 60
stamp memcheck
{ timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-mla --filter mla-pack "${M[@]}"; echo "memcheck pack exit $?"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-mla --filter mla-append-fp8-h16-p64-gptj-strided "${M[@]}"; echo "memcheck append gptj exit $?"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-mla --filter mla-append-bf16-h128-p64-neox-strided "${M[@]}"; echo "memcheck append neox exit $?"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-append trtllm_mha --filter append_ "${C[@]}" --plugin-dir $B/backends/trtllm_mha; echo "memcheck gpu-append exit $?"
} > $OUT/sanitize.log 2>&1
grep -E "ERROR SUMMARY|exit [0-9]" $OUT/sanitize.log
stamp done
