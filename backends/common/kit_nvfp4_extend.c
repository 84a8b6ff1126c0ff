/* kit_nvfp4_extend.c: extend over an nvfp4 (or fp8) cache for any backend: the batch's pages
 * staged as a compact 16-bit cache, then the 16-bit prefill runs over that copy. */
#include <stdint.h>
#include <string.h>

#include "kit.h"

/* Bytes of one staged page of K (or V) and of the whole buffer for `pages` pages: K, V, then the
 * staged page indices 0 .. pages - 1, each part 256-byte aligned. */
static size_t ap_stage_page_bytes(const ap_model *m) {
    return (size_t)m->page_size * (size_t)m->num_kv_heads * (size_t)m->head_dim_qk * 2;
}

static size_t ap_stage_half_bytes(const ap_model *m, int32_t pages) {
    return ((ap_stage_page_bytes(m) * (size_t)pages + 255) / 256) * 256;
}

size_t ap_kit_nvfp4_stage_bytes(const ap_model *model, int32_t pages) {
    return 2 * ap_stage_half_bytes(model, pages) + (size_t)pages * sizeof(int32_t);
}

/* Grow-only: the buffer keeps the size of the largest batch seen. */
static ap_status stager_reserve(ap_kit_nvfp4_stager *s, const ap_model *model, int32_t pages,
                                const char *who, ap_msgbuf *msg) {
    s->pages = 0;
    const ap_status st = ap_kit_device_reserve(&s->buffer, &s->bytes,
                                               ap_kit_nvfp4_stage_bytes(model, pages), who, msg);
    if (st == AP_OK) s->pages = pages;
    return st;
}

ap_status ap_kit_stage_reserve(ap_kit_nvfp4_stager *s, const ap_model *model, int32_t pages,
                               int32_t plan_hopper, int32_t *staged, int32_t *replan,
                               const char *who, ap_msgbuf *msg) {
    const int fp8 = model->kv_dtype == AP_DTYPE_FP8_E4M3;
    *staged = model->kv_dtype == AP_DTYPE_NVFP4 || (fp8 && plan_hopper);
    *replan = 0;
    if (!*staged) return AP_OK;
    const size_t length = msg != NULL ? msg->length : 0;
    const ap_status st = stager_reserve(s, model, pages, who, msg);
    if (st != AP_ERR_OUT_OF_MEMORY || !fp8) return st;
    if (msg != NULL && msg->text != NULL && length < msg->capacity) { /* the line added above */
        msg->length = length;
        msg->text[length] = '\0';
    }
    *staged = 0;
    *replan = 1;
    return AP_OK;
}

void ap_kit_nvfp4_stager_free(ap_kit_nvfp4_stager *s) {
    ap_kit_device_free(s->buffer);
    s->buffer = NULL;
    s->bytes = 0;
    s->pages = 0;
}

/* K is staged exactly (e2m1 * e4m3 is a bf16 and a half) and its global scale moves into the
 * softmax scale, as the fp8 path folds k_scale; V is staged times its global scale (one
 * rounding to 16 bits; the prefill kernel scales no 16-bit V). */
ap_status ap_kit_nvfp4_stager_run(const ap_kit_nvfp4_stager *s, const ap_model *model,
                                  const ap_layer *layer, const int32_t *page_indices, void *stream,
                                  ap_kit_nvfp4_staged *out, const char *who, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    const int fp8 = kv->dtype == AP_DTYPE_FP8_E4M3;
    if (s->buffer == NULL || (!fp8 && (kv->k_block_scales == NULL || kv->v_block_scales == NULL))) {
        ap_msgbuf_add(msg, "%s: layer %d: no staging buffer or block scales", who, layer->layer_id);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const size_t half = ap_stage_half_bytes(model, s->pages);
    char *stage = s->buffer;
    int32_t *indices = (int32_t *)(stage + 2 * half);
    const ap_kit_nvfp4_stage_args args = {
        .pages = {kv->k_pages, kv->v_pages},
        .block_scales = {kv->k_block_scales, kv->v_block_scales},
        .multiplier = {1.0f, layer->v_scale},
        .out = {stage, stage + half},
        .out_dtype = model->dtype,
        .page_indices = page_indices,
        .staged_indices = indices,
        .num_pages = s->pages,
        .page_size = kv->page_size,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
        .in_dtype = kv->dtype,
    };
    ap_status st = ap_kit_nvfp4_stage_run(&args, stream, who, msg);
    if (st != AP_OK) return st;
    /* copies of the caller's structs, no more bytes than their struct_size says they hold */
    memset(out, 0, sizeof *out);
    memcpy(&out->kv, kv, kv->struct_size < sizeof out->kv ? kv->struct_size : sizeof out->kv);
    out->kv.dtype = model->dtype;
    out->kv.k_pages = stage;
    out->kv.v_pages = stage + half;
    out->kv.k_block_scales = NULL;
    out->kv.v_block_scales = NULL;
    memcpy(&out->layer, layer,
           layer->struct_size < sizeof out->layer ? layer->struct_size : sizeof out->layer);
    out->layer.kv = &out->kv;
    out->layer.sm_scale = layer->sm_scale * layer->k_scale;
    out->page_indices = indices;
    return AP_OK;
}
