/* test_fil_nvfp4.c: nvfp4 extend's staging plan and launch arguments (flashinfer_like's glue over
 * the kit's stager, kit_nvfp4_extend.c), on the host (no GPU). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/flashinfer_like/glue.h"
#include "tests/common/test_expect.h"

/* The kit and extend calls under extend_nvfp4.c, replaced: allocations counted, the two
 * launches' arguments kept for the checks. */
static int allocs, frees, fail_alloc;
static ap_kit_nvfp4_stage_args staged_args;
static ap_layer extend_layer; /* what the extend saw, its cache copied out */
static ap_kv_cache extend_kv;
static const int32_t *extend_indices;

ap_status ap_kit_device_alloc(size_t bytes, void **out, const char *who, ap_msgbuf *msg) {
    allocs++;
    if (fail_alloc) { /* as the kit's: a line in msg */
        *out = NULL;
        ap_msgbuf_add(msg, "%s: cudaMalloc: out of memory", who);
        return AP_ERR_OUT_OF_MEMORY;
    }
    *out = malloc(bytes);
    return *out != NULL ? AP_OK : AP_ERR_OUT_OF_MEMORY;
}
void ap_kit_device_free(void *ptr) {
    frees += ptr != NULL;
    free(ptr);
}
ap_status ap_kit_nvfp4_stage_run(const ap_kit_nvfp4_stage_args *args, void *stream, const char *who,
                                 ap_msgbuf *msg) {
    (void)stream, (void)who, (void)msg;
    staged_args = *args;
    return AP_OK;
}
ap_status fil_extend_run(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const fil_batch_plan *plan, void *stream, ap_msgbuf *msg) {
    (void)model, (void)args, (void)stream, (void)msg;
    extend_layer = *layer;
    extend_kv = *layer->kv;
    extend_indices = plan->kv_page_indices;
    return AP_OK;
}

static ap_batch test_batch(ap_forward_mode mode, const int32_t *indptr, int32_t num_seqs) {
    return (ap_batch){.struct_size = sizeof(ap_batch),
                      .mode = mode,
                      .num_seqs = num_seqs,
                      .kv_page_indptr_host = indptr};
}

/* Page 16, 8 KV heads, head dim 128: a staged page of K is 16 * 8 * 128 * 2 = 32 KiB. */
static void check_reserve(ap_backend *b) {
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    int32_t replan = 0;
    const int32_t five[3] = {0, 2, 5}, three[2] = {0, 3}, nine[2] = {0, 9};
    ap_batch batch = test_batch(AP_MODE_EXTEND, five, 2);
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && allocs == 1,
           "5 pages: %s", text);
    EXPECT(b->stage.pages == 5 && b->stage.bytes == 2 * 5 * 32768 + 5 * 4,
           "5 pages: %d pages, %zu bytes", b->stage.pages, b->stage.bytes);
    batch = test_batch(AP_MODE_EXTEND, three, 1);
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && allocs == 1 && frees == 0,
           "3 pages reuse the buffer: %d allocations", allocs);
    EXPECT(b->stage.pages == 3, "3 pages: %d", b->stage.pages);
    batch = test_batch(AP_MODE_EXTEND, nine, 1);
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && allocs == 2 && frees == 1,
           "9 pages grow it: %d allocations, %d frees", allocs, frees);
    batch = test_batch(AP_MODE_DECODE, nine, 1);
    b->model.kv_dtype = AP_DTYPE_BF16;
    batch.mode = AP_MODE_EXTEND;
    int32_t before = b->stage.pages;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && allocs == 2 &&
               b->stage.pages == before,
           "a bf16 model stages nothing");
    b->model.kv_dtype = AP_DTYPE_NVFP4;
}

