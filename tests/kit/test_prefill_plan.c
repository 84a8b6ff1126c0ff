/* test_prefill_plan.c: the kit's prefill plan on the host (no GPU): work items of the paged and
 * the ragged K/V source, causal and chunk, sequences without keys, every refusal, and the plan
 * arguments of a paged batch (ap_kit_prefill_paged_args). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/common/prefill.h"
#include "backends/common/prefill_internal.h"
#include "tests/common/test_expect.h"
#include "tests/common/test_model.h"

/* Stubs for what prefill_kernel.cu and kit_runtime.cu define: the tile rows it builds (the same
 * table) and the copy, which caller_uploads plans never make. */
int32_t ap_kit_prefill_default_tile_rows(int32_t head_dim_qk, int32_t head_dim_v) {
    if (head_dim_qk == 192 && head_dim_v == 128) return 128;
    if (head_dim_qk != head_dim_v) return 0;
    return head_dim_qk == 64 || head_dim_qk == 128 ? 128 : head_dim_qk == 256 ? 64 : 0;
}
int32_t ap_kit_prefill_tile_rows_built(int32_t head_dim_qk, int32_t head_dim_v, int32_t rows) {
    return rows != 0 && rows == ap_kit_prefill_default_tile_rows(head_dim_qk, head_dim_v);
}
/* prefill_hopper.cu's choice: no Hopper device here, unless a case turns the stub on (1: ragged
 * sources, 2: paged too); then 128 rows of (128 / pack) tokens x the group, pack the largest
 * power of two dividing the group, as prefill_hopper.cuh's pack_shift_for gives for
 * check_hopper's batch (21% of its one-head rows would be padding). */
static int hopper_stub;
int32_t ap_kit_prefill_hopper_tile_rows(const ap_kit_prefill_plan_args *args) {
    const int32_t group = args->num_qo_heads / args->num_kv_heads;
    return hopper_stub && args->kv_dtype == AP_DTYPE_BF16 &&
                   (args->kv_indptr_host != NULL || hopper_stub == 2) && args->head_dim_qk == 128
               ? 128 * group / (group & -group)
               : 0;
}
/* prefill_hopper.cu's split count: the same rule over the stubbed plans' work tiles (32-token
 * tiles: 4 heads packed) on an H100's 132 SMs. */
int32_t ap_kit_prefill_hopper_splits(const ap_kit_prefill_plan *plan, int64_t longest_keys) {
    const int32_t pack = 128 / plan->tile_tokens;
    return ap_kit_prefill_split_count((int64_t)plan->num_items * (plan->num_qo_heads / pack),
                                      longest_keys, 132);
}
/* The plan buffer's event calls (kit_plan_buffer.c), never made by a plan. */
ap_status ap_kit_event_wait(void *event, const char *who, ap_msgbuf *msg) {
    (void)event, (void)who, (void)msg;
    failures++;
    return AP_OK;
}
ap_status ap_kit_event_record(void *event, void *stream, const char *who, ap_msgbuf *msg) {
    (void)event, (void)stream, (void)who, (void)msg;
    failures++;
    return AP_OK;
}
ap_status ap_kit_copy_to_device(void *dst, const void *src, size_t bytes, void *stream,
                                const char *who, const char *what, ap_msgbuf *msg) {
    (void)dst, (void)src, (void)bytes, (void)stream, (void)who, (void)what, (void)msg;
    failures++;
    printf("FAIL: a caller_uploads plan copied\n");
    return AP_OK;
}

/* The stager's device calls (kit_nvfp4_extend.c), replaced: allocations counted, failing on
 * demand with the kit's message line. */
static int allocs, fail_alloc;
ap_status ap_kit_device_alloc(size_t bytes, void **out, const char *who, ap_msgbuf *msg) {
    allocs++;
    *out = NULL;
    if (fail_alloc) {
        ap_msgbuf_add(msg, "%s: cudaMalloc: out of memory", who);
        return AP_ERR_OUT_OF_MEMORY;
    }
    *out = malloc(bytes);
    return *out != NULL ? AP_OK : AP_ERR_OUT_OF_MEMORY;
}
void ap_kit_device_free(void *ptr) {
    free(ptr);
}
ap_status ap_kit_nvfp4_stage_run(const ap_kit_nvfp4_stage_args *args, void *stream, const char *who,
                                 ap_msgbuf *msg) {
    (void)args, (void)stream, (void)who, (void)msg;
    return AP_OK;
}

