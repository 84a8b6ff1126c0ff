/* test_attention.c: cpu_ref's forward_extend/forward_decode against a dense double reference. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "scenario.h"

static fx_plugin plugin;

static void run_case(const sc_case *c) {
    sc_scenario s;
    char label[512];
    sc_describe(c, label, sizeof label);
    if (sc_build(&s, &plugin, c) != 0) fail_msg("%s: could not build", label);
    fx_msg msg;
    ap_status status = sc_run(&s, &plugin, &msg);
    if (status != AP_OK) fail_msg("%s: status %d: %s", label, (int)status, msg.text);
    sc_check(&s);
    sc_free(&s, &plugin);
}

/* A base case most tests vary one thing of. */
static sc_case base_case(void) {
    sc_case c = {
        .q_dtype = AP_DTYPE_BF16,
        .kv_dtype = AP_DTYPE_BF16,
        .page_size = 16,
        .num_kv_heads = 2,
        .group = 4,
        .head_dim_qk = 128,
        .head_dim_v = 128,
        .causal = 1,
        .softcap = 0.0f,
        .window_left = -1,
        .save_kv = 1,
        .with_lse = 1,
        .num_seqs = 4,
        /* a 1-token decode-like row, an empty prefix, a mid-page prefix, a page-aligned one */
        .prefix = {37, 0, 5, 32},
        .q_len = {1, 19, 12, 7},
    };
    return c;
}

static void test_mixed_batch_bf16(void **state) {
    (void)state;
    sc_case c = base_case();
    run_case(&c);
}

static void test_q_dtypes(void **state) {
    (void)state;
    ap_dtype q_dtypes[] = {AP_DTYPE_F32, AP_DTYPE_BF16, AP_DTYPE_F16};
    for (int i = 0; i < 3; i++) {
        sc_case c = base_case();
        c.q_dtype = q_dtypes[i];
        c.kv_dtype = AP_DTYPE_F16;
        run_case(&c);
    }
}

static void test_kv_dtypes_and_pages(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2};
    int page_sizes[] = {1, 3, 16, 64};
    for (int k = 0; k < 4; k++)
        for (int p = 0; p < 4; p++) {
            sc_case c = base_case();
            c.kv_dtype = kv_dtypes[k];
            c.page_size = page_sizes[p];
            c.q_dtype = AP_DTYPE_F32; /* the tightest tolerance: only the cache quantizes */
            run_case(&c);
        }
}

/* The nvfp4 cache (the reference dequantizes with the tests' own quantizer, nvfp4_ref.c):
 * extend and decode over pages of every kind, groups, a v dim unlike qk, a read-only cache,
 * softcap and a sliding window. */
static void test_nvfp4_cache(void **state) {
    (void)state;
    int page_sizes[] = {1, 3, 16, 64};
    for (int p = 0; p < 4; p++)
        for (int decode = 0; decode <= 1; decode++) {
            sc_case c = base_case();
            c.kv_dtype = AP_DTYPE_NVFP4;
            c.page_size = page_sizes[p];
            c.q_dtype = p % 2 ? AP_DTYPE_F32 : AP_DTYPE_BF16;
            c.decode = decode;
            for (int i = 0; decode && i < c.num_seqs; i++) c.q_len[i] = 1;
            run_case(&c);
        }
    sc_case c = base_case();
    c.kv_dtype = AP_DTYPE_NVFP4;
    c.group = 8;
    c.num_kv_heads = 1;
    c.head_dim_qk = 128;
    c.head_dim_v = 64;
    run_case(&c);
    c = base_case();
    c.kv_dtype = AP_DTYPE_NVFP4;
    c.head_dim_qk = c.head_dim_v = 256;
    c.save_kv = 0;
    c.softcap = 1.5f;
    c.window_left = 20;
    run_case(&c);
}

static void test_groups_and_head_dims(void **state) {
    (void)state;
    int groups[] = {1, 2, 4, 8};
    int dims[] = {64, 128, 40};
    for (int g = 0; g < 4; g++)
        for (int d = 0; d < 3; d++) {
            sc_case c = base_case();
            c.group = groups[g];
            c.head_dim_qk = c.head_dim_v = dims[d];
            c.num_kv_heads = groups[g] == 8 ? 1 : 2;
            run_case(&c);
        }
}

static void test_v_dim_differs(void **state) {
    (void)state;
    sc_case c = base_case();
    c.head_dim_qk = 64;
    c.head_dim_v = 40;
    c.kv_dtype = AP_DTYPE_FP8_E4M3;
    run_case(&c);
}

