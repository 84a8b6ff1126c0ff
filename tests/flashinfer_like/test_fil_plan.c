/* test_fil_plan.c: the split-KV decode plan and the append slots, built on the host (no GPU). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/flashinfer_like/glue.h"
#include "tests/common/test_expect.h"

/* The kit's runtime calls under plan.c, replaced: the "device" buffer is host memory here. */
ap_status ap_kit_event_wait(void *event, const char *who, ap_msgbuf *msg) {
    (void)event, (void)who, (void)msg;
    return AP_OK;
}
ap_status ap_kit_event_record(void *event, void *stream, const char *who, ap_msgbuf *msg) {
    (void)event, (void)stream, (void)who, (void)msg;
    return AP_OK;
}
ap_status ap_kit_copy_to_device(void *dst, const void *src, size_t bytes, void *stream,
                                const char *who, const char *what, ap_msgbuf *msg) {
    (void)stream, (void)who, (void)what, (void)msg;
    memcpy(dst, src, bytes);
    return AP_OK;
}
size_t fil_extend_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim,
                             int32_t num_qo_heads, int32_t num_kv_heads) {
    (void)head_dim, (void)num_qo_heads, (void)num_kv_heads;
    return ((size_t)max_tokens + (size_t)max_batch + 1) * 16; /* one item per token at most */
}
/* Extend's work list, replaced: one item per sequence, {seq, 0, 100 - seq, 0}, written where
 * plan.c asks, the copy left to plan.c (what the real one does when caller_uploads is set). The
 * K/V types it was asked to plan for, in order, are kept. */
static ap_dtype planned_kv[4];
static int plans;
ap_status fil_extend_plan_build(const ap_kit_prefill_plan_args *args, void *stream,
                                fil_extend_plan *plan, ap_msgbuf *msg) {
    (void)stream, (void)msg;
    if (plans < 4) planned_kv[plans] = args->kv_dtype;
    plans++;
    if (!args->caller_uploads || args->buffer_bytes < (size_t)args->num_seqs * 16)
        return AP_ERR_INVALID_ARGUMENT;
    int32_t *items = args->host_scratch;
    for (int32_t i = 0; i < args->num_seqs; i++) {
        items[4 * i] = i;
        items[4 * i + 1] = 0;
        items[4 * i + 2] = 100 - i;
        items[4 * i + 3] = 0;
    }
    plan->num_items = args->num_seqs;
    return AP_OK;
}

/* Staging (extend_nvfp4.c, tested in test_fil_nvfp4.c), replaced: with stub_no_memory set it
 * answers as for an fp8 cache whose staging buffer cannot be allocated. */
static int stub_no_memory;
ap_status fil_extend_nvfp4_reserve(ap_backend *b, const ap_batch *batch, int32_t *replan,
                                   ap_msgbuf *msg) {
    (void)batch, (void)msg;
    b->plan.extend_staged = 0;
    *replan = stub_no_memory;
    return AP_OK;
}

/* An instance with only what fil_plan_batch reads, and its plan buffer in host memory (the
 * stubs' "device"). */
static void test_backend(ap_backend *b, int32_t page_size, int32_t num_kv_heads, int32_t max_batch,
                         int32_t max_tokens, int32_t max_workers) {
    memset(b, 0, sizeof *b);
    b->model = (ap_model){.struct_size = sizeof(ap_model),
                          .num_qo_heads = 4 * num_kv_heads,
                          .num_kv_heads = num_kv_heads,
                          .head_dim_qk = 128,
                          .head_dim_v = 128,
                          .page_size = page_size,
                          .max_batch = max_batch,
                          .max_tokens = max_tokens};
    b->max_workers = b->target_workers = max_workers;
    b->group = 4;
    b->plan_buffer.bytes = fil_plan_capacity(&b->model, max_workers);
    b->plan_buffer.host = malloc(b->plan_buffer.bytes);
    b->plan_buffer.dev = calloc(1, b->plan_buffer.bytes);
}

static void test_backend_free(ap_backend *b) {
    free(b->plan_buffer.host), free(b->plan_buffer.dev);
}