#define MAX_ITEMS 256
static ap_kit_prefill_item scratch[MAX_ITEMS];
static char msg_text[512];

static ap_kit_prefill_plan_args ragged_args(int32_t n, const int32_t *qo, const int32_t *kv,
                                            int32_t causal, int32_t heads) {
    return (ap_kit_prefill_plan_args){.num_seqs = n,
                                      .qo_indptr_host = qo,
                                      .kv_indptr_host = kv,
                                      .head_dim_qk = 192,
                                      .head_dim_v = 128,
                                      .num_qo_heads = heads,
                                      .num_kv_heads = heads,
                                      .causal = causal,
                                      .host_scratch = scratch,
                                      .buffer_bytes = sizeof scratch,
                                      .caller_uploads = 1};
}

static ap_status build(const ap_kit_prefill_plan_args *args, ap_kit_prefill_plan *plan) {
    ap_msgbuf msg = {sizeof(ap_msgbuf), msg_text, sizeof msg_text, 0};
    msg_text[0] = '\0';
    memset(scratch, 0xab, sizeof scratch);
    return ap_kit_prefill_plan_build(args, NULL, plan, "test", &msg);
}

/* Every (sequence, 128-token tile) once, its KV tile count as the kernel visits them, longest
 * first. */
static void check_items(const char *what, int32_t n, const int32_t *qo, const int32_t *kv,
                        int32_t causal) {
    ap_kit_prefill_plan plan;
    ap_kit_prefill_plan_args args = ragged_args(n, qo, kv, causal, 16);
    EXPECT(build(&args, &plan) == AP_OK, "%s: %s", what, msg_text);
    EXPECT(plan.ragged == 1 && plan.causal == causal && plan.tile_tokens == 128 &&
               plan.head_dim_qk == 192 && plan.head_dim_v == 128,
           "%s: plan header", what);
    int32_t expected = 0;
    for (int32_t i = 0; i < n; i++) expected += (qo[i + 1] - qo[i] + 127) / 128;
    EXPECT(plan.num_items == expected, "%s: %d items, expected %d", what, plan.num_items, expected);
    for (int32_t k = 0; k < plan.num_items; k++) {
        const ap_kit_prefill_item *it = &scratch[k];
        const int32_t q_len = qo[it->seq + 1] - qo[it->seq], kv_len = kv[it->seq + 1] - kv[it->seq];
        const int32_t t_end = it->q_start + 128 < q_len ? it->q_start + 128 : q_len;
        const int32_t kv_end = causal ? kv_len - q_len + t_end : kv_len;
        EXPECT(it->seq >= 0 && it->seq < n && it->q_start % 128 == 0 && it->q_start < q_len,
               "%s: item %d (seq %d, q_start %d)", what, k, it->seq, it->q_start);
        EXPECT(it->kv_tiles == (kv_end + 63) / 64, "%s: item %d kv_tiles %d, expected %d", what, k,
               it->kv_tiles, (kv_end + 63) / 64);
        EXPECT(k == 0 || scratch[k - 1].kv_tiles >= it->kv_tiles, "%s: not longest first", what);
        for (int32_t j = 0; j < k; j++)
            EXPECT(scratch[j].seq != it->seq || scratch[j].q_start != it->q_start,
                   "%s: item %d twice", what, k);
    }
}

