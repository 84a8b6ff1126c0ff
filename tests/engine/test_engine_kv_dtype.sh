#!/usr/bin/env bash
# test_engine_kv_dtype.sh: --kv-dtype: Llama with an nvfp4 (and an fp8) cache against a bf16 one.
# usage: test_engine_kv_dtype.sh ENGINE   (run from the source root)
set -eu
. "$(dirname "$0")/test_lib.sh"
engine=$(abspath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
common=(--config examples/configs/models.yaml --model meta-llama/Llama-3-8B --steps 3 --layers 2
        --batch 3 --prompt-len 40 --seed 11)

# field FILE REGEX: the first capture group of the first line matching the sed regex.
field() { sed -n "s/$2/\1/p" "$1" | head -n 1; }

run_status 0 "$work/bf16.txt" -- "$engine" "${common[@]}" --kv-dtype bf16
run_status 0 "$work/nvfp4.txt" -- "$engine" "${common[@]}" --kv-dtype nvfp4
run_status 0 "$work/fp8.txt" -- "$engine" "${common[@]}" --kv-dtype fp8_e4m3
for run in bf16 nvfp4 fp8; do
    expect_line "$work/$run.txt" '^  result: meta-llama/Llama-3-8B served by [a-z0-9_]+$' "$run: served"
done

# The cache really is nvfp4: 0.5 + 1/16 bytes per value against bf16's 2 (ratio 0.28125).
kv_mib='^  KV cache: 2 layers x [0-9]* pages of 16 tokens, \([0-9.]*\) MiB.*'
bf16_mib=$(field "$work/bf16.txt" "$kv_mib")
nvfp4_mib=$(field "$work/nvfp4.txt" "$kv_mib")
awk -v a="$nvfp4_mib" -v b="$bf16_mib" 'BEGIN { r = a / b; exit !(r > 0.27 && r < 0.29) }' ||
    fail "nvfp4 cache $nvfp4_mib MiB is not 0.28 of bf16's $bf16_mib MiB"

# bf16 against itself: no twin, no report.
expect_no_line "$work/bf16.txt" 'cache vs a bf16 cache' "--kv-dtype bf16 has nothing to compare"

# The report: prefill, last and worst decode step. NVFP4 on uniform activations loses about 10%
# (tests/cpu_ref/test_nvfp4.c derives it), the attention output about the same; fp8 e4m3 (3
# mantissa bits against E2M1's 1) far less. Both are nonzero: the caches are not bf16.

# report FILE DTYPE GROUP: from the report line, 1 prefill, 2 last decode step, 3 worst one.
report() {
    expect_line "$1" "^  $2 cache vs a bf16 cache" "$2: the report"
    sed -n "s/^  $2 cache vs a bf16 cache, same inputs (cpu_ref over bf16, 2 layers alike): rel L2 prefill \([0-9.e+-]*\), last decode step \([0-9.e+-]*\), worst decode step \([0-9.e+-]*\)\$/\\$3/p" "$1"
}
nvfp4_prefill=$(report "$work/nvfp4.txt" nvfp4 1)
nvfp4_worst=$(report "$work/nvfp4.txt" nvfp4 3)
fp8_prefill=$(report "$work/fp8.txt" fp8_e4m3 1)
fp8_worst=$(report "$work/fp8.txt" fp8_e4m3 3)
awk -v p="$nvfp4_prefill" -v w="$nvfp4_worst" 'BEGIN { exit !(p > 0.05 && p < 0.2 && w > 0.05 && w < 0.2) }' ||
    fail "nvfp4 vs bf16: prefill $nvfp4_prefill, worst decode $nvfp4_worst outside (0.05, 0.2)"
awk -v p="$fp8_prefill" -v w="$fp8_worst" -v n="$nvfp4_prefill" 'BEGIN { exit !(p > 0.002 && p < n / 2 && w > 0.002 && w < 0.06) }' ||
    fail "fp8 vs bf16: prefill $fp8_prefill, worst decode $fp8_worst (nvfp4 prefill $nvfp4_prefill)"

run_status 2 "$work/bad.txt" -- "$engine" "${common[@]}" --kv-dtype fp5
expect_line "$work/bad.txt" "unknown cache type 'fp5'" "a bad --kv-dtype is a usage error"
echo "ok: nvfp4 vs bf16 rel L2 prefill $nvfp4_prefill, worst decode $nvfp4_worst; fp8 $fp8_prefill"