/* A batch whose device arrays are its host mirrors. */
static ap_batch test_batch(ap_forward_mode mode, int32_t num_seqs, int32_t num_tokens,
                           int32_t num_pages_total, const int32_t *qo, const int32_t *indptr,
                           const int32_t *pages, const int32_t *last, const int32_t *lens) {
    return (ap_batch){.struct_size = sizeof(ap_batch),
                      .mode = mode,
                      .num_seqs = num_seqs,
                      .num_tokens = num_tokens,
                      .num_pages_total = num_pages_total,
                      .qo_indptr = qo,
                      .kv_page_indptr = indptr,
                      .kv_page_indices = pages,
                      .kv_last_page_len = last,
                      .seq_lens = lens,
                      .qo_indptr_host = qo,
                      .kv_page_indptr_host = indptr,
                      .kv_page_indices_host = pages,
                      .kv_last_page_len_host = last,
                      .seq_lens_host = lens};
}

/* Plans a decode batch of `num_seqs` sequences of lens[i] tokens (page size 16, pages in
 * reverse order) and checks: every token of every (sequence, KV head) is in exactly one
 * segment; segments start on tile boundaries; a split pair's segments own its merge's partial
 * slots and an unsplit one writes directly; the warps stay within the bound; each new token's
 * slot is its page's slot. */
