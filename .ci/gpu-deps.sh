# .ci/gpu-deps.sh: sourced on the GPU machine: use the carried .deps/*.deb (see .ci/gpu-run's top).
# gpu_deps_use unpacks them under /tmp/deps (never into /) and points pkg-config, the compiler and
# the loader there; it returns 1, having changed nothing, when no .deps/*.deb was carried.
gpu_deps_use() {
    ls .deps/*.deb >/dev/null 2>&1 || return 1
    mkdir -p /tmp/deps
    local deb
    for deb in .deps/*.deb; do dpkg -x "$deb" /tmp/deps; done
    export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/deps/usr/share/pkgconfig
    export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
    export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export CPATH=/tmp/deps/usr/include${CPATH:+:$CPATH}
}

# fi_bench DIR SECONDS ARGS...: FlashInfer's benchmark from the carried FlashInfer folder DIR
# (DIR/whl/*.whl, DIR/fi_bench.py; ../shared/peers/flashinfer/README.md): the wheels installed
# under /tmp/fisite, then fi_bench.py ARGS under a time limit of SECONDS. CPATH (set by
# gpu_deps_use) is dropped for it: it would put DLPack 0.6's header before the one tvm_ffi ships,
# and FlashInfer's JIT build fails on that.
fi_bench() {
    local dir=$1 secs=$2
    shift 2
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/fisite "$dir"/whl/*.whl || return $?
    env -u CPATH PATH="$(dirname "$(which python3)"):$PATH" PYTHONPATH=/tmp/fisite \
        PYTHONUNBUFFERED=1 timeout "$secs" python3 "$dir/fi_bench.py" "$@"
}
