/* engine_mla_inputs.c: an MLA run's inputs: sequences, latent caches, tensors and batches. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_mla.h"

DLTensor eng_mla_dl(const eng_tensor *t, int host) {
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
ap_batch eng_mla_rows_host(const eng_mla_rows *r) {
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
ap_status eng_mla_prepare(eng_mla *m, int32_t steps) {
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
ap_status eng_mla_rope_table(eng_mla *m, int32_t positions) {
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
ap_status eng_mla_prefill_inputs(eng_mla *m) {
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

/* The next decode step's batch and inputs: one token per sequence at its next position. */
ap_status eng_mla_step_inputs(eng_mla *m) {
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

void eng_mla_free(eng_mla *m) {
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
