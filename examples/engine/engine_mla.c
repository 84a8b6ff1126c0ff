/* engine_mla.c: an MLA model through the engine: chunked-prefix prefill, latent append, decode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"

/* Prefix tokens per packed chunk of the chunked prefill. Small, so that the short runs of the
 * README and the tests still cut prompts into several chunks. */
#define ENG_MLA_CHUNK 16

/* The forward CSR of one ragged pass: qo_indptr, seq_lens and kv_indptr (host + device). */
enum { ENG_MLA_QO, ENG_MLA_SEQ_LENS, ENG_MLA_KV, ENG_MLA_ARRAYS };
typedef struct eng_mla_rows {
    int32_t *host[ENG_MLA_ARRAYS], *device[ENG_MLA_ARRAYS];
    ap_batch batch; /* for the backend: device arrays (host ones for CPU backends) and mirrors */
} eng_mla_rows;

/* One packed prefix chunk: the rows it covers of each sequence, the decompressed stand-ins and
 * the K/V the forward reads (fp8 from pack_prefix_chunk_kv/1, or the stand-ins' own type). */
typedef struct eng_mla_chunk {
    eng_mla_rows rows;
    eng_tensor k_nope, k_pe, v; /* [n][H][nope], [n][rope], [n][H][v_head] */
    eng_tensor k, v_packed;     /* [n][H][nope + rope], [n][H][v_head] */
    int packed;                 /* 1: k / v_packed come from the pack hook */
    float k_scale, v_scale;     /* the pack's per-tensor scales, the forward's layer scales */
} eng_mla_chunk;

/* Where one pass runs: the backend (its memory) or the cpu_ref replay (host copies), and the
 * outputs it writes. */
typedef struct eng_mla_side {
    ap_instance *instance;
    int host; /* 1: read host copies (the replay) */
    DLTensor out, lse, out_chunk, lse_chunk, q_rope_out;
} eng_mla_side;

typedef struct eng_mla {
    eng_context *context;
    const ap_config_rule *rule;
    ap_instance *instance;
    const ap_model *model;
    eng_memory memory;
    eng_rng *rng;
    eng_sequences seqs;
    eng_cache *caches;
    ap_layer *layers;
    int32_t *prefix; /* [num_seqs] prompt tokens cached before the prefill's new ones */
    int32_t new_tokens, prefix_tokens, num_chunks;
    eng_tensor cos_sin;
    /* the prefill: every prompt's latent rows, then the new tokens in the MHA form */
    eng_tensor lat, lat_pos, lat_loc;
    eng_mla_rows new_rows;
    eng_tensor q, k_new, v_new, out, lse, out_chunk, lse_chunk;
    eng_mla_chunk *chunks;
    /* a decode step: q [B][H][576] read as q_nope / q_rope views, new latent rows */
    eng_batch batch;
    eng_tensor q_all, q_rope_rot, lat_step, pos_step, loc_step, out_step;
    int64_t view_shapes[2][3], view_strides[3];
    void *snapshot; /* the last layer's latent pages before the checked step */
} eng_mla;

static double eng_mla_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

static DLTensor eng_mla_dl(const eng_tensor *t, int host) {
    return host ? eng_tensor_host_view(t) : t->dl;
}

/* A tensor of `dtype`, random in [-1, 1) when `fill`, uploaded. */
static ap_status eng_mla_tensor(eng_mla *m, eng_tensor *t, ap_dtype dtype, int ndim,
                                const int64_t *shape, int fill) {
    ap_status status = eng_tensor_make(t, &m->memory, dtype, ndim, shape);
    if (status == AP_OK && fill) eng_tensor_fill_random(t, m->rng);
    if (status == AP_OK) status = eng_tensor_upload(t, &m->memory);
    return status;
}

/* An int32 vector (positions, slots): a 4-byte tensor whose DLPack type says int32. */
static ap_status eng_mla_ints(eng_mla *m, eng_tensor *t, const int32_t *values, int64_t count) {
    ap_status status = eng_tensor_make(t, &m->memory, AP_DTYPE_F32, 1, (int64_t[]){count});
    if (status != AP_OK) return status;
    t->dl.dtype = (DLDataType){kDLInt, 32, 1};
    memcpy(t->host, values, (size_t)count * sizeof(int32_t));
    return eng_tensor_upload(t, &m->memory);
}

/* The cache slot of position `pos` of sequence i: its page table entry, then the offset. */
static int32_t eng_mla_slot(const eng_sequences *seqs, int32_t i, int32_t pos) {
    int32_t page = seqs->page_table[i * seqs->pages_per_seq + pos / seqs->page_size];
    return page * seqs->page_size + pos % seqs->page_size;
}

