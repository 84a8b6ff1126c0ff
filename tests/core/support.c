/* support.c: helpers of the tests/core suite (see support.h). */
#include <stdio.h>
#include <stdlib.h>

#include "support.h"

ap_registry *tc_registry_open(void) {
    const char *dir = getenv("AP_TEST_CORE_FIXTURES");
    if (dir == NULL) {
        print_error("AP_TEST_CORE_FIXTURES is not set (run through meson test)\n");
        fail();
    }
    const char *dirs[] = {dir};
    ap_registry_options options = {sizeof options, dirs, 1, AP_REGISTRY_NO_DEFAULT_PATHS};
    ap_registry *registry = NULL;
    TC_ASSERT_OK(ap_registry_create(&options, &registry));
    TC_ASSERT_OK(ap_registry_scan(registry));
    assert_int_equal(ap_registry_backend_count(registry), 8);
    return registry;
}

ap_model tc_model_mha(const char *name) {
    return (ap_model){
        .struct_size = sizeof(ap_model),
        .name = name,
        .kind = AP_ATTN_MHA,
        .num_qo_heads = 4,
        .num_kv_heads = 2,
        .head_dim_qk = 8,
        .head_dim_v = 8,
        .dtype = AP_DTYPE_F32,
        .kv_dtype = AP_DTYPE_BF16,
        .page_size = 16,
        .num_layers = 2,
        .causal = 1,
        .max_batch = 8,
        .max_tokens = 64,
        .max_kv_len = 1024,
    };
}

ap_model tc_model_mla(const char *name) {
    ap_model m = tc_model_mha(name);
    m.kind = AP_ATTN_MLA;
    m.num_kv_heads = 1;
    m.kv_lora_rank = 16;
    m.qk_rope_head_dim = 8;
    m.qk_nope_head_dim = 12;
    m.v_head_dim = 10;
    m.head_dim_qk = 24;
    m.head_dim_v = 16;
    return m;
}

ap_device tc_gpu(int32_t major, int32_t minor) {
    ap_device d;
    memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    d.ordinal = 0;
    d.cc_major = major;
    d.cc_minor = minor;
    d.sm_count = 100;
    d.driver_version = 13000;
    snprintf(d.name, sizeof d.name, "injected sm_%d%d", (int)major, (int)minor);
    return d;
}

ap_device tc_cpu(const char *reason) {
    ap_device d;
    ap_device_cpu(&d, reason);
    return d;
}

void tc_tensor_init(tc_tensor *x, DLDataType dtype, int ndim, const int64_t *shape) {
    memset(x, 0, sizeof *x);
    size_t count = 1;
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        count *= (size_t)(shape[i] > 0 ? shape[i] : 1);
    }
    x->t.data = calloc(count, (dtype.bits + 7) / 8 > 0 ? (dtype.bits + 7) / 8 : 1);
    assert_non_null(x->t.data);
    x->t.device = (DLDevice){kDLCPU, 0};
    x->t.ndim = ndim;
    x->t.dtype = dtype;
    x->t.shape = x->shape;
    x->t.strides = NULL;
}

void tc_tensor_free(tc_tensor *x) {
    free(x->t.data);
    x->t.data = NULL;
}

float tc_tensor_f32(const tc_tensor *x, size_t i) {
    return ((const float *)x->t.data)[i];
}

static void tc_batch_point(tc_batch *x, ap_forward_mode mode) {
    ap_batch *b = &x->b;
    memset(b, 0, sizeof *b);
    b->struct_size = sizeof *b;
    b->mode = mode;
    b->num_seqs = 2;
    b->num_pages_total = 3;
    b->max_seq_len = 17;
    b->qo_indptr = b->qo_indptr_host = x->qo;
    b->kv_page_indptr = b->kv_page_indptr_host = x->kv_indptr;
    b->kv_page_indices = b->kv_page_indices_host = x->kv_indices;
    b->kv_last_page_len = b->kv_last_page_len_host = x->last;
    b->seq_lens = b->seq_lens_host = x->seq_lens;
    b->positions = b->positions_host = x->positions;
    const int32_t kv_indptr[] = {0, 1, 3}, kv_indices[] = {0, 1, 2}, last[] = {5, 1},
                  seq_lens[] = {5, 17};
    memcpy(x->kv_indptr, kv_indptr, sizeof kv_indptr);
    memcpy(x->kv_indices, kv_indices, sizeof kv_indices);
    memcpy(x->last, last, sizeof last);
    memcpy(x->seq_lens, seq_lens, sizeof seq_lens);
}

