/* check.c: the core's checks of a batch and of a forward call before the backend sees them. */
#include <inttypes.h>
#include <stdio.h>

#include "check_internal.h"

/* Smallest structs of ABI 1.0 (see select.c for why a minimum, not an exact size). */
#define AP_BATCH_MIN_SIZE (offsetof(ap_batch, positions_host) + sizeof(const int32_t *))
#define AP_FORWARD_MIN_SIZE (offsetof(ap_forward_args, q_rope) + sizeof(const DLTensor *))

/* ---- the batch ------------------------------------------------------------------------------- */

/* indptr[0] == 0, non-decreasing, indptr[n] == total. */
static ap_status ap_check_indptr(ap_msgbuf *msg, const char *name, const int32_t *indptr, int32_t n,
                                 int32_t total, const char *total_name) {
    if (indptr[0] != 0)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "batch.%s[0] is %d, expected 0", name,
                             (int)indptr[0]);
    for (int32_t i = 0; i < n; i++) {
        if (indptr[i + 1] < indptr[i])
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "batch.%s decreases: [%d] = %d after [%d] = %d", name,
                                 (int)(i + 1), (int)indptr[i + 1], (int)i, (int)indptr[i]);
    }
    if (indptr[n] != total)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "batch.%s[%d] is %d, expected %s = %d",
                             name, (int)n, (int)indptr[n], total_name, (int)total);
    return AP_OK;
}

/* ABI 1.1's ragged K/V source is set (a 1.0 host's batch ends before its fields). */
static int ap_batch_is_ragged(const ap_batch *b) {
    return AP_HAS_FIELD(b, ap_batch, kv_causal) && b->kv_indptr != NULL;
}

/* The ragged K/V source's header: extend only, a backend that knows the fields, kv_causal 0 or
 * 1, the host mirror where the backend reads mirrors; without kv_indptr, nothing of it set. */
static ap_status ap_check_ragged_header(const ap_instance *instance, const ap_batch *b,
                                        ap_msgbuf *msg) {
    if (!AP_HAS_FIELD(b, ap_batch, kv_causal)) return AP_OK;
    if (b->kv_indptr == NULL) {
        if (b->kv_indptr_host != NULL || b->num_kv_tokens != 0)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "batch.kv_indptr is NULL but kv_indptr_host is %s and "
                                 "num_kv_tokens is %d (expected NULL and 0)",
                                 b->kv_indptr_host != NULL ? "set" : "NULL", (int)b->num_kv_tokens);
        return AP_OK;
    }
    const ap_plugin *plugin = instance->plugin;
    if (plugin->abi_major == 1 && plugin->abi_minor < 1)
        return ap_check_fail(msg, AP_ERR_UNSUPPORTED,
                             "backend '%s' serves ABI %u.%u, which has no ragged K/V source "
                             "(batch.kv_indptr)",
                             plugin->desc->name, (unsigned)plugin->abi_major,
                             (unsigned)plugin->abi_minor);
    if (b->mode != AP_MODE_EXTEND)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "batch.kv_indptr (the ragged K/V source) is for extend batches, and "
                             "this one is decode");
    if (b->kv_causal != 0 && b->kv_causal != 1)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.kv_causal is %d (0 or 1)",
                             (int)b->kv_causal);
    if (b->num_kv_tokens < 0)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.num_kv_tokens is %d (negative)",
                             (int)b->num_kv_tokens);
    if (plugin->desc->caps->needs_host_mirrors && b->kv_indptr_host == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "backend '%s' needs the batch's host mirrors: kv_indptr_host is NULL",
                             plugin->desc->name);
    return AP_OK;
}

