/* plan.c: fa_varlen's init_metadata: which K/V source a batch reads, its work list and slots. */
#include "backends/common/prefill_internal.h"
#include "fav.h"

#define FAV_PLAN_WHO FAV_NAME ": plan"

static size_t fav_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* The prefill's work items for the model's largest batch. */
size_t fav_plan_item_bytes(const ap_model *m) {
    return fav_align16(ap_kit_prefill_plan_bytes(m->max_tokens, m->max_batch, m->head_dim_qk,
                                                 m->head_dim_v, m->num_qo_heads, m->num_kv_heads));
}

/* One buffer per instance: the work items first, then one slot per new token (save_kv). */
size_t fav_plan_buffer_bytes(const ap_model *m) {
    return fav_plan_item_bytes(m) + fav_align16((size_t)m->max_tokens * sizeof(int32_t));
}

/* The rows of q (and of a ragged k / v): from 0, never decreasing, ending at the totals; the
 * counts within the model's limits. The core checks this; a third-party core may not, and the
 * plan indexes by it. */
static ap_status fav_check_indptr(const int32_t *indptr, int32_t n, int32_t total, const char *what,
                                  ap_msgbuf *msg) {
    if (indptr == NULL) {
        ap_msgbuf_add(msg, FAV_PLAN_WHO ": %s needs its host mirror", what);
        return AP_ERR_INVALID_ARGUMENT;
    }
    for (int32_t i = 0; i < n; i++) {
        if (indptr[i + 1] < indptr[i] || (i == 0 && indptr[0] != 0)) {
            ap_msgbuf_add(msg, FAV_PLAN_WHO ": %s does not start at 0 or decreases at sequence %d",
                          what, i);
            return AP_ERR_INVALID_ARGUMENT;
        }
    }
    if (indptr[n] != total) {
        ap_msgbuf_add(msg, FAV_PLAN_WHO ": %s ends at %d, not %d", what, indptr[n], total);
        return AP_ERR_SHAPE_MISMATCH;
    }
    return AP_OK;
}

/* Page-less batches: the ragged source (kv_indptr) or skip-KV (the new tokens' own k/v). */
static ap_status fav_check_ragged(const ap_backend *b, const ap_batch *batch, int skip,
                                  ap_msgbuf *msg) {
    if (batch->mode != AP_MODE_EXTEND || batch->num_seqs < 0 ||
        batch->num_seqs > b->model.max_batch || batch->num_tokens > b->model.max_tokens) {
        ap_msgbuf_add(msg,
                      FAV_PLAN_WHO ": a batch without the cache is an extend of at most %d "
                                   "sequences and %d tokens",
                      b->model.max_batch, b->model.max_tokens);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fav_check_indptr(batch->qo_indptr_host, batch->num_seqs, batch->num_tokens,
                                    "qo_indptr", msg);
    if (st == AP_OK && !skip)
        st = fav_check_indptr(batch->kv_indptr_host, batch->num_seqs, batch->num_kv_tokens,
                              "kv_indptr", msg);
    if (st != AP_OK || !skip) return st;
    for (int32_t i = 0; batch->seq_lens_host != NULL && i < batch->num_seqs; i++) {
        const int32_t q_len = batch->qo_indptr_host[i + 1] - batch->qo_indptr_host[i];
        if (batch->seq_lens_host[i] != q_len) {
            ap_msgbuf_add(msg,
                          FAV_PLAN_WHO ": sequence %d has a prefix (seq_len %d, %d new tokens) "
                                       "but the batch has no page arrays to read it from",
                          i, batch->seq_lens_host[i], q_len);
            return AP_ERR_INVALID_ARGUMENT;
        }
    }
    return AP_OK;
}

/* The slot of every new token: page * page_size + offset of position seq_len - q_len + j. */
static void fav_plan_slots(const ap_backend *b, const ap_batch *batch, int32_t *slots) {
    const int32_t ps = b->model.page_size;
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        const int32_t *pages = batch->kv_page_indices_host + batch->kv_page_indptr_host[i];
        const int32_t q0 = batch->qo_indptr_host[i], q_len = batch->qo_indptr_host[i + 1] - q0;
        const int32_t prefix = batch->seq_lens_host[i] - q_len;
        for (int32_t j = 0; j < q_len; j++)
            slots[q0 + j] = pages[(prefix + j) / ps] * ps + (prefix + j) % ps;
    }
}

/* Which source the batch reads, after its checks. */
static ap_status fav_plan_source(ap_backend *b, const ap_batch *batch, ap_msgbuf *msg) {
    fav_plan *p = &b->plan;
    const int ragged = AP_HAS_FIELD(batch, ap_batch, kv_causal) && batch->kv_indptr != NULL;
    p->has_pages = batch->kv_page_indptr != NULL && batch->kv_page_indices != NULL &&
                   batch->kv_last_page_len != NULL;
    if (ragged || !p->has_pages) {
        p->source = FAV_SOURCE_RAGGED;
        p->skip_kv = !ragged;
        if (p->skip_kv && !b->model.embedding) {
            ap_msgbuf_add(msg, FAV_PLAN_WHO ": a batch without page arrays or kv_indptr is the "
                                            "embedding skip-KV form, and the model is not an "
                                            "embedding model");
            return AP_ERR_INVALID_ARGUMENT;
        }
        return fav_check_ragged(b, batch, p->skip_kv, msg);
    }
    if (b->kv_mode == FAV_KV_SKIP) {
        ap_msgbuf_add(msg, FAV_PLAN_WHO ": this instance skips the KV cache (embedding model, "
                                        "prefix caching off: its kv spec is 0 bytes); plan the "
                                        "batch without page arrays");
        return AP_ERR_INVALID_ARGUMENT;
    }
    p->source = FAV_SOURCE_PAGED;
    return ap_kit_batch_check(batch, &b->model, &p->max_page, FAV_PLAN_WHO, msg);
}

