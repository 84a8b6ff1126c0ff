/* kv_store.c: the paged KV cache: checking a layer's view, slot addressing, (de)quantization. */
#include <math.h>

#include "backends/numeric/host_numeric.h"
#include "backends/numeric/nvfp4_host.h"
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

/* fp8 and nvfp4: the layer's k_scale / v_scale take part in what is stored. */
static int cpu_kv_is_scaled(ap_dtype dtype) {
    return dtype == AP_DTYPE_FP8_E4M3 || dtype == AP_DTYPE_FP8_E5M2 || dtype == AP_DTYPE_NVFP4;
}

/* The scale the cache applies to an element: fp8 stores x / scale, nvfp4 uses it as the global
 * scale; bf16/f16 store x itself, and their scale is ignored (plugin_api.h: "1 otherwise"). */
float cpu_kv_effective_scale(ap_dtype dtype, float scale) {
    return cpu_kv_is_scaled(dtype) ? scale : 1.0f;
}

/* Bytes of `count` consecutive cache elements (count a multiple of 16 for nvfp4: 2 per byte). */
size_t cpu_kv_bytes(ap_dtype dtype, size_t count) {
    return dtype == AP_DTYPE_NVFP4 ? count / 2 : count * cpu_kv_elem_bytes(dtype);
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
    if (kv->dtype == AP_DTYPE_NVFP4 && kv->num_pages > 0 &&
        (kv->k_block_scales == NULL || kv->v_block_scales == NULL)) {
        ap_msgbuf_add(msg, "cpu_ref: layer %d nvfp4 KV cache without its k/v block-scale buffers",
                      layer->layer_id);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (cpu_kv_is_scaled(kv->dtype) && (!(layer->k_scale > 0.0f) || !(layer->v_scale > 0.0f) ||
                                        isinf(layer->k_scale) || isinf(layer->v_scale))) {
        ap_msgbuf_add(msg, "cpu_ref: layer %d %s scales must be finite and > 0 (k %g, v %g)",
                      layer->layer_id, ap_dtype_str(kv->dtype), (double)layer->k_scale,
                      (double)layer->v_scale);
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

/* NHD: element (slot, head, d) of K sits at ((slot * num_kv_heads + head) * head_dim_qk + d);
 * an nvfp4 row's block scales at that index / 16 of the block-scale buffer. */
static size_t cpu_kv_row_index(const ap_kv_cache *kv, int64_t slot, int32_t head, int32_t dim) {
    return ((size_t)slot * (size_t)kv->num_kv_heads + (size_t)head) * (size_t)dim;
}

/* One (slot, head) row of K (is_v 0) or V (is_v 1): its values and, for nvfp4, its scales. */
typedef struct cpu_kv_row {
    void *values;
    uint8_t *scales; /* NULL unless the cache has block scales */
    int32_t dim;
} cpu_kv_row;

static cpu_kv_row cpu_kv_row_at(const ap_kv_cache *kv, int is_v, int64_t slot, int32_t head) {
    int32_t dim = is_v ? kv->head_dim_v : kv->head_dim_qk;
    size_t index = cpu_kv_row_index(kv, slot, head, dim);
    char *pages = is_v ? kv->v_pages : kv->k_pages;
    uint8_t *scales = is_v ? kv->v_block_scales : kv->k_block_scales;
    return (cpu_kv_row){pages + cpu_kv_bytes(kv->dtype, index),
                        scales != NULL ? scales + index / AP_NVFP4_BLOCK : NULL, dim};
}

/* Quantize one value into the cache's dtype: bf16/f16 by round-to-nearest-even conversion of x,
 * fp8 as saturate_fp8(x / scale) with the division done in float32 (what a kernel does). */
static void cpu_kv_store_row(ap_dtype dtype, void *row, const float *values, int32_t dim,
                             float scale) {
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
static void cpu_kv_load_row(ap_dtype dtype, const void *row, float *values, int32_t dim) {
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

/* nvfp4: each block of 16 values quantized with the global scale (nvfp4_host.h). */
static void cpu_kv_store_nvfp4(uint8_t *row, uint8_t *scales, const float *values, int32_t dim,
                               float global_scale) {
    for (int32_t b = 0; b < dim / AP_NVFP4_BLOCK; b++)
        scales[b] = ap_nvfp4_quantize_block(values + (size_t)b * AP_NVFP4_BLOCK, global_scale,
                                            row + (size_t)b * (AP_NVFP4_BLOCK / 2));
}

/* nvfp4 read back as e2m1 * e4m3, exact, WITHOUT the global scale (as fp8 without its scale). */
static void cpu_kv_load_nvfp4(const uint8_t *row, const uint8_t *scales, float *values,
                              int32_t dim) {
    for (int32_t d = 0; d < dim; d++)
        values[d] = ap_nvfp4_unscaled(row + (size_t)(d / AP_NVFP4_BLOCK) * (AP_NVFP4_BLOCK / 2),
                                      scales[d / AP_NVFP4_BLOCK], d % AP_NVFP4_BLOCK);
}

/* One (slot, head) row of K or V into the cache, quantized with the layer's scale. */
static void cpu_kv_store(const ap_kv_cache *kv, int is_v, int64_t slot, int32_t head,
                         const float *values, float scale) {
    cpu_kv_row row = cpu_kv_row_at(kv, is_v, slot, head);
    if (kv->dtype == AP_DTYPE_NVFP4)
        cpu_kv_store_nvfp4(row.values, row.scales, values, row.dim, scale);
    else
        cpu_kv_store_row(kv->dtype, row.values, values, row.dim, scale);
}

/* One (slot, head) row of K or V as stored, without the layer's scale (cpu_kv_load_row). */
static void cpu_kv_load(const ap_kv_cache *kv, int is_v, int64_t slot, int32_t head,
                        float *values) {
    cpu_kv_row row = cpu_kv_row_at(kv, is_v, slot, head);
    if (kv->dtype == AP_DTYPE_NVFP4)
        cpu_kv_load_nvfp4(row.values, row.scales, values, row.dim);
    else
        cpu_kv_load_row(kv->dtype, row.values, values, row.dim);
}

void cpu_kv_store_k(const ap_kv_cache *kv, int64_t slot, int32_t head, const float *values,
                    float scale) {
    cpu_kv_store(kv, 0, slot, head, values, scale);
}

void cpu_kv_store_v(const ap_kv_cache *kv, int64_t slot, int32_t head, const float *values,
                    float scale) {
    cpu_kv_store(kv, 1, slot, head, values, scale);
}

void cpu_kv_load_k(const ap_kv_cache *kv, int64_t slot, int32_t head, float *values) {
    cpu_kv_load(kv, 0, slot, head, values);
}

void cpu_kv_load_v(const ap_kv_cache *kv, int64_t slot, int32_t head, float *values) {
    cpu_kv_load(kv, 1, slot, head, values);
}