/* One ragged pass over every sequence: q_len[i] query rows, kv_len[i] key rows. */
static ap_status eng_mla_rows_make(eng_mla *m, eng_mla_rows *r, const int32_t *q_len,
                                   const int32_t *kv_len, int32_t kv_causal) {
    int32_t n = m->seqs.num_seqs, max_q = 0, max_seq = 0;
    size_t counts[ENG_MLA_ARRAYS] = {(size_t)n + 1, (size_t)n, (size_t)n + 1};
    ap_status status = AP_OK;
    for (int a = 0; a < ENG_MLA_ARRAYS && status == AP_OK; a++) {
        r->host[a] = calloc(counts[a], sizeof(int32_t));
        if (r->host[a] == NULL) status = AP_ERR_OUT_OF_MEMORY;
        if (status == AP_OK && m->memory.on_device)
            status =
                eng_mem_alloc(&m->memory, counts[a] * sizeof(int32_t), 256, (void **)&r->device[a]);
    }
    if (status != AP_OK) return status;
    for (int32_t i = 0; i < n; i++) {
        r->host[ENG_MLA_QO][i + 1] = r->host[ENG_MLA_QO][i] + q_len[i];
        r->host[ENG_MLA_KV][i + 1] = r->host[ENG_MLA_KV][i] + kv_len[i];
        r->host[ENG_MLA_SEQ_LENS][i] = m->seqs.prompt_lens[i];
        max_q = q_len[i] > max_q ? q_len[i] : max_q;
        max_seq = m->seqs.prompt_lens[i] > max_seq ? m->seqs.prompt_lens[i] : max_seq;
    }
    for (int a = 0; a < ENG_MLA_ARRAYS && status == AP_OK && m->memory.on_device; a++)
        status = eng_mem_upload(&m->memory, r->device[a], r->host[a], counts[a] * sizeof(int32_t));
    int32_t **arrays = m->memory.on_device ? r->device : r->host;
    r->batch = (ap_batch){.struct_size = sizeof(ap_batch),
                          .mode = AP_MODE_EXTEND,
                          .num_seqs = n,
                          .num_tokens = r->host[ENG_MLA_QO][n],
                          .max_q_len = max_q,
                          .max_seq_len = max_seq,
                          .qo_indptr = arrays[ENG_MLA_QO],
                          .seq_lens = arrays[ENG_MLA_SEQ_LENS],
                          .qo_indptr_host = r->host[ENG_MLA_QO],
                          .seq_lens_host = r->host[ENG_MLA_SEQ_LENS],
                          .kv_indptr = arrays[ENG_MLA_KV],
                          .kv_indptr_host = r->host[ENG_MLA_KV],
                          .num_kv_tokens = r->host[ENG_MLA_KV][n],
                          .kv_causal = kv_causal};
    return status;
}

static void eng_mla_rows_free(eng_mla *m, eng_mla_rows *r) {
    for (int a = 0; a < ENG_MLA_ARRAYS; a++) {
        free(r->host[a]);
        if (r->device[a] != NULL) eng_mem_free(&m->memory, r->device[a]);
    }
}

/* The batch as the replay sees it: every array its host mirror. */
static ap_batch eng_mla_rows_host(const eng_mla_rows *r) {
    ap_batch batch = r->batch;
    batch.qo_indptr = batch.qo_indptr_host;
    batch.seq_lens = batch.seq_lens_host;
    batch.kv_indptr = batch.kv_indptr_host;
    return batch;
}

/* Per-tensor fp8 scale: the largest magnitude maps to e4m3's largest finite value, 448. */
static float eng_mla_fp8_scale(const eng_tensor *t) {
    float amax = 0.0f;
    for (size_t i = 0; i < eng_tensor_count(t); i++)
        amax = fmaxf(amax, fabsf(eng_tensor_get(t, i)));
    return amax > 0.0f ? amax / 448.0f : 1.0f;
}

/* Chunk c: rows [c * CHUNK, (c + 1) * CHUNK) of each prefix (none for a shorter one). With an
 * fp8 cache and the pack hook, K and V are packed to fp8; else the forward reads activations. */