static void check_refusals(void) {
    ap_kit_prefill_plan plan;
    const int32_t qo[] = {0, 17, 317}, kv[] = {0, 17, 317}, kv_down[] = {0, 300, 17};
    ap_kit_prefill_plan_args args = ragged_args(2, qo, kv_down, 0, 16);
    EXPECT(build(&args, &plan) == AP_ERR_UNSUPPORTED && strstr(msg_text, "sequence 1") != NULL,
           "decreasing kv_indptr: %s", msg_text);
    args = ragged_args(2, qo, kv, 1, 16);
    args.buffer_bytes = 2 * sizeof(ap_kit_prefill_item);
    EXPECT(build(&args, &plan) == AP_ERR_SHAPE_MISMATCH, "small buffer: %s", msg_text);
    args = ragged_args(2, qo, kv, 1, 16);
    args.head_dim_qk = args.head_dim_v = 96;
    EXPECT(build(&args, &plan) == AP_ERR_UNSUPPORTED && strstr(msg_text, "ragged") != NULL,
           "ragged 96/96 is not built: %s", msg_text);
    args = ragged_args(2, qo, kv, 1, 16);
    args.head_dim_qk = 128, args.head_dim_v = 64;
    EXPECT(build(&args, &plan) == AP_ERR_UNSUPPORTED && strstr(msg_text, "ragged") != NULL,
           "ragged 128/64 is not built: %s", msg_text);
    for (int32_t d = 64; d <= 256; d *= 2) {
        args = ragged_args(2, qo, kv, 1, 16);
        args.head_dim_qk = args.head_dim_v = d;
        args.num_kv_heads = 2; /* group 8 */
        EXPECT(build(&args, &plan) == AP_OK && plan.ragged == 1 && plan.head_dim_qk == d &&
                   plan.tile_tokens == ap_kit_prefill_default_tile_rows(d, d) / 8,
               "ragged %d/%d, group 8: %s", d, d, msg_text);
    }
    args = ragged_args(2, qo, kv, 1, 16);
    args.num_kv_heads = 1; /* group 16 */
    EXPECT(build(&args, &plan) == AP_ERR_UNSUPPORTED, "group 16: %s", msg_text);
    args = ragged_args(2, NULL, kv, 1, 16);
    EXPECT(build(&args, &plan) == AP_ERR_INVALID_ARGUMENT, "NULL qo_indptr_host: %s", msg_text);
    ap_msgbuf msg = {sizeof(ap_msgbuf), msg_text, sizeof msg_text, 0};
    EXPECT(ap_kit_prefill_check_config(0, 192, 128, AP_DTYPE_BF16, AP_DTYPE_BF16, 16, 16, 64,
                                       "test", &msg) == AP_ERR_UNSUPPORTED,
           "paged 192/128 is not built");
    msg.length = 0;
    EXPECT(ap_kit_prefill_check_config(1, 192, 128, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, 128, 128, 0,
                                       "test", &msg) == AP_OK,
           "ragged 192/128 fp8 K/V: %s", msg_text);
    EXPECT(ap_kit_prefill_plan_bytes(16384, 256, 192, 128, 128, 128) ==
               (16384 / 64 + 256 + 1) * sizeof(ap_kit_prefill_item),
           "plan bytes 192/128");
    EXPECT(ap_kit_prefill_plan_bytes(16384, 256, 96, 96, 16, 16) == 0, "plan bytes 96");
}

/* One causal sequence over pages of 64, head dim 128, 32 / 8 heads, through the kit's
 * ap_kit_prefill_paged_args, planned into the scratch for the caller to upload. */
static ap_kit_prefill_plan_args paged_args(const int32_t *qo, const int32_t *pages,
                                           const int32_t *last) {
    ap_model m = ap_test_model("kit-test", 32, 8, 128, 128, AP_DTYPE_BF16, AP_DTYPE_BF16);
    m.page_size = 64;
    const ap_batch b = {.num_seqs = 1,
                        .qo_indptr_host = qo,
                        .kv_page_indptr_host = pages,
                        .kv_last_page_len_host = last};
    ap_kit_prefill_plan_args args = ap_kit_prefill_paged_args(&m, &b);
    args.host_scratch = scratch;
    args.buffer_bytes = sizeof scratch;
    args.caller_uploads = 1;
    return args;
}

/* The paged source keeps the old plan: kv_len from the page table. */
static void check_paged(void) {
    const int32_t qo[] = {0, 300}, pages[] = {0, 7}, last[] = {12}; /* 6 * 64 + 12 = 396 */
    ap_kit_prefill_plan_args args = paged_args(qo, pages, last);
    ap_kit_prefill_plan plan;
    EXPECT(build(&args, &plan) == AP_OK && plan.ragged == 0 && plan.tile_tokens == 32 &&
               plan.num_items == 10,
           "paged: %s (%d items)", msg_text, plan.num_items);
    /* the longest: tokens 288..299 see 96 + 300 = 396 keys */
    EXPECT(scratch[0].q_start == 288 && scratch[0].kv_tiles == (396 + 63) / 64, "paged longest");
}

