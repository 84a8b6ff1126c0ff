/* attention.c: forward_extend and forward_decode: the executable specification of attention. */
#include <math.h>
#include <stdlib.h>

#include "cpu_ref.h"

/* Where one call's keys and values come from (plugin_api.h's ap_batch and ap_forward_args). */
typedef enum cpu_form {
    CPU_FORM_PAGED,  /* MHA: the paged cache, K and V rows per KV head */
    CPU_FORM_LATENT, /* MLA absorbed: the paged latent cache, one 576-wide row [c | k_pe] per
                      * token shared by every query head; V is its first kv_lora_rank values */
    CPU_FORM_RAGGED  /* rows of args->k / args->v: ABI 1.1's ragged source (batch.kv_indptr),
                      * MLA's MHA form, or an embedding batch that skips the cache */
} cpu_form;

/* Everything one forward call reads, checked once. */
typedef struct cpu_attn {
    const ap_model *model;
    const ap_layer *layer;
    const cpu_plan *plan;
    const ap_kv_cache *kv; /* NULL in the ragged form */
    cpu_form form;
    int32_t dim_qk, dim_v;    /* one query/key row and one value row, in this form */
    int32_t q_width;          /* dims of a query row read from args->q; the rest from q_rope */
    int32_t kv_heads, group;  /* key/value heads, and query heads per key/value head */
    int causal;               /* 1: query row j sees keys up to kv_len - q_len + j */
    const int32_t *kv_indptr; /* ragged form: sequence i's rows of k/v */
    double k_scale, v_scale;  /* real key = stored * k_scale (1 unless stored as fp8) */
    cpu_view q, q_rope, out, lse, k, v;
    int has_q_rope, has_lse, has_k, has_v;
    float *keys;    /* [max_len][dim_qk]: one sequence's keys of one KV head, as stored */
    float *values;  /* [max_len][dim_v] */
    double *logits; /* [max_len] */
    double *q_row;  /* [dim_qk] */
    double *acc;    /* [dim_v] */
    float *row;     /* [dim_qk]: one new key or value row on its way to the cache */
} cpu_attn;

/* MLA's MHA form (chunked prefill): q is qk_nope + qk_rope wide with no q_rope beside it. */
static int cpu_attn_is_mla_mha_form(const ap_model *m, const ap_forward_args *args,
                                    ap_forward_mode mode) {
    int32_t width = m->qk_nope_head_dim + m->qk_rope_head_dim;
    return m->kind == AP_ATTN_MLA && mode == AP_MODE_EXTEND && args->q_rope == NULL &&
           args->q != NULL && args->q->ndim == 3 && args->q->shape != NULL &&
           m->qk_nope_head_dim > 0 && m->v_head_dim > 0 && width != m->head_dim_qk &&
           args->q->shape[2] == width;
}

/* The form, its row widths, heads, mask and the rows of the ragged source. */
static void cpu_attn_pick_form(cpu_attn *attn, const ap_forward_args *args, ap_forward_mode mode) {
    const ap_model *m = attn->model;
    const cpu_plan *plan = attn->plan;
    int mla = m->kind == AP_ATTN_MLA;
    attn->dim_qk = m->head_dim_qk;
    attn->dim_v = m->head_dim_v;
    attn->kv_heads = m->num_kv_heads;
    attn->causal = m->causal;
    attn->kv_indptr = plan->ragged ? plan->kv_indptr : plan->qo_indptr;
    int mha_form = cpu_attn_is_mla_mha_form(m, args, mode);
    if (plan->ragged || mha_form || (!mla && !args->save_kv && !plan->has_pages)) {
        attn->form = CPU_FORM_RAGGED;
        if (plan->ragged) attn->causal = plan->kv_causal;
        if (mla) {
            /* per-head K = [k_nope | k_pe] and V, as the pack hook writes them */
            attn->dim_qk = m->qk_nope_head_dim + m->qk_rope_head_dim;
            attn->dim_v = m->v_head_dim;
            attn->kv_heads = m->num_qo_heads;
        }
    } else {
        attn->form = mla ? CPU_FORM_LATENT : CPU_FORM_PAGED;
    }
    attn->has_q_rope = attn->form == CPU_FORM_LATENT && args->q_rope != NULL;
    attn->q_width = attn->has_q_rope ? m->kv_lora_rank : attn->dim_qk;
    attn->group = m->num_qo_heads / attn->kv_heads;
}