/* Counts and required pointers: everything that needs no array element. */
static ap_status ap_check_batch_header(const ap_instance *instance, const ap_batch *b,
                                       ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (b == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch is NULL");
    if (b->struct_size < AP_BATCH_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "batch.struct_size is %zu, expected >= %zu", b->struct_size,
                             (size_t)AP_BATCH_MIN_SIZE);
    if (b->mode != AP_MODE_EXTEND && b->mode != AP_MODE_DECODE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.mode %d is not extend or decode",
                             (int)b->mode);
    if (b->num_seqs < 1 || (m->max_batch > 0 && b->num_seqs > m->max_batch))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "batch.num_seqs is %d, expected 1..%d (model.max_batch)",
                             (int)b->num_seqs, (int)(m->max_batch > 0 ? m->max_batch : INT32_MAX));
    if (b->num_tokens < 1 || (m->max_tokens > 0 && b->num_tokens > m->max_tokens))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "batch.num_tokens is %d, expected 1..%d (model.max_tokens)",
                             (int)b->num_tokens,
                             (int)(m->max_tokens > 0 ? m->max_tokens : INT32_MAX));
    if (b->mode == AP_MODE_DECODE && m->embedding)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "decode batch for an embedding model");
    if (b->mode == AP_MODE_DECODE && b->num_tokens != b->num_seqs)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "decode batch has num_tokens %d for num_seqs %d (one token each)",
                             (int)b->num_tokens, (int)b->num_seqs);
    ap_status status = ap_check_ragged_header(instance, b, msg);
    if (status != AP_OK) return status;
    /* A batch whose keys come from the ragged source reads no cache: its pages are optional. */
    int pages = !ap_skips_kv(instance) && !ap_batch_is_ragged(b);
    if (b->qo_indptr == NULL || b->seq_lens == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "batch.%s is NULL",
                             b->qo_indptr == NULL ? "qo_indptr" : "seq_lens");
    if (pages &&
        (b->kv_page_indptr == NULL || b->kv_page_indices == NULL || b->kv_last_page_len == NULL))
        return ap_check_fail(
            msg, AP_ERR_INVALID_ARGUMENT,
            "batch.kv_page_indptr, kv_page_indices and kv_last_page_len are required "
            "(one is NULL)");
    if (pages && b->num_pages_total < b->num_seqs)
        return ap_check_fail(
            msg, AP_ERR_SHAPE_MISMATCH,
            "batch.num_pages_total is %d, fewer than num_seqs %d (each sequence has "
            ">= 1 page)",
            (int)b->num_pages_total, (int)b->num_seqs);
    if (instance->plugin->desc->caps->needs_host_mirrors) {
        if (b->qo_indptr_host == NULL || b->seq_lens_host == NULL ||
            (pages && (b->kv_page_indptr_host == NULL || b->kv_page_indices_host == NULL ||
                       b->kv_last_page_len_host == NULL)))
            return ap_check_fail(
                msg, AP_ERR_INVALID_ARGUMENT,
                "backend '%s' needs the batch's host mirrors (qo_indptr_host, "
                "kv_page_indptr_host, kv_page_indices_host, kv_last_page_len_host, "
                "seq_lens_host); one is NULL",
                instance->plugin->desc->name);
    }
    return AP_OK;
}

/* One sequence's page list against its length: pages, last-page length, seq_len. */
static ap_status ap_check_seq_pages(const ap_instance *instance, const ap_batch *b, int32_t i,
                                    ap_msgbuf *msg) {
    int32_t page_size = instance->model.page_size;
    int32_t seq_len = b->seq_lens_host[i];
    int32_t npages = b->kv_page_indptr_host[i + 1] - b->kv_page_indptr_host[i];
    if (npages < 1)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "sequence %d has no KV page", (int)i);
    if (b->kv_last_page_len_host == NULL) return AP_OK;
    int32_t last = b->kv_last_page_len_host[i];
    if (last < 1 || last > page_size)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "batch.kv_last_page_len_host[%d] is %d, expected 1..%d (page size)",
                             (int)i, (int)last, (int)page_size);
    int64_t expected = (int64_t)(npages - 1) * page_size + last;
    if (seq_len != expected)
        return ap_check_fail(
            msg, AP_ERR_SHAPE_MISMATCH,
            "batch.seq_lens_host[%d] is %d, but its %d pages of %d with a last page "
            "of %d hold %" PRId64,
            (int)i, (int)seq_len, (int)npages, (int)page_size, (int)last, expected);
    return AP_OK;
}