/* ap_kit_prefill_paged_args: a paged batch's mirrors and the model's shape, nothing else set. */
static void check_paged_args(void) {
    int32_t qo[] = {0, 3, 8}, pages[] = {0, 2, 5}, last[] = {7, 16};
    ap_model m = ap_test_model("kit-test", 32, 8, 192, 128, AP_DTYPE_BF16, AP_DTYPE_BF16);
    m.causal = 0;
    ap_batch b = {.num_seqs = 2,
                  .qo_indptr_host = qo,
                  .kv_page_indptr_host = pages,
                  .kv_last_page_len_host = last};
    const ap_kit_prefill_plan_args a = ap_kit_prefill_paged_args(&m, &b);
    EXPECT(a.num_seqs == 2 && a.qo_indptr_host == qo && a.kv_page_indptr_host == pages &&
               a.kv_last_page_len_host == last && a.page_size == 16 && a.head_dim_qk == 192 &&
               a.head_dim_v == 128 && a.num_qo_heads == 32 && a.num_kv_heads == 8 && a.causal == 0,
           "paged args: the batch's mirrors and the model's shape");
    EXPECT(a.kv_indptr_host == NULL && a.host_scratch == NULL && a.device_buffer == NULL &&
               a.buffer_bytes == 0 && a.caller_uploads == 0 && a.tile_rows == 0 &&
               a.kv_dtype == AP_DTYPE_NONE && a.tile_counters == NULL && a.split_space == NULL,
           "paged args: the rest left to the caller");
    m.causal = 1;
    EXPECT(ap_kit_prefill_paged_args(&m, &b).causal == 1, "paged args: causal as the model says");
}

/* Where the Hopper kernel takes a ragged 128/128 plan: items of its work tiles (group 4 packed:
 * 32 tokens x 4 heads), totals for its maps. */
static void check_hopper(void) {
    const int32_t qo[] = {0, 1, 18, 318, 1318}, kv[] = {0, 5, 22, 1322, 2322};
    ap_kit_prefill_plan_args args = ragged_args(4, qo, kv, 1, 32);
    args.head_dim_qk = args.head_dim_v = 128;
    args.num_kv_heads = 8;
    ap_kit_prefill_plan plan;
    hopper_stub = 1;
    EXPECT(build(&args, &plan) == AP_OK && plan.hopper == 0,
           "ragged 128/128 without kv_dtype stays on the mma.sync plan: %s (hopper %d)", msg_text,
           plan.hopper);
    args.kv_dtype = AP_DTYPE_BF16;
    EXPECT(build(&args, &plan) == AP_OK && plan.hopper == 1 && plan.tile_tokens == 32 &&
               plan.tile_rows == 128 && plan.num_q_tokens == 1318 && plan.num_kv_rows == 2322,
           "hopper plan: %s (hopper %d, tile_tokens %d)", msg_text, plan.hopper, plan.tile_tokens);
    /* 1 + 1 + 10 + 32 tiles of 32 tokens, the longest first: sequence 2's last two (1288 and
     * 1300 keys, both 21 units of 64), the earlier token first */
    EXPECT(plan.num_items == 44 && scratch[0].seq == 2 && scratch[0].q_start == 256 &&
               scratch[1].q_start == 288 && scratch[0].kv_tiles == (1300 + 63) / 64,
           "hopper items: %d, first seq %d q_start %d", plan.num_items, scratch[0].seq,
           scratch[0].q_start);
    args.tile_rows = 128; /* a caller's explicit tile keeps the mma.sync kernel's plan */
    EXPECT(build(&args, &plan) == AP_OK && plan.hopper == 0,
           "explicit tile_rows on ragged 128/128: %s (hopper %d)", msg_text, plan.hopper);
    hopper_stub = 0;
}

/* ap_kit_batch_fresh (kit_batch.c): a paged batch whose sequences hold only their new tokens. */
static void check_fresh(void) {
    const int32_t qo[] = {0, 17, 37}, pages[] = {0, 2, 4};
    int32_t last[] = {1, 4};
    ap_batch batch = {.struct_size = sizeof(ap_batch),
                      .num_seqs = 2,
                      .qo_indptr_host = qo,
                      .kv_page_indptr_host = pages,
                      .kv_last_page_len_host = last};
    EXPECT(ap_kit_batch_fresh(&batch, 16) == 1, "17 and 20 new tokens in 17 and 20 keys: fresh");
    last[1] = 5;
    EXPECT(ap_kit_batch_fresh(&batch, 16) == 0, "a key before sequence 1's new tokens: not fresh");
    last[1] = 4;
    EXPECT(ap_kit_batch_fresh(&batch, 32) == 0, "pages of 32: 33 and 36 keys, not fresh");
    batch.kv_last_page_len_host = NULL;
    EXPECT(ap_kit_batch_fresh(&batch, 16) == 0, "without the last-page mirror: not fresh");
    EXPECT(ap_kit_batch_fresh(NULL, 16) == 0, "no batch: not fresh");
}

