/* test_mla_prefill.c: cpu_ref's MLA extend in the MHA form chunked prefill uses (q/k 192, v 128)
 * over ABI 1.1's ragged K/V source, causal and prefix-chunk, and a whole chunked prefill (new
 * tokens + prefix chunks merged by merge_state/1) against one dense causal attention. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "scenario.h"

static fx_plugin plugin;

#define PF_MAX_SEQS 6

static int is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

/* One sequence set: per sequence q_len query rows and kv_len key/value rows. */
typedef struct pf_case {
    ap_dtype q_dtype, kv_dtype; /* kv_dtype: k/v tensors' type (activation or fp8) */
    int heads, nope, rope, dv;
    int kv_causal; /* 1: causal aligned to the end; 0: every row sees every key */
    int implicit;  /* no kv_indptr: MLA's MHA form over the new tokens (kv rows = q rows) */
    int with_lse;
    int num_seqs;
    int q_len[PF_MAX_SEQS], kv_len[PF_MAX_SEQS];
} pf_case;

typedef struct pf_setup {
    pf_case c;
    int dk, num_tokens, num_kv;
    ap_model model;
    ap_backend *backend;
    int32_t qo_indptr[PF_MAX_SEQS + 1], kv_indptr[PF_MAX_SEQS + 1], seq_lens[PF_MAX_SEQS];
    ap_batch batch;
    ap_layer layer;
    fx_tensor q, k, v, out, lse;
    ap_forward_args args;
} pf_setup;

static ap_model pf_model(const pf_case *c) {
    ap_model m = {.struct_size = sizeof(ap_model),
                  .name = "test/mla",
                  .kind = AP_ATTN_MLA,
                  .num_qo_heads = c->heads,
                  .num_kv_heads = 1,
                  .head_dim_qk = 512 + c->rope,
                  .head_dim_v = 512,
                  .kv_lora_rank = 512,
                  .qk_rope_head_dim = c->rope,
                  .qk_nope_head_dim = c->nope,
                  .v_head_dim = c->dv,
                  .dtype = c->q_dtype,
                  .kv_dtype = AP_DTYPE_BF16,
                  .page_size = 64,
                  .num_layers = 1,
                  .causal = 1,
                  .max_batch = PF_MAX_SEQS,
                  .max_tokens = 4096,
                  .max_kv_len = 4096};
    return m;
}

