#!/usr/bin/env bash
# test_hardening.sh: what the engine and ap-inspect show of misbehaving plugins, bad configs and
# bad arguments: every refusal where the user looks, escaped, with the right exit status.
# usage: test_hardening.sh ENGINE AP_INSPECT PYTHON3 BROKEN_FIXTURE_DIR HOSTILE_FIXTURE_DIR
set -eu
. "$(dirname "$0")/test_lib.sh"
engine=$(abspath "$1")
inspect=$(abspath "$2")
python=$3
broken=$(abspath "$4")
hostile=$(abspath "$5")
work=$(mktemp -d)
engine_pid=
trap '[ -z "$engine_pid" ] || kill "$engine_pid" 2>/dev/null; rm -rf "$work"' EXIT
small=(--steps 1 --layers 1 --batch 1 --prompt-len 4 --seed 3)
llama=(--model meta-llama/Llama-3-8B)

# rule_config FILE BACKENDS [OPTIONS]: one rule for every model.
rule_config() {
    printf 'version: 1\nrules:\n  - match: "*"\n    backends: [%s]\n' "$2" >"$1"
    [ -z "${3:-}" ] || printf '    options: {%s}\n' "$3" >>"$1"
}

# expect_no_control FILE: no byte a terminal acts on (C0 but tab and newline, DEL, C1 as bytes).
expect_no_control() {
    if LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$1"; then
        echo "--- $1:" >&2
        cat -v "$1" >&2
        fail "raw control bytes in $1"
    fi
}

# --- the command line ----------------------------------------------------------------------
run_status 0 "$work/help.txt" -- "$engine" --help
expect_line "$work/help.txt" '\[--layers L\]' "--help: --layers takes L"
expect_line "$work/help.txt" '\[--prompt-len P\]' "--help: --prompt-len takes P, not L"
expect_line "$work/help.txt" 'prompts \(1\.\.P tokens\)' "--help: prompts are 1..P tokens"
for seed in -5 abc ' 7' 18446744073709551616; do
    run_status 2 "$work/seed.txt" -- "$engine" --seed "$seed"
    expect_line "$work/seed.txt" "--seed must be a non-negative integer below 2\^64, got '$seed'" \
        "--seed '$seed' refused"
done
run_status 2 "$work/layers.txt" -- "$engine" "${llama[@]}" --layers 33
expect_line "$work/layers.txt" '^attnplug-engine: --layers 33 is more than meta-llama/Llama-3-8B has \(32 layers\)$' \
    "--layers above the model's count refused"
run_status 0 "$work/layers32.txt" -- "$engine" "${llama[@]}" --layers 32 --steps 0 --batch 1 --prompt-len 1
expect_line "$work/layers32.txt" 'layers=32 \(of 32\)$' "--layers equal to the model's count runs"

# --- singular and plural; the model line shows the rule's KV settings ----------------------------
rule_config "$work/fp8.yaml" cpu_ref 'kv_dtype: fp8_e4m3, page_size: 8'
run_status 0 "$work/one.txt" -- "$engine" --config "$work/fp8.yaml" "${llama[@]}" "${small[@]}"
out=$work/one.txt
expect_line "$out" '^attnplug-engine: config .*, seed 3, 1 layer, batch 1, prompts up to 4 tokens, 1 decode step$' \
    "header in the singular"
expect_line "$out" '^== meta-llama/Llama-3-8B: mha 32q/8kv heads, d128/128, bf16, kv=fp8_e4m3, page=8, layers=1 \(of 32\)$' \
    "the model line shows the config's KV dtype and page size"
expect_line "$out" '^  KV cache: 1 layer x [0-9]+ pages of 8 tokens' "the cache has pages of 8"
expect_line "$out" '^  batch: 1 sequence, prompt length 4 \(4 tokens\)$' "one sequence"
expect_line "$out" '^  decode step 1: 1 token x 1 layer in ' "one token, one layer"
expect_line "$out" '^  decode: 1 step, ' "one decode step"
expect_line "$out" '^engine: 1 model ran, 0 had no backend that can serve them here, 0 failed$' \
    "one model ran"

# --- a backend whose create fails stays in the walk, with its reason ---------------------------
rule_config "$work/create.yaml" 'create_fails, cpu_ref'
run_status 0 "$work/create.txt" -- "$engine" --config "$work/create.yaml" --plugin-dir "$broken" \
    "${llama[@]}" "${small[@]}"
