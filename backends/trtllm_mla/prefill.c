/* prefill.c: MLA's MHA-form prefill (ragged K/V, qk 192 / v 128) on the kit's prefill kernel. */
#include "backends/common/prefill.h"
#include "backends/common/prefill_internal.h"
#include "glue.h"

#define MLA_PREFILL_WHO MLA_NAME ": prefill"

/* The MHA form's head dims: q and k qk_nope + qk_rope wide, v and out v_head_dim. */
static int32_t mla_prefill_dim_qk(const ap_model *m) {
    return m->qk_nope_head_dim + m->qk_rope_head_dim;
}

/* The work list's buffers, sized for the model's largest batch: none when the model names no MHA
 * form the kernel serves (such a batch is refused in its plan). */
ap_status mla_prefill_alloc(ap_backend *b, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    if (m->qk_nope_head_dim <= 0 || m->v_head_dim <= 0) return AP_OK;
    const size_t bytes =
        ap_kit_prefill_plan_bytes(m->max_tokens, m->max_batch, mla_prefill_dim_qk(m), m->v_head_dim,
                                  m->num_qo_heads, m->num_qo_heads);
    if (bytes == 0) return AP_OK;
    return ap_kit_plan_buffer_alloc(&b->prefill_buffer, bytes, MLA_NAME, msg);
}

void mla_prefill_free(ap_backend *b) {
    ap_kit_plan_buffer_free(&b->prefill_buffer);
}

/* A batch with the ragged K/V source: one work item per (sequence, 128-token query tile), built on
 * the host from qo_indptr_host and kv_indptr_host and moved in one copy. trtllm_mla plans decode on
 * the device (needs_host_mirrors 0), so these two mirrors are the MHA form's own requirement: a
 * batch without them is refused here, with the reason. */
