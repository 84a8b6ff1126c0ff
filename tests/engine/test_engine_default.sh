#!/usr/bin/env bash
# test_engine_default.sh: the example engine's run over the shipped config, and its exit statuses.
# usage: test_engine_default.sh ENGINE   (run from the source root)
set -eu
. "$(dirname "$0")/test_lib.sh"
engine=$(abspath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# section FILE MODEL: the lines of one model's block of the engine's output.
section() {
    awk -v head="== $2:" 'index($0, head) == 1 { on = 1; print; next }
                          on && (/^== / || /^engine:/) { on = 0 }
                          on { print }' "$1"
}

run_status 0 "$work/run.txt" -- "$engine" --config examples/configs/models.yaml --steps 3 \
    --layers 2 --batch 3 --prompt-len 24 --seed 7
out=$work/run.txt
expect_line "$out" '^attnplug-engine: config examples/configs/models.yaml, seed 7, 2 layers, batch 3' \
    "the run states its parameters"
expect_line "$out" '^plugins: .*cpu_ref' "cpu_ref is loaded"

# Llama: some backend serves it, the prefill and three decode steps are timed, and any backend
# but cpu_ref is checked against cpu_ref.
section "$out" meta-llama/Llama-3-8B >"$work/llama.txt"
expect_line "$work/llama.txt" '^  candidate [a-z0-9_]+: usable <- chosen$' "Llama: a chosen candidate"
backend=$(sed -n 's/^  result: meta-llama\/Llama-3-8B served by \([a-z0-9_]*\)$/\1/p' "$work/llama.txt")
[ -n "$backend" ] || { cat "$work/llama.txt" >&2; fail "Llama was not served"; }
expect_line "$work/llama.txt" '^  batch: 3 sequences, prompt lengths [0-9]+ [0-9]+ 24 \([0-9]+ tokens\)$' \
    "Llama: 3 prompts, the last one the longest"
expect_line "$work/llama.txt" '^  prefill: [1-9][0-9]* tokens x 2 layers in [0-9]+\.[0-9]{3} ms: [1-9][0-9]* tokens/s$' \
    "Llama: a timed prefill with a throughput"
for step in 1 2 3; do
    expect_line "$work/llama.txt" "^  decode step $step: 3 tokens x 2 layers in [0-9]+\.[0-9]{3} ms: [1-9][0-9]* tokens/s\$" \
        "Llama: decode step $step timed"
done
expect_no_line "$work/llama.txt" '^  decode step 4:' "Llama: exactly --steps decode steps"
expect_line "$work/llama.txt" '^  decode: 3 steps, [0-9]+\.[0-9]{3} ms/step mean, [1-9][0-9]* tokens/s$' \
    "Llama: the decode summary"
if [ "$backend" = cpu_ref ]; then
    expect_line "$work/llama.txt" '^  check: cpu_ref is the reference itself; outputs all finite$' \
        "Llama on cpu_ref: outputs finite"
else
    expect_line "$work/llama.txt" "^  check vs cpu_ref \(layer 1, prefill, 3 sequences\): rel L2 error [0-9]\.[0-9]{3}e[-+][0-9]+ \(limit [0-9]e-0[0-9]\): ok\$" \
        "Llama on $backend: prefill checked against cpu_ref"
    expect_line "$work/llama.txt" "^  check vs cpu_ref \(layer 1, last decode step, 3 sequences\): rel L2 error [0-9]\.[0-9]{3}e[-+][0-9]+ \(limit [0-9]e-0[0-9]\): ok\$" \
        "Llama on $backend: checked against cpu_ref"
fi

# DeepSeek (MLA): served (cpu_ref where no GPU backend does): a chunked-prefix prefill in the MHA
# form (prefix chunks packed by the pack hook, merged by merge_state/1), the latent rows appended,
# then absorbed decode steps over the latent cache; any backend but cpu_ref is checked against it.
section "$out" deepseek-ai/DeepSeek-V3 >"$work/deepseek.txt"
ds_backend=$(sed -n 's/^  result: deepseek-ai\/DeepSeek-V3 served by \([a-z0-9_]*\)$/\1/p' "$work/deepseek.txt")
[ -n "$ds_backend" ] || { cat "$work/deepseek.txt" >&2; fail "DeepSeek-V3 was not served"; }
expect_line "$work/deepseek.txt" '^  KV cache: 2 layers x [0-9]+ pages of 64 tokens, latent 512 \+ rope 64 per token in fp8_e4m3, ' \
    "DeepSeek: the latent cache, fp8 as the config says"
expect_line "$work/deepseek.txt" '^  chunked prefix: [0-9]+ cached prompt tokens, [0-9]+ chunks of up to 16 per sequence, packed to fp8 by pack_prefix_chunk_kv/1, merged by merge_state/1$' \
    "DeepSeek: the prefix goes in packed fp8 chunks, merged"
expect_line "$work/deepseek.txt" '^  prefill: [1-9][0-9]* tokens x 2 layers in [0-9]+\.[0-9]{3} ms: [1-9][0-9]* tokens/s$' \
    "DeepSeek: a timed prefill"
for step in 1 2 3; do
    expect_line "$work/deepseek.txt" "^  decode step $step: 3 tokens x 2 layers in [0-9]+\.[0-9]{3} ms: [1-9][0-9]* tokens/s\$" \
        "DeepSeek: decode step $step timed"
done
if [ "$ds_backend" = cpu_ref ]; then
    expect_line "$work/deepseek.txt" '^  check: cpu_ref is the reference itself; outputs all finite$' \
        "DeepSeek on cpu_ref: outputs finite"
else
    for what in prefill 'last decode step'; do
        expect_line "$work/deepseek.txt" "^  check vs cpu_ref \(layer 1, $what, 3 sequences\): rel L2 error [0-9]\.[0-9]{3}e[-+][0-9]+ \(limit [0-9]e-0[0-9]\): ok\$" \
            "DeepSeek on $ds_backend: $what checked against cpu_ref"
    done
fi

# Qwen3-Embedding: prefill only; with prefix_cache false cpu_ref runs without a KV cache.
section "$out" Qwen/Qwen3-Embedding-8B >"$work/qwen.txt"
expect_line "$work/qwen.txt" '^  embedding model: prefill only, no decode$' "Qwen: prefill only"
expect_line "$work/qwen.txt" '^  prefill: [1-9][0-9]* tokens x 2 layers in [0-9.]+ ms: [1-9][0-9]* tokens/s$' \
    "Qwen: a timed prefill"
expect_no_line "$work/qwen.txt" '^  decode' "Qwen: no decode"
expect_line "$work/qwen.txt" '^  result: Qwen/Qwen3-Embedding-8B served by [a-z0-9_]+$' "Qwen served"
if grep -q 'served by cpu_ref$' "$work/qwen.txt"; then
    expect_line "$work/qwen.txt" '^  KV cache: none \(embedding model, prefix caching off: skip-KV mode\)$' \
        "Qwen on cpu_ref: skip-KV mode"
fi
expect_line "$out" '^engine: 3 models ran, 0 had no backend that can serve them here, 0 failed$' \
    "the summary counts"

# The default config is found from the source root and, through the build tree's copy, from
# any other folder.
run_status 0 "$work/default.txt" -- "$engine" --steps 1 --layers 1 --batch 2 --prompt-len 8
expect_line "$work/default.txt" '^attnplug-engine: config examples/configs/models.yaml,' "default config from the source root"
(cd "$work" && run_status 0 "$work/elsewhere.txt" -- "$engine" --steps 1 --layers 1 --batch 2 --prompt-len 8)
expect_line "$work/elsewhere.txt" '^attnplug-engine: config /.*/models\.yaml,' "default config from the build tree"

# One model by name; a model with no backend alone is a failure (nothing ran); bad input.
run_status 0 "$work/one.txt" -- "$engine" --model Qwen/Qwen3-Embedding-8B --batch 2 --prompt-len 8
expect_line "$work/one.txt" '^engine: 1 models ran, 0 had no backend' "--model runs one model"
# DeepSeek-V3 with 16 heads per GPU (tensor parallelism 8), through --model-spec.
run_status 0 "$work/tp8.txt" -- "$engine" --model deepseek-ai/DeepSeek-V3 --model-spec qo_heads=16 \
    --steps 2 --batch 2 --prompt-len 40
expect_line "$work/tp8.txt" '^== deepseek-ai/DeepSeek-V3: mla 16q heads, kv_lora 512' "--model-spec sets 16 heads"
expect_line "$work/tp8.txt" '^  chunked prefix: [0-9]+ cached prompt tokens, [2-9] chunks' "TP 8: several prefix chunks"
expect_line "$work/tp8.txt" '^engine: 1 models ran, 0 had no backend' "DeepSeek-V3 at TP 8 runs"
run_status 2 "$work/badspec.txt" -- "$engine" --model-spec qo_heads=x
expect_line "$work/badspec.txt" "bad value 'x' for model-spec key 'qo_heads'" "a bad --model-spec is a usage error"
# A model whose rule has no backend that can serve it alone: nothing ran, exit 1.
printf 'version: 1\nrules:\n  - match: "*"\n    backends: [cpu_ref]\n    options: {kv_dtype: nvfp4}\n' >"$work/nvfp4.yaml"
run_status 1 "$work/ds.txt" -- "$engine" --config "$work/nvfp4.yaml" --model deepseek-ai/DeepSeek-V3 \
    --batch 2 --prompt-len 8
expect_line "$work/ds.txt" '^engine: 0 models ran, 1 had no backend' "nothing ran: exit 1"
run_status 2 "$work/unknown.txt" -- "$engine" --model no/such-model
expect_line "$work/unknown.txt" "unknown model 'no/such-model'" "unknown model named"
run_status 2 "$work/usage.txt" -- "$engine" --steps -1
printf 'version: 1\nrules:\n  - match: "*"\n    backendz: [cpu_ref]\n' >"$work/typo.yaml"
run_status 1 "$work/typo.txt" -- "$engine" --config "$work/typo.yaml"
expect_line "$work/typo.txt" 'typo\.yaml:4:[0-9]+: .*backendz' "config errors name file:line:column"
echo "ok: engine served Llama by $backend"
