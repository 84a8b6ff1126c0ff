/* test_instance.c: instance life cycle, getters, wrappers passing arguments, and hooks. */
#include <stdint.h>

#include "support.h"

static void test_lifecycle(void **state) {
    (void)state;
    ap_registry *r = tc_registry_open();
    ap_model m = tc_model_mha("llama");
    ap_options o = {sizeof o, 32, AP_DTYPE_NONE, AP_OPTION_UNSET, AP_OPTION_UNSET, AP_OPTION_UNSET,
                    NULL,     0};
    ap_device cpu = tc_cpu("no GPU");
    ap_instance *a = NULL, *b = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_wide", &m, &o, &cpu, &a));
    ap_model mla = tc_model_mla("ds");
    TC_ASSERT_OK(ap_instance_open(r, "fx_mla", &mla, NULL, &cpu, &b));
    assert_string_equal(ap_instance_backend(a), "fx_wide");
    assert_string_equal(ap_instance_backend(b), "fx_mla");
    const ap_model *seen = ap_instance_model(a);
    assert_int_equal(seen->page_size, 32); /* options applied */
    assert_int_equal(seen->num_qo_heads, 4);
    assert_string_equal(seen->name, "llama");
    assert_ptr_not_equal(seen->name, m.name); /* the instance keeps its own copy */
    assert_ptr_equal(ap_instance_caps(a), ap_registry_find(r, "fx_wide")->caps);

    /* Plugins stay loaded while instances live. */
    TC_ASSERT_FAILS(ap_registry_destroy(r), AP_ERR_INVALID_ARGUMENT, "2 instance(s) still open");
    ap_instance_close(a);
    TC_ASSERT_FAILS(ap_registry_destroy(r), AP_ERR_INVALID_ARGUMENT, "1 instance(s) still open");
    assert_string_equal(ap_instance_backend(b), "fx_mla"); /* still usable */
    ap_instance_close(b);
    ap_instance_close(NULL);
    TC_ASSERT_OK(ap_registry_destroy(r));
}

static int setup(void **state) {
    *state = tc_registry_open();
    return 0;
}

static int teardown(void **state) {
    return ap_registry_destroy(*state) == AP_OK ? 0 : -1;
}

static void test_open_failures(void **state) {
    ap_registry *r = *state;
    ap_device cpu = tc_cpu("no CUDA driver: test");
    ap_instance *inst = (ap_instance *)&cpu;
    ap_model m = tc_model_mha("create-fails");
    TC_ASSERT_FAILS(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst), AP_ERR_OUT_OF_MEMORY,
                    "backend 'fx_wide': create failed: fixture fx_wide: create fails on purpose "
                    "for this model");
    assert_null(inst);
    m = tc_model_mha("llama");
    TC_ASSERT_FAILS(ap_instance_open(r, "fx_picky", &m, NULL, &cpu, &inst), AP_ERR_REFUSED,
                    "picky reason two");
    TC_ASSERT_FAILS(ap_instance_open(r, "fx_cuda", &m, NULL, &cpu, &inst), AP_ERR_NO_DEVICE,
                    "no CUDA driver: test");
    TC_ASSERT_FAILS(ap_instance_open(r, "nope", &m, NULL, &cpu, &inst), AP_ERR_NOT_FOUND,
                    "no plugin provides backend 'nope'");
    m.num_kv_heads = -1;
    TC_ASSERT_FAILS(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst), AP_ERR_INVALID_ARGUMENT,
                    "model.num_kv_heads is -1");
    assert_null(inst);
    /* None of the failures left an instance counted: the registry still destroys (teardown). */
}

/* A CUDA fixture opens on an injected sm_90 (it has no GPU code to run). */
static void test_open_on_injected_gpu(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device sm90 = tc_gpu(9, 0);
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_cuda", &m, NULL, &sm90, &inst));
    assert_int_equal(ap_instance_caps(inst)->device_kinds, AP_DEVICE_KIND_CUDA);
    ap_instance_close(inst);
}

