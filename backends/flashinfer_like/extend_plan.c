/* extend_plan.c: the host side of flashinfer_like's extend: what it serves, and the work list. */
#include <limits.h>
#include <stdlib.h>

#include "extend.h"
#include "extend_internal.h"

ap_status fil_extend_check_config(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                  int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size,
                                  ap_msgbuf *reasons) {
    ap_status st = AP_OK;
    if (!fil_head_dim_served(head_dim)) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: head_dim %d is not " FIL_HEAD_DIMS_TEXT,
                      head_dim);
        st = AP_ERR_UNSUPPORTED;
    }
    if (q_dtype != AP_DTYPE_BF16 && q_dtype != AP_DTYPE_F16) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: query dtype %s is not bf16 or fp16",
                      ap_dtype_str(q_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (kv_dtype != q_dtype && kv_dtype != AP_DTYPE_FP8_E4M3) {
        ap_msgbuf_add(reasons,
                      FIL_NAME ": extend: KV dtype %s is neither the query dtype nor fp8_e4m3",
                      ap_dtype_str(kv_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (num_kv_heads <= 0 || num_qo_heads <= 0 || num_qo_heads % num_kv_heads != 0 ||
        num_qo_heads / num_kv_heads > FIL_MAX_GROUP) {
        ap_msgbuf_add(reasons,
                      FIL_NAME ": extend: %d query heads over %d KV heads is not a group of 1..%d",
                      num_qo_heads, num_kv_heads, FIL_MAX_GROUP);
        st = AP_ERR_UNSUPPORTED;
    }
    if (page_size < 1) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: page size %d is not >= 1", page_size);
        st = AP_ERR_UNSUPPORTED;
    }
    return st;
}

/* Each sequence of q_len tokens gives ceil(q_len / tile_tokens) items, so a batch of at most
 * max_tokens tokens over max_batch sequences gives at most max_tokens / tile_tokens + max_batch. */
size_t fil_extend_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim,
                             int32_t num_qo_heads, int32_t num_kv_heads) {
    const int32_t rows = fil_extend_default_tile_rows(head_dim);
    if (rows == 0 || max_tokens < 0 || max_batch < 0 || num_kv_heads <= 0 || num_qo_heads <= 0 ||
        num_qo_heads % num_kv_heads != 0 || num_qo_heads / num_kv_heads > FIL_MAX_GROUP)
        return 0;
    /* The smallest tile a plan may pick (benchmark builds offer 64 rows for every head dim). */
    const int32_t min_tokens = 64 / (num_qo_heads / num_kv_heads);
    const size_t items = (size_t)max_tokens / (size_t)min_tokens + (size_t)max_batch + 1;
    return items * sizeof(fil_extend_item);
}

static int extend_item_compare(const void *lhs, const void *rhs) {
    const fil_extend_item *x = (const fil_extend_item *)lhs, *y = (const fil_extend_item *)rhs;
    if (x->kv_tiles != y->kv_tiles) return x->kv_tiles > y->kv_tiles ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->q_start < y->q_start ? -1 : (x->q_start > y->q_start);
}

/* The KV length of sequence i (the batch passed ap_kit_batch_check), or -1 with a message when
 * it passes what the kernel's int32 positions reach. */
static int64_t extend_seq_kv_len(const fil_extend_plan_args *args, int32_t i, ap_msgbuf *msg) {
    const int32_t pages = args->kv_page_indptr_host[i + 1] - args->kv_page_indptr_host[i];
    const int64_t kv_len = (int64_t)(pages - 1) * args->page_size + args->kv_last_page_len_host[i];
    if (kv_len > INT32_MAX - FIL_EXTEND_TILE_KV) {
        ap_msgbuf_add(msg, FIL_NAME ": extend plan: sequence %d holds %lld tokens, more than %d", i,
                      (long long)kv_len, INT32_MAX - FIL_EXTEND_TILE_KV);
        return -1;
    }
    return kv_len;
}

ap_status fil_extend_plan_build(const fil_extend_plan_args *args, void *stream,
                                fil_extend_plan *plan, ap_msgbuf *msg) {
    if (args == NULL || plan == NULL || args->num_seqs < 0 ||
        (args->num_seqs > 0 && (args->qo_indptr_host == NULL || args->kv_page_indptr_host == NULL ||
                                args->kv_last_page_len_host == NULL)) ||
        args->host_scratch == NULL || (args->device_buffer == NULL && !args->caller_uploads)) {
        ap_msgbuf_add(msg, FIL_NAME ": extend plan: NULL argument or negative batch size");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st =
        fil_extend_check_config(args->head_dim, AP_DTYPE_BF16, AP_DTYPE_BF16, args->num_qo_heads,
                                args->num_kv_heads, args->page_size, msg);
    if (st != AP_OK) return st;
    const int32_t rows =
        args->tile_rows == 0 ? fil_extend_default_tile_rows(args->head_dim) : args->tile_rows;
    if (!fil_extend_tile_rows_built(args->head_dim, rows)) {
        ap_msgbuf_add(msg, FIL_NAME ": extend plan: no kernel of %d rows per CTA for head_dim %d",
                      rows, args->head_dim);
        return AP_ERR_UNSUPPORTED;
    }
    const int32_t group = args->num_qo_heads / args->num_kv_heads;
    const int32_t tile_tokens = rows / group;
    const size_t capacity = args->buffer_bytes / sizeof(fil_extend_item);
    fil_extend_item *items = (fil_extend_item *)args->host_scratch;

    size_t count = 0;
    for (int32_t i = 0; i < args->num_seqs; ++i) {
        const int64_t kv_len = extend_seq_kv_len(args, i, msg);
        if (kv_len < 0) return AP_ERR_UNSUPPORTED;
        const int32_t q_len = args->qo_indptr_host[i + 1] - args->qo_indptr_host[i];
        const int64_t prefix = kv_len - q_len;
        for (int32_t t0 = 0; t0 < q_len; t0 += tile_tokens) {
            if (count == capacity) {
                ap_msgbuf_add(msg,
                              FIL_NAME ": extend plan: more than %zu work items; the buffer is %zu "
                                       "bytes (size it with fil_extend_plan_bytes)",
                              capacity, args->buffer_bytes);
                return AP_ERR_SHAPE_MISMATCH;
            }
            const int64_t t_end = t0 + tile_tokens < q_len ? t0 + tile_tokens : q_len;
            const int64_t kv_end = args->causal ? prefix + t_end : kv_len;
            items[count].seq = i;
            items[count].q_start = t0;
            items[count].kv_tiles =
                (int32_t)((kv_end + FIL_EXTEND_TILE_KV - 1) / FIL_EXTEND_TILE_KV);
            items[count].unused = 0;
            ++count;
        }
    }
    qsort(items, count, sizeof(fil_extend_item), extend_item_compare);

    if (count > 0 && !args->caller_uploads) {
        st = ap_kit_copy_to_device(args->device_buffer, items, count * sizeof(fil_extend_item),
                                   stream, FIL_NAME ": extend plan",
                                   "cudaMemcpyAsync of the work items", msg);
        if (st != AP_OK) return st;
    }
    plan->num_items = (int32_t)count;
    plan->tile_rows = rows;
    plan->tile_tokens = tile_tokens;
    plan->head_dim = args->head_dim;
    plan->num_qo_heads = args->num_qo_heads;
    plan->num_kv_heads = args->num_kv_heads;
    plan->causal = args->causal != 0;
    plan->items = args->device_buffer;
    return AP_OK;
}
