/* test_fil_validate.c: flashinfer_like's negotiation, caps and validate() reasons, no GPU needed. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "plugin_api.h"
#include "tests/common/test_expect.h"
#include "tests/common/test_model.h"

static const ap_vtable *vt;

static ap_model good_model(void) {
    ap_model m = ap_test_model("test", 32, 8, 128, 128, AP_DTYPE_BF16, AP_DTYPE_BF16);
    m.num_layers = 1;
    m.max_batch = 64;
    m.max_tokens = 4096;
    m.max_kv_len = 32768;
    return m;
}

static void test_validate(void) {
    ap_model m = good_model();
    ap_device d = ap_test_h100();
    ap_test_expect_verdict(vt, "the Llama-3-8B shape", &m, NULL, &d, NULL);
    m.kv_dtype = AP_DTYPE_FP8_E4M3;
    m.page_size = 1;
    m.num_qo_heads = 28;
    m.num_kv_heads = 4; /* group 7 */
    ap_test_expect_verdict(vt, "fp8, page 1, group 7", &m, NULL, &d, NULL);

    m = good_model(), m.kind = AP_ATTN_MLA;
    ap_test_expect_verdict(vt, "MLA", &m, NULL, &d, "MLA");
    m = good_model(), m.head_dim_qk = m.head_dim_v = 96;
    ap_test_expect_verdict(vt, "head dim 96", &m, NULL, &d, "head dim 96 is not 64, 128 or 256");
    m = good_model(), m.head_dim_v = 64;
    ap_test_expect_verdict(vt, "qk 128, v 64", &m, NULL, &d, "differs from v head dim");
    m = good_model(), m.page_size = 3;
    ap_test_expect_verdict(vt, "page 3", &m, NULL, &d, "page size 3 is not a power of two");
    m = good_model(), m.page_size = 256;
    ap_test_expect_verdict(vt, "page 256", &m, NULL, &d, "page size 256");
    m = good_model(), m.num_qo_heads = 64, m.num_kv_heads = 4;
    ap_test_expect_verdict(vt, "group 16", &m, NULL, &d, "GQA group of 16");
    m = good_model(), m.num_qo_heads = 30;
    ap_test_expect_verdict(vt, "30 over 8 heads", &m, NULL, &d, "must divide");
    m = good_model(), m.dtype = AP_DTYPE_F32, m.kv_dtype = AP_DTYPE_FP8_E4M3;
    ap_test_expect_verdict(vt, "f32 queries", &m, NULL, &d, "query dtype f32 is not bf16 or f16");
    m = good_model(), m.kv_dtype = AP_DTYPE_NVFP4;
    ap_test_expect_verdict(vt, "nvfp4 cache, a model that decodes", &m, NULL, &d, NULL);
    m.embedding = 1; /* extend only: staged to 16 bits */
    ap_test_expect_verdict(vt, "nvfp4 cache, an embedding model", &m, NULL, &d, NULL);
    ap_option_kv gone = {"nvfp4_decode", "on"}; /* the old switch is an unknown option now */
    ap_options with_gone = {.struct_size = sizeof with_gone,
                            .prefix_cache = AP_OPTION_UNSET,
                            .chunked_prefill = AP_OPTION_UNSET,
                            .cuda_graphs = AP_OPTION_UNSET,
                            .extra = &gone,
                            .num_extra = 1};
    ap_test_expect_verdict(vt, "nvfp4_decode option", &m, &with_gone, &d, "nvfp4_decode");
    m = good_model(), m.kv_dtype = AP_DTYPE_FP8_E5M2;
    ap_test_expect_verdict(vt, "e5m2 cache", &m, NULL, &d, "not bf16, f16, fp8_e4m3 or nvfp4");
    m = good_model(), m.kv_dtype = AP_DTYPE_F16;
    ap_test_expect_verdict(vt, "f16 cache, bf16 queries", &m, NULL, &d,
                           "must have the query dtype");
    m = good_model(), m.max_batch = 0;
    ap_test_expect_verdict(vt, "max_batch 0", &m, NULL, &d, "max_batch 0");

    m = good_model();
    ap_device cpu = d;
    cpu.ordinal = -1;
    snprintf(cpu.unusable_reason, sizeof cpu.unusable_reason, "no CUDA driver: test");
    ap_test_expect_verdict(vt, "the CPU", &m, NULL, &cpu, "needs a CUDA GPU: no CUDA driver: test");
    ap_device ampere = d;
    ampere.cc_major = 8;
    ap_test_expect_verdict(vt, "an sm_80 GPU", &m, NULL, &ampere,
                           "compute capability 8.0 is below 9.0");

    ap_option_kv extra[2] = {{"split_kv", "off"}, {"decode_warps_per_sm", "8"}};
    ap_options o = {.struct_size = sizeof o,
                    .prefix_cache = AP_OPTION_UNSET,
                    .chunked_prefill = AP_OPTION_UNSET,
                    .cuda_graphs = AP_OPTION_UNSET,
                    .extra = extra,
                    .num_extra = 2};
    ap_test_expect_verdict(vt, "known options", &m, &o, &d, NULL);
    extra[0].value = "sometimes";
    ap_test_expect_verdict(vt, "split_kv: sometimes", &m, &o, &d, "split_kv is 'sometimes'");
    extra[0] = (ap_option_kv){"splitkv", "off"};
    ap_test_expect_verdict(vt, "a typo", &m, &o, &d, "unknown option 'splitkv'");
    extra[0] = (ap_option_kv){"split_kv", "auto"};
    extra[1].value = "0";
    ap_test_expect_verdict(vt, "decode_warps_per_sm 0", &m, &o, &d, "decode_warps_per_sm is '0'");
    extra[1].value = "4";
    o.cuda_graphs = 1;
    ap_test_expect_verdict(vt, "CUDA graphs", &m, &o, &d, "CUDA graphs are not supported");

    /* every reason, not just the first */
    char text[1024] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    m = good_model(), m.head_dim_qk = m.head_dim_v = 80, m.page_size = 5;
    EXPECT(vt->validate(&m, NULL, &ampere, &msg) == AP_ERR_REFUSED && strstr(text, "80") &&
               strstr(text, "page size 5") && strstr(text, "8.0"),
           "three reasons, got '%s'", text);
}

