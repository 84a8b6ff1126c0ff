/* test_mha_validate.c: trtllm_mha's negotiation, caps, validate() reasons, hooks, kv spec and the
 * decode plan (key warps, row blocks, splits) through the built plugin, no GPU needed. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backends/trtllm_mha/mha.h"
#include "tests/common/test_expect.h"
#include "tests/common/test_model.h"

static const ap_vtable *vt;
static const ap_caps *caps;

static ap_model llama(int32_t qo, int32_t kv, int32_t dim, ap_dtype kv_dtype) {
    ap_model m = ap_test_model("meta-llama/Llama-3-8B", qo, kv, dim, dim, AP_DTYPE_BF16, kv_dtype);
    return m;
}

static void test_validate(void) {
    ap_device d = ap_test_h100();
    const ap_dtype kvs[] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, AP_DTYPE_NVFP4};
    for (int k = 0; k < 3; k++)
        for (int g = 1; g <= 32; g *= 2)
            for (int dim = 64; dim <= 256; dim *= 2) {
                ap_model m = llama(2 * g, 2, dim, kvs[k]);
                ap_test_expect_verdict(vt, "served shape", &m, NULL, &d, NULL);
            }
    ap_model m = llama(64, 1, 128, AP_DTYPE_BF16);
    ap_test_expect_verdict(vt, "group 64", &m, NULL, &d, "GQA group of 64");
    m = llama(32, 8, 96, AP_DTYPE_BF16);
    ap_test_expect_verdict(vt, "head dim 96", &m, NULL, &d, "not equal and 64, 128 or 256");
    m = llama(32, 8, 128, AP_DTYPE_BF16), m.head_dim_v = 64;
    ap_test_expect_verdict(vt, "qk != v", &m, NULL, &d, "qk 128 / v 64");
    m = llama(32, 8, 128, AP_DTYPE_BF16), m.page_size = 128;
    ap_test_expect_verdict(vt, "page 128", &m, NULL, &d, "page size 128 is not 16, 32 or 64");
    m = llama(32, 8, 128, AP_DTYPE_F16);
    ap_test_expect_verdict(vt, "bf16 q, f16 cache", &m, NULL, &d, "must have the query dtype");
    m = llama(32, 8, 128, AP_DTYPE_FP8_E5M2);
    ap_test_expect_verdict(vt, "e5m2", &m, NULL, &d, "fp8_e5m2 is not bf16, f16, fp8_e4m3");
    m = llama(32, 8, 128, AP_DTYPE_BF16), m.causal = 0;
    ap_test_expect_verdict(vt, "non-causal", &m, NULL, &d, "non-causal");
    m = ap_test_mla_model("deepseek-ai/DeepSeek-V3", 16);
    ap_test_expect_verdict(vt, "MLA", &m, NULL, &d, "attention kind MLA");
    m = llama(32, 8, 128, AP_DTYPE_BF16);
    ap_device old = ap_test_h100();
    old.cc_major = 8;
    ap_test_expect_verdict(vt, "sm_80", &m, NULL, &old, "below 9.0");
    /* every option value, one at a time: NULL where it is taken, else the reason */
    static const struct {
        const char *what;
        ap_option_kv kv;
        const char *want;
    } opts[] = {
        {"unknown option", {"split", "off"}, "unknown option 'split'"},
        {"split_kv off", {"split_kv", "off"}, NULL},
        {"split_kv x", {"split_kv", "x"}, "split_kv is 'x', not auto or off"},
        {"nvfp4_keys_m off", {"nvfp4_keys_m", "off"}, NULL},
        {"nvfp4_keys_m v1", {"nvfp4_keys_m", "v1"}, NULL},
        {"nvfp4_keys_m v2", {"nvfp4_keys_m", "v2"}, NULL},
        /* two heads per CTA is auto's kernel, not a value of its own */
        {"nvfp4_keys_m v2h",
         {"nvfp4_keys_m", "v2h"},
         "nvfp4_keys_m is 'v2h', not auto, v1, v2 or off"},
        /* v1 and v2 are nvfp4_keys_m's values only */
        {"split_kv v2", {"split_kv", "v2"}, "split_kv is 'v2', not auto or off"},
        {"nvfp4_keys_m on",
         {"nvfp4_keys_m", "on"},
         "nvfp4_keys_m is 'on', not auto, v1, v2 or off"},
        {"split_kv v1", {"split_kv", "v1"}, "split_kv is 'v1', not auto or off"},
        {"decode_schedule flat", {"decode_schedule", "flat"}, NULL},
        {"decode_schedule split", {"decode_schedule", "split"}, NULL},
        {"decode_schedule auto", {"decode_schedule", "auto"}, NULL},
        {"decode_schedule off",
         {"decode_schedule", "off"},
         "decode_schedule is 'off', not auto, flat or split"},
        {"short_extend auto", {"short_extend", "auto"}, NULL},
        {"short_extend decode", {"short_extend", "decode"}, NULL},
        {"short_extend prefill", {"short_extend", "prefill"}, NULL},
        {"short_extend flat",
         {"short_extend", "flat"},
         "short_extend is 'flat', not auto, decode or prefill"},
    };
    ap_options o = {.struct_size = sizeof o, .num_extra = 1};
    for (size_t i = 0; i < sizeof opts / sizeof opts[0]; i++) {
        o.extra = &opts[i].kv;
        ap_test_expect_verdict(vt, opts[i].what, &m, &o, &d, opts[i].want);
    }
    o = (ap_options){.struct_size = sizeof o, .cuda_graphs = 1};
    ap_test_expect_verdict(vt, "cuda graphs on", &m, &o, &d, NULL);
    /* every reason, not just the first */
    m = llama(64, 1, 96, AP_DTYPE_BF16), m.page_size = 8;
    char text[1024] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(vt->validate(&m, NULL, &d, &msg) == AP_ERR_REFUSED && strstr(text, "group of 64") &&
               strstr(text, "page size 8") && strstr(text, "96"),
           "three reasons, got '%s'", text);
}

