# test_lib.sh: helpers shared by the engine suite's shell tests (sourced, not run).
fail() {
    echo "FAIL: $*" >&2
    exit 1
}

# expect_line FILE REGEX WHAT: FILE has a line matching the extended regex.
expect_line() {
    grep -Eq -- "$2" "$1" || { echo "--- $1:" >&2; cat "$1" >&2; fail "$3 (no line matching: $2)"; }
}

# expect_no_line FILE REGEX WHAT
expect_no_line() {
    if grep -Eq -- "$2" "$1"; then echo "--- $1:" >&2; cat "$1" >&2; fail "$3 (a line matches: $2)"; fi
}

# run_status EXPECTED OUT -- COMMAND...: run COMMAND, stdout+stderr into OUT, check exit status.
run_status() {
    local expected=$1 out=$2
    shift 3
    local status=0
    "$@" >"$out" 2>&1 || status=$?
    if [ "$status" != "$expected" ]; then
        echo "--- output of: $*" >&2
        cat "$out" >&2
        fail "exit status $status, expected $expected: $*"
    fi
}

# abspath PATH: PATH made absolute (meson passes build-tree paths relative to the workdir).
abspath() {
    case $1 in
        /*) printf '%s\n' "$1" ;;
        *) printf '%s/%s\n' "$(pwd)" "$1" ;;
    esac
}
