/* extend.c: flashinfer_like's extend on the kit's prefill kernel: its limits, plan and launch. */
#include "extend.h"

#define FIL_EXTEND_WHO FIL_NAME ": extend"

ap_status fil_extend_check_config(int32_t head_dim, ap_dtype q_dtype, ap_dtype kv_dtype,
                                  int32_t num_qo_heads, int32_t num_kv_heads, int32_t page_size,
                                  ap_msgbuf *reasons) {
    ap_status st = AP_OK;
    if (!fil_head_dim_served(head_dim)) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: head_dim %d is not " FIL_HEAD_DIMS_TEXT,
                      head_dim);
        st = AP_ERR_UNSUPPORTED;
    }
    if (q_dtype != AP_DTYPE_BF16 && q_dtype != AP_DTYPE_F16) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: query dtype %s is not bf16 or fp16",
                      ap_dtype_str(q_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (kv_dtype != q_dtype && kv_dtype != AP_DTYPE_FP8_E4M3) {
        ap_msgbuf_add(reasons,
                      FIL_NAME ": extend: KV dtype %s is neither the query dtype nor fp8_e4m3",
                      ap_dtype_str(kv_dtype));
        st = AP_ERR_UNSUPPORTED;
    }
    if (num_kv_heads <= 0 || num_qo_heads <= 0 || num_qo_heads % num_kv_heads != 0 ||
        num_qo_heads / num_kv_heads > FIL_MAX_GROUP) {
        ap_msgbuf_add(reasons,
                      FIL_NAME ": extend: %d query heads over %d KV heads is not a group of 1..%d",
                      num_qo_heads, num_kv_heads, FIL_MAX_GROUP);
        st = AP_ERR_UNSUPPORTED;
    }
    if (page_size < 1) {
        ap_msgbuf_add(reasons, FIL_NAME ": extend: page size %d is not >= 1", page_size);
        st = AP_ERR_UNSUPPORTED;
    }
    return st;
}

size_t fil_extend_plan_bytes(int32_t max_tokens, int32_t max_batch, int32_t head_dim,
                             int32_t num_qo_heads, int32_t num_kv_heads) {
    if (!fil_head_dim_served(head_dim) || num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0 ||
        num_qo_heads / num_kv_heads > FIL_MAX_GROUP)
        return 0;
    return ap_kit_prefill_plan_bytes(max_tokens, max_batch, head_dim, head_dim, num_qo_heads,
                                     num_kv_heads);
}

ap_status fil_extend_plan_build(const ap_kit_prefill_plan_args *args, void *stream,
                                fil_extend_plan *plan, ap_msgbuf *msg) {
    if (args == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": extend plan: NULL argument or negative batch size");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st =
        fil_extend_check_config(args->head_dim_qk, AP_DTYPE_BF16, AP_DTYPE_BF16, args->num_qo_heads,
                                args->num_kv_heads, args->page_size, msg);
    if (st == AP_OK && (args->head_dim_v != args->head_dim_qk || args->kv_indptr_host != NULL)) {
        ap_msgbuf_add(msg, FIL_EXTEND_WHO ": the plan is for the paged source, qk = v head dims");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st != AP_OK) return st;
    return ap_kit_prefill_plan_build(args, stream, plan, FIL_EXTEND_WHO, msg);
}

/* The kit's arguments for this call (the paged source), straight from the entry's. */
static void fil_extend_params_of(const ap_model *m, const ap_layer *layer,
                                 const ap_forward_args *args, const fil_batch_plan *plan,
                                 ap_kit_prefill_params *out) {
    const ap_kv_cache *kv = layer->kv;
    *out = (ap_kit_prefill_params){
        .q = ap_kit_data(args->q),
        .out = ap_kit_data(args->out),
        .lse = args->lse != NULL ? (float *)ap_kit_data(args->lse) : NULL,
        .q_dtype = m->dtype,
        .kv_dtype = kv->dtype,
        .head_dim_qk = kv->head_dim_qk,
        .head_dim_v = kv->head_dim_qk,
        .num_qo_heads = m->num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .causal = m->causal,
        .sm_scale = layer->sm_scale,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .qo_indptr = plan->qo_indptr,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .page_size = kv->page_size,
        .kv_page_indptr = plan->kv_page_indptr,
        .kv_page_indices = plan->kv_page_indices,
        .kv_last_page_len = plan->kv_last_page_len,
        .k = NULL,
        .v = NULL,
        .kv_indptr = NULL,
    };
}

ap_status fil_extend_run(const ap_model *model, const ap_layer *layer, const ap_forward_args *args,
                         const fil_batch_plan *plan, void *stream, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    ap_status st =
        fil_extend_check_config(kv->head_dim_qk, model->dtype, kv->dtype, model->num_qo_heads,
                                kv->num_kv_heads, kv->page_size, msg);
    if (st != AP_OK) return st;
    ap_kit_prefill_params kit;
    fil_extend_params_of(model, layer, args, plan, &kit);
    /* a fresh prefill reads its saved k / v in place where the plan's tiles allow (the kit) */
    ap_kit_prefill_plan ragged;
    const int in_place = ap_kit_prefill_fresh_in_place(
        &plan->extend, plan->extend_fresh, model, layer, args, plan->num_tokens, &kit, &ragged);
    return ap_kit_prefill_run(&kit, in_place ? &ragged : &plan->extend, stream, FIL_EXTEND_WHO,
                              msg);
}