/* Random q (activations) and k/v (stored as the pack hook would: fp8 as saturate(x / scale)). */
static void pf_build(pf_setup *s, const pf_case *c) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    s->dk = c->nope + c->rope;
    s->model = pf_model(c);
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&s->model, NULL, NULL, &s->backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    s->qo_indptr[0] = s->kv_indptr[0] = 0;
    int max_q = 0, max_seq = 0;
    for (int i = 0; i < c->num_seqs; i++) {
        int kv_len = c->implicit ? c->q_len[i] : c->kv_len[i];
        s->qo_indptr[i + 1] = s->qo_indptr[i] + c->q_len[i];
        s->kv_indptr[i + 1] = s->kv_indptr[i] + kv_len;
        s->seq_lens[i] = c->q_len[i] + (kv_len > c->q_len[i] ? kv_len - c->q_len[i] : 0);
        max_q = c->q_len[i] > max_q ? c->q_len[i] : max_q;
        max_seq = s->seq_lens[i] > max_seq ? s->seq_lens[i] : max_seq;
    }
    s->num_tokens = s->qo_indptr[c->num_seqs];
    s->num_kv = s->kv_indptr[c->num_seqs];
    s->batch = (ap_batch){.struct_size = sizeof(ap_batch),
                          .mode = AP_MODE_EXTEND,
                          .num_seqs = c->num_seqs,
                          .num_tokens = s->num_tokens,
                          .max_q_len = max_q,
                          .max_seq_len = max_seq,
                          .qo_indptr = s->qo_indptr,
                          .seq_lens = s->seq_lens,
                          .qo_indptr_host = s->qo_indptr,
                          .seq_lens_host = s->seq_lens,
                          .kv_indptr = c->implicit ? NULL : s->kv_indptr,
                          .kv_indptr_host = c->implicit ? NULL : s->kv_indptr,
                          .num_kv_tokens = c->implicit ? 0 : s->num_kv,
                          .kv_causal = c->kv_causal};
    int fp8 = is_fp8(c->kv_dtype);
    s->layer = (ap_layer){.struct_size = sizeof(ap_layer),
                          .sm_scale = (float)(1.0 / sqrt((double)s->dk)),
                          .k_scale = fp8 ? (float)fx_rand_uniform(0.004, 0.02) : 1.0f,
                          .v_scale = fp8 ? (float)fx_rand_uniform(0.004, 0.02) : 1.0f,
                          .window_left = -1};
    int64_t t = s->num_tokens, n = s->num_kv, h = c->heads;
    fx_tensor_make(&s->q, c->q_dtype, 3, (int64_t[]){t, h, s->dk});
    fx_tensor_make(&s->k, c->kv_dtype, 3, (int64_t[]){n, h, s->dk});
    fx_tensor_make(&s->v, c->kv_dtype, 3, (int64_t[]){n, h, c->dv});
    fx_tensor_make(&s->out, c->q_dtype, 3, (int64_t[]){t, h, c->dv});
    fx_tensor_make(&s->lse, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    memset(s->out.buffer, 0xFF, s->out.bytes);
    memset(s->lse.buffer, 0xFF, s->lse.bytes);
    for (int64_t a = 0; a < t; a++)
        for (int64_t b = 0; b < h; b++)
            for (int d = 0; d < s->dk; d++)
                fx_tensor_set(&s->q, (int64_t[]){a, b, d}, (float)fx_rand_uniform(-3.0, 3.0));
    for (int64_t a = 0; a < n; a++)
        for (int64_t b = 0; b < h; b++) {
            for (int d = 0; d < s->dk; d++) {
                float x = (float)fx_rand_uniform(-1.0, 1.0);
                fx_tensor_set(&s->k, (int64_t[]){a, b, d}, fp8 ? x / s->layer.k_scale : x);
            }
            for (int d = 0; d < c->dv; d++) {
                float x = (float)fx_rand_uniform(-1.0, 1.0);
                fx_tensor_set(&s->v, (int64_t[]){a, b, d}, fp8 ? x / s->layer.v_scale : x);
            }
        }
    s->args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                .q = &s->q.dl,
                                .k = &s->k.dl,
                                .v = &s->v.dl,
                                .out = &s->out.dl,
                                .lse = c->with_lse ? &s->lse.dl : NULL};
}

static void pf_free(pf_setup *s) {
    plugin.vt->destroy(s->backend);
    fx_tensor *all[] = {&s->q, &s->k, &s->v, &s->out, &s->lse};
    for (int n = 0; n < 5; n++) fx_tensor_free(all[n]);
}

static ap_status pf_run(pf_setup *s, fx_msg *msg) {
    fx_msg_init(msg);
    ap_status status = plugin.vt->init_metadata(s->backend, &s->batch, NULL, &msg->buf);
    if (status != AP_OK) return status;
    return plugin.vt->forward_extend(s->backend, &s->layer, &s->args, NULL, &msg->buf);
}

/* The definition, dense in double. Query row j of sequence i (q_len rows, kv_len keys) sees key
 * p when kv_causal is 0, or p <= kv_len - q_len + j; real k/v = stored * scale for fp8:
 *   s_p = sm_scale * sum_d q[d] k_p[d],  out = sum_p softmax(s)_p v_p,  lse = log sum_p e^s_p
 * and out = 0, lse = -inf for a row that sees no key. */
