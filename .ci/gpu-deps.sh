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
