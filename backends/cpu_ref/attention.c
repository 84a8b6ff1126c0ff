/* attention.c: forward_extend and forward_decode: the executable specification of attention. */
#include <math.h>
#include <stdlib.h>

#include "cpu_ref.h"

/* Everything one forward call reads, checked once. */
typedef struct cpu_attn {
    const ap_model *model;
    const ap_layer *layer;
    const cpu_plan *plan;
    const ap_kv_cache *kv; /* NULL in embedding skip-KV mode */
    cpu_view q, out, lse, k, v;
    int has_lse, has_kv_input, skip_kv;
    float *keys;    /* [max_len][head_dim_qk]: one sequence's keys of one KV head, as stored */
    float *values;  /* [max_len][head_dim_v] */
    double *logits; /* [max_len] */
    double *q_row;  /* [head_dim_qk] */
    double *acc;    /* [head_dim_v] */
    float *row;     /* [max(head_dim_qk, head_dim_v)]: one new k or v row on its way to the cache */
} cpu_attn;

/* Shapes of the forward's tensors against the model and the planned batch (plugin_api.h's
 * ap_forward_args comment). */
static ap_status cpu_attn_check_tensors(cpu_attn *attn, const ap_forward_args *args,
                                        ap_msgbuf *msg) {
    const ap_model *m = attn->model;
    int64_t t = attn->plan->num_tokens;
    int64_t q_shape[3] = {t, m->num_qo_heads, m->head_dim_qk};
    int64_t out_shape[3] = {t, m->num_qo_heads, m->head_dim_v};
    int64_t lse_shape[2] = {t, m->num_qo_heads};
    int64_t k_shape[3] = {t, m->num_kv_heads, m->head_dim_qk};
    int64_t v_shape[3] = {t, m->num_kv_heads, m->head_dim_v};
    ap_status s = cpu_view_make(args->q, "q", &attn->q, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->q, "q", 3, q_shape, msg);
    if (s == AP_OK) s = cpu_view_make(args->out, "out", &attn->out, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->out, "out", 3, out_shape, msg);
    if (s != AP_OK) return s;
    if (!cpu_elem_is_float_activation(attn->q.elem) || attn->out.elem != attn->q.elem) {
        ap_msgbuf_add(msg,
                      "cpu_ref: q (%s) must be float32, bfloat16 or float16 and out the same "
                      "(%s)",
                      cpu_elem_name(attn->q.elem), cpu_elem_name(attn->out.elem));
        return AP_ERR_INVALID_ARGUMENT;
    }
    attn->has_lse = args->lse != NULL;
    if (attn->has_lse) {
        s = cpu_view_make(args->lse, "lse", &attn->lse, msg);
        if (s == AP_OK) s = cpu_view_expect(&attn->lse, "lse", 2, lse_shape, msg);
        if (s == AP_OK && attn->lse.elem != CPU_ELEM_F32) {
            ap_msgbuf_add(msg, "cpu_ref: lse must be float32, not %s",
                          cpu_elem_name(attn->lse.elem));
            s = AP_ERR_INVALID_ARGUMENT;
        }
        if (s != AP_OK) return s;
    }
    attn->has_kv_input = args->k != NULL || args->v != NULL;
    if (!attn->has_kv_input) return AP_OK;
    s = cpu_view_make(args->k, "k", &attn->k, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->k, "k", 3, k_shape, msg);
    if (s == AP_OK) s = cpu_view_make(args->v, "v", &attn->v, msg);
    if (s == AP_OK) s = cpu_view_expect(&attn->v, "v", 3, v_shape, msg);
    if (s == AP_OK && (!cpu_elem_is_float_activation(attn->k.elem) ||
                       !cpu_elem_is_float_activation(attn->v.elem))) {
        ap_msgbuf_add(msg, "cpu_ref: k and v must be float32, bfloat16 or float16");
        s = AP_ERR_INVALID_ARGUMENT;
    }
    return s;
}

/* Which mode: save_kv writes k/v first and needs pages; without save_kv, a batch with pages reads
 * the cache and a batch without pages (embedding skip-KV) attends over the given k/v alone. */
static ap_status cpu_attn_check_mode(cpu_attn *attn, const ap_forward_args *args, ap_msgbuf *msg) {
    const cpu_plan *plan = attn->plan;
    if (args->save_kv && (!plan->has_pages || !attn->has_kv_input)) {
        ap_msgbuf_add(msg, "cpu_ref: save_kv needs the batch's page arrays and both k and v");
        return AP_ERR_INVALID_ARGUMENT;
    }
    attn->skip_kv = !args->save_kv && !plan->has_pages;
    if (attn->skip_kv) {
        if (!attn->has_kv_input) {
            ap_msgbuf_add(msg, "cpu_ref: a batch without page arrays needs k and v (embedding "
                               "skip-KV mode)");
            return AP_ERR_INVALID_ARGUMENT;
        }
        return AP_OK;
    }
    ap_status s = cpu_kv_check(attn->model, attn->layer, msg);
    if (s == AP_OK) s = cpu_kv_check_pages(plan, attn->layer->kv, msg);
    attn->kv = attn->layer->kv;
    return s;
}

