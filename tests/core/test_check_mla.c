/* test_check_mla.c: the core's checks of MLA's forward forms (absorbed decode and MTP over the
 * latent cache, the MHA form over ABI 1.1's ragged K/V source), its hooks and merge_state/1. */
#include <stdlib.h>

#include "support.h"

/* tc_model_mla: 4 heads, kv_lora_rank 16 + rope 8 = 24, nope 12, v_head 10, pages of 16. */
typedef struct mla_state {
    ap_registry *registry;
    ap_instance *inst; /* fx_mla_hooks (CPU, needs host mirrors, offers the MLA hooks) */
    ap_model model;
    tc_batch batch;
    tc_layer layer;
    tc_tensor q_all; /* [T][4][24 + 4 padding]: q_nope and q_rope are views into it */
    DLTensor q_nope, q_rope;
    int64_t nope_shape[3], rope_shape[3], strides[3];
    tc_tensor out, lse, k, v;
    ap_forward_args args;
} mla_state;

/* q_nope [T][4][16] and q_rope [T][4][8] as slices of one padded buffer: rows dense, rows
 * strided by 28 elements; k the new latent rows [T][1][24]. */
static void mla_tensors(mla_state *s, int64_t t) {
    tc_tensor_init(&s->q_all, TC_F32, 3, (int64_t[]){t, 4, 28});
    s->strides[0] = 4 * 28, s->strides[1] = 28, s->strides[2] = 1;
    s->nope_shape[0] = s->rope_shape[0] = t;
    s->nope_shape[1] = s->rope_shape[1] = 4;
    s->nope_shape[2] = 16, s->rope_shape[2] = 8;
    s->q_nope = s->q_all.t;
    s->q_nope.shape = s->nope_shape;
    s->q_nope.strides = s->strides;
    s->q_rope = s->q_nope;
    s->q_rope.shape = s->rope_shape;
    s->q_rope.byte_offset = 16 * sizeof(float);
    tc_tensor_init(&s->out, TC_F32, 3, (int64_t[]){t, 4, 16});
    tc_tensor_init(&s->lse, TC_F32, 2, (int64_t[]){t, 4});
    tc_tensor_init(&s->k, TC_F32, 3, (int64_t[]){t, 1, 24});
    tc_tensor_init(&s->v, TC_F32, 3, (int64_t[]){t, 1, 16});
    s->args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                .q = &s->q_nope,
                                .k = &s->k.t,
                                .out = &s->out.t,
                                .lse = &s->lse.t,
                                .save_kv = 1,
                                .q_rope = &s->q_rope};
}

static void mla_tensors_free(mla_state *s) {
    tc_tensor *all[] = {&s->q_all, &s->out, &s->lse, &s->k, &s->v};
    for (size_t i = 0; i < 5; i++) tc_tensor_free(all[i]);
}

static int setup(void **state) {
    mla_state *s = calloc(1, sizeof *s);
    s->registry = tc_registry_open();
    s->model = tc_model_mla("deepseek");
    ap_device cpu = tc_cpu("no GPU");
    if (ap_instance_open(s->registry, "fx_mla_hooks", &s->model, NULL, &cpu, &s->inst) != AP_OK)
        return -1;
    tc_layer_init(&s->layer, &s->model, 4);
    *state = s;
    return 0;
}

static int teardown(void **state) {
    mla_state *s = *state;
    mla_tensors_free(s);
    ap_instance_close(s->inst);
    int rc = ap_registry_destroy(s->registry) == AP_OK ? 0 : -1;
    free(s);
    return rc;
}

#define DECODE_FAILS(s, status, needle) \
    TC_ASSERT_FAILS(ap_instance_forward_decode((s)->inst, &(s)->layer.layer, &(s)->args, NULL), \
                    status, needle)