static void pf_reference(const pf_setup *s, int i, int j, int h, double *out, double *lse) {
    const pf_case *c = &s->c;
    int token = s->qo_indptr[i] + j, first = s->kv_indptr[i];
    int kv_len = s->kv_indptr[i + 1] - first, q_len = c->q_len[i];
    int causal = c->implicit ? 1 : c->kv_causal;
    int visible = causal ? kv_len - q_len + j + 1 : kv_len;
    double k_scale = is_fp8(c->kv_dtype) ? s->layer.k_scale : 1.0;
    double v_scale = is_fp8(c->kv_dtype) ? s->layer.v_scale : 1.0;
    double *logits = malloc(sizeof(double) * (size_t)(visible > 0 ? visible : 1));
    double max_logit = -INFINITY, sum = 0.0;
    for (int p = 0; p < visible; p++) {
        double dot = 0.0;
        for (int d = 0; d < s->dk; d++)
            dot += (double)fx_tensor_get(&s->q, (int64_t[]){token, h, d}) *
                   (double)fx_tensor_get(&s->k, (int64_t[]){first + p, h, d}) * k_scale;
        logits[p] = (double)s->layer.sm_scale * dot;
        max_logit = logits[p] > max_logit ? logits[p] : max_logit;
    }
    for (int p = 0; p < visible; p++) sum += exp(logits[p] - max_logit);
    for (int d = 0; d < c->dv; d++) {
        double acc = 0.0;
        for (int p = 0; p < visible; p++)
            acc += exp(logits[p] - max_logit) *
                   (double)fx_tensor_get(&s->v, (int64_t[]){first + p, h, d}) * v_scale;
        out[d] = visible > 0 ? acc / sum : 0.0;
    }
    *lse = visible > 0 ? max_logit + log(sum) : -INFINITY;
    free(logits);
}

static void pf_describe(const pf_case *c, char *text, size_t size) {
    int n = snprintf(text, size, "q %s kv %s heads %d dims %d+%d/%d causal %d implicit %d seqs",
                     fx_dtype_name(c->q_dtype), fx_dtype_name(c->kv_dtype), c->heads, c->nope,
                     c->rope, c->dv, c->kv_causal, c->implicit);
    for (int i = 0; i < c->num_seqs && n > 0 && (size_t)n < size; i++)
        n += snprintf(text + n, size - (size_t)n, " (q %d kv %d)", c->q_len[i], c->kv_len[i]);
}

static void run_pf_case(const pf_case *c) {
    char label[512];
    pf_describe(c, label, sizeof label);
    pf_setup s;
    pf_build(&s, c);
    fx_msg msg;
    ap_status status = pf_run(&s, &msg);
    if (status != AP_OK) fail_msg("%s: status %d: %s", label, (int)status, msg.text);
    size_t count = (size_t)s.num_tokens * (size_t)c->heads * (size_t)c->dv;
    double *want = malloc(sizeof(double) * count), *got = malloc(sizeof(double) * count);
    for (int i = 0; i < c->num_seqs; i++)
        for (int j = 0; j < c->q_len[i]; j++)
            for (int h = 0; h < c->heads; h++) {
                int token = s.qo_indptr[i] + j;
                size_t at = ((size_t)token * (size_t)c->heads + (size_t)h) * (size_t)c->dv;
                double lse;
                pf_reference(&s, i, j, h, want + at, &lse);
                for (int d = 0; d < c->dv; d++)
                    got[at + (size_t)d] = fx_tensor_get(&s.out, (int64_t[]){token, h, d});
                if (!c->with_lse) continue;
                double value = fx_tensor_get(&s.lse, (int64_t[]){token, h});
                int ok = lse == -INFINITY ? value == -INFINITY
                                          : fabs(value - lse) <= 1e-5 * (1.0 + fabs(lse));
                if (!ok)
                    fail_msg("%s: lse[%d][%d] = %.9g, expected %.9g", label, token, h, value, lse);
            }
    for (size_t e = 0; e < count; e++)
        if (!isfinite(got[e])) fail_msg("%s: out element %zu is not finite", label, e);
    double err = fx_rel_l2(got, want, count);
    if (!(err < sc_tolerance(c->q_dtype)))
        fail_msg("%s: output relative L2 error %g >= %g", label, err, sc_tolerance(c->q_dtype));
    free(want);
    free(got);
    pf_free(&s);
}

