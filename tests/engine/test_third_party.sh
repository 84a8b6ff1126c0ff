#!/usr/bin/env bash
# test_third_party.sh: install attnplug into a DESTDIR, build the third-party plugin from a copy
# of its files with only the installed pkg-config file, and run the installed tools with it.
# usage: test_third_party.sh MESON BUILD_ROOT PLUGIN_SOURCE_DIR PREFIX LIBDIR
set -eu
. "$(dirname "$0")/test_lib.sh"
meson=$1
build=$(abspath "$2")
plugin_src=$(abspath "$3")
prefix=$4
libdir=$5
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v pkg-config >/dev/null || fail "pkg-config is needed to build the plugin out of tree"

dest=$work/dest
run_status 0 "$work/install.txt" -- "$meson" install -C "$build" --destdir "$dest" --no-rebuild
case $libdir in
    /*) lib=$dest$libdir ;;
    *) lib=$dest$prefix/$libdir ;;
esac
bin=$dest$prefix/bin
[ -x "$bin/ap-inspect" ] && [ -x "$bin/attnplug-engine" ] || fail "tools not installed in $bin"
[ -f "$lib/pkgconfig/attnplug-plugin.pc" ] || fail "attnplug-plugin.pc not installed in $lib"
ls "$lib"/attnplug/*.so >/dev/null 2>&1 || fail "no plugin installed in $lib/attnplug"

# Build from a copy outside the tree: nothing but the installed header can be reached.
cp "$plugin_src/example_naive.c" "$plugin_src/meson.build" "$work/"
mkdir "$work/src" && mv "$work/example_naive.c" "$work/meson.build" "$work/src/"
export PKG_CONFIG_PATH=$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$dest
run_status 0 "$work/setup.txt" -- "$meson" setup "$work/plugin" "$work/src"
run_status 0 "$work/compile.txt" -- "$meson" compile -C "$work/plugin"
so=$work/plugin/ap_example_naive.so
[ -f "$so" ] || fail "the plugin was not built"
expect_line "$work/plugin/compile_commands.json" "-I$dest$prefix/include/attnplug" \
    "the plugin compiles against the installed header"
tree_root=$(cd "$plugin_src/../.." && pwd)
expect_no_line "$work/plugin/compile_commands.json" "$tree_root" "the plugin never sees the tree"
if command -v nm >/dev/null; then
    nm -D --defined-only "$so" | awk '$2 == "T" { print $3 }' >"$work/exports.txt"
    [ "$(cat "$work/exports.txt")" = ap_plugin_negotiate ] ||
        fail "the plugin exports more than its entry: $(tr '\n' ' ' <"$work/exports.txt")"
fi

# ap-inspect (installed) finds it with --plugin-dir and lists what it can do.
run_status 0 "$work/inspect.txt" -- "$bin/ap-inspect" --plugin-dir "$work/plugin" \
    --plugin-dir "$lib/attnplug"
expect_line "$work/inspect.txt" "^  loaded   $so -> example_naive\$" "the plugin file was loaded"
expect_line "$work/inspect.txt" '^example_naive 1\.0\.0: ' "example_naive listed"
run_status 0 "$work/naive.json" -- "$bin/ap-inspect" --plugin-dir "$work/plugin" --json example_naive
python3 - "$work/naive.json" <<'PY' || fail "ap-inspect --json example_naive"
import json, sys
doc = json.load(open(sys.argv[1]))
(naive,) = doc["backends"]
assert naive["name"] == "example_naive" and naive["kv_dtypes"] == ["bf16"], naive
assert naive["q_dtypes"] == ["f32", "bf16"] and naive["verdicts"][0]["usable"] is True, naive
PY

# The installed engine, with a config that names it explicitly and finds it through the
# config's own plugin_path (relative to the config's folder).
mkdir "$work/cfg"
printf 'version: 1\nplugin_path: ["../plugin"]\nrules:\n  - match: "*Llama-3*"\n    backend: example_naive\n' \
    >"$work/cfg/naive.yaml"
run_status 0 "$work/engine.txt" -- "$bin/attnplug-engine" --config "$work/cfg/naive.yaml" \
    --plugin-dir "$lib/attnplug" --steps 2 --layers 2 --batch 3 --prompt-len 20 --seed 11
expect_line "$work/engine.txt" '^  candidate example_naive: usable <- chosen$' "the config chose it"
expect_line "$work/engine.txt" '^  decode: 2 steps, [0-9.]+ ms/step mean, [1-9][0-9]* tokens/s$' "it decoded"
expect_line "$work/engine.txt" '^  check vs cpu_ref \(layer 1, prefill, 3 sequences\): rel L2 error [0-9]\.[0-9]{3}e-[0-9]+ \(limit 1e-02\): ok$' \
    "its prefill agrees with cpu_ref"
expect_line "$work/engine.txt" '^  check vs cpu_ref \(layer 1, last decode step, 3 sequences\): rel L2 error [0-9]\.[0-9]{3}e-[0-9]+ \(limit 1e-02\): ok$' \
    "its output agrees with cpu_ref"
expect_line "$work/engine.txt" '^  result: meta-llama/Llama-3-8B served by example_naive$' "it served"

# The same plugin with a wrong softmax scale: the engine's check must catch it and exit 1.
mkdir "$work/broken-src"
sed 's/scores\[p\] = dot \* layer->sm_scale;/scores[p] = dot * layer->sm_scale * 1.25f;/' \
    "$work/src/example_naive.c" >"$work/broken-src/example_naive.c"
cmp -s "$work/src/example_naive.c" "$work/broken-src/example_naive.c" && fail "the fault was not injected"
cp "$work/src/meson.build" "$work/broken-src/"
run_status 0 "$work/setup2.txt" -- "$meson" setup "$work/broken" "$work/broken-src"
run_status 0 "$work/compile2.txt" -- "$meson" compile -C "$work/broken"
run_status 1 "$work/broken.txt" -- "$bin/attnplug-engine" --config "$work/cfg/naive.yaml" \
    --plugin-dir "$work/broken" --plugin-dir "$lib/attnplug" --steps 1 --layers 1 --batch 2 \
    --prompt-len 16 --seed 11
expect_line "$work/broken.txt" 'check vs cpu_ref .*: FAIL$' "a wrong kernel fails the check"
expect_line "$work/broken.txt" '^engine: 0 models ran, 0 had no backend that can serve them here, 1 failed$' \
    "and counts as a failure"

# The installed engine finds the installed config beside itself.
(cd "$work" && run_status 0 "$work/installed.txt" -- "$bin/attnplug-engine" \
    --plugin-dir "$lib/attnplug" --steps 1 --layers 1 --batch 2 --prompt-len 8)
expect_line "$work/installed.txt" '^attnplug-engine: config .*/share/attnplug/configs/models\.yaml,' \
    "the installed config"
echo "ok: third-party plugin built out of tree, loaded, served and checked"
