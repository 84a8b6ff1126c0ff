/* gpu_ragged_run.c: cases without the paged cache (ragged k/v by kv_indptr, embedding skip-KV):
 * the backend twice on one plan, cpu_ref on the same inputs, out and lse compared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpu_check.h"
#include "gpu_mem.h"
#include "gpu_rand.h"
#include "gpu_run.h"
#include "paged_layout.h"

/* One case's inputs and outputs: host halves hold the inputs, then what the backend wrote. */
typedef struct ragged_run {
    const gpu_case *c;
    gpu_layout layout; /* sequences and the batch's CSR arrays; its page arrays are not sent */
    ap_model model;
    ap_options options;
    int skip;           /* GPU_SOURCE_SKIP_KV */
    int32_t dqk, dv;    /* head dims of q / k and of v / out */
    ap_dtype kv_dtype;  /* of the k / v tensors */
    int32_t *kv_indptr; /* host [num_seqs + 1]: rows of k / v per sequence */
    int32_t num_kv;     /* kv_indptr[num_seqs] */
    float k_scale, v_scale;
    size_t q_count, k_count, v_count, out_count, lse_count;
    gpu_buf q, k, v, out, lse, ints, kv_ints;
    void *out_ref, *out_first;
    float *lse_ref, *lse_first;
    size_t replay_differ;
    ap_instance *under_test, *ref;
    int lse_on;
    long long spec_bytes; /* K + V bytes per page the instance asks for; -1 unknown */
    double backend_ms, ref_ms;
} ragged_run;

/* Rows of k / v: the whole context per sequence (ragged), or the new tokens (skip-KV, which
 * has no prefix). */
static int ragged_kv_rows(ragged_run *r, const gpu_seq *seqs, int32_t n) {
    r->kv_indptr = calloc((size_t)n + 1, sizeof(int32_t));
    if (r->kv_indptr == NULL) return 0;
    for (int32_t i = 0; i < n; i++) {
        if (r->skip && seqs[i].prefix != 0) return 0;
        r->kv_indptr[i + 1] = r->kv_indptr[i] + seqs[i].prefix + seqs[i].q_len;
    }
    r->num_kv = r->kv_indptr[n];
    return 1;
}

/* SKIP when the backend under test refuses the model (caps, validate) or has no skip-KV mode
 * for a skip-KV case; FAIL when cpu_ref, the oracle, cannot serve it. */
static gpu_outcome ragged_open(const gpu_ctx *ctx, ragged_run *r) {
    const gpu_case *c = r->c;
    ap_verdict verdict;
    ap_status st = ap_registry_check(ctx->registry, ctx->backend, &r->model, &r->options,
                                     &ctx->device, &verdict);
    const ap_descriptor *desc = ap_registry_find(ctx->registry, ctx->backend);
    if (st != AP_OK || verdict.status != AP_OK) {
        printf("SKIP  %-44s %s: %s\n", c->name, ctx->backend,
               verdict.reasons != NULL && verdict.reasons[0] ? verdict.reasons : ap_last_error());
        return GPU_SKIP;
    }
    if (r->skip && !(desc->caps->features & AP_FEATURE_EMBEDDING_SKIP_KV)) {
        printf("SKIP  %-44s %s: no embedding skip-KV mode in its caps\n", c->name, ctx->backend);
        return GPU_SKIP;
    }
    if (ap_instance_open(ctx->registry, "cpu_ref", &r->model, &r->options, &ctx->cpu, &r->ref) !=
        AP_OK) {
        printf("FAIL  %-44s cpu_ref cannot serve it: %s\n", c->name, ap_last_error());
        return GPU_FAIL;
    }
    if (ap_instance_open(ctx->registry, ctx->backend, &r->model, &r->options, &ctx->device,
                         &r->under_test) != AP_OK) {
        printf("FAIL  %-44s open %s after its check passed: %s\n", c->name, ctx->backend,
               ap_last_error());
        return GPU_FAIL;
    }
    /* what the instance asks of the host's cache, shown on the case's line (fa_varlen's
     * skip-KV mode asks 0 bytes; cpu_ref keeps its spec and is simply never given a cache) */
    ap_kv_spec spec = {.struct_size = sizeof spec};
    if (ap_instance_kv_spec(r->under_test, &spec) == AP_OK)
        r->spec_bytes = (long long)(spec.k_bytes_per_page + spec.v_bytes_per_page);
    r->lse_on = (desc->caps->features & AP_FEATURE_LSE) != 0;
    return GPU_PASS;
}

