/* gpu_case_run.c: one case end to end: random paged inputs, both backends, every comparison. */
#include "gpu_case_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_check.h"
#include "gpu_mem.h"
#include "gpu_rand.h"
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

static double gpu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static void gpu_run_model(const gpu_case *c, const gpu_layout *layout, ap_model *model) {
    *model = (ap_model){
        .struct_size = sizeof(ap_model),
        .name = "gpu-test",
        .kind = AP_ATTN_MHA,
        .num_qo_heads = c->num_qo_heads,
        .num_kv_heads = c->num_kv_heads,
        .head_dim_qk = c->head_dim,
        .head_dim_v = c->head_dim,
        .dtype = c->q_dtype,
        .kv_dtype = c->kv_dtype,
        .page_size = c->page_size,
        .num_layers = 1,
        .causal = c->causal,
        .max_batch = layout->num_seqs,
        .max_tokens = layout->num_tokens,
        .max_kv_len = layout->max_seq_len,
    };
}

static const ap_options gpu_no_options = {
    .struct_size = sizeof(ap_options),
    .prefix_cache = AP_OPTION_UNSET,
    .chunked_prefill = AP_OPTION_UNSET,
    .cuda_graphs = AP_OPTION_UNSET,
};

/* The harness compares cache bytes, so both backends must use the dense NHD page layout. */
static int gpu_spec_is_dense(ap_instance *instance, const gpu_case *c, const char *who) {
    ap_kv_spec spec = {.struct_size = sizeof spec};
    size_t dense = (size_t)c->page_size * (size_t)c->num_kv_heads * (size_t)c->head_dim *
                   gpu_dtype_bytes(c->kv_dtype);
    if (ap_instance_kv_spec(instance, &spec) != AP_OK) {
        printf("FAIL  %-44s %s kv_spec: %s\n", c->name, who, ap_last_error());
        return 0;
    }
    if (spec.k_bytes_per_page != dense || spec.v_bytes_per_page != dense ||
        spec.alignment > GPU_BUF_ALIGN) {
        printf("FAIL  %-44s %s kv_spec %zu/%zu bytes per page, alignment %zu: want dense NHD %zu, "
               "alignment <= %d\n",
               c->name, who, spec.k_bytes_per_page, spec.v_bytes_per_page, spec.alignment, dense,
               GPU_BUF_ALIGN);
        return 0;
    }
    return 1;
}

/* The first line of a '\n'-separated reason list, for a one-line report. */
static void gpu_print_first_line(const char *text) {
    const char *end = strchr(text, '\n');
    int len = end != NULL ? (int)(end - text) : (int)strlen(text);
    printf("%.*s%s", len, text, end != NULL ? " (...)" : "");
}

/* Check the case against both backends and open them. SKIP when the backend under test refuses
 * it (its caps or validate), FAIL when cpu_ref, the oracle, cannot serve it. */
static gpu_outcome gpu_run_open(const gpu_ctx *ctx, gpu_run *run) {
    const gpu_case *c = run->c;
    ap_verdict verdict;
    ap_status st = ap_registry_check(ctx->registry, ctx->backend, &run->model, &gpu_no_options,
                                     &ctx->device, &verdict);
    if (st != AP_OK || verdict.status != AP_OK) {
        printf("SKIP  %-44s %s: ", c->name, ctx->backend);
        gpu_print_first_line(verdict.reasons != NULL && verdict.reasons[0] != '\0'
                                 ? verdict.reasons
                                 : ap_last_error());
        printf("\n");
        return GPU_SKIP;
    }
    if (ap_instance_open(ctx->registry, "cpu_ref", &run->model, &gpu_no_options, &ctx->cpu,
                         &run->ref) != AP_OK) {
        printf("FAIL  %-44s cpu_ref cannot serve it: %s\n", c->name, ap_last_error());
        return GPU_FAIL;
    }
    if (ap_instance_open(ctx->registry, ctx->backend, &run->model, &gpu_no_options, &ctx->device,
                         &run->under_test) != AP_OK) {
        printf("FAIL  %-44s open %s after its check passed: %s\n", c->name, ctx->backend,
               ap_last_error());
        return GPU_FAIL;
    }
    if (!gpu_spec_is_dense(run->ref, c, "cpu_ref") ||
        !gpu_spec_is_dense(run->under_test, c, ctx->backend))
        return GPU_FAIL;
    const ap_caps *caps = ap_instance_caps(run->under_test);
    run->lse_on = caps != NULL && (caps->features & AP_FEATURE_LSE) != 0;
    return GPU_PASS;
}

static void gpu_fill_uniform(ap_dtype dtype, void *data, size_t count, float bound, uint64_t *rng) {
    for (size_t i = 0; i < count; i++)
        gpu_elem_store(dtype, data, i, gpu_rand_uniform(rng, -bound, bound));
}

