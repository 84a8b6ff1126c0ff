#!/bin/bash
# mha_run.sh: on the GPU machine, build trtllm_mha and what checks and times it, in one call.
# Usage (repo root, carry .deps; .fi at ../../.fi or .fi for FlashInfer):
#   AP_COMMIT=sha bash bench/mha_run.sh [--tests] [--bench] [--engine]
# --tests: gpu-mha, the shared gpu-harness table, compute-sanitizer memcheck and racecheck;
# --bench: attnplug-bench + torch SDPA (+ report.py), FlashInfer's decode, mha-bench;
# --engine: the Llama rule in the engine, eager and with --cuda-graphs;
# --nvfp4: the kit's nvfp4 test and flashinfer_like's nvfp4 decode (gpu-fil-nvfp4, its decode
# benchmarks); torch on decode cases only (--tests runs gpu-mha's quick cases, nvfp4 among them,
# under memcheck and racecheck).
set -o pipefail
OUT=${OUT:-/tmp/mha_out}
B=/tmp/mha-build
mkdir -p "$OUT"
TESTS=0 BENCH=0 ENGINE=0 NVFP4=0
for a in "$@"; do
    case "$a" in --tests) TESTS=1 ;; --bench) BENCH=1 ;; --engine) ENGINE=1 ;; --nvfp4) NVFP4=1 ;; esac
done
EXTRA=()
[ $NVFP4 = 1 ] && EXTRA=(backends/flashinfer_like/ap_flashinfer_like.so tests/gpu/gpu-fil-nvfp4
    tests/gpu/test_gpu_nvfp4)
t0=$(date +%s)
stamp() { echo "--- $1 at +$(($(date +%s) - t0))s"; }
source .ci/gpu-deps.sh
gpu_deps_use || echo "no .deps/*.deb"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv
stamp build
(meson setup $B -Dcuda=enabled -Dbuildtype=debugoptimized >/dev/null &&
    ninja -C $B -j 16 backends/trtllm_mha/ap_trtllm_mha.so backends/cpu_ref/ap_cpu_ref.so \
        tests/gpu/gpu-mha tests/gpu/gpu-harness bench/attnplug-bench bench/mha-bench \
        examples/engine/attnplug-engine "${EXTRA[@]}") >"$OUT/build.log" 2>&1 ||
    { echo "build failed"; grep -E "error" "$OUT/build.log" | head -n 30; exit 1; }
P=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/trtllm_mha)
if [ $TESTS = 1 ]; then
    stamp gpu-mha
    timeout 150 $B/tests/gpu/gpu-mha "${P[@]}" >"$OUT/tests.log" 2>&1
    echo "gpu-mha exit $?"; grep -E "^(FAIL|summary)" "$OUT/tests.log" | head -n 40
    if [ -z "$MHA_SAN_FILTER" ]; then # MHA_SAN_FILTER=nvfp4: those cases only, no gpu-harness
        stamp gpu-harness
        timeout 150 $B/tests/gpu/gpu-harness trtllm_mha "${P[@]}" >>"$OUT/tests.log" 2>&1
        echo "gpu-harness exit $?"; grep -E "^(FAIL|summary)" "$OUT/tests.log" | tail -n 20
    fi
    stamp sanitize
    {
        timeout 100 compute-sanitizer --tool memcheck --error-exitcode 3 --print-limit 10 \
            $B/tests/gpu/gpu-mha --quick ${MHA_SAN_FILTER:+--filter $MHA_SAN_FILTER} "${P[@]}"
        echo "memcheck exit $?"
        timeout 100 compute-sanitizer --tool racecheck --error-exitcode 3 --print-limit 10 \
            $B/tests/gpu/gpu-mha --quick --filter ${MHA_SAN_FILTER:-_g} "${P[@]}"
        echo "racecheck exit $?"
    } >"$OUT/sanitize.log" 2>&1
    grep -E "ERROR SUMMARY|exit [0-9]|^summary|^FAIL" "$OUT/sanitize.log"