static ap_status fav_plan_items(ap_backend *b, const ap_batch *batch, void *stream,
                                ap_msgbuf *msg) {
    fav_plan *p = &b->plan;
    const ap_model *m = &b->model;
    const int paged = p->source == FAV_SOURCE_PAGED;
    ap_kit_prefill_plan_args args = {
        .num_seqs = batch->num_seqs,
        .qo_indptr_host = batch->qo_indptr_host,
        .kv_page_indptr_host = paged ? batch->kv_page_indptr_host : NULL,
        .kv_last_page_len_host = paged ? batch->kv_last_page_len_host : NULL,
        .page_size = m->page_size,
        .kv_indptr_host = paged        ? NULL
                          : p->skip_kv ? batch->qo_indptr_host
                                       : batch->kv_indptr_host,
        .head_dim_qk = m->head_dim_qk,
        .head_dim_v = m->head_dim_v,
        .num_qo_heads = m->num_qo_heads,
        .num_kv_heads = m->num_kv_heads,
        .causal = paged || p->skip_kv ? m->causal : batch->kv_causal,
        .tile_rows = 0,
        .host_scratch = b->buffer.host,
        .device_buffer = b->buffer.dev,
        .buffer_bytes = b->item_bytes,
        .caller_uploads = 1,
        /* the model's K/V type: a 16-bit one lets the kit plan for its Hopper kernel where it
         * serves the shape; raw fp8 k/v then need a model whose kv_dtype says fp8_e4m3. A paged
         * fp8 cache is staged to 16 bits where the plan is then the Hopper kernel's (its paged
         * source reads 16-bit K/V only), else read as stored by mma.sync: the kit's
         * ap_kit_prefill_plan_staged sets the type */
        .kv_dtype = m->kv_dtype,
        /* the Hopper kernel's dynamic schedule (this instance's launches run one at a time),
         * unless the schedule option says rounds */
        .tile_counters = b->rounds ? NULL : b->buffer.tile_counters,
        .split_space = &b->buffer, /* split-KV for a short chunk over a long prefix */
    };
    p->staged = 0;
    if (!paged) return ap_kit_prefill_plan_build(&args, stream, &p->prefill, FAV_PLAN_WHO, msg);
    return ap_kit_prefill_plan_staged(&args, m, batch->kv_page_indptr_host[batch->num_seqs],
                                      &b->stage, stream, &p->prefill, &p->staged, FAV_PLAN_WHO,
                                      msg);
}

/* One plan per batch, shared by every layer: the source, the work list and (paged) the slots,
 * moved to the device in one copy. */
ap_status fav_init_metadata(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg) {
    if (b == NULL || batch == NULL || batch->struct_size < offsetof(ap_batch, kv_indptr)) {
        ap_msgbuf_add(msg, FAV_NAME ": init_metadata needs an instance and a batch");
        return AP_ERR_INVALID_ARGUMENT;
    }
    fav_plan *p = &b->plan;
    memset(p, 0, sizeof *p);
    ap_status st = fav_plan_source(b, batch, msg);
    if (st == AP_OK) st = ap_kit_plan_buffer_begin(&b->buffer, FAV_NAME, msg);
    if (st == AP_OK) st = fav_plan_items(b, batch, stream, msg);
    if (st != AP_OK) return st;
    size_t upload = (size_t)p->prefill.num_items * sizeof(ap_kit_prefill_item);
    if (p->source == FAV_SOURCE_PAGED && batch->num_tokens > 0) {
        fav_plan_slots(b, batch, (int32_t *)((char *)b->buffer.host + b->item_bytes));
        upload = b->item_bytes + (size_t)batch->num_tokens * sizeof(int32_t);
        p->slots = (const int32_t *)((const char *)b->buffer.dev + b->item_bytes);
    }
    if (upload > 0) st = ap_kit_plan_buffer_upload(&b->buffer, upload, stream, FAV_NAME, msg);
    if (st != AP_OK) return st;
    p->mode = batch->mode;
    p->num_tokens = batch->num_tokens;
    p->qo_indptr = batch->qo_indptr;
    if (p->source == FAV_SOURCE_RAGGED) { /* kv_indptr is read only where the batch has it */
        p->num_kv_tokens = p->skip_kv ? batch->num_tokens : batch->num_kv_tokens;
        p->kv_indptr = p->skip_kv ? batch->qo_indptr : batch->kv_indptr;
    }
    p->kv_page_indptr = batch->kv_page_indptr;
    p->kv_page_indices = batch->kv_page_indices;
    p->kv_last_page_len = batch->kv_last_page_len;
    p->ready = 1;
    return AP_OK;
}
