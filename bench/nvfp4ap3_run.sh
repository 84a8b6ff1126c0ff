#!/bin/bash
# nvfp4ap3_run.sh: on the GPU machine, one call for the nvfp4 KV append, round 3 (issue 11): build
# the default (AP_APPEND_NVFP4_SPLIT 2) and keep its plugins aside, then recompile append_rope.cu
# alone with -DAP_APPEND_NVFP4_SPLIT=3 into the same build dir and relink the plugins (variant 3);
# gpu-append for both MHA backends and memcheck / racecheck on the append_nvfp4 cases on variant
# 3; nvfp4-bench --runs 100 for both builds, alternated twice. Usage (repo root, .deps carried;
# logs under $OUT):   OUT=... bash bench/nvfp4ap3_run.sh
set -o pipefail
B=/tmp/nvfp4ap3-build
P2=/tmp/nvfp4ap3-plugins-r2 # the default's plugins
t0=$(date +%s); stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh; gpu_deps_use || echo "no .deps"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
PL=(cpu_ref flashinfer_like trtllm_mha)
T=(tests/gpu/gpu-append bench/nvfp4-bench)
for p in "${PL[@]}"; do T+=(backends/$p/ap_$p.so); done
stamp build-r2
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null && ninja -C $B -j 16 "${T[@]}") \
  > $OUT/build.log 2>&1 || { echo build failed; grep error $OUT/build.log | head -30; exit 1; }
for p in "${PL[@]}"; do mkdir -p $P2/$p && cp $B/backends/$p/ap_$p.so $P2/$p/; done
stamp build-r3
O=backends/common/libap_kit.a.p/append_rope.cu.o
CMD=$(ninja -C $B -t commands $O | tail -1)
(cd $B && eval "${CMD/ -o $O/ -DAP_APPEND_NVFP4_SPLIT=3 -o $O}" && touch $O && ninja -j 16 "${T[@]}") \
  > $OUT/build-r3.log 2>&1 || { echo round-3 build failed; grep error $OUT/build-r3.log | head; exit 1; }
echo "persist kernels: r3 $(cuobjdump -symbols $B/backends/flashinfer_like/ap_flashinfer_like.so | grep -c persist_kernel)" \
  "r2 $(cuobjdump -symbols $P2/flashinfer_like/ap_flashinfer_like.so | grep -c persist_kernel) (want >0, 0)"
C=(--plugin-dir $B/backends/cpu_ref)
F=("${C[@]}" --plugin-dir $B/backends/flashinfer_like)
stamp tests-r3
{ for be in flashinfer_like trtllm_mha; do timeout 60 $B/tests/gpu/gpu-append $be "${C[@]}" --plugin-dir $B/backends/$be; echo "gpu-append $be exit $?"; done
} > $OUT/tests.log 2>&1
grep -E "exit [0-9]|^FAIL|summary" $OUT/tests.log | tail -n 20
stamp sanitize-r3
{ for tool in memcheck racecheck; do
    timeout 40 compute-sanitizer --tool $tool --error-exitcode 3 --print-limit 10 $B/tests/gpu/gpu-append flashinfer_like --filter append_nvfp4 "${F[@]}"
    echo "$tool gpu-append append_nvfp4 exit $?"; done
} > $OUT/sanitize.log 2>&1
grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit [0-9]" $OUT/sanitize.log
stamp bench-ab
for round in 1 2; do for d in $P2 $B/backends; do echo "== round $round: $d"
  timeout 30 $B/bench/nvfp4-bench --runs 100 --plugin-dir $d/cpu_ref --plugin-dir $d/flashinfer_like 2>&1 |
    grep -E "append|copy"; done; done > $OUT/bench-ab.log
cat $OUT/bench-ab.log
stamp done