/* caps.archs must say what the build compiled: "90a" -> sm_90a SASS, "90" -> SASS, "ptxNN" PTX. */
static void test_caps(const ap_caps *caps) {
    const char *p = AP_CUDA_ARCHS;
    size_t expected = 0;
    for (const char *entry = p; *entry != '\0';) {
        const char *end = strchr(entry, ',');
        size_t len = end != NULL ? (size_t)(end - entry) : strlen(entry);
        if (len > 0 && expected < caps->num_archs) {
            ap_arch_kind kind = strncmp(entry, "ptx", 3) == 0 ? AP_ARCH_PTX
                                : entry[len - 1] == 'a'       ? AP_ARCH_SASS_SPECIFIC
                                                              : AP_ARCH_SASS;
            int sm = 0;
            for (const char *c = entry + (kind == AP_ARCH_PTX ? 3 : 0); *c >= '0' && *c <= '9'; c++)
                sm = sm * 10 + (*c - '0');
            EXPECT(caps->archs[expected].sm == sm && caps->archs[expected].kind == kind,
                   "arch %zu of '%s' as {%d, %d}, got {%d, %d}", expected, p, sm, (int)kind,
                   caps->archs[expected].sm, (int)caps->archs[expected].kind);
        }
        if (len > 0) expected++;
        entry = end != NULL ? end + 1 : entry + len;
    }
    EXPECT(caps->num_archs == expected, "%zu archs for '%s', got %zu", expected, p,
           caps->num_archs);
    EXPECT(caps->device_kinds == AP_DEVICE_KIND_CUDA, "a CUDA-only backend");
    EXPECT(caps->needs_host_mirrors == 1 && caps->cuda_graph == AP_GRAPH_NONE,
           "host mirrors needed, no graphs");
    EXPECT(caps->num_page_sizes == 8 && caps->page_sizes[0] == 1 && caps->page_sizes[7] == 128,
           "page sizes 1..128");
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_fil_validate PLUGIN.so\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    ap_plugin_negotiate_fn negotiate = (ap_plugin_negotiate_fn)dlsym(lib, AP_PLUGIN_ENTRY);
    EXPECT(negotiate != NULL, "the entry symbol");
    if (negotiate == NULL) return 1;
    char text[256] = "";
    ap_msgbuf msg = {sizeof msg, text, sizeof text, 0};
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR + 1, 0};
    ap_negotiate_reply reply = {sizeof reply, 0, 0, NULL};
    EXPECT(negotiate(&offer, &reply, &msg) == AP_ERR_ABI_MISMATCH && strstr(text, "ABI"),
           "a newer major refused, got '%s'", text);
    offer.core_abi_major = AP_ABI_VERSION_MAJOR;
    offer.core_abi_minor = AP_ABI_VERSION_MINOR;
    EXPECT(negotiate(&offer, &reply, &msg) == AP_OK && reply.descriptor != NULL, "negotiation");
    if (reply.descriptor == NULL) return 1;
    EXPECT(strcmp(reply.descriptor->name, "flashinfer_like") == 0, "the name");
    vt = reply.descriptor->vtable;
    test_caps(reply.descriptor->caps);
    test_validate();
    /* dlclose is skipped: the CUDA runtime inside registers exit handlers */
    printf("%s\n", failures == 0 ? "ok" : "FAILED");
    return failures != 0;
}
