/* bench_append.c: the append_kv/1 hook through the core: neox RoPE on q (in place) and k, k and v
 * quantized into their cache slots, for the new tokens of the case's batch, in shuffled pages. */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "bench_fill.h"
#include "bench_time.h"
#include "tests/gpu/gpu_mem.h"
#include "tests/gpu/paged_layout.h"

#define BENCH_APPEND_SETS 8
#define BENCH_APPEND_SCALE (1.0f / 64.0f)

/* One input set: new q, k, v and a whole cache to write them into. */
typedef struct append_set {
    void *q, *k, *v, *k_pages, *v_pages;
} append_set;

typedef struct append_state {
    const bench_case *c;
    gpu_layout layout;
    ap_model model;
    ap_instance *instance;
    int num_sets;
    append_set sets[BENCH_APPEND_SETS];
    int32_t *positions, *out_loc; /* device [tokens] */
    float *cos_sin;               /* device [max_position][rotary_dim] */
    int32_t max_position;
} append_state;

static ap_status append_call(const bench_ctx *ctx, const void *state, int s) {
    const append_state *st = state;
    const bench_case *c = st->c;
    const append_set *set = &st->sets[s];
    int64_t t = bench_new_tokens(c);
    ap_kv_cache kv;
    gpu_layout_kv_cache(&st->layout, c->kv_dtype, c->num_kv_heads, c->head_dim, set->k_pages,
                        set->v_pages, &kv);
    int scaled = c->kv_dtype == AP_DTYPE_FP8_E4M3;
    ap_layer layer = {.struct_size = sizeof layer,
                      .layer_id = s,
                      .sm_scale = 1.0f,
                      .k_scale = scaled ? BENCH_APPEND_SCALE : 1.0f,
                      .v_scale = scaled ? BENCH_APPEND_SCALE : 1.0f,
                      .window_left = -1,
                      .kv = &kv};
    gpu_tensor q, k, v, pos, loc, cs;
    gpu_tensor_make(&q, set->q, c->q_dtype, 1, 3, t, c->num_qo_heads, c->head_dim);
    gpu_tensor_make(&k, set->k, c->q_dtype, 1, 3, t, c->num_kv_heads, c->head_dim);
    gpu_tensor_make(&v, set->v, c->q_dtype, 1, 3, t, c->num_kv_heads, c->head_dim);
    gpu_tensor_make_i32(&pos, st->positions, 1, t);
    gpu_tensor_make_i32(&loc, st->out_loc, 1, t);
    gpu_tensor_make(&cs, st->cos_sin, AP_DTYPE_F32, 1, 2, st->max_position, c->rotary_dim, 0);
    ap_append_kv_args args = {.struct_size = sizeof args,
                              .q = &q.dl,
                              .q_out = &q.dl,
                              .k = &k.dl,
                              .v = &v.dl,
                              .positions = &pos.dl,
                              .out_loc = &loc.dl,
                              .cos_sin = &cs.dl,
                              .rotary_dim = c->rotary_dim,
                              .is_neox = 1};
    return ap_instance_append_kv(st->instance, &layer, &args, ctx->stream);
}

/* Positions prefix + j of every sequence's new tokens and their cache slots, on the device. */
static ap_status append_indices(append_state *st) {
    const gpu_layout *l = &st->layout;
    const int32_t *qo = l->ints + l->off_qo_indptr;
    size_t t = (size_t)l->num_tokens;
    int32_t *host = malloc(2 * t * sizeof *host);
    if (host == NULL) return AP_ERR_OUT_OF_MEMORY;
    for (int32_t s = 0; s < l->num_seqs; s++) {
        int32_t len = l->ints[l->off_seq_lens + (size_t)s], q_len = qo[s + 1] - qo[s];
        for (int32_t j = 0; j < q_len; j++) {
            host[qo[s] + j] = len - q_len + j;
            host[t + (size_t)(qo[s] + j)] = (int32_t)gpu_layout_slot(l, s, len - q_len + j);
        }
    }
    st->max_position = l->max_seq_len;
    cudaError_t err = cudaMalloc((void **)&st->positions, 2 * t * sizeof *host);
    if (err == cudaSuccess)
        err = cudaMemcpy(st->positions, host, 2 * t * sizeof *host, cudaMemcpyHostToDevice);
    st->out_loc = st->positions + t;
    free(host);
    return err == cudaSuccess ? AP_OK : gpu_cuda_fail(err, "indices", __FILE__, __LINE__);
}