/* Store real value x of cache element i the way the cache holds it: x / scale for fp8. */
static void gpu_cache_store(const gpu_run *run, void *cache, size_t i, float x, float scale) {
    ap_dtype kv = run->c->kv_dtype;
    int fp8 = kv == AP_DTYPE_FP8_E4M3 || kv == AP_DTYPE_FP8_E5M2;
    gpu_elem_store(kv, cache, i, fp8 ? x / scale : x);
}

/* The cache before the forward: NaN (poison) everywhere, random values at every cached position
 * (the prefix, and the new tokens too when the forward does not save them). */
static void gpu_fill_cache(gpu_run *run, uint64_t *rng) {
    const gpu_case *c = run->c;
    const gpu_layout *l = &run->layout;
    const int32_t *qo_indptr = l->ints + l->off_qo_indptr;
    memset(run->k_cache.host, GPU_POISON_BYTE, run->k_cache.bytes);
    memset(run->v_cache.host, GPU_POISON_BYTE, run->v_cache.bytes);
    for (int32_t s = 0; s < l->num_seqs; s++) {
        int32_t q_len = qo_indptr[s + 1] - qo_indptr[s];
        int32_t len = l->ints[l->off_seq_lens + (size_t)s];
        int32_t prefix = len - q_len;
        for (int32_t pos = 0; pos < len; pos++) {
            size_t base = (size_t)gpu_layout_slot(l, s, pos) * run->slot_elems;
            size_t token = (size_t)(qo_indptr[s] + pos - prefix) * run->slot_elems;
            if (pos >= prefix) {
                run->is_new[base / run->slot_elems] = (uint8_t)c->save_kv;
                if (c->save_kv) continue;
            }
            for (size_t e = 0; e < run->slot_elems; e++) {
                float kx = pos < prefix ? gpu_rand_uniform(rng, -2.0f, 2.0f)
                                        : gpu_elem_load(c->q_dtype, run->k.host, token + e);
                float vx = pos < prefix ? gpu_rand_uniform(rng, -1.0f, 1.0f)
                                        : gpu_elem_load(c->q_dtype, run->v.host, token + e);
                gpu_cache_store(run, run->k_cache.host, base + e, kx, run->k_scale);
                gpu_cache_store(run, run->v_cache.host, base + e, vx, run->v_scale);
            }
        }
    }
}

static ap_status gpu_run_alloc(gpu_run *run, int on_device) {
    const gpu_case *c = run->c;
    size_t q_bytes = gpu_dtype_bytes(c->q_dtype);
    size_t cache_bytes = (size_t)run->num_slots * run->slot_elems * gpu_dtype_bytes(c->kv_dtype);
    ap_status st = AP_OK;
    run->q_count = (size_t)run->layout.num_tokens * (size_t)c->num_qo_heads * (size_t)c->head_dim;
    run->kv_count = (size_t)run->layout.num_tokens * run->slot_elems;
    run->out_count = run->q_count;
    run->lse_count = (size_t)run->layout.num_tokens * (size_t)c->num_qo_heads;
    if ((st = gpu_buf_alloc(&run->q, run->q_count * q_bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->k, run->kv_count * q_bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->v, run->kv_count * q_bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->k_cache, cache_bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->v_cache, cache_bytes, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->out, run->out_count * q_bytes + GPU_GUARD_BYTES, on_device)) !=
            AP_OK ||
        (st = gpu_buf_alloc(&run->lse, run->lse_count * 4 + GPU_GUARD_BYTES, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&run->ints, run->layout.num_ints * 4, on_device)) != AP_OK)
        return st;
    run->k_ref = malloc(cache_bytes);
    run->v_ref = malloc(cache_bytes);
    run->is_new = calloc((size_t)run->num_slots, 1);
    run->out_ref = malloc(run->out.bytes);
    run->lse_ref = malloc(run->lse.bytes);
    run->out_first = malloc(run->out.bytes);
    run->lse_first = malloc(run->lse.bytes);
    if (!run->k_ref || !run->v_ref || !run->is_new || !run->out_ref || !run->lse_ref ||
        !run->out_first || !run->lse_first)
        return AP_ERR_OUT_OF_MEMORY;
    return AP_OK;
}

