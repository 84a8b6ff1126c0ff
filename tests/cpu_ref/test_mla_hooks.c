/* test_mla_hooks.c: cpu_ref's append_kv/1 for MLA (RoPE on q_rope and k_pe, the latent row
 * quantized into its page) byte for byte against a naive version written here, and its
 * merge_state/1 against attention over all the keys at once. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "fixture.h"
#include "scenario.h"
#include "tests/common/test_model.h"

static fx_plugin plugin;

static int is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

typedef struct mla_append_case {
    ap_dtype q_dtype, kv_dtype;
    int page_size, num_pages, heads, rank, rope, nope, tokens, max_position, is_neox;
    int in_place; /* q_rope is a slice of q [T][H][nope + rope], rotated in place (q_out = q) */
} mla_append_case;

typedef struct mla_append {
    mla_append_case c;
    int width;
    ap_backend *backend;
    ap_kv_cache kv;
    ap_layer layer;
    unsigned char *cache, *cache_expect;
    size_t cache_bytes;
    fx_tensor q_full, q_out_t, k, positions, out_loc, cos_sin;
    DLTensor q_view;
    int64_t view_shape[3];
    ap_append_kv_args args;
} mla_append;

static void append_build(mla_append *a, const mla_append_case *c) {
    memset(a, 0, sizeof *a);
    a->c = *c;
    a->width = c->rank + c->rope;
    ap_model m = {.struct_size = sizeof m,
                  .kind = AP_ATTN_MLA,
                  .num_qo_heads = c->heads,
                  .num_kv_heads = 1,
                  .head_dim_qk = a->width,
                  .head_dim_v = c->rank,
                  .kv_lora_rank = c->rank,
                  .qk_rope_head_dim = c->rope,
                  .qk_nope_head_dim = c->nope,
                  .v_head_dim = c->nope,
                  .dtype = c->q_dtype,
                  .kv_dtype = c->kv_dtype,
                  .page_size = c->page_size,
                  .num_layers = 1,
                  .causal = 1};
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&m, NULL, NULL, &a->backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    a->cache_bytes = (size_t)c->num_pages * (size_t)c->page_size * (size_t)a->width *
                     fx_dtype_bytes(c->kv_dtype);
    a->cache = malloc(a->cache_bytes);
    a->cache_expect = malloc(a->cache_bytes);
    memset(a->cache, 0xA5, a->cache_bytes);
    memset(a->cache_expect, 0xA5, a->cache_bytes);
    a->kv = (ap_kv_cache){.struct_size = sizeof a->kv,
                          .layout = AP_KV_LAYOUT_NHD,
                          .dtype = c->kv_dtype,
                          .page_size = c->page_size,
                          .num_pages = c->num_pages,
                          .num_kv_heads = 1,
                          .head_dim_qk = a->width,
                          .head_dim_v = c->rank,
                          .k_pages = a->cache};
    a->layer = (ap_layer){.struct_size = sizeof a->layer,
                          .sm_scale = 0.1f,
                          .k_scale = is_fp8(c->kv_dtype) ? (float)fx_rand_uniform(0.005, 0.05) : 1,
                          .v_scale = is_fp8(c->kv_dtype) ? 1000.0f : 1, /* unused by MLA */
                          .window_left = -1,
                          .kv = &a->kv};
    int64_t t = c->tokens, h = c->heads;
    /* q [T][H][nope + rope] as the projection writes it: q_rope is its last rope values */
    fx_tensor_make(&a->q_full, c->q_dtype, 3, (int64_t[]){t, h, c->nope + c->rope});
    if (!c->in_place) fx_tensor_make(&a->q_out_t, c->q_dtype, 3, (int64_t[]){t, h, c->rope});
    fx_tensor_make(&a->k, c->q_dtype, 3, (int64_t[]){t, 1, a->width});
    fx_tensor_make(&a->positions, AP_DTYPE_NONE, 1, (int64_t[]){t});
    fx_tensor_make(&a->out_loc, AP_DTYPE_NONE, 1, (int64_t[]){t});
    fx_tensor_make(&a->cos_sin, AP_DTYPE_F32, 2, (int64_t[]){c->max_position, c->rope});
    fx_rope_table(&a->cos_sin);
    for (size_t e = 0; e < a->q_full.bytes / fx_dtype_bytes(c->q_dtype); e++)
        fx_encode(c->q_dtype, (char *)a->q_full.buffer + e * fx_dtype_bytes(c->q_dtype),
                  (float)fx_rand_uniform(-2.0, 2.0));
    for (size_t e = 0; e < a->k.bytes / fx_dtype_bytes(c->q_dtype); e++)
        fx_encode(c->q_dtype, (char *)a->k.buffer + e * fx_dtype_bytes(c->q_dtype),
                  (float)fx_rand_uniform(-2.0, 2.0));
    /* distinct slots: a random sample of all of them */
    int total = c->num_pages * c->page_size;
    int *slots = malloc(sizeof(int) * (size_t)total);
    for (int i = 0; i < total; i++) slots[i] = i;
    for (int i = 0; i < c->tokens; i++) {
        int other = fx_rand_int(i, total - 1), keep = slots[i];
        slots[i] = slots[other];
        slots[other] = keep;
        fx_tensor_i32(&a->out_loc)[i] = slots[i];
        fx_tensor_i32(&a->positions)[i] = fx_rand_int(0, c->max_position - 1);
    }
    free(slots);
    /* the q_rope view: rows strided by nope + rope, starting nope values in */
    a->view_shape[0] = t, a->view_shape[1] = h, a->view_shape[2] = c->rope;
    a->q_view = a->q_full.dl;
    a->q_view.shape = a->view_shape;
    a->q_view.strides = a->q_full.strides; /* the dense strides of [T][H][nope + rope] */
    a->q_view.byte_offset = (uint64_t)c->nope * fx_dtype_bytes(c->q_dtype);
    a->args = (ap_append_kv_args){.struct_size = sizeof a->args,
                                  .q = &a->q_view,
                                  .q_out = c->in_place ? &a->q_view : &a->q_out_t.dl,
                                  .k = &a->k.dl,
                                  .v = NULL,
                                  .positions = &a->positions.dl,
                                  .out_loc = &a->out_loc.dl,
                                  .cos_sin = &a->cos_sin.dl,
                                  .rotary_dim = c->rope,
                                  .is_neox = c->is_neox};
}

