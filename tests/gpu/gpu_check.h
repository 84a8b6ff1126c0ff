/* gpu_check.h: the comparisons of the GPU tests: relative L2 error, poison and cache bytes. */
#ifndef AP_GPU_CHECK_H
#define AP_GPU_CHECK_H

#include "plugin_api.h"

/* The byte every output is filled with before a run: all-ones bits are a NaN in bf16, fp16,
 * fp32 and fp8 e4m3, so an element nobody wrote is both counted and poisons any use of it. */
#define GPU_POISON_BYTE 0xff

/* One element of `dtype` at index `i` of `data`, as float (exact for every supported dtype). */
float gpu_elem_load(ap_dtype dtype, const void *data, size_t i);
/* Store `value` rounded to nearest even into element `i` (fp8 saturates to its largest). */
void gpu_elem_store(ap_dtype dtype, void *data, size_t i, float value);

/* How a result compares with the reference. */
typedef struct gpu_diff {
    double rel_l2;     /* ||got - ref|| / ||ref|| over the finite pairs */
    double row_rel_l2; /* the largest of the same per row: a few wrong rows (one sequence,
                          one page boundary) drown in the global figure */
    size_t unwritten;  /* elements of `got` still holding the poison bits */
    size_t nonfinite;  /* NaN or inf elements of `got` (unwritten ones included) */
    size_t ref_bad;    /* NaN, inf or poison in the reference: the oracle failed */
} gpu_diff;

/* Compare `count` elements, as rows of `row_len` (count % row_len == 0). */
gpu_diff gpu_compare(ap_dtype dtype, const void *got, const void *ref, size_t count,
                     size_t row_len);

/* 1 when all `bytes` bytes at `data` still hold GPU_POISON_BYTE (the guard past an output). */
int gpu_guard_intact(const void *data, size_t bytes);

/* Bytes of two KV caches compared element by element, slot by slot. */
typedef struct gpu_cache_diff {
    size_t new_exact;    /* elements of written (new-token) slots with equal bits */
    size_t new_one_ulp;  /* ... differing by one unit in the last place (or +0 vs -0) */
    size_t new_far;      /* ... differing by more */
    size_t other_differ; /* elements of slots nobody should write that differ in any bit */
} gpu_cache_diff;

/* Compare caches of `num_slots` slots of `slot_elems` elements; is_new[slot] is 1 where the
 * forward wrote a new token. Adds into `diff`. */
void gpu_cache_compare(ap_dtype dtype, const void *got, const void *ref, int64_t num_slots,
                       size_t slot_elems, const uint8_t *is_new, gpu_cache_diff *diff);

#endif /* AP_GPU_CHECK_H */