static ap_status ragged_alloc(ragged_run *r, int on_device) {
    const gpu_case *c = r->c;
    const size_t qb = gpu_dtype_bytes(c->q_dtype), kvb = gpu_dtype_bytes(r->kv_dtype);
    const size_t tokens = (size_t)r->layout.num_tokens;
    r->q_count = tokens * (size_t)c->num_qo_heads * (size_t)r->dqk;
    r->k_count = (size_t)r->num_kv * (size_t)c->num_kv_heads * (size_t)r->dqk;
    r->v_count = (size_t)r->num_kv * (size_t)c->num_kv_heads * (size_t)r->dv;
    r->out_count = tokens * (size_t)c->num_qo_heads * (size_t)r->dv;
    r->lse_count = tokens * (size_t)c->num_qo_heads;
    ap_status st;
    if ((st = gpu_buf_alloc(&r->q, r->q_count * qb, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->k, r->k_count * kvb + 16, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->v, r->v_count * kvb + 16, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->out, r->out_count * qb + GPU_GUARD_BYTES, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->lse, r->lse_count * 4 + GPU_GUARD_BYTES, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->ints, r->layout.num_ints * 4, on_device)) != AP_OK ||
        (st = gpu_buf_alloc(&r->kv_ints, ((size_t)r->layout.num_seqs + 1) * 4, on_device)) != AP_OK)
        return st;
    r->out_ref = malloc(r->out.bytes);
    r->out_first = malloc(r->out.bytes);
    r->lse_ref = malloc(r->lse.bytes);
    r->lse_first = malloc(r->lse.bytes);
    return r->out_ref && r->out_first && r->lse_ref && r->lse_first ? AP_OK : AP_ERR_OUT_OF_MEMORY;
}

/* Random inputs (fp8 k / v stored as x / scale), uploaded; outputs poisoned. */
static ap_status ragged_inputs(ragged_run *r, uint64_t *rng) {
    const gpu_case *c = r->c;
    const int fp8 = r->kv_dtype == AP_DTYPE_FP8_E4M3;
    for (size_t i = 0; i < r->q_count; i++)
        gpu_elem_store(c->q_dtype, r->q.host, i, gpu_rand_uniform(rng, -2.0f, 2.0f));
    for (size_t i = 0; i < r->k_count; i++) {
        float x = gpu_rand_uniform(rng, -2.0f, 2.0f);
        gpu_elem_store(r->kv_dtype, r->k.host, i, fp8 ? x / r->k_scale : x);
    }
    for (size_t i = 0; i < r->v_count; i++) {
        float x = gpu_rand_uniform(rng, -1.0f, 1.0f);
        gpu_elem_store(r->kv_dtype, r->v.host, i, fp8 ? x / r->v_scale : x);
    }
    memcpy(r->ints.host, r->layout.ints, r->ints.bytes);
    memcpy(r->kv_ints.host, r->kv_indptr, r->kv_ints.bytes);
    ap_status st;
    if ((st = gpu_buf_upload(&r->q)) != AP_OK || (st = gpu_buf_upload(&r->k)) != AP_OK ||
        (st = gpu_buf_upload(&r->v)) != AP_OK || (st = gpu_buf_upload(&r->ints)) != AP_OK ||
        (st = gpu_buf_upload(&r->kv_ints)) != AP_OK)
        return st;
    if ((st = gpu_buf_fill_target(&r->out, GPU_POISON_BYTE)) != AP_OK ||
        (st = gpu_buf_fill_target(&r->lse, GPU_POISON_BYTE)) != AP_OK)
        return st;
    return AP_OK;
}