static void append_free(mla_append *a) {
    plugin.vt->destroy(a->backend);
    free(a->cache);
    free(a->cache_expect);
    fx_tensor *all[] = {&a->q_full, &a->q_out_t, &a->k, &a->positions, &a->out_loc, &a->cos_sin};
    for (int n = 0; n < 6; n++) fx_tensor_free(all[n]);
}

/* The expected q_out values [T][H][rope] and cache bytes, before the hook runs (it may rotate q
 * in place): q_rope rotated; the latent row with c as given and k_pe rotated, each value stored
 * as saturate(x / k_scale) (fp8, division in float32) or x rounded (bf16/f16), at
 * slot * (rank + rope) of the single-head NHD cache. */
static float *append_expect(mla_append *a) {
    const mla_append_case *c = &a->c;
    float *q_want = malloc(sizeof(float) * (size_t)c->tokens * (size_t)c->heads * (size_t)c->rope);
    float row[1024];
    size_t elem = fx_dtype_bytes(c->kv_dtype);
    for (int t = 0; t < c->tokens; t++) {
        int pos = fx_tensor_i32(&a->positions)[t];
        size_t slot = (size_t)fx_tensor_i32(&a->out_loc)[t];
        for (int h = 0; h < c->heads; h++) {
            for (int d = 0; d < c->rope; d++)
                row[d] = fx_tensor_get(&a->q_full, (int64_t[]){t, h, c->nope + d});
            fx_rope_naive(&a->cos_sin, row, c->rope, c->is_neox, pos);
            for (int d = 0; d < c->rope; d++)
                q_want[((size_t)t * (size_t)c->heads + (size_t)h) * (size_t)c->rope + (size_t)d] =
                    fx_round_to(c->q_dtype, row[d]);
        }
        for (int d = 0; d < a->width; d++) row[d] = fx_tensor_get(&a->k, (int64_t[]){t, 0, d});
        fx_rope_naive(&a->cos_sin, row + c->rank, c->rope, c->is_neox, pos);
        for (int d = 0; d < a->width; d++)
            fx_encode(c->kv_dtype, a->cache_expect + (slot * (size_t)a->width + (size_t)d) * elem,
                      is_fp8(c->kv_dtype) ? row[d] / a->layer.k_scale : row[d]);
    }
    return q_want;
}