/* DeepSeek-V3's prefill widths (qk 128 + 64, v 128), 16 heads. */
static pf_case pf_base(void) {
    pf_case c = {.q_dtype = AP_DTYPE_BF16,
                 .kv_dtype = AP_DTYPE_BF16,
                 .heads = 16,
                 .nope = 128,
                 .rope = 64,
                 .dv = 128,
                 .kv_causal = 1,
                 .with_lse = 1,
                 .num_seqs = 4,
                 .q_len = {1, 17, 6, 40},
                 .kv_len = {1, 17, 6, 40}};
    return c;
}

/* Causal over the new tokens themselves (kv_indptr = qo_indptr), and over more keys than rows. */
static void test_causal_new_tokens(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3};
    for (int k = 0; k < 2; k++) {
        pf_case c = pf_base();
        c.kv_dtype = kv_dtypes[k];
        run_pf_case(&c);
        c.q_dtype = AP_DTYPE_F32;
        c.kv_dtype = k ? AP_DTYPE_FP8_E4M3 : AP_DTYPE_F32;
        c.kv_len[1] = 30, c.kv_len[3] = 41; /* aligned to the end: the last row sees them all */
        run_pf_case(&c);
    }
    pf_case c = pf_base();
    c.implicit = 1; /* no kv_indptr: the MHA form over the new tokens */
    run_pf_case(&c);
}

/* A packed prefix chunk: every row sees every key, sequences with no key in the chunk get
 * out 0 and lse -inf. */
static void test_prefix_chunk(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3};
    for (int k = 0; k < 2; k++) {
        pf_case c = pf_base();
        c.kv_causal = 0;
        c.kv_dtype = kv_dtypes[k];
        int kv_lens[] = {64, 0, 3, 64};
        for (int i = 0; i < 4; i++) c.kv_len[i] = kv_lens[i];
        run_pf_case(&c);
        c.heads = 128;
        c.num_seqs = 2;
        c.with_lse = 0;
        run_pf_case(&c);
    }
    pf_case c = pf_base();
    c.kv_causal = 0;
    c.nope = 24, c.rope = 8, c.dv = 20, c.heads = 3;
    c.q_dtype = AP_DTYPE_F16;
    run_pf_case(&c);
}

/* Refusals that protect the buffers: nothing written. */
static void test_ragged_bad_input(void **state) {
    (void)state;
    for (int what = 0; what < 5; what++) {
        pf_case c = pf_base();
        pf_setup s;
        pf_build(&s, &c);
        ap_status want = AP_ERR_SHAPE_MISMATCH;
        if (what == 0) s.kv_indptr[2] = s.kv_indptr[1] - 1; /* decreasing */
        if (what == 1) s.batch.num_kv_tokens += 1;          /* does not match kv_indptr */
        if (what == 2) s.kv_indptr[1] = 0;                  /* causal: fewer keys than rows */
        if (what == 3) s.k.shape[0] -= 1;                   /* k shorter than the kv rows */
        if (what == 4) s.args.save_kv = 1, want = AP_ERR_INVALID_ARGUMENT;
        fx_msg msg;
        assert_int_equal(pf_run(&s, &msg), want);
        assert_true(msg.buf.length > 0);
        for (size_t b = 0; b < s.out.bytes; b++)
            assert_int_equal(((unsigned char *)s.out.buffer)[b], 0xFF);
        pf_free(&s);
    }
}

/* ---- a whole chunked prefill ---- */

#define CP_SEQS 3
#define CP_CHUNK 16

/* Sequences whose keys are k_nope [len][H][nope] ++ k_pe [len][rope] (one per token, broadcast
 * over heads) and values v [len][H][dv], all float; the first prefix[i] tokens are cached, the
 * rest are new. */
typedef struct cp_run {
    int fp8; /* prefix chunks packed to fp8 by pack_prefix_chunk_kv/1 */
    int heads, nope, rope, dv, dk;
    int prefix[CP_SEQS], q_len[CP_SEQS], start[CP_SEQS], total;
    float *k_nope, *k_pe, *v, *q; /* per sequence position; q per new token */
    double *k_real, *v_real;      /* what the passes see: fp8 prefix keys dequantized */
    float k_scale, v_scale;
    ap_backend *backend;
} cp_run;

