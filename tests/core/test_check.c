/* test_check.c: the core refuses bad batches, layers and tensors before a backend sees them. */
#include <math.h>
#include <stdlib.h>

#include "support.h"

typedef struct check_state {
    ap_registry *registry;
    ap_instance *inst; /* fx_wide (CPU, needs host mirrors) on the tc_model_mha model */
    ap_model model;
    tc_batch batch;
    tc_layer layer;
    tc_forward fwd;
} check_state;

static int setup(void **state) {
    check_state *s = calloc(1, sizeof *s);
    s->registry = tc_registry_open();
    s->model = tc_model_mha("llama");
    ap_device cpu = tc_cpu("no GPU");
    if (ap_instance_open(s->registry, "fx_wide", &s->model, NULL, &cpu, &s->inst) != AP_OK)
        return -1;
    tc_batch_extend(&s->batch);
    tc_layer_init(&s->layer, &s->model, 4);
    tc_forward_init(&s->fwd, &s->model, 4);
    *state = s;
    return 0;
}

static int teardown(void **state) {
    check_state *s = *state;
    tc_forward_free(&s->fwd);
    ap_instance_close(s->inst);
    int rc = ap_registry_destroy(s->registry) == AP_OK ? 0 : -1;
    free(s);
    return rc;
}

/* The batch as built passes: every rejection below is caused by the one change it makes. */
static void test_good_batch_passes(void **state) {
    check_state *s = *state;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL));
    s->fwd.args.lse = NULL; /* optional */
    s->fwd.args.k = s->fwd.args.v = NULL;
    s->fwd.args.save_kv = 0;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL));
}

#define BATCH_FAILS(s, status, needle) \
    TC_ASSERT_FAILS(ap_instance_init_metadata((s)->inst, &(s)->batch.b, NULL), status, needle)

static void test_batch_counts(void **state) {
    check_state *s = *state;
    s->batch.b.num_seqs = 0;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.num_seqs is 0, expected 1..8");
    TC_ASSERT_HAS(ap_last_error(), "backend 'fx_wide': init_metadata: ");
    s->batch.b.num_seqs = 9;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.num_seqs is 9, expected 1..8");
    tc_batch_extend(&s->batch);
    s->batch.b.num_tokens = 65;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.num_tokens is 65, expected 1..64");
    tc_batch_extend(&s->batch);
    s->batch.b.mode = (ap_forward_mode)3;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.mode 3");
    tc_batch_extend(&s->batch);
    s->batch.b.struct_size = 16;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.struct_size is 16");
    TC_ASSERT_FAILS(ap_instance_init_metadata(s->inst, NULL, NULL), AP_ERR_INVALID_ARGUMENT,
                    "batch is NULL");
}

static void test_batch_required_arrays(void **state) {
    check_state *s = *state;
    s->batch.b.qo_indptr = NULL;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "batch.qo_indptr is NULL");
    tc_batch_extend(&s->batch);
    s->batch.b.kv_page_indices = NULL;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "kv_page_indices");
    /* fx_wide declares needs_host_mirrors. */
    tc_batch_extend(&s->batch);
    s->batch.b.kv_last_page_len_host = NULL;
    BATCH_FAILS(s, AP_ERR_INVALID_ARGUMENT, "backend 'fx_wide' needs the batch's host mirrors");
}

static void test_batch_bad_csr(void **state) {
    check_state *s = *state;
    s->batch.qo[0] = 1;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.qo_indptr_host[0] is 1, expected 0");
    tc_batch_extend(&s->batch);
    s->batch.qo[1] = 5; /* {0, 5, 4} */
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.qo_indptr_host decreases: [2] = 4 after [1] = 5");
    tc_batch_extend(&s->batch);
    s->batch.qo[2] = 5;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.qo_indptr_host[2] is 5, expected num_tokens = 4");
    tc_batch_extend(&s->batch);
    s->batch.kv_indptr[2] = 4;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH,
                "batch.kv_page_indptr_host[2] is 4, expected num_pages_total = 3");
    tc_batch_extend(&s->batch);
    s->batch.kv_indptr[1] = 0; /* sequence 0 has no page */
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "sequence 0 has no KV page");
    tc_batch_extend(&s->batch);
    s->batch.kv_indices[1] = -2;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.kv_page_indices_host[1] is -2");
}