/* Draw the inputs; upload the backend's copies and poison its outputs. */
static ap_status gpu_run_inputs(gpu_run *run, uint64_t *rng) {
    const gpu_case *c = run->c;
    ap_status st;
    gpu_fill_uniform(c->q_dtype, run->q.host, run->q_count, 2.0f, rng);
    gpu_fill_uniform(c->q_dtype, run->k.host, run->kv_count, 2.0f, rng);
    gpu_fill_uniform(c->q_dtype, run->v.host, run->kv_count, 1.0f, rng);
    gpu_fill_cache(run, rng);
    memcpy(run->ints.host, run->layout.ints, run->ints.bytes);
    memcpy(run->k_ref, run->k_cache.host, run->k_cache.bytes);
    memcpy(run->v_ref, run->v_cache.host, run->v_cache.bytes);
    memset(run->out_ref, GPU_POISON_BYTE, run->out.bytes);
    memset(run->lse_ref, GPU_POISON_BYTE, run->lse.bytes);
    if ((st = gpu_buf_upload(&run->q)) != AP_OK || (st = gpu_buf_upload(&run->k)) != AP_OK ||
        (st = gpu_buf_upload(&run->v)) != AP_OK || (st = gpu_buf_upload(&run->k_cache)) != AP_OK ||
        (st = gpu_buf_upload(&run->v_cache)) != AP_OK || (st = gpu_buf_upload(&run->ints)) != AP_OK)
        return st;
    if ((st = gpu_buf_fill_target(&run->out, GPU_POISON_BYTE)) != AP_OK ||
        (st = gpu_buf_fill_target(&run->lse, GPU_POISON_BYTE)) != AP_OK)
        return st;
    return AP_OK;
}

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
    ap_kv_cache kv = {
        .struct_size = sizeof kv,
        .layout = AP_KV_LAYOUT_NHD,
        .dtype = c->kv_dtype,
        .page_size = c->page_size,
        .num_pages = run->layout.num_pages_pool,
        .num_kv_heads = c->num_kv_heads,
        .head_dim_qk = c->head_dim,
        .head_dim_v = c->head_dim,
        .k_pages = side->k_cache,
        .v_pages = side->v_cache,
    };
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

/* Append " [reason]" to a failure note; `fmt` takes one size_t. */
static void gpu_note(char *note, size_t size, const char *fmt, size_t value) {
    size_t used = strlen(note);
    if (used < size) snprintf(note + used, size - used, fmt, value);
}

static void gpu_note_text(char *note, size_t size, const char *text) {
    size_t used = strlen(note);
    if (used < size) snprintf(note + used, size - used, " [%s]", text);
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

static void gpu_run_free(gpu_run *run) {
    gpu_buf *bufs[] = {&run->q,       &run->k,   &run->v,   &run->k_cache,
                       &run->v_cache, &run->out, &run->lse, &run->ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_buf_free(bufs[i]);
    free(run->k_ref);
    free(run->v_ref);
    free(run->is_new);
    free(run->out_ref);
    free(run->lse_ref);
    free(run->out_first);
    free(run->lse_first);
    if (run->under_test != NULL) ap_instance_close(run->under_test);
    if (run->ref != NULL) ap_instance_close(run->ref);
    gpu_layout_free(&run->layout);
}

gpu_outcome gpu_case_run(const gpu_ctx *ctx, const gpu_case *c, uint64_t seed) {
    gpu_run run = {.c = c, .k_scale = 1.0f, .v_scale = 1.0f};
    gpu_seq *seqs = NULL;
    int32_t num_seqs = 0;
    uint64_t rng = seed;
    gpu_outcome outcome = GPU_FAIL;
    gpu_cache_diff cache_diff;
    if (gpu_seqs_parse(c->seqs, &seqs, &num_seqs) != AP_OK ||
        gpu_layout_build(seqs, num_seqs, c->page_size, num_seqs + 2, &rng, &run.layout) != AP_OK) {
        printf("FAIL  %-44s bad batch \"%s\"\n", c->name, c->seqs);
        goto out;
    }
    if (c->kv_dtype == AP_DTYPE_FP8_E4M3 || c->kv_dtype == AP_DTYPE_FP8_E5M2) {
        /* non-power-of-two scales: a kernel that ignores or inverts one cannot pass */
        run.k_scale = gpu_rand_uniform(&rng, 0.011f, 0.019f);
        run.v_scale = gpu_rand_uniform(&rng, 0.006f, 0.009f);
    }
    run.slot_elems = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    run.num_slots = (int64_t)run.layout.num_pages_pool * c->page_size;
    gpu_run_model(c, &run.layout, &run.model);
    if ((outcome = gpu_run_open(ctx, &run)) != GPU_PASS) goto out;
    outcome = GPU_FAIL;
    if (gpu_run_alloc(&run, ctx->on_device) != AP_OK) {
        printf("FAIL  %-44s cannot allocate the inputs\n", c->name);
        goto out;
    }
    if (gpu_run_inputs(&run, &rng) != AP_OK || gpu_run_backend(ctx, &run) != AP_OK ||
        gpu_run_reference(&run, c->save_kv) != AP_OK || gpu_run_caches(&run, &cache_diff) != AP_OK)
        goto out;
    outcome = gpu_run_judge(ctx, &run, &cache_diff);
out:
    free(seqs);
    gpu_run_free(&run);
    return outcome;
}
