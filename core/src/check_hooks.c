/* check_hooks.c: the core's checks of the append_kv/1, pack_prefix_chunk_kv/1 and merge_state/1
 * arguments. */
#include <inttypes.h>
#include <string.h>

#include "check_internal.h"

#define AP_APPEND_MIN_SIZE (offsetof(ap_append_kv_args, is_neox) + sizeof(int32_t))
#define AP_PACK_MIN_SIZE (offsetof(ap_pack_kv_args, v_scale) + sizeof(float))
#define AP_MERGE_MIN_SIZE (offsetof(ap_merge_state_args, lse) + sizeof(DLTensor *))

/* Element i of a 1-D int32 tensor in host memory. */
static int32_t ap_host_int32(const DLTensor *t, int64_t i) {
    int64_t stride = t->strides != NULL ? t->strides[0] : 1;
    const char *base = (const char *)t->data + t->byte_offset;
    int32_t value;
    memcpy(&value, base + i * stride * (int64_t)sizeof(int32_t), sizeof value);
    return value;
}

/* On a CPU backend the slot and position tensors are host memory: check each value so nothing
 * is written outside the cache nor read outside cos_sin. */
static ap_status ap_check_append_values(const ap_instance *instance, const ap_layer *layer,
                                        const ap_append_kv_args *a, int64_t t, ap_msgbuf *msg) {
    if (ap_expected_device_type(instance) != kDLCPU) return AP_OK;
    int64_t slots = (int64_t)layer->kv->num_pages * layer->kv->page_size;
    int64_t rows = a->cos_sin->shape[0];
    for (int64_t i = 0; i < t; i++) {
        int32_t slot = ap_host_int32(a->out_loc, i), pos = ap_host_int32(a->positions, i);
        if (slot < 0 || slot >= slots)
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "args.out_loc[%" PRId64 "] is %d, outside the cache's %" PRId64
                                 " slots",
                                 i, (int)slot, slots);
        if (pos < 0 || pos >= rows)
            return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                                 "args.positions[%" PRId64 "] is %d, outside cos_sin's %" PRId64
                                 " rows",
                                 i, (int)pos, rows);
    }
    return AP_OK;
}

/* Activation inputs of a hook whose model does not fix their dtype: float32, bf16 or fp16. */
static int ap_is_activation(const DLTensor *t) {
    DLDataType d = t->dtype;
    return d.lanes == 1 && ((d.code == kDLFloat && (d.bits == 32 || d.bits == 16)) ||
                            (d.code == kDLBfloat && d.bits == 16));
}

/* The new k and v of an append: [T][Hkv][Dqk] and [T][Hkv][Dv] for MHA, q and q_out
 * [T][Hq][Dqk]. MLA: k is the new latent rows [T][1][kv_lora_rank + qk_rope] (k_pe, the last
 * qk_rope values, not rotated yet), no v (the latent holds V), and q / q_out are q_rope
 * [T][Hq][qk_rope], read and written in place (dense rows, any row stride). */
static ap_status ap_check_append_tensors(const ap_instance *instance, const ap_append_kv_args *a,
                                         int64_t t, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    int mla = m->kind == AP_ATTN_MLA;
    DLDataType act = ap_dl_of(m->dtype);
    int64_t hq = m->num_qo_heads, dq = mla ? m->qk_rope_head_dim : m->head_dim_qk;
    int64_t hk = m->num_kv_heads, dk = m->head_dim_qk, dv = m->head_dim_v;
    ap_layout q_layout = mla ? AP_ROWS : AP_DENSE;
    ap_status status =
        ap_check_tensor(instance, msg, "args.k", a->k, 3, (int64_t[]){t, hk, dk}, act, AP_DENSE);
    if (status == AP_OK && mla && a->v != NULL)
        status = ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                               "args.v must be NULL for MLA (V is the first kv_lora_rank values "
                               "of the latent row in args.k)");
    if (status == AP_OK && !mla)
        status = ap_check_required(instance, msg, "args.v", a->v, 3, (int64_t[]){t, hk, dv}, act,
                                   AP_DENSE);
    /* q is optional (a host may rotate q elsewhere); q_out comes with it and has its shape. */
    if (status == AP_OK && (a->q == NULL) != (a->q_out == NULL))
        status = ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                               "args.q and args.q_out come together "
                               "(one is NULL)");
    if (status == AP_OK && a->q != NULL)
        status = ap_check_tensor(instance, msg, "args.q", a->q, 3, (int64_t[]){t, hq, dq}, act,
                                 q_layout);
    if (status == AP_OK && a->q != NULL)
        status = ap_check_tensor(instance, msg, "args.q_out", a->q_out, 3, (int64_t[]){t, hq, dq},
                                 act, q_layout);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.positions", a->positions, 1, (int64_t[]){t},
                                   AP_DL_INT32, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.out_loc", a->out_loc, 1, (int64_t[]){t},
                                   AP_DL_INT32, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.cos_sin", a->cos_sin, 2,
                                   (int64_t[]){AP_ANY, a->rotary_dim}, AP_DL_FLOAT32, AP_DENSE);
    return status;
}

