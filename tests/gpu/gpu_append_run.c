/* gpu_append_run.c: the append_kv/1 check: RoPE + quantize + paged write against cpu_ref's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_run.h"

#define GPU_ROPE_BASE 10000.0

/* What an append adds to a case: rotated queries, the slots and the cos/sin table. */
typedef struct gpu_append {
    gpu_buf q_out, out_loc, cos_sin;
    void *q_out_ref;
    uint8_t *all_rows; /* 1 per token: every q_out row is written */
    int32_t max_position;
} gpu_append;

/* cos_sin[p][i] = cos(p * f_i), cos_sin[p][rd/2 + i] = sin(p * f_i), f_i = base^(-2i/rd). */
static void gpu_fill_cos_sin(float *table, int32_t rows, int32_t rotary_dim) {
    int32_t half = rotary_dim / 2;
    for (int32_t p = 0; p < rows; p++) {
        for (int32_t i = 0; i < half; i++) {
            double angle = p * pow(GPU_ROPE_BASE, -2.0 * i / rotary_dim);
            table[(size_t)p * rotary_dim + i] = (float)cos(angle);
            table[(size_t)p * rotary_dim + half + i] = (float)sin(angle);
        }
    }
}

static ap_status gpu_append_prepare(const gpu_run *run, int on_device, gpu_append *a) {
    const gpu_layout *l = &run->layout;
    const int32_t *qo_indptr = l->ints + l->off_qo_indptr;
    const int32_t *positions = l->ints + l->off_positions;
    int32_t tokens = l->num_tokens, rotary_dim = run->c->rotary_dim;
    ap_status st;
    a->max_position = l->max_seq_len;
    if ((st = gpu_buf_alloc(&a->q_out, run->q.bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&a->out_loc, (size_t)tokens * 4, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&a->cos_sin, (size_t)a->max_position * rotary_dim * 4, on_device)) !=
            AP_OK)
        return st;
    a->q_out_ref = malloc(run->q.bytes);
    a->all_rows = malloc((size_t)tokens);
    if (a->q_out_ref == NULL || a->all_rows == NULL) return AP_ERR_OUT_OF_MEMORY;
    memset(a->q_out_ref, GPU_POISON_BYTE, run->q.bytes);
    memset(a->all_rows, 1, (size_t)tokens);
    for (int32_t s = 0; s < l->num_seqs; s++)
        for (int32_t t = qo_indptr[s]; t < qo_indptr[s + 1]; t++)
            ((int32_t *)a->out_loc.host)[t] = (int32_t)gpu_layout_slot(l, s, positions[t]);
    gpu_fill_cos_sin(a->cos_sin.host, a->max_position, rotary_dim);
    if ((st = gpu_buf_upload(&a->out_loc)) != AP_OK || (st = gpu_buf_upload(&a->cos_sin)) != AP_OK)
        return st;
    return gpu_buf_fill_target(&a->q_out, GPU_POISON_BYTE);
}

static void gpu_append_free(gpu_append *a) {
    gpu_buf_free(&a->q_out);
    gpu_buf_free(&a->out_loc);
    gpu_buf_free(&a->cos_sin);
    free(a->q_out_ref);
    free(a->all_rows);
}

/* One append_kv/1 call on one side's memory: `target` 1 for the backend under test's copies. */
static ap_status gpu_append_call(const gpu_run *run, const gpu_append *a, ap_instance *instance,
                                 int target, int on_device, void *stream) {
    const gpu_case *c = run->c;
    int64_t tokens = run->layout.num_tokens;
    const int32_t *ints = target ? run->ints.target : run->ints.host;
    ap_kv_cache kv;
    gpu_layout_kv_cache(&run->layout, c->kv_dtype, c->num_kv_heads, c->head_dim,
                        target ? run->k_cache.target : run->k_ref,
                        target ? run->v_cache.target : run->v_ref, &kv);
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = 1.0f / sqrtf((float)c->head_dim),
                      .k_scale = run->k_scale,
                      .v_scale = run->v_scale,
                      .window_left = -1,
                      .kv = &kv};
    gpu_tensor q, q_out, k, v, positions, out_loc, cos_sin;
    gpu_tensor_make(&q, target ? run->q.target : run->q.host, c->q_dtype, on_device, 3, tokens,
                    c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&q_out, target ? a->q_out.target : a->q_out_ref, c->q_dtype, on_device, 3,
                    tokens, c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&k, target ? run->k.target : run->k.host, c->q_dtype, on_device, 3, tokens,
                    c->num_kv_heads, c->head_dim);
    gpu_tensor_make(&v, target ? run->v.target : run->v.host, c->q_dtype, on_device, 3, tokens,
                    c->num_kv_heads, c->head_dim);
    gpu_tensor_make_i32(&positions, (void *)(ints + run->layout.off_positions), on_device, tokens);
    gpu_tensor_make_i32(&out_loc, target ? a->out_loc.target : a->out_loc.host, on_device, tokens);
    gpu_tensor_make(&cos_sin, target ? a->cos_sin.target : a->cos_sin.host, AP_DTYPE_F32, on_device,
                    2, a->max_position, c->rotary_dim, 0);
    ap_append_kv_args args = {
        .struct_size = sizeof args,
        .q = &q.dl,
        .q_out = &q_out.dl,
        .k = &k.dl,
        .v = &v.dl,
        .positions = &positions.dl,
        .out_loc = &out_loc.dl,
        .cos_sin = &cos_sin.dl,
        .rotary_dim = c->rotary_dim,
        .is_neox = c->is_neox,
    };
    return ap_instance_append_kv(instance, &layer, &args, stream);
}

