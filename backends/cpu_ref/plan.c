/* plan.c: init_metadata: check a batch's host mirrors and copy what the forward calls need. */
#include <stdlib.h>

#include "cpu_ref.h"

void cpu_plan_free(cpu_plan *plan) {
    free(plan->qo_indptr);
    free(plan->seq_lens);
    free(plan->kv_page_indptr);
    free(plan->kv_page_indices);
    free(plan->kv_indptr);
    memset(plan, 0, sizeof *plan);
}

static int32_t *cpu_plan_copy(const int32_t *from, int32_t count) {
    int32_t *to = malloc((size_t)(count > 0 ? count : 1) * sizeof *to);
    if (to != NULL && count > 0) memcpy(to, from, (size_t)count * sizeof *to);
    return to;
}

/* qo_indptr: starts at 0, never decreases, ends at num_tokens; decode: every q_len is 1; every
 * sequence holds at least its new tokens (prefix = seq_len - q_len >= 0). */
static ap_status cpu_plan_check_tokens(const ap_batch *batch, ap_msgbuf *msg) {
    const int32_t *qo = batch->qo_indptr_host;
    if (qo[0] != 0 || qo[batch->num_seqs] != batch->num_tokens) {
        ap_msgbuf_add(msg, "cpu_ref: qo_indptr must run from 0 to num_tokens %d (got %d .. %d)",
                      batch->num_tokens, qo[0], qo[batch->num_seqs]);
        return AP_ERR_SHAPE_MISMATCH;
    }
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        /* compared before subtracting: a difference that wraps would pass as q_len >= 0 */
        if (qo[i + 1] < qo[i]) {
            ap_msgbuf_add(msg, "cpu_ref: qo_indptr decreases at sequence %d", i);
            return AP_ERR_SHAPE_MISMATCH;
        }
        int32_t q_len = qo[i + 1] - qo[i];
        if (batch->mode == AP_MODE_DECODE && q_len != 1) {
            ap_msgbuf_add(msg, "cpu_ref: decode batch sequence %d has %d new tokens, not 1", i,
                          q_len);
            return AP_ERR_SHAPE_MISMATCH;
        }
        if (batch->seq_lens_host[i] < q_len) {
            ap_msgbuf_add(msg, "cpu_ref: sequence %d has seq_len %d < its %d new tokens", i,
                          batch->seq_lens_host[i], q_len);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

/* Page CSR: kv_page_indptr from 0 to num_pages_total, and for each sequence
 * seq_len == (num_pages - 1) * page_size + kv_last_page_len with last in 1..page_size
 * (or no page at all for an empty sequence). */
static ap_status cpu_plan_check_pages(const ap_batch *batch, int32_t page_size, ap_msgbuf *msg) {
    const int32_t *indptr = batch->kv_page_indptr_host;
    if (batch->kv_page_indices_host == NULL || batch->kv_last_page_len_host == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: kv_page_indptr_host is set but kv_page_indices_host or "
                           "kv_last_page_len_host is NULL");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (indptr[0] != 0 || indptr[batch->num_seqs] != batch->num_pages_total ||
        batch->num_pages_total < 0) {
        ap_msgbuf_add(msg, "cpu_ref: kv_page_indptr must run from 0 to num_pages_total %d",
                      batch->num_pages_total);
        return AP_ERR_SHAPE_MISMATCH;
    }
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        if (indptr[i + 1] < indptr[i]) {
            ap_msgbuf_add(msg, "cpu_ref: kv_page_indptr decreases at sequence %d", i);
            return AP_ERR_SHAPE_MISMATCH;
        }
        int32_t pages = indptr[i + 1] - indptr[i];
        int32_t seq_len = batch->seq_lens_host[i];
        int32_t last = batch->kv_last_page_len_host[i];
        int ok =
            pages >= 0 && (pages == 0 ? seq_len == 0
                                      : last >= 1 && last <= page_size &&
                                            (int64_t)(pages - 1) * page_size + last == seq_len);
        if (!ok) {
            ap_msgbuf_add(msg,
                          "cpu_ref: sequence %d: %d pages of %d with last_page_len %d do not hold "
                          "seq_len %d",
                          i, pages, page_size, last, seq_len);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

/* ABI 1.1's ragged K/V source (a 1.0 host's batch ends before it): extend only; kv_indptr_host
 * from 0 to num_kv_tokens, never decreasing; kv_causal 0 or 1, and when 1 every sequence has at
 * least as many keys as query rows (causal aligned to the end). */
static int cpu_plan_is_ragged(const ap_batch *batch) {
    return AP_HAS_FIELD(batch, ap_batch, kv_causal) && batch->kv_indptr != NULL;
}

static ap_status cpu_plan_check_ragged(const ap_batch *batch, ap_msgbuf *msg) {
    const int32_t *kv = batch->kv_indptr_host;
    if (batch->mode != AP_MODE_EXTEND || kv == NULL ||
        (batch->kv_causal != 0 && batch->kv_causal != 1)) {
        ap_msgbuf_add(msg, "cpu_ref: a ragged K/V source needs an extend batch, kv_indptr_host "
                           "(cpu_ref reads host mirrors) and kv_causal 0 or 1");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (kv[0] != 0 || kv[batch->num_seqs] != batch->num_kv_tokens) {
        ap_msgbuf_add(msg, "cpu_ref: kv_indptr must run from 0 to num_kv_tokens %d (got %d .. %d)",
                      batch->num_kv_tokens, kv[0], kv[batch->num_seqs]);
        return AP_ERR_SHAPE_MISMATCH;
    }
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        int32_t q_len = batch->qo_indptr_host[i + 1] - batch->qo_indptr_host[i];
        if (kv[i + 1] < kv[i] || (batch->kv_causal && kv[i + 1] - kv[i] < q_len)) {
            ap_msgbuf_add(msg,
                          "cpu_ref: kv_indptr at sequence %d: %d .. %d (it may not decrease, "
                          "and a causal source needs at least the %d query rows)",
                          i, kv[i], kv[i + 1], q_len);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

static ap_status cpu_plan_check(const ap_backend *backend, const ap_batch *batch, ap_msgbuf *msg) {
    /* an ABI 1.0 batch ends at positions_host */
    size_t smallest = offsetof(ap_batch, positions_host) + sizeof(const int32_t *);
    if (batch == NULL || batch->struct_size < smallest) {
        ap_msgbuf_add(msg, "cpu_ref: the batch is NULL or its struct_size is too small");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->mode != AP_MODE_EXTEND && batch->mode != AP_MODE_DECODE) {
        ap_msgbuf_add(msg, "cpu_ref: unknown batch mode %d", (int)batch->mode);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->num_seqs < 0 || batch->num_tokens < 0) {
        ap_msgbuf_add(msg, "cpu_ref: negative num_seqs %d or num_tokens %d", batch->num_seqs,
                      batch->num_tokens);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->qo_indptr_host == NULL || batch->seq_lens_host == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: reads the host mirrors: qo_indptr_host and seq_lens_host "
                           "must be set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status status = cpu_plan_check_tokens(batch, msg);
    if (status == AP_OK && batch->kv_page_indptr_host != NULL)
        status = cpu_plan_check_pages(batch, backend->model.page_size, msg);
    if (status == AP_OK && cpu_plan_is_ragged(batch)) status = cpu_plan_check_ragged(batch, msg);
    return status;
}

ap_status cpu_plan_init(ap_backend *backend, const ap_batch *batch, ap_msgbuf *msg) {
    cpu_plan *plan = &backend->plan;
    cpu_plan_free(plan);
    ap_status status = cpu_plan_check(backend, batch, msg);
    if (status != AP_OK) return status;
    plan->mode = batch->mode;
    plan->num_seqs = batch->num_seqs;
    plan->num_tokens = batch->num_tokens;
    plan->has_pages = batch->kv_page_indptr_host != NULL;
    plan->num_pages_total = plan->has_pages ? batch->num_pages_total : 0;
    plan->qo_indptr = cpu_plan_copy(batch->qo_indptr_host, batch->num_seqs + 1);
    plan->seq_lens = cpu_plan_copy(batch->seq_lens_host, batch->num_seqs);
    int pages_ok = 1;
    if (plan->has_pages) {
        plan->kv_page_indptr = cpu_plan_copy(batch->kv_page_indptr_host, batch->num_seqs + 1);
        plan->kv_page_indices = cpu_plan_copy(batch->kv_page_indices_host, plan->num_pages_total);
        pages_ok = plan->kv_page_indptr != NULL && plan->kv_page_indices != NULL;
    }
    plan->ragged = cpu_plan_is_ragged(batch);
    if (plan->ragged) {
        plan->kv_causal = batch->kv_causal;
        plan->num_kv_tokens = batch->num_kv_tokens;
        plan->kv_indptr = cpu_plan_copy(batch->kv_indptr_host, batch->num_seqs + 1);
        pages_ok = pages_ok && plan->kv_indptr != NULL;
    }
    if (plan->qo_indptr == NULL || plan->seq_lens == NULL || !pages_ok) {
        cpu_plan_free(plan);
        ap_msgbuf_add(msg, "cpu_ref: out of host memory copying the batch");
        return AP_ERR_OUT_OF_MEMORY;
    }
    plan->ready = 1;
    return AP_OK;
}
