/* test_mla.c: cpu_ref's MLA absorbed attention (decode, and MTP verification as an extend batch)
 * over the paged latent cache, against a naive dense computation in double written here. */
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

#define MLA_MAX_SEQS 8

/* How q reaches the plugin. */
typedef enum mla_q_form {
    MLA_Q_SPLIT,   /* q_nope [T][H][r] and q_rope [T][H][p], two dense tensors */
    MLA_Q_STRIDED, /* both views into one [T][H][r + p + pad] buffer: read in place */
    MLA_Q_WHOLE    /* q [T][H][r + p], q_rope NULL */
} mla_q_form;

typedef struct mla_case {
    ap_dtype q_dtype, kv_dtype;
    int page_size, heads, rank, rope;
    mla_q_form q_form;
    int save_kv; /* the new tokens' latent rows come in args.k and are written by the call */
    int decode;  /* forward_decode (q_len 1 each); else an extend batch (MTP verification) */
    int with_lse;
    int num_seqs;
    int prefix[MLA_MAX_SEQS];
    int q_len[MLA_MAX_SEQS];
} mla_case;

typedef struct mla_setup {
    mla_case c;
    int width, num_tokens, num_pages, pages_used;
    ap_model model;
    ap_backend *backend;
    int32_t qo_indptr[MLA_MAX_SEQS + 1], page_indptr[MLA_MAX_SEQS + 1];
    int32_t last_len[MLA_MAX_SEQS], seq_lens[MLA_MAX_SEQS], *pages, *positions;
    int kv_start[MLA_MAX_SEQS];
    unsigned char *cache, *cache_expect;
    size_t cache_bytes;
    ap_batch batch;
    ap_kv_cache kv;
    ap_layer layer;
    fx_tensor q_all, q_rope_t, k, out, lse; /* q_all: the whole q buffer of every q form */
    DLTensor q_nope_view, q_rope_view;
    int64_t view_shapes[2][3]; /* the strided views' shapes */
    ap_forward_args args;
    double *q_ref;   /* [token][head][width] */
    double *lat_ref; /* [kv row][width]: the cache's rows, dequantized */
} mla_setup;

static int mla_is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

static void mla_describe(const mla_case *c, char *text, size_t size) {
    static const char *const forms[] = {"split", "strided", "whole"};
    int n = snprintf(
        text, size, "q %s kv %s page %d heads %d rank %d rope %d q %s save %d %s lse %d",
        fx_dtype_name(c->q_dtype), fx_dtype_name(c->kv_dtype), c->page_size, c->heads, c->rank,
        c->rope, forms[c->q_form], c->save_kv, c->decode ? "decode" : "mtp", c->with_lse);
    for (int i = 0; i < c->num_seqs && n > 0 && (size_t)n < size; i++)
        n += snprintf(text + n, size - (size_t)n, " (%d+%d)", c->prefix[i], c->q_len[i]);
}

/* Byte offset of value d of the latent row at position pos of sequence i: NHD with one head,
 * [page][slot][576], pages from the sequence's shuffled page list. */
static size_t mla_cache_offset(const mla_setup *s, int i, int pos, int d) {
    int page = s->pages[s->page_indptr[i] + pos / s->c.page_size];
    size_t slot = (size_t)page * (size_t)s->c.page_size + (size_t)(pos % s->c.page_size);
    return (slot * (size_t)s->width + (size_t)d) * fx_dtype_bytes(s->c.kv_dtype);
}