static float *cp_at(float *base, int row, int width) {
    return base + (size_t)row * (size_t)width;
}

/* One forward_extend over the ragged source: `kv_rows[i]` rows of sequence i from `k`/`v`
 * (tensors of `dtype`, real = stored * scale for fp8), into out/lse. */
static void cp_forward(cp_run *r, const int *kv_rows, int causal, const fx_tensor *q,
                       const fx_tensor *k, const fx_tensor *v, fx_tensor *out, fx_tensor *lse,
                       float k_scale, float v_scale) {
    int32_t qo[CP_SEQS + 1] = {0}, kv[CP_SEQS + 1] = {0}, seq_lens[CP_SEQS];
    int max_q = 0;
    for (int i = 0; i < CP_SEQS; i++) {
        qo[i + 1] = qo[i] + r->q_len[i];
        kv[i + 1] = kv[i] + kv_rows[i];
        seq_lens[i] = r->prefix[i] + r->q_len[i];
        max_q = r->q_len[i] > max_q ? r->q_len[i] : max_q;
    }
    int max_seq = 0;
    for (int i = 0; i < CP_SEQS; i++) max_seq = seq_lens[i] > max_seq ? seq_lens[i] : max_seq;
    ap_batch batch = {.struct_size = sizeof batch,
                      .mode = AP_MODE_EXTEND,
                      .num_seqs = CP_SEQS,
                      .num_tokens = qo[CP_SEQS],
                      .max_q_len = max_q,
                      .max_seq_len = max_seq,
                      .qo_indptr = qo,
                      .seq_lens = seq_lens,
                      .qo_indptr_host = qo,
                      .seq_lens_host = seq_lens,
                      .kv_indptr = kv,
                      .kv_indptr_host = kv,
                      .num_kv_tokens = kv[CP_SEQS],
                      .kv_causal = causal};
    ap_layer layer = {.struct_size = sizeof layer,
                      .sm_scale = (float)(1.0 / sqrt((double)r->dk)),
                      .k_scale = k_scale,
                      .v_scale = v_scale,
                      .window_left = -1};
    ap_forward_args args = {.struct_size = sizeof args,
                            .q = &q->dl,
                            .k = &k->dl,
                            .v = &v->dl,
                            .out = &out->dl,
                            .lse = &lse->dl};
    fx_msg msg;
    fx_msg_init(&msg);
    ap_status status = plugin.vt->init_metadata(r->backend, &batch, NULL, &msg.buf);
    if (status == AP_OK)
        status = plugin.vt->forward_extend(r->backend, &layer, &args, NULL, &msg.buf);
    if (status != AP_OK) fail_msg("chunked prefill forward: %d %s", (int)status, msg.text);
}

/* Chunk c of every prefix: rows [c * CP_CHUNK, min((c + 1) * CP_CHUNK, prefix)), K packed as
 * [k_nope | k_pe] (by the pack hook into fp8, or as float32), attended non-causally. */
