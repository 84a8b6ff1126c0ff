/* test_mla_validate.c: trtllm_mla's negotiation, caps, validate() reasons, hooks and the split
 * plan through the built plugin, no GPU needed. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backends/trtllm_mla/mla.h"
#include "tests/common/test_expect.h"
#include "tests/common/test_model.h"

static const ap_vtable *vt;
static const ap_caps *caps;

static ap_model deepseek(int32_t heads) {
    return ap_test_mla_model("deepseek-ai/DeepSeek-V3", heads);
}

static void test_validate(void) {
    ap_device d = ap_test_h100();
    for (int h = 16; h <= 128; h *= 2) {
        ap_model m = deepseek(h);
        ap_test_expect_verdict(vt, "DeepSeek-V3 bf16", &m, NULL, &d, NULL);
        m.kv_dtype = AP_DTYPE_FP8_E4M3, m.page_size = 32;
        ap_test_expect_verdict(vt, "DeepSeek-V3 fp8 page 32", &m, NULL, &d, NULL);
    }
    ap_model m = deepseek(128);
    m.kind = AP_ATTN_MHA;
    ap_test_expect_verdict(vt, "MHA", &m, NULL, &d, "MLA only");
    m = deepseek(8);
    ap_test_expect_verdict(vt, "8 heads", &m, NULL, &d, "8 query heads");
    m = deepseek(128), m.page_size = 16;
    ap_test_expect_verdict(vt, "page 16", &m, NULL, &d, "page size 16");
    m = deepseek(128), m.kv_lora_rank = 256, m.head_dim_qk = 320, m.head_dim_v = 256;
    ap_test_expect_verdict(vt, "latent 256", &m, NULL, &d, "not DeepSeek's 512 + 64");
    m = deepseek(128), m.kv_dtype = AP_DTYPE_FP8_E5M2;
    ap_test_expect_verdict(vt, "e5m2", &m, NULL, &d, "fp8_e5m2 is not bf16 or fp8_e4m3");
    m = deepseek(128), m.dtype = AP_DTYPE_F16;
    ap_test_expect_verdict(vt, "f16 queries", &m, NULL, &d, "query dtype f16");
    m = deepseek(16);
    ap_device old = ap_test_h100();
    old.cc_major = 8;
    ap_test_expect_verdict(vt, "sm_80", &m, NULL, &old, "below 9.0");
    ap_device cpu = ap_test_h100();
    cpu.ordinal = -1;
    snprintf(cpu.unusable_reason, sizeof cpu.unusable_reason, "no CUDA driver");
    ap_test_expect_verdict(vt, "the CPU", &m, NULL, &cpu, "needs a CUDA GPU: no CUDA driver");
    ap_option_kv bad = {"split", "off"}, off = {"split_kv", "off"};
    ap_options o = {.struct_size = sizeof o, .extra = &bad, .num_extra = 1};
    ap_test_expect_verdict(vt, "unknown option", &m, &o, &d, "unknown option 'split'");
    o.extra = &off;
    ap_test_expect_verdict(vt, "split_kv off", &m, &o, &d, NULL);
    ap_option_kv three = {"decode_stages", "3"}, four = {"decode_stages", "4"};
    o.extra = &three;
    ap_test_expect_verdict(vt, "decode_stages 3", &m, &o, &d, NULL);
    o.extra = &four;
    ap_test_expect_verdict(vt, "decode_stages 4", &m, &o, &d, "decode_stages is '4', not 2 or 3");
    ap_option_kv split = {"decode_schedule", "split"}, bal = {"decode_schedule", "balanced"};
    o.extra = &split;
    ap_test_expect_verdict(vt, "decode_schedule split", &m, &o, &d, NULL);
    o.extra = &bal;
    ap_test_expect_verdict(vt, "decode_schedule balanced", &m, &o, &d,
                           "decode_schedule is 'balanced', not flat, split or cut");
    /* every reason, not just the first */
    m = deepseek(8), m.page_size = 16;
    char text[1024] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(vt->validate(&m, NULL, &d, &msg) == AP_ERR_REFUSED && strstr(text, "8 query heads") &&
               strstr(text, "page size 16"),
           "two reasons, got '%s'", text);
}

static void test_caps(void) {
    EXPECT(caps->attn_kinds == AP_ATTN_BIT(AP_ATTN_MLA), "MLA only");
    EXPECT(caps->needs_host_mirrors == 0, "no host mirrors (graph-capturable plan)");
    EXPECT(caps->cuda_graph == AP_GRAPH_DECODE_ONLY, "decode graphs");
    EXPECT(caps->num_archs >= 1 && caps->archs[0].sm == 90, "sm_90 built");
    EXPECT((caps->features & AP_FEATURE_LSE) && (caps->features & AP_FEATURE_SPLIT_KV), "lse");
}

static void test_splits(void) {
    /* rows per CTA: 16 for H16 single token, else 64 */
    EXPECT(mla_decode_block_rows(16, 1) == 16 && mla_decode_block_rows(16, 2) == 64 &&
               mla_decode_block_rows(128, 1) == 64,
           "block rows");
    /* enough CTAs already: no split; few: fill the SMs once, capped */
    EXPECT(mla_decode_num_splits(128, 16, 1, 132, 256) == 1, "B128 H16: 128 CTAs");
    EXPECT(mla_decode_num_splits(128, 128, 1, 132, 256) == 1, "B128 H128");
    EXPECT(mla_decode_num_splits(1, 16, 1, 132, 256) == 132, "B1 H16: 132 splits");
    EXPECT(mla_decode_num_splits(1, 128, 1, 132, 256) == 66, "B1 H128: 2 blocks x 66");
    EXPECT(mla_decode_num_splits(8, 16, 1, 132, 4) == 4, "capped");
    EXPECT(mla_decode_num_splits(0, 16, 1, 132, 256) == 1, "empty batch");
    /* the workspace bound: ctas * splits <= sm_count whenever splits > 1 */
    for (int b = 1; b <= 200; b++)
        for (int h = 16; h <= 128; h *= 2)
            for (int q = 1; q <= 4; q++) {
                int s = mla_decode_num_splits(b, h, q, 132, 256);
                int m = mla_decode_block_rows(h, q);
                long ctas = (long)b * ((h * q + m - 1) / m);
                EXPECT(s == 1 || ctas * s <= 132, "b %d h %d q %d: %ld ctas x %d", b, h, q, ctas,
                       s);
            }
}

static void test_hooks_and_spec(void) {
    const char *names[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1,
                           AP_HOOK_MERGE_STATE_V1, AP_HOOK_CUDA_GRAPH_V1};
    for (size_t i = 0; i < 4; i++) EXPECT(vt->get_hook(NULL, names[i]) != NULL, "%s", names[i]);
    EXPECT(vt->get_hook(NULL, "vendor.none/1") == NULL, "unknown hook");
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *so = NULL;
    ap_plugin_negotiate_fn negotiate = NULL;
    const ap_descriptor *desc = ap_test_open_plugin(argv[1], "trtllm_mla", &so, &negotiate);
    if (desc == NULL) return 1;
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR, 0};
    ap_negotiate_reply old = {.struct_size = sizeof old};
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(negotiate(&offer, &old, &msg) == AP_ERR_ABI_MISMATCH, "ABI 1.0 core refused");
    vt = desc->vtable;
    caps = desc->caps;
    test_validate();
    test_caps();
    test_splits();
    test_hooks_and_spec();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    dlclose(so);
    return failures ? 1 : 0;
}
