/* test_hooks.c: cpu_ref's append_kv/1 and pack_prefix_chunk_kv/1 against naive versions. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"

static fx_plugin plugin;

static int is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

/* ---- append_kv/1 ---- */

typedef struct rope_case {
    ap_dtype q_dtype, kv_dtype;
    int page_size, num_pages, num_kv_heads, group, head_dim_qk, head_dim_v;
    int rotary_dim, is_neox, tokens, max_position;
    int alias_q; /* q_out is q */
} rope_case;

typedef struct rope_setup {
    rope_case c;
    ap_backend *backend;
    ap_kv_cache kv;
    ap_layer layer;
    unsigned char *k_pages, *v_pages, *k_expect, *v_expect;
    size_t k_bytes, v_bytes;
    fx_tensor q, q_out, k, v, positions, out_loc, cos_sin;
    ap_append_kv_args args;
} rope_setup;

static void rope_naive(const rope_setup *r, float *row, int pos) {
    fx_rope_naive(&r->cos_sin, row, r->c.rotary_dim, r->c.is_neox, pos);
}

static void rope_build(rope_setup *r, const rope_case *c) {
    memset(r, 0, sizeof *r);
    r->c = *c;
    int hq = c->num_kv_heads * c->group;
    ap_model m = {.struct_size = sizeof m,
                  .kind = AP_ATTN_MHA,
                  .num_qo_heads = hq,
                  .num_kv_heads = c->num_kv_heads,
                  .head_dim_qk = c->head_dim_qk,
                  .head_dim_v = c->head_dim_v,
                  .dtype = c->q_dtype,
                  .kv_dtype = c->kv_dtype,
                  .page_size = c->page_size,
                  .num_layers = 1,
                  .causal = 1};
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&m, NULL, NULL, &r->backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    size_t elem = fx_dtype_bytes(c->kv_dtype);
    size_t slots = (size_t)c->num_pages * (size_t)c->page_size * (size_t)c->num_kv_heads;
    r->k_bytes = slots * (size_t)c->head_dim_qk * elem;
    r->v_bytes = slots * (size_t)c->head_dim_v * elem;
    r->k_pages = malloc(r->k_bytes);
    r->v_pages = malloc(r->v_bytes);
    r->k_expect = malloc(r->k_bytes);
    r->v_expect = malloc(r->v_bytes);
    memset(r->k_pages, 0xA5, r->k_bytes);
    memset(r->v_pages, 0xA5, r->v_bytes);
    memcpy(r->k_expect, r->k_pages, r->k_bytes);
    memcpy(r->v_expect, r->v_pages, r->v_bytes);
    r->kv = (ap_kv_cache){sizeof r->kv, AP_KV_LAYOUT_NHD, c->kv_dtype,    c->page_size,
                          c->num_pages, c->num_kv_heads,  c->head_dim_qk, c->head_dim_v,
                          r->k_pages,   r->v_pages,       NULL,           NULL};
    r->layer = (ap_layer){.struct_size = sizeof r->layer,
                          .sm_scale = 0.1f,
                          .k_scale = is_fp8(c->kv_dtype) ? (float)fx_rand_uniform(0.005, 0.05) : 1,
                          .v_scale = is_fp8(c->kv_dtype) ? (float)fx_rand_uniform(0.005, 0.05) : 1,
                          .window_left = -1,
                          .kv = &r->kv};
    int64_t t = c->tokens;
    fx_tensor_make(&r->q, c->q_dtype, 3, (int64_t[]){t, hq, c->head_dim_qk});
    if (!c->alias_q) fx_tensor_make(&r->q_out, c->q_dtype, 3, (int64_t[]){t, hq, c->head_dim_qk});
    fx_tensor_make(&r->k, c->q_dtype, 3, (int64_t[]){t, c->num_kv_heads, c->head_dim_qk});
    fx_tensor_make(&r->v, c->q_dtype, 3, (int64_t[]){t, c->num_kv_heads, c->head_dim_v});
    fx_tensor_make(&r->positions, AP_DTYPE_NONE, 1, (int64_t[]){t});
    fx_tensor_make(&r->out_loc, AP_DTYPE_NONE, 1, (int64_t[]){t});
    fx_tensor_make(&r->cos_sin, AP_DTYPE_F32, 2, (int64_t[]){c->max_position, c->rotary_dim});
    fx_rope_table(&r->cos_sin);
    /* distinct slots: a random sample of all slots */
    int total = c->num_pages * c->page_size;
    int *slots_all = malloc(sizeof(int) * (size_t)total);
    for (int i = 0; i < total; i++) slots_all[i] = i;
    for (int i = 0; i < c->tokens; i++) {
        int other = fx_rand_int(i, total - 1);
        int keep = slots_all[i];
        slots_all[i] = slots_all[other];
        slots_all[other] = keep;
        fx_tensor_i32(&r->out_loc)[i] = slots_all[i];
        fx_tensor_i32(&r->positions)[i] = fx_rand_int(0, c->max_position - 1);
    }
    free(slots_all);
    fx_tensor *tensors[] = {&r->q, &r->k, &r->v};
    for (int n = 0; n < 3; n++)
        for (size_t e = 0; e < tensors[n]->bytes / fx_dtype_bytes(c->q_dtype); e++)
            fx_encode(c->q_dtype, (char *)tensors[n]->buffer + e * fx_dtype_bytes(c->q_dtype),
                      (float)fx_rand_uniform(-2.0, 2.0));
    r->args = (ap_append_kv_args){
        .struct_size = sizeof r->args,
        .q = &r->q.dl,
        .q_out = c->alias_q ? &r->q.dl : &r->q_out.dl,
        .k = &r->k.dl,
        .v = &r->v.dl,
        .positions = &r->positions.dl,
        .out_loc = &r->out_loc.dl,
        .cos_sin = &r->cos_sin.dl,
        .rotary_dim = c->rotary_dim,
        .is_neox = c->is_neox,
    };
}