/* Sequences, shuffled pages (a few spare ones stay poisoned) and the batch. */
static void mla_layout(mla_setup *s) {
    const mla_case *c = &s->c;
    int rows = 0, max_q = 0, max_seq = 0;
    s->qo_indptr[0] = s->page_indptr[0] = 0;
    for (int i = 0; i < c->num_seqs; i++) {
        s->qo_indptr[i + 1] = s->qo_indptr[i] + c->q_len[i];
        s->seq_lens[i] = c->prefix[i] + c->q_len[i];
        s->kv_start[i] = rows;
        rows += s->seq_lens[i];
        int pages = (s->seq_lens[i] + c->page_size - 1) / c->page_size;
        s->page_indptr[i + 1] = s->page_indptr[i] + pages;
        s->last_len[i] = s->seq_lens[i] - (pages - 1) * c->page_size;
        max_q = c->q_len[i] > max_q ? c->q_len[i] : max_q;
        max_seq = s->seq_lens[i] > max_seq ? s->seq_lens[i] : max_seq;
    }
    s->num_tokens = s->qo_indptr[c->num_seqs];
    s->pages_used = s->page_indptr[c->num_seqs];
    s->num_pages = s->pages_used + 3;
    s->pages = malloc(sizeof(int32_t) * (size_t)s->num_pages);
    for (int p = 0; p < s->num_pages; p++) s->pages[p] = p;
    for (int p = s->num_pages - 1; p > 0; p--) {
        int other = fx_rand_int(0, p), keep = s->pages[p];
        s->pages[p] = s->pages[other];
        s->pages[other] = keep;
    }
    s->positions = malloc(sizeof(int32_t) * (size_t)s->num_tokens);
    for (int i = 0; i < c->num_seqs; i++)
        for (int j = 0; j < c->q_len[i]; j++) s->positions[s->qo_indptr[i] + j] = c->prefix[i] + j;
    s->cache_bytes = (size_t)s->num_pages * (size_t)c->page_size * (size_t)s->width *
                     fx_dtype_bytes(c->kv_dtype);
    s->cache = malloc(s->cache_bytes);
    s->cache_expect = malloc(s->cache_bytes);
    memset(s->cache, 0xA5, s->cache_bytes);
    memset(s->cache_expect, 0xA5, s->cache_bytes);
    s->lat_ref = malloc(sizeof(double) * (size_t)rows * (size_t)s->width);
    s->batch = (ap_batch){.struct_size = sizeof(ap_batch),
                          .mode = c->decode ? AP_MODE_DECODE : AP_MODE_EXTEND,
                          .num_seqs = c->num_seqs,
                          .num_tokens = s->num_tokens,
                          .max_q_len = max_q,
                          .max_seq_len = max_seq,
                          .num_pages_total = s->pages_used,
                          .qo_indptr = s->qo_indptr,
                          .kv_page_indptr = s->page_indptr,
                          .kv_page_indices = s->pages,
                          .kv_last_page_len = s->last_len,
                          .seq_lens = s->seq_lens,
                          .positions = s->positions,
                          .qo_indptr_host = s->qo_indptr,
                          .kv_page_indptr_host = s->page_indptr,
                          .kv_page_indices_host = s->pages,
                          .kv_last_page_len_host = s->last_len,
                          .seq_lens_host = s->seq_lens,
                          .positions_host = s->positions};
}

/* The query tensors of the case's q form; q_ref holds the values as the plugin reads them. */
static void mla_queries(mla_setup *s) {
    const mla_case *c = &s->c;
    int64_t t = s->num_tokens, h = c->heads;
    int whole = c->q_form != MLA_Q_SPLIT;
    fx_tensor_strided(&s->q_all, c->q_dtype, 3, (int64_t[]){t, h, whole ? s->width : c->rank},
                      c->q_form == MLA_Q_STRIDED ? 7 : 0, c->q_form == MLA_Q_STRIDED ? 5 : 0);
    if (!whole) fx_tensor_make(&s->q_rope_t, c->q_dtype, 3, (int64_t[]){t, h, c->rope});
    s->q_ref = malloc(sizeof(double) * (size_t)(t * h) * (size_t)s->width);
    for (int64_t a = 0; a < t; a++)
        for (int64_t b = 0; b < h; b++)
            for (int d = 0; d < s->width; d++) {
                float x = (float)fx_rand_uniform(-3.0, 3.0);
                fx_tensor *at = whole || d < c->rank ? &s->q_all : &s->q_rope_t;
                int64_t index[3] = {a, b, whole || d < c->rank ? d : d - c->rank};
                fx_tensor_set(at, index, x);
                s->q_ref[((size_t)a * (size_t)h + (size_t)b) * (size_t)s->width + (size_t)d] =
                    fx_tensor_get(at, index);
            }
    s->q_nope_view = s->q_all.dl;
    s->q_rope_view = whole ? s->q_all.dl : s->q_rope_t.dl;
    if (c->q_form != MLA_Q_STRIDED) return;
    /* two views of one padded buffer: q_nope its first rank values, q_rope the next rope ones */
    s->view_shapes[0][0] = s->view_shapes[1][0] = t;
    s->view_shapes[0][1] = s->view_shapes[1][1] = h;
    s->view_shapes[0][2] = c->rank;
    s->view_shapes[1][2] = c->rope;
    s->q_nope_view.shape = s->view_shapes[0];
    s->q_rope_view.shape = s->view_shapes[1];
    s->q_rope_view.byte_offset += (uint64_t)c->rank * fx_dtype_bytes(c->q_dtype);
}

