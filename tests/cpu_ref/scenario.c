/* scenario.c: builds one attention call for cpu_ref and its independent dense reference. */
#include "scenario.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "nvfp4_ref.h"

static int sc_is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

double sc_tolerance(ap_dtype q_dtype) {
    return q_dtype == AP_DTYPE_F32 ? 1e-5 : q_dtype == AP_DTYPE_F16 ? 1e-3 : 8e-3;
}

void sc_describe(const sc_case *c, char *text, size_t size) {
    int n = snprintf(text, size,
                     "q %s kv %s page %d kv_heads %d group %d dims %d/%d causal %d softcap %g "
                     "window %d save_kv %d decode %d skip_kv %d lse %d seqs",
                     fx_dtype_name(c->q_dtype), fx_dtype_name(c->kv_dtype), c->page_size,
                     c->num_kv_heads, c->group, c->head_dim_qk, c->head_dim_v, c->causal,
                     (double)c->softcap, c->window_left, c->save_kv, c->decode, c->skip_kv,
                     c->with_lse);
    for (int i = 0; i < c->num_seqs && n > 0 && (size_t)n < size; i++)
        n += snprintf(text + n, size - (size_t)n, " (%d+%d)", c->prefix[i], c->q_len[i]);
}

static void sc_model(sc_scenario *s) {
    const sc_case *c = &s->c;
    s->model = (ap_model){
        .struct_size = sizeof(ap_model),
        .name = "test/model",
        .kind = AP_ATTN_MHA,
        .num_qo_heads = s->num_qo_heads,
        .num_kv_heads = c->num_kv_heads,
        .head_dim_qk = c->head_dim_qk,
        .head_dim_v = c->head_dim_v,
        .dtype = c->q_dtype,
        .kv_dtype = c->kv_dtype,
        .page_size = c->page_size,
        .num_layers = 1,
        .causal = c->causal,
        .embedding = c->skip_kv,
        .max_batch = SC_MAX_SEQS,
        .max_tokens = 4096,
        .max_kv_len = 4096,
    };
}

/* Pages in a shuffled order, so a sequence's pages are neither contiguous nor ascending; a few
 * spare pages stay untouched (poisoned) to catch writes to the wrong page. */
static void sc_pages(sc_scenario *s) {
    const sc_case *c = &s->c;
    s->pages_used = 0;
    s->kv_page_indptr[0] = 0;
    for (int i = 0; i < c->num_seqs; i++) {
        int pages = (s->seq_lens[i] + c->page_size - 1) / c->page_size;
        s->kv_page_indptr[i + 1] = s->kv_page_indptr[i] + pages;
        s->last_page_len[i] = s->seq_lens[i] - (pages - 1) * c->page_size;
        s->pages_used += pages;
    }
    s->num_pages = s->pages_used + 3;
    int32_t *order = malloc(sizeof(int32_t) * (size_t)s->num_pages);
    for (int p = 0; p < s->num_pages; p++) order[p] = p;
    for (int p = s->num_pages - 1; p > 0; p--) {
        int other = fx_rand_int(0, p);
        int32_t keep = order[p];
        order[p] = order[other];
        order[other] = keep;
    }
    s->page_indices = order;
    size_t slots = (size_t)s->num_pages * (size_t)c->page_size * (size_t)c->num_kv_heads;
    size_t k_elems = slots * (size_t)c->head_dim_qk, v_elems = slots * (size_t)c->head_dim_v;
    int nvfp4 = c->kv_dtype == AP_DTYPE_NVFP4;
    s->k_bytes = nvfp4 ? k_elems / 2 : k_elems * fx_dtype_bytes(c->kv_dtype);
    s->v_bytes = nvfp4 ? v_elems / 2 : v_elems * fx_dtype_bytes(c->kv_dtype);
    s->k_scale_bytes = nvfp4 ? k_elems / 16 : 0;
    s->v_scale_bytes = nvfp4 ? v_elems / 16 : 0;
    unsigned char **buffers[8] = {&s->k_pages,         &s->v_pages,        &s->k_expect,
                                  &s->v_expect,        &s->k_scales,       &s->v_scales,
                                  &s->k_scales_expect, &s->v_scales_expect};
    size_t sizes[8] = {s->k_bytes,       s->v_bytes,       s->k_bytes,       s->v_bytes,
                       s->k_scale_bytes, s->v_scale_bytes, s->k_scale_bytes, s->v_scale_bytes};
    for (int b = 0; b < 8; b++) {
        if (sizes[b] == 0) continue;
        *buffers[b] = malloc(sizes[b]);
        memset(*buffers[b], 0xA5, sizes[b]);
    }
}