static void test_batch_lengths(void **state) {
    check_state *s = *state;
    s->batch.last[0] = 0;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.kv_last_page_len_host[0] is 0, expected 1..16");
    tc_batch_extend(&s->batch);
    s->batch.last[1] = 17;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.kv_last_page_len_host[1] is 17, expected 1..16");
    tc_batch_extend(&s->batch);
    s->batch.seq_lens[1] = 18; /* two pages with a last page of 1 hold 17 */
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH,
                "batch.seq_lens_host[1] is 18, but its 2 pages of 16 "
                "with a last page of 1 hold 17");
    tc_batch_extend(&s->batch);
    s->batch.seq_lens[0] = 2; /* q_len 3 */
    s->batch.last[0] = 2;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.seq_lens_host[0] is 2, shorter than its q_len 3");
    tc_batch_extend(&s->batch);
    s->batch.b.max_q_len = 2;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.max_q_len is 2, but the largest q_len is 3");
    tc_batch_extend(&s->batch);
    s->batch.b.max_seq_len = 16;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "batch.max_seq_len is 16, but the largest seq_len is 17");
}

static void test_decode_batch(void **state) {
    check_state *s = *state;
    tc_batch_decode(&s->batch);
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    /* q_len 2 and 0 in a decode batch of 2 tokens. */
    s->batch.qo[1] = 2;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "decode batch: sequence 0 has q_len 2");
    tc_batch_decode(&s->batch);
    s->batch.b.num_tokens = 3;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "decode batch has num_tokens 3 for num_seqs 2");
}

static void test_forward_needs_matching_plan(void **state) {
    check_state *s = *state;
    /* Nothing planned yet on this fresh instance. */
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "no batch is planned");
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    TC_ASSERT_FAILS(ap_instance_forward_decode(s->inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT,
                    "backend 'fx_wide': forward_decode: the planned batch is extend, not decode");
    /* A rejected plan forgets the previous one. */
    s->batch.qo[0] = 1;
    BATCH_FAILS(s, AP_ERR_SHAPE_MISMATCH, "qo_indptr_host[0]");
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "no batch is planned");
}

static void test_page_index_out_of_range(void **state) {
    check_state *s = *state;
    s->batch.kv_indices[2] = 9; /* the layer's cache has 4 pages */
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_SHAPE_MISMATCH,
                    "the planned batch uses page 9 but layer.kv has 4 pages");
    s->layer.kv.num_pages = 10;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL));
}

#define FORWARD_FAILS(s, status, needle) \
    TC_ASSERT_FAILS( \
        ap_instance_forward_extend((s)->inst, &(s)->layer.layer, &(s)->fwd.args, NULL), status, \
        needle)

static void test_layer_and_cache(void **state) {
    check_state *s = *state;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    s->layer.kv.dtype = AP_DTYPE_FP8_E4M3;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "layer.kv->dtype is fp8_e4m3, the model's is bf16");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.kv.page_size = 32;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "layer.kv->page_size is 32, the model's is 16");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.kv.num_kv_heads = 4;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "layer.kv->num_kv_heads is 4, the model's is 2");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.kv.v_pages = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "layer.kv->v_pages is NULL");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.layer.kv = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "layer.kv is NULL");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.layer.sm_scale = 0.0f;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "layer.sm_scale is 0");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.layer.k_scale = NAN;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "layer.k_scale/v_scale are nan/1");
    tc_layer_init(&s->layer, &s->model, 4);
    s->layer.layer.layer_id = 2;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "layer.layer_id is 2, expected 0..1");
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, NULL, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "layer is NULL");
}

