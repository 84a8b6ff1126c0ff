#!/usr/bin/env bash
# .ci/deps.sh: install the Debian/Ubuntu packages attnplug needs, only those missing.
# Run it (`bash .ci/deps.sh [--ci]`) or source it and call ap_deps_install PACKAGE...
# Root needs no sudo; otherwise sudo is used (non-interactive when stdin is not a terminal).

# What building and running the engine needs on a bare machine, and what CI adds (the format
# check, the test log reader, the fuzz build, the Python binding and its tests).
AP_BUILD_PACKAGES=(gcc libc6-dev meson ninja-build pkg-config libyaml-dev libcmocka-dev libdlpack-dev)
AP_CI_PACKAGES=(clang-format python3 clang python3-dev python3-numpy python3-pytest python3-venv)

# ap_deps_install PACKAGE...: install the packages not installed yet; 1 when that fails.
ap_deps_install() {
    local missing=() package
    for package in "$@"; do
        # "install ok installed" only: a removed package leaves a status entry behind.
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
            missing+=("$package")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "installing: ${missing[*]}" >&2
    local as_root=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null || { echo "not root and no sudo: install ${missing[*]}" >&2; return 1; }
        if [ -t 0 ]; then as_root=(sudo); else as_root=(sudo -n); fi
    fi
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update </dev/null ||
        { echo "apt-get update failed" >&2; return 1; }
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y --no-install-recommends "${missing[@]}" </dev/null ||
        { echo "apt-get install failed" >&2; return 1; }
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    set -u
    if [ "${1:-}" = --ci ]; then
        ap_deps_install "${AP_BUILD_PACKAGES[@]}" "${AP_CI_PACKAGES[@]}"
    else
        ap_deps_install "${AP_BUILD_PACKAGES[@]}"
    fi
fi
