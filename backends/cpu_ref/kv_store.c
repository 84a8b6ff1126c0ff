/* kv_store.c: the paged KV cache: checking a layer's view, slot addressing, (de)quantization. */
#include <math.h>

#include "backends/common/host_numeric.h"
#include "cpu_ref.h"

size_t cpu_kv_elem_bytes(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_F32: return 4;
        case AP_DTYPE_BF16:
        case AP_DTYPE_F16: return 2;
        case AP_DTYPE_FP8_E4M3:
        case AP_DTYPE_FP8_E5M2: return 1;
        default: return 0;
    }
}

static int cpu_kv_is_fp8(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2;
}

/* The scale the cache applies to an element: fp8 stores x / scale; bf16/f16 store x itself, and
 * their scale is ignored (plugin_api.h: "1 otherwise"). */
float cpu_kv_effective_scale(ap_dtype dtype, float scale) {
    return cpu_kv_is_fp8(dtype) ? scale : 1.0f;
}

/* Does the layer's cache match the model this instance was made for? Checked on every call:
 * cpu_ref writes through these pointers and sizes. */
ap_status cpu_kv_check(const ap_model *model, const ap_layer *layer, ap_msgbuf *msg) {
    if (layer == NULL || layer->struct_size < sizeof(ap_layer) || layer->kv == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: the layer or its KV cache view is missing (or too old)");
        return AP_ERR_INVALID_ARGUMENT;
    }
    const ap_kv_cache *kv = layer->kv;
    if (kv->struct_size < sizeof(ap_kv_cache)) {
        ap_msgbuf_add(msg, "cpu_ref: ap_kv_cache struct_size %zu < %zu", kv->struct_size,
                      sizeof(ap_kv_cache));
        return AP_ERR_INVALID_ARGUMENT;
    }
    /* MLA keeps one latent row per token (V is its first kv_lora_rank values): no V width. */
    int mla = model->kind == AP_ATTN_MLA;
    if (kv->layout != AP_KV_LAYOUT_NHD || kv->dtype != model->kv_dtype ||
        kv->page_size != model->page_size || kv->num_kv_heads != model->num_kv_heads ||
        kv->head_dim_qk != model->head_dim_qk || (!mla && kv->head_dim_v != model->head_dim_v)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: layer %d KV cache (layout %d, dtype %s, page %d, %d heads, dims "
                      "%d/%d) does not match the model (dtype %s, page %d, %d heads, dims %d/%d)",
                      layer->layer_id, (int)kv->layout, ap_dtype_str(kv->dtype), kv->page_size,
                      kv->num_kv_heads, kv->head_dim_qk, kv->head_dim_v,
                      ap_dtype_str(model->kv_dtype), model->page_size, model->num_kv_heads,
                      model->head_dim_qk, model->head_dim_v);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (kv->num_pages < 0 ||
        (kv->num_pages > 0 && (kv->k_pages == NULL || (!mla && kv->v_pages == NULL)))) {
        ap_msgbuf_add(msg, "cpu_ref: layer %d KV cache has %d pages and a NULL k or v base",
                      layer->layer_id, kv->num_pages);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (cpu_kv_is_fp8(kv->dtype) && (!(layer->k_scale > 0.0f) || !(layer->v_scale > 0.0f) ||
                                     isinf(layer->k_scale) || isinf(layer->v_scale))) {
        ap_msgbuf_add(msg, "cpu_ref: layer %d fp8 scales must be finite and > 0 (k %g, v %g)",
                      layer->layer_id, (double)layer->k_scale, (double)layer->v_scale);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

/* Every page index of the planned batch must name a page of this layer's cache: checked before
 * anything is written, so a bad index changes no byte. */
ap_status cpu_kv_check_pages(const cpu_plan *plan, const ap_kv_cache *kv, ap_msgbuf *msg) {
    for (int32_t p = 0; p < plan->num_pages_total; p++) {
        int32_t page = plan->kv_page_indices[p];
        if (page < 0 || page >= kv->num_pages) {
            ap_msgbuf_add(msg, "cpu_ref: kv_page_indices[%d] = %d is outside the cache's %d pages",
                          p, page, kv->num_pages);
            return AP_ERR_SHAPE_MISMATCH;
        }
    }
    return AP_OK;
}

/* Slot of position `pos` of sequence `seq`: its page is the (pos / page_size)-th of the
 * sequence's pages, its offset pos % page_size; slot = page * page_size + offset. */
int64_t cpu_kv_slot_of(const cpu_plan *plan, const ap_kv_cache *kv, int32_t seq, int32_t pos) {
    int32_t page = plan->kv_page_indices[plan->kv_page_indptr[seq] + pos / kv->page_size];
    return (int64_t)page * kv->page_size + pos % kv->page_size;
}

/* NHD: element (slot, head, d) of K sits at ((slot * num_kv_heads + head) * head_dim_qk + d). */
void *cpu_kv_k_row(const ap_kv_cache *kv, int64_t slot, int32_t head) {
    size_t index =
        ((size_t)slot * (size_t)kv->num_kv_heads + (size_t)head) * (size_t)kv->head_dim_qk;
    return (char *)kv->k_pages + index * cpu_kv_elem_bytes(kv->dtype);
}

void *cpu_kv_v_row(const ap_kv_cache *kv, int64_t slot, int32_t head) {
    size_t index =
        ((size_t)slot * (size_t)kv->num_kv_heads + (size_t)head) * (size_t)kv->head_dim_v;
    return (char *)kv->v_pages + index * cpu_kv_elem_bytes(kv->dtype);
}

/* Quantize one value into the cache's dtype: bf16/f16 by round-to-nearest-even conversion of x,
 * fp8 as saturate_fp8(x / scale) with the division done in float32 (what a kernel does). */
void cpu_kv_store_row(ap_dtype dtype, void *row, const float *values, int32_t dim, float scale) {
    for (int32_t d = 0; d < dim; d++) {
        float x = values[d];
        uint16_t half;
        switch (dtype) {
            case AP_DTYPE_F32: memcpy((char *)row + 4 * (size_t)d, &x, 4); break;
            case AP_DTYPE_BF16:
                half = ap_float_to_bf16(x);
                memcpy((char *)row + 2 * (size_t)d, &half, 2);
                break;
            case AP_DTYPE_F16:
                half = ap_float_to_f16(x);
                memcpy((char *)row + 2 * (size_t)d, &half, 2);
                break;
            case AP_DTYPE_FP8_E4M3: ((uint8_t *)row)[d] = ap_float_to_fp8_e4m3(x / scale); break;
            case AP_DTYPE_FP8_E5M2: ((uint8_t *)row)[d] = ap_float_to_fp8_e5m2(x / scale); break;
            default: break;
        }
    }
}

/* The stored codes of one row as floats, exactly, WITHOUT the fp8 scale (the caller applies it
 * in double so the oracle rounds once). */
void cpu_kv_load_row(ap_dtype dtype, const void *row, float *values, int32_t dim) {
    for (int32_t d = 0; d < dim; d++) {
        uint16_t half;
        switch (dtype) {
            case AP_DTYPE_F32: memcpy(&values[d], (const char *)row + 4 * (size_t)d, 4); break;
            case AP_DTYPE_BF16:
                memcpy(&half, (const char *)row + 2 * (size_t)d, 2);
                values[d] = ap_bf16_to_float(half);
                break;
            case AP_DTYPE_F16:
                memcpy(&half, (const char *)row + 2 * (size_t)d, 2);
                values[d] = ap_f16_to_float(half);
                break;
            case AP_DTYPE_FP8_E4M3:
                values[d] = ap_fp8_e4m3_to_float(((const uint8_t *)row)[d]);
                break;
            case AP_DTYPE_FP8_E5M2:
                values[d] = ap_fp8_e5m2_to_float(((const uint8_t *)row)[d]);
                break;
            default: values[d] = 0.0f; break;
        }
    }
}