static void test_forward_tensors(void **state) {
    check_state *s = *state;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    ap_forward_args *a = &s->fwd.args;
    /* Wrong head dim on q. */
    s->fwd.q.shape[2] = 16;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.q has shape [4][4][16], expected [4][4][8]");
    s->fwd.q.shape[2] = 8;
    /* Wrong token count (the batch planned 4). */
    s->fwd.out.shape[0] = 5;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.out has shape [5][4][8], expected [4][4][8]");
    s->fwd.out.shape[0] = 4;
    s->fwd.q.t.ndim = 2;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.q has shape [4][4], expected [4][4][8]");
    s->fwd.q.t.ndim = 3;
    /* bf16 q for an f32 model. */
    s->fwd.q.t.dtype = TC_BF16;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.q has dtype bfloat16");
    TC_ASSERT_HAS(ap_last_error(), "expected float32");
    s->fwd.q.t.dtype = TC_F32;
    s->fwd.lse.t.dtype = TC_BF16;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.lse has dtype bfloat16");
    s->fwd.lse.t.dtype = TC_F32;
    s->fwd.lse.shape[1] = 2;
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.lse has shape [4][2], expected [4][4]");
    s->fwd.lse.shape[1] = 4;
    s->fwd.k.shape[1] = 4; /* k per query head instead of per KV head */
    FORWARD_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.k has shape [4][4][8], expected [4][2][8]");
    s->fwd.k.shape[1] = 2;
    /* Missing and unpaired tensors. */
    a->out = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.out is NULL (required)");
    a->out = &s->fwd.out.t;
    a->v = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.k is given without args.v");
    a->k = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.save_kv is 1 but args.k/v are NULL");
    a->k = &s->fwd.k.t;
    a->v = &s->fwd.v.t;
    void *data = s->fwd.q.t.data;
    s->fwd.q.t.data = NULL;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.q has shape [4][4][8] but no data");
    s->fwd.q.t.data = data;
    /* A start between two float32 elements; a whole number of elements is fine. */
    s->fwd.q.t.byte_offset = 6;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT,
                  "args.q has byte_offset 6, not a multiple of its 4-byte element");
    s->fwd.k.t.byte_offset = 2;
    s->fwd.q.t.byte_offset = 0;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT,
                  "args.k has byte_offset 2, not a multiple of its 4-byte element");
    s->fwd.k.t.byte_offset = 0;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, a, NULL));
}

static void test_forward_layout_and_device(void **state) {
    check_state *s = *state;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    /* Compact strides written out pass; a transposed view does not. */
    s->fwd.q.strides[0] = 32, s->fwd.q.strides[1] = 8, s->fwd.q.strides[2] = 1;
    s->fwd.q.t.strides = s->fwd.q.strides;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->fwd.args, NULL));
    s->fwd.q.strides[1] = 1, s->fwd.q.strides[2] = 4;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.q must be dense (row-major)");
    s->fwd.q.t.strides = NULL;
    /* A CPU backend takes host tensors. */
    s->fwd.out.t.device.device_type = kDLCUDA;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.out is on device type 2, expected kDLCPU");
    s->fwd.out.t.device.device_type = kDLCPU;
    /* q_rope belongs to MLA. */
    s->fwd.args.q_rope = &s->fwd.q.t;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.q_rope is for MLA models only");
    s->fwd.args.q_rope = NULL;
    s->fwd.args.save_kv = 3;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.save_kv is 3");
    s->fwd.args.save_kv = 1;
    s->fwd.args.struct_size = 8;
    FORWARD_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.struct_size is 8");
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &s->layer.layer, NULL, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args is NULL");
}

