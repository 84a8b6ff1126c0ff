/* hooks.c: append_kv/1, pack_prefix_chunk_kv/1, merge_state/1 and cuda_graph/1 of trtllm_mla. */
#include "glue.h"

/* A 1-D int32 device array of `count` elements on our GPU; its stride in elements. */
static ap_status mla_index_check(const DLTensor *t, const char *what, int64_t count,
                                 int32_t ordinal, int64_t *stride, ap_msgbuf *msg) {
    if (t == NULL || t->data == NULL || t->ndim != 1 || t->shape == NULL || t->shape[0] != count ||
        t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1 ||
        ((uintptr_t)t->data + t->byte_offset) % 4 != 0) {
        ap_msgbuf_add(msg, MLA_NAME ": %s must be an aligned int32 array of %lld elements", what,
                      (long long)count);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (t->device.device_type != kDLCUDA || t->device.device_id != ordinal) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s is not on CUDA device %d", what, ordinal);
        return AP_ERR_INVALID_ARGUMENT;
    }
    *stride = t->strides != NULL ? t->strides[0] : 1;
    return AP_OK;
}

/* ---- append_kv/1 ------------------------------------------------------------------------------
 * MLA's form: k [T][1][576] the new latent rows (c, then k_pe not yet rotated), v NULL; q, when
 * given, [T][H][64] (q_rope) or [T][H][576] (latent-width q), rotated on its last 64 values into
 * q_out; rotary_dim 64 (the k_pe / q_rope width). */
static ap_status mla_append_check(const ap_backend *b, const ap_append_kv_args *a,
                                  mla_append_params *p, ap_msgbuf *msg) {
    const int32_t dev = b->device_ordinal;
    if (a == NULL || a->struct_size < sizeof(ap_append_kv_args) || a->k == NULL ||
        a->cos_sin == NULL || (a->q == NULL) != (a->q_out == NULL)) {
        ap_msgbuf_add(msg, MLA_NAME ": append_kv needs args with struct_size, k, cos_sin, and q "
                                    "with q_out or neither");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (a->v != NULL || a->rotary_dim != MLA_ROPE) {
        ap_msgbuf_add(msg,
                      MLA_NAME ": MLA's append_kv takes the latent in k, no v, and rotary_dim "
                               "%d (got v %s, rotary_dim %d)",
                      MLA_ROPE, a->v != NULL ? "set" : "NULL", a->rotary_dim);
        return AP_ERR_INVALID_ARGUMENT;
    }
    int64_t s[3];
    ap_status st =
        mla_tensor_check(a->k, "k", 3, (int64_t[]){-1, 1, MLA_ROW}, AP_DTYPE_BF16, dev, 1, s, msg);
    if (st != AP_OK) return st;
    const int64_t n = a->k->shape[0];
    p->k = MLA_DATA(a->k);
    p->k_stride_t = s[0];
    p->num_tokens = n;
    if (a->q != NULL) {
        const int64_t qd = a->q->ndim == 3 && a->q->shape != NULL ? a->q->shape[2] : -1;
        if (qd != MLA_ROPE && qd != MLA_ROW) {
            ap_msgbuf_add(msg, MLA_NAME ": append_kv's q is q_rope [T][H][64] or [T][H][576]");
            return AP_ERR_SHAPE_MISMATCH;
        }
        const int64_t q_shape[3] = {n, b->model.num_qo_heads, qd};
        st = mla_tensor_check(a->q, "q", 3, q_shape, AP_DTYPE_BF16, dev, 1, s, msg);
        if (st != AP_OK) return st;
        p->q = MLA_DATA(a->q);
        p->q_stride_t = s[0];
        p->q_stride_h = s[1];
        st = mla_tensor_check(a->q_out, "q_out", 3, q_shape, AP_DTYPE_BF16, dev, 1, s, msg);
        if (st != AP_OK) return st;
        p->q_out = MLA_DATA(a->q_out);
        p->qo_stride_t = s[0];
        p->qo_stride_h = s[1];
        p->q_dim = (int32_t)qd;
        p->num_heads = b->model.num_qo_heads;
    }
    st = mla_tensor_check(a->cos_sin, "cos_sin", 2, (int64_t[]){-1, MLA_ROPE}, AP_DTYPE_F32, dev, 0,
                          s, msg);
    if (st == AP_OK && s[0] != MLA_ROPE) {
        ap_msgbuf_add(msg, MLA_NAME ": cos_sin must be dense");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK)
        st = mla_index_check(a->positions, "positions", n, dev, &p->positions_stride, msg);
    if (st == AP_OK) st = mla_index_check(a->out_loc, "out_loc", n, dev, &p->out_loc_stride, msg);
    return st;
}

ap_status mla_hook_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                             void *stream, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, MLA_NAME ": append_kv without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    mla_append_params p = {0};
    ap_status st = mla_layer_check(b, layer, msg);
    if (st == AP_OK) st = mla_append_check(b, args, &p, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, MLA_NAME, msg);
    if (st != AP_OK) return st;
    const ap_kv_cache *kv = layer->kv;
    int64_t rows = args->cos_sin->shape[0];
    p.kv_pages = kv->k_pages;
    p.kv_dtype = kv->dtype;
    p.k_scale = layer->k_scale;
    p.num_slots = (int64_t)kv->num_pages * kv->page_size;
    p.positions = (const int32_t *)MLA_DATA(args->positions);
    p.out_loc = (const int32_t *)MLA_DATA(args->out_loc);
    p.cos_sin = (const float *)MLA_DATA(args->cos_sin);
    p.max_position = rows > INT32_MAX ? INT32_MAX : (int32_t)rows;
    p.rotary_dim = args->rotary_dim;
    p.is_neox = args->is_neox;
    return mla_append_run(&p, stream, msg);
}

