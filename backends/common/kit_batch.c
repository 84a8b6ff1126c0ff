/* kit_batch.c: the batch rules a plan indexes by, checked from the host mirrors (kit.h), and the
 * plan arguments of a paged-source batch (prefill.h). */
#include <limits.h>

#include "kit.h"
#include "prefill.h"

/* Counts, pointers and the ends of both indptrs: nothing that walks the sequences. */
static ap_status ap_kit_batch_check_arrays(const ap_batch *batch, const ap_model *model,
                                           const char *who, ap_msgbuf *msg) {
    if (batch->struct_size < sizeof(ap_batch)) {
        ap_msgbuf_add(msg, "%s: ap_batch struct_size %zu < %zu", who, batch->struct_size,
                      sizeof(ap_batch));
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->mode != AP_MODE_DECODE && batch->mode != AP_MODE_EXTEND) {
        ap_msgbuf_add(msg, "%s: unknown batch mode %d", who, (int)batch->mode);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->num_seqs < 0 || batch->num_seqs > model->max_batch || batch->num_tokens < 0 ||
        batch->num_tokens > model->max_tokens) {
        ap_msgbuf_add(msg,
                      "%s: %d sequences and %d tokens exceed the model's limits (%d sequences, "
                      "%d tokens)",
                      who, batch->num_seqs, batch->num_tokens, model->max_batch, model->max_tokens);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (batch->qo_indptr_host == NULL || batch->kv_page_indptr_host == NULL ||
        batch->kv_page_indices_host == NULL || batch->kv_last_page_len_host == NULL ||
        batch->seq_lens_host == NULL || batch->qo_indptr == NULL || batch->kv_page_indptr == NULL ||
        batch->kv_page_indices == NULL || batch->kv_last_page_len == NULL) {
        ap_msgbuf_add(msg,
                      "%s: the batch needs qo_indptr, the page arrays (device and host mirrors) "
                      "and seq_lens_host",
                      who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int32_t *qo = batch->qo_indptr_host;
    const int32_t *pages = batch->kv_page_indptr_host;
    if (qo[0] != 0 || qo[batch->num_seqs] != batch->num_tokens || pages[0] != 0 ||
        pages[batch->num_seqs] != batch->num_pages_total || batch->num_pages_total < 0) {
        ap_msgbuf_add(msg,
                      "%s: qo_indptr must run from 0 to num_tokens %d and kv_page_indptr from 0 "
                      "to num_pages_total %d",
                      who, batch->num_tokens, batch->num_pages_total);
        return AP_ERR_SHAPE_MISMATCH;
    }
    return AP_OK;
}

/* Per sequence: q_len >= 0 (exactly 1 in decode), seq_len >= q_len, and its pages (at least
 * one) hold seq_len: (pages - 1) * page_size + last_page_len == seq_len. */
static ap_status ap_kit_batch_check_seqs(const ap_batch *batch, int32_t page_size, const char *who,
                                         ap_msgbuf *msg) {
    const int32_t ps = page_size;
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        /* compared before subtracting: a difference that wraps would pass as >= 0, and the
         * slots and page reads of a plan would follow it outside the arrays */
        if (batch->qo_indptr_host[i + 1] < batch->qo_indptr_host[i] ||
            batch->kv_page_indptr_host[i + 1] < batch->kv_page_indptr_host[i]) {
            ap_msgbuf_add(msg, "%s: qo_indptr or kv_page_indptr decreases at sequence %d", who, i);
            return AP_ERR_SHAPE_MISMATCH;
        }
        int32_t q_len = batch->qo_indptr_host[i + 1] - batch->qo_indptr_host[i];
        int32_t seq_len = batch->seq_lens_host[i];
        int32_t pages = batch->kv_page_indptr_host[i + 1] - batch->kv_page_indptr_host[i];
        int32_t last = batch->kv_last_page_len_host[i];
        if (q_len < 0 || (batch->mode == AP_MODE_DECODE && q_len != 1) || seq_len < q_len) {
            ap_msgbuf_add(msg, "%s: sequence %d has %d new tokens and seq_len %d%s", who, i, q_len,
                          seq_len,
                          batch->mode == AP_MODE_DECODE ? " (decode needs exactly 1 new)" : "");
            return AP_ERR_SHAPE_MISMATCH;
        }
        int ok =
            pages >= 1 && last >= 1 && last <= ps && (int64_t)(pages - 1) * ps + last == seq_len;
        if (!ok) {
            ap_msgbuf_add(msg,
                          "%s: sequence %d: %d pages of %d with last_page_len %d do not hold "
                          "seq_len %d (every sequence has at least one page)",
                          who, i, pages, ps, last, seq_len);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

/* Every page index >= 0 and its slots (page * page_size + offset) below 2^31; the largest. */
static ap_status ap_kit_batch_check_pages(const ap_batch *batch, int32_t page_size,
                                          int32_t *max_page, const char *who, ap_msgbuf *msg) {
    const int32_t ps = page_size;
    int32_t largest = -1;
    for (int32_t p = 0; p < batch->num_pages_total; p++) {
        int32_t page = batch->kv_page_indices_host[p];
        if (page < 0 || (int64_t)page * ps + ps - 1 > INT32_MAX) {
            ap_msgbuf_add(msg, "%s: page index %d (entry %d) is negative or its slots pass 2^31",
                          who, page, p);
            return AP_ERR_SHAPE_MISMATCH;
        }
        if (page > largest) largest = page;
    }
    *max_page = largest;
    return AP_OK;
}

ap_status ap_kit_batch_check(const ap_batch *batch, const ap_model *model, int32_t *max_page,
                             const char *who, ap_msgbuf *msg) {
    ap_status st = ap_kit_batch_check_arrays(batch, model, who, msg);
    if (st == AP_OK) st = ap_kit_batch_check_seqs(batch, model->page_size, who, msg);
    if (st == AP_OK) st = ap_kit_batch_check_pages(batch, model->page_size, max_page, who, msg);
    return st;
}

int32_t ap_kit_batch_fresh(const ap_batch *batch, int32_t page_size) {
    if (batch == NULL || batch->qo_indptr_host == NULL || batch->kv_page_indptr_host == NULL ||
        batch->kv_last_page_len_host == NULL)
        return 0;
    for (int32_t i = 0; i < batch->num_seqs; ++i) {
        const int64_t pages = batch->kv_page_indptr_host[i + 1] - batch->kv_page_indptr_host[i];
        const int64_t kv_len =
            pages > 0 ? (pages - 1) * page_size + batch->kv_last_page_len_host[i] : 0;
        if (kv_len != (int64_t)batch->qo_indptr_host[i + 1] - batch->qo_indptr_host[i]) return 0;
    }
    return 1;
}

ap_dtype ap_kit_staged_kv_dtype(const ap_model *m) {
    return m->kv_dtype == AP_DTYPE_NVFP4 || m->kv_dtype == AP_DTYPE_FP8_E4M3 ? m->dtype
                                                                             : m->kv_dtype;
}

ap_kit_prefill_plan_args ap_kit_prefill_paged_args(const ap_model *model, const ap_batch *batch) {
    return (ap_kit_prefill_plan_args){
        .num_seqs = batch->num_seqs,
        .qo_indptr_host = batch->qo_indptr_host,
        .kv_page_indptr_host = batch->kv_page_indptr_host,
        .kv_last_page_len_host = batch->kv_last_page_len_host,
        .page_size = model->page_size,
        .head_dim_qk = model->head_dim_qk,
        .head_dim_v = model->head_dim_v,
        .num_qo_heads = model->num_qo_heads,
        .num_kv_heads = model->num_kv_heads,
        .causal = model->causal,
    };
}
