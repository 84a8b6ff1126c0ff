/* test_fav_validate.c: fa_varlen's negotiation, caps, validate() reasons, the embedding mode's
 * decision and its kv spec of 0 bytes, through the built plugin; no GPU needed. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "backends/fa_varlen/fav.h"
#include "tests/common/test_expect.h"
#include "tests/common/test_model.h"

static const ap_vtable *vt;
static const ap_caps *caps;

static ap_model llama(void) {
    return ap_test_model("meta-llama/Llama-3-8B", 32, 8, 128, 128, AP_DTYPE_BF16, AP_DTYPE_BF16);
}

/* Qwen3-Embedding-8B's shape: 32 query heads over 8 KV heads of 128, an embedding model. */
static ap_model qwen_embedding(void) {
    ap_model m =
        ap_test_model("Qwen/Qwen3-Embedding-8B", 32, 8, 128, 128, AP_DTYPE_BF16, AP_DTYPE_BF16);
    m.embedding = 1;
    return m;
}

static ap_options options_with(int32_t prefix_cache, const ap_option_kv *extra, size_t n) {
    return (ap_options){.struct_size = sizeof(ap_options),
                        .prefix_cache = prefix_cache,
                        .chunked_prefill = AP_OPTION_UNSET,
                        .cuda_graphs = AP_OPTION_UNSET,
                        .extra = extra,
                        .num_extra = n};
}

static void test_shapes(void) {
    ap_device d = ap_test_h100();
    for (int32_t dim = 64; dim <= 256; dim *= 2)
        for (int32_t kv_heads = 32; kv_heads >= 4; kv_heads /= 2) { /* groups 1, 2, 4, 8 */
            ap_model m = ap_test_model("x", 32, kv_heads, dim, dim, AP_DTYPE_F16, AP_DTYPE_F16);
            ap_test_expect_verdict(vt, "served shape", &m, NULL, &d, NULL);
            m.kv_dtype = AP_DTYPE_FP8_E4M3, m.causal = 0, m.page_size = 7;
            ap_test_expect_verdict(vt, "fp8, non-causal, page 7", &m, NULL, &d, NULL);
        }
    ap_model m = llama();
    m.head_dim_qk = 192, m.head_dim_v = 128;
    ap_test_expect_verdict(vt, "192/128", &m, NULL, &d, "head dims qk 192 / v 128 are not");
    m = llama(), m.head_dim_qk = m.head_dim_v = 96;
    ap_test_expect_verdict(vt, "96", &m, NULL, &d, "qk 96 / v 96");
    m = llama(), m.num_kv_heads = 2;
    ap_test_expect_verdict(vt, "group 16", &m, NULL, &d, "GQA group of 16");
    m = llama(), m.num_kv_heads = 5;
    ap_test_expect_verdict(vt, "5 KV heads", &m, NULL, &d, "must divide");
    m = ap_test_mla_model("deepseek-ai/DeepSeek-V3", 16);
    ap_test_expect_verdict(vt, "MLA", &m, NULL, &d, "attention kind MLA");
    m = llama(), m.kv_dtype = AP_DTYPE_NVFP4;
    ap_test_expect_verdict(vt, "nvfp4", &m, NULL, &d, "nvfp4 is neither");
    m = llama(), m.kv_dtype = AP_DTYPE_F16;
    ap_test_expect_verdict(vt, "f16 cache, bf16 q", &m, NULL, &d, "f16 is neither");
    m = llama(), m.dtype = m.kv_dtype = AP_DTYPE_F32;
    ap_test_expect_verdict(vt, "f32", &m, NULL, &d, "query dtype f32");
    ap_device old = ap_test_h100();
    old.cc_major = 8;
    m = llama();
    ap_test_expect_verdict(vt, "sm_80", &m, NULL, &old, "below 9.0");
    ap_device cpu = ap_test_h100();
    cpu.ordinal = -1;
    snprintf(cpu.unusable_reason, sizeof cpu.unusable_reason, "no CUDA driver");
    ap_test_expect_verdict(vt, "the CPU", &m, NULL, &cpu, "needs a CUDA GPU: no CUDA driver");
    /* every reason, not just the first */
    m = llama(), m.num_kv_heads = 2, m.head_dim_qk = m.head_dim_v = 96;
    char text[1024] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(vt->validate(&m, NULL, &d, &msg) == AP_ERR_REFUSED && strstr(text, "group of 16") &&
               strstr(text, "qk 96"),
           "two reasons, got '%s'", text);
}