static void test_kv_spec(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst));
    ap_kv_spec spec;
    TC_ASSERT_OK(ap_instance_kv_spec(inst, &spec));
    /* The fixture's formula: page_size * kv_heads * head_dim * 2 bytes. */
    assert_int_equal(spec.k_bytes_per_page, 16 * 2 * 8 * 2);
    assert_int_equal(spec.v_bytes_per_page, 16 * 2 * 8 * 2);
    assert_int_equal(spec.alignment, 256);
    TC_ASSERT_FAILS(ap_instance_kv_spec(inst, NULL), AP_ERR_INVALID_ARGUMENT, "out");
    ap_instance_close(inst);
}

/* The wrappers pass the instance's plan, the layer and the tensors through. */
static void test_forward_passes_args(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst));
    tc_batch batch;
    tc_layer layer;
    tc_forward fwd;
    tc_batch_extend(&batch);
    tc_layer_init(&layer, &m, 4);
    tc_forward_init(&fwd, &m, 4);
    TC_ASSERT_OK(ap_instance_init_metadata(inst, &batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(inst, &layer.layer, &fwd.args, NULL));
    assert_true(tc_tensor_f32(&fwd.out, 0) == 4.0f); /* tokens planned */
    assert_true(tc_tensor_f32(&fwd.out, 1) == 1.0f); /* layer id */
    assert_true(tc_tensor_f32(&fwd.out, 2) == 1.0f); /* extend entry */
    tc_forward_free(&fwd);

    tc_batch_decode(&batch);
    tc_forward_init(&fwd, &m, 2);
    layer.layer.layer_id = 0;
    TC_ASSERT_OK(ap_instance_init_metadata(inst, &batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_decode(inst, &layer.layer, &fwd.args, NULL));
    assert_true(tc_tensor_f32(&fwd.out, 0) == 2.0f);
    assert_true(tc_tensor_f32(&fwd.out, 1) == 0.0f);
    assert_true(tc_tensor_f32(&fwd.out, 2) == 2.0f); /* decode entry */
    tc_forward_free(&fwd);
    ap_instance_close(inst);
}

/* A plugin's failure comes back with its status, prefixed with backend and entry. */
static void test_plugin_failure_message(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst));
    /* Seven sequences of one token each: the fixture refuses to plan them. */
    tc_batch batch;
    tc_batch_decode(&batch);
    ap_batch *b = &batch.b;
    b->num_seqs = 7;
    b->num_tokens = 7;
    b->num_pages_total = 7;
    b->max_seq_len = 1;
    for (int i = 0; i < 8; i++) {
        batch.qo[i] = i;
        batch.kv_indptr[i] = i;
    }
    for (int i = 0; i < 7; i++) {
        batch.kv_indices[i] = i;
        batch.last[i] = 1;
        batch.seq_lens[i] = 1;
    }
    TC_ASSERT_FAILS(ap_instance_init_metadata(inst, b, NULL), AP_ERR_CUDA,
                    "backend 'fx_wide': init_metadata: fixture fx_wide: init_metadata fails for "
                    "7 sequences");
    /* The failed plan leaves nothing planned. */
    tc_layer layer;
    tc_forward fwd;
    tc_layer_init(&layer, &m, 8);
    tc_forward_init(&fwd, &m, 7);
    TC_ASSERT_FAILS(ap_instance_forward_decode(inst, &layer.layer, &fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "no batch is planned");
    tc_forward_free(&fwd);
    ap_instance_close(inst);
}

typedef struct append_case {
    tc_tensor q, q_out, k, v, positions, out_loc, cos_sin;
    ap_append_kv_args args;
} append_case;