/* Parse, lay out, open both backends, allocate and fill. */
static gpu_outcome ragged_setup(const gpu_ctx *ctx, const gpu_case *c, uint64_t *rng,
                                ragged_run *r) {
    gpu_seq *seqs = NULL;
    int32_t n = 0;
    gpu_outcome outcome = GPU_FAIL;
    r->skip = c->source == GPU_SOURCE_SKIP_KV;
    r->dqk = c->head_dim;
    r->dv = c->head_dim_v > 0 ? c->head_dim_v : c->head_dim;
    r->kv_dtype = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? c->kv_dtype : c->q_dtype;
    r->k_scale = r->v_scale = 1.0f;
    if (gpu_seqs_parse(c->seqs, &seqs, &n) != AP_OK ||
        gpu_layout_build(seqs, n, c->page_size, 0, rng, &r->layout) != AP_OK ||
        !ragged_kv_rows(r, seqs, n)) {
        printf("FAIL  %-44s bad batch \"%s\"%s\n", c->name, c->seqs,
               r->skip ? " (skip-KV sequences have no prefix)" : "");
        goto out;
    }
    if (r->kv_dtype == AP_DTYPE_FP8_E4M3) { /* non-power-of-two scales, as the paged cases */
        r->k_scale = gpu_rand_uniform(rng, 0.011f, 0.019f);
        r->v_scale = gpu_rand_uniform(rng, 0.006f, 0.009f);
    }
    gpu_layout_model(&r->layout, c->q_dtype, c->q_dtype, c->num_qo_heads, c->num_kv_heads, r->dqk,
                     &r->model);
    r->model.name = "gpu-test";
    r->model.head_dim_v = r->dv;
    r->model.causal = c->causal;
    r->model.embedding = r->skip;
    r->options = (ap_options){.struct_size = sizeof(ap_options),
                              .prefix_cache = r->skip ? 0 : AP_OPTION_UNSET,
                              .chunked_prefill = AP_OPTION_UNSET,
                              .cuda_graphs = AP_OPTION_UNSET};
    if ((outcome = ragged_open(ctx, r)) != GPU_PASS) goto out;
    outcome = GPU_FAIL;
    if (ragged_alloc(r, ctx->on_device) != AP_OK || ragged_inputs(r, rng) != AP_OK)
        printf("FAIL  %-44s cannot allocate or upload the inputs\n", c->name);
    else
        outcome = GPU_PASS;
out:
    free(seqs);
    return outcome;
}

/* One forward over the batch without page arrays; `plan` = 0 reuses the last plan. */
static ap_status ragged_forward(const ragged_run *r, ap_instance *instance, int host_side,
                                int on_device, int plan, void *stream) {
    const gpu_case *c = r->c;
    const int64_t t = r->layout.num_tokens;
    gpu_tensor q, k, v, out, lse;
    gpu_tensor_make(&q, host_side ? r->q.host : r->q.target, c->q_dtype, on_device, 3, t,
                    c->num_qo_heads, r->dqk);
    gpu_tensor_make(&k, host_side ? r->k.host : r->k.target, r->kv_dtype, on_device, 3, r->num_kv,
                    c->num_kv_heads, r->dqk);
    gpu_tensor_make(&v, host_side ? r->v.host : r->v.target, r->kv_dtype, on_device, 3, r->num_kv,
                    c->num_kv_heads, r->dv);
    gpu_tensor_make(&out, host_side ? r->out_ref : r->out.target, c->q_dtype, on_device, 3, t,
                    c->num_qo_heads, r->dv);
    gpu_tensor_make(&lse, host_side ? (void *)r->lse_ref : r->lse.target, AP_DTYPE_F32, on_device,
                    2, t, c->num_qo_heads, 0);
    const int with_lse = host_side || r->lse_on;
    ap_forward_args args = {.struct_size = sizeof args,
                            .q = &q.dl,
                            .k = &k.dl,
                            .v = &v.dl,
                            .out = &out.dl,
                            .lse = with_lse ? &lse.dl : NULL,
                            .save_kv = 0};
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = 1.0f / sqrtf((float)r->dqk),
                      .k_scale = r->k_scale,
                      .v_scale = r->v_scale,
                      .window_left = -1,
                      .kv = NULL};
    ap_batch batch;
    gpu_layout_batch(&r->layout, AP_MODE_EXTEND, host_side ? NULL : r->ints.target, &batch);
    batch.kv_page_indptr = batch.kv_page_indices = batch.kv_last_page_len = NULL;
    batch.kv_page_indptr_host = batch.kv_page_indices_host = batch.kv_last_page_len_host = NULL;
    batch.num_pages_total = 0;
    if (!r->skip) {
        batch.kv_indptr = host_side ? r->kv_indptr : r->kv_ints.target;
        batch.kv_indptr_host = r->kv_indptr;
        batch.num_kv_tokens = r->num_kv;
        batch.kv_causal = c->causal;
    }
    ap_status st = plan ? ap_instance_init_metadata(instance, &batch, stream) : AP_OK;
    return st == AP_OK ? ap_instance_forward_extend(instance, &layer, &args, stream) : st;
}