/* Every latent row: random, stored as the cache stores it (fp8: saturate(x / k_scale), the
 * division in float32), its dequantized value kept for the reference. A new token's row goes
 * through args.k (so it carries k's rounding) when the call saves it. */
static void mla_latent_rows(mla_setup *s) {
    const mla_case *c = &s->c;
    float scale = s->layer.k_scale;
    if (c->save_kv) fx_tensor_make(&s->k, c->q_dtype, 3, (int64_t[]){s->num_tokens, 1, s->width});
    for (int i = 0; i < c->num_seqs; i++)
        for (int pos = 0; pos < s->seq_lens[i]; pos++)
            for (int d = 0; d < s->width; d++) {
                float x = (float)fx_rand_uniform(-1.0, 1.0);
                int is_new = pos >= c->prefix[i];
                if (is_new && c->save_kv) {
                    int64_t index[3] = {s->qo_indptr[i] + pos - c->prefix[i], 0, d};
                    fx_tensor_set(&s->k, index, x);
                    x = fx_tensor_get(&s->k, index);
                }
                unsigned char code[4];
                fx_encode(c->kv_dtype, code, mla_is_fp8(c->kv_dtype) ? x / scale : x);
                s->lat_ref[(size_t)(s->kv_start[i] + pos) * (size_t)s->width + (size_t)d] =
                    (double)fx_decode(c->kv_dtype, code) * (mla_is_fp8(c->kv_dtype) ? scale : 1.0);
                size_t at = mla_cache_offset(s, i, pos, d);
                memcpy(s->cache_expect + at, code, fx_dtype_bytes(c->kv_dtype));
                if (!(is_new && c->save_kv))
                    memcpy(s->cache + at, code, fx_dtype_bytes(c->kv_dtype));
            }
}