static void cp_chunk(cp_run *r, int chunk, const fx_tensor *q, fx_tensor *out, fx_tensor *lse) {
    int rows[CP_SEQS], n = 0;
    for (int i = 0; i < CP_SEQS; i++) {
        int first = chunk * CP_CHUNK, last = first + CP_CHUNK;
        last = last < r->prefix[i] ? last : r->prefix[i];
        rows[i] = last > first ? last - first : 0;
        n += rows[i];
    }
    int64_t h = r->heads;
    fx_tensor k_nope, k_pe, v, k, v_out;
    fx_tensor_make(&k_nope, AP_DTYPE_F32, 3, (int64_t[]){n, h, r->nope});
    fx_tensor_make(&k_pe, AP_DTYPE_F32, 2, (int64_t[]){n, r->rope});
    fx_tensor_make(&v, AP_DTYPE_F32, 3, (int64_t[]){n, h, r->dv});
    int row = 0;
    for (int i = 0; i < CP_SEQS; i++)
        for (int p = chunk * CP_CHUNK; p < chunk * CP_CHUNK + rows[i]; p++, row++) {
            int at = r->start[i] + p;
            for (int e = 0; e < r->heads * r->nope; e++)
                ((float *)k_nope.buffer)[row * r->heads * r->nope + e] =
                    cp_at(r->k_nope, at, r->heads * r->nope)[e];
            for (int e = 0; e < r->rope; e++)
                ((float *)k_pe.buffer)[row * r->rope + e] = cp_at(r->k_pe, at, r->rope)[e];
            for (int e = 0; e < r->heads * r->dv; e++)
                ((float *)v.buffer)[row * r->heads * r->dv + e] =
                    cp_at(r->v, at, r->heads * r->dv)[e];
        }
    ap_dtype kv_type = r->fp8 ? AP_DTYPE_FP8_E4M3 : AP_DTYPE_F32;
    fx_tensor_make(&k, kv_type, 3, (int64_t[]){n, h, r->dk});
    fx_tensor_make(&v_out, kv_type, 3, (int64_t[]){n, h, r->dv});
    if (r->fp8) {
        ap_pack_kv_args pack = {sizeof pack, &k_nope.dl, &k_pe.dl,   &v.dl,
                                &k.dl,       &v_out.dl,  r->k_scale, r->v_scale};
        ap_hook_pack_prefix_chunk_kv_v1 hook;
        void *found = plugin.vt->get_hook(r->backend, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1);
        memcpy(&hook, &found, sizeof hook);
        fx_msg msg;
        fx_msg_init(&msg);
        if (hook(r->backend, &pack, NULL, &msg.buf) != AP_OK) fail_msg("pack: %s", msg.text);
    } else {
        for (int a = 0; a < n; a++)
            for (int b = 0; b < r->heads; b++) {
                for (int d = 0; d < r->dk; d++)
                    fx_tensor_set(&k, (int64_t[]){a, b, d},
                                  d < r->nope ? fx_tensor_get(&k_nope, (int64_t[]){a, b, d})
                                              : fx_tensor_get(&k_pe, (int64_t[]){a, d - r->nope}));
                for (int d = 0; d < r->dv; d++)
                    fx_tensor_set(&v_out, (int64_t[]){a, b, d},
                                  fx_tensor_get(&v, (int64_t[]){a, b, d}));
            }
    }
    cp_forward(r, rows, 0, q, &k, &v_out, out, lse, r->fp8 ? r->k_scale : 1.0f,
               r->fp8 ? r->v_scale : 1.0f);
    fx_tensor *all[] = {&k_nope, &k_pe, &v, &k, &v_out};
    for (int e = 0; e < 5; e++) fx_tensor_free(all[e]);
}

/* Real key/value of (sequence position `at`, head h, dim d) as the passes see them. */
static void cp_real_values(cp_run *r) {
    r->k_real = malloc(sizeof(double) * (size_t)r->total * (size_t)(r->heads * r->dk));
    r->v_real = malloc(sizeof(double) * (size_t)r->total * (size_t)(r->heads * r->dv));
    for (int i = 0; i < CP_SEQS; i++)
        for (int p = 0; p < r->prefix[i] + r->q_len[i]; p++) {
            int at = r->start[i] + p, packed = r->fp8 && p < r->prefix[i];
            for (int h = 0; h < r->heads; h++) {
                for (int d = 0; d < r->dk; d++) {
                    float x = d < r->nope
                                  ? cp_at(r->k_nope, at, r->heads * r->nope)[h * r->nope + d]
                                  : cp_at(r->k_pe, at, r->rope)[d - r->nope];
                    r->k_real[((size_t)at * (size_t)r->heads + (size_t)h) * (size_t)r->dk +
                              (size_t)d] =
                        packed ? (double)fx_round_to(AP_DTYPE_FP8_E4M3, x / r->k_scale) * r->k_scale
                               : (double)x;
                }
                for (int d = 0; d < r->dv; d++) {
                    float x = cp_at(r->v, at, r->heads * r->dv)[h * r->dv + d];
                    r->v_real[((size_t)at * (size_t)r->heads + (size_t)h) * (size_t)r->dv +
                              (size_t)d] =
                        packed ? (double)fx_round_to(AP_DTYPE_FP8_E4M3, x / r->v_scale) * r->v_scale
                               : (double)x;
                }
            }
        }
}

