/* test_select.c: verdicts on fixture backends for injected devices, and preference-list walks. */
#include "support.h"

static int setup(void **state) {
    *state = tc_registry_open();
    return 0;
}

static int teardown(void **state) {
    return ap_registry_destroy(*state) == AP_OK ? 0 : -1;
}

/* Check one backend and return its verdict (strings valid until the next check). */
static ap_verdict check(ap_registry *r, const char *name, const ap_model *m, const ap_options *o,
                        const ap_device *d) {
    ap_verdict v;
    memset(&v, 0, sizeof v);
    ap_status status = ap_registry_check(r, name, m, o, d, &v);
    assert_int_equal(status, v.status);
    assert_string_equal(v.backend, name);
    return v;
}

static void test_cuda_fixture_on_devices(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no CUDA driver: libcuda.so.1: cannot open shared object file");
    ap_verdict v = check(r, "fx_cuda", &m, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_NO_DEVICE);
    TC_ASSERT_HAS(v.reasons, "no CUDA driver: libcuda.so.1: cannot open shared object file");
    assert_int_equal(v.arch_index, -1);
    TC_ASSERT_HAS(ap_last_error(), "fx_cuda");
    TC_ASSERT_HAS(ap_last_error(), "no CUDA driver");

    ap_device sm90 = tc_gpu(9, 0);
    v = check(r, "fx_cuda", &m, NULL, &sm90);
    assert_int_equal(v.status, AP_OK);
    assert_string_equal(v.reasons, "");
    assert_int_equal(v.arch_index, 0);
    assert_string_equal(ap_last_error(), "");

    ap_device sm80 = tc_gpu(8, 0);
    v = check(r, "fx_cuda", &m, NULL, &sm80);
    assert_int_equal(v.status, AP_ERR_NO_DEVICE);
    assert_string_equal(v.reasons, "compiled for sm_90a (SASS, arch-specific); this GPU is sm_80");

    ap_device sm100 = tc_gpu(10, 0);
    v = check(r, "fx_cuda", &m, NULL, &sm100);
    assert_int_equal(v.status, AP_ERR_NO_DEVICE);
    TC_ASSERT_HAS(v.reasons, "this GPU is sm_100");
}

