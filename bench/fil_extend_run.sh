#!/bin/bash
# fil_extend_run.sh: on the GPU machine, check and time flashinfer_like's extend kernel in one go.
# Usage: bench/fil_extend_run.sh [binary]   (build it with bench/fil_extend_build.sh; logs in $OUT)
set -o pipefail
OUT=${OUT:-/tmp/fil_extend_out}
BIN=${1:-build-d2/fil_extend_check}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
cuobjdump -sass "$BIN" >/tmp/fil_extend_sass.txt 2>&1
echo "sass: HMMA $(grep -c HMMA /tmp/fil_extend_sass.txt) LDSM $(grep -c LDSM /tmp/fil_extend_sass.txt) LDL/STL $(grep -c 'LDL\|STL' /tmp/fil_extend_sass.txt)"
"$BIN" test 2>&1 | tee "$OUT/test.log"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" small >"$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; tail -n 3 "$OUT/memcheck.log"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN" tiny >"$OUT/racecheck.log" 2>&1
echo "racecheck rc $?"; tail -n 3 "$OUT/racecheck.log"
timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN" tiny 2 >"$OUT/racecheck2.log" 2>&1
echo "racecheck variant 2 rc $?"; tail -n 3 "$OUT/racecheck2.log"
"$BIN" bench 2>&1 | tee "$OUT/bench.log"
PYTHONUNBUFFERED=1 timeout 150 python3 bench/fil_extend_torch.py 2>&1 | tee "$OUT/torch.log"