static ap_status eng_mla_chunk_make(eng_mla *m, eng_mla_chunk *c, int32_t index) {
    const ap_model *md = m->model;
    int32_t n = m->seqs.num_seqs, *q_len = calloc((size_t)n, sizeof(int32_t));
    int32_t *kv_len = calloc((size_t)n, sizeof(int32_t)), rows = 0;
    if (q_len == NULL || kv_len == NULL) {
        free(q_len), free(kv_len);
        return AP_ERR_OUT_OF_MEMORY;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t first = index * ENG_MLA_CHUNK, last = first + ENG_MLA_CHUNK;
        last = last < m->prefix[i] ? last : m->prefix[i];
        q_len[i] = m->seqs.prompt_lens[i] - m->prefix[i];
        kv_len[i] = last > first ? last - first : 0;
        rows += kv_len[i];
    }
    ap_status status = eng_mla_rows_make(m, &c->rows, q_len, kv_len, 0);
    free(q_len), free(kv_len);
    int64_t h = md->num_qo_heads, nope = md->qk_nope_head_dim, rope = md->qk_rope_head_dim;
    int64_t dv = md->v_head_dim;
    c->packed = md->kv_dtype == AP_DTYPE_FP8_E4M3 &&
                ap_instance_has_hook(m->instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1);
    ap_dtype kv_type = c->packed ? AP_DTYPE_FP8_E4M3 : md->dtype;
    if (status == AP_OK)
        status = eng_mla_tensor(m, &c->k_nope, md->dtype, 3, (int64_t[]){rows, h, nope}, 1);
    if (status == AP_OK)
        status = eng_mla_tensor(m, &c->k_pe, md->dtype, 2, (int64_t[]){rows, rope}, 1);
    if (status == AP_OK)
        status = eng_mla_tensor(m, &c->v, md->dtype, 3, (int64_t[]){rows, h, dv}, 1);
    /* unpacked, the stand-ins of K and V are random activations of their own */
    if (status == AP_OK)
        status =
            eng_mla_tensor(m, &c->k, kv_type, 3, (int64_t[]){rows, h, nope + rope}, !c->packed);
    if (status == AP_OK)
        status = eng_mla_tensor(m, &c->v_packed, kv_type, 3, (int64_t[]){rows, h, dv}, !c->packed);
    c->k_scale = c->packed ? fmaxf(eng_mla_fp8_scale(&c->k_nope), eng_mla_fp8_scale(&c->k_pe)) : 1;
    c->v_scale = c->packed ? eng_mla_fp8_scale(&c->v) : 1.0f;
    return status;
}

static void eng_mla_chunk_free(eng_mla *m, eng_mla_chunk *c) {
    eng_mla_rows_free(m, &c->rows);
    eng_tensor *all[] = {&c->k_nope, &c->k_pe, &c->v, &c->k, &c->v_packed};
    for (int i = 0; i < 5; i++) eng_tensor_free(all[i], &m->memory);
}

/* Sequences, one latent cache per layer, the RoPE table and the prefill's inputs. The first
 * half of each prompt stands for tokens an earlier chunk (or a prefix-cache hit) cached. */
static ap_status eng_mla_prepare(eng_mla *m, int32_t steps) {
    const eng_args *args = m->context->args;
    const ap_model *md = m->model;
    ap_status status =
        eng_sequences_make(&m->seqs, m->rng, args->batch, args->prompt_len, steps, md->page_size);
    int32_t n = m->seqs.num_seqs;
    m->layers = calloc((size_t)md->num_layers, sizeof(ap_layer));
    m->caches = calloc((size_t)md->num_layers, sizeof(eng_cache));
    m->prefix = calloc((size_t)n, sizeof(int32_t));
    if (status == AP_OK && (m->layers == NULL || m->caches == NULL || m->prefix == NULL))
        status = AP_ERR_OUT_OF_MEMORY;
    ap_kv_spec spec = {sizeof(ap_kv_spec), 0, 0, 0, 0};
    if (status == AP_OK) status = ap_instance_kv_spec(m->instance, &spec);
    for (int32_t l = 0; l < md->num_layers && status == AP_OK; l++) {
        status = eng_cache_make(&m->caches[l], md, &spec, m->seqs.num_pages, &m->memory);
        m->layers[l] = (ap_layer){
            .struct_size = sizeof(ap_layer),
            .layer_id = l,
            .sm_scale = 1.0f / sqrtf((float)(md->qk_nope_head_dim + md->qk_rope_head_dim)),
            .k_scale = md->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1.0f / 64 : 1,
            .v_scale = 1.0f,
            .window_left = -1,
            .kv = &m->caches[l].kv};
    }
    if (status != AP_OK) return status;
    int32_t max_prefix = 0;
    for (int32_t i = 0; i < n; i++) {
        m->prefix[i] = m->seqs.prompt_lens[i] / 2;
        m->prefix_tokens += m->prefix[i];
        m->new_tokens += m->seqs.prompt_lens[i] - m->prefix[i];
        max_prefix = m->prefix[i] > max_prefix ? m->prefix[i] : max_prefix;
    }
    m->num_chunks = (max_prefix + ENG_MLA_CHUNK - 1) / ENG_MLA_CHUNK;
    const eng_cache *c = &m->caches[0];
    printf("  KV cache: %d layers x %d pages of %d tokens, latent %d + rope %d per token in %s, "
           "%.2f MiB in %s memory\n",
           md->num_layers, m->seqs.num_pages, md->page_size, md->kv_lora_rank, md->qk_rope_head_dim,
           ap_dtype_name(md->kv_dtype),
           (double)(c->k_bytes + c->v_bytes) * md->num_layers / (1024.0 * 1024.0),
           m->memory.on_device ? "device" : "host");
    return AP_OK;
}