static void append_case_init(append_case *c, const ap_model *m, int64_t t) {
    tc_tensor_init(&c->q, TC_F32, 3, (int64_t[]){t, m->num_qo_heads, m->head_dim_qk});
    tc_tensor_init(&c->q_out, TC_F32, 3, (int64_t[]){t, m->num_qo_heads, m->head_dim_qk});
    tc_tensor_init(&c->k, TC_F32, 3, (int64_t[]){t, m->num_kv_heads, m->head_dim_qk});
    tc_tensor_init(&c->v, TC_F32, 3, (int64_t[]){t, m->num_kv_heads, m->head_dim_v});
    tc_tensor_init(&c->positions, TC_I32, 1, (int64_t[]){t});
    tc_tensor_init(&c->out_loc, TC_I32, 1, (int64_t[]){t});
    tc_tensor_init(&c->cos_sin, TC_F32, 2, (int64_t[]){32, 4});
    c->args = (ap_append_kv_args){sizeof c->args,  &c->q.t,       &c->q_out.t,   &c->k.t, &c->v.t,
                                  &c->positions.t, &c->out_loc.t, &c->cos_sin.t, 4,       1};
}

static void append_case_free(append_case *c) {
    tc_tensor *all[] = {&c->q, &c->q_out, &c->k, &c->v, &c->positions, &c->out_loc, &c->cos_sin};
    for (size_t i = 0; i < 7; i++) tc_tensor_free(all[i]);
}

static void test_hooks_present_and_absent(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mha("llama");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_wide", &m, NULL, &cpu, &inst));
    assert_true(ap_instance_has_hook(inst, AP_HOOK_APPEND_KV_V1));
    assert_false(ap_instance_has_hook(inst, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1));
    assert_false(ap_instance_has_hook(inst, AP_HOOK_CUDA_GRAPH_V1));
    assert_true(ap_instance_has_hook(inst, "fx.vendor/1"));
    assert_false(ap_instance_has_hook(inst, "fx.vendor/2"));

    tc_layer layer;
    tc_layer_init(&layer, &m, 4);
    append_case c;
    append_case_init(&c, &m, 3);
    TC_ASSERT_OK(ap_instance_append_kv(inst, &layer.layer, &c.args, NULL));
    assert_true(tc_tensor_f32(&c.q_out, 0) == 4.0f); /* rotary_dim */
    assert_true(tc_tensor_f32(&c.q_out, 1) == 1.0f); /* is_neox */
    assert_true(tc_tensor_f32(&c.q_out, 2) == 1.0f); /* layer id */
    c.args.rotary_dim = 2;
    c.cos_sin.shape[1] = 2;
    TC_ASSERT_FAILS(ap_instance_append_kv(inst, &layer.layer, &c.args, NULL), AP_ERR_CUDA,
                    "backend 'fx_wide': append_kv/1: fixture fx_wide: append_kv fails on purpose");
    append_case_free(&c);

    ap_pack_kv_args pack = {sizeof pack, NULL, NULL, NULL, NULL, NULL, 1.0f, 1.0f};
    TC_ASSERT_FAILS(ap_instance_pack_prefix_chunk_kv(inst, &pack, NULL), AP_ERR_UNSUPPORTED,
                    "backend 'fx_wide' has no hook 'pack_prefix_chunk_kv/1'");
    TC_ASSERT_FAILS(ap_instance_cuda_graph_prepare(inst, 4, NULL), AP_ERR_UNSUPPORTED,
                    "backend 'fx_wide' has no hook 'cuda_graph/1'");

    /* Any name, asked afresh: the third party's hook is the function the plugin returns. */
    int (*vendor)(void) = (int (*)(void))ap_instance_hook(inst, "fx.vendor/1");
    assert_non_null(vendor);
    assert_int_equal(vendor(), 42);
    assert_null(ap_instance_hook(inst, "fx.missing/1"));
    TC_ASSERT_HAS(ap_last_error(), "backend 'fx_wide' has no hook 'fx.missing/1'");
    ap_instance_close(inst);
}