/* On a GPU instance the tensors must be CUDA memory on the instance's device. */
static void test_gpu_instance_wants_cuda_tensors(void **state) {
    check_state *s = *state;
    ap_device sm90 = tc_gpu(9, 0);
    ap_instance *gpu = NULL;
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_cuda", &s->model, NULL, &sm90, &gpu));
    TC_ASSERT_OK(ap_instance_init_metadata(gpu, &s->batch.b, NULL));
    TC_ASSERT_FAILS(ap_instance_forward_extend(gpu, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args.q is on device type 1, expected kDLCUDA");
    tc_tensor *all[] = {&s->fwd.q, &s->fwd.out, &s->fwd.lse, &s->fwd.k, &s->fwd.v};
    for (size_t i = 0; i < 5; i++) all[i]->t.device = (DLDevice){kDLCUDA, 0};
    TC_ASSERT_OK(ap_instance_forward_extend(gpu, &s->layer.layer, &s->fwd.args, NULL));
    s->fwd.lse.t.device.device_id = 1;
    TC_ASSERT_FAILS(ap_instance_forward_extend(gpu, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args.lse is on CUDA device 1, expected 0");
    ap_instance_close(gpu);
}

/* Embedding on a skip-KV backend: no cache and no page arrays go together. A batch without page
 * arrays gives save_kv nothing to write through, and a batch with them has the backend read the
 * cache, so layer.kv is then required. */
static void test_embedding_skip_kv_pages(void **state) {
    check_state *s = *state;
    ap_model embed = tc_model_mha("embedder");
    embed.embedding = 1;
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_wide", &embed, NULL, &cpu, &inst));
    ap_batch *b = &s->batch.b;
    b->kv_page_indptr = b->kv_page_indices = b->kv_last_page_len = NULL;
    b->kv_page_indptr_host = b->kv_page_indices_host = b->kv_last_page_len_host = NULL;
    b->num_pages_total = 0;
    TC_ASSERT_OK(ap_instance_init_metadata(inst, b, NULL));
    s->fwd.args.save_kv = 0;
    s->layer.layer.kv = NULL;
    TC_ASSERT_OK(ap_instance_forward_extend(inst, &s->layer.layer, &s->fwd.args, NULL));
    s->layer.layer.kv = &s->layer.kv;
    s->fwd.args.save_kv = 1;
    TC_ASSERT_FAILS(ap_instance_forward_extend(inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT,
                    "args.save_kv is 1 but the planned batch has no page arrays");
    tc_batch_extend(&s->batch);
    TC_ASSERT_OK(ap_instance_init_metadata(inst, b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(inst, &s->layer.layer, &s->fwd.args, NULL));
    s->fwd.args.save_kv = 0;
    s->layer.layer.kv = NULL;
    TC_ASSERT_FAILS(ap_instance_forward_extend(inst, &s->layer.layer, &s->fwd.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "layer.kv is NULL");
    ap_instance_close(inst);
}

typedef struct append_tensors {
    tc_tensor q, q_out, k, v, positions, out_loc, cos_sin;
    ap_append_kv_args args;
} append_tensors;

static void append_init(append_tensors *c, const ap_model *m, int64_t t) {
    tc_tensor_init(&c->q, TC_F32, 3, (int64_t[]){t, m->num_qo_heads, m->head_dim_qk});
    tc_tensor_init(&c->q_out, TC_F32, 3, (int64_t[]){t, m->num_qo_heads, m->head_dim_qk});
    tc_tensor_init(&c->k, TC_F32, 3, (int64_t[]){t, m->num_kv_heads, m->head_dim_qk});
    tc_tensor_init(&c->v, TC_F32, 3, (int64_t[]){t, m->num_kv_heads, m->head_dim_v});
    tc_tensor_init(&c->positions, TC_I32, 1, (int64_t[]){t});
    tc_tensor_init(&c->out_loc, TC_I32, 1, (int64_t[]){t});
    tc_tensor_init(&c->cos_sin, TC_F32, 2, (int64_t[]){32, 4});
    c->args = (ap_append_kv_args){sizeof c->args,  &c->q.t,       &c->q_out.t,   &c->k.t, &c->v.t,
                                  &c->positions.t, &c->out_loc.t, &c->cos_sin.t, 4,       0};
}

static void append_free(append_tensors *c) {
    tc_tensor *all[] = {&c->q, &c->q_out, &c->k, &c->v, &c->positions, &c->out_loc, &c->cos_sin};
    for (size_t i = 0; i < 7; i++) tc_tensor_free(all[i]);
}

#define APPEND_FAILS(s, c, status, needle) \
    TC_ASSERT_FAILS(ap_instance_append_kv((s)->inst, &(s)->layer.layer, &(c)->args, NULL), status, \
                    needle)

static void test_append_kv_args(void **state) {
    check_state *s = *state;
    append_tensors c;
    append_init(&c, &s->model, 3);
    int32_t *loc = c.out_loc.t.data, *pos = c.positions.t.data;
    loc[0] = 0, loc[1] = 17, loc[2] = 63; /* 4 pages of 16: slots 0..63 */
    pos[0] = 0, pos[1] = 5, pos[2] = 31;  /* cos_sin has 32 rows */
    TC_ASSERT_OK(ap_instance_append_kv(s->inst, &s->layer.layer, &c.args, NULL));
    loc[2] = 64;
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH,
                 "args.out_loc[2] is 64, outside the cache's 64 slots");
    loc[2] = 63;
    pos[1] = 32;
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH,
                 "args.positions[1] is 32, outside cos_sin's 32 rows");
    pos[1] = -1;
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH, "args.positions[1] is -1");
    pos[1] = 5;
    c.args.rotary_dim = 3;
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT, "args.rotary_dim is 3 (must be even");
    c.args.rotary_dim = 10;
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT, "<= head_dim_qk 8");
    c.args.rotary_dim = 4;
    c.cos_sin.shape[1] = 8;
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH, "args.cos_sin has shape [32][8], expected [*][4]");
    c.cos_sin.shape[1] = 4;
    c.cos_sin.shape[0] = -1; /* a free dim must still be a size */
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT, "args.cos_sin has shape [-1][4] (negative dim 0)");
    /* A free dim so large that the element count overflows is not an empty tensor. */
    void *table = c.cos_sin.t.data;
    c.cos_sin.t.data = NULL;
    c.cos_sin.shape[0] = INT64_C(1) << 62;
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT,
                 "args.cos_sin has shape [4611686018427387904][4]: more elements than int64 holds");
    c.cos_sin.shape[0] = 0; /* truly empty: no data needed, and no position fits */
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH, "args.positions[0] is 0, outside cos_sin's 0 rows");
    c.cos_sin.t.data = table;
    c.cos_sin.shape[0] = 32;
    c.positions.t.dtype = (DLDataType){kDLInt, 64, 1};
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH, "args.positions has dtype int");
    c.positions.t.dtype = TC_I32;
    c.v.shape[2] = 4;
    APPEND_FAILS(s, &c, AP_ERR_SHAPE_MISMATCH, "args.v has shape [3][2][4], expected [3][2][8]");
    c.v.shape[2] = 8;
    c.args.q_out = NULL;
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT, "args.q and args.q_out come together");
    c.args.q = NULL; /* a host that rotates q elsewhere */
    TC_ASSERT_OK(ap_instance_append_kv(s->inst, &s->layer.layer, &c.args, NULL));
    c.args.k = NULL;
    APPEND_FAILS(s, &c, AP_ERR_INVALID_ARGUMENT, "args.k is NULL");
    append_free(&c);
}