static void test_caps(void) {
    EXPECT(caps->attn_kinds == AP_ATTN_BIT(AP_ATTN_MHA), "MHA only");
    EXPECT(caps->needs_host_mirrors == 0, "no host mirrors (device-planned decode)");
    EXPECT(caps->cuda_graph == AP_GRAPH_DECODE_ONLY, "decode graphs");
    EXPECT(caps->phases == (AP_PHASE_EXTEND | AP_PHASE_DECODE), "both phases (see README)");
    EXPECT(caps->kv_dtypes & AP_DTYPE_BIT(AP_DTYPE_NVFP4), "nvfp4");
    EXPECT(caps->num_page_sizes == 3 && caps->num_head_dims == 3, "pages and head dims");
    EXPECT(caps->num_archs >= 1 && caps->archs[0].sm == 90, "sm_90 built");
}

/* Option short_extend's kernel for 2..8 new tokens a sequence, by shape (plan.c). */
static void test_short_extend(void) {
    const int32_t A = MHA_SHORT_EXTEND_AUTO, D = MHA_SHORT_EXTEND_DECODE,
                  P = MHA_SHORT_EXTEND_PREFILL;
    ap_model g4 = llama(32, 8, 128, AP_DTYPE_BF16);
    /* auto: more than 16 rows per KV head (group 4 x 5..8 tokens), B >= 2, a sequence >= 2048 */
    EXPECT(mha_short_extend_prefill(A, 5, &g4, 4, 8197, 1) &&
               mha_short_extend_prefill(A, 8, &g4, 64, 2056, 1),
           "auto: group 4 x 5 and x 8 tokens");
    EXPECT(!mha_short_extend_prefill(A, 4, &g4, 4, 8196, 1), "auto: 16 rows keep four key warps");
    EXPECT(!mha_short_extend_prefill(A, 8, &g4, 1, 8200, 1), "auto: one sequence");
    EXPECT(!mha_short_extend_prefill(A, 8, &g4, 4, 2047, 1), "auto: sequences under 2048");
    EXPECT(!mha_short_extend_prefill(A, 8, &g4, 4, 8200, 0), "auto: split_kv off");
    EXPECT(!mha_short_extend_prefill(A, 9, &g4, 4, 8200, 1) &&
               !mha_short_extend_prefill(A, 1, &g4, 4, 8200, 1),
           "auto: 2..8 tokens only");
    ap_model m = llama(64, 8, 128, AP_DTYPE_BF16);
    EXPECT(!mha_short_extend_prefill(A, 8, &m, 4, 8200, 1), "auto: group 8 (not measured)");
    m = llama(32, 8, 64, AP_DTYPE_BF16);
    EXPECT(!mha_short_extend_prefill(A, 8, &m, 4, 8200, 1), "auto: head dim 64 (not measured)");
    m = g4, m.kv_dtype = AP_DTYPE_FP8_E4M3;
    EXPECT(!mha_short_extend_prefill(A, 8, &m, 4, 8200, 1) &&
               !mha_short_extend_prefill(P, 8, &m, 4, 8200, 1),
           "fp8 cache: the decode kernel (the prefill would stage it)");
    m = g4, m.kv_dtype = AP_DTYPE_NVFP4;
    EXPECT(!mha_short_extend_prefill(P, 8, &m, 4, 8200, 1), "nvfp4 cache: the decode kernel");
    m = g4, m.kv_dtype = AP_DTYPE_F16;
    EXPECT(!mha_short_extend_prefill(P, 8, &m, 4, 8200, 1), "a cache of another 16-bit type");
    /* prefill: any 16-bit shape; decode: never */
    m = llama(16, 8, 64, AP_DTYPE_F16), m.dtype = AP_DTYPE_F16;
    EXPECT(mha_short_extend_prefill(P, 2, &m, 1, 10, 0), "prefill forced");
    EXPECT(!mha_short_extend_prefill(D, 8, &g4, 64, 8200, 1), "decode forced");
}