ap_status ap_check_append_kv(const ap_instance *instance, const ap_layer *layer,
                             const ap_append_kv_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    ap_status status = ap_check_layer(instance, layer, 0, msg);
    if (status != AP_OK) return status;
    if (a == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_APPEND_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.struct_size is %zu, expected >= %zu", a->struct_size,
                             (size_t)AP_APPEND_MIN_SIZE);
    if (a->rotary_dim <= 0 || a->rotary_dim % 2 != 0 || a->rotary_dim > m->head_dim_qk)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.rotary_dim is %d (must be even, > 0 and <= head_dim_qk %d)",
                             (int)a->rotary_dim, (int)m->head_dim_qk);
    /* MLA rotates all of q_rope and k_pe: the rope part is exactly qk_rope_head_dim wide. */
    if (m->kind == AP_ATTN_MLA && a->rotary_dim != m->qk_rope_head_dim)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.rotary_dim is %d, expected qk_rope_head_dim %d for MLA",
                             (int)a->rotary_dim, (int)m->qk_rope_head_dim);
    if (a->is_neox != 0 && a->is_neox != 1)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.is_neox is %d (0 or 1)",
                             (int)a->is_neox);
    if (a->k == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k is NULL (required)");
    if (a->k->ndim < 1 || a->k->shape == NULL)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "args.k has ndim %d, expected 3",
                             (int)a->k->ndim);
    int64_t t = a->k->shape[0];
    status = ap_check_append_tensors(instance, a, t, msg);
    if (status != AP_OK) return status;
    return ap_check_append_values(instance, layer, a, t, msg);
}

/* Pack inputs and outputs: [T][H][nope], [T][r] or [T][1][r], [T][H][dv] in; fp8 out. */
static ap_status ap_check_pack_tensors(const ap_instance *instance, const ap_pack_kv_args *a,
                                       int64_t h, int64_t nope, int64_t rope, int64_t dv,
                                       DLDataType act, ap_msgbuf *msg) {
    int64_t t = a->k_nope->shape[0];
    ap_status status = ap_check_tensor(instance, msg, "args.k_nope", a->k_nope, 3,
                                       (int64_t[]){t, h, nope}, act, AP_STRIDED);
    /* A free head count is k_nope's: v must have as many heads. */
    if (h == AP_ANY) h = a->k_nope->shape[1];
    if (status == AP_OK && a->k_pe == NULL)
        status = ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k_pe is NULL (required)");
    if (status == AP_OK)
        status = a->k_pe->ndim == 3 ? ap_check_tensor(instance, msg, "args.k_pe", a->k_pe, 3,
                                                      (int64_t[]){t, 1, rope}, act, AP_STRIDED)
                                    : ap_check_tensor(instance, msg, "args.k_pe", a->k_pe, 2,
                                                      (int64_t[]){t, rope}, act, AP_STRIDED);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.v", a->v, 3, (int64_t[]){t, h, dv}, act,
                                   AP_STRIDED);
    if (status != AP_OK) return status;
    /* With the dims free (a non-MLA model), they come from the inputs just checked. */
    int64_t k_width = (nope == AP_ANY ? a->k_nope->shape[2] : nope) +
                      (rope == AP_ANY ? a->k_pe->shape[a->k_pe->ndim - 1] : rope);
    int64_t heads = h, v_width = a->v->shape[2];
    status = ap_check_required(instance, msg, "args.k_out", a->k_out, 3,
                               (int64_t[]){t, heads, k_width}, AP_DL_FP8_OUT, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.v_out", a->v_out, 3,
                                   (int64_t[]){t, heads, v_width}, AP_DL_FP8_OUT, AP_DENSE);
    return status;
}