typedef struct pack_tensors {
    tc_tensor k_nope, k_pe, v, k_out, v_out;
    ap_pack_kv_args args;
} pack_tensors;

/* The tc_model_mla shapes: 4 heads, nope 12, rope 8, v 10. */
static void pack_init(pack_tensors *c, int64_t t) {
    tc_tensor_init(&c->k_nope, TC_F32, 3, (int64_t[]){t, 4, 12});
    tc_tensor_init(&c->k_pe, TC_F32, 3, (int64_t[]){t, 1, 8});
    tc_tensor_init(&c->v, TC_F32, 3, (int64_t[]){t, 4, 10});
    tc_tensor_init(&c->k_out, TC_U8, 3, (int64_t[]){t, 4, 20});
    tc_tensor_init(&c->v_out, TC_FP8, 3, (int64_t[]){t, 4, 10});
    c->args = (ap_pack_kv_args){sizeof c->args, &c->k_nope.t, &c->k_pe.t, &c->v.t,
                                &c->k_out.t,    &c->v_out.t,  1.0f,       1.0f};
}

static void pack_free(pack_tensors *c) {
    tc_tensor *all[] = {&c->k_nope, &c->k_pe, &c->v, &c->k_out, &c->v_out};
    for (size_t i = 0; i < 5; i++) tc_tensor_free(all[i]);
}

