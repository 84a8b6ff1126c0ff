/* prefill_plan.c: the host side of the kit's prefill kernel: what it serves, and the work list. */
#include <limits.h>
#include <stdlib.h>

#include "prefill.h"
#include "prefill_hopper.h"
#include "prefill_internal.h"

static int prefill_dims_served(int32_t ragged, int32_t head_dim_qk, int32_t head_dim_v) {
    if (ragged && head_dim_qk == 192 && head_dim_v == 128) return 1;
    return head_dim_qk == head_dim_v &&
           (head_dim_qk == 64 || head_dim_qk == 128 || head_dim_qk == 256);
}

ap_status ap_kit_prefill_check_config(int32_t ragged, int32_t head_dim_qk, int32_t head_dim_v,
                                      ap_dtype q_dtype, ap_dtype kv_dtype, int32_t num_qo_heads,
                                      int32_t num_kv_heads, int32_t page_size, const char *who,
                                      ap_msgbuf *reasons) {
    ap_status st = AP_OK;
    if (!prefill_dims_served(ragged, head_dim_qk, head_dim_v)) {
        ap_msgbuf_add(
            reasons, "%s: head dims qk %d / v %d are not served over a %s K/V source (%s)", who,
            head_dim_qk, head_dim_v, ragged ? "ragged" : "paged",
            ragged ? "qk = v = 64, 128 or 256, or qk 192 / v 128" : "qk = v = 64, 128 or 256");
        st = AP_ERR_UNSUPPORTED;
    }
    if (q_dtype != AP_DTYPE_BF16 && q_dtype != AP_DTYPE_F16) {
        ap_msgbuf_add(reasons, "%s: query dtype %s is not bf16 or fp16", who,
                      ap_dtype_str(q_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (kv_dtype != q_dtype && kv_dtype != AP_DTYPE_FP8_E4M3) {
        ap_msgbuf_add(reasons, "%s: KV dtype %s is neither the query dtype nor fp8_e4m3", who,
                      ap_dtype_str(kv_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (num_kv_heads <= 0 || num_qo_heads <= 0 || num_qo_heads % num_kv_heads != 0 ||
        num_qo_heads / num_kv_heads > AP_KIT_PREFILL_MAX_GROUP) {
        ap_msgbuf_add(reasons, "%s: %d query heads over %d KV heads is not a group of 1..%d", who,
                      num_qo_heads, num_kv_heads, AP_KIT_PREFILL_MAX_GROUP);
        st = AP_ERR_UNSUPPORTED;
    }
    if (!ragged && page_size < 1) {
        ap_msgbuf_add(reasons, "%s: page size %d is not >= 1", who, page_size);
        st = AP_ERR_UNSUPPORTED;
    }
    return st;
}

/* Each sequence of q_len tokens gives ceil(q_len / tile_tokens) items, so a batch of at most
 * max_tokens tokens over max_batch sequences gives at most max_tokens / tile_tokens + max_batch. */
size_t ap_kit_prefill_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim_qk,
                                 int32_t head_dim_v, int32_t num_qo_heads, int32_t num_kv_heads) {
    const int32_t rows = ap_kit_prefill_default_tile_rows(head_dim_qk, head_dim_v);
    if (rows == 0 || max_tokens < 0 || max_batch < 0 || num_kv_heads <= 0 || num_qo_heads <= 0 ||
        num_qo_heads % num_kv_heads != 0 || num_qo_heads / num_kv_heads > AP_KIT_PREFILL_MAX_GROUP)
        return 0;
    /* The smallest tile a plan may pick (benchmark builds offer 64 rows for every head dim). */
    const int32_t min_tokens = 64 / (num_qo_heads / num_kv_heads);
    const size_t items = (size_t)max_tokens / (size_t)min_tokens + (size_t)max_batch + 1;
    return items * sizeof(ap_kit_prefill_item);
}

int32_t ap_kit_prefill_split_count(int64_t tiles, int64_t longest_keys, int32_t sms) {
    if (tiles <= 0 || sms <= 0) return 1;
    int64_t splits = sms / tiles;
    if (splits > longest_keys / AP_KIT_PREFILL_SPLIT_KEYS)
        splits = longest_keys / AP_KIT_PREFILL_SPLIT_KEYS;
    if (splits > AP_KIT_PREFILL_MAX_SPLITS) splits = AP_KIT_PREFILL_MAX_SPLITS;
    return splits >= 2 ? (int32_t)splits : 1;
}

/* A Hopper plan's split-KV (ap_kit_prefill_plan_args.split_space): its parts and their
 * workspace, where the workspace can be had; else the plan stays whole (a call the plan's items
 * run on the mma.sync kernel, prefill_hopper.cu, writes its rows whole and ignores the parts).
 * `longest_keys`: the first item's. */
static void prefill_plan_split(const ap_kit_prefill_plan_args *args, ap_kit_prefill_plan *plan,
                               int64_t longest_keys) {
    plan->splits = 1;
    plan->split_out = NULL;
    plan->split_lse = NULL;
    if (!plan->hopper || args->split_space == NULL || plan->num_items == 0) return;
    const int32_t splits = ap_kit_prefill_hopper_splits(plan, longest_keys);
    if (splits < 2) return;
    const size_t rows = (size_t)splits * (size_t)plan->num_q_tokens * (size_t)plan->num_qo_heads;
    const size_t out_bytes = (rows * (size_t)plan->head_dim_v * 2 + 255) / 256 * 256;
    ap_kit_plan_buffer *space = args->split_space; /* grown to the largest split batch */
    if (ap_kit_device_reserve(&space->split, &space->split_bytes, out_bytes + rows * sizeof(float),
                              "", NULL) != AP_OK) /* no message: the plan runs whole */
        return;
    plan->splits = splits;
    plan->min_kv_tiles = 0; /* a part past a short tile's keys has none (the rounds take it) */
    plan->split_out = space->split;
    plan->split_lse = (float *)((char *)space->split + out_bytes);
}

static int prefill_item_compare(const void *lhs, const void *rhs) {
    const ap_kit_prefill_item *x = (const ap_kit_prefill_item *)lhs;
    const ap_kit_prefill_item *y = (const ap_kit_prefill_item *)rhs;
    if (x->kv_tiles != y->kv_tiles) return x->kv_tiles > y->kv_tiles ? -1 : 1;
    if (x->seq != y->seq) return x->seq < y->seq ? -1 : 1;
    return x->q_start < y->q_start ? -1 : (x->q_start > y->q_start);
}

/* The KV length of sequence i, or -1 with a message when it passes what the kernel's int32
 * positions reach (or a ragged indptr decreases). */
static int64_t prefill_seq_kv_len(const ap_kit_prefill_plan_args *args, int32_t i, const char *who,
                                  ap_msgbuf *msg) {
    int64_t kv_len;
    if (args->kv_indptr_host != NULL) {
        kv_len = (int64_t)args->kv_indptr_host[i + 1] - args->kv_indptr_host[i];
    } else {
        const int32_t pages = args->kv_page_indptr_host[i + 1] - args->kv_page_indptr_host[i];
        kv_len = (int64_t)(pages - 1) * args->page_size + args->kv_last_page_len_host[i];
    }
    if (kv_len < 0 || kv_len > INT32_MAX - AP_KIT_PREFILL_TILE_KV) {
        ap_msgbuf_add(msg, "%s plan: sequence %d holds %lld keys, not 0..%d", who, i,
                      (long long)kv_len, INT32_MAX - AP_KIT_PREFILL_TILE_KV);
        return -1;
    }
    return kv_len;
}

static int prefill_plan_args_bad(const ap_kit_prefill_plan_args *args,
                                 const ap_kit_prefill_plan *plan) {
    if (args == NULL || plan == NULL || args->num_seqs < 0 || args->host_scratch == NULL ||
        (args->device_buffer == NULL && !args->caller_uploads))
        return 1;
    if (args->num_seqs == 0) return 0;
    if (args->qo_indptr_host == NULL) return 1;
    return args->kv_indptr_host == NULL &&
           (args->kv_page_indptr_host == NULL || args->kv_last_page_len_host == NULL);
}

ap_status ap_kit_prefill_plan_build(const ap_kit_prefill_plan_args *args, void *stream,
                                    ap_kit_prefill_plan *plan, const char *who, ap_msgbuf *msg) {
    if (prefill_plan_args_bad(args, plan)) {
        ap_msgbuf_add(msg, "%s plan: NULL argument or negative batch size", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int32_t ragged = args->kv_indptr_host != NULL;
    const int32_t hopper_rows = args->tile_rows == 0 ? ap_kit_prefill_hopper_tile_rows(args) : 0;
    ap_status st =
        hopper_rows ? AP_OK
                    : ap_kit_prefill_check_config(ragged, args->head_dim_qk, args->head_dim_v,
                                                  AP_DTYPE_BF16, AP_DTYPE_BF16, args->num_qo_heads,
                                                  args->num_kv_heads, args->page_size, who, msg);
    if (st != AP_OK) return st;
    const int32_t rows = hopper_rows ? hopper_rows
                         : args->tile_rows == 0
                             ? ap_kit_prefill_default_tile_rows(args->head_dim_qk, args->head_dim_v)
                             : args->tile_rows;
    if (!hopper_rows &&
        !ap_kit_prefill_tile_rows_built(args->head_dim_qk, args->head_dim_v, rows)) {
        ap_msgbuf_add(msg, "%s plan: no kernel of %d rows per CTA for head dims %d / %d", who, rows,
                      args->head_dim_qk, args->head_dim_v);
        return AP_ERR_UNSUPPORTED;
    }
    const int32_t group = args->num_qo_heads / args->num_kv_heads;
    const int32_t tile_tokens = rows / group;
    const size_t capacity = args->buffer_bytes / sizeof(ap_kit_prefill_item);
    ap_kit_prefill_item *items = (ap_kit_prefill_item *)args->host_scratch;

    size_t count = 0;
    for (int32_t i = 0; i < args->num_seqs; ++i) {
        const int64_t kv_len = prefill_seq_kv_len(args, i, who, msg);
        if (kv_len < 0) return AP_ERR_UNSUPPORTED;
        const int32_t q_len = args->qo_indptr_host[i + 1] - args->qo_indptr_host[i];
        const int64_t prefix = kv_len - q_len;
        for (int32_t t0 = 0; t0 < q_len; t0 += tile_tokens) {
            if (count == capacity) {
                ap_msgbuf_add(msg,
                              "%s plan: more than %zu work items; the buffer is %zu bytes (size "
                              "it with the plan's bytes function)",
                              who, capacity, args->buffer_bytes);
                return AP_ERR_SHAPE_MISMATCH;
            }
            const int64_t t_end = t0 + tile_tokens < q_len ? t0 + tile_tokens : q_len;
            const int64_t kv_end = args->causal ? prefix + t_end : kv_len;
            items[count].seq = i;
            items[count].q_start = t0;
            items[count].kv_tiles =
                (int32_t)((kv_end + AP_KIT_PREFILL_TILE_KV - 1) / AP_KIT_PREFILL_TILE_KV);
            items[count].unused = 0;
            ++count;
        }
    }
    qsort(items, count, sizeof(ap_kit_prefill_item), prefill_item_compare);

    if (count > 0 && !args->caller_uploads) {
        st = ap_kit_copy_to_device(args->device_buffer, items, count * sizeof(ap_kit_prefill_item),
                                   stream, who, "cudaMemcpyAsync of the prefill work items", msg);
        if (st != AP_OK) return st;
    }
    plan->num_items = (int32_t)count;
    plan->tile_rows = rows;
    plan->tile_tokens = tile_tokens;
    plan->head_dim_qk = args->head_dim_qk;
    plan->head_dim_v = args->head_dim_v;
    plan->num_qo_heads = args->num_qo_heads;
    plan->num_kv_heads = args->num_kv_heads;
    plan->causal = args->causal != 0;
    plan->ragged = ragged;
    plan->items = args->device_buffer;
    plan->hopper = hopper_rows != 0;
    plan->num_q_tokens = args->num_seqs > 0 ? args->qo_indptr_host[args->num_seqs] : 0;
    plan->num_kv_rows = ragged && args->num_seqs > 0 ? args->kv_indptr_host[args->num_seqs] : 0;
    plan->tile_counters = args->tile_counters;
    plan->min_kv_tiles = count > 0 ? items[count - 1].kv_tiles : 0; /* sorted: the fewest last */
    prefill_plan_split(args, plan,
                       count > 0 ? (int64_t)items[0].kv_tiles * AP_KIT_PREFILL_TILE_KV : 0);
    return AP_OK;
}