static void test_ptx_fixture_picks(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    const struct {
        int32_t major, minor;
        ap_status status;
        int arch_index;
    } cases[] = {
        {8, 0, AP_OK, 0},
        {8, 6, AP_OK, 0},
        {9, 0, AP_OK, 1},
        {10, 0, AP_OK, 1},
        {7, 5, AP_ERR_NO_DEVICE, -1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ap_device d = tc_gpu(cases[i].major, cases[i].minor);
        ap_verdict v = check(r, "fx_cuda_ptx", &m, NULL, &d);
        assert_int_equal(v.status, cases[i].status);
        assert_int_equal(v.arch_index, cases[i].arch_index);
    }
    ap_device sm75 = tc_gpu(7, 5);
    ap_verdict v = check(r, "fx_cuda_ptx", &m, NULL, &sm75);
    assert_string_equal(v.reasons,
                        "compiled for sm_80 (SASS), compute_90 (PTX); this GPU is sm_75");
}

/* A GPU the host marked unusable is no GPU for a CUDA backend; a CPU backend serves anywhere. */
static void test_device_kinds(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device broken = tc_gpu(9, 0);
    snprintf(broken.unusable_reason, sizeof broken.unusable_reason, "GPU 0 fell off the bus");
    ap_verdict v = check(r, "fx_cuda", &m, NULL, &broken);
    assert_int_equal(v.status, AP_ERR_NO_DEVICE);
    TC_ASSERT_HAS(v.reasons, "GPU 0 fell off the bus");
    ap_device cpu = tc_cpu("");
    v = check(r, "fx_cuda", &m, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_NO_DEVICE);
    TC_ASSERT_HAS(v.reasons, "needs a CUDA GPU");
    ap_device sm90 = tc_gpu(9, 0);
    assert_int_equal(check(r, "fx_wide", &m, NULL, &sm90).status, AP_OK);
    assert_int_equal(check(r, "fx_wide", &m, NULL, &cpu).status, AP_OK);
}

/* One model that breaks every static capability of fx_narrow at once. */
static void test_every_static_mismatch(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("misfit");
    m.dtype = AP_DTYPE_F16;
    m.kv_dtype = AP_DTYPE_FP8_E4M3;
    m.page_size = 8;
    m.head_dim_qk = 64;
    m.head_dim_v = 64;
    m.num_qo_heads = 6;
    m.num_kv_heads = 4;
    m.causal = 0;
    ap_options o = {sizeof o, 0, AP_DTYPE_NONE, AP_OPTION_UNSET, AP_OPTION_UNSET, 1, NULL, 0};
    ap_device cpu = tc_cpu("no GPU");
    ap_verdict v = check(r, "fx_narrow", &m, &o, &cpu);
    assert_int_equal(v.status, AP_ERR_UNSUPPORTED);
    const char *expected[] = {
        "query dtype f16 is not supported (supports bf16)",
        "KV-cache dtype fp8_e4m3 is not supported (supports bf16)",
        "page size 8 is not supported (supports 16, 32)",
        "head dim 64 is not supported (supports 128)",
        "decode phase is not supported",
        "non-causal attention is not supported",
        "options.cuda_graphs is on",
        "num_qo_heads 6 is not a multiple of num_kv_heads 4",
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        TC_ASSERT_HAS(v.reasons, expected[i]);
        TC_ASSERT_HAS(ap_last_error(), expected[i]);
    }
    /* One line per reason, nothing else. */
    size_t lines = 1;
    for (const char *p = v.reasons; *p != '\0'; p++) lines += *p == '\n';
    assert_int_equal(lines, sizeof expected / sizeof expected[0]);
    TC_ASSERT_HAS(ap_last_error(), "backend 'fx_narrow' cannot serve model 'misfit'");
}

static void test_attention_kind_and_phases(void **state) {
    ap_registry *r = *state;
    ap_device cpu = tc_cpu("no GPU");
    ap_model mla = tc_model_mla("deepseek");
    mla.dtype = AP_DTYPE_BF16;
    ap_verdict v = check(r, "fx_narrow", &mla, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_UNSUPPORTED);
    TC_ASSERT_HAS(v.reasons, "attention kind mla is not supported (supports mha)");
    /* The MLA fixture serves it; a broken MLA shape is a reason there. */
    assert_int_equal(check(r, "fx_mla", &mla, NULL, &cpu).status, AP_OK);
    mla.head_dim_qk = 30;
    v = check(r, "fx_mla", &mla, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_UNSUPPORTED);
    TC_ASSERT_HAS(v.reasons, "MLA head_dim_qk 30 != kv_lora_rank 16 + qk_rope_head_dim 8");
    /* An embedding model never decodes: extend alone is enough. */
    ap_model embed = tc_model_mha("embedder");
    embed.dtype = AP_DTYPE_BF16;
    embed.head_dim_qk = embed.head_dim_v = 128;
    embed.embedding = 1;
    assert_int_equal(check(r, "fx_narrow", &embed, NULL, &cpu).status, AP_OK);
    embed.embedding = 0;
    v = check(r, "fx_narrow", &embed, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_UNSUPPORTED);
    assert_string_equal(v.reasons, "decode phase is not supported (the model is not an embedding "
                                   "model, so it decodes)");
}

/* validate() sees the model with the options applied, and every one of its reasons is kept. */
static void test_validate_refusal(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_options o = {
        sizeof o, 64, AP_DTYPE_FP8_E4M3, AP_OPTION_UNSET, AP_OPTION_UNSET, AP_OPTION_UNSET,
        NULL,     0};
    ap_device cpu = tc_cpu("no GPU");
    ap_verdict v = check(r, "fx_picky", &m, &o, &cpu);
    assert_int_equal(v.status, AP_ERR_REFUSED);
    assert_string_equal(v.reasons, "picky reason one: page size 64 is not to its taste\n"
                                   "picky reason two: 2 layers are too many");
    TC_ASSERT_HAS(ap_last_error(), "picky reason one: page size 64 is not to its taste");
    TC_ASSERT_HAS(ap_last_error(), "picky reason two: 2 layers are too many");
}

static void test_not_found_and_bad_input(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no GPU");
    ap_verdict v = check(r, "nope", &m, NULL, &cpu);
    assert_int_equal(v.status, AP_ERR_NOT_FOUND);
    assert_string_equal(v.reasons, "no plugin provides backend 'nope'");
    assert_string_equal(ap_last_error(), "no plugin provides backend 'nope'");

    ap_model bad = m;
    bad.num_qo_heads = 0;
    bad.page_size = 0;
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &bad, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "model.num_qo_heads is 0 (must be > 0)");
    TC_ASSERT_HAS(ap_last_error(), "model.page_size is 0");
    TC_ASSERT_HAS(v.reasons, "model.num_qo_heads is 0");
    bad = m;
    bad.kind = (ap_attn_kind)9;
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &bad, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "model.kind 9 is not an attention kind");
    bad = m;
    bad.dtype = AP_DTYPE_NONE;
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &bad, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "model.dtype 0 is not a dtype");
    bad = m;
    bad.struct_size = 8;
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &bad, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "model.struct_size is 8");
    ap_options o = {sizeof o, -4, AP_DTYPE_NONE, AP_OPTION_UNSET, AP_OPTION_UNSET, AP_OPTION_UNSET,
                    NULL,     0};
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &m, &o, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "options.page_size is -4");
    o.page_size = 0;
    o.prefix_cache = 5;
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &m, &o, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "options flag 5");
    TC_ASSERT_FAILS(ap_registry_check(r, "fx_wide", &m, NULL, NULL, &v), AP_ERR_INVALID_ARGUMENT,
                    "device is NULL");
    TC_ASSERT_FAILS(ap_registry_check(NULL, "fx_wide", &m, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "registry is NULL");
    TC_ASSERT_FAILS(ap_registry_check(r, NULL, &m, NULL, &cpu, &v), AP_ERR_INVALID_ARGUMENT,
                    "name");
}