/* Both sides append; fetch what the backend wrote. */
static ap_status gpu_append_run_both(const gpu_ctx *ctx, gpu_run *run, gpu_append *a) {
    const char *name = run->c->name;
    double start = gpu_now_ms();
    ap_status st = gpu_append_call(run, a, run->under_test, 1, ctx->on_device, ctx->stream);
    if (st != AP_OK) {
        printf("FAIL  %-44s %s append_kv/1: %s: %s\n", name, ctx->backend, ap_status_name(st),
               ap_last_error());
        return st;
    }
    if (ctx->on_device) {
        GPU_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
        GPU_CHECK(cudaGetLastError());
    }
    run->backend_ms = gpu_now_ms() - start;
    if ((st = gpu_buf_download(&a->q_out)) != AP_OK ||
        (st = gpu_buf_download(&run->k_cache)) != AP_OK ||
        (st = gpu_buf_download(&run->v_cache)) != AP_OK)
        return st;
    start = gpu_now_ms();
    st = gpu_append_call(run, a, run->ref, 0, 0, NULL);
    run->ref_ms = gpu_now_ms() - start;
    if (st != AP_OK)
        printf("FAIL  %-44s cpu_ref append_kv/1: %s: %s\n", name, ap_status_name(st),
               ap_last_error());
    return st;
}

/* Rotated queries and the cache bytes must match cpu_ref's within one ulp (the rotation's fp32
 * arithmetic may round differently), and nothing outside the new slots may change. */
static gpu_outcome gpu_append_judge(const gpu_ctx *ctx, const gpu_run *run, const gpu_append *a) {
    const gpu_case *c = run->c;
    size_t row = (size_t)c->num_qo_heads * (size_t)c->head_dim;
    gpu_cache_diff q_diff = {0}, kv_diff = {0};
    char note[256] = "";
    gpu_cache_compare(c->q_dtype, a->q_out.host, a->q_out_ref, run->layout.num_tokens, row,
                      a->all_rows, &q_diff);
    gpu_cache_compare(c->kv_dtype, run->k_cache.host, run->k_ref, run->num_slots, run->slot_elems,
                      run->is_new, &kv_diff);
    gpu_cache_compare(c->kv_dtype, run->v_cache.host, run->v_ref, run->num_slots, run->slot_elems,
                      run->is_new, &kv_diff);
    gpu_diff q_err = gpu_compare(c->q_dtype, a->q_out.host, a->q_out_ref,
                                 (size_t)run->layout.num_tokens * row, (size_t)c->head_dim);
    if (q_diff.new_far) gpu_note(note, sizeof note, " [q_out: %zu off > 1 ulp]", q_diff.new_far);
    if (kv_diff.new_far)
        gpu_note(note, sizeof note, " [kv: %zu new elements off > 1 ulp]", kv_diff.new_far);
    if (kv_diff.other_differ)
        gpu_note(note, sizeof note, " [kv: %zu elements changed outside new slots]",
                 kv_diff.other_differ);
    if (q_err.unwritten) gpu_note(note, sizeof note, " [%zu q_out unwritten]", q_err.unwritten);
    int pass = note[0] == '\0';
    printf("%s  %-44s q_out %.2e (%zu/%zu/%zu) kv %zu/%zu/%zu  %s %.1f ms  ref %.0f ms%s\n",
           pass ? "PASS" : "FAIL", c->name, q_err.rel_l2, q_diff.new_exact, q_diff.new_one_ulp,
           q_diff.new_far, kv_diff.new_exact, kv_diff.new_one_ulp, kv_diff.new_far, ctx->backend,
           run->backend_ms, run->ref_ms, note);
    return pass ? GPU_PASS : GPU_FAIL;
}

gpu_outcome gpu_append_check(const gpu_ctx *ctx, gpu_run *run) {
    const char *name = run->c->name;
    gpu_append a = {0};
    gpu_outcome outcome = GPU_FAIL;
    if (!ap_instance_has_hook(run->under_test, AP_HOOK_APPEND_KV_V1)) {
        printf("SKIP  %-44s %s: no %s hook\n", name, ctx->backend, AP_HOOK_APPEND_KV_V1);
        return GPU_SKIP;
    }
    if (!ap_instance_has_hook(run->ref, AP_HOOK_APPEND_KV_V1)) {
        printf("FAIL  %-44s cpu_ref has no %s hook to compare with\n", name, AP_HOOK_APPEND_KV_V1);
        return GPU_FAIL;
    }
    if (gpu_append_prepare(run, ctx->on_device, &a) != AP_OK) {
        printf("FAIL  %-44s cannot allocate the append inputs\n", name);
    } else if (gpu_append_run_both(ctx, run, &a) == AP_OK) {
        outcome = gpu_append_judge(ctx, run, &a);
    }
    gpu_append_free(&a);
    return outcome;
}