/* Every sequence: q_len, seq_len, pages; and the batch's maxima. */
static ap_status ap_check_batch_seqs(const ap_instance *instance, const ap_batch *b,
                                     ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int32_t max_q = 0, max_seq = 0;
    for (int32_t i = 0; i < b->num_seqs; i++) {
        int32_t q_len = b->qo_indptr_host[i + 1] - b->qo_indptr_host[i];
        if (b->mode == AP_MODE_DECODE && q_len != 1)
            return ap_check_fail(
                msg, AP_ERR_SHAPE_MISMATCH,
                "decode batch: sequence %d has q_len %d (qo_indptr_host), expected 1", (int)i,
                (int)q_len);
        if (b->seq_lens_host == NULL) {
            max_q = q_len > max_q ? q_len : max_q;
            continue;
        }
        int32_t seq_len = b->seq_lens_host[i];
        if (seq_len < q_len)
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "batch.seq_lens_host[%d] is %d, shorter than its q_len %d", (int)i,
                                 (int)seq_len, (int)q_len);
        if (m->max_kv_len > 0 && seq_len > m->max_kv_len)
            return ap_check_fail(
                msg, AP_ERR_INVALID_ARGUMENT,
                "batch.seq_lens_host[%d] is %d, longer than model.max_kv_len %" PRId64, (int)i,
                (int)seq_len, m->max_kv_len);
        if (b->kv_page_indptr_host != NULL) {
            ap_status status = ap_check_seq_pages(instance, b, i, msg);
            if (status != AP_OK) return status;
        }
        max_q = q_len > max_q ? q_len : max_q;
        max_seq = seq_len > max_seq ? seq_len : max_seq;
    }
    if (b->max_q_len != max_q)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "batch.max_q_len is %d, but the largest q_len is %d",
                             (int)b->max_q_len, (int)max_q);
    if (b->seq_lens_host != NULL && b->max_seq_len != max_seq)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "batch.max_seq_len is %d, but the largest seq_len is %d",
                             (int)b->max_seq_len, (int)max_seq);
    return AP_OK;
}

/* Which page arrays the batch gives (see ap_batch_pages). */
static ap_batch_pages ap_batch_page_arrays(const ap_instance *instance, const ap_batch *b) {
    const int32_t *device[] = {b->kv_page_indptr, b->kv_page_indices, b->kv_last_page_len};
    const int32_t *host[] = {b->kv_page_indptr_host, b->kv_page_indices_host,
                             b->kv_last_page_len_host};
    int mirrors = instance->plugin->desc->caps->needs_host_mirrors;
    size_t given = 0, needed = 0;
    for (size_t i = 0; i < 3; i++) {
        given += (device[i] != NULL) + (host[i] != NULL);
        needed += (device[i] != NULL) + (mirrors && host[i] != NULL);
    }
    if (given == 0) return AP_BATCH_PAGES_NONE;
    return needed == (mirrors ? 6u : 3u) ? AP_BATCH_PAGES_ALL : AP_BATCH_PAGES_SOME;
}

/* The ragged source's rows from its host mirror: monotone from 0 to num_kv_tokens, and with
 * kv_causal every sequence has at least its q_len keys (its last query row sees them all). */
static ap_status ap_check_ragged_rows(const ap_batch *b, ap_msgbuf *msg) {
    const int32_t *kv = b->kv_indptr_host;
    ap_status status =
        ap_check_indptr(msg, "kv_indptr_host", kv, b->num_seqs, b->num_kv_tokens, "num_kv_tokens");
    for (int32_t i = 0; status == AP_OK && b->kv_causal && i < b->num_seqs; i++) {
        int32_t kv_len = kv[i + 1] - kv[i];
        int32_t q_len = b->qo_indptr_host[i + 1] - b->qo_indptr_host[i];
        if (kv_len < q_len)
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "batch.kv_causal is 1 but sequence %d has %d keys for %d query "
                                 "rows (causal aligned to the end needs kv_len >= q_len)",
                                 (int)i, (int)kv_len, (int)q_len);
    }
    return status;
}