/* Byte offset of (position pos of sequence i, head g, dim d) in a cache of head dim `dim`:
 * NHD layout, [page][slot in page][head][dim]. */
static size_t sc_cache_offset(const sc_scenario *s, int i, int pos, int g, int d, int dim) {
    int page = s->page_indices[s->kv_page_indptr[i] + pos / s->c.page_size];
    size_t slot = (size_t)page * (size_t)s->c.page_size + (size_t)(pos % s->c.page_size);
    size_t index = (slot * (size_t)s->c.num_kv_heads + (size_t)g) * (size_t)dim + (size_t)d;
    return index * fx_dtype_bytes(s->c.kv_dtype);
}

/* One K or V element of position pos: a random value (through the input tensor for a new token,
 * so it carries the input's rounding), stored as the cache stores it, and its dequantized value
 * kept for the reference. */
static void sc_element(sc_scenario *s, int i, int pos, int g, int d, int is_v) {
    const sc_case *c = &s->c;
    int dim = is_v ? c->head_dim_v : c->head_dim_qk;
    fx_tensor *input = is_v ? &s->v : &s->k;
    double *ref = is_v ? s->v_ref : s->k_ref;
    float scale = is_v ? s->layer.v_scale : s->layer.k_scale;
    float x = (float)fx_rand_uniform(-1.0, 1.0);
    int prefix = c->skip_kv ? 0 : s->seq_lens[i] - c->q_len[i];
    if (pos >= prefix && input->buffer != NULL) {
        int64_t index[3] = {s->qo_indptr[i] + pos - prefix, g, d};
        fx_tensor_set(input, index, x);
        x = fx_tensor_get(input, index);
    }
    size_t at =
        ((size_t)(s->kv_start[i] + pos) * (size_t)c->num_kv_heads + (size_t)g) * (size_t)dim +
        (size_t)d;
    if (c->skip_kv) {
        ref[at] = x;
        return;
    }
    unsigned char code[4];
    /* fp8: saturate(x / scale), the division in float; bf16/f16: x rounded */
    fx_encode(c->kv_dtype, code, sc_is_fp8(c->kv_dtype) ? x / scale : x);
    ref[at] = (double)fx_decode(c->kv_dtype, code) * (sc_is_fp8(c->kv_dtype) ? scale : 1.0);
    size_t offset = sc_cache_offset(s, i, pos, g, d, dim);
    size_t elem = fx_dtype_bytes(c->kv_dtype);
    memcpy((is_v ? s->v_expect : s->k_expect) + offset, code, elem);
    if (pos < prefix || !c->save_kv) memcpy((is_v ? s->v_pages : s->k_pages) + offset, code, elem);
}

/* nvfp4: one (position, head) row of K or V drawn as sc_element draws it, then quantized block
 * by block with the tests' own quantizer (nvfp4_ref.c) and its global scale; the reference
 * keeps the dequantized values. */