/* ap_kit_staged_kv_dtype (kit_batch.c): the type a prefill plan names for each cache type. */
static void check_staged_kv_dtype(void) {
    ap_model m = {.struct_size = sizeof m, .dtype = AP_DTYPE_BF16};
    const ap_dtype kv[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2,
                           AP_DTYPE_NVFP4};
    const ap_dtype want[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_BF16, AP_DTYPE_FP8_E5M2,
                             AP_DTYPE_BF16};
    for (int i = 0; i < 5; i++) {
        m.kv_dtype = kv[i];
        EXPECT(ap_kit_staged_kv_dtype(&m) == want[i], "kv %s: plan names %s, want %s",
               ap_dtype_str(kv[i]), ap_dtype_str(ap_kit_staged_kv_dtype(&m)),
               ap_dtype_str(want[i]));
    }
    m.dtype = AP_DTYPE_F16, m.kv_dtype = AP_DTYPE_FP8_E4M3;
    EXPECT(ap_kit_staged_kv_dtype(&m) == AP_DTYPE_F16, "an f16 model stages fp8 to f16");
}

/* ap_kit_prefill_plan_staged (kit_prefill_staged.c): a paged batch over an fp8 cache is planned
 * for the staged bf16 copy where the Hopper kernel takes it and the staging buffer is had; with
 * no memory, planned again for fp8 as stored (mma.sync), the message as it was; an nvfp4 cache
 * without memory fails; a bf16 cache stages nothing. */
static void check_plan_staged(void) {
    const int32_t qo[] = {0, 300}, pages[] = {0, 7}, last[] = {12};
    ap_model m = {.struct_size = sizeof m,
                  .dtype = AP_DTYPE_BF16,
                  .kv_dtype = AP_DTYPE_FP8_E4M3,
                  .page_size = 64,
                  .num_qo_heads = 32,
                  .num_kv_heads = 8,
                  .head_dim_qk = 128,
                  .head_dim_v = 128};
    ap_kit_prefill_plan_args args = paged_args(qo, pages, last);
    ap_kit_nvfp4_stager stager = {0};
    ap_kit_prefill_plan plan;
    char text[256] = "earlier line";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, strlen(text)};
    int32_t staged = -1;
    hopper_stub = 2;
    ap_status st =
        ap_kit_prefill_plan_staged(&args, &m, 7, &stager, NULL, &plan, &staged, "test", &msg);
    EXPECT(st == AP_OK && staged == 1 && plan.hopper == 1 && args.kv_dtype == AP_DTYPE_BF16 &&
               allocs == 1 && stager.pages == 7,
           "fp8 staged: status %d, staged %d, hopper %d, %d allocations", (int)st, staged,
           plan.hopper, allocs);
    ap_kit_nvfp4_stager_free(&stager);
    fail_alloc = 1;
    st = ap_kit_prefill_plan_staged(&args, &m, 7, &stager, NULL, &plan, &staged, "test", &msg);
    EXPECT(st == AP_OK && staged == 0 && plan.hopper == 0 && args.kv_dtype == AP_DTYPE_FP8_E4M3 &&
               plan.num_items > 0 && strcmp(text, "earlier line") == 0,
           "fp8 without memory: status %d, staged %d, hopper %d, message '%s'", (int)st, staged,
           plan.hopper, text);
    m.kv_dtype = AP_DTYPE_NVFP4;
    st = ap_kit_prefill_plan_staged(&args, &m, 7, &stager, NULL, &plan, &staged, "test", &msg);
    EXPECT(st == AP_ERR_OUT_OF_MEMORY && strstr(text, "out of memory") != NULL,
           "nvfp4 without memory: status %d, message '%s'", (int)st, text);
    fail_alloc = 0;
    m.kv_dtype = AP_DTYPE_BF16;
    const int before = allocs;
    st = ap_kit_prefill_plan_staged(&args, &m, 7, &stager, NULL, &plan, &staged, "test", &msg);
    EXPECT(st == AP_OK && staged == 0 && plan.hopper == 1 && allocs == before,
           "bf16 stages nothing: status %d, staged %d", (int)st, staged);
    ap_kit_nvfp4_stager_free(&stager);
    hopper_stub = 0;
}

/* Split-KV: ap_kit_prefill_split_count's rule, and the plan's parts and workspace (a Hopper plan
 * of 16-bit K/V with a split space), with no memory (unsplit, no message) and without a space. */