ap_status ap_check_batch(const ap_instance *instance, const ap_batch *b, ap_batch_facts *facts,
                         ap_msgbuf *msg) {
    facts->max_page = -1;
    facts->pages = AP_BATCH_PAGES_NONE;
    facts->num_kv_tokens = -1;
    ap_status status = ap_check_batch_header(instance, b, msg);
    if (status != AP_OK) return status;
    facts->pages = ap_batch_page_arrays(instance, b);
    if (ap_batch_is_ragged(b)) facts->num_kv_tokens = b->num_kv_tokens;
    /* Without host mirrors the device arrays cannot be read here; the backend plans blind. */
    if (b->qo_indptr_host == NULL) return AP_OK;
    status = ap_check_indptr(msg, "qo_indptr_host", b->qo_indptr_host, b->num_seqs, b->num_tokens,
                             "num_tokens");
    if (status == AP_OK && ap_batch_is_ragged(b) && b->kv_indptr_host != NULL)
        status = ap_check_ragged_rows(b, msg);
    if (status != AP_OK) return status;
    if (b->kv_page_indptr_host != NULL) {
        status = ap_check_indptr(msg, "kv_page_indptr_host", b->kv_page_indptr_host, b->num_seqs,
                                 b->num_pages_total, "num_pages_total");
        if (status != AP_OK) return status;
    }
    status = ap_check_batch_seqs(instance, b, msg);
    if (status != AP_OK) return status;
    if (b->kv_page_indices_host != NULL && b->kv_page_indptr_host != NULL) {
        int32_t largest = -1;
        for (int32_t p = 0; p < b->num_pages_total; p++) {
            int32_t page = b->kv_page_indices_host[p];
            if (page < 0)
                return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                     "batch.kv_page_indices_host[%d] is %d (negative)", (int)p,
                                     (int)page);
            largest = page > largest ? page : largest;
        }
        facts->max_page = largest;
    }
    return AP_OK;
}

/* ---- forward_extend / forward_decode ---------------------------------------------------------- */

/* q, out, lse, q_rope: the query side, shaped [T][Hq][...]; q and q_rope laid out as `q_layout`
 * says (MLA's absorbed form reads them in place: rows dense, rows strided). */
static ap_status ap_check_forward_q(const ap_instance *instance, const ap_forward_args *a,
                                    int64_t dq, int64_t dv, ap_layout q_layout, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int64_t t = instance->batch_num_tokens, hq = m->num_qo_heads;
    DLDataType act = ap_dl_of(m->dtype);
    ap_status status =
        ap_check_required(instance, msg, "args.q", a->q, 3, (int64_t[]){t, hq, dq}, act, q_layout);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.out", a->out, 3, (int64_t[]){t, hq, dv},
                                   act, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_optional(instance, msg, "args.lse", a->lse, 2, (int64_t[]){t, hq},
                                   AP_DL_FLOAT32, AP_DENSE);
    if (status == AP_OK && a->q_rope != NULL)
        status = ap_check_tensor(instance, msg, "args.q_rope", a->q_rope, 3,
                                 (int64_t[]){t, hq, m->qk_rope_head_dim}, act, q_layout);
    return status;
}

/* The type a k or v tensor must have: the model's activation type, or with `fp8_ok` (the
 * ragged source, as pack_prefix_chunk_kv/1 writes it) fp8 e4m3 when that is what it holds. */
static DLDataType ap_kv_input_type(const ap_instance *instance, const DLTensor *t, int fp8_ok) {
    int fp8 = t != NULL && (t->dtype.code == AP_DL_FLOAT8_E4M3FN ||
                            (t->dtype.code == kDLUInt && t->dtype.bits == 8));
    return fp8_ok && fp8 ? AP_DL_FP8_OUT : ap_dl_of(instance->model.dtype);
}