static void mla_build(mla_setup *s, const mla_case *c) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    s->width = c->rank + c->rope;
    s->model = (ap_model){.struct_size = sizeof(ap_model),
                          .name = "test/mla",
                          .kind = AP_ATTN_MLA,
                          .num_qo_heads = c->heads,
                          .num_kv_heads = 1,
                          .head_dim_qk = s->width,
                          .head_dim_v = c->rank,
                          .kv_lora_rank = c->rank,
                          .qk_rope_head_dim = c->rope,
                          .qk_nope_head_dim = 128,
                          .v_head_dim = 128,
                          .dtype = c->q_dtype,
                          .kv_dtype = c->kv_dtype,
                          .page_size = c->page_size,
                          .num_layers = 1,
                          .causal = 1,
                          .max_batch = MLA_MAX_SEQS,
                          .max_tokens = 4096,
                          .max_kv_len = 4096};
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin.vt->validate(&s->model, NULL, NULL, &msg.buf) != AP_OK ||
        plugin.vt->create(&s->model, NULL, NULL, &s->backend, &msg.buf) != AP_OK)
        fail_msg("validate/create refused MLA: %s", msg.text);
    mla_layout(s);
    s->kv = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                          .layout = AP_KV_LAYOUT_NHD,
                          .dtype = c->kv_dtype,
                          .page_size = c->page_size,
                          .num_pages = s->num_pages,
                          .num_kv_heads = 1,
                          .head_dim_qk = s->width,
                          .head_dim_v = c->rank,
                          .k_pages = s->cache,
                          .v_pages = NULL};
    int fp8 = mla_is_fp8(c->kv_dtype);
    s->layer = (ap_layer){.struct_size = sizeof(ap_layer),
                          .sm_scale = (float)(fx_rand_uniform(0.5, 1.5) / sqrt((double)s->width)),
                          .k_scale = fp8 ? (float)fx_rand_uniform(0.004, 0.02) : 1.0f,
                          /* never read by MLA: a value that would show if it were */
                          .v_scale = fp8 ? 1000.0f : 1.0f,
                          .window_left = -1,
                          .kv = &s->kv};
    mla_queries(s);
    mla_latent_rows(s);
    fx_tensor_make(&s->out, c->q_dtype, 3, (int64_t[]){s->num_tokens, c->heads, c->rank});
    memset(s->out.buffer, 0xFF, s->out.bytes);
    if (c->with_lse) {
        fx_tensor_make(&s->lse, AP_DTYPE_F32, 2, (int64_t[]){s->num_tokens, c->heads});
        memset(s->lse.buffer, 0xFF, s->lse.bytes);
    }
    s->args = (ap_forward_args){.struct_size = sizeof(ap_forward_args),
                                .q = &s->q_nope_view,
                                .k = c->save_kv ? &s->k.dl : NULL,
                                .v = NULL,
                                .out = &s->out.dl,
                                .lse = c->with_lse ? &s->lse.dl : NULL,
                                .save_kv = c->save_kv,
                                .q_rope = c->q_form == MLA_Q_WHOLE ? NULL : &s->q_rope_view};
}

static void mla_free(mla_setup *s) {
    plugin.vt->destroy(s->backend);
    free(s->pages);
    free(s->positions);
    free(s->cache);
    free(s->cache_expect);
    free(s->q_ref);
    free(s->lat_ref);
    fx_tensor *all[] = {&s->q_all, &s->q_rope_t, &s->k, &s->out, &s->lse};
    for (int n = 0; n < 5; n++) fx_tensor_free(all[n]);
}

static ap_status mla_run(mla_setup *s, fx_msg *msg) {
    fx_msg_init(msg);
    ap_status status = plugin.vt->init_metadata(s->backend, &s->batch, NULL, &msg->buf);
    if (status != AP_OK) return status;
    if (s->c.decode)
        return plugin.vt->forward_decode(s->backend, &s->layer, &s->args, NULL, &msg->buf);
    return plugin.vt->forward_extend(s->backend, &s->layer, &s->args, NULL, &msg->buf);
}

/* The definition, dense, in double: query row j of sequence i sits at position prefix + j and
 * sees positions 0 .. prefix + j of the sequence (causal among the new tokens too);
 *   s_p = sm_scale * sum_{d < rank + rope} q[d] * L_p[d]     (L_p: the dequantized latent row)
 *   out[d] = sum_p softmax(s)_p * L_p[d] for d < rank;  lse = log sum_p exp(s_p). */
static void mla_reference_row(const mla_setup *s, int i, int j, int h, double *out, double *lse) {
    const mla_case *c = &s->c;
    int token = s->qo_indptr[i] + j, visible = c->prefix[i] + j + 1;
    const double *q = s->q_ref + ((size_t)token * (size_t)c->heads + (size_t)h) * (size_t)s->width;
    double *logits = malloc(sizeof(double) * (size_t)visible);
    double max_logit = -INFINITY, sum = 0.0;
    for (int p = 0; p < visible; p++) {
        const double *row = s->lat_ref + (size_t)(s->kv_start[i] + p) * (size_t)s->width;
        double dot = 0.0;
        for (int d = 0; d < s->width; d++) dot += q[d] * row[d];
        logits[p] = (double)s->layer.sm_scale * dot;
        max_logit = logits[p] > max_logit ? logits[p] : max_logit;
    }
    for (int p = 0; p < visible; p++) sum += exp(logits[p] - max_logit);
    for (int d = 0; d < c->rank; d++) {
        double acc = 0.0;
        for (int p = 0; p < visible; p++)
            acc += exp(logits[p] - max_logit) *
                   s->lat_ref[(size_t)(s->kv_start[i] + p) * (size_t)s->width + (size_t)d];
        out[d] = acc / sum;
    }
    *lse = max_logit + log(sum);
    free(logits);
}

