/* plan.c: init_metadata: check a batch, plan split-KV decode and the KV append, copy it once. */
#include <limits.h>

#include "backends/common/prefill_internal.h"
#include "glue.h"

static size_t fil_align16(size_t n) {
    return (n + 15) & ~(size_t)15;
}

/* Upper bounds of the plan arrays for this model's largest batch (see fil_decode_split). */
typedef struct fil_plan_sizes {
    size_t workers, segs, merges, tokens, extend_bytes;
} fil_plan_sizes;

static fil_plan_sizes fil_plan_bounds(const ap_model *m, int32_t max_workers) {
    fil_plan_sizes s;
    size_t pairs = (size_t)m->max_batch * (size_t)m->num_kv_heads;
    s.workers = pairs + 2 * (size_t)max_workers;
    s.segs = s.workers;
    s.merges = pairs;
    s.tokens = (size_t)m->max_tokens;
    s.extend_bytes = fil_extend_plan_bytes(m->max_tokens, m->max_batch, m->head_dim_qk,
                                           m->num_qo_heads, m->num_kv_heads);
    return s;
}

/* The arrays one after the other, each 16-byte aligned: indptr, segs, seg_partial, merges,
 * slots, extend's work items. The same layout serves the bounds (capacity) and the actual counts
 * (the batch's one copy). */
typedef struct fil_plan_layout {
    size_t indptr, segs, seg_partial, merges, slots, items, end;
} fil_plan_layout;

static fil_plan_layout fil_layout_of(fil_plan_sizes s) {
    fil_plan_layout l;
    l.indptr = 0;
    l.segs = fil_align16((s.workers + 1) * sizeof(int32_t));
    l.seg_partial = l.segs + fil_align16(s.segs * sizeof(fil_decode_seg));
    l.merges = l.seg_partial + fil_align16(s.segs * sizeof(int32_t));
    l.slots = l.merges + fil_align16(s.merges * sizeof(ap_kit_merge));
    l.items = l.slots + fil_align16(s.tokens * sizeof(int32_t));
    l.end = l.items + fil_align16(s.extend_bytes);
    return l;
}

size_t fil_plan_capacity(const ap_model *model, int32_t max_workers) {
    return fil_layout_of(fil_plan_bounds(model, max_workers)).end;
}

/* ---- the batch's own limits (the kit checked the batch rules) -------------------------------- */

/* The decode kernel's int32 token cursor steps up to 2 tiles past a position. */
static ap_status fil_batch_check_limits(const ap_batch *batch, ap_msgbuf *msg) {
    for (int32_t i = 0; batch->mode == AP_MODE_DECODE && i < batch->num_seqs; i++) {
        int32_t seq_len = batch->seq_lens_host[i];
        if (seq_len > INT32_MAX - 2 * FIL_DECODE_TILE) {
            ap_msgbuf_add(msg, FIL_NAME ": sequence %d: decode serves at most %d tokens, not %d", i,
                          INT32_MAX - 2 * FIL_DECODE_TILE, seq_len);
            return AP_ERR_UNSUPPORTED;
        }
    }
    return AP_OK;
}

/* The slot of every new token: page * page_size + offset of position seq_len - q_len + j. */
static void fil_plan_slots(const ap_backend *b, const ap_batch *batch, int32_t *slots) {
    const int32_t ps = b->model.page_size;
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        const int32_t *seq_pages = batch->kv_page_indices_host + batch->kv_page_indptr_host[i];
        int32_t q0 = batch->qo_indptr_host[i], q_len = batch->qo_indptr_host[i + 1] - q0;
        int32_t prefix = batch->seq_lens_host[i] - q_len;
        for (int32_t j = 0; j < q_len; j++) {
            int32_t pos = prefix + j;
            slots[q0 + j] = seq_pages[pos / ps] * ps + pos % ps;
        }
    }
}

/* ---- split-KV decode ------------------------------------------------------------------------ */

typedef struct fil_split {
    int32_t *indptr;
    fil_decode_seg *segs;
    int32_t *seg_partial;
    ap_kit_merge *merges;
    int32_t num_workers, num_segs, num_merges, num_partials;
} fil_split;

static int64_t fil_tiles(int32_t len) {
    return ((int64_t)len + FIL_DECODE_TILE - 1) / FIL_DECODE_TILE;
}