/* save_kv: token j of sequence i is at position prefix + j; it goes into slot
 * (page kv_page_indices[kv_page_indptr[i] + pos / page_size], offset pos % page_size),
 * quantized as the cache stores it (kv_store.c). */
static void cpu_attn_save_kv(const cpu_attn *attn) {
    float *row = attn->row;
    const cpu_plan *plan = attn->plan;
    const ap_kv_cache *kv = attn->kv;
    const ap_layer *layer = attn->layer;
    for (int32_t i = 0; i < plan->num_seqs; i++) {
        int32_t q_len = plan->qo_indptr[i + 1] - plan->qo_indptr[i];
        int32_t prefix = plan->seq_lens[i] - q_len;
        for (int32_t j = 0; j < q_len; j++) {
            int64_t token = plan->qo_indptr[i] + j;
            int64_t slot = cpu_kv_slot_of(plan, kv, i, prefix + j);
            for (int32_t h = 0; h < kv->num_kv_heads; h++) {
                for (int32_t d = 0; d < kv->head_dim_qk; d++)
                    row[d] = cpu_view_get(&attn->k, (int64_t[]){token, h, d});
                cpu_kv_store_k(kv, slot, h, row, layer->k_scale);
                for (int32_t d = 0; d < kv->head_dim_v; d++)
                    row[d] = cpu_view_get(&attn->v, (int64_t[]){token, h, d});
                cpu_kv_store_v(kv, slot, h, row, layer->v_scale);
            }
        }
    }
}

/* Keys and values of sequence i, KV head g, positions [0, kv_len), as stored (fp8 and nvfp4
 * without the layer's scale): from the cache, or in skip-KV mode from the sequence's own rows of k and v. */
static void cpu_attn_gather(const cpu_attn *attn, int32_t i, int32_t g, int32_t kv_len) {
    const ap_model *m = attn->model;
    for (int32_t p = 0; p < kv_len; p++) {
        float *key = attn->keys + (size_t)p * (size_t)m->head_dim_qk;
        float *value = attn->values + (size_t)p * (size_t)m->head_dim_v;
        if (attn->skip_kv) {
            int64_t token = attn->plan->qo_indptr[i] + p;
            for (int32_t d = 0; d < m->head_dim_qk; d++)
                key[d] = cpu_view_get(&attn->k, (int64_t[]){token, g, d});
            for (int32_t d = 0; d < m->head_dim_v; d++)
                value[d] = cpu_view_get(&attn->v, (int64_t[]){token, g, d});
        } else {
            int64_t slot = cpu_kv_slot_of(attn->plan, attn->kv, i, p);
            cpu_kv_load_k(attn->kv, slot, g, key);
            cpu_kv_load_v(attn->kv, slot, g, value);
        }
    }
}

/* One query row against the gathered keys/values of its KV head. For positions p < kv_len that
 * the mask keeps (causal: p <= q_pos; sliding window: p >= q_pos - window_left):
 *   s_p   = sm_scale * sum_d q_d * (K_pd * k_scale)        (fp8, nvfp4: K_pd * k_scale is the key)
 *   s_p   = cap * tanh(s_p / cap)                           when logit_softcap cap > 0
 *   m     = max_p s_p,   w_p = exp(s_p - m),   l = sum_p w_p
 *   out_d = sum_p w_p * (V_pd * v_scale) / l
 *   lse   = m + log(l)                                      (natural log, of the scaled logits)
 * all in double: this is the oracle the GPU kernels are held to. A row the mask empties (only
 * possible with kv_len 0) gets out = 0 and lse = -inf. */