fi
if [ $NVFP4 = 1 ]; then
    stamp nvfp4
    F=(--plugin-dir $B/backends/cpu_ref --plugin-dir $B/backends/flashinfer_like)
    {
        timeout 60 $B/tests/gpu/test_gpu_nvfp4; echo "test_gpu_nvfp4 exit $?"
        timeout 150 $B/tests/gpu/gpu-fil-nvfp4 "${F[@]}"; echo "gpu-fil-nvfp4 exit $?"
    } >"$OUT/nvfp4.log" 2>&1
    grep -E "exit [0-9]|ERROR SUMMARY|^summary|^FAIL|wrong|passed" "$OUT/nvfp4.log" | head -n 30
fi
if [ $ENGINE = 1 ]; then
    stamp engine
    E=(--model meta-llama/Llama-3-8B --layers 4 --steps 4 --batch 8 --prompt-len 300 --seed 7)
    { $B/examples/engine/attnplug-engine "${E[@]}" "${P[@]}"; echo "engine eager exit $?";
      $B/examples/engine/attnplug-engine "${E[@]}" --cuda-graphs "${P[@]}";
      echo "engine graphs exit $?"; } >"$OUT/engine.log" 2>&1
    grep -E "candidate|backend:|prefill:|decode step|check|result|exit" "$OUT/engine.log" | head -n 40
fi
if [ $BENCH = 1 ]; then
    stamp bench
    timeout 120 $B/bench/attnplug-bench --backend trtllm_mha --runs 100 "${P[@]}" \
        --json "$OUT/bench-ours.json" >"$OUT/bench.log" 2>&1
    grep -E "^(decode|extend)" "$OUT/bench.log"
    $B/bench/attnplug-bench --list >/tmp/cases.json
    TC=(); [ $NVFP4 = 1 ] && TC=(--case decode)
    PYTHONUNBUFFERED=1 timeout 150 python3 bench/peer_torch.py --cases /tmp/cases.json --runs 100 \
        "${TC[@]}" --json "$OUT/bench-torch.json" >>"$OUT/bench.log" 2>&1 || echo "peer_torch failed"
    python3 bench/report.py --cases /tmp/cases.json --ours "$OUT/bench-ours.json" \
        --peer "$OUT/bench-torch.json" --gpu "$(nvidia-smi --query-gpu=name --format=csv,noheader)" \
        --commit "${AP_COMMIT:-unknown}" --date "$(date -u +%F)" --backend trtllm_mha \
        --out "$OUT/results.md" >>"$OUT/bench.log" 2>&1 && grep '^|' "$OUT/results.md"
    if [ $NVFP4 = 1 ]; then
        timeout 90 $B/bench/attnplug-bench --backend flashinfer_like --case decode --runs 100 \
            --plugin-dir $B/backends/flashinfer_like >"$OUT/bench-fil.log" 2>&1
        echo "flashinfer_like:"; grep -E "^decode" "$OUT/bench-fil.log"
    fi
    stamp mha-bench
    timeout 120 $B/bench/mha-bench "${P[@]}" 2>&1 | tee -a "$OUT/bench.log"
    FI=""
    for d in .fi ../../.fi; do [ -f $d/fi_bench.py ] && FI=$d && break; done
    if [ -n "$FI" ]; then
        stamp flashinfer
        fi_bench "$FI" 200 --only decode --no-extra --build-budget 150 --out /tmp/fi \
            >"$OUT/fi.log" 2>&1 || echo "fi_bench exit $?"
        sed -n '/==== FlashInfer/,$p' "$OUT/fi.log" | head -n 14
    fi
fi
stamp done
# --nvfp4 writes 10 files; the device tool returns 8: one archive
[ $NVFP4 = 1 ] && (cd "$OUT" && tar czf logs.tgz --remove-files ./*.log ./*.json ./*.md)