/* ---- pack_prefix_chunk_kv/1 -------------------------------------------------------------------- */

/* A strided input: any non-negative strides (elements); dtype bf16, f16 or f32. */
static ap_status mla_pack_input(const DLTensor *t, const char *what, int ndim, int32_t dev,
                                ap_dtype *dtype, int64_t strides[3], ap_msgbuf *msg) {
    if (t == NULL || t->data == NULL || t->ndim != ndim || t->shape == NULL ||
        !mla_dl_dtype(t->dtype, dtype) || *dtype == AP_DTYPE_FP8_E4M3) {
        ap_msgbuf_add(msg, MLA_NAME ": pack input %s must be a %d-D bf16/f16/f32 tensor", what,
                      ndim);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (t->device.device_type != kDLCUDA || t->device.device_id != dev) {
        ap_msgbuf_add(msg, MLA_NAME ": tensor %s is not on CUDA device %d", what, dev);
        return AP_ERR_INVALID_ARGUMENT;
    }
    int64_t compact = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        strides[d] = t->strides != NULL ? t->strides[d] : compact;
        if (strides[d] < 0) {
            ap_msgbuf_add(msg, MLA_NAME ": pack input %s has a negative stride", what);
            return AP_ERR_UNSUPPORTED;
        }
        compact *= t->shape[d];
    }
    return AP_OK;
}