ap_status mla_prefill_plan(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    mla_plan *p = &b->plan;
    ap_status st =
        ap_kit_prefill_check_config(1, mla_prefill_dim_qk(m), m->v_head_dim, m->dtype, m->dtype,
                                    m->num_qo_heads, m->num_qo_heads, 0, MLA_PREFILL_WHO, msg);
    if (st != AP_OK) return st;
    if (batch->mode != AP_MODE_EXTEND || batch->qo_indptr_host == NULL ||
        batch->kv_indptr_host == NULL) {
        ap_msgbuf_add(msg, MLA_PREFILL_WHO ": the ragged K/V source is planned from the batch's "
                                           "qo_indptr_host and kv_indptr_host (an extend batch)");
        return AP_ERR_UNSUPPORTED;
    }
    if (batch->num_seqs > 0 && (batch->qo_indptr == NULL || batch->kv_indptr == NULL)) {
        ap_msgbuf_add(msg,
                      MLA_PREFILL_WHO ": the batch needs qo_indptr and kv_indptr on the device");
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_kit_plan_buffer *buffer = &b->prefill_buffer;
    if (buffer->host == NULL) {
        ap_msgbuf_add(msg,
                      MLA_PREFILL_WHO ": no plan buffer (the model's MHA dims are not served)");
        return AP_ERR_UNSUPPORTED;
    }
    st = ap_kit_plan_buffer_begin(buffer, MLA_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kit_prefill_plan_args args = {
        .num_seqs = batch->num_seqs,
        .qo_indptr_host = batch->qo_indptr_host,
        .kv_indptr_host = batch->kv_indptr_host,
        .head_dim_qk = mla_prefill_dim_qk(m),
        .head_dim_v = m->v_head_dim,
        .num_qo_heads = m->num_qo_heads,
        .num_kv_heads = m->num_qo_heads,
        .causal = batch->kv_causal,
        .tile_rows = 0,
        .host_scratch = buffer->host,
        .device_buffer = buffer->dev,
        .buffer_bytes = buffer->bytes,
        .caller_uploads = 1,
        .kv_dtype = m->kv_dtype, /* BF16: the kit's Hopper kernel where it serves */
        .tile_counters = buffer->tile_counters,
        .split_space = buffer, /* split-KV for few new tokens over a long chunk */
    };
    st = ap_kit_prefill_plan_build(&args, stream, &p->prefill, MLA_PREFILL_WHO, msg);
    if (st == AP_OK && p->prefill.num_items > 0)
        st = ap_kit_plan_buffer_upload(buffer,
                                       (size_t)p->prefill.num_items * sizeof(ap_kit_prefill_item),
                                       stream, MLA_NAME, msg);
    if (st != AP_OK) return st;
    p->kv_indptr = batch->kv_indptr;
    p->num_kv_tokens = batch->num_kv_tokens;
    return AP_OK;
}

/* k and v: bf16 or fp8_e4m3 (as pack_prefix_chunk_kv/1 writes them), both the same. */
static ap_status mla_prefill_kv_dtype(const ap_forward_args *a, ap_dtype *out, ap_msgbuf *msg) {
    ap_dtype k = AP_DTYPE_F32, v = AP_DTYPE_F32;
    if (a->k == NULL || a->v == NULL || !mla_dl_dtype(a->k->dtype, &k) ||
        !mla_dl_dtype(a->v->dtype, &v) || k != v ||
        (k != AP_DTYPE_BF16 && k != AP_DTYPE_FP8_E4M3)) {
        ap_msgbuf_add(msg, MLA_PREFILL_WHO ": k and v must both be bf16 or both fp8_e4m3");
        return AP_ERR_UNSUPPORTED;
    }
    *out = k;
    return AP_OK;
}

/* One tensor of the call: dense (its rows packed) and 16-byte aligned, on our device. */
static ap_status mla_prefill_tensor(const DLTensor *t, const char *what, int ndim,
                                    const int64_t *shape, ap_dtype dtype, int vec,
                                    const ap_backend *b, ap_msgbuf *msg) {
    int64_t s[3];
    ap_status st = mla_tensor_check(t, what, ndim, shape, dtype, b->device_ordinal, vec, s, msg);
    if (st != AP_OK) return st;
    if ((ndim == 3 && (s[1] != shape[2] || s[0] != shape[1] * shape[2])) ||
        (ndim == 2 && s[0] != shape[1])) {
        ap_msgbuf_add(msg, MLA_PREFILL_WHO ": %s must be dense", what);
        return AP_ERR_UNSUPPORTED;
    }
    return AP_OK;
}

ap_status mla_prefill_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *a,
                              void *stream, ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    const mla_plan *p = &b->plan;
    if (layer == NULL || layer->struct_size < sizeof(ap_layer) || a->q_rope != NULL || a->save_kv) {
        ap_msgbuf_add(msg, MLA_PREFILL_WHO ": needs an ap_layer, q without q_rope, save_kv 0");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (layer->logit_softcap != 0.f || layer->window_left >= 0) {
        ap_msgbuf_add(msg, MLA_PREFILL_WHO ": a logit softcap or sliding window is not served");
        return AP_ERR_UNSUPPORTED;
    }
    ap_dtype kv_dtype;
    ap_status st = mla_prefill_kv_dtype(a, &kv_dtype, msg);
    const int64_t t = p->num_tokens, kv = p->num_kv_tokens, h = m->num_qo_heads;
    const int64_t dqk = mla_prefill_dim_qk(m), dv = m->v_head_dim;
    if (st == AP_OK)
        st = mla_prefill_tensor(a->q, "q", 3, (int64_t[]){t, h, dqk}, m->dtype, 1, b, msg);
    if (st == AP_OK)
        st = mla_prefill_tensor(a->k, "k", 3, (int64_t[]){kv, h, dqk}, kv_dtype, 1, b, msg);
    if (st == AP_OK)
        st = mla_prefill_tensor(a->v, "v", 3, (int64_t[]){kv, h, dv}, kv_dtype, 1, b, msg);
    if (st == AP_OK)
        st = mla_prefill_tensor(a->out, "out", 3, (int64_t[]){t, h, dv}, m->dtype, 1, b, msg);
    if (st == AP_OK && a->lse != NULL)
        st = mla_prefill_tensor(a->lse, "lse", 2, (int64_t[]){t, h}, AP_DTYPE_F32, 0, b, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, MLA_NAME, msg);
    if (st != AP_OK || p->prefill.num_items == 0) return st;
    const ap_kit_prefill_params params = {
        .q = MLA_DATA(a->q),
        .out = MLA_DATA(a->out),
        .lse = a->lse != NULL ? (float *)MLA_DATA(a->lse) : NULL,
        .q_dtype = m->dtype,
        .kv_dtype = kv_dtype,
        .head_dim_qk = (int32_t)dqk,
        .head_dim_v = (int32_t)dv,
        .num_qo_heads = (int32_t)h,
        .num_kv_heads = (int32_t)h,
        .causal = p->prefill.causal,
        .sm_scale = layer->sm_scale,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .qo_indptr = p->qo_indptr,
        .k = MLA_DATA(a->k),
        .v = MLA_DATA(a->v),
        .kv_indptr = p->kv_indptr,
    };
    return ap_kit_prefill_run(&params, &p->prefill, stream, MLA_PREFILL_WHO, msg);
}