static void sc_nvfp4_row(sc_scenario *s, int i, int pos, int g, int is_v) {
    const sc_case *c = &s->c;
    int dim = is_v ? c->head_dim_v : c->head_dim_qk;
    fx_tensor *input = is_v ? &s->v : &s->k;
    float global = is_v ? s->layer.v_scale : s->layer.k_scale;
    int prefix = s->seq_lens[i] - c->q_len[i];
    int page = s->page_indices[s->kv_page_indptr[i] + pos / c->page_size];
    size_t slot = (size_t)page * (size_t)c->page_size + (size_t)(pos % c->page_size);
    size_t index = (slot * (size_t)c->num_kv_heads + (size_t)g) * (size_t)dim;
    size_t at =
        ((size_t)(s->kv_start[i] + pos) * (size_t)c->num_kv_heads + (size_t)g) * (size_t)dim;
    float block[16];
    for (int b = 0; b < dim / 16; b++) {
        for (int d = 0; d < 16; d++) {
            block[d] = (float)fx_rand_uniform(-1.0, 1.0);
            if (pos >= prefix && input->buffer != NULL) {
                int64_t where[3] = {s->qo_indptr[i] + pos - prefix, g, b * 16 + d};
                fx_tensor_set(input, where, block[d]);
                block[d] = fx_tensor_get(input, where);
            }
        }
        uint8_t packed[8];
        uint8_t scale = nr_quantize_block(block, global, packed);
        for (int d = 0; d < 16; d++)
            (is_v ? s->v_ref : s->k_ref)[at + (size_t)(b * 16 + d)] =
                nr_dequantize(packed, scale, global, d);
        size_t byte = index / 2 + (size_t)b * 8, scale_at = index / 16 + (size_t)b;
        memcpy((is_v ? s->v_expect : s->k_expect) + byte, packed, 8);
        (is_v ? s->v_scales_expect : s->k_scales_expect)[scale_at] = scale;
        if (pos < prefix || !c->save_kv) {
            memcpy((is_v ? s->v_pages : s->k_pages) + byte, packed, 8);
            (is_v ? s->v_scales : s->k_scales)[scale_at] = scale;
        }
    }
}

static void sc_tensors(sc_scenario *s) {
    const sc_case *c = &s->c;
    int64_t q_shape[3] = {s->num_tokens, s->num_qo_heads, c->head_dim_qk};
    int64_t out_shape[3] = {s->num_tokens, s->num_qo_heads, c->head_dim_v};
    int64_t lse_shape[2] = {s->num_tokens, s->num_qo_heads};
    int64_t k_shape[3] = {s->num_tokens, c->num_kv_heads, c->head_dim_qk};
    int64_t v_shape[3] = {s->num_tokens, c->num_kv_heads, c->head_dim_v};
    fx_tensor_make(&s->q, c->q_dtype, 3, q_shape);
    fx_tensor_make(&s->out, c->q_dtype, 3, out_shape);
    memset(s->out.buffer, 0xFF, s->out.bytes); /* NaN in every float type: unwritten shows */
    if (c->with_lse) {
        fx_tensor_make(&s->lse, AP_DTYPE_F32, 2, lse_shape);
        memset(s->lse.buffer, 0xFF, s->lse.bytes);
    }
    if (c->save_kv || c->skip_kv) {
        fx_tensor_make(&s->k, c->q_dtype, 3, k_shape);
        fx_tensor_make(&s->v, c->q_dtype, 3, v_shape);
    }
    for (int t = 0; t < s->num_tokens; t++)
        for (int h = 0; h < s->num_qo_heads; h++)
            for (int d = 0; d < c->head_dim_qk; d++)
                fx_tensor_set(&s->q, (int64_t[]){t, h, d}, (float)fx_rand_uniform(-3.0, 3.0));
}

static void sc_batch(sc_scenario *s) {
    const sc_case *c = &s->c;
    int max_q = 0, max_seq = 0;
    s->positions = malloc(sizeof(int32_t) * (size_t)(s->num_tokens > 0 ? s->num_tokens : 1));
    for (int i = 0; i < c->num_seqs; i++) {
        for (int j = 0; j < c->q_len[i]; j++) s->positions[s->qo_indptr[i] + j] = c->prefix[i] + j;
        if (c->q_len[i] > max_q) max_q = c->q_len[i];
        if (s->seq_lens[i] > max_seq) max_seq = s->seq_lens[i];
    }
    int paged = !c->skip_kv;
    s->batch = (ap_batch){
        .struct_size = sizeof(ap_batch),
        .mode = c->decode ? AP_MODE_DECODE : AP_MODE_EXTEND,
        .num_seqs = c->num_seqs,
        .num_tokens = s->num_tokens,
        .max_q_len = max_q,
        .max_seq_len = max_seq,
        .num_pages_total = paged ? s->pages_used : 0,
        .qo_indptr = s->qo_indptr,
        .kv_page_indptr = paged ? s->kv_page_indptr : NULL,
        .kv_page_indices = paged ? s->page_indices : NULL,
        .kv_last_page_len = paged ? s->last_page_len : NULL,
        .seq_lens = s->seq_lens,
        .positions = s->positions,
        .qo_indptr_host = s->qo_indptr,
        .kv_page_indptr_host = paged ? s->kv_page_indptr : NULL,
        .kv_page_indices_host = paged ? s->page_indices : NULL,
        .kv_last_page_len_host = paged ? s->last_page_len : NULL,
        .seq_lens_host = s->seq_lens,
        .positions_host = s->positions,
    };
}

