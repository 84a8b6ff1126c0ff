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

ap_status fil_extend_plan_build(const fil_extend_plan_args *args, void *stream,
                                fil_extend_plan *plan, ap_msgbuf *msg) {
    if (args == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": extend plan: NULL argument or negative batch size");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st =
        fil_extend_check_config(args->head_dim, AP_DTYPE_BF16, AP_DTYPE_BF16, args->num_qo_heads,
                                args->num_kv_heads, args->page_size, msg);
    if (st != AP_OK) return st;
    const ap_kit_prefill_plan_args kit = {
        .num_seqs = args->num_seqs,
        .qo_indptr_host = args->qo_indptr_host,
        .kv_page_indptr_host = args->kv_page_indptr_host,
        .kv_last_page_len_host = args->kv_last_page_len_host,
        .page_size = args->page_size,
        .kv_indptr_host = NULL,
        .head_dim_qk = args->head_dim,
        .head_dim_v = args->head_dim,
        .num_qo_heads = args->num_qo_heads,
        .num_kv_heads = args->num_kv_heads,
        .causal = args->causal,
        .tile_rows = args->tile_rows,
        .host_scratch = args->host_scratch,
        .device_buffer = args->device_buffer,
        .buffer_bytes = args->buffer_bytes,
        .caller_uploads = args->caller_uploads,
    };
    return ap_kit_prefill_plan_build(&kit, stream, plan, FIL_EXTEND_WHO, msg);
}

void fil_extend_params_of(const fil_attn_params *p, ap_kit_prefill_params *out) {
    *out = (ap_kit_prefill_params){
        .q = p->q,
        .out = p->out,
        .lse = p->lse,
        .q_dtype = p->q_dtype,
        .kv_dtype = p->kv.kv_dtype,
        .head_dim_qk = p->kv.head_dim,
        .head_dim_v = p->kv.head_dim,
        .num_qo_heads = p->num_qo_heads,
        .num_kv_heads = p->kv.num_kv_heads,
        .causal = p->causal,
        .sm_scale = p->sm_scale,
        .k_scale = p->kv.k_scale,
        .v_scale = p->kv.v_scale,
        .qo_indptr = p->qo_indptr,
        .k_pages = p->kv.k_pages,
        .v_pages = p->kv.v_pages,
        .page_size = p->kv.page_size,
        .kv_page_indptr = p->kv.kv_page_indptr,
        .kv_page_indices = p->kv.kv_page_indices,
        .kv_last_page_len = p->kv.kv_last_page_len,
        .k = NULL,
        .v = NULL,
        .kv_indptr = NULL,
    };
}

ap_status fil_extend_run(const fil_attn_params *p, const fil_extend_plan *plan, void *stream,
                         ap_msgbuf *msg) {
    if (p == NULL) {
        ap_msgbuf_add(msg, FIL_EXTEND_WHO ": NULL params or plan");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st =
        fil_extend_check_config(p->kv.head_dim, p->q_dtype, p->kv.kv_dtype, p->num_qo_heads,
                                p->kv.num_kv_heads, p->kv.page_size, msg);
    if (st != AP_OK) return st;
    ap_kit_prefill_params kit;
    fil_extend_params_of(p, &kit);
    return ap_kit_prefill_run(&kit, plan, stream, FIL_EXTEND_WHO, msg);
}