static void test_absorbed_decode(void **state) {
    mla_state *s = *state;
    tc_batch_decode(&s->batch);
    mla_tensors(s, 2);
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    /* q_nope and q_rope read in place: strided rows pass */
    TC_ASSERT_OK(ap_instance_forward_decode(s->inst, &s->layer.layer, &s->args, NULL));
    assert_true(tc_tensor_f32(&s->out, 2) == 2.0f); /* the fixture's decode ran */
    /* ... but a row must be dense */
    int64_t bad_strides[3] = {4 * 28, 28, 2};
    s->q_rope.strides = bad_strides;
    DECODE_FAILS(s, AP_ERR_INVALID_ARGUMENT,
                 "args.q_rope must have dense rows: its last dim has stride 2, expected 1");
    s->q_rope.strides = s->strides;
    /* widths: q_nope is kv_lora_rank wide beside q_rope, q_rope qk_rope_head_dim */
    s->nope_shape[2] = 24;
    DECODE_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.q has shape [2][4][24], expected [2][4][16]");
    s->nope_shape[2] = 16;
    s->rope_shape[2] = 6;
    DECODE_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.q_rope has shape [2][4][6], expected [2][4][8]");
    s->rope_shape[2] = 8;
    /* the latent holds V: no v tensor */
    s->args.v = &s->v.t;
    DECODE_FAILS(s, AP_ERR_INVALID_ARGUMENT, "args.v must be NULL in MLA's absorbed form");
    s->args.v = NULL;
    /* the new latent rows are one 24-wide row per token */
    s->k.shape[2] = 16;
    DECODE_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.k has shape [2][1][16], expected [2][1][24]");
    s->k.shape[2] = 24;
    s->out.shape[2] = 10;
    DECODE_FAILS(s, AP_ERR_SHAPE_MISMATCH, "args.out has shape [2][4][10], expected [2][4][16]");
    s->out.shape[2] = 16;
    /* the whole 24-wide q without q_rope is the other absorbed spelling */
    s->args.q_rope = NULL;
    s->nope_shape[2] = 24;
    TC_ASSERT_OK(ap_instance_forward_decode(s->inst, &s->layer.layer, &s->args, NULL));
}

/* MTP verification: several new tokens per sequence, absorbed, as an extend batch. */
static void test_absorbed_extend(void **state) {
    mla_state *s = *state;
    tc_batch_extend(&s->batch);
    mla_tensors(s, 4);
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &s->batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->args, NULL));
    assert_true(tc_tensor_f32(&s->out, 2) == 1.0f); /* the fixture's extend ran */
    s->args.save_kv = 0;
    s->args.k = NULL;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &s->args, NULL));
    /* and a decode batch stays one token per sequence */
    TC_ASSERT_FAILS(ap_instance_forward_decode(s->inst, &s->layer.layer, &s->args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "the planned batch is extend, not decode");
}

/* append_kv/1 for MLA: k the new latent rows [T][1][24] (k_pe not rotated yet), v NULL, q and
 * q_out the q_rope slices [T][4][8] of a wider q, rotary_dim = qk_rope_head_dim. */
static void test_append_kv(void **state) {
    mla_state *s = *state;
    mla_tensors(s, 3);
    tc_tensor positions, out_loc, cos_sin;
    tc_tensor_init(&positions, TC_I32, 1, (int64_t[]){3});
    tc_tensor_init(&out_loc, TC_I32, 1, (int64_t[]){3});
    tc_tensor_init(&cos_sin, TC_F32, 2, (int64_t[]){32, 8});
    ap_append_kv_args a = {.struct_size = sizeof a,
                           .q = &s->q_rope,
                           .q_out = &s->q_rope,
                           .k = &s->k.t,
                           .positions = &positions.t,
                           .out_loc = &out_loc.t,
                           .cos_sin = &cos_sin.t,
                           .rotary_dim = 8,
                           .is_neox = 0};
#define MLA_APPEND_FAILS(status, needle) \
    TC_ASSERT_FAILS(ap_instance_append_kv(s->inst, &s->layer.layer, &a, NULL), status, needle)
    TC_ASSERT_OK(ap_instance_append_kv(s->inst, &s->layer.layer, &a, NULL));
    a.rotary_dim = 4;
    MLA_APPEND_FAILS(AP_ERR_INVALID_ARGUMENT,
                     "args.rotary_dim is 4, expected qk_rope_head_dim 8 for MLA");
    a.rotary_dim = 8;
    a.v = &s->v.t;
    MLA_APPEND_FAILS(AP_ERR_INVALID_ARGUMENT, "args.v must be NULL for MLA");
    a.v = NULL;
    a.q = a.q_out = &s->q_nope; /* 16 wide: not the rope part */
    MLA_APPEND_FAILS(AP_ERR_SHAPE_MISMATCH, "args.q has shape [3][4][16], expected [3][4][8]");
    a.q = a.q_out = &s->q_rope;
    s->k.shape[1] = 4;
    MLA_APPEND_FAILS(AP_ERR_SHAPE_MISMATCH, "args.k has shape [3][4][24], expected [3][1][24]");
    s->k.shape[1] = 1;
    int64_t bad_strides[3] = {4 * 28, 28, 2};
    s->q_rope.strides = bad_strides;
    MLA_APPEND_FAILS(AP_ERR_INVALID_ARGUMENT, "args.q must have dense rows");
#undef MLA_APPEND_FAILS
    tc_tensor_free(&positions);
    tc_tensor_free(&out_loc);
    tc_tensor_free(&cos_sin);
}