/* k, v: new keys and values [T][H][...] (or the ragged source's rows), both or neither. */
static ap_status ap_check_forward_kv(const ap_instance *instance, const ap_forward_args *a,
                                     int64_t hk, int64_t dk, int64_t dv, int v_optional,
                                     ap_msgbuf *msg) {
    int ragged = instance->batch_num_kv_tokens >= 0;
    int64_t t = ragged ? instance->batch_num_kv_tokens : instance->batch_num_tokens;
    DLDataType k_type = ap_kv_input_type(instance, a->k, ragged);
    DLDataType v_type = ap_kv_input_type(instance, a->v, ragged);
    if (ragged && a->k == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.k and args.v are required with the batch's ragged K/V source");
    if (a->k == NULL && a->v != NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.v is given without args.k");
    if (a->k != NULL && a->v == NULL && !v_optional)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k is given without args.v");
    if (a->save_kv && a->k == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.save_kv is 1 but args.k/v are NULL");
    ap_status status = ap_check_optional(instance, msg, "args.k", a->k, 3, (int64_t[]){t, hk, dk},
                                         k_type, AP_DENSE);
    if (status != AP_OK) return status;
    return ap_check_optional(instance, msg, "args.v", a->v, 3, (int64_t[]){t, hk, dv}, v_type,
                             AP_DENSE);
}

/* MLA has two forms. MHA-style prefill (extend, q without q_rope is qk_nope + qk_rope wide):
 * per-head k and v. Absorbed (decode, or extend over the latent: MTP verification): q is the
 * latent width (576 = 512 + 64) or its 512 part with q_rope beside it, both read in place; new k
 * is the latent [T][1][576] and there is no v (V is the latent's first 512 values). A batch with
 * the ragged K/V source takes the MHA form only. */
static ap_status ap_check_forward_mla(const ap_instance *instance, ap_forward_mode mode,
                                      const ap_forward_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int ragged = instance->batch_num_kv_tokens >= 0;
    ap_status status;
    int64_t prefill_dq = (int64_t)m->qk_nope_head_dim + m->qk_rope_head_dim;
    int mha_form = mode == AP_MODE_EXTEND && a->q_rope == NULL && a->q != NULL && a->q->ndim == 3 &&
                   a->q->shape != NULL && m->qk_nope_head_dim > 0 && m->v_head_dim > 0 &&
                   a->q->shape[2] == prefill_dq && prefill_dq != m->head_dim_qk;
    if (ragged && !mha_form)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "the batch's ragged K/V source takes MLA's MHA form: q [T][%d][%d] "
                             "(qk_nope + qk_rope) without q_rope",
                             (int)m->num_qo_heads, (int)prefill_dq);
    if (mha_form) {
        if (a->save_kv)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "args.save_kv must be 0 in MLA's MHA form (the latent cache "
                                 "holds no per-head K/V)");
        status = ap_check_forward_q(instance, a, prefill_dq, m->v_head_dim, AP_DENSE, msg);
        if (status != AP_OK) return status;
        return ap_check_forward_kv(instance, a, m->num_qo_heads, prefill_dq, m->v_head_dim, 0, msg);
    }
    int64_t dq = a->q_rope != NULL ? m->kv_lora_rank : m->head_dim_qk;
    status = ap_check_forward_q(instance, a, dq, m->head_dim_v, AP_ROWS, msg);
    if (status != AP_OK) return status;
    if (a->v != NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.v must be NULL in MLA's absorbed form (V is the first "
                             "kv_lora_rank values of the latent row in args.k)");
    return ap_check_forward_kv(instance, a, 1, m->head_dim_qk, m->head_dim_v, 1, msg);
}

ap_status ap_check_forward(const ap_instance *instance, ap_forward_mode mode, const ap_layer *layer,
                           const ap_forward_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    const char *want = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (!instance->batch_planned)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "no batch is planned: call ap_instance_init_metadata first");
    if (instance->batch_mode != mode)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "the planned batch is %s, not %s",
                             instance->batch_mode == AP_MODE_DECODE ? "decode" : "extend", want);
    if (a == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_FORWARD_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.struct_size is %zu, expected >= %zu", a->struct_size,
                             (size_t)AP_FORWARD_MIN_SIZE);
    if (a->save_kv != 0 && a->save_kv != 1)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.save_kv is %d (0 or 1)",
                             (int)a->save_kv);
    int ragged = instance->batch_num_kv_tokens >= 0;
    if (a->save_kv && ragged)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.save_kv must be 0 with the batch's ragged K/V source (keys and "
                             "values come from args.k/v; nothing goes to the cache)");
    if (a->save_kv && instance->batch_pages != AP_BATCH_PAGES_ALL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.save_kv is 1 but the planned batch has no page arrays (or not "
                             "all of them) to write k/v through");
    /* No cache only with no page arrays: a batch with pages has the backend read the cache. */
    int kv_optional = ragged || (ap_skips_kv(instance) && !a->save_kv &&
                                 instance->batch_pages == AP_BATCH_PAGES_NONE);
    ap_status status = ap_check_layer(instance, layer, kv_optional, msg);
    if (status != AP_OK) return status;
    if (m->kind == AP_ATTN_MHA) {
        if (a->q_rope != NULL)
            return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                                 "args.q_rope is for MLA models only");
        status = ap_check_forward_q(instance, a, m->head_dim_qk, m->head_dim_v, AP_DENSE, msg);
        if (status != AP_OK) return status;
        return ap_check_forward_kv(instance, a, m->num_kv_heads, m->head_dim_qk, m->head_dim_v, 0,
                                   msg);
    }
    return ap_check_forward_mla(instance, mode, a, msg);
}
