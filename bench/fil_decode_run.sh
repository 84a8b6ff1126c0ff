#!/bin/bash
# fil_decode_run.sh: on the GPU machine, build, check and time flashinfer_like's decode in one go.
# Usage (repo root, carry .deps): bash bench/fil_decode_run.sh   (logs under $OUT)
set -o pipefail
OUT=${OUT:-/tmp/fil_decode_out}
B=/tmp/fil-build
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb: carry .deps (see .ci/gpu-run); using system packages"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
stamp build
(meson setup $B -Dcuda=enabled && ninja -C $B -j 16 backends/flashinfer_like/ap_flashinfer_like.so \
    backends/cpu_ref/ap_cpu_ref.so && { ninja -C $B -j 16 tests/gpu/gpu-harness || true; }) \
    >"$OUT/build.log" 2>&1 || { echo "meson build failed"; tail -n 30 "$OUT/build.log"; exit 1; }
SO=$B/backends/flashinfer_like/ap_flashinfer_like.so
nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I. -o $B/fil_decode_bench \
    bench/fil_decode_bench.cu -ldl >>"$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
cuobjdump -sass $SO >/tmp/sass.txt 2>&1
# per decode kernel: instructions, HMMA, LDSM, cp.async, local memory, fp8 conversions
awk '/Function :/ {name=$3} /Function :.*fil_decode_kernel/ {show=1} /Function :/ && !/fil_decode_kernel/ {show=0}
     show && /\/\*[0-9a-f]+\*\// {n[name]++; if (/HMMA/) h[name]++; if (/LDSM/) l[name]++; if (/LDGSTS/) g[name]++;
     if (/LDL|STL/) s[name]++; if (/F2FP|F2F/) f[name]++}
     END {for (k in n) printf "%6d instr %4d HMMA %4d LDSM %4d LDGSTS %3d LDL/STL %4d F2FP  %s\n", n[k], h[k], l[k], g[k], s[k], f[k], k}' /tmp/sass.txt | sort -k14 | tee "$OUT/sass_summary.txt"
stamp bench
$B/fil_decode_bench $SO --runs 50 ${FIL_FILTER:+--filter $FIL_FILTER} 2>&1 | tee "$OUT/bench.log"
stamp sanitize
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/fil_decode_bench $SO --filter b3_l77 --runs 2 >"$OUT/sanitize.log" 2>&1
echo "memcheck rc $?"; tail -n 2 "$OUT/sanitize.log"
timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 $B/fil_decode_bench $SO --filter b3_l77 --runs 2 >>"$OUT/sanitize.log" 2>&1
echo "racecheck rc $?"; tail -n 2 "$OUT/sanitize.log"
if [ -x $B/tests/gpu/gpu-harness ]; then
    stamp harness
    timeout 100 $B/tests/gpu/gpu-harness flashinfer_like --filter decode --plugin-dir $B/backends/cpu_ref \
        --plugin-dir $B/backends/flashinfer_like >"$OUT/harness.log" 2>&1
    echo "harness rc $?"; grep -E "FAIL|fail|summary|passed|skip" "$OUT/harness.log" | head -n 40
fi
stamp end
grep -E "PASS|FAIL" "$OUT/bench.log"
