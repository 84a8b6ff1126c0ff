#!/bin/bash
# fil_extend_build.sh: build bench/fil_extend_check with the benchmark-only kernel variants
# (bench/fil_extend_variants.cu wraps the plugin's extend_kernel.cu).
# Usage: bench/fil_extend_build.sh [output]   (default build-d2/fil_extend_check, from the repo root)
set -e
OUTBIN=${1:-build-d2/fil_extend_check}
mkdir -p "$(dirname "$OUTBIN")"
nvcc -std=c++17 -O3 -Werror=all-warnings --expt-relaxed-constexpr -DFIL_EXTEND_VARIANTS \
    -gencode=arch=compute_90a,code=sm_90a -I. -o "$OUTBIN" bench/fil_extend_check.cu \
    bench/fil_extend_variants.cu backends/flashinfer_like/extend_plan.cu
