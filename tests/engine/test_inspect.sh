#!/usr/bin/env bash
# test_inspect.sh: ap-inspect's listing, one backend, --json, config validation and selection walks.
# usage: test_inspect.sh AP_INSPECT PYTHON3 MODELS_YAML
set -eu
. "$(dirname "$0")/test_lib.sh"
inspect=$(abspath "$1")
python=$2
config=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The listing: ABI, device, files and cpu_ref with its capabilities and its verdict here.
run_status 0 "$work/all.txt" -- "$inspect"
out=$work/all.txt
expect_line "$out" '^attnplug core ABI 1\.1$' "core ABI version"
expect_line "$out" '^Device: ' "device line"
expect_line "$out" '^  loaded   /.*/ap_cpu_ref\.so -> cpu_ref$' "cpu_ref's file loaded"
expect_line "$out" '^cpu_ref [0-9]+\.[0-9]+\.[0-9]+: ' "cpu_ref's header"
expect_line "$out" '^  attention:    mha, mla$' "cpu_ref serves MHA and MLA"
expect_line "$out" '^  kv dtypes:    .*bf16' "cpu_ref's KV dtypes"
expect_line "$out" '^  page sizes:   any$' "cpu_ref takes any page size"
expect_line "$out" '^  phases:       extend, decode$' "cpu_ref's phases"
expect_line "$out" '^  hooks:        append_kv/1, pack_prefix_chunk_kv/1, merge_state/1$' "cpu_ref's hooks"
expect_line "$out" '^  here:         USABLE for meta-llama/Llama-3-8B \(mha 32q/8kv heads, d128/128, bf16' \
    "cpu_ref's verdict names the model it used"

# One backend; an unknown one; bad usage.
run_status 0 "$work/one.txt" -- "$inspect" cpu_ref
expect_line "$work/one.txt" '^cpu_ref ' "ap-inspect cpu_ref shows it"
expect_no_line "$work/one.txt" '^Plugin files' "ap-inspect cpu_ref shows only it"
run_status 1 "$work/none.txt" -- "$inspect" no_such_backend
expect_line "$work/none.txt" "no backend named 'no_such_backend'" "unknown backend named"
run_status 2 "$work/usage.txt" -- "$inspect" --no-such-option
run_status 2 "$work/usage2.txt" -- "$inspect" --model x

# --json parses, and says the same things.
run_status 0 "$work/all.json" -- "$inspect" --json
"$python" -m json.tool "$work/all.json" >/dev/null || fail "ap-inspect --json is not JSON"
"$python" - "$work/all.json" <<'PY' || fail "ap-inspect --json content"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["core_abi"] == "1.1", doc["core_abi"]
ref = [b for b in doc["backends"] if b["name"] == "cpu_ref"]
assert len(ref) == 1, [b["name"] for b in doc["backends"]]
ref = ref[0]
assert ref["attention"] == ["mha", "mla"], ref["attention"]
assert ref["page_sizes"] == "any" and ref["head_dims"] == "any"
assert "bf16" in ref["kv_dtypes"] and ref["phases"] == ["extend", "decode"]
assert ref["hooks"] == ["append_kv/1", "pack_prefix_chunk_kv/1", "merge_state/1"], ref["hooks"]
assert ref["verdicts"][0]["model"] == "meta-llama/Llama-3-8B" and ref["verdicts"][0]["usable"] is True
files = [f for f in doc["plugin_files"] if f["backend"] == "cpu_ref"]
assert files and files[0]["loaded"] is True and files[0]["status"] == "AP_OK"
assert isinstance(doc["device"]["gpu_usable"], bool)
PY

# --config: the shipped config validates and lists its rules.
run_status 0 "$work/cfg.txt" -- "$inspect" --config "$config"
expect_line "$work/cfg.txt" '^Config .*models\.yaml: valid \(version 1, [0-9]+ rules\)$' "config valid"
expect_line "$work/cfg.txt" '^  1\. \S+  \(line [0-9]+\)$' "rule 1 listed with its line"
expect_line "$work/cfg.txt" '^       backends: .*cpu_ref' "a rule's backends listed"