/* merge_state/1: three [T][H][D] states of one float type, float32 LSEs, all dense. */
static void test_merge_state(void **state) {
    mla_state *s = *state;
    tc_tensor o_a, o_b, o, lse_a, lse_b, lse;
    tc_tensor_init(&o_a, TC_F32, 3, (int64_t[]){5, 4, 10});
    tc_tensor_init(&o_b, TC_F32, 3, (int64_t[]){5, 4, 10});
    tc_tensor_init(&o, TC_F32, 3, (int64_t[]){5, 4, 10});
    tc_tensor_init(&lse_a, TC_F32, 2, (int64_t[]){5, 4});
    tc_tensor_init(&lse_b, TC_F32, 2, (int64_t[]){5, 4});
    tc_tensor_init(&lse, TC_F32, 2, (int64_t[]){5, 4});
    ap_merge_state_args a = {sizeof a, &o_a.t, &lse_a.t, &o_b.t, &lse_b.t, &o.t, &lse.t};
#define MERGE_FAILS(status, needle) \
    TC_ASSERT_FAILS(ap_instance_merge_state(s->inst, &a, NULL), status, needle)
    assert_true(ap_instance_has_hook(s->inst, AP_HOOK_MERGE_STATE_V1));
    TC_ASSERT_OK(ap_instance_merge_state(s->inst, &a, NULL));
    assert_true(tc_tensor_f32(&o, 0) == 7.0f); /* the fixture's merge ran */
    a.o = &o_a.t, a.lse = NULL;                /* in place, no merged LSE */
    TC_ASSERT_OK(ap_instance_merge_state(s->inst, &a, NULL));
    a.o = &o.t, a.lse = &lse.t;
    o_b.shape[2] = 9;
    MERGE_FAILS(AP_ERR_SHAPE_MISMATCH, "args.o_b has shape [5][4][9], expected [5][4][10]");
    o_b.shape[2] = 10;
    o.t.dtype = TC_BF16;
    MERGE_FAILS(AP_ERR_SHAPE_MISMATCH, "args.o has dtype bfloat16 (code 4, 16 bits, 1 lanes), "
                                       "expected float32");
    o.t.dtype = TC_F32;
    lse_b.shape[0] = 4;
    MERGE_FAILS(AP_ERR_SHAPE_MISMATCH, "args.lse_b has shape [4][4], expected [5][4]");
    lse_b.shape[0] = 5;
    lse.t.dtype = TC_BF16;
    MERGE_FAILS(AP_ERR_SHAPE_MISMATCH, "args.lse has dtype bfloat16");
    lse.t.dtype = TC_F32;
    o_a.t.dtype = TC_I32;
    MERGE_FAILS(AP_ERR_SHAPE_MISMATCH, "args.o_a has dtype code 0, 32 bits: expected float32");
    o_a.t.dtype = TC_F32;
    int64_t transposed[3] = {40, 1, 4};
    o.t.strides = transposed;
    MERGE_FAILS(AP_ERR_INVALID_ARGUMENT, "args.o must be dense");
    o.t.strides = NULL;
    a.lse_a = NULL;
    MERGE_FAILS(AP_ERR_INVALID_ARGUMENT, "args.lse_a is NULL (required)");
    a.lse_a = &lse_a.t;
    a.struct_size = 16;
    MERGE_FAILS(AP_ERR_INVALID_ARGUMENT, "args.struct_size is 16");
    a.struct_size = sizeof a;
    TC_ASSERT_FAILS(ap_instance_merge_state(s->inst, NULL, NULL), AP_ERR_INVALID_ARGUMENT,
                    "args is NULL");
#undef MERGE_FAILS
    /* a backend without the hook: the host's own merge path */
    ap_instance *bare = NULL;
    ap_device cpu = tc_cpu("");
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_mla", &s->model, NULL, &cpu, &bare));
    assert_false(ap_instance_has_hook(bare, AP_HOOK_MERGE_STATE_V1));
    TC_ASSERT_FAILS(ap_instance_merge_state(bare, &a, NULL), AP_ERR_UNSUPPORTED,
                    "backend 'fx_mla' has no hook 'merge_state/1'");
    ap_instance_close(bare);
    tc_tensor *all[] = {&o_a, &o_b, &o, &lse_a, &lse_b, &lse};
    for (size_t i = 0; i < 6; i++) tc_tensor_free(all[i]);
}