static ap_status ragged_backend_once(const gpu_ctx *ctx, ragged_run *r, int plan) {
    ap_status st = ragged_forward(r, r->under_test, 0, ctx->on_device, plan, ctx->stream);
    if (st != AP_OK) {
        printf("%s  %-44s %s forward: %s: %s\n", st == AP_ERR_UNSUPPORTED ? "SKIP" : "FAIL",
               r->c->name, ctx->backend, ap_status_name(st), ap_last_error());
        return st;
    }
    if (ctx->on_device) {
        GPU_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
        GPU_CHECK(cudaGetLastError());
    }
    if ((st = gpu_buf_download(&r->out)) != AP_OK || (st = gpu_buf_download(&r->lse)) != AP_OK)
        return st;
    return AP_OK;
}

static size_t ragged_count_differ(const void *a, const void *b, size_t count, size_t elem) {
    size_t differ = 0;
    for (size_t i = 0; i < count; i++)
        differ += memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0;
    return differ;
}

/* Planned run, then a replay on the same plan into re-poisoned outputs: equal bit for bit. */
static ap_status ragged_backend(const gpu_ctx *ctx, ragged_run *r) {
    const double start = gpu_now_ms();
    ap_status st = ragged_backend_once(ctx, r, 1);
    r->backend_ms = gpu_now_ms() - start;
    if (st != AP_OK) return st;
    memcpy(r->out_first, r->out.host, r->out.bytes);
    memcpy(r->lse_first, r->lse.host, r->lse.bytes);
    if ((st = gpu_buf_fill_target(&r->out, GPU_POISON_BYTE)) != AP_OK ||
        (st = gpu_buf_fill_target(&r->lse, GPU_POISON_BYTE)) != AP_OK ||
        (st = ragged_backend_once(ctx, r, 0)) != AP_OK)
        return st;
    r->replay_differ = ragged_count_differ(r->out_first, r->out.host, r->out_count,
                                           gpu_dtype_bytes(r->c->q_dtype));
    if (r->lse_on)
        r->replay_differ += ragged_count_differ(r->lse_first, r->lse.host, r->lse_count, 4);
    return AP_OK;
}

