#!/bin/bash
# hopper_paged_run.sh: one device call for the Hopper prefill kernel's paged K/V source, from the
# repo root (.fi linked or carried beside it for FlashInfer): FlashInfer's fa3 prefill (ragged and
# paged) JIT-built in the background; our build; hopper_prefill_check (double reference on every
# element and LSE, ragged and paged cases, then its timings incl. paged page 16); gpu-harness
# fa_varlen and flashinfer_like (every extend case now on the Hopper kernel); compute-sanitizer
# memcheck and racecheck on paged cases; fav-bench's paged/ragged rows and attnplug-bench's
# flashinfer_like extend rows beside torch SDPA (cuDNN) and FlashInfer in the same call.
# Logs tarred into $OUT/logs.tgz; a short summary last.
set -u
OUT=${OUT:-/tmp/hopper-out}
B=/tmp/hopper-build
L=/tmp/hopper-logs
mkdir -p "$OUT" "$L"
source .ci/gpu-deps.sh && gpu_deps_use
t0=$(date +%s)
stamp() { echo "[$(($(date +%s) - t0))s] $*" | tee -a "$L/summary.txt"; }
FI_PID=
if ls .fi/whl/*.whl >/dev/null 2>&1; then
    fi_bench .fi 300 --only prefill --labels prefill_fa3,prefill_paged_fa3 --no-extra \
        --build-budget 200 --out "$L/fi" >"$L/fi.log" 2>&1 &
    FI_PID=$!
fi
meson setup "$B" -Dbuildtype=debugoptimized -Dcuda=enabled >"$L/build.log" 2>&1 &&
    meson compile -C "$B" -j 16 hopper_prefill_check gpu-harness fav-bench attnplug-bench \
        ap_cpu_ref ap_flashinfer_like ap_fa_varlen >>"$L/build.log" 2>&1
stamp "build rc=$?"
grep -E "error|FAILED" "$L/build.log" | head -20
P=(--plugin-dir "$B/backends/cpu_ref")
FAV=("${P[@]}" --plugin-dir "$B/backends/fa_varlen")
FIL=("${P[@]}" --plugin-dir "$B/backends/flashinfer_like")
# the small cases first: a hang or a failure there ends the call early (device time is short)
timeout 25 "$B/bench/hopper_prefill_check" --quick >"$L/check-quick.log" 2>&1
rc=$?
stamp "check --quick rc=$rc"
if [ $rc != 0 ]; then
    [ -n "$FI_PID" ] && kill "$FI_PID"
    tar czf "$OUT/logs.tgz" -C "$L" .
    cat "$L/check-quick.log"
    exit 1
fi
timeout 100 "$B/bench/hopper_prefill_check" >"$L/check.log" 2>&1
stamp "check rc=$?"
timeout 100 "$B/tests/gpu/gpu-harness" fa_varlen --filter extend "${FAV[@]}" \
    >"$L/gpu-harness-fav.log" 2>&1
stamp "gpu-harness fa_varlen extend rc=$?"
timeout 100 "$B/tests/gpu/gpu-harness" flashinfer_like --filter extend "${FIL[@]}" \
    >"$L/gpu-harness-fil.log" 2>&1
stamp "gpu-harness flashinfer_like extend rc=$?"
{
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
        "$B/bench/hopper_prefill_check" --quick
    echo "memcheck check --quick exit $?"
    timeout 40 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 20 \
        "$B/tests/gpu/gpu-harness" fa_varlen --filter extend_prefix_mid_page --seed 1 "${FAV[@]}"
    echo "memcheck fa_varlen extend_prefix_mid_page exit $?"
    timeout 50 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 20 \
        "$B/tests/gpu/gpu-harness" fa_varlen --filter extend_prefix_mid_page --seed 1 "${FAV[@]}"
    echo "racecheck fa_varlen extend_prefix_mid_page exit $?"
} >"$L/san.log" 2>&1
stamp "sanitizer done"
"$B/bench/fav-bench" --list /tmp/fav-cases.json
timeout 45 "$B/bench/fav-bench" --runs 30 --only b4_s4096_d128 "${FAV[@]}" >"$L/fav-bench.log" 2>&1
stamp "fav-bench rc=$?"
timeout 45 "$B/bench/attnplug-bench" --backend flashinfer_like --case extend --runs 50 \
    "${FIL[@]}" >"$L/fil-bench.log" 2>&1
stamp "attnplug-bench flashinfer_like extend rc=$?"
"$B/bench/attnplug-bench" --list >/tmp/ab-cases.json
PYTHONUNBUFFERED=1 timeout 60 python3 bench/peer_torch.py --cases /tmp/fav-cases.json --runs 30 \
    --case b4_s4096_d128 >"$L/torch-fav.log" 2>&1
PYTHONUNBUFFERED=1 timeout 60 python3 bench/peer_torch.py --cases /tmp/ab-cases.json --runs 50 \
    --case extend >"$L/torch-fil.log" 2>&1
stamp "torch peers done"
if [ -n "$FI_PID" ]; then
    wait "$FI_PID"
    stamp "FlashInfer rc=$?"
fi
rm -f "$L"/fi/ninja_build.log
tar czf "$OUT/logs.tgz" -C "$L" .
cat "$L/summary.txt"
grep -E "^(FAIL|ALL|SOME|hopper)|kit entry" "$L/check.log" | grep -v "^PASS"
echo "check PASS lines: $(grep -cE "^PASS" "$L/check.log")"
grep -E "^(summary|FAIL)" "$L/gpu-harness-fav.log" "$L/gpu-harness-fil.log" | head -20
grep -E "ERROR SUMMARY|exit" "$L/san.log"
grep -E "TFLOP|not run" "$L/fav-bench.log" | head -8
grep -E "extend" "$L/fil-bench.log" | head -6
grep -E "s4096|extend" "$L/torch-fav.log" "$L/torch-fil.log" | head -12
grep -E "^prefill|rror" "$L/fi.log" | head -6