/* A layer over a cache of 8 KV heads, head dim 128, page 16 (host bytes: the stage is faked). */
static void test_layer(ap_dtype dtype, int32_t num_pages, char *k_pages, char *v_pages,
                       float k_scale, float v_scale, ap_kv_cache *kv, ap_layer *layer) {
    *kv = (ap_kv_cache){.struct_size = sizeof *kv,
                        .dtype = dtype,
                        .page_size = 16,
                        .num_pages = num_pages,
                        .num_kv_heads = 8,
                        .head_dim_qk = 128,
                        .head_dim_v = 128,
                        .k_pages = k_pages,
                        .v_pages = v_pages};
    *layer = (ap_layer){.struct_size = sizeof *layer,
                        .sm_scale = 0.125f,
                        .k_scale = k_scale,
                        .v_scale = v_scale,
                        .window_left = -1,
                        .kv = kv};
}

/* K staged exactly with its scale in the softmax scale; V staged times its scale; the extend
 * reads the staged pages, in order, as a cache of the query's type. */
static void check_run(ap_backend *b) {
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    const int32_t indices[9] = {7, 3, 11, 0, 2, 4, 6, 8, 9};
    char k_pages[64], v_pages[64], k_scales[8], v_scales[8];
    ap_kv_cache kv;
    ap_layer layer;
    test_layer(AP_DTYPE_NVFP4, 12, k_pages, v_pages, 0.5f, 0.25f, &kv, &layer);
    kv.k_block_scales = k_scales;
    kv.v_block_scales = v_scales;
    ap_forward_args args = {.struct_size = sizeof args};
    b->plan.kv_page_indices = indices;
    EXPECT(fil_extend_nvfp4_run(b, &layer, &args, NULL, &msg) == AP_OK, "run: %s", text);
    const char *stage = b->stage.buffer;
    size_t half = 9 * 32768;
    EXPECT(staged_args.pages[0] == k_pages && staged_args.pages[1] == v_pages &&
               staged_args.block_scales[0] == k_scales && staged_args.block_scales[1] == v_scales,
           "the stage reads the layer's values and scales");
    EXPECT(staged_args.multiplier[0] == 1.0f && staged_args.multiplier[1] == 0.25f,
           "multipliers %g, %g", staged_args.multiplier[0], staged_args.multiplier[1]);
    EXPECT(staged_args.out[0] == stage && staged_args.out[1] == stage + half &&
               staged_args.staged_indices == (const int32_t *)(stage + 2 * half),
           "staged K, V and indices in the buffer");
    EXPECT(staged_args.page_indices == indices && staged_args.num_pages == 9 &&
               staged_args.out_dtype == AP_DTYPE_F16,
           "9 pages of the batch into f16");
    EXPECT(extend_layer.sm_scale == 0.125f * 0.5f, "softmax scale %g", extend_layer.sm_scale);
    EXPECT(extend_kv.dtype == AP_DTYPE_F16 && extend_kv.k_pages == stage &&
               extend_kv.v_pages == stage + half && extend_indices == staged_args.staged_indices,
           "the extend reads the staged cache");
    EXPECT(b->plan.kv_page_indices == indices, "the batch's own plan is left as it was");
    kv.k_block_scales = NULL;
    EXPECT(fil_extend_nvfp4_run(b, &layer, &args, NULL, &msg) == AP_ERR_INVALID_ARGUMENT,
           "a cache without block scales is refused");
}

/* An fp8 cache is staged only where the extend's plan is the Hopper kernel's (whose paged source
 * reads 16-bit K/V); staged like nvfp4, without block scales. */