ap_status ap_check_pack_kv(const ap_instance *instance, const ap_pack_kv_args *a, ap_msgbuf *msg) {
    const ap_model *m = &instance->model;
    if (a == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_PACK_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.struct_size is %zu, expected >= %zu", a->struct_size,
                             (size_t)AP_PACK_MIN_SIZE);
    if (!ap_scale_ok(a->k_scale) || !ap_scale_ok(a->v_scale))
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.k_scale/v_scale are %g/%g (must be > 0, finite)",
                             (double)a->k_scale, (double)a->v_scale);
    if (a->k_nope == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.k_nope is NULL (required)");
    if (a->k_nope->ndim != 3 || a->k_nope->shape == NULL)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "args.k_nope has ndim %d, expected 3",
                             (int)a->k_nope->ndim);
    if (m->kind == AP_ATTN_MLA) {
        if (m->qk_nope_head_dim <= 0 || m->v_head_dim <= 0)
            return ap_check_fail(msg, AP_ERR_UNSUPPORTED,
                                 "the MLA model has no qk_nope_head_dim/v_head_dim (%d, %d) for "
                                 "a chunked prefill",
                                 (int)m->qk_nope_head_dim, (int)m->v_head_dim);
        return ap_check_pack_tensors(instance, a, m->num_qo_heads, m->qk_nope_head_dim,
                                     m->qk_rope_head_dim, m->v_head_dim, ap_dl_of(m->dtype), msg);
    }
    /* A reference backend may offer the pack to an MHA model (to test a GPU kernel against it):
     * then the model fixes no dim, and the inputs must agree with each other, in one float
     * activation type. */
    if (!ap_is_activation(a->k_nope))
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "args.k_nope has dtype code %d, %d bits: expected float32, bfloat16 "
                             "or float16",
                             (int)a->k_nope->dtype.code, (int)a->k_nope->dtype.bits);
    return ap_check_pack_tensors(instance, a, AP_ANY, AP_ANY, AP_ANY, AP_ANY, a->k_nope->dtype,
                                 msg);
}

/* Two partial states and the merged one: o_a, o_b, o [T][H][D] of one float dtype (o_a's), the
 * LSEs float32 [T][H]; all dense. o may alias o_a or o_b, lse lse_a or lse_b (each element is
 * read before its own position is written). */
ap_status ap_check_merge_state(const ap_instance *instance, const ap_merge_state_args *a,
                               ap_msgbuf *msg) {
    if (a == NULL) return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args is NULL");
    if (a->struct_size < AP_MERGE_MIN_SIZE)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT,
                             "args.struct_size is %zu, expected >= %zu", a->struct_size,
                             (size_t)AP_MERGE_MIN_SIZE);
    if (a->o_a == NULL)
        return ap_check_fail(msg, AP_ERR_INVALID_ARGUMENT, "args.o_a is NULL (required)");
    if (a->o_a->ndim != 3 || a->o_a->shape == NULL)
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH, "args.o_a has ndim %d, expected 3",
                             (int)a->o_a->ndim);
    if (!ap_is_activation(a->o_a))
        return ap_check_fail(msg, AP_ERR_SHAPE_MISMATCH,
                             "args.o_a has dtype code %d, %d bits: expected float32, bfloat16 or "
                             "float16",
                             (int)a->o_a->dtype.code, (int)a->o_a->dtype.bits);
    const int64_t *shape = a->o_a->shape;
    int64_t rows[2] = {shape[0], shape[1]};
    DLDataType type = a->o_a->dtype;
    ap_status status = ap_check_tensor(instance, msg, "args.o_a", a->o_a, 3, shape, type, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.o_b", a->o_b, 3, shape, type, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.o", a->o, 3, shape, type, AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.lse_a", a->lse_a, 2, rows, AP_DL_FLOAT32,
                                   AP_DENSE);
    if (status == AP_OK)
        status = ap_check_required(instance, msg, "args.lse_b", a->lse_b, 2, rows, AP_DL_FLOAT32,
                                   AP_DENSE);
    if (status == AP_OK)
        status =
            ap_check_optional(instance, msg, "args.lse", a->lse, 2, rows, AP_DL_FLOAT32, AP_DENSE);
    return status;
}