static void test_apply_options(void **state) {
    (void)state;
    ap_model m = tc_model_mha("llama");
    ap_model out;
    ap_model_apply_options(&m, NULL, &out);
    assert_memory_equal(&out, &m, sizeof m);
    ap_options o = {sizeof o, 32, AP_DTYPE_FP8_E5M2, 0, 1, 1, NULL, 0};
    ap_model_apply_options(&m, &o, &out);
    assert_int_equal(out.page_size, 32);
    assert_int_equal(out.kv_dtype, AP_DTYPE_FP8_E5M2);
    assert_int_equal(out.head_dim_qk, m.head_dim_qk);
    assert_ptr_equal(out.name, m.name);
    o.page_size = 0;
    o.kv_dtype = AP_DTYPE_NONE;
    ap_model_apply_options(&m, &o, &out);
    assert_int_equal(out.page_size, 16);
    assert_int_equal(out.kv_dtype, AP_DTYPE_BF16);
    /* A shorter (older) model struct is read up to its size; the rest reads as zero. */
    ap_model older = m;
    older.struct_size = offsetof(ap_model, max_kv_len);
    ap_model_apply_options(&older, NULL, &out);
    assert_int_equal(out.struct_size, sizeof out);
    assert_int_equal(out.max_kv_len, 0);
    assert_int_equal(out.max_tokens, 64);
}

static void test_select_walk(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no CUDA driver: test");
    const char *names[] = {"nope", "fx_cuda", "fx_picky", "fx_wide", "fx_narrow"};
    ap_selection *sel = NULL;
    TC_ASSERT_OK(ap_select(r, names, 5, 0, &m, NULL, &cpu, &sel));
    assert_non_null(sel);
    assert_string_equal(ap_selection_chosen(sel), "fx_wide");
    assert_int_equal(ap_selection_count(sel), 4); /* fx_narrow is never tried */
    const ap_status statuses[] = {AP_ERR_NOT_FOUND, AP_ERR_NO_DEVICE, AP_ERR_REFUSED, AP_OK};
    const char *reasons[] = {"no plugin provides backend 'nope'", "no CUDA driver: test",
                             "picky reason two", ""};
    for (size_t i = 0; i < 4; i++) {
        const ap_verdict *v = ap_selection_verdict(sel, i);
        assert_non_null(v);
        assert_string_equal(v->backend, names[i]);
        assert_int_equal(v->status, statuses[i]);
        TC_ASSERT_HAS(v->reasons, reasons[i]);
    }
    assert_string_equal(ap_selection_verdict(sel, 3)->reasons, "");
    assert_null(ap_selection_verdict(sel, 4));
    /* The selection owns its strings: another check does not change them. */
    ap_verdict other;
    ap_registry_check(r, "fx_narrow", &m, NULL, &cpu, &other);
    TC_ASSERT_HAS(ap_selection_verdict(sel, 2)->reasons, "picky reason one");
    ap_selection_destroy(sel);
}