ap_status mla_hook_pack(ap_backend *b, const ap_pack_kv_args *a, void *stream, ap_msgbuf *msg) {
    if (b == NULL || a == NULL || a->struct_size < sizeof(ap_pack_kv_args)) {
        ap_msgbuf_add(msg, MLA_NAME ": pack_prefix_chunk_kv needs an instance and args with "
                                    "struct_size set");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int32_t dev = b->device_ordinal;
    mla_pack_params p = {0};
    int64_t kn[3], pe[3], v[3], out[3];
    ap_dtype d_kn, d_pe, d_v;
    ap_status st = mla_pack_input(a->k_nope, "k_nope", 3, dev, &d_kn, kn, msg);
    const int pe_ndim = a->k_pe != NULL ? a->k_pe->ndim : 2;
    if (st == AP_OK) st = mla_pack_input(a->k_pe, "k_pe", pe_ndim, dev, &d_pe, pe, msg);
    if (st == AP_OK) st = mla_pack_input(a->v, "v", 3, dev, &d_v, v, msg);
    if (st != AP_OK) return st;
    const int64_t t = a->k_nope->shape[0], h = a->k_nope->shape[1];
    const int64_t rope = a->k_pe->shape[pe_ndim - 1];
    if (d_kn != d_pe || d_kn != d_v || (pe_ndim != 2 && pe_ndim != 3) || a->k_pe->shape[0] != t ||
        (pe_ndim == 3 && a->k_pe->shape[1] != 1) || a->v->shape[0] != t || a->v->shape[1] != h) {
        ap_msgbuf_add(msg, MLA_NAME ": pack inputs disagree: k_nope [T][H][n], k_pe [T][r] or "
                                    "[T][1][r], v [T][H][dv], one dtype");
        return AP_ERR_SHAPE_MISMATCH;
    }
    const int64_t nope = a->k_nope->shape[2], dv = a->v->shape[2];
    st = mla_tensor_check(a->k_out, "k_out", 3, (int64_t[]){t, h, nope + rope}, AP_DTYPE_FP8_E4M3,
                          dev, 0, out, msg);
    if (st == AP_OK && (out[0] != h * (nope + rope) || out[1] != nope + rope)) {
        ap_msgbuf_add(msg, MLA_NAME ": k_out must be dense");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK)
        st = mla_tensor_check(a->v_out, "v_out", 3, (int64_t[]){t, h, dv}, AP_DTYPE_FP8_E4M3, dev,
                              0, out, msg);
    if (st == AP_OK && (out[0] != h * dv || out[1] != dv)) {
        ap_msgbuf_add(msg, MLA_NAME ": v_out must be dense");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK && (h > INT32_MAX || nope + rope + dv > INT32_MAX / 2)) {
        ap_msgbuf_add(msg, MLA_NAME ": pack dims too large");
        st = AP_ERR_UNSUPPORTED;
    }
    if (st == AP_OK) st = ap_kit_set_device(dev, MLA_NAME, msg);
    if (st != AP_OK) return st;
    p.k_nope = MLA_DATA(a->k_nope);
    p.k_pe = MLA_DATA(a->k_pe);
    p.v = MLA_DATA(a->v);
    p.kn_stride_t = kn[0];
    p.kn_stride_h = kn[1];
    p.kn_stride_d = kn[2];
    p.pe_stride_t = pe[0];
    p.pe_stride_d = pe[pe_ndim - 1];
    p.v_stride_t = v[0];
    p.v_stride_h = v[1];
    p.v_stride_d = v[2];
    p.in_dtype = d_kn;
    p.k_out = MLA_DATA(a->k_out);
    p.v_out = MLA_DATA(a->v_out);
    p.tokens = t;
    p.heads = (int32_t)h;
    p.nope_dim = (int32_t)nope;
    p.rope_dim = (int32_t)rope;
    p.v_dim = (int32_t)dv;
    p.k_scale = a->k_scale;
    p.v_scale = a->v_scale;
    p.use_pdl = b->use_pdl;
    return mla_pack_run(&p, stream, msg);
}

/* ---- merge_state/1 ----------------------------------------------------------------------------- */

ap_status mla_hook_merge_state(ap_backend *b, const ap_merge_state_args *a, void *stream,
                               ap_msgbuf *msg) {
    if (b == NULL || a == NULL || a->struct_size < sizeof(ap_merge_state_args) || a->o_a == NULL ||
        a->o_a->ndim != 3 || a->o_a->shape == NULL) {
        ap_msgbuf_add(msg, MLA_NAME ": merge_state needs an instance and args with struct_size, "
                                    "o_a [T][H][D]");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int32_t dev = b->device_ordinal;
    ap_dtype dtype;
    if (!mla_dl_dtype(a->o_a->dtype, &dtype) || dtype == AP_DTYPE_FP8_E4M3) {
        ap_msgbuf_add(msg, MLA_NAME ": merge_state takes bf16, f16 or f32 states");
        return AP_ERR_SHAPE_MISMATCH;
    }
    const int64_t t = a->o_a->shape[0], h = a->o_a->shape[1], d = a->o_a->shape[2];
    const int64_t o_shape[3] = {t, h, d}, l_shape[2] = {t, h};
    const DLTensor *os[3] = {a->o_a, a->o_b, a->o};
    const char *on[3] = {"o_a", "o_b", "o"};
    const DLTensor *ls[3] = {a->lse_a, a->lse_b, a->lse};
    const char *ln[3] = {"lse_a", "lse_b", "lse"};
    int64_t s[3];
    ap_status st = AP_OK;
    for (int i = 0; i < 3 && st == AP_OK; i++) {
        st = mla_tensor_check(os[i], on[i], 3, o_shape, dtype, dev, 0, s, msg);
        if (st == AP_OK && (s[0] != h * d || s[1] != d)) {
            ap_msgbuf_add(msg, MLA_NAME ": %s must be dense", on[i]);
            st = AP_ERR_UNSUPPORTED;
        }
        if (st != AP_OK || (i == 2 && ls[i] == NULL)) continue;
        st = mla_tensor_check(ls[i], ln[i], 2, l_shape, AP_DTYPE_F32, dev, 0, s, msg);
        if (st == AP_OK && s[0] != h) {
            ap_msgbuf_add(msg, MLA_NAME ": %s must be dense", ln[i]);
            st = AP_ERR_UNSUPPORTED;
        }
    }
    if (st == AP_OK && d > INT32_MAX) st = AP_ERR_UNSUPPORTED;
    if (st == AP_OK) st = ap_kit_set_device(dev, MLA_NAME, msg);
    if (st != AP_OK) return st;
    mla_merge_params p = {
        .o_a = MLA_DATA(a->o_a),
        .lse_a = (const float *)MLA_DATA(a->lse_a),
        .o_b = MLA_DATA(a->o_b),
        .lse_b = (const float *)MLA_DATA(a->lse_b),
        .o = MLA_DATA(a->o),
        .lse = a->lse != NULL ? (float *)MLA_DATA(a->lse) : NULL,
        .dtype = dtype,
        .rows = t * h,
        .dim = (int32_t)d,
    };
    return mla_merge_run(&p, stream, msg);
}

/* ---- cuda_graph/1 ------------------------------------------------------------------------------
 * Nothing to prepare: init_metadata never reads a host mirror, copies or allocates, the split
 * count depends on the batch size alone, and the decode launches only kernels on `stream`. */
ap_status mla_hook_cuda_graph(ap_backend *b, int32_t max_batch, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (b == NULL || max_batch <= 0 || max_batch > b->model.max_batch) {
        ap_msgbuf_add(msg, MLA_NAME ": cuda_graph needs an instance and max_batch in 1..%d",
                      b != NULL ? b->model.max_batch : 0);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}