/* Cuts every sequence into k chunks of whole 16-token tiles, the same cut for all its KV heads,
 * and gives each (sequence, chunk, KV head) to one warp. The chunk aims at
 * c = max(ceil(total tiles / target warps), FIL_DECODE_MIN_TILES); a sequence of n tiles gets
 * k = max(1, round(n / c)) chunks, so an even batch is not cut into one long and one tiny piece.
 * Warps run in chunk order, the KV heads of one chunk side by side: the warps of a CTA read
 * neighbouring rows of the same pages. Pairs cut in k > 1 leave k partial states that the merge
 * kernel combines.
 * Bounds: k >= 2 needs n >= 1.5 c, so k <= n / c + 1/2 <= (4/3) n / c and the partials number
 * at most (4/3) total / c <= (4/3) target; the warps at most pairs + (4/3) target. With split_kv
 * off, k = 1 everywhere. */
static ap_status fil_decode_split(const ap_backend *b, const ap_batch *batch, fil_split *s,
                                  ap_msgbuf *msg) {
    const int32_t hk = b->model.num_kv_heads;
    int64_t total = 0;
    for (int32_t i = 0; i < batch->num_seqs; i++) total += hk * fil_tiles(batch->seq_lens_host[i]);
    int64_t aim = (total + b->target_workers - 1) / b->target_workers;
    if (aim < FIL_DECODE_MIN_TILES) aim = FIL_DECODE_MIN_TILES;
    s->indptr[0] = 0;
    for (int32_t i = 0; i < batch->num_seqs; i++) {
        const int32_t len = batch->seq_lens_host[i];
        const int64_t tiles = fil_tiles(len);
        int64_t k = b->split_kv ? (tiles + aim / 2) / aim : 1;
        if (k < 1) k = 1;
        const int64_t chunk = (tiles + k - 1) / k;
        k = (tiles + chunk - 1) / chunk;
        const int32_t first_partial = s->num_partials;
        for (int64_t j = 0; j < k; j++) {
            const int64_t begin = j * chunk * FIL_DECODE_TILE;
            const int64_t end = (j + 1) * chunk * FIL_DECODE_TILE;
            for (int32_t h = 0; h < hk; h++) {
                s->seg_partial[s->num_segs] = k > 1 ? first_partial + (int32_t)(h * k + j) : -1;
                s->segs[s->num_segs++] =
                    (fil_decode_seg){i, h, (int32_t)begin, end < len ? (int32_t)end : len};
                s->indptr[++s->num_workers] = s->num_segs;
            }
        }
        if (k == 1) continue;
        for (int32_t h = 0; h < hk; h++)
            s->merges[s->num_merges++] = (ap_kit_merge){i, h, first_partial + (int32_t)(h * k),
                                                        first_partial + (int32_t)((h + 1) * k)};
        s->num_partials += (int32_t)(hk * k);
    }
    if (s->num_partials > 2 * b->max_workers) {
        ap_msgbuf_add(msg, FIL_NAME ": internal: %d partials for %d workers", s->num_partials,
                      b->max_workers);
        return AP_ERR_INTERNAL;
    }
    return AP_OK;
}

/* ---- the plan of one batch ------------------------------------------------------------------ */

/* Extend's work list, written into the plan buffer at its capacity offset; the batch's one copy
 * moves it with the rest, and fil_plan_batch points the plan at its device place. */
static ap_status fil_plan_extend(ap_backend *b, const ap_batch *batch, void *items_host,
                                 size_t items_bytes, ap_dtype kv_dtype, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    /* head_dim_v: the model's, equal to head_dim_qk here (validate.c) */
    ap_kit_prefill_plan_args args = ap_kit_prefill_paged_args(m, batch);
    args.host_scratch = items_host;
    args.buffer_bytes = items_bytes;
    args.caller_uploads = 1;
    /* the K/V type the kernel reads (the caller's: ap_kit_staged_kv_dtype, or fp8 as stored
     * where there is no memory to stage it; extend_nvfp4.c) */
    args.kv_dtype = kv_dtype;
    args.split_space = &b->plan_buffer; /* split-KV for a short chunk over a long prefix */
    /* no prefix anywhere: extend.c may read the saved k / v in place */
    b->plan.extend_fresh = ap_kit_batch_fresh(batch, m->page_size);
    return fil_extend_plan_build(&args, NULL, &b->plan.extend, msg);
}

/* Moves the arrays planned at their capacity offsets down to the compact layout of `used`, so
 * one copy moves only what this batch needs. Regions only move down, in order. */