static ap_status append_alloc(const bench_ctx *ctx, append_state *st) {
    const bench_case *c = st->c;
    size_t t = (size_t)bench_new_tokens(c), qb = gpu_dtype_bytes(c->q_dtype);
    size_t q_elems = t * (size_t)(c->num_qo_heads * c->head_dim);
    size_t kv_elems = t * (size_t)(c->num_kv_heads * c->head_dim);
    size_t cache_elems = (size_t)st->layout.num_pages_pool * (size_t)c->page_size *
                         (size_t)(c->num_kv_heads * c->head_dim);
    size_t cache_bytes = cache_elems * gpu_dtype_bytes(c->kv_dtype);
    size_t cs_elems = (size_t)st->max_position * (size_t)c->rotary_dim;
    double set_bytes = (double)(q_elems + 2 * kv_elems) * (double)qb + 2.0 * (double)cache_bytes;
    double l2 = ctx->device.l2_bytes > 0 ? ctx->device.l2_bytes : 50e6;
    st->num_sets = (int)(4.0 * l2 / set_bytes) + 1;
    if (st->num_sets > BENCH_APPEND_SETS) st->num_sets = BENCH_APPEND_SETS;
    GPU_CHECK(cudaMalloc((void **)&st->cos_sin, cs_elems * sizeof(float)));
    GPU_CHECK((cudaError_t)bench_fill_random(st->cos_sin, cs_elems, AP_DTYPE_F32, 1.0f, 0xc05,
                                             ctx->stream));
    for (int s = 0; s < st->num_sets; s++) {
        append_set *set = &st->sets[s];
        uint64_t seed = 0xa77e0000ull + 4u * (unsigned)s;
        GPU_CHECK(cudaMalloc(&set->q, q_elems * qb));
        GPU_CHECK(cudaMalloc(&set->k, kv_elems * qb));
        GPU_CHECK(cudaMalloc(&set->v, kv_elems * qb));
        GPU_CHECK(cudaMalloc(&set->k_pages, cache_bytes));
        GPU_CHECK(cudaMalloc(&set->v_pages, cache_bytes));
        GPU_CHECK(
            (cudaError_t)bench_fill_random(set->q, q_elems, c->q_dtype, 2.0f, seed, ctx->stream));
        GPU_CHECK((cudaError_t)bench_fill_random(set->k, kv_elems, c->q_dtype, 2.0f, seed + 1,
                                                 ctx->stream));
        GPU_CHECK((cudaError_t)bench_fill_random(set->v, kv_elems, c->q_dtype, 1.0f, seed + 2,
                                                 ctx->stream));
    }
    GPU_CHECK(cudaStreamSynchronize((cudaStream_t)ctx->stream));
    return AP_OK;
}

static void append_free(append_state *st) {
    for (int s = 0; s < BENCH_APPEND_SETS; s++) {
        append_set *set = &st->sets[s];
        void *bufs[] = {set->q, set->k, set->v, set->k_pages, set->v_pages};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) cudaFree(bufs[i]);
    }
    cudaFree(st->positions);
    cudaFree(st->cos_sin);
    if (st->instance != NULL) ap_instance_close(st->instance);
    gpu_layout_free(&st->layout);
}

static ap_status append_open(const bench_ctx *ctx, append_state *st, bench_result *out) {
    static const ap_options no_options = {.struct_size = sizeof(ap_options),
                                          .prefix_cache = AP_OPTION_UNSET,
                                          .chunked_prefill = AP_OPTION_UNSET,
                                          .cuda_graphs = AP_OPTION_UNSET};
    const bench_case *c = st->c;
    gpu_layout_model(&st->layout, c->q_dtype, c->kv_dtype, c->num_qo_heads, c->num_kv_heads,
                     c->head_dim, &st->model);
    st->model.name = "bench";
    st->model.num_layers = BENCH_APPEND_SETS;
    ap_status status = ap_instance_open(ctx->registry, ctx->backend, &st->model, &no_options,
                                        &ctx->device, &st->instance);
    if (status != AP_OK) bench_fail(out, ap_status_name(status), ap_last_error());
    return status;
}

ap_status bench_append_time(const bench_ctx *ctx, const bench_case *c, bench_result *out) {
    append_state st = {.c = c};
    gpu_seq *seqs = calloc((size_t)c->batch, sizeof *seqs);
    uint64_t rng = 0xa77eull;
    ap_status status = AP_ERR_OUT_OF_MEMORY;
    memset(out, 0, sizeof *out);
    bench_fail(out, "error", "out of host memory");
    if (seqs == NULL) goto done;
    for (int32_t i = 0; i < c->batch; i++) seqs[i] = (gpu_seq){c->prefix, c->q_len};
    if ((status = gpu_layout_build(seqs, c->batch, c->page_size, 0, &rng, &st.layout)) != AP_OK ||
        (status = append_open(ctx, &st, out)) != AP_OK)
        goto done;
    if ((status = append_indices(&st)) != AP_OK || (status = append_alloc(ctx, &st)) != AP_OK) {
        bench_fail(out, "error", "device allocation or fill failed (see stderr)");
        goto done;
    }
    status = bench_time_case(ctx, c, append_call, &st, st.num_sets, "append_kv", out);
done:
    append_free(&st);
    free(seqs);
    return status;
}