void tc_batch_extend(tc_batch *x) {
    memset(x, 0, sizeof *x);
    tc_batch_point(x, AP_MODE_EXTEND);
    const int32_t qo[] = {0, 3, 4}, positions[] = {2, 3, 4, 16};
    memcpy(x->qo, qo, sizeof qo);
    memcpy(x->positions, positions, sizeof positions);
    x->b.num_tokens = 4;
    x->b.max_q_len = 3;
}

void tc_batch_decode(tc_batch *x) {
    memset(x, 0, sizeof *x);
    tc_batch_point(x, AP_MODE_DECODE);
    const int32_t qo[] = {0, 1, 2}, positions[] = {4, 16};
    memcpy(x->qo, qo, sizeof qo);
    memcpy(x->positions, positions, sizeof positions);
    x->b.num_tokens = 2;
    x->b.max_q_len = 1;
}

/* The fixtures never read the cache: one static buffer stands in for every page. */
static unsigned char tc_page_memory[256];

void tc_layer_init(tc_layer *x, const ap_model *m, int32_t num_pages) {
    memset(x, 0, sizeof *x);
    x->kv = (ap_kv_cache){
        .struct_size = sizeof(ap_kv_cache),
        .layout = AP_KV_LAYOUT_NHD,
        .dtype = m->kv_dtype,
        .page_size = m->page_size,
        .num_pages = num_pages,
        .num_kv_heads = m->num_kv_heads,
        .head_dim_qk = m->head_dim_qk,
        .head_dim_v = m->head_dim_v,
        .k_pages = tc_page_memory,
        .v_pages = m->kind == AP_ATTN_MLA ? NULL : tc_page_memory,
    };
    x->layer = (ap_layer){
        .struct_size = sizeof(ap_layer),
        .layer_id = 1,
        .sm_scale = 0.35f,
        .logit_softcap = 0.0f,
        .k_scale = 1.0f,
        .v_scale = 1.0f,
        .window_left = -1,
        .kv = &x->kv,
    };
}

void tc_forward_init(tc_forward *x, const ap_model *m, int64_t tokens) {
    memset(x, 0, sizeof *x);
    tc_tensor_init(&x->q, TC_F32, 3, (int64_t[]){tokens, m->num_qo_heads, m->head_dim_qk});
    tc_tensor_init(&x->out, TC_F32, 3, (int64_t[]){tokens, m->num_qo_heads, m->head_dim_v});
    tc_tensor_init(&x->lse, TC_F32, 2, (int64_t[]){tokens, m->num_qo_heads});
    tc_tensor_init(&x->k, TC_F32, 3, (int64_t[]){tokens, m->num_kv_heads, m->head_dim_qk});
    tc_tensor_init(&x->v, TC_F32, 3, (int64_t[]){tokens, m->num_kv_heads, m->head_dim_v});
    x->args = (ap_forward_args){
        .struct_size = sizeof(ap_forward_args),
        .q = &x->q.t,
        .k = &x->k.t,
        .v = &x->v.t,
        .out = &x->out.t,
        .lse = &x->lse.t,
        .save_kv = 1,
    };
}

void tc_forward_free(tc_forward *x) {
    tc_tensor_free(&x->q);
    tc_tensor_free(&x->out);
    tc_tensor_free(&x->lse);
    tc_tensor_free(&x->k);
    tc_tensor_free(&x->v);
}