# Walks that succeed (MLA too: cpu_ref serves it where trtllm_mla does not); a shape from
# --model-spec that cpu_ref refuses for a stated reason.
run_status 0 "$work/walk.txt" -- "$inspect" --config "$config" --model meta-llama/Llama-3-8B
expect_line "$work/walk.txt" '^Selection for meta-llama/Llama-3-8B \(built-in example model\)$' "walk header"
expect_line "$work/walk.txt" '^Chosen: [a-z0-9_]+$' "walk chooses a backend"
expect_line "$work/walk.txt" '^  [0-9]+\. [a-z0-9_]+ +USABLE  <- chosen$' "the chosen candidate is marked"
run_status 0 "$work/mla.txt" -- "$inspect" --config "$config" --model deepseek-ai/DeepSeek-V3
expect_line "$work/mla.txt" '^Chosen: (trtllm_mla|cpu_ref)$' "an MLA backend serves DeepSeek-V3"
expect_line "$work/mla.txt" '^  [0-9]+\. cpu_ref +USABLE' "cpu_ref serves MLA"
run_status 1 "$work/spec.txt" -- "$inspect" --config "$config" --model my/model \
    --model-spec qo_heads=8,kv_heads=3
expect_line "$work/spec.txt" 'cpu_ref.*REFUSED' "cpu_ref refuses 8 query heads over 3 KV heads"
expect_line "$work/spec.txt" '(divide|multiple)' "the reason says why"
run_status 1 "$work/badspec.txt" -- "$inspect" --config "$config" --model my/model --model-spec qo_heads=x
expect_line "$work/badspec.txt" "bad value 'x' for model-spec key 'qo_heads'" "a bad spec is named"
run_status 0 "$work/walk.json" -- "$inspect" --config "$config" --model meta-llama/Llama-3-8B --json
"$python" - "$work/walk.json" <<'PY' || fail "walk --json content"
import json, sys
doc = json.load(open(sys.argv[1]))
sel = doc["selection"]
chosen = [c for c in sel["candidates"] if c["chosen"]]
assert len(chosen) == 1 and chosen[0]["backend"] == sel["chosen"], sel
assert doc["config"]["valid"] is True and len(doc["config"]["rules"]) >= 3
PY

# A broken config: exit 1 with file:line:column, in text and JSON; JSON escapes a path holding
# a quote, a backslash and a tab.
bad="$work/we\"ird\\	name.yaml"
printf 'version: 1\nrules:\n  - match: "*"\n    backends: [cpu_ref]\n    options: {page_sise: 16}\n' >"$bad"
run_status 1 "$work/bad.txt" -- "$inspect" --config "$bad"
expect_line "$work/bad.txt" 'name\.yaml:5:[0-9]+: .*page_sise' "parse error with file:line:column"
run_status 1 "$work/bad.json" -- "$inspect" --config "$bad" --json
"$python" - "$work/bad.json" "$bad" <<'PY' || fail "invalid-config JSON"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["config"]["valid"] is False and doc["config"]["path"] == sys.argv[2], doc
assert ":5:" in doc["config"]["error"], doc["config"]["error"]
PY
# A path that is not UTF-8 still gives valid JSON (the byte becomes U+FFFD).
odd="$work/odd-$(printf '\377')-name.yaml"
cp "$bad" "$odd"
run_status 1 "$work/odd.json" -- "$inspect" --config "$odd" --json
"$python" - "$work/odd.json" <<'PY' || fail "non-UTF-8 path in JSON"
import json, sys
doc = json.load(open(sys.argv[1], encoding="utf-8"))
assert doc["config"]["path"].endswith("odd-\ufffd-name.yaml"), doc["config"]["path"]
PY
echo "ok: ap-inspect"
