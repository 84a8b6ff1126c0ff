#!/bin/bash
# mlaap2_run.sh: on the GPU machine, one call for trtllm_mla's fused MLA append, round 2 (issue 9):
# build, gpu-mla's append cases (every cache byte and q element against cpu_ref and the host rope),
# memcheck on them, mla-bench's append rows. AB=1 also times round 1's kernel in the same call:
# a copy of the build dir whose append.cu is recompiled with -DAP_MLA_APPEND_PERSISTENT=0 and the
# plugin relinked (seconds, not a second full build). Usage (repo root, .deps carried):
#   OUT=... [AB=1] bash bench/mlaap2_run.sh
set -o pipefail
B=/tmp/mlaap2-b
B1=/tmp/mlaap2-r1
t0=$(date +%s); stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh; gpu_deps_use || echo "no .deps"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
T=(backends/cpu_ref/ap_cpu_ref.so backends/trtllm_mla/ap_trtllm_mla.so tests/gpu/gpu-mla bench/mla-bench)
stamp build
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null && ninja -C $B -j 16 "${T[@]}") \
  > $OUT/build.log 2>&1 || { echo build failed; grep error $OUT/build.log | head -30; exit 1; }
D=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/trtllm_mla)
stamp tests
timeout 60 $B/tests/gpu/gpu-mla --filter mla-append "${D[@]}" > $OUT/tests.log 2>&1
echo "gpu-mla mla-append exit $?"; grep -iE "pass|fail|differ" $OUT/tests.log | tail -n 12
stamp memcheck
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
  $B/tests/gpu/gpu-mla --filter mla-append "${D[@]}" > $OUT/memcheck.log 2>&1
echo "memcheck exit $?"; grep -E "ERROR SUMMARY" $OUT/memcheck.log
stamp bench
timeout 30 $B/bench/mla-bench --runs 100 --only append "${D[@]}" > $OUT/bench.log 2>&1
echo "mla-bench exit $?"; grep -E "append" $OUT/bench.log
if [ "${AB:-0}" = 1 ]; then
  stamp "round 1 (AP_MLA_APPEND_PERSISTENT=0)"
  rm -rf $B1 && cp -a $B $B1 &&
  (cd $B1 && so=backends/trtllm_mla/ap_trtllm_mla.so &&
   eval "$(ninja -t commands $so | grep -F 'append.cu.o -c') -DAP_MLA_APPEND_PERSISTENT=0" &&
   eval "$(ninja -t commands $so | tail -n 1)") > $OUT/build-r1.log 2>&1 || { echo r1 build failed; exit 1; }
  for b in $B1 $B $B1 $B; do echo "== $b"; timeout 30 $B/bench/mla-bench --runs 100 --only append \
    --plugin-dir $B/backends/cpu_ref --plugin-dir $b/backends/trtllm_mla 2>&1 | grep -E "append"; done \
    > $OUT/bench-ab.log
  cat $OUT/bench-ab.log
fi
stamp done
