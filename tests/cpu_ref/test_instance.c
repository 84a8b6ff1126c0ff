/* test_instance.c: cpu_ref through the core: registry, ap_instance_open and the checked calls. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "attnplug.h"
#include "scenario.h"

static fx_plugin plugin; /* for sc_build's own create; the calls under test go through the core */
static ap_registry *registry;
static ap_device cpu;

static int setup(void **state) {
    (void)state;
    ap_registry_options options = {.struct_size = sizeof options,
                                   .flags = AP_REGISTRY_NO_DEFAULT_PATHS};
    if (ap_registry_create(&options, &registry) != AP_OK) return -1;
    if (ap_registry_load_file(registry, getenv("AP_CPU_REF_PLUGIN")) != AP_OK) {
        print_error("load: %s\n", ap_last_error());
        return -1;
    }
    ap_device_cpu(&cpu, "no GPU in this test");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    return ap_registry_destroy(registry) == AP_OK ? 0 : -1;
}

static sc_case instance_case(int decode, ap_dtype kv_dtype) {
    sc_case c = {
        .q_dtype = AP_DTYPE_BF16,
        .kv_dtype = kv_dtype,
        .page_size = 16,
        .num_kv_heads = 2,
        .group = 4,
        .head_dim_qk = 64,
        .head_dim_v = 64,
        .causal = 1,
        .window_left = -1,
        .save_kv = 1,
        .decode = decode,
        .with_lse = 1,
        .num_seqs = 3,
        .prefix = {0, 17, 40},
        .q_len = {decode ? 1 : 13, 1, decode ? 1 : 6},
    };
    return c;
}

static void run_through_core(const sc_case *c) {
    sc_scenario s;
    assert_int_equal(sc_build(&s, &plugin, c), 0);
    ap_instance *instance = NULL;
    if (ap_instance_open(registry, "cpu_ref", &s.model, NULL, &cpu, &instance) != AP_OK)
        fail_msg("open: %s", ap_last_error());
    assert_string_equal(ap_instance_backend(instance), "cpu_ref");
    ap_kv_spec spec = {.struct_size = sizeof spec};
    assert_int_equal(ap_instance_kv_spec(instance, &spec), AP_OK);
    assert_true(spec.k_bytes_per_page * (size_t)s.num_pages <= s.k_bytes);
    if (ap_instance_init_metadata(instance, &s.batch, NULL) != AP_OK)
        fail_msg("init_metadata: %s", ap_last_error());
    ap_status status = c->decode ? ap_instance_forward_decode(instance, &s.layer, &s.args, NULL)
                                 : ap_instance_forward_extend(instance, &s.layer, &s.args, NULL);
    if (status != AP_OK) fail_msg("forward: %s", ap_last_error());
    sc_check(&s);
    ap_instance_close(instance);
    sc_free(&s, &plugin);
}

static void test_extend_and_decode(void **state) {
    (void)state;
    sc_case extend = instance_case(0, AP_DTYPE_FP8_E4M3);
    run_through_core(&extend);
    sc_case decode = instance_case(1, AP_DTYPE_BF16);
    run_through_core(&decode);
}

static void test_hooks_and_refusals(void **state) {
    (void)state;
    sc_case c = instance_case(0, AP_DTYPE_F16);
    sc_scenario s;
    assert_int_equal(sc_build(&s, &plugin, &c), 0);
    ap_instance *instance = NULL;
    assert_int_equal(ap_instance_open(registry, "cpu_ref", &s.model, NULL, &cpu, &instance), AP_OK);
    assert_true(ap_instance_has_hook(instance, AP_HOOK_APPEND_KV_V1));
    assert_true(ap_instance_has_hook(instance, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1));
    assert_true(ap_instance_has_hook(instance, AP_HOOK_MERGE_STATE_V1));
    assert_false(ap_instance_has_hook(instance, AP_HOOK_CUDA_GRAPH_V1));
    assert_int_equal(ap_instance_cuda_graph_prepare(instance, 8, NULL), AP_ERR_UNSUPPORTED);
    /* a page index past the cache: refused (by the core or by cpu_ref), nothing written */
    unsigned char *k_before = malloc(s.k_bytes);
    memcpy(k_before, s.k_pages, s.k_bytes);
    s.page_indices[0] = s.num_pages + 2;
    ap_status status = ap_instance_init_metadata(instance, &s.batch, NULL);
    if (status == AP_OK) status = ap_instance_forward_extend(instance, &s.layer, &s.args, NULL);
    assert_int_equal(status, AP_ERR_SHAPE_MISMATCH);
    assert_true(strlen(ap_last_error()) > 0);
    assert_memory_equal(k_before, s.k_pages, s.k_bytes);
    free(k_before);
    ap_instance_close(instance);
    /* an MLA model whose widths do not add up (no latent, 2 KV heads) is refused with its
     * reason; one that does is served */
    ap_model mla = s.model;
    mla.kind = AP_ATTN_MLA;
    instance = NULL;
    assert_int_not_equal(ap_instance_open(registry, "cpu_ref", &mla, NULL, &cpu, &instance), AP_OK);
    assert_null(instance);
    assert_non_null(strstr(ap_last_error(), "MLA"));
    mla.num_kv_heads = 1, mla.kv_lora_rank = 48, mla.qk_rope_head_dim = 16;
    mla.head_dim_qk = 64, mla.head_dim_v = 48;
    assert_int_equal(ap_instance_open(registry, "cpu_ref", &mla, NULL, &cpu, &instance), AP_OK);
    ap_instance_close(instance);
    sc_free(&s, &plugin);
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_extend_and_decode),
        cmocka_unit_test(test_hooks_and_refusals),
    };
    int failed = cmocka_run_group_tests(tests, setup, teardown);
    fx_plugin_close(&plugin);
    return failed;
}