/* cos_sin [max_position][rope]: cos(p f_i) then sin(p f_i), f_i = 10000^(-2i/rope). */
static ap_status eng_mla_rope_table(eng_mla *m, int32_t positions) {
    int32_t rope = m->model->qk_rope_head_dim, half = rope / 2;
    ap_status status =
        eng_tensor_make(&m->cos_sin, &m->memory, AP_DTYPE_F32, 2, (int64_t[]){positions, rope});
    if (status != AP_OK) return status;
    float *table = m->cos_sin.host;
    for (int32_t p = 0; p < positions; p++)
        for (int32_t i = 0; i < half; i++) {
            double angle = p * pow(10000.0, -2.0 * i / rope);
            table[p * rope + i] = (float)cos(angle);
            table[p * rope + half + i] = (float)sin(angle);
        }
    return eng_tensor_upload(&m->cos_sin, &m->memory);
}

/* The prefill's inputs: every prompt token's latent row and slot, the new tokens' q/k/v in the
 * MHA form, the outputs, and the prefix chunks. */
static ap_status eng_mla_prefill_inputs(eng_mla *m) {
    const ap_model *md = m->model;
    int32_t n = m->seqs.num_seqs, total = m->prefix_tokens + m->new_tokens, at = 0;
    int32_t *pos = calloc((size_t)total, sizeof(int32_t)), *loc = calloc((size_t)total, 4);
    int32_t *q_len = calloc((size_t)n, sizeof(int32_t));
    ap_status status = pos && loc && q_len ? AP_OK : AP_ERR_OUT_OF_MEMORY;
    for (int32_t i = 0; i < n && status == AP_OK; i++) {
        q_len[i] = m->seqs.prompt_lens[i] - m->prefix[i];
        for (int32_t p = 0; p < m->seqs.prompt_lens[i]; p++, at++)
            pos[at] = p, loc[at] = eng_mla_slot(&m->seqs, i, p);
    }
    int64_t t = m->new_tokens, h = md->num_qo_heads, latent = md->head_dim_qk;
    int64_t dk = md->qk_nope_head_dim + md->qk_rope_head_dim, dv = md->v_head_dim;
    if (status == AP_OK) status = eng_mla_ints(m, &m->lat_pos, pos, total);
    if (status == AP_OK) status = eng_mla_ints(m, &m->lat_loc, loc, total);
    if (status == AP_OK)
        status = eng_mla_tensor(m, &m->lat, md->dtype, 3, (int64_t[]){total, 1, latent}, 1);
    if (status == AP_OK) status = eng_mla_rows_make(m, &m->new_rows, q_len, q_len, 1);
    free(pos), free(loc), free(q_len);
    struct {
        eng_tensor *t;
        ap_dtype dtype;
        int ndim;
        int64_t shape[3];
        int fill;
    } all[] = {
        {&m->q, md->dtype, 3, {t, h, dk}, 1},       {&m->k_new, md->dtype, 3, {t, h, dk}, 1},
        {&m->v_new, md->dtype, 3, {t, h, dv}, 1},   {&m->out, md->dtype, 3, {t, h, dv}, 0},
        {&m->lse, AP_DTYPE_F32, 2, {t, h}, 0},      {&m->out_chunk, md->dtype, 3, {t, h, dv}, 0},
        {&m->lse_chunk, AP_DTYPE_F32, 2, {t, h}, 0}};
    for (size_t i = 0; i < sizeof all / sizeof all[0] && status == AP_OK; i++)
        status = eng_mla_tensor(m, all[i].t, all[i].dtype, all[i].ndim, all[i].shape, all[i].fill);
    m->chunks = calloc((size_t)(m->num_chunks > 0 ? m->num_chunks : 1), sizeof(eng_mla_chunk));
    if (status == AP_OK && m->chunks == NULL) status = AP_ERR_OUT_OF_MEMORY;
    for (int32_t c = 0; c < m->num_chunks && status == AP_OK; c++)
        status = eng_mla_chunk_make(m, &m->chunks[c], c);
    return status;
}

/* One ragged forward_extend with the layer's scales replaced by the pass's own. */
static ap_status eng_mla_extend(const eng_mla_side *side, const eng_mla_rows *rows,
                                const ap_layer *layer, float k_scale, float v_scale, DLTensor *q,
                                DLTensor *k, DLTensor *v, DLTensor *out, DLTensor *lse) {
    ap_batch batch = side->host ? eng_mla_rows_host(rows) : rows->batch;
    ap_layer pass = *layer;
    pass.k_scale = k_scale, pass.v_scale = v_scale;
    pass.kv = NULL; /* the ragged source reads no cache */
    ap_forward_args args = {
        .struct_size = sizeof args, .q = q, .k = k, .v = v, .out = out, .lse = lse};
    ap_status status = ap_instance_init_metadata(side->instance, &batch, NULL);
    if (status == AP_OK) status = ap_instance_forward_extend(side->instance, &pass, &args, NULL);
    return status;
}