/* A ragged batch: sequence 0 has 3 query rows over 5 keys, sequence 1 one row over 2 keys;
 * no page arrays (the source reads no cache). MHA-form tensors: q/k 12 + 8 = 20, v 10. */
typedef struct ragged {
    tc_batch batch;
    int32_t kv_indptr[3];
    tc_tensor q, k, v, out, lse;
    ap_forward_args args;
} ragged;

static void ragged_init(ragged *r, int64_t kv_heads, int64_t dk, int64_t dv) {
    tc_batch_extend(&r->batch);
    ap_batch *b = &r->batch.b;
    b->kv_page_indptr = b->kv_page_indices = b->kv_last_page_len = NULL;
    b->kv_page_indptr_host = b->kv_page_indices_host = b->kv_last_page_len_host = NULL;
    b->num_pages_total = 0;
    r->kv_indptr[0] = 0, r->kv_indptr[1] = 5, r->kv_indptr[2] = 7;
    b->kv_indptr = b->kv_indptr_host = r->kv_indptr;
    b->num_kv_tokens = 7;
    b->kv_causal = 1;
    tc_tensor_init(&r->q, TC_F32, 3, (int64_t[]){4, 4, dk});
    tc_tensor_init(&r->k, TC_F32, 3, (int64_t[]){7, kv_heads, dk});
    tc_tensor_init(&r->v, TC_F32, 3, (int64_t[]){7, kv_heads, dv});
    tc_tensor_init(&r->out, TC_F32, 3, (int64_t[]){4, 4, dv});
    tc_tensor_init(&r->lse, TC_F32, 2, (int64_t[]){4, 4});
    r->args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                .q = &r->q.t,
                                .k = &r->k.t,
                                .v = &r->v.t,
                                .out = &r->out.t,
                                .lse = &r->lse.t};
}

static void ragged_free(ragged *r) {
    tc_tensor *all[] = {&r->q, &r->k, &r->v, &r->out, &r->lse};
    for (size_t i = 0; i < 5; i++) tc_tensor_free(all[i]);
}

#define PLAN_FAILS(s, r, status, needle) \
    TC_ASSERT_FAILS(ap_instance_init_metadata((s)->inst, &(r)->batch.b, NULL), status, needle)

static void test_ragged_batch(void **state) {
    mla_state *s = *state;
    ragged r;
    ragged_init(&r, 4, 20, 10);
    ap_batch *b = &r.batch.b;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, b, NULL)); /* no page arrays needed */
    r.kv_indptr[1] = 8;
    PLAN_FAILS(s, &r, AP_ERR_SHAPE_MISMATCH,
               "batch.kv_indptr_host decreases: [2] = 7 after [1] = 8");
    r.kv_indptr[1] = 5;
    b->num_kv_tokens = 6;
    PLAN_FAILS(s, &r, AP_ERR_SHAPE_MISMATCH,
               "batch.kv_indptr_host[2] is 7, expected num_kv_tokens = 6");
    b->num_kv_tokens = 7;
    r.kv_indptr[1] = 2; /* sequence 0: 2 keys for 3 causal rows */
    PLAN_FAILS(s, &r, AP_ERR_SHAPE_MISMATCH,
               "batch.kv_causal is 1 but sequence 0 has 2 keys for 3 query rows");
    b->kv_causal = 0; /* a prefix chunk: any number of keys, none included */
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, b, NULL));
    r.kv_indptr[1] = 0;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, b, NULL));
    r.kv_indptr[1] = 5;
    b->kv_causal = 2;
    PLAN_FAILS(s, &r, AP_ERR_INVALID_ARGUMENT, "batch.kv_causal is 2 (0 or 1)");
    b->kv_causal = 1;
    b->kv_indptr_host = NULL;
    PLAN_FAILS(s, &r, AP_ERR_INVALID_ARGUMENT, "kv_indptr_host is NULL");
    b->kv_indptr_host = r.kv_indptr;
    b->kv_indptr = NULL; /* the rest of the source without its indptr */
    PLAN_FAILS(s, &r, AP_ERR_INVALID_ARGUMENT, "batch.kv_indptr is NULL but kv_indptr_host is set");
    b->kv_indptr = r.kv_indptr;
    b->mode = AP_MODE_DECODE;
    b->num_tokens = 2, b->max_q_len = 1;
    r.batch.qo[1] = 1, r.batch.qo[2] = 2;
    PLAN_FAILS(s, &r, AP_ERR_INVALID_ARGUMENT, "is for extend batches");
    /* an ABI 1.0 batch ends before the source: its fields are never read */
    tc_batch_decode(&r.batch);
    r.batch.b.struct_size = offsetof(ap_batch, kv_indptr);
    r.batch.b.kv_indptr = r.kv_indptr;
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &r.batch.b, NULL));
    ragged_free(&r);
}