/* Expected q_out (as floats) and expected cache bytes, computed before the hook runs (q may be
 * overwritten in place). */
static float *rope_expect(rope_setup *r) {
    const rope_case *c = &r->c;
    int hq = c->num_kv_heads * c->group;
    float *q_want = malloc(sizeof(float) * (size_t)c->tokens * (size_t)hq * (size_t)c->head_dim_qk);
    float row[512];
    size_t elem = fx_dtype_bytes(c->kv_dtype);
    for (int t = 0; t < c->tokens; t++) {
        int pos = fx_tensor_i32(&r->positions)[t];
        size_t slot = (size_t)fx_tensor_i32(&r->out_loc)[t];
        for (int h = 0; h < hq; h++) {
            for (int d = 0; d < c->head_dim_qk; d++)
                row[d] = fx_tensor_get(&r->q, (int64_t[]){t, h, d});
            rope_naive(r, row, pos);
            for (int d = 0; d < c->head_dim_qk; d++)
                q_want[((size_t)t * (size_t)hq + (size_t)h) * (size_t)c->head_dim_qk + (size_t)d] =
                    fx_round_to(c->q_dtype, row[d]);
        }
        for (int g = 0; g < c->num_kv_heads; g++) {
            for (int d = 0; d < c->head_dim_qk; d++)
                row[d] = fx_tensor_get(&r->k, (int64_t[]){t, g, d});
            rope_naive(r, row, pos);
            for (int d = 0; d < c->head_dim_qk; d++) {
                size_t at = ((slot * (size_t)c->num_kv_heads + (size_t)g) * (size_t)c->head_dim_qk +
                             (size_t)d) *
                            elem;
                fx_encode(c->kv_dtype, r->k_expect + at,
                          is_fp8(c->kv_dtype) ? row[d] / r->layer.k_scale : row[d]);
            }
            for (int d = 0; d < c->head_dim_v; d++) {
                float x = fx_tensor_get(&r->v, (int64_t[]){t, g, d});
                size_t at = ((slot * (size_t)c->num_kv_heads + (size_t)g) * (size_t)c->head_dim_v +
                             (size_t)d) *
                            elem;
                fx_encode(c->kv_dtype, r->v_expect + at,
                          is_fp8(c->kv_dtype) ? x / r->layer.v_scale : x);
            }
        }
    }
    return q_want;
}

static void rope_free(rope_setup *r) {
    plugin.vt->destroy(r->backend);
    free(r->k_pages);
    free(r->v_pages);
    free(r->k_expect);
    free(r->v_expect);
    fx_tensor *tensors[] = {&r->q,         &r->q_out,   &r->k,      &r->v,
                            &r->positions, &r->out_loc, &r->cos_sin};
    for (int n = 0; n < 7; n++) fx_tensor_free(tensors[n]);
}

