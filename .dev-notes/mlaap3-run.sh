#!/bin/bash
# mlaap3: build the default tree, relink the trtllm_mla plugin with append.cu at forms 1-3 into
# build-f1..3/trtllm_mla, check the forms against cpu_ref, memcheck form 1, time all forms twice.
# Run from the repository root: bash .dev-notes/mlaap3-run.sh [compile-only]
set -e
[ -d build ] || meson setup build -Dbuildtype=debugoptimized -Dcuda=enabled >/dev/null
ninja -C build backends/trtllm_mla/ap_trtllm_mla.so backends/cpu_ref/ap_cpu_ref.so \
    tests/gpu/gpu-mla bench/mla-bench >/dev/null
OBJ=backends/trtllm_mla/ap_trtllm_mla.so.p/append.cu.o
SO=backends/trtllm_mla/ap_trtllm_mla.so
CC=$(cd build && ninja -t commands $OBJ | tail -1)
LD=$(cd build && ninja -t commands $SO | tail -1)
for f in 1 2 3; do
    mkdir -p build-f$f/trtllm_mla
    (cd build && eval "${CC/ -o $OBJ / -DAP_MLA_APPEND_FORM=$f -o ../build-f$f/append.cu.o }" &&
        L="${LD/ $OBJ / ../build-f$f/append.cu.o }" &&
        eval "${L/-o $SO /-o ../build-f$f/trtllm_mla/ap_trtllm_mla.so }") &
done
wait
ls -l build-f*/trtllm_mla/ap_trtllm_mla.so
[ "$1" = compile-only ] && exit 0
set +e
CPU=build/backends/cpu_ref
for f in 1 2 3; do
    echo "== gpu-mla form $f"
    build/tests/gpu/gpu-mla --filter mla-append --plugin-dir $CPU --plugin-dir build-f$f/trtllm_mla | tail -3
done
echo "== memcheck form 1"
compute-sanitizer --tool memcheck --error-exitcode 1 build/tests/gpu/gpu-mla --filter mla-append \
    --plugin-dir $CPU --plugin-dir build-f1/trtllm_mla | tail -3
for round in 1 2; do
    for d in build/backends/trtllm_mla build-f1/trtllm_mla build-f2/trtllm_mla build-f3/trtllm_mla; do
        echo "== round $round: $d"
        build/bench/mla-bench --runs 100 --only append --plugin-dir $d | grep append
    done
done