/* q (and q_rope), out and lse: [T][Hq][...], read where they are (any strides). */
static ap_status cpu_attn_check_query(cpu_attn *attn, const ap_forward_args *args, ap_msgbuf *msg) {
    const ap_model *m = attn->model;
    int64_t t = attn->plan->num_tokens, h = m->num_qo_heads;
    ap_status s = cpu_view_make(args->q, "q", &attn->q, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->q, "q", 3, (int64_t[]){t, h, attn->q_width}, msg);
    if (s == AP_OK && attn->has_q_rope)
        s = cpu_view_make(args->q_rope, "q_rope", &attn->q_rope, msg);
    if (s == AP_OK && attn->has_q_rope)
        s = cpu_view_expect(&attn->q_rope, "q_rope", 3,
                            (int64_t[]){t, h, attn->dim_qk - attn->q_width}, msg);
    if (s == AP_OK) s = cpu_view_make(args->out, "out", &attn->out, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->out, "out", 3, (int64_t[]){t, h, attn->dim_v}, msg);
    if (s != AP_OK) return s;
    if (!cpu_elem_is_float_activation(attn->q.elem) || attn->out.elem != attn->q.elem ||
        (attn->has_q_rope && attn->q_rope.elem != attn->q.elem)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: q (%s) must be float32, bfloat16 or float16, and q_rope and out "
                      "the same (out %s)",
                      cpu_elem_name(attn->q.elem), cpu_elem_name(attn->out.elem));
        return AP_ERR_INVALID_ARGUMENT;
    }
    attn->has_lse = args->lse != NULL;
    if (!attn->has_lse) return AP_OK;
    s = cpu_view_make(args->lse, "lse", &attn->lse, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->lse, "lse", 2, (int64_t[]){t, h}, msg);
    if (s == AP_OK && attn->lse.elem != CPU_ELEM_F32) {
        ap_msgbuf_add(msg, "cpu_ref: lse must be float32, not %s", cpu_elem_name(attn->lse.elem));
        s = AP_ERR_INVALID_ARGUMENT;
    }
    return s;
}

/* New keys/values: [T][Hkv][...] for the cache forms (latent: k [T][1][576] and no v); the
 * ragged form's [kv rows][Hkv][...], which may also be fp8 (as pack_prefix_chunk_kv/1 writes). */
