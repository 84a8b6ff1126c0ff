#!/bin/bash
# fil_extend_build.sh: build bench/fil_extend_check with the benchmark-only kernel variants
# (bench/fil_extend_variants.cu wraps the plugin's extend_kernel.cu) through meson, in $B
# (default build-bench), and copy it to the output.
# Usage: bench/fil_extend_build.sh [output]   (default build-d2/fil_extend_check, from the repo root)
set -e
OUTBIN=${1:-build-d2/fil_extend_check}
B=${B:-build-bench}
[ -f "$B/build.ninja" ] || meson setup "$B" -Dcuda=enabled >/dev/null
ninja -C "$B" bench/fil_extend_check
mkdir -p "$(dirname "$OUTBIN")"
cp "$B/bench/fil_extend_check" "$OUTBIN"
