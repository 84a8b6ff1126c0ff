/* gpu_case_run.c: the attention check: the backend twice on one plan, cpu_ref, every comparison. */
#include "gpu_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Where one forward call reads and writes: the backend's copies or cpu_ref's blocks. */
typedef struct gpu_side {
    void *q, *k, *v, *k_cache, *v_cache, *out;
    float *lse;
    const int32_t *device_ints; /* NULL: the batch's device arrays are the host mirrors */
    int on_device;
} gpu_side;

/* One forward; `plan` = 1 first runs init_metadata (0 reuses the last plan, as a layer after
 * the first does). */
static ap_status gpu_forward(const gpu_run *run, ap_instance *instance, const gpu_side *side,
                             int save_kv, int plan, void *stream) {
    const gpu_case *c = run->c;
    gpu_tensor q, k, v, out, lse;
    ap_batch batch;
    ap_kv_cache kv;
    gpu_layout_kv_cache(&run->layout, c->kv_dtype, c->num_kv_heads, c->head_dim, side->k_cache,
                        side->v_cache, &kv);
    ap_layer layer = {
        .struct_size = sizeof layer,
        .sm_scale = 1.0f / sqrtf((float)c->head_dim),
        .k_scale = run->k_scale,
        .v_scale = run->v_scale,
        .window_left = -1,
        .kv = &kv,
    };
    int64_t tokens = run->layout.num_tokens;
    gpu_tensor_make(&q, side->q, c->q_dtype, side->on_device, 3, tokens, c->num_qo_heads,
                    c->head_dim);
    gpu_tensor_make(&k, side->k, c->q_dtype, side->on_device, 3, tokens, c->num_kv_heads,
                    c->head_dim);
    gpu_tensor_make(&v, side->v, c->q_dtype, side->on_device, 3, tokens, c->num_kv_heads,
                    c->head_dim);
    gpu_tensor_make(&out, side->out, c->q_dtype, side->on_device, 3, tokens, c->num_qo_heads,
                    c->head_dim);
    gpu_tensor_make(&lse, side->lse, AP_DTYPE_F32, side->on_device, 2, tokens, c->num_qo_heads, 0);
    ap_forward_args args = {
        .struct_size = sizeof args,
        .q = &q.dl,
        .k = save_kv ? &k.dl : NULL,
        .v = save_kv ? &v.dl : NULL,
        .out = &out.dl,
        .lse = side->lse != NULL ? &lse.dl : NULL,
        .save_kv = save_kv,
    };
    gpu_layout_batch(&run->layout, c->mode, side->device_ints, &batch);
    ap_status st = plan ? ap_instance_init_metadata(instance, &batch, stream) : AP_OK;
    if (st != AP_OK) return st;
    if (c->mode == AP_MODE_DECODE)
        return ap_instance_forward_decode(instance, &layer, &args, stream);
    return ap_instance_forward_extend(instance, &layer, &args, stream);
}

/* One forward of the backend under test, waited for, its launch checked, its outputs fetched. */
static ap_status gpu_run_backend_once(const gpu_ctx *ctx, gpu_run *run, const gpu_side *side,
                                      int plan) {
    ap_status st = gpu_forward(run, run->under_test, side, run->c->save_kv, plan, ctx->stream);
    if (st != AP_OK) {
        printf("FAIL  %-44s %s forward: %s: %s\n", run->c->name, ctx->backend, ap_status_name(st),
               ap_last_error());
        return st;
    }
    if (ctx->on_device) {
        GPU_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
        GPU_CHECK(cudaGetLastError());
    }
    if ((st = gpu_buf_download(&run->out)) != AP_OK || (st = gpu_buf_download(&run->lse)) != AP_OK)
        return st;
    return AP_OK;
}

/* Elements of `count` whose bytes differ between two results. */
static size_t gpu_count_differ(const void *a, const void *b, size_t count, size_t elem_bytes) {
    size_t differ = 0;
    for (size_t i = 0; i < count; i++)
        differ += memcmp((const char *)a + i * elem_bytes, (const char *)b + i * elem_bytes,
                         elem_bytes) != 0;
    return differ;
}