static void test_select_exhausted(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no CUDA driver: test");
    const char *names[] = {"fx_cuda", "fx_picky"};
    ap_selection *sel = NULL;
    TC_ASSERT_FAILS(ap_select(r, names, 2, 0, &m, NULL, &cpu, &sel), AP_ERR_REFUSED,
                    "no backend can serve model 'llama'");
    TC_ASSERT_HAS(ap_last_error(), "fx_cuda (AP_ERR_NO_DEVICE): needs a CUDA GPU: no CUDA "
                                   "driver: test");
    TC_ASSERT_HAS(ap_last_error(), "fx_picky (AP_ERR_REFUSED): picky reason one");
    TC_ASSERT_HAS(ap_last_error(), "picky reason two");
    assert_non_null(sel);
    assert_null(ap_selection_chosen(sel));
    assert_int_equal(ap_selection_count(sel), 2);
    ap_selection_destroy(sel);
    /* A one-name list that is not explicit is still a list: AP_ERR_REFUSED. */
    TC_ASSERT_FAILS(ap_select(r, names, 1, 0, &m, NULL, &cpu, &sel), AP_ERR_REFUSED, "fx_cuda");
    ap_selection_destroy(sel);
}

static void test_select_explicit_single(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no CUDA driver: test");
    const struct {
        const char *name;
        ap_status status;
        const char *needle;
    } cases[] = {
        {"fx_picky", AP_ERR_REFUSED,
         "picky reason one: page size 16 is not to its taste; picky "
         "reason two"},
        {"fx_cuda", AP_ERR_NO_DEVICE, "needs a CUDA GPU: no CUDA driver: test"},
        {"nope", AP_ERR_NOT_FOUND, "no plugin provides backend 'nope'"},
        {"fx_wide", AP_OK, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ap_selection *sel = NULL;
        TC_ASSERT_FAILS(ap_select(r, &cases[i].name, 1, 1, &m, NULL, &cpu, &sel), cases[i].status,
                        cases[i].needle);
        if (cases[i].status != AP_OK) TC_ASSERT_HAS(ap_last_error(), cases[i].name);
        assert_int_equal(ap_selection_count(sel), 1);
        ap_selection_destroy(sel);
    }
    char dummy;
    ap_selection *sel = (ap_selection *)&dummy; /* must come back NULL */
    TC_ASSERT_FAILS(ap_select(r, NULL, 0, 0, &m, NULL, &cpu, &sel), AP_ERR_INVALID_ARGUMENT,
                    "no backend names");
    assert_null(sel);
    ap_selection_destroy(NULL);
    assert_int_equal(ap_selection_count(NULL), 0);
    assert_null(ap_selection_chosen(NULL));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cuda_fixture_on_devices),
        cmocka_unit_test(test_ptx_fixture_picks),
        cmocka_unit_test(test_device_kinds),
        cmocka_unit_test(test_every_static_mismatch),
        cmocka_unit_test(test_attention_kind_and_phases),
        cmocka_unit_test(test_validate_refusal),
        cmocka_unit_test(test_not_found_and_bad_input),
        cmocka_unit_test(test_apply_options),
        cmocka_unit_test(test_select_walk),
        cmocka_unit_test(test_select_exhausted),
        cmocka_unit_test(test_select_explicit_single),
    };
    return cmocka_run_group_tests_name("core.select", tests, setup, teardown);
}