/* One layer's chunked-prefix prefill in MLA's MHA form:
 *   (out, lse)     = attention of the new tokens over their own K/V, causal
 *   for each chunk:  pack its stand-ins (fp8), (o_c, lse_c) = attention over it, no mask,
 *                    (out, lse) = merge_state((out, lse), (o_c, lse_c))
 * The latent rows were appended first (the backend side only: the replay reads no cache). */
static ap_status eng_mla_prefill_layer(eng_mla *m, eng_mla_side *side, const ap_layer *layer) {
    int host = side->host;
    DLTensor q = eng_mla_dl(&m->q, host), k = eng_mla_dl(&m->k_new, host);
    DLTensor v = eng_mla_dl(&m->v_new, host);
    ap_status status =
        eng_mla_extend(side, &m->new_rows, layer, 1.0f, 1.0f, &q, &k, &v, &side->out, &side->lse);
    for (int32_t c = 0; c < m->num_chunks && status == AP_OK; c++) {
        eng_mla_chunk *chunk = &m->chunks[c];
        DLTensor k_nope = eng_mla_dl(&chunk->k_nope, host), k_pe = eng_mla_dl(&chunk->k_pe, host);
        DLTensor v_in = eng_mla_dl(&chunk->v, host), k_out = eng_mla_dl(&chunk->k, host);
        DLTensor v_out = eng_mla_dl(&chunk->v_packed, host);
        if (chunk->packed) {
            ap_pack_kv_args pack = {sizeof pack, &k_nope, &k_pe,          &v_in,
                                    &k_out,      &v_out,  chunk->k_scale, chunk->v_scale};
            status = ap_instance_pack_prefix_chunk_kv(side->instance, &pack, NULL);
        }
        if (status == AP_OK)
            status = eng_mla_extend(side, &chunk->rows, layer, chunk->k_scale, chunk->v_scale, &q,
                                    &k_out, &v_out, &side->out_chunk, &side->lse_chunk);
        ap_merge_state_args merge = {sizeof merge,     &side->out, &side->lse, &side->out_chunk,
                                     &side->lse_chunk, &side->out, &side->lse};
        if (status == AP_OK) status = ap_instance_merge_state(side->instance, &merge, NULL);
    }
    return status;
}

/* Every layer: append the prompts' latent rows (k_pe rotated), then the chunked prefill. */
static ap_status eng_mla_prefill(eng_mla *m, double *ms) {
    eng_mla_side side = {m->instance,     0,  m->out.dl, m->lse.dl, m->out_chunk.dl,
                         m->lse_chunk.dl, {0}};
    ap_append_kv_args append = {.struct_size = sizeof append,
                                .k = &m->lat.dl,
                                .positions = &m->lat_pos.dl,
                                .out_loc = &m->lat_loc.dl,
                                .cos_sin = &m->cos_sin.dl,
                                .rotary_dim = m->model->qk_rope_head_dim,
                                .is_neox = 0};
    double start = eng_mla_now_ms();
    ap_status status = AP_OK;
    for (int32_t l = 0; l < m->model->num_layers && status == AP_OK; l++) {
        status = ap_instance_append_kv(m->instance, &m->layers[l], &append, NULL);
        if (status == AP_OK) status = eng_mla_prefill_layer(m, &side, &m->layers[l]);
    }
    if (status == AP_OK) status = eng_mem_sync(&m->memory);
    *ms = eng_mla_now_ms() - start;
    for (int32_t i = 0; i < m->seqs.num_seqs; i++) m->seqs.seq_lens[i] = m->seqs.prompt_lens[i];
    return status;
}

/* q_nope [B][H][512] and q_rope [B][H][64]: views into q_all [B][H][576], read in place. */
static void eng_mla_q_views(eng_mla *m, int host, DLTensor *q_nope, DLTensor *q_rope) {
    const ap_model *md = m->model;
    int64_t b = m->q_all.shape[0], h = md->num_qo_heads, width = md->head_dim_qk;
    m->view_shapes[0][0] = m->view_shapes[1][0] = b;
    m->view_shapes[0][1] = m->view_shapes[1][1] = h;
    m->view_shapes[0][2] = md->kv_lora_rank;
    m->view_shapes[1][2] = md->qk_rope_head_dim;
    m->view_strides[0] = h * width, m->view_strides[1] = width, m->view_strides[2] = 1;
    *q_nope = eng_mla_dl(&m->q_all, host);
    q_nope->shape = m->view_shapes[0];
    q_nope->strides = m->view_strides;
    *q_rope = *q_nope;
    q_rope->shape = m->view_shapes[1];
    q_rope->byte_offset += (uint64_t)md->kv_lora_rank * (ap_dtype_size_bits(md->dtype) / 8);
}