static double cpu_attn_row(const cpu_attn *attn, int32_t q_pos, int32_t kv_len) {
    const ap_model *m = attn->model;
    const ap_layer *layer = attn->layer;
    double k_scale = attn->skip_kv ? 1.0 : cpu_kv_effective_scale(attn->kv->dtype, layer->k_scale);
    double v_scale = attn->skip_kv ? 1.0 : cpu_kv_effective_scale(attn->kv->dtype, layer->v_scale);
    double cap = layer->logit_softcap;
    int32_t first = 0, last = kv_len - 1;
    if (m->causal && q_pos < last) last = q_pos;
    if (layer->window_left >= 0 && q_pos - layer->window_left > first)
        first = q_pos - layer->window_left;
    for (int32_t d = 0; d < m->head_dim_v; d++) attn->acc[d] = 0.0;
    if (first > last) return -INFINITY;
    double max_logit = -INFINITY;
    for (int32_t p = first; p <= last; p++) {
        const float *key = attn->keys + (size_t)p * (size_t)m->head_dim_qk;
        double dot = 0.0;
        for (int32_t d = 0; d < m->head_dim_qk; d++)
            dot += attn->q_row[d] * ((double)key[d] * k_scale);
        double s = (double)layer->sm_scale * dot;
        if (cap > 0.0) s = cap * tanh(s / cap);
        attn->logits[p] = s;
        if (s > max_logit) max_logit = s;
    }
    double denom = 0.0;
    for (int32_t p = first; p <= last; p++) {
        double w = exp(attn->logits[p] - max_logit);
        const float *value = attn->values + (size_t)p * (size_t)m->head_dim_v;
        denom += w;
        for (int32_t d = 0; d < m->head_dim_v; d++)
            attn->acc[d] += w * ((double)value[d] * v_scale);
    }
    for (int32_t d = 0; d < m->head_dim_v; d++) attn->acc[d] /= denom;
    return max_logit + log(denom);
}

/* Sequence i: query head h reads KV head h / (num_qo_heads / num_kv_heads). */
static void cpu_attn_sequence(const cpu_attn *attn, int32_t i) {
    const ap_model *m = attn->model;
    int32_t q_len = attn->plan->qo_indptr[i + 1] - attn->plan->qo_indptr[i];
    int32_t prefix = attn->skip_kv ? 0 : attn->plan->seq_lens[i] - q_len;
    int32_t kv_len = attn->skip_kv ? q_len : attn->plan->seq_lens[i];
    int32_t group = m->num_qo_heads / m->num_kv_heads;
    for (int32_t g = 0; g < m->num_kv_heads; g++) {
        cpu_attn_gather(attn, i, g, kv_len);
        for (int32_t j = 0; j < q_len; j++) {
            int64_t token = attn->plan->qo_indptr[i] + j;
            for (int32_t h = g * group; h < (g + 1) * group; h++) {
                for (int32_t d = 0; d < m->head_dim_qk; d++)
                    attn->q_row[d] = cpu_view_get(&attn->q, (int64_t[]){token, h, d});
                double lse = cpu_attn_row(attn, prefix + j, kv_len);
                for (int32_t d = 0; d < m->head_dim_v; d++)
                    cpu_view_set(&attn->out, (int64_t[]){token, h, d}, (float)attn->acc[d]);
                if (attn->has_lse) cpu_view_set(&attn->lse, (int64_t[]){token, h}, (float)lse);
            }
        }
    }
}

static int32_t cpu_attn_max_len(const cpu_attn *attn) {
    int32_t longest = 1;
    for (int32_t i = 0; i < attn->plan->num_seqs; i++) {
        int32_t q_len = attn->plan->qo_indptr[i + 1] - attn->plan->qo_indptr[i];
        int32_t len = attn->skip_kv ? q_len : attn->plan->seq_lens[i];
        if (len > longest) longest = len;
    }
    return longest;
}

static ap_status cpu_attn_alloc(cpu_attn *attn, ap_msgbuf *msg) {
    const ap_model *m = attn->model;
    size_t len = (size_t)cpu_attn_max_len(attn);
    size_t widest = (size_t)(m->head_dim_qk > m->head_dim_v ? m->head_dim_qk : m->head_dim_v);
    attn->keys = malloc(len * (size_t)m->head_dim_qk * sizeof(float));
    attn->values = malloc(len * (size_t)m->head_dim_v * sizeof(float));
    attn->logits = malloc(len * sizeof(double));
    attn->q_row = malloc(widest * sizeof(double));
    attn->acc = malloc(widest * sizeof(double));
    attn->row = malloc(widest * sizeof(float));
    if (attn->keys && attn->values && attn->logits && attn->q_row && attn->acc && attn->row)
        return AP_OK;
    ap_msgbuf_add(msg, "cpu_ref: out of host memory for a sequence of %zu tokens", len);
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
    if (args == NULL || args->struct_size < offsetof(ap_forward_args, q_rope) || layer == NULL ||
        layer->struct_size < sizeof(ap_layer)) {
        ap_msgbuf_add(msg, "cpu_ref: forward arguments or layer NULL or too old");
        return AP_ERR_INVALID_ARGUMENT;
    }
    cpu_attn attn = {.model = &backend->model, .layer = layer, .plan = plan};
    ap_status status = cpu_attn_check_tensors(&attn, args, msg);
    if (status == AP_OK) status = cpu_attn_check_mode(&attn, args, msg);
    if (status == AP_OK) status = cpu_attn_alloc(&attn, msg);
    if (status == AP_OK) {
        if (args->save_kv) cpu_attn_save_kv(&attn);
        for (int32_t i = 0; i < plan->num_seqs; i++) cpu_attn_sequence(&attn, i);
    }
    cpu_attn_free(&attn);
    return status;
}