/* The backend under test runs twice: planned, then again on the same plan (as every layer after
 * the first does) into re-poisoned outputs. The two results must be equal bit for bit: a
 * difference is a race, a read of unwritten memory or a plan the forward call mutated. */
static ap_status gpu_run_backend(const gpu_ctx *ctx, gpu_run *run) {
    gpu_side side = {
        .q = run->q.target,
        .k = run->k.target,
        .v = run->v.target,
        .k_cache = run->k_cache.target,
        .v_cache = run->v_cache.target,
        .out = run->out.target,
        .lse = run->lse_on ? run->lse.target : NULL,
        .device_ints = ctx->on_device ? run->ints.target : NULL,
        .on_device = ctx->on_device,
    };
    size_t q_bytes = gpu_dtype_bytes(run->c->q_dtype);
    double start = gpu_now_ms();
    ap_status st = gpu_run_backend_once(ctx, run, &side, 1);
    run->backend_ms = gpu_now_ms() - start;
    if (st != AP_OK) return st;
    memcpy(run->out_first, run->out.host, run->out.bytes);
    memcpy(run->lse_first, run->lse.host, run->lse.bytes);
    if ((st = gpu_buf_fill_target(&run->out, GPU_POISON_BYTE)) != AP_OK ||
        (st = gpu_buf_fill_target(&run->lse, GPU_POISON_BYTE)) != AP_OK ||
        (st = gpu_run_backend_once(ctx, run, &side, 0)) != AP_OK)
        return st;
    run->replay_differ = gpu_count_differ(run->out_first, run->out.host, run->out_count, q_bytes);
    if (run->lse_on)
        run->replay_differ += gpu_count_differ(run->lse_first, run->lse.host, run->lse_count, 4);
    if ((st = gpu_buf_download(&run->k_cache)) != AP_OK ||
        (st = gpu_buf_download(&run->v_cache)) != AP_OK)
        return st;
    return AP_OK;
}

static ap_status gpu_run_reference(gpu_run *run, int save_kv) {
    gpu_side side = {
        .q = run->q.host,
        .k = run->k.host,
        .v = run->v.host,
        .k_cache = run->k_ref,
        .v_cache = run->v_ref,
        .out = run->out_ref,
        .lse = run->lse_ref,
    };
    double start = gpu_now_ms();
    memset(run->out_ref, GPU_POISON_BYTE, run->out.bytes);
    memset(run->lse_ref, GPU_POISON_BYTE, run->lse.bytes);
    ap_status st = gpu_forward(run, run->ref, &side, save_kv, 1, NULL);
    if (st != AP_OK)
        printf("FAIL  %-44s cpu_ref forward: %s: %s\n", run->c->name, ap_status_name(st),
               ap_last_error());
    run->ref_ms += gpu_now_ms() - start;
    return st;
}

/* Compare the caches both wrote. Where the backend's new-token bytes differ from cpu_ref's by
 * one ulp (fp8 rounding of x / scale), attention is judged against cpu_ref run on the
 * backend's cache, so the error measured is the attention's alone. */
static ap_status gpu_run_caches(gpu_run *run, gpu_cache_diff *diff) {
    ap_dtype kv = run->c->kv_dtype;
    *diff = (gpu_cache_diff){0};
    gpu_cache_compare(kv, run->k_cache.host, run->k_ref, run->num_slots, run->slot_elems,
                      run->is_new, diff);
    gpu_cache_compare(kv, run->v_cache.host, run->v_ref, run->num_slots, run->slot_elems,
                      run->is_new, diff);
    if (diff->new_one_ulp == 0 || diff->new_far > 0 || diff->other_differ > 0) return AP_OK;
    memcpy(run->k_ref, run->k_cache.host, run->k_cache.bytes);
    memcpy(run->v_ref, run->v_cache.host, run->v_cache.bytes);
    return gpu_run_reference(run, 0);
}

