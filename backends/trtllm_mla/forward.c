/* forward.c: forward_decode / forward_extend in MLA's absorbed form over the latent cache (the MHA
 * form over a ragged K/V source goes to prefill.c). */
#include "glue.h"

/* q_nope [T][H][512] beside q_rope [T][H][64], or q [T][H][576] alone (its last 64 the rope
 * part); rows dense, token and head strides free (16-byte multiples): read in place. */
static ap_status mla_query_check(const ap_backend *b, const ap_forward_args *a,
                                 mla_decode_params *p, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    const int64_t t = b->plan.num_tokens, h = m->num_qo_heads;
    const int32_t dev = b->device_ordinal;
    int64_t s[3];
    ap_status st;
    if (a->q_rope != NULL) {
        st = mla_tensor_check(a->q, "q", 3, (int64_t[]){t, h, MLA_LATENT}, AP_DTYPE_BF16, dev, 1, s,
                              msg);
        if (st != AP_OK) return st;
        p->q_nope = MLA_DATA(a->q);
        p->q_stride_t = s[0];
        p->q_stride_h = s[1];
        st = mla_tensor_check(a->q_rope, "q_rope", 3, (int64_t[]){t, h, MLA_ROPE}, AP_DTYPE_BF16,
                              dev, 1, s, msg);
        if (st != AP_OK) return st;
        p->q_rope = MLA_DATA(a->q_rope);
        p->qr_stride_t = s[0];
        p->qr_stride_h = s[1];
        return AP_OK;
    }
    if (a->q != NULL && a->q->ndim == 3 && a->q->shape != NULL && a->q->shape[2] != MLA_ROW) {
        ap_msgbuf_add(msg,
                      MLA_NAME ": q of width %lld without q_rope: MLA's MHA form (qk_nope + "
                               "qk_rope per head) is served over a ragged K/V source only "
                               "(ap_batch.kv_indptr)",
                      (long long)a->q->shape[2]);
        return AP_ERR_UNSUPPORTED;
    }
    st = mla_tensor_check(a->q, "q", 3, (int64_t[]){t, h, MLA_ROW}, AP_DTYPE_BF16, dev, 1, s, msg);
    if (st != AP_OK) return st;
    p->q_nope = MLA_DATA(a->q);
    p->q_rope = (const char *)MLA_DATA(a->q) + MLA_LATENT * 2;
    p->q_stride_t = p->qr_stride_t = s[0];
    p->q_stride_h = p->qr_stride_h = s[1];
    return AP_OK;
}

static ap_status mla_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *a,
                             ap_forward_mode mode, void *stream, ap_msgbuf *msg) {
    const char *entry = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (b == NULL || a == NULL || a->struct_size < sizeof(ap_forward_args)) {
        ap_msgbuf_add(msg, MLA_NAME ": forward_%s needs an instance and ap_forward_args", entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const mla_plan *plan = &b->plan;
    if (!plan->ready || plan->mode != mode) {
        ap_msgbuf_add(msg, MLA_NAME ": forward_%s without init_metadata of a %s batch", entry,
                      entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (plan->ragged) return mla_prefill_forward(b, layer, a, stream, msg);
    if (plan->max_q_len > MLA_MAX_Q_LEN) {
        ap_msgbuf_add(msg,
                      MLA_NAME ": %d query tokens in one sequence; the absorbed kernel takes "
                               "1..%d (MTP)",
                      plan->max_q_len, MLA_MAX_Q_LEN);
        return AP_ERR_UNSUPPORTED;
    }
    if (a->save_kv) {
        ap_msgbuf_add(msg, MLA_NAME ": save_kv is not served: write the latent rows with "
                                    "append_kv/1 first");
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = mla_layer_check(b, layer, msg);
    if (st != AP_OK || plan->num_tokens == 0) return st;
    mla_decode_params p = {0};
    st = mla_query_check(b, a, &p, msg);
    const int64_t t = plan->num_tokens, h = b->model.num_qo_heads;
    int64_t s[3];
    if (st == AP_OK)
        st = mla_tensor_check(a->out, "out", 3, (int64_t[]){t, h, MLA_LATENT}, AP_DTYPE_BF16,
                              b->device_ordinal, 1, s, msg);
    if (st == AP_OK && (s[0] != h * MLA_LATENT || s[1] != MLA_LATENT)) {
        ap_msgbuf_add(msg, MLA_NAME ": out must be dense");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK && a->lse != NULL)
        st = mla_tensor_check(a->lse, "lse", 2, (int64_t[]){t, h}, AP_DTYPE_F32, b->device_ordinal,
                              0, s, msg);
    if (st == AP_OK && a->lse != NULL && s[0] != h) {
        ap_msgbuf_add(msg, MLA_NAME ": lse must be dense");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, MLA_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    p.out = MLA_DATA(a->out);
    p.lse = a->lse != NULL ? (float *)MLA_DATA(a->lse) : NULL;
    p.kv_pages = kv->k_pages;
    p.kv_dtype = kv->dtype;
    p.kv_scale = kv->dtype == AP_DTYPE_FP8_E4M3 ? layer->k_scale : 1.0f;
    p.sm_scale = layer->sm_scale;
    p.page_size = kv->page_size;
    p.num_heads = b->model.num_qo_heads;
    p.num_seqs = plan->num_seqs;
    p.max_q_len = plan->max_q_len;
    p.qo_indptr = plan->qo_indptr;
    p.kv_page_indptr = plan->kv_page_indptr;
    p.kv_page_indices = plan->kv_page_indices;
    p.seq_lens = plan->seq_lens;
    p.num_splits = plan->num_splits;
    p.partial_out = b->partial_out;
    p.partial_lse = b->partial_lse;
    p.use_pdl = b->use_pdl;
    p.stages = b->stages;
    p.kv_slots = (int64_t)kv->num_pages * kv->page_size;
    if (mla_decode_wgmma_covers(&p)) return mla_decode_wgmma_run(&p, stream, msg);
    p.flat = plan->flat;
    p.flat_ctas = b->sm_count;
    return mla_decode_run(&p, stream, msg);
}

ap_status mla_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return mla_forward(b, layer, args, AP_MODE_DECODE, stream, msg);
}

/* Extend in the absorbed form: 1..4 new tokens per sequence (MTP verification), causal among
 * themselves, over the latent cache that already holds them. */
ap_status mla_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return mla_forward(b, layer, args, AP_MODE_EXTEND, stream, msg);
}
