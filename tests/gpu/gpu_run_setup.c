/* gpu_run_setup.c: one case's setup: batch layout, both backends opened, inputs and caches. */
#include "gpu_run.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpu_rand.h"

double gpu_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
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

void gpu_note(char *note, size_t size, const char *fmt, size_t value) {
    size_t used = strlen(note);
    if (used < size) snprintf(note + used, size - used, fmt, value);
}

void gpu_note_text(char *note, size_t size, const char *text) {
    size_t used = strlen(note);
    if (used < size) snprintf(note + used, size - used, " [%s]", text);
}

void gpu_run_free(gpu_run *run) {
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

gpu_outcome gpu_run_setup(const gpu_ctx *ctx, const gpu_case *c, uint64_t *rng, gpu_run *run) {
    gpu_seq *seqs = NULL;
    int32_t num_seqs = 0;
    gpu_outcome outcome = GPU_FAIL;
    *run = (gpu_run){.c = c, .k_scale = 1.0f, .v_scale = 1.0f};
    if (gpu_seqs_parse(c->seqs, &seqs, &num_seqs) != AP_OK ||
        gpu_layout_build(seqs, num_seqs, c->page_size, num_seqs + 2, rng, &run->layout) != AP_OK) {
        printf("FAIL  %-44s bad batch \"%s\"\n", c->name, c->seqs);
        goto out;
    }
    if (c->kv_dtype == AP_DTYPE_FP8_E4M3 || c->kv_dtype == AP_DTYPE_FP8_E5M2) {
        /* non-power-of-two scales: a kernel that ignores or inverts one cannot pass */
        run->k_scale = gpu_rand_uniform(rng, 0.011f, 0.019f);
        run->v_scale = gpu_rand_uniform(rng, 0.006f, 0.009f);
    }
    run->slot_elems = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    run->num_slots = (int64_t)run->layout.num_pages_pool * c->page_size;
    gpu_layout_model(&run->layout, c->q_dtype, c->kv_dtype, c->num_qo_heads, c->num_kv_heads,
                     c->head_dim, &run->model);
    run->model.name = "gpu-test";
    run->model.causal = c->causal;
    if ((outcome = gpu_run_open(ctx, run)) != GPU_PASS) goto out;
    outcome = GPU_FAIL;
    if (gpu_run_alloc(run, ctx->on_device) != AP_OK) {
        printf("FAIL  %-44s cannot allocate the inputs\n", c->name);
        goto out;
    }
    if (gpu_run_inputs(run, rng) == AP_OK)
        outcome = GPU_PASS;
    else
        printf("FAIL  %-44s cannot upload the inputs (CUDA error above)\n", c->name);
out:
    free(seqs);
    return outcome;
}