expect_line "$work/create.txt" '^  candidate create_fails: refused \(AP_ERR_OUT_OF_MEMORY\)$' \
    "engine: create_fails in the walk"
expect_line "$work/create.txt" "^      - passed the checks, but backend 'create_fails': create failed: fixture 'create_fails' fails create on purpose\$" \
    "engine: create's message as the reason"
expect_line "$work/create.txt" '^  candidate cpu_ref: usable <- chosen$' "engine: cpu_ref chosen"
run_status 0 "$work/create_inspect.txt" -- "$inspect" --plugin-dir "$broken" \
    --config "$work/create.yaml" "${llama[@]}"
expect_line "$work/create_inspect.txt" '^  1\. create_fails +REFUSED \(AP_ERR_OUT_OF_MEMORY\)$' \
    "ap-inspect: create_fails not shown as chosen"
expect_line "$work/create_inspect.txt" "^       - passed the checks, but backend 'create_fails': create failed: " \
    "ap-inspect: create's message as the reason"
expect_line "$work/create_inspect.txt" '^  2\. cpu_ref +USABLE  <- chosen$' "ap-inspect: cpu_ref chosen"
run_status 0 "$work/create.json" -- "$inspect" --plugin-dir "$broken" --config "$work/create.yaml" \
    "${llama[@]}" --json
"$python" - "$work/create.json" <<'PY' || fail "ap-inspect --json walk with a failed create"
import json, sys
sel = json.load(open(sys.argv[1]))["selection"]
first, second = sel["candidates"]
assert first["backend"] == "create_fails" and first["verdict"] == "refused", first
assert first["status"] == "AP_ERR_OUT_OF_MEMORY" and not first["chosen"], first
assert first["reasons"][0].startswith("passed the checks, but backend 'create_fails'"), first
assert second["chosen"] and sel["chosen"] == "cpu_ref", sel
PY

# --- AP_BACKENDS_DISABLE names itself in the walk ------------------------------------------------
AP_BACKENDS_DISABLE=cpu_ref run_status 1 "$work/disabled.txt" -- "$engine" \
    --config "$work/fp8.yaml" "${llama[@]}" "${small[@]}"
expect_line "$work/disabled.txt" '^  candidate cpu_ref: refused \(AP_ERR_REFUSED\)$' "disabled: refused"
expect_line "$work/disabled.txt" "^      - disabled by AP_BACKENDS_DISABLE \(pattern 'cpu_ref'\): backend 'cpu_ref' in \[" \
    "disabled: the walk names the variable and the pattern"
expect_no_line "$work/disabled.txt" 'no plugin provides' "disabled is not absent"

# --- an unknown backend list is a config error, in the engine and in ap-inspect -------------------
rule_config "$work/unknown.yaml" 'no_such_a, no_such_b'
run_status 1 "$work/unknown.txt" -- "$engine" --config "$work/unknown.yaml" "${llama[@]}" "${small[@]}"
expect_line "$work/unknown.txt" '^  config error: AP_ERR_CONFIG$' "engine: a config error"
expect_line "$work/unknown.txt" "unknown\.yaml:4:15: none of the backends \[no_such_a, no_such_b\] is loaded" \
    "engine: the error names file:line:column"
expect_line "$work/unknown.txt" '^engine: 0 models ran, 0 had no backend that can serve them here, 1 failed$' \
    "engine: counted as a failure, not as a known gap"
run_status 1 "$work/unknown_inspect.txt" -- "$inspect" --config "$work/unknown.yaml"
expect_line "$work/unknown_inspect.txt" "^error: .*unknown\.yaml:4:15: none of the backends \[no_such_a, no_such_b\] is loaded" \
    "ap-inspect --config: an error, exit 1"
run_status 1 "$work/unknown.json" -- "$inspect" --config "$work/unknown.yaml" --json
"$python" - "$work/unknown.json" <<'PY' || fail "ap-inspect --json config error"
import json, sys
config = json.load(open(sys.argv[1]))["config"]
assert "none of the backends [no_such_a, no_such_b] is loaded" in config["error"], config
PY

# --- hostile text from plugins reaches no output raw ---------------------------------------------
run_status 0 "$work/hostile.txt" -- "$inspect" --plugin-dir "$hostile"
expect_no_control "$work/hostile.txt"
expect_line "$work/hostile.txt" "backend name 'evil\\\\n\\\\x1b\[31mname\\\\x07' is not of the form" \
    "ap-inspect: the control bytes of a name shown escaped"
