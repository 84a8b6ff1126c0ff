/* forward.c: fa_varlen's forward_extend / forward_decode: only what the core does not check,
 * the cache write (save_kv, the kit's paged append), then the kit's prefill kernel. */
#include "fav.h"

#define FAV_FORWARD_WHO FAV_NAME ": forward"

/* The ragged k / v: the model's activation dtype, or fp8_e4m3 (real = stored * scale); both the
 * same (the core checks each against those two). */
static ap_status fav_ragged_kv_dtype(const ap_backend *b, const ap_forward_args *a, ap_dtype *out,
                                     ap_msgbuf *msg) {
    if (a->k == NULL || a->v == NULL) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": a batch without the cache attends over k and v: "
                                           "both are needed");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_dtype types[2] = {b->model.dtype, AP_DTYPE_FP8_E4M3};
    for (int i = 0; i < 2; i++) {
        if (ap_dtype_is_dl(a->k->dtype, types[i]) && ap_dtype_is_dl(a->v->dtype, types[i])) {
            *out = types[i];
            return AP_OK;
        }
    }
    ap_msgbuf_add(msg, FAV_FORWARD_WHO ": k and v must both be %s or both fp8_e4m3",
                  ap_dtype_str(b->model.dtype));
    return AP_ERR_UNSUPPORTED;
}

/* What the core leaves to the backend: the layer's features we do not declare, and the 16-byte
 * alignment of every row the kernels copy with vector loads. */
static ap_status fav_check_call(const ap_backend *b, const ap_layer *layer,
                                const ap_forward_args *a, ap_forward_mode mode, ap_msgbuf *msg) {
    if (!b->plan.ready || b->plan.mode != mode) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": no %s batch is planned",
                      mode == AP_MODE_EXTEND ? "extend" : "decode");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (layer == NULL || layer->struct_size < sizeof(ap_layer) || a->q_rope != NULL) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": needs an ap_layer and no q_rope (MHA only)");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (layer->logit_softcap != 0.f || layer->window_left >= 0) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": a logit softcap or sliding window is not served");
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_aligned(a->q, "q", 16, FAV_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->out, "out", 16, FAV_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->k, "k", 16, FAV_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->v, "v", 16, FAV_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(a->lse, "lse", 4, FAV_NAME, msg);
    return st;
}

/* save_kv: the new tokens' k / v into their slots (quantized for an fp8 cache). */
/* The kernel's arguments for this layer: the plan's source, the call's tensors. */
static ap_kit_prefill_params fav_params_of(const ap_backend *b, const ap_layer *layer,
                                           const ap_forward_args *a, ap_dtype kv_dtype) {
    const fav_plan *p = &b->plan;
    const ap_model *m = &b->model;
    const int paged = p->source == FAV_SOURCE_PAGED;
    return (ap_kit_prefill_params){
        .q = ap_kit_data(a->q),
        .out = ap_kit_data(a->out),
        .lse = a->lse != NULL ? (float *)ap_kit_data(a->lse) : NULL,
        .q_dtype = m->dtype,
        .kv_dtype = kv_dtype,
        .head_dim_qk = m->head_dim_qk,
        .head_dim_v = m->head_dim_v,
        .num_qo_heads = m->num_qo_heads,
        .num_kv_heads = m->num_kv_heads,
        .causal = p->prefill.causal,
        .sm_scale = layer->sm_scale,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .qo_indptr = p->qo_indptr,
        .k_pages = paged ? layer->kv->k_pages : NULL,
        .v_pages = paged ? layer->kv->v_pages : NULL,
        .page_size = paged ? layer->kv->page_size : 0,
        .kv_page_indptr = paged ? p->kv_page_indptr : NULL,
        .kv_page_indices = paged ? p->kv_page_indices : NULL,
        .kv_last_page_len = paged ? p->kv_last_page_len : NULL,
        .k = paged ? NULL : ap_kit_data(a->k),
        .v = paged ? NULL : ap_kit_data(a->v),
        .kv_indptr = paged ? NULL : p->kv_indptr,
    };
}

static ap_status fav_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *a,
                             ap_forward_mode mode, void *stream, ap_msgbuf *msg) {
    if (b == NULL || a == NULL || a->q == NULL || a->out == NULL) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": needs an instance, q and out");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fav_check_call(b, layer, a, mode, msg);
    const int paged = b->plan.source == FAV_SOURCE_PAGED;
    ap_dtype kv_dtype = AP_DTYPE_NONE;
    if (st == AP_OK && paged && layer->kv == NULL) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": the batch reads the paged cache: layer->kv is NULL");
        st = AP_ERR_INVALID_ARGUMENT;
    }
    if (st == AP_OK && !paged && a->save_kv) {
        ap_msgbuf_add(msg, FAV_FORWARD_WHO ": save_kv must be 0 in a batch without the cache");
        st = AP_ERR_INVALID_ARGUMENT;
    }
    if (st == AP_OK) {
        if (paged)
            kv_dtype = layer->kv->dtype;
        else
            st = fav_ragged_kv_dtype(b, a, &kv_dtype, msg);
    }
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FAV_NAME, msg);
    if (st == AP_OK && paged && a->save_kv)
        st = ap_kit_save_kv(&b->model, layer, a, b->plan.slots, b->plan.num_tokens, stream,
                            FAV_FORWARD_WHO, msg);
    if (st != AP_OK) return st;
    if (b->plan.staged) { /* a paged fp8 cache, staged to 16 bits for the Hopper kernel */
        ap_kit_nvfp4_staged staged;
        st = ap_kit_nvfp4_stager_run(&b->stage, &b->model, layer, b->plan.kv_page_indices, stream,
                                     &staged, FAV_FORWARD_WHO, msg);
        if (st != AP_OK) return st;
        ap_kit_prefill_params params = fav_params_of(b, &staged.layer, a, staged.kv.dtype);
        params.kv_page_indices = staged.page_indices;
        return ap_kit_prefill_run(&params, &b->plan.prefill, stream, FAV_FORWARD_WHO, msg);
    }
    const ap_kit_prefill_params params = fav_params_of(b, layer, a, kv_dtype);
    return ap_kit_prefill_run(&params, &b->plan.prefill, stream, FAV_FORWARD_WHO, msg);
}

ap_status fav_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return fav_forward(b, layer, args, AP_MODE_EXTEND, stream, msg);
}

/* A decode batch is an extend of one token per sequence over the paged cache: the same plan and
 * kernel (docs/ARCHITECTURE.md, "fa_varlen", says why). */
ap_status fav_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return fav_forward(b, layer, args, AP_MODE_DECODE, stream, msg);
}