static ap_status rope_call(rope_setup *r, fx_msg *msg) {
    ap_hook_append_kv_v1 hook;
    void *found = plugin.vt->get_hook(r->backend, AP_HOOK_APPEND_KV_V1);
    memcpy(&hook, &found, sizeof hook);
    fx_msg_init(msg);
    return hook(r->backend, &r->layer, &r->args, NULL, &msg->buf);
}

static void run_rope_case(const rope_case *c) {
    rope_setup r;
    rope_build(&r, c);
    float *q_want = rope_expect(&r);
    fx_msg msg;
    ap_status status = rope_call(&r, &msg);
    if (status != AP_OK) fail_msg("append_kv: %d %s", (int)status, msg.text);
    int hq = c->num_kv_heads * c->group;
    const fx_tensor *q_out = c->alias_q ? &r.q : &r.q_out;
    for (int t = 0; t < c->tokens; t++)
        for (int h = 0; h < hq; h++)
            for (int d = 0; d < c->head_dim_qk; d++) {
                float got = fx_tensor_get(q_out, (int64_t[]){t, h, d});
                float want = q_want[((size_t)t * (size_t)hq + (size_t)h) * (size_t)c->head_dim_qk +
                                    (size_t)d];
                if (got != want)
                    fail_msg("%s neox %d rot %d: q_out[%d][%d][%d] = %g, expected %g",
                             fx_dtype_name(c->kv_dtype), c->is_neox, c->rotary_dim, t, h, d,
                             (double)got, (double)want);
            }
    assert_memory_equal(r.k_pages, r.k_expect, r.k_bytes);
    assert_memory_equal(r.v_pages, r.v_expect, r.v_bytes);
    free(q_want);
    rope_free(&r);
}

static rope_case rope_base(void) {
    rope_case c = {.q_dtype = AP_DTYPE_BF16,
                   .kv_dtype = AP_DTYPE_FP8_E4M3,
                   .page_size = 16,
                   .num_pages = 6,
                   .num_kv_heads = 2,
                   .group = 4,
                   .head_dim_qk = 128,
                   .head_dim_v = 128,
                   .rotary_dim = 128,
                   .is_neox = 1,
                   .tokens = 23,
                   .max_position = 300};
    return c;
}

static void test_append_kv(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2, AP_DTYPE_BF16, AP_DTYPE_F16};
    ap_dtype q_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_F32};
    for (int k = 0; k < 4; k++)
        for (int neox = 0; neox <= 1; neox++) {
            rope_case c = rope_base();
            c.kv_dtype = kv_dtypes[k];
            c.q_dtype = q_dtypes[(k + neox) % 3];
            c.is_neox = neox;
            run_rope_case(&c);
            c.rotary_dim = 64; /* partial rotary: the tail passes through */
            c.alias_q = 1;
            c.page_size = 3;
            c.num_pages = 10;
            c.head_dim_v = 40;
            run_rope_case(&c);
        }
}

static void test_append_kv_bad_input(void **state) {
    (void)state;
    for (int what = 0; what < 4; what++) {
        rope_case c = rope_base();
        rope_setup r;
        rope_build(&r, &c);
        ap_status want = AP_ERR_SHAPE_MISMATCH;
        if (what == 0) fx_tensor_i32(&r.out_loc)[c.tokens - 1] = c.num_pages * c.page_size;
        if (what == 1) fx_tensor_i32(&r.positions)[3] = c.max_position;
        if (what == 2) r.args.rotary_dim = 7, want = AP_ERR_INVALID_ARGUMENT;
        if (what == 3) r.v.shape[2] = 64;
        unsigned char *q_before = malloc(r.q.bytes);
        memcpy(q_before, r.q.buffer, r.q.bytes);
        fx_msg msg;
        assert_int_equal(rope_call(&r, &msg), want);
        assert_true(msg.buf.length > 0);
        /* nothing written: cache still all poison, q_out still poison */
        assert_memory_equal(r.k_pages, r.k_expect, r.k_bytes);
        assert_memory_equal(r.v_pages, r.v_expect, r.v_bytes);
        assert_memory_equal(r.q.buffer, q_before, r.q.bytes);
        for (size_t b = 0; b < r.q_out.bytes; b++)
            assert_int_equal(((unsigned char *)r.q_out.buffer)[b], 0xA5);
        free(q_before);
        rope_free(&r);
    }
}