expect_line "$work/hostile.txt" 'is 10240 bytes long, more than the 64 allowed' "ap-inspect: a 10 KB name refused"
run_status 0 "$work/hostile.json" -- "$inspect" --plugin-dir "$hostile" --json
expect_no_control "$work/hostile.json"
"$python" -m json.tool "$work/hostile.json" >/dev/null || fail "ap-inspect --json with hostile plugins"
rule_config "$work/hostile.yaml" 'ctrl_messages, cpu_ref' 'page_size: 8'
run_status 0 "$work/hostile_engine.txt" -- "$engine" --config "$work/hostile.yaml" \
    --plugin-dir "$hostile" "${llama[@]}" "${small[@]}"
expect_no_control "$work/hostile_engine.txt"
expect_line "$work/hostile_engine.txt" '^      - \\x1b\[31mforged: all good\\x1b\[0m\\x07\\r\\x1b\[2J$' \
    "engine: a refusal's ESC, BEL and CR shown escaped"
rule_config "$work/hostile_create.yaml" 'ctrl_messages, cpu_ref'
run_status 0 "$work/hostile_walk.txt" -- "$inspect" --plugin-dir "$hostile" \
    --config "$work/hostile_create.yaml" "${llama[@]}"
expect_no_control "$work/hostile_walk.txt"
expect_line "$work/hostile_walk.txt" "create failed: create: bad; \\\\x1b\\[31mforged: all good" \
    "ap-inspect: a create message's ESC shown escaped, its lines joined"

# File names are text from outside too: a plugin file and a FIFO named with ESC, BEL and a
# newline show escaped in the listing and in the AP_DEBUG=load lines.
odd_dir=$work/odd
mkdir "$odd_dir"
cp "$broken/good.so" "$odd_dir/$(printf 'odd\033[31m\nforged.so')"
mkfifo "$odd_dir/$(printf 'fifo\033]0;title\a.so')"
AP_DEBUG=load run_status 0 "$work/odd.txt" -- "$inspect" --plugin-dir "$odd_dir"
expect_no_control "$work/odd.txt"
expect_no_line "$work/odd.txt" '^forged\.so' "a newline in a file name forges no line"
expect_line "$work/odd.txt" '^  loaded   .*/odd\\x1b\[31m\\nforged\.so -> good$' "the odd file listed escaped"
expect_line "$work/odd.txt" '^attnplug\[load\]: skipped \[.*/fifo\\x1b\]0;title\\x07\.so\]: a FIFO, not a regular file$' \
    "the FIFO's record and log line escaped"

# --- out of memory says what failed to allocate ------------------------------------------------------
# 16 GiB of KV cache per layer in host memory (cpu_ref, also where a GPU is) against a 4 GiB
# address space (ASan builds: its own allocation cap instead).
rule_config "$work/cpu.yaml" cpu_ref
if ldd "$engine" | grep -q libasan; then
    export ASAN_OPTIONS="${ASAN_OPTIONS:-}:allocator_may_return_null=1:max_allocation_size_mb=4096"
    limit=unlimited
else
    limit=4000000
fi
(ulimit -v "$limit" && exec "$engine" --config "$work/cpu.yaml" "${llama[@]}" --steps 1 --layers 1 --batch 512 \
    --prompt-len 8192) >"$work/oom.txt" 2>&1 && fail "the engine ran a 16 GiB cache in 4 GiB"
expect_line "$work/oom.txt" '^  error: allocating: AP_ERR_OUT_OF_MEMORY: out of memory for the KV cache of layer 0 \([0-9]+ pages\): [0-9]+\.[0-9] MiB$' \
    "out of memory names what it was allocating"

# --- progress shows in a file as it happens ------------------------------------------------------
# A long prefill on cpu_ref (minutes); the lines before it must be in the file at once.
"$engine" --config "$work/cpu.yaml" "${llama[@]}" --layers 2 --batch 4 --prompt-len 4096 --steps 10 \
    >"$work/progress.txt" 2>&1 &
engine_pid=$!
for _ in $(seq 100); do
    grep -q '^  batch: 4 sequences' "$work/progress.txt" && break
    sleep 0.1
done
kill "$engine_pid" 2>/dev/null || true
wait "$engine_pid" 2>/dev/null || true
engine_pid=
expect_line "$work/progress.txt" '^  batch: 4 sequences' "stdout is line-buffered when not a terminal"
echo "ok: hardening"