/* One layer of a decode step: the new latent row appended (k_pe and q_rope rotated, q_rope into
 * q_rope_rot), then absorbed attention over the latent cache. */
static ap_status eng_mla_decode_layer(eng_mla *m, eng_mla_side *side, const ap_layer *layer) {
    int host = side->host;
    DLTensor q_nope, q_rope, k = eng_mla_dl(&m->lat_step, host);
    DLTensor pos = eng_mla_dl(&m->pos_step, host), loc = eng_mla_dl(&m->loc_step, host);
    DLTensor cos_sin = eng_mla_dl(&m->cos_sin, host);
    eng_mla_q_views(m, host, &q_nope, &q_rope);
    ap_append_kv_args append = {sizeof append, &q_rope,  &side->q_rope_out,          &k, NULL, &pos,
                                &loc,          &cos_sin, m->model->qk_rope_head_dim, 0};
    ap_status status = ap_instance_append_kv(side->instance, layer, &append, NULL);
    ap_forward_args args = {
        .struct_size = sizeof args, .q = &q_nope, .out = &side->out, .q_rope = &side->q_rope_out};
    if (status == AP_OK) status = ap_instance_forward_decode(side->instance, layer, &args, NULL);
    return status;
}

/* The next decode step's batch and inputs: one token per sequence at its next position. */
static ap_status eng_mla_step_inputs(eng_mla *m) {
    const ap_model *md = m->model;
    eng_tensor *all[] = {&m->q_all,    &m->q_rope_rot, &m->lat_step,
                         &m->pos_step, &m->loc_step,   &m->out_step};
    for (int i = 0; i < 6; i++) eng_tensor_free(all[i], &m->memory);
    eng_batch_free(&m->batch, &m->memory);
    ap_status status = eng_batch_make(&m->batch, &m->seqs, AP_MODE_DECODE, 1, &m->memory);
    int32_t n = m->seqs.num_seqs, *loc = calloc((size_t)n, sizeof(int32_t));
    if (status == AP_OK && loc == NULL) status = AP_ERR_OUT_OF_MEMORY;
    for (int32_t i = 0; i < n && status == AP_OK; i++)
        loc[i] = eng_mla_slot(&m->seqs, i, m->seqs.seq_lens[i] - 1);
    int64_t b = n, h = md->num_qo_heads;
    if (status == AP_OK)
        status = eng_mla_tensor(m, &m->q_all, md->dtype, 3, (int64_t[]){b, h, md->head_dim_qk}, 1);
    if (status == AP_OK)
        status = eng_mla_tensor(m, &m->q_rope_rot, md->dtype, 3,
                                (int64_t[]){b, h, md->qk_rope_head_dim}, 0);
    if (status == AP_OK)
        status =
            eng_mla_tensor(m, &m->lat_step, md->dtype, 3, (int64_t[]){b, 1, md->head_dim_qk}, 1);
    if (status == AP_OK)
        status =
            eng_mla_tensor(m, &m->out_step, md->dtype, 3, (int64_t[]){b, h, md->kv_lora_rank}, 0);
    if (status == AP_OK) status = eng_mla_ints(m, &m->pos_step, m->batch.host[5], b);
    if (status == AP_OK) status = eng_mla_ints(m, &m->loc_step, loc, b);
    free(loc);
    return status;
}

/* A host copy of the last layer's latent pages: the state its next step starts from. */
static ap_status eng_mla_snapshot(eng_mla *m) {
    const eng_cache *c = &m->caches[m->model->num_layers - 1];
    free(m->snapshot);
    m->snapshot = malloc(c->k_bytes ? c->k_bytes : 1);
    if (m->snapshot == NULL) return AP_ERR_OUT_OF_MEMORY;
    return eng_mem_download(&m->memory, m->snapshot, c->kv.k_pages, c->k_bytes);
}

static ap_status eng_mla_decode_step(eng_mla *m, int checked, double *ms) {
    ap_status status = eng_mla_step_inputs(m);
    if (status == AP_OK && checked) status = eng_mla_snapshot(m);
    if (status != AP_OK) return status;
    eng_mla_side side = {m->instance, 0, m->out_step.dl, {0}, {0}, {0}, m->q_rope_rot.dl};
    double start = eng_mla_now_ms();
    status = ap_instance_init_metadata(m->instance, &m->batch.batch, NULL);
    for (int32_t l = 0; l < m->model->num_layers && status == AP_OK; l++)
        status = eng_mla_decode_layer(m, &side, &m->layers[l]);
    if (status == AP_OK) status = eng_mem_sync(&m->memory);
    *ms = eng_mla_now_ms() - start;
    return status;
}