/* ---- pack_prefix_chunk_kv/1 ---- */

typedef struct pack_case {
    ap_dtype in_dtype, out_dtype;
    int tokens, heads, nope_dim, rope_dim, v_dim;
    int pe_3d; /* k_pe as [t][1][r] */
    int strided;
} pack_case;

static ap_status pack_call(ap_backend *backend, const ap_pack_kv_args *args, fx_msg *msg) {
    ap_hook_pack_prefix_chunk_kv_v1 hook;
    void *found = plugin.vt->get_hook(backend, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1);
    memcpy(&hook, &found, sizeof hook);
    fx_msg_init(msg);
    return hook(backend, args, NULL, &msg->buf);
}

static void fill_random(fx_tensor *t, int ndim) {
    int64_t i[3] = {0, 0, 0};
    for (i[0] = 0; i[0] < t->shape[0]; i[0]++)
        for (i[1] = 0; i[1] < (ndim > 1 ? t->shape[1] : 1); i[1]++)
            for (i[2] = 0; i[2] < (ndim > 2 ? t->shape[2] : 1); i[2]++)
                fx_tensor_set(t, i, (float)fx_rand_uniform(-3.0, 3.0));
}

static void run_pack_case(ap_backend *backend, const pack_case *c) {
    int64_t t = c->tokens, h = c->heads;
    int pad = c->strided ? 5 : 0;
    uint64_t offset = c->strided ? 3 : 0;
    fx_tensor k_nope, k_pe, v, k_out, v_out;
    fx_tensor_strided(&k_nope, c->in_dtype, 3, (int64_t[]){t, h, c->nope_dim}, pad + c->v_dim,
                      offset);
    if (c->pe_3d)
        fx_tensor_strided(&k_pe, c->in_dtype, 3, (int64_t[]){t, 1, c->rope_dim}, pad, offset);
    else
        fx_tensor_strided(&k_pe, c->in_dtype, 2, (int64_t[]){t, c->rope_dim}, pad, offset);
    fx_tensor_strided(&v, c->in_dtype, 3, (int64_t[]){t, h, c->v_dim}, pad, offset + 1);
    fx_tensor_make(&k_out, c->out_dtype, 3, (int64_t[]){t, h, c->nope_dim + c->rope_dim});
    fx_tensor_make(&v_out, c->out_dtype, 3, (int64_t[]){t, h, c->v_dim});
    fill_random(&k_nope, 3);
    fill_random(&k_pe, c->pe_3d ? 3 : 2);
    fill_random(&v, 3);
    float k_scale = (float)fx_rand_uniform(0.005, 0.05),
          v_scale = (float)fx_rand_uniform(0.005, 0.05);
    ap_pack_kv_args args = {sizeof args, &k_nope.dl, &k_pe.dl, &v.dl,
                            &k_out.dl,   &v_out.dl,  k_scale,  v_scale};
    fx_msg msg;
    ap_status status = pack_call(backend, &args, &msg);
    if (status != AP_OK) fail_msg("pack: %d %s", (int)status, msg.text);
    for (int64_t a = 0; a < t; a++)
        for (int64_t b = 0; b < h; b++) {
            for (int d = 0; d < c->nope_dim + c->rope_dim; d++) {
                float x = d < c->nope_dim ? fx_tensor_get(&k_nope, (int64_t[]){a, b, d})
                          : c->pe_3d      ? fx_tensor_get(&k_pe, (int64_t[]){a, 0, d - c->nope_dim})
                                          : fx_tensor_get(&k_pe, (int64_t[]){a, d - c->nope_dim});
                unsigned char want;
                fx_encode(c->out_dtype, &want, x / k_scale);
                unsigned char got =
                    ((unsigned char *)k_out.buffer)[(a * h + b) * (c->nope_dim + c->rope_dim) + d];
                if (got != want)
                    fail_msg("k_out[%ld][%ld][%d] = 0x%02x, expected 0x%02x", (long)a, (long)b, d,
                             got, want);
            }
            for (int d = 0; d < c->v_dim; d++) {
                unsigned char want;
                fx_encode(c->out_dtype, &want, fx_tensor_get(&v, (int64_t[]){a, b, d}) / v_scale);
                unsigned char got = ((unsigned char *)v_out.buffer)[(a * h + b) * c->v_dim + d];
                if (got != want)
                    fail_msg("v_out[%ld][%ld][%d] = 0x%02x, expected 0x%02x", (long)a, (long)b, d,
                             got, want);
            }
        }
    fx_tensor *all[] = {&k_nope, &k_pe, &v, &k_out, &v_out};
    for (int n = 0; n < 5; n++) fx_tensor_free(all[n]);
}