static ap_status append_call(mla_append *a, fx_msg *msg) {
    ap_hook_append_kv_v1 hook;
    void *found = plugin.vt->get_hook(a->backend, AP_HOOK_APPEND_KV_V1);
    memcpy(&hook, &found, sizeof hook);
    fx_msg_init(msg);
    return hook(a->backend, &a->layer, &a->args, NULL, &msg->buf);
}

static void run_append_case(const mla_append_case *c) {
    mla_append a;
    append_build(&a, c);
    unsigned char *q_before = malloc(a.q_full.bytes);
    memcpy(q_before, a.q_full.buffer, a.q_full.bytes);
    float *q_want = append_expect(&a);
    fx_msg msg;
    ap_status status = append_call(&a, &msg);
    if (status != AP_OK) fail_msg("append_kv: %d %s", (int)status, msg.text);
    for (int t = 0; t < c->tokens; t++)
        for (int h = 0; h < c->heads; h++) {
            for (int d = 0; d < c->rope; d++) {
                float got = c->in_place ? fx_tensor_get(&a.q_full, (int64_t[]){t, h, c->nope + d})
                                        : fx_tensor_get(&a.q_out_t, (int64_t[]){t, h, d});
                float want = q_want[((size_t)t * (size_t)c->heads + (size_t)h) * (size_t)c->rope +
                                    (size_t)d];
                if (got != want)
                    fail_msg("%s neox %d: q_out[%d][%d][%d] = %g, expected %g",
                             fx_dtype_name(c->kv_dtype), c->is_neox, t, h, d, (double)got,
                             (double)want);
            }
            /* q_nope, beside q_rope in the same rows, is not touched */
            size_t row_bytes = (size_t)(c->nope + c->rope) * fx_dtype_bytes(c->q_dtype);
            size_t at = ((size_t)t * (size_t)c->heads + (size_t)h) * row_bytes;
            assert_memory_equal((char *)a.q_full.buffer + at, q_before + at,
                                (size_t)c->nope * fx_dtype_bytes(c->q_dtype));
        }
    for (size_t b = 0; b < a.cache_bytes; b++)
        if (a.cache[b] != a.cache_expect[b])
            fail_msg("%s neox %d: cache byte %zu is 0x%02x, expected 0x%02x",
                     fx_dtype_name(c->kv_dtype), c->is_neox, b, a.cache[b], a.cache_expect[b]);
    free(q_before);
    free(q_want);
    append_free(&a);
}

/* DeepSeek-V3's widths (latent 512, rope 64, nope 128), 16 heads. */
static mla_append_case append_base(void) {
    mla_append_case c = {.q_dtype = AP_DTYPE_BF16,
                         .kv_dtype = AP_DTYPE_FP8_E4M3,
                         .page_size = 64,
                         .num_pages = 5,
                         .heads = 16,
                         .rank = 512,
                         .rope = 64,
                         .nope = 128,
                         .tokens = 37,
                         .max_position = 4096,
                         .is_neox = 0};
    return c;
}