static void test_mla_hooks(void **state) {
    ap_registry *r = *state;
    ap_model m = tc_model_mla("ds");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(r, "fx_mla", &m, NULL, &cpu, &inst));
    assert_false(ap_instance_has_hook(inst, AP_HOOK_APPEND_KV_V1));
    assert_true(ap_instance_has_hook(inst, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1));
    assert_true(ap_instance_has_hook(inst, AP_HOOK_CUDA_GRAPH_V1));
    tc_layer layer;
    tc_layer_init(&layer, &m, 4);
    ap_append_kv_args append = {sizeof append, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 4, 0};
    TC_ASSERT_FAILS(ap_instance_append_kv(inst, &layer.layer, &append, NULL), AP_ERR_UNSUPPORTED,
                    "backend 'fx_mla' has no hook 'append_kv/1'");
    TC_ASSERT_OK(ap_instance_cuda_graph_prepare(inst, 8, NULL));
    TC_ASSERT_FAILS(ap_instance_cuda_graph_prepare(inst, 9, NULL), AP_ERR_INVALID_ARGUMENT,
                    "max_batch 9 is outside 1..8");
    TC_ASSERT_FAILS(ap_instance_cuda_graph_prepare(inst, 0, NULL), AP_ERR_INVALID_ARGUMENT,
                    "max_batch 0");

    /* T = 3 tokens, H = 4 heads: k_nope [3][4][12], k_pe [3][8], v [3][4][10] -> fp8 outputs. */
    tc_tensor k_nope, k_pe, v, k_out, v_out;
    tc_tensor_init(&k_nope, TC_F32, 3, (int64_t[]){3, 4, 12});
    tc_tensor_init(&k_pe, TC_F32, 2, (int64_t[]){3, 8});
    tc_tensor_init(&v, TC_F32, 3, (int64_t[]){3, 4, 10});
    tc_tensor_init(&k_out, TC_FP8, 3, (int64_t[]){3, 4, 20});
    tc_tensor_init(&v_out, TC_FP8, 3, (int64_t[]){3, 4, 10});
    ap_pack_kv_args pack = {sizeof pack, &k_nope.t, &k_pe.t, &v.t, &k_out.t, &v_out.t, 0.5f, 2.0f};
    TC_ASSERT_OK(ap_instance_pack_prefix_chunk_kv(inst, &pack, NULL));
    assert_int_equal(((unsigned char *)k_out.t.data)[0], 0x5a);
    assert_int_equal(((unsigned char *)v_out.t.data)[0], 0xa5);
    tc_tensor *all[] = {&k_nope, &k_pe, &v, &k_out, &v_out};
    for (size_t i = 0; i < 5; i++) tc_tensor_free(all[i]);
    ap_instance_close(inst);
}

static void test_null_instance(void **state) {
    (void)state;
    assert_null(ap_instance_backend(NULL));
    assert_null(ap_instance_model(NULL));
    assert_null(ap_instance_caps(NULL));
    assert_false(ap_instance_has_hook(NULL, AP_HOOK_APPEND_KV_V1));
    TC_ASSERT_FAILS(ap_instance_init_metadata(NULL, NULL, NULL), AP_ERR_INVALID_ARGUMENT,
                    "instance is NULL");
    TC_ASSERT_FAILS(ap_instance_forward_extend(NULL, NULL, NULL, NULL), AP_ERR_INVALID_ARGUMENT,
                    "instance is NULL");
    TC_ASSERT_FAILS(ap_instance_append_kv(NULL, NULL, NULL, NULL), AP_ERR_INVALID_ARGUMENT,
                    "instance is NULL");
    TC_ASSERT_FAILS(ap_instance_open(NULL, "fx_wide", NULL, NULL, NULL, NULL),
                    AP_ERR_INVALID_ARGUMENT, "out is NULL");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lifecycle),
        cmocka_unit_test(test_open_failures),
        cmocka_unit_test(test_open_on_injected_gpu),
        cmocka_unit_test(test_kv_spec),
        cmocka_unit_test(test_forward_passes_args),
        cmocka_unit_test(test_plugin_failure_message),
        cmocka_unit_test(test_hooks_present_and_absent),
        cmocka_unit_test(test_mla_hooks),
        cmocka_unit_test(test_null_instance),
    };
    return cmocka_run_group_tests_name("core.instance", tests, setup, teardown);
}
