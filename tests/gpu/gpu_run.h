/* gpu_run.h: what the case runners of gpu-harness share: one case's buffers and instances. */
#ifndef AP_GPU_RUN_H
#define AP_GPU_RUN_H

#include "gpu_case_run.h"
#include "gpu_check.h"
#include "gpu_mem.h"
#include "paged_layout.h"

/* Poisoned bytes past each output: a write past its end shows there. */
#define GPU_GUARD_BYTES 256

/* Everything one case allocates. Host halves of the gpu_bufs hold the inputs, then (after the
 * run) what the backend under test wrote; cpu_ref works on the *_ref blocks. */
typedef struct gpu_run {
    const gpu_case *c;
    gpu_layout layout;
    ap_model model;
    float k_scale, v_scale;
    size_t slot_elems; /* kv heads * head dim: the elements of one token in K (or V) */
    int64_t num_slots; /* pool pages * page size */
    size_t q_count, kv_count, out_count, lse_count;
    gpu_buf q, k, v, k_cache, v_cache, out, lse, ints;
    uint8_t *k_ref, *v_ref, *is_new;
    void *out_ref, *out_first; /* out_first, lse_first: the backend's first of two runs */
    float *lse_ref, *lse_first;
    size_t replay_differ; /* elements of out and lse that differ between the two runs */
    ap_instance *under_test, *ref;
    int lse_on; /* 1: the backend under test declares AP_FEATURE_LSE */
    double backend_ms, ref_ms;
} gpu_run;

/* Parse the batch, draw scales, check and open both backends, allocate and fill the inputs
 * (backend copies uploaded, outputs poisoned). GPU_SKIP when the backend refuses the case;
 * GPU_FAIL (with its line printed) on any error. Free with gpu_run_free in every case. */
gpu_outcome gpu_run_setup(const gpu_ctx *ctx, const gpu_case *c, uint64_t *rng, gpu_run *run);
void gpu_run_free(gpu_run *run);

double gpu_now_ms(void);

/* Append " [reason]" to a failure note; `fmt` takes one size_t. */
void gpu_note(char *note, size_t size, const char *fmt, size_t value);
void gpu_note_text(char *note, size_t size, const char *text);

/* The attention check (gpu_case_run.c) and the append_kv/1 hook check (gpu_append_run.c). */
gpu_outcome gpu_attention_check(const gpu_ctx *ctx, gpu_run *run);
gpu_outcome gpu_append_check(const gpu_ctx *ctx, gpu_run *run);

#endif /* AP_GPU_RUN_H */