static void mla_check(const mla_setup *s, const char *label) {
    const mla_case *c = &s->c;
    size_t count = (size_t)s->num_tokens * (size_t)c->heads * (size_t)c->rank;
    double *want = malloc(sizeof(double) * count), *got = malloc(sizeof(double) * count);
    for (int i = 0; i < c->num_seqs; i++)
        for (int j = 0; j < c->q_len[i]; j++)
            for (int h = 0; h < c->heads; h++) {
                int token = s->qo_indptr[i] + j;
                size_t at = ((size_t)token * (size_t)c->heads + (size_t)h) * (size_t)c->rank;
                double lse;
                mla_reference_row(s, i, j, h, want + at, &lse);
                for (int d = 0; d < c->rank; d++) {
                    got[at + (size_t)d] = fx_tensor_get(&s->out, (int64_t[]){token, h, d});
                    if (!isfinite(got[at + (size_t)d]))
                        fail_msg("%s: out[%d][%d][%d] is not finite (unwritten?)", label, token, h,
                                 d);
                }
                double lse_got = c->with_lse ? fx_tensor_get(&s->lse, (int64_t[]){token, h}) : lse;
                if (!(fabs(lse_got - lse) <= 1e-5 * (1.0 + fabs(lse))))
                    fail_msg("%s: lse[%d][%d] = %.9g, expected %.9g", label, token, h, lse_got,
                             lse);
            }
    double err = fx_rel_l2(got, want, count);
    if (!(err < sc_tolerance(c->q_dtype)))
        fail_msg("%s: output relative L2 error %g >= %g", label, err, sc_tolerance(c->q_dtype));
    for (size_t b = 0; b < s->cache_bytes; b++)
        if (s->cache[b] != s->cache_expect[b])
            fail_msg("%s: cache byte %zu is 0x%02x, expected 0x%02x", label, b, s->cache[b],
                     s->cache_expect[b]);
    free(want);
    free(got);
}

static void run_mla_case(const mla_case *c) {
    char label[512];
    mla_describe(c, label, sizeof label);
    mla_setup s;
    mla_build(&s, c);
    fx_msg msg;
    ap_status status = mla_run(&s, &msg);
    if (status != AP_OK) fail_msg("%s: status %d: %s", label, (int)status, msg.text);
    mla_check(&s, label);
    mla_free(&s);
}

/* DeepSeek-V3's widths, 16 heads (128 at TP 1 / 8 GPUs), a mixed decode batch: a first token,
 * a page minus one, a page, a page plus one, and a few pages in. */
static mla_case mla_base(void) {
    mla_case c = {.q_dtype = AP_DTYPE_BF16,
                  .kv_dtype = AP_DTYPE_BF16,
                  .page_size = 64,
                  .heads = 16,
                  .rank = 512,
                  .rope = 64,
                  .q_form = MLA_Q_SPLIT,
                  .decode = 1,
                  .with_lse = 1,
                  .num_seqs = 5,
                  .prefix = {0, 62, 63, 64, 150},
                  .q_len = {1, 1, 1, 1, 1}};
    return c;
}

static void test_decode_pages_and_dtypes(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3};
    int page_sizes[] = {32, 64, 1, 7};
    for (int k = 0; k < 2; k++)
        for (int p = 0; p < 4; p++) {
            mla_case c = mla_base();
            c.kv_dtype = kv_dtypes[k];
            c.page_size = page_sizes[p];
            run_mla_case(&c);
            c.q_dtype = AP_DTYPE_F32; /* the tightest tolerance: only the cache quantizes */
            run_mla_case(&c);
        }
}

static void test_decode_q_forms(void **state) {
    (void)state;
    mla_q_form forms[] = {MLA_Q_SPLIT, MLA_Q_STRIDED, MLA_Q_WHOLE};
    for (int f = 0; f < 3; f++) {
        mla_case c = mla_base();
        c.q_form = forms[f];
        c.kv_dtype = AP_DTYPE_FP8_E4M3;
        run_mla_case(&c);
        c.q_dtype = AP_DTYPE_F16;
        c.with_lse = 0;
        run_mla_case(&c);
    }
}