static void check_plan(const char *what, int32_t num_seqs, const int32_t *lens, int32_t hk,
                       int32_t max_workers, int32_t target, int split) {
    const int32_t ps = 16;
    ap_backend b;
    test_backend(&b, ps, hk, num_seqs, num_seqs, max_workers);
    b.target_workers = target;
    b.split_kv = split;
    int32_t *qo = malloc(sizeof(int32_t) * (size_t)(num_seqs + 1));
    int32_t *indptr = malloc(sizeof(int32_t) * (size_t)(num_seqs + 1));
    int32_t *last = malloc(sizeof(int32_t) * (size_t)num_seqs);
    int32_t total_pages = 0;
    for (int32_t i = 0; i < num_seqs; i++) total_pages += (lens[i] + ps - 1) / ps;
    int32_t *pages = malloc(sizeof(int32_t) * (size_t)total_pages);
    for (int32_t p = 0; p < total_pages; p++) pages[p] = total_pages - 1 - p;
    qo[0] = indptr[0] = 0;
    for (int32_t i = 0; i < num_seqs; i++) {
        qo[i + 1] = i + 1;
        indptr[i + 1] = indptr[i] + (lens[i] + ps - 1) / ps;
        last[i] = lens[i] - (indptr[i + 1] - indptr[i] - 1) * ps;
    }
    ap_batch batch =
        test_batch(AP_MODE_DECODE, num_seqs, num_seqs, total_pages, qo, indptr, pages, last, lens);
    char text[512] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
    EXPECT(st == AP_OK, "%s: plan, got %d '%s'", what, (int)st, text);
    if (st != AP_OK) return;
    const fil_decode_plan *p = &b.plan.decode;
    int32_t max_len = 0;
    for (int32_t i = 0; i < num_seqs; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    unsigned char *cover = calloc((size_t)num_seqs * hk * max_len, 1);
    int32_t max_partial = -1, direct = 0;
    for (int32_t w = 0; w < p->num_workers; w++) {
        EXPECT(p->worker_indptr[w + 1] > p->worker_indptr[w], "%s: worker %d has work", what, w);
        for (int32_t s = p->worker_indptr[w]; s < p->worker_indptr[w + 1]; s++) {
            fil_decode_seg g = p->segs[s];
            EXPECT(g.begin % FIL_DECODE_TILE == 0 && g.begin < g.end && g.end <= lens[g.seq],
                   "%s: segment %d [%d, %d) of a sequence of %d", what, s, g.begin, g.end,
                   lens[g.seq]);
            for (int32_t t = g.begin; t < g.end; t++)
                cover[((size_t)g.seq * hk + g.kv_head) * max_len + t]++;
            if (p->seg_partial[s] < 0) direct++;
            max_partial = p->seg_partial[s] > max_partial ? p->seg_partial[s] : max_partial;
        }
    }
    size_t bad = 0;
    for (int32_t i = 0; i < num_seqs; i++)
        for (int32_t h = 0; h < hk; h++)
            for (int32_t t = 0; t < lens[i]; t++)
                bad += cover[((size_t)i * hk + h) * max_len + t] != 1;
    EXPECT(bad == 0, "%s: %zu tokens not covered exactly once", what, bad);
    int32_t partials = 0;
    for (int32_t m = 0; m < p->num_merges; m++) {
        ap_kit_merge g = p->merges[m];
        EXPECT(g.first_partial == partials && g.end_partial - g.first_partial >= 2,
               "%s: merge %d owns partials [%d, %d)", what, m, g.first_partial, g.end_partial);
        for (int32_t s = 0; s < p->worker_indptr[p->num_workers]; s++) {
            int32_t slot = p->seg_partial[s];
            if (slot >= g.first_partial && slot < g.end_partial)
                EXPECT(p->segs[s].seq == g.seq && p->segs[s].kv_head == g.kv_head,
                       "%s: partial %d belongs to merge %d's pair", what, slot, m);
        }
        partials = g.end_partial;
    }
    EXPECT(partials == max_partial + 1, "%s: %d partials, highest slot %d", what, partials,
           max_partial);
    EXPECT(partials <= 2 * max_workers, "%s: %d partials for %d workers", what, partials,
           max_workers);
    EXPECT(split || p->num_merges == 0, "%s: no merge without split", what);
    for (int32_t i = 0; i < num_seqs; i++) {
        int32_t pos = lens[i] - 1;
        EXPECT(b.plan.slots[i] == pages[indptr[i] + pos / ps] * ps + pos % ps,
               "%s: slot of sequence %d", what, i);
    }
    printf("%-28s workers %5d merges %4d partials %5d direct %5d\n", what, p->num_workers,
           p->num_merges, partials, direct);
    free(cover), free(pages), free(last), free(indptr), free(qo);
    test_backend_free(&b);
}

/* A batch that breaks a rule gets AP_ERR_SHAPE_MISMATCH naming the sequence. */
static void check_refusal(void) {
    ap_backend b;
    test_backend(&b, 16, 1, 2, 2, 8);
    int32_t qo[3] = {0, 1, 2}, indptr[3] = {0, 1, 2}, pages[2] = {0, 1}, last[2] = {5, 7};
    int32_t lens[2] = {5, 8}; /* sequence 1: one page holding 7 tokens is not 8 */
    ap_batch batch = test_batch(AP_MODE_DECODE, 2, 2, 2, qo, indptr, pages, last, lens);
    char text[512] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(fil_plan_batch(&b, &batch, NULL, &msg) == AP_ERR_SHAPE_MISMATCH &&
               strstr(text, "sequence 1") != NULL,
           "the inconsistent sequence named, got '%s'", text);
    test_backend_free(&b);
}

/* CSR arrays whose steps are each >= 0 only because int32 subtraction wraps: 0, 5, INT32_MIN, -1,
 * 10 ends at 10 yet puts sequence 1 at token (and page) INT32_MIN with 2^31 - 5 of them. The plan
 * must refuse them before it writes a slot or reads a page index. */
static void check_wrap(ap_forward_mode mode) {
    ap_backend b;
    test_backend(&b, 1, 1, 4, 10, 8);
    int32_t wrap[5] = {0, 5, INT32_MIN, -1, 10}, pages[10] = {0};
    int32_t last[4] = {1, 1, 1, 1}, lens[4] = {5, INT32_MAX - 4, INT32_MAX, 11};
    /* decode: one token each, the wrap in kv_page_indptr alone (0, 1, INT32_MIN, -1, 1) */
    int32_t qo_decode[5] = {0, 1, 2, 3, 4}, pages_decode[5] = {0, 1, INT32_MIN, -1, 1};
    int32_t lens_decode[4] = {1, INT32_MAX, INT32_MAX, 2};
    const int decode = mode == AP_MODE_DECODE;
    ap_batch batch =
        test_batch(mode, 4, decode ? 4 : 10, decode ? 1 : 10, decode ? qo_decode : wrap,
                   decode ? pages_decode : wrap, pages, last, decode ? lens_decode : lens);
    char text[512] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
    EXPECT(st == AP_ERR_SHAPE_MISMATCH && strstr(text, "indptr") != NULL,
           "%s: wrapped indptr refused, got %d '%s'", decode ? "decode" : "extend", (int)st, text);
    test_backend_free(&b);
}

/* plugin_api.h's batch rules: every sequence has at least one page, so an empty extend sequence
 * (q_len 0, seq_len 0) without one is refused as the core and cpu_ref refuse it. */
static void check_zero_page(void) {
    ap_backend b;
    test_backend(&b, 16, 1, 2, 2, 8);
    int32_t qo[3] = {0, 1, 1}, indptr[3] = {0, 1, 1}, pages[1] = {0}, last[2] = {1, 1};
    int32_t lens[2] = {1, 0};
    ap_batch batch = test_batch(AP_MODE_EXTEND, 2, 1, 1, qo, indptr, pages, last, lens);
    char text[512] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
    EXPECT(st == AP_ERR_SHAPE_MISMATCH && strstr(text, "sequence 1: 0 pages") != NULL,
           "a sequence without a page refused, got %d '%s'", (int)st, text);
    test_backend_free(&b);
}

/* An extend batch's work items travel in the plan buffer's one copy: after planning, the
 * "device" side holds them, 16-byte aligned, after the slots, which are still right. */
static void check_extend_items(void) {
    ap_backend b;
    test_backend(&b, 4, 1, 3, 8, 8);
    /* three sequences of 2, 3 and 1 new tokens over 5, 3 and 9 cached ones */
    int32_t qo[4] = {0, 2, 5, 6}, indptr[4] = {0, 2, 3, 6}, pages[6] = {7, 3, 5, 0, 1, 2};
    int32_t last[3] = {1, 3, 1}, lens[3] = {5, 3, 9};
    ap_batch batch = test_batch(AP_MODE_EXTEND, 3, 6, 6, qo, indptr, pages, last, lens);
    char text[512] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
    EXPECT(st == AP_OK, "extend plan: status %d '%s'", (int)st, text);
    const char *dev = b.plan_buffer.dev;
    const int32_t *items = (const int32_t *)b.plan.extend.items;
    EXPECT(b.plan.extend.num_items == 3 && (const char *)items > (const char *)b.plan.slots &&
               ((const char *)items - dev) % 16 == 0 &&
               (const char *)items + 3 * 16 <= dev + b.plan_buffer.bytes,
           "items at offset %td of %zu", (const char *)items - dev, b.plan_buffer.bytes);
    for (int32_t i = 0; i < 3; i++)
        EXPECT(items[4 * i] == i && items[4 * i + 1] == 0 && items[4 * i + 2] == 100 - i &&
                   items[4 * i + 3] == 0,
               "item %d: {%d, %d, %d, %d}", i, items[4 * i], items[4 * i + 1], items[4 * i + 2],
               items[4 * i + 3]);
    /* new tokens sit at positions 3, 4 | 0, 1, 2 | 8: page * 4 + offset, the pages 7 3 | 5 | 0 1 2 */
    const int32_t want[6] = {7 * 4 + 3, 3 * 4 + 0, 5 * 4 + 0, 5 * 4 + 1, 5 * 4 + 2, 2 * 4 + 0};
    for (int32_t t = 0; t < 6; t++)
        EXPECT(b.plan.slots[t] == want[t], "token %d: slot %d, want %d", t, b.plan.slots[t],
               want[t]);
    test_backend_free(&b);
}

/* An fp8 cache: the extend is planned for the staged bf16 copy (the Hopper kernel's paged
 * source), and where staging finds no memory, planned again for the fp8 cache as stored. */
static void check_fp8_replan(void) {
    int32_t qo[4] = {0, 2, 5, 6}, indptr[4] = {0, 2, 3, 6}, pages[6] = {7, 3, 5, 0, 1, 2};
    int32_t last[3] = {1, 3, 1}, lens[3] = {5, 3, 9};
    for (int no_memory = 0; no_memory < 2; no_memory++) {
        ap_backend b;
        test_backend(&b, 4, 1, 3, 8, 8);
        b.model.dtype = AP_DTYPE_BF16;
        b.model.kv_dtype = AP_DTYPE_FP8_E4M3;
        ap_batch batch = test_batch(AP_MODE_EXTEND, 3, 6, 6, qo, indptr, pages, last, lens);
        char text[512] = "";
        ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
        plans = 0;
        stub_no_memory = no_memory;
        ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
        EXPECT(st == AP_OK && plans == 1 + no_memory && planned_kv[0] == AP_DTYPE_BF16,
               "fp8 extend (no memory %d): status %d, %d plans, first for %s", no_memory, (int)st,
               plans, ap_dtype_str(planned_kv[0]));
        if (no_memory)
            EXPECT(planned_kv[1] == AP_DTYPE_FP8_E4M3 && b.plan.extend.num_items == 3 &&
                       !b.plan.extend_staged,
                   "planned again for fp8 as stored: %s, %d items", ap_dtype_str(planned_kv[1]),
                   b.plan.extend.num_items);
        test_backend_free(&b);
    }
    stub_no_memory = 0;
}

/* A decode sequence within 32 tokens of 2^31 would overflow the kernel's int32 token cursor
 * (pos + 32 steps past INT32_MAX): refused, while one just below the limit plans. Page 0 is named
 * over and over, which the batch rules allow. */
static void check_decode_len_limit(void) {
    const int32_t ps = 128, pages_needed = (int32_t)(((int64_t)INT32_MAX + ps - 1) / ps);
    ap_backend b;
    test_backend(&b, ps, 1, 1, 1, 8);
    b.split_kv = 1;
    int32_t *pages = calloc((size_t)pages_needed, sizeof *pages);
    const int32_t lens[2] = {INT32_MAX - 2 * FIL_DECODE_TILE + 1, INT32_MAX - 2 * FIL_DECODE_TILE};
    for (int i = 0; i < 2; i++) {
        int32_t qo[2] = {0, 1}, last[1] = {(lens[i] - 1) % ps + 1};
        int32_t indptr[2] = {0, (lens[i] - last[0]) / ps + 1}, seq_lens[1] = {lens[i]};
        ap_batch batch =
            test_batch(AP_MODE_DECODE, 1, 1, indptr[1], qo, indptr, pages, last, seq_lens);
        char text[512] = "";
        ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
        ap_status st = fil_plan_batch(&b, &batch, NULL, &msg);
        ap_status want = i == 0 ? AP_ERR_UNSUPPORTED : AP_OK;
        EXPECT(st == want, "decode seq_len %d: status %d, want %d '%s'", lens[i], (int)st,
               (int)want, text);
    }
    free(pages);
    test_backend_free(&b);
}

int main(void) {
    int32_t b64[64], b8[8], b1[1] = {8192}, mixed[6] = {1, 7, 333, 1031, 5000, 16};
    for (int i = 0; i < 64; i++) b64[i] = 4096;
    for (int i = 0; i < 8; i++) b8[i] = 32768;
    check_plan("B64 L4096, target 528", 64, b64, 8, 1056, 528, 1);
    check_plan("B64 L4096, split off", 64, b64, 8, 1056, 528, 0);
    check_plan("B64 L4096, target 1056", 64, b64, 8, 1056, 1056, 1);
    check_plan("B1 L8192", 1, b1, 8, 1056, 528, 1);
    check_plan("B8 L32768", 8, b8, 8, 1056, 528, 1);
    check_plan("mixed lengths", 6, mixed, 4, 1056, 528, 1);
    check_plan("mixed, few warps", 6, mixed, 4, 7, 7, 1);
    check_plan("mixed, one warp", 6, mixed, 2, 1, 1, 1);
    check_refusal();
    check_wrap(AP_MODE_DECODE);
    check_wrap(AP_MODE_EXTEND);
    check_decode_len_limit();
    check_fp8_replan();
    check_zero_page();
    check_extend_items();
    printf("%s\n", failures == 0 ? "ok" : "FAILED");
    return failures != 0;
}