static void test_noncausal(void **state) {
    (void)state;
    sc_case c = base_case();
    c.causal = 0;
    run_case(&c);
    c.q_dtype = AP_DTYPE_F32;
    c.kv_dtype = AP_DTYPE_FP8_E5M2;
    run_case(&c);
}

static void test_softcap(void **state) {
    (void)state;
    sc_case c = base_case();
    c.q_dtype = AP_DTYPE_F32;
    c.softcap = 0.4f; /* the logits here reach about 1: the cap bends them */
    run_case(&c);
}

static void test_sliding_window(void **state) {
    (void)state;
    sc_case c = base_case();
    c.q_dtype = AP_DTYPE_F32;
    int windows[] = {0, 1, 6, 20};
    for (int w = 0; w < 4; w++) {
        c.window_left = windows[w];
        run_case(&c);
    }
}

/* The cache already holds the new tokens: no k/v given, nothing written. */
static void test_read_only_cache(void **state) {
    (void)state;
    sc_case c = base_case();
    c.save_kv = 0;
    c.kv_dtype = AP_DTYPE_FP8_E4M3;
    run_case(&c);
}

static void test_decode(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2};
    for (int k = 0; k < 4; k++) {
        sc_case c = base_case();
        c.decode = 1;
        c.kv_dtype = kv_dtypes[k];
        c.num_seqs = 5;
        int prefixes[] = {0, 1, 15, 16, 70};
        for (int i = 0; i < 5; i++) {
            c.prefix[i] = prefixes[i];
            c.q_len[i] = 1;
        }
        run_case(&c);
    }
}

/* Embedding mode: no pages, attend over each sequence's own given k/v. */
static void test_embedding_skip_kv(void **state) {
    (void)state;
    for (int causal = 0; causal <= 1; causal++) {
        sc_case c = base_case();
        c.skip_kv = 1;
        c.save_kv = 0;
        c.causal = causal;
        c.q_dtype = AP_DTYPE_F32;
        c.prefix[0] = c.prefix[2] = c.prefix[3] = 0;
        c.q_len[0] = 9;
        run_case(&c);
    }
}

/* Random combinations of everything above; the seed printed at start replays them. */
static void test_random_sweep(void **state) {
    (void)state;
    ap_dtype q_dtypes[] = {AP_DTYPE_F32, AP_DTYPE_BF16, AP_DTYPE_F16};
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2,
                            AP_DTYPE_NVFP4};
    int page_sizes[] = {1, 3, 16, 64};
    int groups[] = {1, 2, 4, 8};
    int dims[] = {64, 128, 40};
    for (int iter = 0; iter < 40; iter++) {
        sc_case c = base_case();
        c.q_dtype = q_dtypes[fx_rand_int(0, 2)];
        c.kv_dtype = kv_dtypes[fx_rand_int(0, 4)];
        c.page_size = page_sizes[fx_rand_int(0, 3)];
        c.group = groups[fx_rand_int(0, 3)];
        c.num_kv_heads = fx_rand_int(1, 2);
        /* nvfp4 rows are whole blocks of 16 */
        c.head_dim_qk = c.head_dim_v = dims[fx_rand_int(0, c.kv_dtype == AP_DTYPE_NVFP4 ? 1 : 2)];
        c.causal = fx_rand_int(0, 1);
        c.softcap = fx_rand_int(0, 1) ? (float)fx_rand_uniform(0.2, 2.0) : 0.0f;
        c.window_left = fx_rand_int(0, 1) ? fx_rand_int(0, 40) : -1;
        c.save_kv = fx_rand_int(0, 3) != 0;
        c.decode = fx_rand_int(0, 3) == 0;
        c.with_lse = fx_rand_int(0, 1);
        c.num_seqs = fx_rand_int(1, 4);
        for (int i = 0; i < c.num_seqs; i++) {
            c.prefix[i] = fx_rand_int(0, 3) == 0 ? 0 : fx_rand_int(1, 80);
            c.q_len[i] = c.decode ? 1 : fx_rand_int(1, 20);
        }
        run_case(&c);
    }
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixed_batch_bf16),
        cmocka_unit_test(test_q_dtypes),
        cmocka_unit_test(test_kv_dtypes_and_pages),
        cmocka_unit_test(test_nvfp4_cache),
        cmocka_unit_test(test_groups_and_head_dims),
        cmocka_unit_test(test_v_dim_differs),
        cmocka_unit_test(test_noncausal),
        cmocka_unit_test(test_softcap),
        cmocka_unit_test(test_sliding_window),
        cmocka_unit_test(test_read_only_cache),
        cmocka_unit_test(test_decode),
        cmocka_unit_test(test_embedding_skip_kv),
        cmocka_unit_test(test_random_sweep),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