int sc_build(sc_scenario *s, const fx_plugin *plugin, const sc_case *c) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    s->num_qo_heads = c->num_kv_heads * c->group;
    s->qo_indptr[0] = 0;
    int kv_rows = 0;
    for (int i = 0; i < c->num_seqs; i++) {
        s->qo_indptr[i + 1] = s->qo_indptr[i] + c->q_len[i];
        s->seq_lens[i] = c->skip_kv ? c->q_len[i] : c->prefix[i] + c->q_len[i];
        s->kv_start[i] = kv_rows;
        kv_rows += s->seq_lens[i];
    }
    s->num_tokens = s->qo_indptr[c->num_seqs];
    sc_model(s);
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin->vt->validate(&s->model, NULL, NULL, &msg.buf) != AP_OK ||
        plugin->vt->create(&s->model, NULL, NULL, &s->backend, &msg.buf) != AP_OK) {
        print_error("validate/create refused: %s\n", msg.text);
        return -1;
    }
    int fp8 = sc_is_fp8(c->kv_dtype), nvfp4 = c->kv_dtype == AP_DTYPE_NVFP4;
    s->layer = (ap_layer){
        .struct_size = sizeof(ap_layer),
        .layer_id = 0,
        .sm_scale = (float)(fx_rand_uniform(0.5, 1.5) / sqrt((double)c->head_dim_qk)),
        .logit_softcap = c->softcap,
        /* nvfp4's global scale: block scales amax / (6 g) of about 40 .. 170, inside e4m3 */
        .k_scale = fp8     ? (float)fx_rand_uniform(0.004, 0.02)
                   : nvfp4 ? (float)fx_rand_uniform(0.001, 0.004)
                           : 1.0f,
        .v_scale = fp8     ? (float)fx_rand_uniform(0.004, 0.02)
                   : nvfp4 ? (float)fx_rand_uniform(0.001, 0.004)
                           : 1.0f,
        .window_left = c->window_left,
        .kv = c->skip_kv ? NULL : &s->kv,
    };
    if (!c->skip_kv) sc_pages(s);
    s->kv = (ap_kv_cache){
        .struct_size = sizeof(ap_kv_cache),
        .layout = AP_KV_LAYOUT_NHD,
        .dtype = c->kv_dtype,
        .page_size = c->page_size,
        .num_pages = s->num_pages,
        .num_kv_heads = c->num_kv_heads,
        .head_dim_qk = c->head_dim_qk,
        .head_dim_v = c->head_dim_v,
        .k_pages = s->k_pages,
        .v_pages = s->v_pages,
        .k_block_scales = s->k_scales,
        .v_block_scales = s->v_scales,
    };
    sc_tensors(s);
    size_t rows = (size_t)kv_rows * (size_t)c->num_kv_heads;
    s->k_ref = malloc(sizeof(double) * (rows * (size_t)c->head_dim_qk + 1));
    s->v_ref = malloc(sizeof(double) * (rows * (size_t)c->head_dim_v + 1));
    for (int i = 0; i < c->num_seqs; i++)
        for (int pos = 0; pos < s->seq_lens[i]; pos++)
            for (int g = 0; g < c->num_kv_heads; g++) {
                if (nvfp4 && !c->skip_kv) {
                    sc_nvfp4_row(s, i, pos, g, 0);
                    sc_nvfp4_row(s, i, pos, g, 1);
                    continue;
                }
                for (int d = 0; d < c->head_dim_qk; d++) sc_element(s, i, pos, g, d, 0);
                for (int d = 0; d < c->head_dim_v; d++) sc_element(s, i, pos, g, d, 1);
            }
    sc_batch(s);
    s->args = (ap_forward_args){
        .struct_size = sizeof(ap_forward_args),
        .q = &s->q.dl,
        .k = s->k.buffer != NULL ? &s->k.dl : NULL,
        .v = s->v.buffer != NULL ? &s->v.dl : NULL,
        .out = &s->out.dl,
        .lse = c->with_lse ? &s->lse.dl : NULL,
        .save_kv = c->save_kv,
    };
    return 0;
}