static void test_options(void) {
    ap_device d = ap_test_h100();
    ap_model m = qwen_embedding();
    ap_option_kv on = {"embedding_skip_kv", "on"}, off = {"embedding_skip_kv", "off"};
    ap_option_kv bad = {"embedding_skip_kv", "yes"}, unknown = {"skip", "on"};
    ap_options o = options_with(0, &on, 1);
    ap_test_expect_verdict(vt, "skip on, prefix cache off", &m, &o, &d, NULL);
    o = options_with(1, &on, 1);
    ap_test_expect_verdict(vt, "skip on, prefix cache on", &m, &o, &d,
                           "a shared prefix would be read from a cache never written");
    o = options_with(AP_OPTION_UNSET, &on, 1);
    ap_test_expect_verdict(vt, "skip on, prefix cache unset", &m, &o, &d, "unset, which means on");
    o = options_with(1, NULL, 0);
    ap_test_expect_verdict(vt, "auto, prefix cache on: the cached path", &m, &o, &d, NULL);
    o = options_with(0, &off, 1);
    ap_test_expect_verdict(vt, "skip off", &m, &o, &d, NULL);
    ap_model chat = llama();
    o = options_with(0, &on, 1);
    ap_test_expect_verdict(vt, "skip on, not an embedding model", &chat, &o, &d,
                           "not an embedding model");
    o = options_with(0, &bad, 1);
    ap_test_expect_verdict(vt, "bad value", &m, &o, &d, "'yes', not auto, on or off");
    o = options_with(0, &unknown, 1);
    ap_test_expect_verdict(vt, "unknown", &m, &o, &d, "unknown option 'skip'");
    o = options_with(0, NULL, 0), o.cuda_graphs = 1;
    ap_test_expect_verdict(vt, "graphs", &m, &o, &d, "CUDA graphs are not supported");
    /* the Hopper prefill's schedule: dynamic (the default) or rounds */
    ap_option_kv rounds = {"schedule", "rounds"}, dynamic = {"schedule", "dynamic"};
    ap_option_kv bad_sched = {"schedule", "static"};
    ap_option_kv both[2] = {{"schedule", "rounds"}, {"embedding_skip_kv", "off"}};
    o = options_with(0, &rounds, 1);
    ap_test_expect_verdict(vt, "schedule rounds", &m, &o, &d, NULL);
    EXPECT(fav_option_rounds(&o) == 1, "schedule rounds: read as rounds");
    o = options_with(0, &dynamic, 1);
    ap_test_expect_verdict(vt, "schedule dynamic", &m, &o, &d, NULL);
    EXPECT(fav_option_rounds(&o) == 0, "schedule dynamic: not rounds");
    o = options_with(0, both, 2);
    ap_test_expect_verdict(vt, "schedule and skip", &m, &o, &d, NULL);
    EXPECT(fav_option_rounds(&o) == 1 && fav_kv_mode_of(&m, &o) == FAV_KV_CACHED,
           "schedule rounds beside skip off");
    EXPECT(fav_option_rounds(NULL) == 0, "no options: dynamic");
    o = options_with(0, &bad_sched, 1);
    ap_test_expect_verdict(vt, "bad schedule", &m, &o, &d, "'static', not dynamic or rounds");
}