static void test_mla_append(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_FP8_E4M3, AP_DTYPE_BF16, AP_DTYPE_FP8_E5M2, AP_DTYPE_F16};
    ap_dtype q_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_F32};
    for (int k = 0; k < 4; k++)
        for (int neox = 0; neox <= 1; neox++) {
            mla_append_case c = append_base();
            c.kv_dtype = kv_dtypes[k];
            c.q_dtype = q_dtypes[(k + neox) % 3];
            c.is_neox = neox;
            c.in_place = neox;
            run_append_case(&c);
            c.page_size = 32; /* other widths, pages and head counts */
            c.num_pages = 4;
            c.rank = 40;
            c.rope = 8;
            c.nope = 12;
            c.heads = 3;
            c.in_place = !neox;
            run_append_case(&c);
        }
}

/* Refused calls write nothing: neither the cache nor q_out. */
static void test_mla_append_bad_input(void **state) {
    (void)state;
    for (int what = 0; what < 4; what++) {
        mla_append_case c = append_base();
        mla_append a;
        append_build(&a, &c);
        ap_status want = AP_ERR_SHAPE_MISMATCH;
        fx_tensor v;
        fx_tensor_make(&v, c.q_dtype, 3, (int64_t[]){c.tokens, 1, c.rank});
        if (what == 0) fx_tensor_i32(&a.out_loc)[c.tokens - 1] = c.num_pages * c.page_size;
        if (what == 1) a.args.v = &v.dl, want = AP_ERR_INVALID_ARGUMENT;
        if (what == 2) a.args.rotary_dim = 32, want = AP_ERR_INVALID_ARGUMENT;
        if (what == 3) a.k.shape[2] = 512;
        unsigned char *q_before = malloc(a.q_full.bytes);
        memcpy(q_before, a.q_full.buffer, a.q_full.bytes);
        fx_msg msg;
        assert_int_equal(append_call(&a, &msg), want);
        assert_true(msg.buf.length > 0);
        assert_memory_equal(a.cache, a.cache_expect, a.cache_bytes);
        assert_memory_equal(a.q_full.buffer, q_before, a.q_full.bytes);
        for (size_t b = 0; b < a.q_out_t.bytes; b++)
            assert_int_equal(((unsigned char *)a.q_out_t.buffer)[b], 0xA5);
        free(q_before);
        fx_tensor_free(&v);
        append_free(&a);
    }
}

/* ---- merge_state/1 ---- */

/* Softmax attention of one query over the keys `set` marks, dense in double:
 *   s_n = scale * q . k_n,  out = sum_n softmax(s)_n v_n,  returns lse = log sum_n exp(s_n)
 * (-inf and out = 0 when the set is empty). */
static double naive_attend(const double *q, const double *keys, const double *values,
                           const int *set, int count, int dk, int dv, double scale, double *out) {
    double max_logit = -INFINITY, sum = 0.0;
    double *logits = malloc(sizeof(double) * (size_t)count);
    for (int n = 0; n < count; n++) {
        logits[n] = -INFINITY;
        if (!set[n]) continue;
        double dot = 0.0;
        for (int d = 0; d < dk; d++) dot += q[d] * keys[(size_t)n * (size_t)dk + (size_t)d];
        logits[n] = scale * dot;
        max_logit = logits[n] > max_logit ? logits[n] : max_logit;
    }
    for (int d = 0; d < dv; d++) out[d] = 0.0;
    if (max_logit == -INFINITY) {
        free(logits);
        return -INFINITY;
    }
    for (int n = 0; n < count; n++) sum += exp(logits[n] - max_logit);
    for (int n = 0; n < count; n++)
        for (int d = 0; d < dv; d++)
            out[d] += exp(logits[n] - max_logit) / sum * values[(size_t)n * (size_t)dv + (size_t)d];
    free(logits);
    return max_logit + log(sum);
}

typedef struct merge_case {
    ap_dtype dtype;
    int tokens, heads, dk, dv, keys;
    int in_place; /* o = o_a, lse = lse_a */
    int with_lse;
} merge_case;

/* Row kinds, by (t * heads + h) % 5: 0..1 keys split at random between the two sides, 2 only
 * side b has keys, 3 only side a, 4 neither. */