static gpu_outcome ragged_judge(const gpu_ctx *ctx, ragged_run *r) {
    const gpu_case *c = r->c;
    const double tol = r->kv_dtype == AP_DTYPE_FP8_E4M3 ? 5e-2 : 1e-2;
    const size_t qb = gpu_dtype_bytes(c->q_dtype);
    gpu_diff out = gpu_compare(c->q_dtype, r->out.host, r->out_ref, r->out_count, (size_t)r->dv);
    gpu_diff lse = {0};
    char note[256] = "";
    if (r->lse_on)
        lse = gpu_compare(AP_DTYPE_F32, r->lse.host, r->lse_ref, r->lse_count,
                          (size_t)c->num_qo_heads);
    if (out.unwritten + lse.unwritten)
        gpu_note(note, sizeof note, " [%zu unwritten]", out.unwritten + lse.unwritten);
    if (out.nonfinite + lse.nonfinite)
        gpu_note(note, sizeof note, " [%zu non-finite]", out.nonfinite + lse.nonfinite);
    if (out.ref_bad + lse.ref_bad)
        gpu_note(note, sizeof note, " [cpu_ref: %zu bad values]", out.ref_bad + lse.ref_bad);
    if (!gpu_guard_intact((char *)r->out.host + r->out_count * qb, GPU_GUARD_BYTES) ||
        !gpu_guard_intact((char *)r->lse.host + r->lse_count * 4, GPU_GUARD_BYTES))
        gpu_note_text(note, sizeof note, "write past out or lse");
    if (r->replay_differ)
        gpu_note(note, sizeof note, " [%zu elements differ between two identical runs]",
                 r->replay_differ);
    if (out.rel_l2 >= tol || out.row_rel_l2 >= tol)
        gpu_note_text(note, sizeof note, "out error over tolerance");
    if (r->lse_on && (lse.rel_l2 >= tol || lse.row_rel_l2 >= tol))
        gpu_note_text(note, sizeof note, "lse error over tolerance");
    const int pass = note[0] == '\0';
    printf("%s  %-44s out %.2e row<=%.2e lse %.2e tol %.0e %s (%d kv rows, kv spec %lld B/page)  "
           "%s %.1f ms  ref %.0f ms%s\n",
           pass ? "PASS" : "FAIL", c->name, out.rel_l2, out.row_rel_l2, lse.rel_l2, tol,
           r->skip ? "skip-KV" : "ragged", r->num_kv, r->spec_bytes, ctx->backend, r->backend_ms,
           r->ref_ms, note);
    return pass ? GPU_PASS : GPU_FAIL;
}

static void ragged_free(ragged_run *r) {
    gpu_buf *bufs[] = {&r->q, &r->k, &r->v, &r->out, &r->lse, &r->ints, &r->kv_ints};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_buf_free(bufs[i]);
    free(r->out_ref);
    free(r->out_first);
    free(r->lse_ref);
    free(r->lse_first);
    free(r->kv_indptr);
    if (r->under_test != NULL) ap_instance_close(r->under_test);
    if (r->ref != NULL) ap_instance_close(r->ref);
    gpu_layout_free(&r->layout);
}

gpu_outcome gpu_ragged_case_run(const gpu_ctx *ctx, const gpu_case *c, uint64_t seed) {
    ragged_run r;
    memset(&r, 0, sizeof r);
    r.c = c;
    r.spec_bytes = -1;
    uint64_t rng = seed;
    gpu_outcome outcome = ragged_setup(ctx, c, &rng, &r);
    if (outcome == GPU_PASS) {
        ap_status st = ragged_backend(ctx, &r);
        if (st == AP_ERR_UNSUPPORTED) {
            outcome = GPU_SKIP; /* the backend's plan refuses this source, with its reason */
        } else if (st != AP_OK) {
            outcome = GPU_FAIL;
        } else {
            memset(r.out_ref, GPU_POISON_BYTE, r.out.bytes);
            memset(r.lse_ref, GPU_POISON_BYTE, r.lse.bytes);
            const double start = gpu_now_ms();
            st = ragged_forward(&r, r.ref, 1, 0, 1, NULL);
            r.ref_ms = gpu_now_ms() - start;
            if (st != AP_OK)
                printf("FAIL  %-44s cpu_ref forward: %s: %s\n", c->name, ap_status_name(st),
                       ap_last_error());
            outcome = st == AP_OK ? ragged_judge(ctx, &r) : GPU_FAIL;
        }
    }
    ragged_free(&r);
    return outcome;
}