static ap_backend *any_instance(void) {
    ap_model m = {.struct_size = sizeof m,
                  .kind = AP_ATTN_MHA,
                  .num_qo_heads = 4,
                  .num_kv_heads = 4,
                  .head_dim_qk = 64,
                  .head_dim_v = 64,
                  .dtype = AP_DTYPE_BF16,
                  .kv_dtype = AP_DTYPE_BF16,
                  .page_size = 16};
    ap_backend *backend = NULL;
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    return backend;
}

static void test_pack(void **state) {
    (void)state;
    ap_backend *backend = any_instance();
    ap_dtype ins[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_F32};
    ap_dtype outs[] = {AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2};
    for (int i = 0; i < 3; i++)
        for (int o = 0; o < 2; o++)
            for (int variant = 0; variant < 4; variant++) {
                pack_case c = {ins[i], outs[o], fx_rand_int(1, 40), fx_rand_int(1, 16), 128,
                               64,     128,     variant & 1,        (variant >> 1) & 1};
                if (variant == 3) c.nope_dim = 40, c.rope_dim = 8, c.v_dim = 24; /* odd dims */
                run_pack_case(backend, &c);
            }
    plugin.vt->destroy(backend);
}

static void test_pack_bad_input(void **state) {
    (void)state;
    ap_backend *backend = any_instance();
    fx_tensor k_nope, k_pe, v, k_out, v_out;
    fx_tensor_make(&k_nope, AP_DTYPE_BF16, 3, (int64_t[]){4, 2, 16});
    fx_tensor_make(&k_pe, AP_DTYPE_BF16, 2, (int64_t[]){4, 8});
    fx_tensor_make(&v, AP_DTYPE_BF16, 3, (int64_t[]){4, 2, 16});
    fx_tensor_make(&k_out, AP_DTYPE_FP8_E4M3, 3, (int64_t[]){4, 2, 24});
    fx_tensor_make(&v_out, AP_DTYPE_FP8_E4M3, 3, (int64_t[]){4, 2, 16});
    ap_pack_kv_args args = {sizeof args, &k_nope.dl, &k_pe.dl, &v.dl,
                            &k_out.dl,   &v_out.dl,  0.1f,     0.1f};
    fx_msg msg;
    k_out.shape[2] = 23;
    assert_int_equal(pack_call(backend, &args, &msg), AP_ERR_SHAPE_MISMATCH);
    k_out.shape[2] = 24;
    k_pe.shape[0] = 3;
    assert_int_equal(pack_call(backend, &args, &msg), AP_ERR_SHAPE_MISMATCH);
    k_pe.shape[0] = 4;
    args.v_scale = 0.0f;
    assert_int_equal(pack_call(backend, &args, &msg), AP_ERR_INVALID_ARGUMENT);
    args.v_scale = 0.1f;
    k_out.dl.dtype = (DLDataType){kDLBfloat, 16, 1};
    assert_int_equal(pack_call(backend, &args, &msg), AP_ERR_INVALID_ARGUMENT);
    assert_true(msg.buf.length > 0);
    for (size_t b = 0; b < k_out.bytes; b++)
        assert_int_equal(((unsigned char *)k_out.buffer)[b], 0xA5);
    for (size_t b = 0; b < v_out.bytes; b++)
        assert_int_equal(((unsigned char *)v_out.buffer)[b], 0xA5);
    fx_tensor *all[] = {&k_nope, &k_pe, &v, &k_out, &v_out};
    for (int n = 0; n < 5; n++) fx_tensor_free(all[n]);
    plugin.vt->destroy(backend);
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_kv),
        cmocka_unit_test(test_append_kv_bad_input),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_pack_bad_input),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
