/* gpu_check.c: relative L2 error, unwritten-element counts and KV cache byte comparison. */
#include "gpu_check.h"

#include <math.h>
#include <string.h>

#include "backends/numeric/host_numeric.h"

float gpu_elem_load(ap_dtype dtype, const void *data, size_t i) {
    switch (dtype) {
        case AP_DTYPE_F32: return ((const float *)data)[i];
        case AP_DTYPE_BF16: return ap_bf16_to_float(((const uint16_t *)data)[i]);
        case AP_DTYPE_F16: return ap_f16_to_float(((const uint16_t *)data)[i]);
        case AP_DTYPE_FP8_E4M3: return ap_fp8_e4m3_to_float(((const uint8_t *)data)[i]);
        case AP_DTYPE_FP8_E5M2: return ap_fp8_e5m2_to_float(((const uint8_t *)data)[i]);
        default: return NAN;
    }
}

void gpu_elem_store(ap_dtype dtype, void *data, size_t i, float value) {
    switch (dtype) {
        case AP_DTYPE_F32: ((float *)data)[i] = value; break;
        case AP_DTYPE_BF16: ((uint16_t *)data)[i] = ap_float_to_bf16(value); break;
        case AP_DTYPE_F16: ((uint16_t *)data)[i] = ap_float_to_f16(value); break;
        case AP_DTYPE_FP8_E4M3: ((uint8_t *)data)[i] = ap_float_to_fp8_e4m3(value); break;
        case AP_DTYPE_FP8_E5M2: ((uint8_t *)data)[i] = ap_float_to_fp8_e5m2(value); break;
        default: break;
    }
}

/* The raw bits of element i, widened. */
static uint32_t gpu_elem_bits(ap_dtype dtype, const void *data, size_t i) {
    switch (dtype) {
        case AP_DTYPE_F32: return ((const uint32_t *)data)[i];
        case AP_DTYPE_BF16:
        case AP_DTYPE_F16: return ((const uint16_t *)data)[i];
        default: return ((const uint8_t *)data)[i];
    }
}

static uint32_t gpu_poison_bits(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_F32: return 0xffffffffu;
        case AP_DTYPE_BF16:
        case AP_DTYPE_F16: return 0xffffu;
        default: return 0xffu;
    }
}

static double gpu_rel(double err2, double ref2) {
    if (ref2 > 0.0) return sqrt(err2 / ref2);
    return err2 > 0.0 ? INFINITY : 0.0;
}

gpu_diff gpu_compare(ap_dtype dtype, const void *got, const void *ref, size_t count,
                     size_t row_len) {
    gpu_diff diff = {0};
    uint32_t poison = gpu_poison_bits(dtype);
    double err2 = 0.0, ref2 = 0.0, row_err2 = 0.0, row_ref2 = 0.0;
    for (size_t i = 0; i < count; i++) {
        float g = gpu_elem_load(dtype, got, i);
        float r = gpu_elem_load(dtype, ref, i);
        if (gpu_elem_bits(dtype, got, i) == poison) diff.unwritten++;
        if (gpu_elem_bits(dtype, ref, i) == poison || !isfinite(r)) {
            diff.ref_bad++;
        } else if (!isfinite(g)) {
            diff.nonfinite++;
        } else {
            double d = (double)g - r;
            row_err2 += d * d;
            row_ref2 += (double)r * r;
        }
        if ((i + 1) % row_len == 0) {
            double row = gpu_rel(row_err2, row_ref2);
            if (row > diff.row_rel_l2) diff.row_rel_l2 = row;
            err2 += row_err2;
            ref2 += row_ref2;
            row_err2 = row_ref2 = 0.0;
        }
    }
    diff.rel_l2 = gpu_rel(err2, ref2);
    return diff;
}

int gpu_guard_intact(const void *data, size_t bytes) {
    const uint8_t *p = data;
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != GPU_POISON_BYTE) return 0;
    return 1;
}

/* Position of a sign-magnitude code on the number line, so neighbours differ by one. */
static int64_t gpu_code_rank(ap_dtype dtype, uint32_t bits) {
    uint32_t sign = 0x80u;
    if (dtype == AP_DTYPE_F32)
        sign = 0x80000000u;
    else if (dtype == AP_DTYPE_BF16 || dtype == AP_DTYPE_F16)
        sign = 0x8000u;
    int64_t magnitude = (int64_t)(bits & (sign - 1u));
    return (bits & sign) ? -magnitude : magnitude;
}

void gpu_cache_compare(ap_dtype dtype, const void *got, const void *ref, int64_t num_slots,
                       size_t slot_elems, const uint8_t *is_new, gpu_cache_diff *diff) {
    for (int64_t slot = 0; slot < num_slots; slot++) {
        size_t base = (size_t)slot * slot_elems;
        for (size_t e = 0; e < slot_elems; e++) {
            uint32_t g = gpu_elem_bits(dtype, got, base + e);
            uint32_t r = gpu_elem_bits(dtype, ref, base + e);
            if (!is_new[slot]) {
                diff->other_differ += g != r;
                continue;
            }
            if (g == r) {
                diff->new_exact++;
                continue;
            }
            /* a NaN on either side is never "close" */
            int nan = isnan(gpu_elem_load(dtype, got, base + e)) ||
                      isnan(gpu_elem_load(dtype, ref, base + e));
            int64_t distance = gpu_code_rank(dtype, g) - gpu_code_rank(dtype, r);
            if (!nan && distance >= -1 && distance <= 1)
                diff->new_one_ulp++;
            else
                diff->new_far++;
        }
    }
}