static void run_merge_case(ap_backend *backend, const merge_case *c) {
    int64_t t = c->tokens, h = c->heads;
    size_t rows = (size_t)(t * h);
    fx_tensor o_a, o_b, o, lse_a, lse_b, lse;
    fx_tensor_make(&o_a, c->dtype, 3, (int64_t[]){t, h, c->dv});
    fx_tensor_make(&o_b, c->dtype, 3, (int64_t[]){t, h, c->dv});
    fx_tensor_make(&o, c->dtype, 3, (int64_t[]){t, h, c->dv});
    fx_tensor_make(&lse_a, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    fx_tensor_make(&lse_b, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    fx_tensor_make(&lse, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    double *q = malloc(sizeof(double) * (size_t)c->dk);
    double *keys = malloc(sizeof(double) * (size_t)(c->keys * c->dk));
    double *values = malloc(sizeof(double) * (size_t)(c->keys * c->dv));
    double *part = malloc(sizeof(double) * (size_t)c->dv);
    double *want = malloc(sizeof(double) * rows * (size_t)c->dv);
    double *got = malloc(sizeof(double) * rows * (size_t)c->dv);
    double *lse_want = malloc(sizeof(double) * rows);
    int *kind = malloc(sizeof(int) * rows);
    int *in_a = malloc(sizeof(int) * (size_t)c->keys),
        *in_b = malloc(sizeof(int) * (size_t)c->keys);
    int *all = malloc(sizeof(int) * (size_t)c->keys);
    double scale = 1.0 / sqrt((double)c->dk);
    for (size_t r = 0; r < rows; r++) {
        int64_t ti = (int64_t)r / h, hi = (int64_t)r % h;
        kind[r] = (int)(r % 5);
        for (int d = 0; d < c->dk; d++) q[d] = fx_rand_uniform(-2.0, 2.0);
        for (int n = 0; n < c->keys * c->dk; n++) keys[n] = fx_rand_uniform(-1.0, 1.0);
        for (int n = 0; n < c->keys * c->dv; n++) values[n] = fx_rand_uniform(-1.0, 1.0);
        for (int n = 0; n < c->keys; n++) {
            int side_a = kind[r] == 3 || (kind[r] < 2 && fx_rand_int(0, 1));
            in_a[n] = kind[r] != 4 && side_a;
            in_b[n] = kind[r] != 4 && !side_a;
            all[n] = kind[r] != 4;
        }
        lse_want[r] = naive_attend(q, keys, values, all, c->keys, c->dk, c->dv, scale,
                                   want + r * (size_t)c->dv);
        /* the partial states as a forward writes them: o rounded to its dtype, lse float32; an
         * empty side's o is poison (NaN), which the merge must not read */
        double lse_part = naive_attend(q, keys, values, in_a, c->keys, c->dk, c->dv, scale, part);
        fx_tensor_set(&lse_a, (int64_t[]){ti, hi}, (float)lse_part);
        for (int d = 0; d < c->dv; d++)
            fx_tensor_set(&o_a, (int64_t[]){ti, hi, d},
                          lse_part == -INFINITY ? NAN : (float)part[d]);
        lse_part = naive_attend(q, keys, values, in_b, c->keys, c->dk, c->dv, scale, part);
        fx_tensor_set(&lse_b, (int64_t[]){ti, hi}, (float)lse_part);
        for (int d = 0; d < c->dv; d++)
            fx_tensor_set(&o_b, (int64_t[]){ti, hi, d},
                          lse_part == -INFINITY ? NAN : (float)part[d]);
    }
    fx_tensor o_a_before, lse_a_before, lse_b_before, o_b_before;
    fx_tensor *keep[][2] = {
        {&o_a, &o_a_before}, {&o_b, &o_b_before}, {&lse_a, &lse_a_before}, {&lse_b, &lse_b_before}};
    for (int n = 0; n < 4; n++) {
        fx_tensor_make(keep[n][1], keep[n][0]->dtype, keep[n][0]->dl.ndim, keep[n][0]->shape);
        memcpy(keep[n][1]->buffer, keep[n][0]->buffer, keep[n][0]->bytes);
    }
    ap_merge_state_args args = {.struct_size = sizeof args,
                                .o_a = &o_a.dl,
                                .lse_a = &lse_a.dl,
                                .o_b = &o_b.dl,
                                .lse_b = &lse_b.dl,
                                .o = c->in_place ? &o_a.dl : &o.dl,
                                .lse = !c->with_lse  ? NULL
                                       : c->in_place ? &lse_a.dl
                                                     : &lse.dl};
    ap_hook_merge_state_v1 hook;
    void *found = plugin.vt->get_hook(backend, AP_HOOK_MERGE_STATE_V1);
    memcpy(&hook, &found, sizeof hook);
    fx_msg msg;
    fx_msg_init(&msg);
    ap_status status = hook(backend, &args, NULL, &msg.buf);
    if (status != AP_OK) fail_msg("merge_state: %d %s", (int)status, msg.text);
    const fx_tensor *out = c->in_place ? &o_a : &o, *lse_out = c->in_place ? &lse_a : &lse;
    for (size_t r = 0; r < rows; r++) {
        int64_t ti = (int64_t)r / h, hi = (int64_t)r % h;
        /* one side empty: the other side's values exactly; neither: 0 and -inf */
        const fx_tensor *copied = kind[r] == 2 ? &o_b_before : kind[r] == 3 ? &o_a_before : NULL;
        const fx_tensor *copied_lse = kind[r] == 2   ? &lse_b_before
                                      : kind[r] == 3 ? &lse_a_before
                                                     : NULL;
        for (int d = 0; d < c->dv; d++) {
            int64_t at[3] = {ti, hi, d};
            got[r * (size_t)c->dv + (size_t)d] = fx_tensor_get(out, at);
            float exact = copied != NULL ? fx_tensor_get(copied, at) : kind[r] == 4 ? 0.0f : NAN;
            if (kind[r] >= 2 && fx_tensor_get(out, at) != exact)
                fail_msg("%s row %zu (kind %d): o[%d] = %g, expected exactly %g",
                         fx_dtype_name(c->dtype), r, kind[r], d, (double)fx_tensor_get(out, at),
                         (double)exact);
        }
        if (!c->with_lse) continue;
        double value = fx_tensor_get(lse_out, (int64_t[]){ti, hi});
        double lse_exact =
            copied_lse != NULL ? fx_tensor_get(copied_lse, (int64_t[]){ti, hi}) : -INFINITY;
        int ok = kind[r] >= 2 ? value == lse_exact
                              : fabs(value - lse_want[r]) <= 1e-5 * (1.0 + fabs(lse_want[r]));
        if (!ok)
            fail_msg("%s row %zu (kind %d): lse %.9g, expected %.9g", fx_dtype_name(c->dtype), r,
                     kind[r], value, kind[r] >= 2 ? lse_exact : lse_want[r]);
    }
    /* merged against attending to every key at once */
    double err = fx_rel_l2(got, want, rows * (size_t)c->dv);
    if (!(err < sc_tolerance(c->dtype)))
        fail_msg("%s: merged o relative L2 error %g >= %g", fx_dtype_name(c->dtype), err,
                 sc_tolerance(c->dtype));
    if (!c->in_place) {
        assert_memory_equal(o_a.buffer, o_a_before.buffer, o_a.bytes); /* inputs untouched */
        assert_memory_equal(lse_a.buffer, lse_a_before.buffer, lse_a.bytes);
    }
    assert_memory_equal(o_b.buffer, o_b_before.buffer, o_b.bytes);
    assert_memory_equal(lse_b.buffer, lse_b_before.buffer, lse_b.bytes);
    fx_tensor *tensors[] = {&o_a, &o_b,        &o,          &lse_a,        &lse_b,
                            &lse, &o_a_before, &o_b_before, &lse_a_before, &lse_b_before};
    for (int n = 0; n < 10; n++) fx_tensor_free(tensors[n]);
    free(q), free(keys), free(values), free(part), free(want), free(got), free(lse_want);
    free(kind), free(in_a), free(in_b), free(all);
}

static ap_backend *mla_instance(void) {
    ap_model m = ap_test_mla_model("mla", 16);
    m.num_layers = 1;
    ap_backend *backend = NULL;
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    return backend;
}

static void test_merge_state(void **state) {
    (void)state;
    ap_backend *backend = mla_instance();
    ap_dtype dtypes[] = {AP_DTYPE_F32, AP_DTYPE_BF16, AP_DTYPE_F16};
    for (int k = 0; k < 3; k++)
        for (int variant = 0; variant < 3; variant++) {
            /* MLA's prefill widths (qk 192, v 128), and small odd ones */
            merge_case c = {dtypes[k], 7, 5, 192, 128, 23, variant == 1, variant != 2};
            if (variant == 2) c.dk = 9, c.dv = 5, c.keys = 3;
            run_merge_case(backend, &c);
        }
    plugin.vt->destroy(backend);
}

static void test_merge_state_bad_input(void **state) {
    (void)state;
    ap_backend *backend = mla_instance();
    fx_tensor o_a, o_b, o, lse_a, lse_b;
    fx_tensor_make(&o_a, AP_DTYPE_BF16, 3, (int64_t[]){4, 2, 8});
    fx_tensor_make(&o_b, AP_DTYPE_BF16, 3, (int64_t[]){4, 2, 8});
    fx_tensor_make(&o, AP_DTYPE_BF16, 3, (int64_t[]){4, 2, 8});
    fx_tensor_make(&lse_a, AP_DTYPE_F32, 2, (int64_t[]){4, 2});
    fx_tensor_make(&lse_b, AP_DTYPE_F32, 2, (int64_t[]){4, 2});
    memset(o_a.buffer, 0, o_a.bytes), memset(o_b.buffer, 0, o_b.bytes);
    memset(lse_a.buffer, 0, lse_a.bytes), memset(lse_b.buffer, 0, lse_b.bytes);
    ap_merge_state_args args = {sizeof args, &o_a.dl, &lse_a.dl, &o_b.dl, &lse_b.dl, &o.dl, NULL};
    ap_hook_merge_state_v1 hook;
    void *found = plugin.vt->get_hook(backend, AP_HOOK_MERGE_STATE_V1);
    memcpy(&hook, &found, sizeof hook);
    fx_msg msg;
    fx_msg_init(&msg);
    o_b.shape[2] = 7;
    assert_int_equal(hook(backend, &args, NULL, &msg.buf), AP_ERR_SHAPE_MISMATCH);
    o_b.shape[2] = 8;
    lse_b.shape[1] = 3;
    assert_int_equal(hook(backend, &args, NULL, &msg.buf), AP_ERR_SHAPE_MISMATCH);
    lse_b.shape[1] = 2;
    o.dl.dtype = (DLDataType){kDLFloat, 32, 1};
    assert_int_equal(hook(backend, &args, NULL, &msg.buf), AP_ERR_INVALID_ARGUMENT);
    assert_true(msg.buf.length > 0);
    for (size_t b = 0; b < o.bytes; b++) assert_int_equal(((unsigned char *)o.buffer)[b], 0xA5);
    o.dl.dtype = (DLDataType){kDLBfloat, 16, 1};
    assert_int_equal(hook(backend, &args, NULL, &msg.buf), AP_OK);
    fx_tensor *all[] = {&o_a, &o_b, &o, &lse_a, &lse_b};
    for (int n = 0; n < 5; n++) fx_tensor_free(all[n]);
    plugin.vt->destroy(backend);
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mla_append),
        cmocka_unit_test(test_mla_append_bad_input),
        cmocka_unit_test(test_merge_state),
        cmocka_unit_test(test_merge_state_bad_input),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