static void check_split(void) {
    const struct {
        int64_t tiles, keys;
        int32_t sms, want;
    } rule[] = {{32, 8192, 132, 4},    {64, 8192, 132, 2}, {128, 8192, 132, 1}, {67, 8192, 132, 1},
                {1, 1 << 20, 132, 16}, {8, 1024, 132, 2},  {8, 1023, 132, 1},   {0, 8192, 132, 1},
                {32, 8192, 0, 1},      {-1, 8192, 132, 1}};
    for (size_t i = 0; i < sizeof rule / sizeof rule[0]; i++) {
        const int32_t got = ap_kit_prefill_split_count(rule[i].tiles, rule[i].keys, rule[i].sms);
        EXPECT(got == rule[i].want, "split count (%lld tiles, %lld keys, %d SMs): %d, want %d",
               (long long)rule[i].tiles, (long long)rule[i].keys, rule[i].sms, got, rule[i].want);
    }
    /* 4 new tokens over 8188 keys in pages of 64: one 32-token item x 8 head slots = 8 tiles,
     * 132 / 8 = 16 parts of 512 keys (8192 / 512 = 16) */
    const int32_t qo[] = {0, 4}, pages[] = {0, 128}, last[] = {60};
    ap_kit_prefill_plan_args args = paged_args(qo, pages, last);
    args.kv_dtype = AP_DTYPE_BF16;
    ap_kit_plan_buffer space = {0};
    args.split_space = &space;
    ap_kit_prefill_plan plan;
    hopper_stub = 2;
    allocs = 0;
    EXPECT(build(&args, &plan) == AP_OK && plan.hopper == 1 && plan.num_items == 1, "split: %s",
           msg_text);
    const size_t out_bytes = (16 * 4 * 32 * 128 * 2 + 255) / 256 * 256;
    EXPECT(plan.splits == 16 && allocs == 1 && plan.split_out == space.split &&
               (char *)plan.split_lse == (char *)space.split + out_bytes &&
               space.split_bytes >= out_bytes + 16 * 4 * 32 * sizeof(float),
           "split: %d parts, %d allocations, workspace %zu bytes", plan.splits, allocs,
           space.split_bytes);
    EXPECT(build(&args, &plan) == AP_OK && plan.splits == 16 && allocs == 1,
           "split again: the workspace kept (%d allocations)", allocs);
    ap_kit_device_free(space.split);
    space = (ap_kit_plan_buffer){0};
    fail_alloc = 1;
    EXPECT(build(&args, &plan) == AP_OK && plan.splits == 1 && plan.split_out == NULL &&
               msg_text[0] == '\0',
           "split without memory: %d parts, message \"%s\"", plan.splits, msg_text);
    fail_alloc = 0;
    args.split_space = NULL;
    EXPECT(build(&args, &plan) == AP_OK && plan.splits == 1, "no split space: %d parts",
           plan.splits);
    /* 128 new tokens: 4 items x 8 slots = 32 tiles, 4 parts */
    const int32_t qo128[] = {0, 128};
    args = paged_args(qo128, pages, last);
    args.kv_dtype = AP_DTYPE_BF16;
    args.split_space = &space;
    EXPECT(build(&args, &plan) == AP_OK && plan.num_items == 4 && plan.splits == 4,
           "128 tokens: %d items, %d parts", plan.num_items, plan.splits);
    ap_kit_device_free(space.split);
    hopper_stub = 0;
}

int main(void) {
    const int32_t qo[] = {0, 1, 18, 318, 1318};
    check_items("causal 1/17/300/1000", 4, qo, qo, 1);
    const int32_t kv_prefix[] = {0, 90, 423, 1423};
    const int32_t qo3[] = {0, 17, 317, 318};
    check_items("causal over a prefix", 3, qo3, kv_prefix, 1);
    const int32_t qo5[] = {0, 1, 18, 318, 1318, 1335}, kv5[] = {0, 1000, 1000, 1300, 1317, 1317};
    check_items("chunk with empty sequences", 5, qo5, kv5, 0);
    const int32_t kv0[] = {0, 0, 0};
    const int32_t qo2[] = {0, 17, 317};
    check_items("chunk, no keys at all", 2, qo2, kv0, 0);
    check_refusals();
    check_paged();
    check_paged_args();
    check_hopper();
    check_fresh();
    check_staged_kv_dtype();
    check_plan_staged();
    check_split();
    printf("%s\n", failures == 0 ? "ok" : "FAILED");
    return failures != 0;
}