/* 128 heads (DeepSeek-V3 at TP 1) and other latent widths. */
static void test_decode_heads_and_widths(void **state) {
    (void)state;
    mla_case c = mla_base();
    c.heads = 128;
    c.num_seqs = 2;
    c.prefix[0] = 70;
    run_mla_case(&c);
    c = mla_base();
    c.rank = 40;
    c.rope = 8;
    c.heads = 3;
    c.page_size = 5;
    c.q_form = MLA_Q_STRIDED;
    run_mla_case(&c);
}

/* The call writes the new tokens' latent rows (args.k, [T][1][576]) and attends over them. */
static void test_decode_save_kv(void **state) {
    (void)state;
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2, AP_DTYPE_F16};
    for (int k = 0; k < 4; k++) {
        mla_case c = mla_base();
        c.save_kv = 1;
        c.kv_dtype = kv_dtypes[k];
        c.page_size = k % 2 ? 32 : 64;
        run_mla_case(&c);
    }
}

/* MTP / speculative verification: 1..4 new tokens per sequence as an extend batch in the
 * absorbed form, causal among themselves and over the whole cached prefix. */
static void test_mtp_extend(void **state) {
    (void)state;
    for (int save = 0; save <= 1; save++)
        for (int k = 0; k < 2; k++) {
            mla_case c = mla_base();
            c.decode = 0;
            c.save_kv = save;
            c.kv_dtype = k ? AP_DTYPE_FP8_E4M3 : AP_DTYPE_BF16;
            c.page_size = k ? 32 : 64;
            c.q_form = save ? MLA_Q_STRIDED : MLA_Q_SPLIT;
            int q_lens[] = {1, 2, 3, 4, 4};
            int prefixes[] = {0, 61, 62, 30, 129};
            for (int i = 0; i < 5; i++) c.q_len[i] = q_lens[i], c.prefix[i] = prefixes[i];
            run_mla_case(&c);
        }
}

static void test_random_sweep(void **state) {
    (void)state;
    ap_dtype q_dtypes[] = {AP_DTYPE_F32, AP_DTYPE_BF16, AP_DTYPE_F16};
    ap_dtype kv_dtypes[] = {AP_DTYPE_BF16, AP_DTYPE_F16, AP_DTYPE_FP8_E4M3, AP_DTYPE_FP8_E5M2};
    int page_sizes[] = {1, 3, 32, 64};
    for (int iter = 0; iter < 12; iter++) {
        mla_case c = mla_base();
        c.q_dtype = q_dtypes[fx_rand_int(0, 2)];
        c.kv_dtype = kv_dtypes[fx_rand_int(0, 3)];
        c.page_size = page_sizes[fx_rand_int(0, 3)];
        c.heads = fx_rand_int(1, 8);
        c.rank = fx_rand_int(0, 1) ? 512 : fx_rand_int(1, 48);
        c.rope = fx_rand_int(0, 1) ? 64 : 2 * fx_rand_int(1, 8);
        c.q_form = (mla_q_form)fx_rand_int(0, 2);
        c.save_kv = fx_rand_int(0, 1);
        c.decode = fx_rand_int(0, 1);
        c.with_lse = fx_rand_int(0, 1);
        c.num_seqs = fx_rand_int(1, 4);
        for (int i = 0; i < c.num_seqs; i++) {
            c.prefix[i] = fx_rand_int(0, 3) == 0 ? 0 : fx_rand_int(1, 140);
            c.q_len[i] = c.decode ? 1 : fx_rand_int(1, 5);
        }
        run_mla_case(&c);
    }
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_pages_and_dtypes),
        cmocka_unit_test(test_decode_q_forms),
        cmocka_unit_test(test_decode_heads_and_widths),
        cmocka_unit_test(test_decode_save_kv),
        cmocka_unit_test(test_mtp_extend),
        cmocka_unit_test(test_random_sweep),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