/* The embedding mode's decision, and what each mode asks of the host's cache. */
static void test_kv_mode_and_spec(void) {
    ap_model emb = qwen_embedding(), chat = llama();
    ap_option_kv off = {"embedding_skip_kv", "off"};
    ap_options pc_off = options_with(0, NULL, 0), pc_on = options_with(1, NULL, 0);
    ap_options pc_unset = options_with(AP_OPTION_UNSET, NULL, 0), forced = options_with(0, &off, 1);
    EXPECT(fav_kv_mode_of(&emb, &pc_off) == FAV_KV_SKIP, "embedding, prefix cache off: skip");
    EXPECT(fav_kv_mode_of(&emb, &pc_on) == FAV_KV_CACHED, "prefix cache on: cached");
    EXPECT(fav_kv_mode_of(&emb, &pc_unset) == FAV_KV_CACHED, "prefix cache unset (on): cached");
    EXPECT(fav_kv_mode_of(&emb, &forced) == FAV_KV_CACHED, "skip off: cached");
    EXPECT(fav_kv_mode_of(&chat, &pc_off) == FAV_KV_CACHED, "not an embedding model: cached");
    EXPECT(fav_kv_mode_of(&emb, NULL) == FAV_KV_CACHED, "no options: cached");

    /* get_kv_spec reads only the model and the mode: an instance built by hand reaches it
     * without a GPU */
    ap_backend b;
    memset(&b, 0, sizeof b);
    b.model = emb;
    b.kv_mode = FAV_KV_SKIP;
    ap_kv_spec spec = {.struct_size = sizeof spec, .k_bytes_per_page = 1, .v_bytes_per_page = 1};
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    EXPECT(vt->get_kv_spec(&b, &spec, &msg) == AP_OK && spec.k_bytes_per_page == 0 &&
               spec.v_bytes_per_page == 0 && spec.scale_bytes_per_page == 0,
           "skip-KV asks for no cache: %zu / %zu bytes, '%s'", spec.k_bytes_per_page,
           spec.v_bytes_per_page, text);
    b.kv_mode = FAV_KV_CACHED;
    b.model.kv_dtype = AP_DTYPE_FP8_E4M3;
    EXPECT(vt->get_kv_spec(&b, &spec, &msg) == AP_OK && spec.k_bytes_per_page == 16 * 8 * 128 &&
               spec.v_bytes_per_page == 16 * 8 * 128 && spec.alignment >= 16,
           "cached fp8: a page of 16 x 8 x 128 bytes, got %zu", spec.k_bytes_per_page);
}

static void test_caps(void) {
    EXPECT(caps->attn_kinds == AP_ATTN_BIT(AP_ATTN_MHA), "MHA only");
    EXPECT(caps->features & AP_FEATURE_EMBEDDING_SKIP_KV, "skip-KV declared");
    EXPECT((caps->features & AP_FEATURE_NONCAUSAL) && (caps->features & AP_FEATURE_LSE),
           "non-causal and LSE declared");
    EXPECT(caps->phases == (AP_PHASE_EXTEND | AP_PHASE_DECODE), "extend and decode");
    EXPECT(caps->needs_host_mirrors == 1 && caps->cuda_graph == AP_GRAPH_NONE, "host plan");
    EXPECT(caps->page_sizes == NULL && caps->num_head_dims == 3, "any page, three head dims");
    EXPECT(caps->num_archs >= 1 && caps->archs[0].sm == 90, "sm_90 built");
    EXPECT(vt->get_hook(NULL, AP_HOOK_APPEND_KV_V1) == NULL, "no hooks");
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    void *so = NULL;
    ap_plugin_negotiate_fn negotiate = NULL;
    const ap_descriptor *desc = ap_test_open_plugin(argv[1], "fa_varlen", &so, &negotiate);
    if (desc == NULL) return 1;
    vt = desc->vtable;
    caps = desc->caps;
    test_shapes();
    test_options();
    test_kv_mode_and_spec();
    test_caps();
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok", failures);
    dlclose(so);
    return failures ? 1 : 0;
}
