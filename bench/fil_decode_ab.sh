#!/bin/bash
# fil_decode_ab.sh: on the GPU machine, check and time flashinfer_like decode A (a commit) against B (the same commit with another decode.cu) in one call.
# Usage (repo root; carry .deps and the ignored folder that holds the two inputs):
#   bash bench/fil_decode_ab.sh SRC_TAR VARIANT_DECODE_CU      (logs under $OUT)
# SRC_TAR is `git archive` of the commit (.git does not travel, and a clean tree keeps others'
# uncommitted files out of both builds); VARIANT_DECODE_CU replaces its decode.cu for B.
# Both run the bench's full case list (check + 50 timed calls), then the key cases A B A B with
# 100 calls each so the spread between two runs of one version is seen, d3's gpu-harness on the
# decode cases, and compute-sanitizer on B's small fp8 cases. The table comes last.
set -o pipefail
SRC_TAR=$(realpath "$1") VARIANT=$(realpath "$2")
OUT=${OUT:-/tmp/fil_decode_ab_out}
W=/tmp/fil-ab
KEY=b64_l4096,b64_l4096_fp8,b1_l8192,b1_l8192_fp8,b8_l32768,b8_l32768_fp8
SMALL_FP8=b3_l77_fp8_g3,b2_l999_fp8_d64_split,b16_l3001_d64_fp8_g7
mkdir -p "$OUT" "$W/a" "$W/b"
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb: carry .deps (see .ci/gpu-run); using system packages"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu,power.draw --format=csv
tar -xf "$SRC_TAR" -C "$W/a" && tar -xf "$SRC_TAR" -C "$W/b" || exit 1
cp "$VARIANT" "$W/b/backends/flashinfer_like/decode.cu" || exit 1

stamp build
# A: plugin, cpu_ref and the harness; B: the plugin alone (the harness loads it from its dir)
(meson setup "$W/build-a" "$W/a" -Dcuda=enabled && ninja -C "$W/build-a" -j 10 \
    backends/flashinfer_like/ap_flashinfer_like.so backends/cpu_ref/ap_cpu_ref.so \
    tests/gpu/gpu-harness) >"$OUT/build.log" 2>&1 &
pa=$!
(meson setup "$W/build-b" "$W/b" -Dcuda=enabled -Dtests=false &&
    ninja -C "$W/build-b" -j 6 backends/flashinfer_like/ap_flashinfer_like.so) >"$W/build-b.log" 2>&1 &
pb=$!
wait $pa
rc_a=$?
ninja -C "$W/build-a" bench/fil_decode_bench >"$W/build-bench.log" 2>&1
rc_bench=$?
wait $pb
rc_b=$?
cat "$W/build-b.log" "$W/build-bench.log" >>"$OUT/build.log"
echo "build rc: A $rc_a, B $rc_b, bench $rc_bench"
if [ $rc_a != 0 ] || [ $rc_b != 0 ] || [ $rc_bench != 0 ]; then
    grep -E "error|FAILED" "$OUT/build.log" | head -n 30
    exit 1
fi
SO_A=$W/build-a/backends/flashinfer_like/ap_flashinfer_like.so
SO_B=$W/build-b/backends/flashinfer_like/ap_flashinfer_like.so
BENCH=$W/build-a/bench/fil_decode_bench

# per decode kernel: instructions, HMMA, LDSM, cp.async, local memory, fp8 conversions
for v in a b; do
    so=$W/build-$v/backends/flashinfer_like/ap_flashinfer_like.so
    echo "== $v"
    cuobjdump -sass "$so" 2>&1 | awk '/Function :/ {name=$3} /Function :.*fil_decode_kernel/ {show=1}
        /Function :/ && !/fil_decode_kernel/ {show=0}
        show && /\/\*[0-9a-f]+\*\// {n[name]++; if (/HMMA/) h[name]++; if (/LDSM/) l[name]++;
        if (/LDGSTS/) g[name]++; if (/LDL|STL/) s[name]++; if (/F2FP|F2F/) f[name]++}
        END {for (k in n) printf "%6d instr %4d HMMA %4d LDSM %4d LDGSTS %3d LDL/STL %4d F2FP  %s\n",
             n[k], h[k], l[k], g[k], s[k], f[k], k}' | sort -k14
done >"$OUT/sass_summary.txt"

stamp "full list A"
timeout 120 "$BENCH" "$SO_A" --runs 50 >"$OUT/bench_a.log" 2>&1
echo "A full list rc $?"
stamp "full list B"
timeout 120 "$BENCH" "$SO_B" --runs 50 >"$OUT/bench_b.log" 2>&1
echo "B full list rc $?"
stamp "interleaved"
: >"$OUT/ab.log"
for round in 1 2; do
    for v in A B; do
        so=$SO_A
        [ $v = B ] && so=$SO_B
        echo "### round $round version $v" >>"$OUT/ab.log"
        timeout 60 "$BENCH" "$so" --only $KEY --runs 100 >>"$OUT/ab.log" 2>&1
        echo "round $round $v rc $?"
    done
done

stamp harness
: >"$OUT/harness.log"
for v in a b; do
    echo "### version $v" >>"$OUT/harness.log"
    timeout 100 "$W/build-a/tests/gpu/gpu-harness" flashinfer_like --filter decode \
        --plugin-dir "$W/build-a/backends/cpu_ref" \
        --plugin-dir "$W/build-$v/backends/flashinfer_like" >>"$OUT/harness.log" 2>&1
    echo "harness $v rc $?"
done
grep -E "^(FAIL|summary)|passed|failed" "$OUT/harness.log" | head -n 20

stamp sanitize
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BENCH" "$SO_B" --only $SMALL_FP8 \
    --runs 2 >"$OUT/sanitize.log" 2>&1
echo "B memcheck rc $?"
timeout 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$BENCH" "$SO_B" \
    --only $SMALL_FP8 --runs 2 >>"$OUT/sanitize.log" 2>&1
echo "B racecheck rc $?"
grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize.log"

stamp end
for v in a b; do
    echo "== full list $v: $(grep -c PASS "$OUT/bench_$v.log") PASS, $(grep -c FAIL "$OUT/bench_$v.log") FAIL"
    grep FAIL "$OUT/bench_$v.log"
done
# fp8 tokens/s over bf16 tokens/s, per run (B64 L4096)
awk '/^### round/ {r=$3; v=$5} /^b64_l4096 / {bf[r v]=$(NF-1)} /^b64_l4096_fp8 / {f8[r v]=$(NF-1)}
     /(PASS|FAIL)/ {printf "r%s %s %-16s %s %s %s %s %s\n", r, v, $1, $2, $3, $4, $10, $14}
     END {for (k in bf) if (k in f8) printf "round/version %s: fp8/bf16 tok/s = %.3f\n", k, f8[k] / bf[k]}' \
    "$OUT/ab.log"