static void test_plan(void) {
    EXPECT(mha_decode_key_warps(4, 1, 128) == 4 && mha_decode_key_warps(16, 1, 128) == 4 &&
               mha_decode_key_warps(4, 1, 256) == 2 && mha_decode_key_warps(32, 1, 128) == 2 &&
               mha_decode_key_warps(4, 8, 128) == 2 && mha_decode_key_warps(32, 8, 64) == 1,
           "key warps");
    EXPECT(mha_decode_row_blocks(4, 1, 4) == 1 && mha_decode_row_blocks(32, 8, 1) == 4 &&
               mha_decode_row_blocks(32, 1, 2) == 1,
           "row blocks");
    /* one wave is 132 slots (one CTA per SM) */
    EXPECT(mha_decode_num_splits(256, 8, 4, 1, 128, 132, 64, 1) == 1, "B256: 15.5 waves");
    /* one wave of splits when it is >= 85% full: every CTA fills its ring once */
    EXPECT(mha_decode_num_splits(8, 8, 4, 1, 128, 132, 64, 1) == 2, "B8: 64 CTAs x 2 (128 of 132)");
    EXPECT(mha_decode_num_splits(1, 8, 4, 1, 128, 132, 64, 1) == 16,
           "B1: 8 CTAs x 16 (128 of 132)");
    EXPECT(mha_decode_num_splits(5, 8, 4, 1, 128, 132, 64, 1) == 3, "B5: 40 CTAs x 3 (120 of 132)");
    EXPECT(mha_decode_num_splits(5, 8, 4, 1, 128, 264, 64, 1) == 6, "B5: 40 CTAs x 6 (240 of 264)");
    EXPECT(mha_decode_num_splits(2, 1, 32, 1, 128, 132, 64, 1) == 64, "B2 g32: 2 CTAs x 64");
    /* the CTAs alone fill one wave >= 85%: no split (nvfp4 B64: 512 CTAs in 528 slots) */
    EXPECT(mha_decode_num_splits(64, 8, 4, 1, 128, 528, 64, 1) == 1, "B64: 512 of 528, unsplit");
    EXPECT(mha_decode_num_splits(14, 8, 4, 1, 128, 132, 64, 1) == 1,
           "B14: 112 of 132 (85%%), unsplit");
    EXPECT(mha_decode_num_splits(13, 8, 4, 1, 128, 132, 64, 1) == 1,
           "B13: 104 of 132 (79%%): below the rule; 2 or 3 splits fill their waves no better, 4 "
           "pass the "
           "workspace bound");
    /* else the smallest count whose last wave is >= 85% full */
    EXPECT(mha_decode_num_splits(10, 8, 4, 1, 128, 132, 64, 1) == 3,
           "B10: 80 CTAs x 3 (1.8 waves)");
    EXPECT(mha_decode_num_splits(0, 8, 4, 1, 128, 132, 64, 1) == 1, "empty batch");
    /* v2h: auto's CTA per two KV heads where its kernel serves (nvfp4, D = 128, <= 8 rows, even H) */
    EXPECT(mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 1, 8, MHA_KEYS_M_AUTO) == 2 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 2, 8, MHA_KEYS_M_AUTO) == 2 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 3, 8, MHA_KEYS_M_AUTO) == 1 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 1, 3, MHA_KEYS_M_AUTO) == 1 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 64, 4, 1, 8, MHA_KEYS_M_AUTO) == 1 &&
               mha_decode_heads_per_cta(AP_DTYPE_FP8_E4M3, 128, 4, 1, 8, MHA_KEYS_M_AUTO) == 1 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 1, 8, MHA_KEYS_M_V2) == 1 &&
               mha_decode_heads_per_cta(AP_DTYPE_NVFP4, 128, 4, 1, 8, MHA_KEYS_M_V1) == 1,
           "heads per CTA");
    EXPECT(mha_decode_keys_m_for(MHA_KEYS_M_AUTO, 2) == MHA_KEYS_M_V2H &&
               mha_decode_keys_m_for(MHA_KEYS_M_AUTO, 1) == MHA_KEYS_M_AUTO &&
               mha_decode_keys_m_for(MHA_KEYS_M_V2, 1) == MHA_KEYS_M_AUTO &&
               mha_decode_keys_m_for(MHA_KEYS_M_V1, 1) == MHA_KEYS_M_V1,
           "the kernel's keys_m");
    /* B64 L4096 H8 on 528 slots: 256 CTAs of two heads count as 512: one wave, unsplit */
    EXPECT(mha_decode_num_splits(64, 8, 4, 1, 128, 528, 64, 2) == 1, "v2h B64: 256 CTAs");
    EXPECT(mha_decode_num_splits(128, 8, 4, 1, 128, 528, 64, 2) == 1, "v2h B128: 512 CTAs");
    EXPECT(mha_decode_num_splits(8, 8, 4, 1, 128, 528, 64, 2) == 8, "v2h B8: 32 CTAs x 8");
    /* the workspace bound: ctas * splits * heads <= MHA_SPLIT_WAVES * slots when splits > 1 */
    for (int b = 1; b <= 300; b += 7)
        for (int q = 1; q <= 2; q++) {
            int s = mha_decode_num_splits(b, 8, 4, q, 128, 132, MHA_MAX_SPLITS, 2);
            long ctas = (long)b * 4;
            EXPECT(s >= 1 && s <= MHA_MAX_SPLITS, "v2h b %d q %d: %d splits", b, q, s);
            EXPECT(s == 1 || ctas * s * 2 <= MHA_SPLIT_WAVES * 132, "v2h b %d q %d: %ld x %d", b, q,
                   ctas, s);
        }
    /* the workspace bound: ctas * splits <= MHA_SPLIT_WAVES * slots whenever splits > 1 */
    for (int b = 1; b <= 300; b += 7)
        for (int g = 1; g <= 32; g *= 2)
            for (int q = 1; q <= 8; q++) {
                int s = mha_decode_num_splits(b, 8, g, q, 128, 132, MHA_MAX_SPLITS, 1);
                int kw = mha_decode_key_warps(g, q, 128);
                long ctas = (long)b * 8 * mha_decode_row_blocks(g, q, kw);
                EXPECT(s >= 1 && s <= MHA_MAX_SPLITS, "b %d g %d q %d: %d splits", b, g, q, s);
                EXPECT(s == 1 || ctas * s <= MHA_SPLIT_WAVES * 132, "b %d g %d q %d: %ld x %d", b,
                       g, q, ctas, s);
            }
}

static void test_hooks(void) {
    EXPECT(vt->get_hook(NULL, AP_HOOK_APPEND_KV_V1) != NULL, "append_kv/1");
    EXPECT(vt->get_hook(NULL, AP_HOOK_CUDA_GRAPH_V1) != NULL, "cuda_graph/1");
    EXPECT(vt->get_hook(NULL, AP_HOOK_MERGE_STATE_V1) == NULL, "no merge_state/1");
    EXPECT(vt->get_hook(NULL, "vendor.none/1") == NULL, "unknown hook");
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *so = NULL;
    ap_plugin_negotiate_fn negotiate = NULL;
    const ap_descriptor *desc = ap_test_open_plugin(argv[1], "trtllm_mha", &so, &negotiate);
    if (desc == NULL) return 1;
    vt = desc->vtable;
    caps = desc->caps;
    test_validate();
    test_caps();
    test_plan();
    test_short_extend();
    test_hooks();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    dlclose(so);
    return failures ? 1 : 0;
}