ap_status sc_run(sc_scenario *s, const fx_plugin *plugin, fx_msg *msg) {
    fx_msg_init(msg);
    ap_status status = plugin->vt->init_metadata(s->backend, &s->batch, NULL, &msg->buf);
    if (status != AP_OK) return status;
    if (s->c.decode)
        return plugin->vt->forward_decode(s->backend, &s->layer, &s->args, NULL, &msg->buf);
    return plugin->vt->forward_extend(s->backend, &s->layer, &s->args, NULL, &msg->buf);
}

/* Dense attention in double, one (token, head) at a time, straight from the definition:
 * logits over the positions the masks allow, optional softcap, softmax, weighted sum of V. */
static void sc_reference_row(sc_scenario *s, int i, int j, int h, double *logits) {
    const sc_case *c = &s->c;
    int token = s->qo_indptr[i] + j;
    int g = h / c->group;
    int kv_len = s->seq_lens[i];
    int q_pos = kv_len - c->q_len[i] + j;
    double max_logit = -INFINITY;
    for (int p = 0; p < kv_len; p++) {
        int allowed =
            (!c->causal || p <= q_pos) && (c->window_left < 0 || p >= q_pos - c->window_left);
        logits[p] = -INFINITY;
        if (!allowed) continue;
        double dot = 0.0;
        const double *key =
            s->k_ref + ((size_t)(s->kv_start[i] + p) * (size_t)c->num_kv_heads + (size_t)g) *
                           (size_t)c->head_dim_qk;
        for (int d = 0; d < c->head_dim_qk; d++)
            dot += (double)fx_tensor_get(&s->q, (int64_t[]){token, h, d}) * key[d];
        double logit = (double)s->layer.sm_scale * dot;
        if (c->softcap > 0) logit = c->softcap * tanh(logit / c->softcap);
        logits[p] = logit;
        if (logit > max_logit) max_logit = logit;
    }
    double sum = 0.0;
    for (int p = 0; p < kv_len; p++) sum += exp(logits[p] - max_logit); /* exp(-inf) = 0 */
    double *out =
        s->out_ref + ((size_t)token * (size_t)s->num_qo_heads + (size_t)h) * (size_t)c->head_dim_v;
    for (int d = 0; d < c->head_dim_v; d++) {
        double acc = 0.0;
        for (int p = 0; p < kv_len; p++) {
            const double *value =
                s->v_ref + ((size_t)(s->kv_start[i] + p) * (size_t)c->num_kv_heads + (size_t)g) *
                               (size_t)c->head_dim_v;
            acc += exp(logits[p] - max_logit) * value[d];
        }
        out[d] = acc / sum;
    }
    s->lse_ref[(size_t)token * (size_t)s->num_qo_heads + (size_t)h] = max_logit + log(sum);
}

void sc_reference(sc_scenario *s) {
    const sc_case *c = &s->c;
    size_t rows = (size_t)s->num_tokens * (size_t)s->num_qo_heads;
    s->out_ref = malloc(sizeof(double) * (rows * (size_t)c->head_dim_v + 1));
    s->lse_ref = malloc(sizeof(double) * (rows + 1));
    int longest = 1;
    for (int i = 0; i < c->num_seqs; i++)
        longest = s->seq_lens[i] > longest ? s->seq_lens[i] : longest;
    double *logits = malloc(sizeof(double) * (size_t)longest);
    for (int i = 0; i < c->num_seqs; i++)
        for (int j = 0; j < c->q_len[i]; j++)
            for (int h = 0; h < s->num_qo_heads; h++) sc_reference_row(s, i, j, h, logits);
    free(logits);
}