/* Replay the last layer of the prefill (decode = 0) or of the last decode step on cpu_ref,
 * from the same host inputs, and compare the output by relative L2 error. */
static eng_outcome eng_mla_check(eng_mla *m, int decode) {
    eng_tensor *got = decode ? &m->out_step : &m->out;
    if (eng_tensor_download(got, &m->memory) != AP_OK) {
        printf("  error: reading the output back: %s\n", eng_mem_error());
        return ENG_FAILED;
    }
    for (size_t i = 0; i < eng_tensor_count(got); i++)
        if (!isfinite(eng_tensor_get(got, i))) {
            printf("  error: the %s output holds NaN or inf\n", decode ? "decode" : "prefill");
            return ENG_FAILED;
        }
    if (strcmp(ap_instance_backend(m->instance), "cpu_ref") == 0) {
        printf("  check: cpu_ref is the reference itself; outputs all finite\n");
        return ENG_RAN;
    }
    char why[1024] = "";
    ap_instance *ref = NULL;
    if (eng_open_cpu_ref(m->context->registry, m->model, &m->rule->options, &ref, why,
                         sizeof why) != AP_OK) {
        printf("  check: skipped: %s\n", why);
        return ENG_RAN;
    }
    eng_memory host = {0, -1};
    eng_tensor want, lse, out_chunk, lse_chunk, q_rope;
    memset(&lse, 0, sizeof lse), memset(&out_chunk, 0, sizeof out_chunk);
    memset(&lse_chunk, 0, sizeof lse_chunk), memset(&q_rope, 0, sizeof q_rope);
    ap_status status = eng_tensor_make(&want, &host, got->dtype, got->dl.ndim, got->shape);
    if (status == AP_OK) memset(want.host, 0xff, want.bytes); /* unwritten shows as NaN */
    eng_mla_side side = {ref, 1, eng_tensor_host_view(&want), {0}, {0}, {0}, {0}};
    int32_t last = m->model->num_layers - 1;
    ap_layer layer = m->layers[last];
    ap_kv_cache kv = m->caches[last].kv;
    if (status == AP_OK && decode) {
        kv.k_pages = m->snapshot;
        layer.kv = &kv;
        status = eng_tensor_make(&q_rope, &host, m->q_rope_rot.dtype, 3, m->q_rope_rot.shape);
        side.q_rope_out = eng_tensor_host_view(&q_rope);
        ap_batch batch = eng_batch_host(&m->batch);
        if (status == AP_OK) status = ap_instance_init_metadata(ref, &batch, NULL);
        if (status == AP_OK) status = eng_mla_decode_layer(m, &side, &layer);
    } else if (status == AP_OK) {
        status = eng_tensor_make(&lse, &host, AP_DTYPE_F32, 2, m->lse.shape);
        if (status == AP_OK) status = eng_tensor_make(&out_chunk, &host, got->dtype, 3, got->shape);
        if (status == AP_OK)
            status = eng_tensor_make(&lse_chunk, &host, AP_DTYPE_F32, 2, m->lse.shape);
        side.lse = eng_tensor_host_view(&lse);
        side.out_chunk = eng_tensor_host_view(&out_chunk);
        side.lse_chunk = eng_tensor_host_view(&lse_chunk);
        if (status == AP_OK) status = eng_mla_prefill_layer(m, &side, &layer);
    }
    double error = NAN;
    if (status == AP_OK)
        error = eng_tensor_rel_l2(got, &want);
    else
        printf("  check: error: cpu_ref failed to replay: %s\n", ap_last_error());
    eng_tensor *all[] = {&want, &lse, &out_chunk, &lse_chunk, &q_rope};
    for (int i = 0; i < 5; i++) eng_tensor_free(all[i], &host);
    ap_instance_close(ref);
    if (status != AP_OK) return ENG_FAILED;
    double limit = eng_check_tolerance(m->model->kv_dtype);
    int pass = isfinite(error) && error <= limit;
    printf("  check vs cpu_ref (layer %d, %s, %d sequences): rel L2 error %.3e (limit %.0e): %s\n",
           last, decode ? "last decode step" : "prefill", m->seqs.num_seqs, error, limit,
           pass ? "ok" : "FAIL");
    return pass ? ENG_RAN : ENG_FAILED;
}

static void eng_mla_rate(const char *what, int64_t tokens, int32_t layers, double ms) {
    printf("  %s: %lld tokens x %d layers in %.3f ms: %.0f tokens/s\n", what, (long long)tokens,
           layers, ms, ms > 0.0 ? (double)tokens / (ms / 1e3) : 0.0);
}