/* The new tokens attended causally over themselves, each prefix chunk without a mask, merged in
 * place by merge_state/1: equal to one causal attention over prefix + new tokens. */
static void run_chunked_prefill(int fp8) {
    cp_run r = {.fp8 = fp8, .heads = 4, .nope = 32, .rope = 16, .dv = 24};
    r.dk = r.nope + r.rope;
    r.k_scale = 0.01f, r.v_scale = 0.008f;
    int prefixes[CP_SEQS] = {0, 23, 40}, q_lens[CP_SEQS] = {5, 9, 1};
    int new_rows = 0, max_prefix = 0;
    for (int i = 0; i < CP_SEQS; i++) {
        r.prefix[i] = prefixes[i], r.q_len[i] = q_lens[i];
        r.start[i] = r.total;
        r.total += r.prefix[i] + r.q_len[i];
        new_rows += r.q_len[i];
        max_prefix = r.prefix[i] > max_prefix ? r.prefix[i] : max_prefix;
    }
    r.k_nope = malloc(sizeof(float) * (size_t)(r.total * r.heads * r.nope));
    r.k_pe = malloc(sizeof(float) * (size_t)(r.total * r.rope));
    r.v = malloc(sizeof(float) * (size_t)(r.total * r.heads * r.dv));
    for (int e = 0; e < r.total * r.heads * r.nope; e++)
        r.k_nope[e] = (float)fx_rand_uniform(-1, 1);
    for (int e = 0; e < r.total * r.rope; e++) r.k_pe[e] = (float)fx_rand_uniform(-1, 1);
    for (int e = 0; e < r.total * r.heads * r.dv; e++) r.v[e] = (float)fx_rand_uniform(-1, 1);
    cp_real_values(&r);
    pf_case model_case = pf_base();
    model_case.q_dtype = AP_DTYPE_F32;
    model_case.heads = r.heads, model_case.nope = r.nope, model_case.rope = r.rope;
    model_case.dv = r.dv;
    ap_model model = pf_model(&model_case);
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->create(&model, NULL, NULL, &r.backend, &msg.buf) != AP_OK)
        fail_msg("create: %s", msg.text);
    int64_t t = new_rows, h = r.heads;
    fx_tensor q, k_new, v_new, out, lse, out_chunk, lse_chunk;
    fx_tensor_make(&q, AP_DTYPE_F32, 3, (int64_t[]){t, h, r.dk});
    fx_tensor_make(&k_new, AP_DTYPE_F32, 3, (int64_t[]){t, h, r.dk});
    fx_tensor_make(&v_new, AP_DTYPE_F32, 3, (int64_t[]){t, h, r.dv});
    fx_tensor_make(&out, AP_DTYPE_F32, 3, (int64_t[]){t, h, r.dv});
    fx_tensor_make(&lse, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    fx_tensor_make(&out_chunk, AP_DTYPE_F32, 3, (int64_t[]){t, h, r.dv});
    fx_tensor_make(&lse_chunk, AP_DTYPE_F32, 2, (int64_t[]){t, h});
    int token = 0;
    for (int i = 0; i < CP_SEQS; i++)
        for (int j = 0; j < r.q_len[i]; j++, token++) {
            size_t at = (size_t)(r.start[i] + r.prefix[i] + j) * (size_t)r.heads;
            for (int b = 0; b < r.heads; b++) {
                for (int d = 0; d < r.dk; d++) {
                    fx_tensor_set(&q, (int64_t[]){token, b, d}, (float)fx_rand_uniform(-2, 2));
                    fx_tensor_set(&k_new, (int64_t[]){token, b, d},
                                  (float)r.k_real[(at + (size_t)b) * (size_t)r.dk + (size_t)d]);
                }
                for (int d = 0; d < r.dv; d++)
                    fx_tensor_set(&v_new, (int64_t[]){token, b, d},
                                  (float)r.v_real[(at + (size_t)b) * (size_t)r.dv + (size_t)d]);
            }
        }
    cp_forward(&r, r.q_len, 1, &q, &k_new, &v_new, &out, &lse, 1.0f, 1.0f);
    ap_hook_merge_state_v1 merge;
    void *found = plugin.vt->get_hook(r.backend, AP_HOOK_MERGE_STATE_V1);
    memcpy(&merge, &found, sizeof merge);
    for (int chunk = 0; chunk * CP_CHUNK < max_prefix; chunk++) {
        cp_chunk(&r, chunk, &q, &out_chunk, &lse_chunk);
        ap_merge_state_args args = {sizeof args,   &out.dl, &lse.dl, &out_chunk.dl,
                                    &lse_chunk.dl, &out.dl, &lse.dl};
        fx_msg_init(&msg);
        if (merge(r.backend, &args, NULL, &msg.buf) != AP_OK) fail_msg("merge: %s", msg.text);
    }
    /* one causal attention over prefix + new tokens, dense in double */
    token = 0;
    double *row = malloc(sizeof(double) * (size_t)r.dv);
    double *logits = malloc(sizeof(double) * (size_t)r.total);
    double scale = 1.0 / sqrt((double)r.dk);
    for (int i = 0; i < CP_SEQS; i++)
        for (int j = 0; j < r.q_len[i]; j++, token++)
            for (int b = 0; b < r.heads; b++) {
                int visible = r.prefix[i] + j + 1;
                double max_logit = -INFINITY, sum = 0.0;
                for (int p = 0; p < visible; p++) {
                    size_t at = ((size_t)(r.start[i] + p) * (size_t)r.heads + (size_t)b);
                    double dot = 0.0;
                    for (int d = 0; d < r.dk; d++)
                        dot += (double)fx_tensor_get(&q, (int64_t[]){token, b, d}) *
                               r.k_real[at * (size_t)r.dk + (size_t)d];
                    logits[p] = scale * dot;
                    max_logit = logits[p] > max_logit ? logits[p] : max_logit;
                }
                for (int p = 0; p < visible; p++) sum += exp(logits[p] - max_logit);
                for (int d = 0; d < r.dv; d++) {
                    row[d] = 0.0;
                    for (int p = 0; p < visible; p++)
                        row[d] +=
                            exp(logits[p] - max_logit) / sum *
                            r.v_real[((size_t)(r.start[i] + p) * (size_t)r.heads + (size_t)b) *
                                         (size_t)r.dv +
                                     (size_t)d];
                    double got = fx_tensor_get(&out, (int64_t[]){token, b, d});
                    if (!(fabs(got - row[d]) <= 2e-5 * (1.0 + fabs(row[d]))))
                        fail_msg("fp8 %d: out[%d][%d][%d] = %.8g, expected %.8g", fp8, token, b, d,
                                 got, row[d]);
                }
                double lse_want = max_logit + log(sum);
                double lse_got = fx_tensor_get(&lse, (int64_t[]){token, b});
                if (!(fabs(lse_got - lse_want) <= 1e-5 * (1.0 + fabs(lse_want))))
                    fail_msg("fp8 %d: lse[%d][%d] = %.9g, expected %.9g", fp8, token, b, lse_got,
                             lse_want);
            }
    free(row), free(logits);
    fx_tensor *all[] = {&q, &k_new, &v_new, &out, &lse, &out_chunk, &lse_chunk};
    for (int e = 0; e < 7; e++) fx_tensor_free(all[e]);
    free(r.k_nope), free(r.k_pe), free(r.v), free(r.k_real), free(r.v_real);
    plugin.vt->destroy(r.backend);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    run_chunked_prefill(0);
    run_chunked_prefill(1);
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_causal_new_tokens),
        cmocka_unit_test(test_prefix_chunk),
        cmocka_unit_test(test_ragged_bad_input),
        cmocka_unit_test(test_chunked_prefill),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