static gpu_outcome gpu_run_judge(const gpu_ctx *ctx, gpu_run *run, const gpu_cache_diff *cd) {
    const gpu_case *c = run->c;
    int fp8 = c->kv_dtype == AP_DTYPE_FP8_E4M3 || c->kv_dtype == AP_DTYPE_FP8_E5M2;
    double tol = fp8 ? 5e-2 : 1e-2;
    size_t q_bytes = gpu_dtype_bytes(c->q_dtype);
    gpu_diff out =
        gpu_compare(c->q_dtype, run->out.host, run->out_ref, run->out_count, (size_t)c->head_dim);
    gpu_diff lse = {0};
    char note[256] = "";
    if (run->lse_on)
        lse = gpu_compare(AP_DTYPE_F32, run->lse.host, run->lse_ref, run->lse_count,
                          (size_t)c->num_qo_heads);
    if (out.unwritten) gpu_note(note, sizeof note, " [%zu out unwritten]", out.unwritten);
    if (out.nonfinite) gpu_note(note, sizeof note, " [%zu out non-finite]", out.nonfinite);
    if (lse.unwritten) gpu_note(note, sizeof note, " [%zu lse unwritten]", lse.unwritten);
    if (lse.nonfinite) gpu_note(note, sizeof note, " [%zu lse non-finite]", lse.nonfinite);
    if (out.ref_bad + lse.ref_bad)
        gpu_note(note, sizeof note, " [cpu_ref: %zu bad values]", out.ref_bad + lse.ref_bad);
    if (!gpu_guard_intact((char *)run->out.host + run->out_count * q_bytes, GPU_GUARD_BYTES))
        gpu_note_text(note, sizeof note, "write past out");
    if (!gpu_guard_intact((char *)run->lse.host + run->lse_count * 4, GPU_GUARD_BYTES))
        gpu_note_text(note, sizeof note, "write past lse");
    if (cd->new_far)
        gpu_note(note, sizeof note, " [kv: %zu new elements off > 1 ulp]", cd->new_far);
    if (cd->other_differ)
        gpu_note(note, sizeof note, " [kv: %zu elements changed outside new slots]",
                 cd->other_differ);
    if (run->replay_differ)
        gpu_note(note, sizeof note, " [%zu elements differ between two identical runs]",
                 run->replay_differ);
    if (out.rel_l2 >= tol || out.row_rel_l2 >= tol)
        gpu_note_text(note, sizeof note, "out error over tolerance");
    if (run->lse_on && (lse.rel_l2 >= tol || lse.row_rel_l2 >= tol))
        gpu_note_text(note, sizeof note, "lse error over tolerance");
    int pass = note[0] == '\0';
    char lse_text[16] = "   -    ";
    if (run->lse_on) snprintf(lse_text, sizeof lse_text, "%.2e", lse.rel_l2);
    printf("%s  %-44s out %.2e row<=%.2e lse %s tol %.0e kv %zu/%zu/%zu  %s %.1f ms  ref %.0f "
           "ms%s\n",
           pass ? "PASS" : "FAIL", c->name, out.rel_l2, out.row_rel_l2, lse_text, tol,
           cd->new_exact, cd->new_one_ulp, cd->new_far, ctx->backend, run->backend_ms, run->ref_ms,
           note);
    return pass ? GPU_PASS : GPU_FAIL;
}

gpu_outcome gpu_attention_check(const gpu_ctx *ctx, gpu_run *run) {
    gpu_cache_diff cache_diff;
    if (gpu_run_backend(ctx, run) != AP_OK || gpu_run_reference(run, run->c->save_kv) != AP_OK ||
        gpu_run_caches(run, &cache_diff) != AP_OK)
        return GPU_FAIL;
    return gpu_run_judge(ctx, run, &cache_diff);
}

gpu_outcome gpu_case_run(const gpu_ctx *ctx, const gpu_case *c, uint64_t seed) {
    if (c->source != GPU_SOURCE_PAGED) return gpu_ragged_case_run(ctx, c, seed);
    gpu_run run;
    uint64_t rng = seed;
    gpu_outcome outcome = gpu_run_setup(ctx, c, &rng, &run);
    if (outcome == GPU_PASS)
        outcome = c->rotary_dim > 0 ? gpu_append_check(ctx, &run) : gpu_attention_check(ctx, &run);
    gpu_run_free(&run);
    return outcome;
}