static void test_pack_args(void **state) {
    check_state *s = *state;
    ap_model mla = tc_model_mla("ds");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_mla", &mla, NULL, &cpu, &inst));
    pack_tensors c;
    pack_init(&c, 5);
#define PACK_FAILS(status, needle) \
    TC_ASSERT_FAILS(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL), status, needle)
    TC_ASSERT_OK(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL)); /* uint8 k_out */
    /* Strided inputs pass: k_nope as a slice of a wider [5][4][16] buffer. */
    c.k_nope.strides[0] = 64, c.k_nope.strides[1] = 16, c.k_nope.strides[2] = 1;
    c.k_nope.t.strides = c.k_nope.strides;
    TC_ASSERT_OK(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL));
    c.k_nope.t.strides = NULL;
    /* Outputs must be dense. */
    c.v_out.strides[0] = 80, c.v_out.strides[1] = 1, c.v_out.strides[2] = 4;
    c.v_out.t.strides = c.v_out.strides;
    PACK_FAILS(AP_ERR_INVALID_ARGUMENT, "args.v_out must be dense");
    c.v_out.t.strides = NULL;
    c.k_out.shape[2] = 19;
    PACK_FAILS(AP_ERR_SHAPE_MISMATCH, "args.k_out has shape [5][4][19], expected [5][4][20]");
    c.k_out.shape[2] = 20;
    c.k_out.t.dtype = TC_BF16;
    PACK_FAILS(AP_ERR_SHAPE_MISMATCH, "args.k_out has dtype bfloat16");
    TC_ASSERT_HAS(ap_last_error(), "expected float8_e4m3fn");
    c.k_out.t.dtype = TC_FP8;
    c.k_pe.shape[1] = 4;
    PACK_FAILS(AP_ERR_SHAPE_MISMATCH, "args.k_pe has shape [5][4][8], expected [5][1][8]");
    c.k_pe.t.ndim = 2;
    c.k_pe.shape[1] = 8;
    TC_ASSERT_OK(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL)); /* [T][r] form */
    c.v.shape[1] = 3;
    PACK_FAILS(AP_ERR_SHAPE_MISMATCH, "args.v has shape [5][3][10], expected [5][4][10]");
    c.v.shape[1] = 4;
    c.args.k_scale = 0.0f;
    PACK_FAILS(AP_ERR_INVALID_ARGUMENT, "args.k_scale/v_scale are 0/1");
    c.args.k_scale = 1.0f;
    c.args.v_scale = INFINITY;
    PACK_FAILS(AP_ERR_INVALID_ARGUMENT, "must be > 0, finite");
    c.args.v_scale = 1.0f;
    c.args.k_nope = NULL;
    PACK_FAILS(AP_ERR_INVALID_ARGUMENT, "args.k_nope is NULL");
#undef PACK_FAILS
    pack_free(&c);
    ap_instance_close(inst);
}

/* On an MHA model the pack's dims are free, so the inputs must agree with each other: a v with
 * fewer heads than k_nope would be read past its end by a backend taking k_nope's heads. */
static void test_pack_args_mha(void **state) {
    check_state *s = *state;
    ap_model embed = tc_model_mha("embedder");
    embed.dtype = AP_DTYPE_BF16;
    embed.head_dim_qk = embed.head_dim_v = 128;
    embed.embedding = 1;
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_narrow", &embed, NULL, &cpu, &inst));
    pack_tensors c;
    pack_init(&c, 5);
    TC_ASSERT_OK(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL));
    assert_int_equal(((unsigned char *)c.k_out.t.data)[0], 0x5a);
    c.v.shape[1] = 3;
    TC_ASSERT_FAILS(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL), AP_ERR_SHAPE_MISMATCH,
                    "args.v has shape [5][3][10], expected [5][4][*]");
    c.v.shape[1] = 4;
    c.k_pe.shape[0] = 4;
    TC_ASSERT_FAILS(ap_instance_pack_prefix_chunk_kv(inst, &c.args, NULL), AP_ERR_SHAPE_MISMATCH,
                    "args.k_pe has shape [4][1][8], expected [5][1][*]");
    pack_free(&c);
    ap_instance_close(inst);
}

int main(void) {
    /* Each test gets a fresh registry and instance: a plan must not leak between tests. */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_good_batch_passes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_required_arrays, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_bad_csr, setup, teardown),
        cmocka_unit_test_setup_teardown(test_batch_lengths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_needs_matching_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_page_index_out_of_range, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layer_and_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward_layout_and_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_instance_wants_cuda_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_skip_kv_pages, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_kv_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pack_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pack_args_mha, setup, teardown),
    };
    return cmocka_run_group_tests_name("core.check", tests, NULL, NULL);
}