/* The prefill, checked; then the decode steps, the last one checked. */
static eng_outcome eng_mla_steps(eng_mla *m, int32_t steps) {
    const ap_model *md = m->model;
    printf("  batch: %d sequences, prompt lengths", m->seqs.num_seqs);
    for (int32_t i = 0; i < m->seqs.num_seqs; i++) printf(" %d", m->seqs.prompt_lens[i]);
    printf(" (%d tokens)\n", m->prefix_tokens + m->new_tokens);
    printf("  chunked prefix: %d cached prompt tokens, %d chunks of up to %d per sequence, %s, "
           "merged by merge_state/1\n",
           m->prefix_tokens, m->num_chunks, ENG_MLA_CHUNK,
           m->num_chunks > 0 && m->chunks[0].packed ? "packed to fp8 by pack_prefix_chunk_kv/1"
                                                    : "K/V in the activation type");
    double ms = 0.0, total_ms = 0.0;
    ap_status status = eng_mla_prefill(m, &ms);
    if (status != AP_OK) {
        printf("  error: prefill failed: %s: %s\n", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
        return ENG_FAILED;
    }
    eng_mla_rate("prefill", m->new_tokens, md->num_layers, ms);
    eng_outcome outcome = eng_mla_check(m, 0);
    for (int32_t s = 0; s < steps && outcome == ENG_RAN; s++) {
        status = eng_mla_decode_step(m, s == steps - 1, &ms);
        if (status != AP_OK) {
            printf("  error: decode step %d failed: %s: %s\n", s + 1, ap_status_name(status),
                   status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
            return ENG_FAILED;
        }
        char label[48];
        snprintf(label, sizeof label, "decode step %d", s + 1);
        eng_mla_rate(label, m->seqs.num_seqs, md->num_layers, ms);
        total_ms += ms;
    }
    if (outcome != ENG_RAN || steps == 0) return outcome;
    printf("  decode: %d steps, %.3f ms/step mean, %.0f tokens/s\n", steps, total_ms / steps,
           total_ms > 0.0 ? (double)steps * m->seqs.num_seqs / (total_ms / 1e3) : 0.0);
    return eng_mla_check(m, 1);
}

static void eng_mla_free(eng_mla *m) {
    eng_tensor *all[] = {&m->cos_sin,   &m->lat,     &m->lat_pos,    &m->lat_loc,  &m->q,
                         &m->k_new,     &m->v_new,   &m->out,        &m->lse,      &m->out_chunk,
                         &m->lse_chunk, &m->q_all,   &m->q_rope_rot, &m->lat_step, &m->pos_step,
                         &m->loc_step,  &m->out_step};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) eng_tensor_free(all[i], &m->memory);
    for (int32_t c = 0; m->chunks != NULL && c < m->num_chunks; c++)
        eng_mla_chunk_free(m, &m->chunks[c]);
    eng_mla_rows_free(m, &m->new_rows);
    eng_batch_free(&m->batch, &m->memory);
    for (int32_t l = 0; m->caches != NULL && l < m->model->num_layers; l++)
        eng_cache_free(&m->caches[l], &m->memory);
    free(m->chunks), free(m->caches), free(m->layers), free(m->prefix), free(m->snapshot);
    eng_sequences_free(&m->seqs);
}

eng_outcome eng_mla_run(eng_context *context, const ap_config_rule *rule, ap_instance *instance,
                        const eng_memory *memory, eng_rng *rng) {
    eng_mla m;
    memset(&m, 0, sizeof m);
    m.context = context, m.rule = rule, m.instance = instance, m.memory = *memory, m.rng = rng;
    m.model = ap_instance_model(instance);
    printf("  backend: %s on %s\n", ap_instance_backend(instance),
           memory->on_device ? context->device.name : "the CPU (host memory)");
    const char *needed[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_MERGE_STATE_V1};
    for (int i = 0; i < 2; i++)
        if (!ap_instance_has_hook(instance, needed[i])) {
            printf("  error: this engine drives MLA through the %s hook, which %s lacks\n",
                   needed[i], ap_instance_backend(instance));
            return ENG_FAILED;
        }
    if (m.model->qk_nope_head_dim <= 0 || m.model->v_head_dim <= 0) {
        printf("  error: the MLA model has no qk_nope_head_dim/v_head_dim for its prefill\n");
        return ENG_FAILED;
    }
    int32_t steps = context->args->steps;
    ap_status status = eng_mla_prepare(&m, steps);
    if (status == AP_OK) status = eng_mla_rope_table(&m, context->args->prompt_len + steps + 1);
    if (status == AP_OK) status = eng_mla_prefill_inputs(&m);
    eng_outcome outcome = ENG_FAILED;
    if (status != AP_OK)
        printf("  error: allocating: %s: %s\n", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
    else
        outcome = eng_mla_steps(&m, steps);
    eng_mla_free(&m);
    return outcome;
}