static ap_status cpu_attn_check_kv_input(cpu_attn *attn, const ap_forward_args *args,
                                         ap_msgbuf *msg) {
    int64_t rows = attn->form == CPU_FORM_RAGGED ? attn->kv_indptr[attn->plan->num_seqs]
                                                 : attn->plan->num_tokens;
    attn->has_k = args->k != NULL;
    attn->has_v = args->v != NULL;
    if (attn->form == CPU_FORM_LATENT && attn->has_v) {
        ap_msgbuf_add(msg, "cpu_ref: MLA's absorbed form takes no v (V is the first kv_lora_rank "
                           "values of the latent row in k)");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (attn->form != CPU_FORM_LATENT && attn->has_k != attn->has_v) {
        ap_msgbuf_add(msg, "cpu_ref: k and v come together (one is NULL)");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status s = AP_OK;
    if (attn->has_k) s = cpu_view_make(args->k, "k", &attn->k, msg);
    if (s == AP_OK && attn->has_k)
        s = cpu_view_expect(&attn->k, "k", 3, (int64_t[]){rows, attn->kv_heads, attn->dim_qk}, msg);
    if (s == AP_OK && attn->has_v) s = cpu_view_make(args->v, "v", &attn->v, msg);
    if (s == AP_OK && attn->has_v)
        s = cpu_view_expect(&attn->v, "v", 3, (int64_t[]){rows, attn->kv_heads, attn->dim_v}, msg);
    if (s != AP_OK) return s;
    int fp8_ok = attn->form == CPU_FORM_RAGGED;
    int k_ok = !attn->has_k || cpu_elem_is_float_activation(attn->k.elem) ||
               (fp8_ok && cpu_elem_is_fp8(attn->k.elem));
    int v_ok = !attn->has_v || cpu_elem_is_float_activation(attn->v.elem) ||
               (fp8_ok && cpu_elem_is_fp8(attn->v.elem));
    if (!k_ok || !v_ok) {
        ap_msgbuf_add(msg, "cpu_ref: k and v must be float32, bfloat16 or float16%s (k %s, v %s)",
                      fp8_ok ? ", or fp8 in the ragged form" : "",
                      attn->has_k ? cpu_elem_name(attn->k.elem) : "none",
                      attn->has_v ? cpu_elem_name(attn->v.elem) : "none");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

/* The cache the form reads and writes, and the scales that turn stored values into real ones:
 *   paged:  K * k_scale, V * v_scale            (fp8; bf16/f16 caches ignore the scales)
 *   latent: the whole row [c | k_pe] * k_scale  (V = c is read with k_scale too; no v_scale)
 *   ragged: k * k_scale, v * v_scale            when k / v are fp8 tensors, else as given */
static ap_status cpu_attn_check_source(cpu_attn *attn, const ap_forward_args *args,
                                       ap_msgbuf *msg) {
    const cpu_plan *plan = attn->plan;
    const ap_layer *layer = attn->layer;
    if (attn->form == CPU_FORM_RAGGED) {
        if (args->save_kv || !attn->has_k) {
            ap_msgbuf_add(msg, "cpu_ref: %s",
                          args->save_kv ? "save_kv must be 0 when keys and values come from "
                                          "args->k/v (ragged source, MLA's MHA form, skip-KV)"
                                        : "a batch without page arrays needs k and v (ragged "
                                          "source, MLA's MHA form, embedding skip-KV mode)");
            return AP_ERR_INVALID_ARGUMENT;
        }
        attn->k_scale = cpu_elem_is_fp8(attn->k.elem) ? (double)layer->k_scale : 1.0;
        attn->v_scale = cpu_elem_is_fp8(attn->v.elem) ? (double)layer->v_scale : 1.0;
        if (!(attn->k_scale > 0.0 && attn->v_scale > 0.0 && isfinite(attn->k_scale) &&
              isfinite(attn->v_scale))) {
            ap_msgbuf_add(msg, "cpu_ref: fp8 k/v need finite scales > 0 (k %g, v %g)",
                          attn->k_scale, attn->v_scale);
            return AP_ERR_INVALID_ARGUMENT;
        }
        return AP_OK;
    }
    if (args->save_kv && (!plan->has_pages || !attn->has_k)) {
        ap_msgbuf_add(msg, "cpu_ref: save_kv needs the batch's page arrays and %s",
                      attn->form == CPU_FORM_LATENT ? "k (the new latent rows)" : "both k and v");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!plan->has_pages) {
        ap_msgbuf_add(msg, "cpu_ref: reading the KV cache needs the batch's page arrays");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status s = cpu_kv_check(attn->model, layer, msg);
    if (s == AP_OK) s = cpu_kv_check_pages(plan, layer->kv, msg);
    if (s != AP_OK) return s;
    attn->kv = layer->kv;
    attn->k_scale = cpu_kv_effective_scale(attn->kv->dtype, layer->k_scale);
    attn->v_scale = attn->form == CPU_FORM_LATENT
                        ? attn->k_scale
                        : cpu_kv_effective_scale(attn->kv->dtype, layer->v_scale);
    return AP_OK;
}

/* save_kv: token j of sequence i is at position prefix + j; it goes into slot
 * (page kv_page_indices[kv_page_indptr[i] + pos / page_size], offset pos % page_size),
 * quantized as the cache stores it (kv_store.c). The latent form writes the 576-wide row of k
 * (already rotated) with k_scale, and no V. */
static void cpu_attn_save_kv(const cpu_attn *attn) {
    float *row = attn->row;
    const cpu_plan *plan = attn->plan;
    const ap_kv_cache *kv = attn->kv;
    const ap_layer *layer = attn->layer;
    int latent = attn->form == CPU_FORM_LATENT;
    for (int32_t i = 0; i < plan->num_seqs; i++) {
        int32_t q_len = plan->qo_indptr[i + 1] - plan->qo_indptr[i];
        int32_t prefix = plan->seq_lens[i] - q_len;
        for (int32_t j = 0; j < q_len; j++) {
            int64_t token = plan->qo_indptr[i] + j;
            int64_t slot = cpu_kv_slot_of(plan, kv, i, prefix + j);
            for (int32_t h = 0; h < kv->num_kv_heads; h++) {
                for (int32_t d = 0; d < kv->head_dim_qk; d++)
                    row[d] = cpu_view_get(&attn->k, (int64_t[]){token, h, d});
                cpu_kv_store_row(kv->dtype, cpu_kv_k_row(kv, slot, h), row, kv->head_dim_qk,
                                 layer->k_scale);
                if (latent) continue;
                for (int32_t d = 0; d < kv->head_dim_v; d++)
                    row[d] = cpu_view_get(&attn->v, (int64_t[]){token, h, d});
                cpu_kv_store_row(kv->dtype, cpu_kv_v_row(kv, slot, h), row, kv->head_dim_v,
                                 layer->v_scale);
            }
        }
    }
}

/* Keys and values of sequence i, KV head g, rows [0, kv_len), as stored (fp8 without its scale):
 * from the paged cache, from the latent cache (V = the row's first dim_v values), or from the
 * sequence's rows of args->k / args->v. */
static void cpu_attn_gather(const cpu_attn *attn, int32_t i, int32_t g, int32_t kv_len) {
    for (int32_t p = 0; p < kv_len; p++) {
        float *key = attn->keys + (size_t)p * (size_t)attn->dim_qk;
        float *value = attn->values + (size_t)p * (size_t)attn->dim_v;
        if (attn->form == CPU_FORM_RAGGED) {
            int64_t row = attn->kv_indptr[i] + p;
            for (int32_t d = 0; d < attn->dim_qk; d++)
                key[d] = cpu_view_get(&attn->k, (int64_t[]){row, g, d});
            for (int32_t d = 0; d < attn->dim_v; d++)
                value[d] = cpu_view_get(&attn->v, (int64_t[]){row, g, d});
            continue;
        }
        int64_t slot = cpu_kv_slot_of(attn->plan, attn->kv, i, p);
        cpu_kv_load_row(attn->kv->dtype, cpu_kv_k_row(attn->kv, slot, g), key, attn->dim_qk);
        if (attn->form == CPU_FORM_LATENT)
            memcpy(value, key, (size_t)attn->dim_v * sizeof *value);
        else
            cpu_kv_load_row(attn->kv->dtype, cpu_kv_v_row(attn->kv, slot, g), value, attn->dim_v);
    }
}

/* One query row against the gathered keys/values of its KV head. For rows p < kv_len that the
 * mask keeps (causal: p <= q_pos; sliding window: p >= q_pos - window_left), where
 * q_pos = kv_len - q_len + j for query row j (the new tokens are the last rows of the sequence):
 *   s_p   = sm_scale * sum_d q_d * (K_pd * k_scale)        (fp8: K_pd * k_scale is the real key)
 *   s_p   = cap * tanh(s_p / cap)                           when logit_softcap cap > 0
 *   m     = max_p s_p,   w_p = exp(s_p - m),   l = sum_p w_p
 *   out_d = sum_p w_p * (V_pd * v_scale) / l
 *   lse   = m + log(l)                                      (natural log, of the scaled logits)
 * MLA absorbed: q = [q_nope | q_rope] (kv_lora_rank + qk_rope wide), K_p = the latent row
 * [c_p | k_pe_p], so s_p = sm_scale * k_scale * (q_nope . c_p + q_rope . k_pe_p), and
 * V_p = c_p with v_scale = k_scale: out is kv_lora_rank wide per head.
 * All in double: this is the oracle the GPU kernels are held to. A row the mask empties (no
 * keys) gets out = 0 and lse = -inf. */
static double cpu_attn_row(const cpu_attn *attn, int32_t q_pos, int32_t kv_len) {
    const ap_layer *layer = attn->layer;
    double cap = layer->logit_softcap;
    int32_t first = 0, last = kv_len - 1;
    if (attn->causal && q_pos < last) last = q_pos;
    if (layer->window_left >= 0 && q_pos - layer->window_left > first)
        first = q_pos - layer->window_left;
    for (int32_t d = 0; d < attn->dim_v; d++) attn->acc[d] = 0.0;
    if (first > last) return -INFINITY;
    double max_logit = -INFINITY;
    for (int32_t p = first; p <= last; p++) {
        const float *key = attn->keys + (size_t)p * (size_t)attn->dim_qk;
        double dot = 0.0;
        for (int32_t d = 0; d < attn->dim_qk; d++)
            dot += attn->q_row[d] * ((double)key[d] * attn->k_scale);
        double s = (double)layer->sm_scale * dot;
        if (cap > 0.0) s = cap * tanh(s / cap);
        attn->logits[p] = s;
        if (s > max_logit) max_logit = s;
    }
    double denom = 0.0;
    for (int32_t p = first; p <= last; p++) {
        double w = exp(attn->logits[p] - max_logit);
        const float *value = attn->values + (size_t)p * (size_t)attn->dim_v;
        denom += w;
        for (int32_t d = 0; d < attn->dim_v; d++)
            attn->acc[d] += w * ((double)value[d] * attn->v_scale);
    }
    for (int32_t d = 0; d < attn->dim_v; d++) attn->acc[d] /= denom;
    return max_logit + log(denom);
}

/* Query row (token, h): its first q_width dims from q, the rest (MLA's rope part) from q_rope. */
static void cpu_attn_load_query(const cpu_attn *attn, int64_t token, int32_t h) {
    for (int32_t d = 0; d < attn->q_width; d++)
        attn->q_row[d] = cpu_view_get(&attn->q, (int64_t[]){token, h, d});
    for (int32_t d = attn->q_width; d < attn->dim_qk; d++)
        attn->q_row[d] = cpu_view_get(&attn->q_rope, (int64_t[]){token, h, d - attn->q_width});
}

static int32_t cpu_attn_kv_len(const cpu_attn *attn, int32_t i) {
    if (attn->form == CPU_FORM_RAGGED) return attn->kv_indptr[i + 1] - attn->kv_indptr[i];
    return attn->plan->seq_lens[i];
}

/* Sequence i: query head h reads KV head h / group. */
static void cpu_attn_sequence(const cpu_attn *attn, int32_t i) {
    int32_t q_len = attn->plan->qo_indptr[i + 1] - attn->plan->qo_indptr[i];
    int32_t kv_len = cpu_attn_kv_len(attn, i);
    for (int32_t g = 0; g < attn->kv_heads; g++) {
        cpu_attn_gather(attn, i, g, kv_len);
        for (int32_t j = 0; j < q_len; j++) {
            int64_t token = attn->plan->qo_indptr[i] + j;
            for (int32_t h = g * attn->group; h < (g + 1) * attn->group; h++) {
                cpu_attn_load_query(attn, token, h);
                double lse = cpu_attn_row(attn, kv_len - q_len + j, kv_len);
                for (int32_t d = 0; d < attn->dim_v; d++)
                    cpu_view_set(&attn->out, (int64_t[]){token, h, d}, (float)attn->acc[d]);
                if (attn->has_lse) cpu_view_set(&attn->lse, (int64_t[]){token, h}, (float)lse);
            }
        }
    }
}

static ap_status cpu_attn_alloc(cpu_attn *attn, ap_msgbuf *msg) {
    size_t len = 1;
    for (int32_t i = 0; i < attn->plan->num_seqs; i++) {
        size_t kv_len = (size_t)cpu_attn_kv_len(attn, i);
        if (kv_len > len) len = kv_len;
    }
    size_t widest = (size_t)(attn->dim_qk > attn->dim_v ? attn->dim_qk : attn->dim_v);
    attn->keys = malloc(len * (size_t)attn->dim_qk * sizeof(float));
    attn->values = malloc(len * (size_t)attn->dim_v * sizeof(float));
    attn->logits = malloc(len * sizeof(double));
    attn->q_row = malloc(widest * sizeof(double));
    attn->acc = malloc(widest * sizeof(double));
    attn->row = malloc(widest * sizeof(float));
    if (attn->keys && attn->values && attn->logits && attn->q_row && attn->acc && attn->row)
        return AP_OK;
    ap_msgbuf_add(msg, "cpu_ref: out of host memory for a sequence of %zu keys", len);
    return AP_ERR_OUT_OF_MEMORY;
}

static void cpu_attn_free(cpu_attn *attn) {
    free(attn->keys);
    free(attn->values);
    free(attn->logits);
    free(attn->q_row);
    free(attn->acc);
    free(attn->row);
}

ap_status cpu_forward(ap_backend *backend, const ap_layer *layer, const ap_forward_args *args,
                      ap_forward_mode mode, ap_msgbuf *msg) {
    const cpu_plan *plan = &backend->plan;
    if (!plan->ready) {
        ap_msgbuf_add(msg, "cpu_ref: forward called without a successful init_metadata");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (plan->mode != mode) {
        ap_msgbuf_add(msg, "cpu_ref: forward_%s called on a batch planned as %s",
                      mode == AP_MODE_DECODE ? "decode" : "extend",
                      plan->mode == AP_MODE_DECODE ? "decode" : "extend");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (args == NULL || args->struct_size < offsetof(ap_forward_args, q_rope) + sizeof(void *) ||
        layer == NULL || layer->struct_size < sizeof(ap_layer)) {
        ap_msgbuf_add(msg, "cpu_ref: forward arguments or layer NULL or too old");
        return AP_ERR_INVALID_ARGUMENT;
    }
    cpu_attn attn = {.model = &backend->model, .layer = layer, .plan = plan};
    cpu_attn_pick_form(&attn, args, mode);
    if (attn.form != CPU_FORM_LATENT && args->q_rope != NULL) {
        ap_msgbuf_add(msg, "cpu_ref: q_rope belongs to MLA's absorbed form only");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status status = cpu_attn_check_query(&attn, args, msg);
    if (status == AP_OK) status = cpu_attn_check_kv_input(&attn, args, msg);
    if (status == AP_OK) status = cpu_attn_check_source(&attn, args, msg);
    if (status == AP_OK) status = cpu_attn_alloc(&attn, msg);
    if (status == AP_OK) {
        if (args->save_kv) cpu_attn_save_kv(&attn);
        for (int32_t i = 0; i < plan->num_seqs; i++) cpu_attn_sequence(&attn, i);
    }
    cpu_attn_free(&attn);
    return status;
}