/* `per_byte` elements per byte (nvfp4 values 2, its block scales 16), else `elem_bytes` per
 * element. */
static void sc_check_cache(const unsigned char *got, const unsigned char *want, size_t bytes,
                           size_t per_byte, size_t elem_bytes, const char *what,
                           const char *label) {
    for (size_t b = 0; b < bytes; b++)
        if (got[b] != want[b])
            fail_msg("%s: %s cache byte %zu is 0x%02x, expected 0x%02x (element %zu)", label, what,
                     b, got[b], want[b], per_byte > 0 ? b * per_byte : b / elem_bytes);
}

void sc_check(sc_scenario *s) {
    const sc_case *c = &s->c;
    char label[512];
    sc_describe(c, label, sizeof label);
    sc_reference(s);
    size_t count = (size_t)s->num_tokens * (size_t)s->num_qo_heads * (size_t)c->head_dim_v;
    double *got = malloc(sizeof(double) * (count + 1));
    size_t n = 0;
    for (int t = 0; t < s->num_tokens; t++)
        for (int h = 0; h < s->num_qo_heads; h++)
            for (int d = 0; d < c->head_dim_v; d++) {
                got[n] = fx_tensor_get(&s->out, (int64_t[]){t, h, d});
                if (!isfinite(got[n]))
                    fail_msg("%s: out[%d][%d][%d] = %g (not written?)", label, t, h, d, got[n]);
                n++;
            }
    double err = fx_rel_l2(got, s->out_ref, count);
    if (!(err < sc_tolerance(c->q_dtype)))
        fail_msg("%s: output relative L2 error %g >= %g", label, err, sc_tolerance(c->q_dtype));
    free(got);
    if (c->with_lse)
        for (int t = 0; t < s->num_tokens; t++)
            for (int h = 0; h < s->num_qo_heads; h++) {
                double want = s->lse_ref[(size_t)t * (size_t)s->num_qo_heads + (size_t)h];
                double value = fx_tensor_get(&s->lse, (int64_t[]){t, h});
                if (!(fabs(value - want) <= 1e-5 * (1.0 + fabs(want))))
                    fail_msg("%s: lse[%d][%d] = %.9g, expected %.9g", label, t, h, value, want);
            }
    if (!c->skip_kv) {
        size_t per_byte = c->kv_dtype == AP_DTYPE_NVFP4 ? 2 : 0;
        size_t elem = fx_dtype_bytes(c->kv_dtype);
        sc_check_cache(s->k_pages, s->k_expect, s->k_bytes, per_byte, elem, "K", label);
        sc_check_cache(s->v_pages, s->v_expect, s->v_bytes, per_byte, elem, "V", label);
        sc_check_cache(s->k_scales, s->k_scales_expect, s->k_scale_bytes, 16, 1, "K block-scale",
                       label);
        sc_check_cache(s->v_scales, s->v_scales_expect, s->v_scale_bytes, 16, 1, "V block-scale",
                       label);
    }
}

void sc_free(sc_scenario *s, const fx_plugin *plugin) {
    if (s->backend != NULL) plugin->vt->destroy(s->backend);
    free(s->page_indices);
    free(s->positions);
    free(s->k_pages);
    free(s->v_pages);
    free(s->k_expect);
    free(s->v_expect);
    free(s->k_scales);
    free(s->v_scales);
    free(s->k_scales_expect);
    free(s->v_scales_expect);
    free(s->k_ref);
    free(s->v_ref);
    free(s->out_ref);
    free(s->lse_ref);
    fx_tensor_free(&s->q);
    fx_tensor_free(&s->k);
    fx_tensor_free(&s->v);
    fx_tensor_free(&s->out);
    fx_tensor_free(&s->lse);
    memset(s, 0, sizeof *s);
}
