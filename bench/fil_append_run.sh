#!/bin/bash
# fil_append_run.sh: on the GPU machine, build, check and time flashinfer_like's append_kv/1 hook.
# Usage (repo root, carry .deps): bash bench/fil_append_run.sh   (logs under $OUT)
set -o pipefail
OUT=${OUT:-/tmp/fil_append_out}
B=/tmp/fil-append-build
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb: carry .deps (see .ci/gpu-run); using system packages"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
stamp build
(meson setup $B -Dcuda=enabled && ninja -C $B -j 16 backends/flashinfer_like/ap_flashinfer_like.so \
    backends/cpu_ref/ap_cpu_ref.so tests/gpu/gpu-harness) >"$OUT/build.log" 2>&1 ||
    { tail -n 30 "$OUT/build.log"; exit 1; }
SO=$B/backends/flashinfer_like/ap_flashinfer_like.so
# the bench with the launch built twice beside it: the previous (staged) kernel only, and as
# the plugin picks (bench/fil_append_variants.cu)
ninja -C $B bench/fil_append_bench >>"$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
# the fused kernel's SASS: FFMA must be absent from the rotation (only the IEEE division's), the
# row loads and stores 16 bytes wide, nothing in local memory
cuobjdump -sass $SO >/tmp/sass.txt 2>&1
awk '/Function :/ {name=$3; keep = name ~ /append_rope/} keep && /\/\*[0-9a-f]+\*\// {n[name]++;
     if (/FFMA/) f[name]++; if (/FMUL/) m[name]++; if (/LDG.*128/) l[name]++; if (/STG.E.128|STG.E.64/) s[name]++;
     if (/SHFL/) h[name]++; if (/LDL|STL/) x[name]++}
     END {for (k in n) printf "%5d instr %3d FFMA %3d FMUL %2d LDG.128 %2d STG.128/64 %2d SHFL %2d LDL/STL  %s\n",
          n[k], f[k], m[k], l[k], s[k], h[k], x[k], k}' /tmp/sass.txt | tee "$OUT/sass_summary.txt"
P=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/flashinfer_like)
stamp "harness append (seed default, then seeds 2 and 3)"
timeout 120 $B/tests/gpu/gpu-harness flashinfer_like --filter append "${P[@]}" 2>&1 | tee "$OUT/harness.log"
echo "harness append rc $?"
timeout 120 $B/tests/gpu/gpu-harness flashinfer_like --filter append --seed 2 "${P[@]}" 2>&1 | tee -a "$OUT/harness.log"
echo "harness append seed 2 rc $?"
timeout 120 $B/tests/gpu/gpu-harness flashinfer_like --filter append --seed 3 "${P[@]}" 2>&1 | tee -a "$OUT/harness.log"
echo "harness append seed 3 rc $?"
stamp bench
$B/bench/fil_append_bench $SO --runs 200 2>&1 | tee "$OUT/bench.log"
stamp "harness quick (the forward paths still pass)"
timeout 150 $B/tests/gpu/gpu-harness flashinfer_like --quick "${P[@]}" >"$OUT/harness_quick.log" 2>&1
echo "harness quick rc $?"; grep -cE "^PASS" "$OUT/harness_quick.log"; grep -E "^FAIL|passed|failed" "$OUT/harness_quick.log" | head -n 20
stamp sanitize
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/gpu/gpu-harness flashinfer_like \
    --filter append_rope "${P[@]}" >"$OUT/sanitize.log" 2>&1
echo "memcheck rc $?"; tail -n 3 "$OUT/sanitize.log"
stamp end