static void fil_plan_compact(char *base, fil_plan_layout from, fil_plan_layout to,
                             fil_plan_sizes used) {
    memmove(base + to.segs, base + from.segs, used.segs * sizeof(fil_decode_seg));
    memmove(base + to.seg_partial, base + from.seg_partial, used.segs * sizeof(int32_t));
    memmove(base + to.merges, base + from.merges, used.merges * sizeof(ap_kit_merge));
    memmove(base + to.slots, base + from.slots, used.tokens * sizeof(int32_t));
    memmove(base + to.items, base + from.items, used.extend_bytes);
}

ap_status fil_plan_batch(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg) {
    b->plan.ready = 0;
    /* ABI 1.1's ragged K/V source: keys from args.k/v rows, which these kernels do not read */
    if (AP_HAS_FIELD(batch, ap_batch, kv_causal) && batch->kv_indptr != NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": plan: the ragged K/V source (batch.kv_indptr) is not "
                                    "implemented: keys come from the paged cache only");
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_batch_check(batch, &b->model, &b->plan.max_page_index, FIL_NAME, msg);
    if (st == AP_OK) st = fil_batch_check_limits(batch, msg);
    if (st != AP_OK) return st;
    /* the previous batch's copy must have left the pinned buffer before it is rewritten */
    st = ap_kit_plan_buffer_begin(&b->plan_buffer, FIL_NAME, msg);
    if (st != AP_OK) return st;
    char *host = b->plan_buffer.host;
    const fil_plan_layout cap = fil_layout_of(fil_plan_bounds(&b->model, b->max_workers));
    fil_plan_slots(b, batch, (int32_t *)(host + cap.slots));

    fil_split split = {(int32_t *)(host + cap.indptr),
                       (fil_decode_seg *)(host + cap.segs),
                       (int32_t *)(host + cap.seg_partial),
                       (ap_kit_merge *)(host + cap.merges),
                       0,
                       0,
                       0,
                       0};
    if (batch->mode == AP_MODE_DECODE) {
        st = fil_decode_split(b, batch, &split, msg);
    } else {
        split.indptr[0] = 0;
        /* an nvfp4 cache is staged to the query's type, an fp8 one too where the plan is then the
         * Hopper kernel's (its paged source reads 16-bit K/V only; the mma.sync kernel reads fp8
         * as stored) */
        st = fil_plan_extend(b, batch, host + cap.items, cap.end - cap.items,
                             ap_kit_staged_kv_dtype(&b->model), msg);
    }
    int32_t replan = 0;
    if (st == AP_OK) st = fil_extend_nvfp4_reserve(b, batch, &replan, msg);
    if (st == AP_OK && replan) /* no memory to stage the fp8 cache: read as stored */
        st = fil_plan_extend(b, batch, host + cap.items, cap.end - cap.items, b->model.kv_dtype,
                             msg);
    if (st != AP_OK) return st;

    const size_t items = batch->mode == AP_MODE_EXTEND ? (size_t)b->plan.extend.num_items : 0;
    fil_plan_sizes used = {(size_t)split.num_workers, (size_t)split.num_segs,
                           (size_t)split.num_merges, (size_t)batch->num_tokens,
                           items * sizeof(ap_kit_prefill_item)};
    const fil_plan_layout lay = fil_layout_of(used);
    fil_plan_compact(host, cap, lay, used);
    st = ap_kit_plan_buffer_upload(&b->plan_buffer, lay.end, stream, FIL_NAME, msg);
    if (st != AP_OK) return st;

    char *dev = b->plan_buffer.dev;
    fil_batch_plan *p = &b->plan;
    p->mode = batch->mode;
    p->num_seqs = batch->num_seqs;
    p->num_tokens = batch->num_tokens;
    p->qo_indptr = batch->qo_indptr;
    p->kv_page_indptr = batch->kv_page_indptr;
    p->kv_page_indices = batch->kv_page_indices;
    p->kv_last_page_len = batch->kv_last_page_len;
    p->slots = (const int32_t *)(dev + lay.slots);
    p->extend.items = dev + lay.items;
    p->decode = (fil_decode_plan){
        .num_workers = split.num_workers,
        .num_merges = split.num_merges,
        .worker_indptr = (const int32_t *)(dev + lay.indptr),
        .segs = (const fil_decode_seg *)(dev + lay.segs),
        .seg_partial = (const int32_t *)(dev + lay.seg_partial),
        .merges = (const ap_kit_merge *)(dev + lay.merges),
        .partial_out = b->partial_out,
        .partial_lse = b->partial_lse,
    };
    p->ready = 1;
    return AP_OK;
}