static void test_ragged_forward(void **state) {
    mla_state *s = *state;
    ragged r;
    ragged_init(&r, 4, 20, 10);
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &r.batch.b, NULL));
    ap_layer layer = s->layer.layer;
    layer.kv = NULL; /* no cache read or written */
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL));
    /* fp8 k/v, as pack_prefix_chunk_kv/1 writes them */
    r.k.t.dtype = r.v.t.dtype = TC_FP8;
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL));
    r.v.t.dtype = TC_BF16; /* but not another activation type than the model's */
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_SHAPE_MISMATCH, "args.v has dtype bfloat16");
    r.v.t.dtype = TC_F32;
    r.k.shape[0] = 4; /* k per query token instead of per key row */
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_SHAPE_MISMATCH, "args.k has shape [4][4][20], expected [7][4][20]");
    r.k.shape[0] = 7;
    r.args.save_kv = 1;
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_INVALID_ARGUMENT,
                    "args.save_kv must be 0 with the batch's ragged K/V source");
    r.args.save_kv = 0;
    r.args.v = NULL;
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args.k is given without args.v");
    r.args.v = r.args.k = NULL;
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args.k and args.v are required with the batch's");
    r.args.k = &r.k.t, r.args.v = &r.v.t;
    /* MLA over a ragged source is the MHA form: no absorbed q */
    r.q.shape[2] = 24;
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &layer, &r.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "the batch's ragged K/V source takes MLA's MHA form");
    ragged_free(&r);
}

/* The MHA form without a ragged source (keys are the new tokens') writes nothing to the
 * latent cache. */
static void test_mha_form_save_kv(void **state) {
    mla_state *s = *state;
    ragged r;
    ragged_init(&r, 4, 20, 10);
    r.k.shape[0] = r.v.shape[0] = 4;
    tc_batch_extend(&r.batch);
    TC_ASSERT_OK(ap_instance_init_metadata(s->inst, &r.batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(s->inst, &s->layer.layer, &r.args, NULL));
    r.args.save_kv = 1;
    TC_ASSERT_FAILS(ap_instance_forward_extend(s->inst, &s->layer.layer, &r.args, NULL),
                    AP_ERR_INVALID_ARGUMENT, "args.save_kv must be 0 in MLA's MHA form");
    ragged_free(&r);
}

/* An MHA model takes the ragged source too: k/v per KV head. */
static void test_ragged_mha_model(void **state) {
    mla_state *s = *state;
    ap_model mha = tc_model_mha("llama");
    ap_device cpu = tc_cpu("");
    ap_instance *inst = NULL;
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_wide", &mha, NULL, &cpu, &inst));
    ragged r;
    ragged_init(&r, 2, 8, 8);
    ap_layer layer = s->layer.layer;
    layer.kv = NULL;
    TC_ASSERT_OK(ap_instance_init_metadata(inst, &r.batch.b, NULL));
    TC_ASSERT_OK(ap_instance_forward_extend(inst, &layer, &r.args, NULL));
    r.k.shape[1] = 4;
    TC_ASSERT_FAILS(ap_instance_forward_extend(inst, &layer, &r.args, NULL), AP_ERR_SHAPE_MISMATCH,
                    "args.k has shape [7][4][8], expected [7][2][8]");
    ragged_free(&r);
    ap_instance_close(inst);
    /* A plugin that negotiated ABI 1.0 does not know the source's fields: refused, not ignored. */
    TC_ASSERT_OK(ap_instance_open(s->registry, "fx_abi10", &mha, NULL, &cpu, &inst));
    ragged_init(&r, 2, 8, 8);
    TC_ASSERT_FAILS(ap_instance_init_metadata(inst, &r.batch.b, NULL), AP_ERR_UNSUPPORTED,
                    "backend 'fx_abi10' serves ABI 1.0, which has no ragged K/V source");
    ragged_free(&r);
    ap_instance_close(inst);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_absorbed_decode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_absorbed_extend, setup, teardown),
        cmocka_unit_test_setup_teardown(test_append_kv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_merge_state, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mha_form_save_kv, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ragged_mha_model, setup, teardown),
    };
    return cmocka_run_group_tests_name("core.check_mla", tests, NULL, NULL);
}