static void check_fp8(ap_backend *b) {
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    int32_t replan = 0;
    const int32_t four[2] = {0, 4}, indices[4] = {5, 1, 2, 9};
    ap_batch batch = test_batch(AP_MODE_EXTEND, four, 1);
    b->model.kv_dtype = AP_DTYPE_FP8_E4M3;
    b->plan.extend.hopper = 0;
    const int32_t before = b->stage.pages;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && !b->plan.extend_staged &&
               b->stage.pages == before,
           "fp8 on the mma.sync plan stages nothing: %s", text);
    b->plan.extend.hopper = 1;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && b->plan.extend_staged &&
               b->stage.pages == 4,
           "fp8 on the Hopper plan reserves its 4 pages: %s", text);
    batch.mode = AP_MODE_DECODE;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && !b->plan.extend_staged,
           "a decode batch stages nothing");
    batch.mode = AP_MODE_EXTEND;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && b->plan.extend_staged,
           "again");
    char k_pages[64], v_pages[64];
    ap_kv_cache kv;
    ap_layer layer;
    test_layer(AP_DTYPE_FP8_E4M3, 10, k_pages, v_pages, 2.0f, 0.75f, &kv, &layer);
    ap_forward_args args = {.struct_size = sizeof args};
    b->plan.kv_page_indices = indices;
    EXPECT(fil_extend_nvfp4_run(b, &layer, &args, NULL, &msg) == AP_OK, "fp8 run: %s", text);
    EXPECT(staged_args.in_dtype == AP_DTYPE_FP8_E4M3 && staged_args.pages[0] == k_pages &&
               staged_args.pages[1] == v_pages && staged_args.num_pages == 4 &&
               staged_args.page_indices == indices,
           "the stage reads the fp8 pages of the batch");
    EXPECT(staged_args.multiplier[0] == 1.0f && staged_args.multiplier[1] == 0.75f,
           "fp8 multipliers %g, %g", staged_args.multiplier[0], staged_args.multiplier[1]);
    EXPECT(extend_layer.sm_scale == 0.125f * 2.0f && extend_kv.dtype == AP_DTYPE_F16 &&
               extend_kv.k_pages == b->stage.buffer,
           "the extend reads the staged f16 cache, k_scale in the softmax scale (%g)",
           extend_layer.sm_scale);
    b->model.kv_dtype = AP_DTYPE_NVFP4;
    b->plan.extend.hopper = 0;
}

/* No memory for the staging buffer: an fp8 cache is then read as stored (the caller plans again,
 * the allocation's message taken back out); an nvfp4 cache, which has no other path, fails. */
static void check_no_memory(ap_backend *b) {
    char text[256] = "earlier line";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, strlen(text)};
    int32_t replan = 0;
    const int32_t many[2] = {0, 1000};
    ap_batch batch = test_batch(AP_MODE_EXTEND, many, 1);
    fail_alloc = 1;
    b->model.kv_dtype = AP_DTYPE_FP8_E4M3;
    b->plan.extend.hopper = 1;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_OK && replan == 1 &&
               !b->plan.extend_staged && strcmp(text, "earlier line") == 0 &&
               msg.length == strlen(text),
           "fp8 without memory: replan %d, staged %d, message '%s'", replan, b->plan.extend_staged,
           text);
    b->model.kv_dtype = AP_DTYPE_NVFP4;
    EXPECT(fil_extend_nvfp4_reserve(b, &batch, &replan, &msg) == AP_ERR_OUT_OF_MEMORY &&
               replan == 0 && strstr(text, "out of memory") != NULL,
           "nvfp4 without memory fails: replan %d, message '%s'", replan, text);
    fail_alloc = 0;
    b->plan.extend.hopper = 0;
}

int main(void) {
    ap_backend b;
    memset(&b, 0, sizeof b);
    b.model = (ap_model){.struct_size = sizeof(ap_model),
                         .num_qo_heads = 32,
                         .num_kv_heads = 8,
                         .head_dim_qk = 128,
                         .head_dim_v = 128,
                         .dtype = AP_DTYPE_F16,
                         .kv_dtype = AP_DTYPE_NVFP4,
                         .page_size = 16};
    check_reserve(&b);
    check_run(&b);
    check_fp8(&b);
    check_no_memory(&b);
    fil_extend_nvfp4_free(&b);
    EXPECT(b.stage.buffer == NULL && frees == 2, "free releases the buffer");
    printf("%s\n", failures == 0 ? "ok" : "FAILED");
    return failures != 0;
}
