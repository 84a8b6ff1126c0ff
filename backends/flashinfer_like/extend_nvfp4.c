/* extend_nvfp4.c: extend over an nvfp4 cache: the batch's pages staged as 16-bit, then extend. */
#include <stdint.h>

#include "glue.h"

#define FIL_NVFP4_WHO FIL_NAME ": nvfp4 extend"

/* Bytes of one staged page of K (or V) and of the whole buffer for `pages` pages: K, V, then the
 * staged page indices 0 .. pages - 1, each part 256-byte aligned. */
static size_t fil_stage_page_bytes(const ap_model *m) {
    return (size_t)m->page_size * (size_t)m->num_kv_heads * (size_t)m->head_dim_qk * 2;
}

static size_t fil_stage_bytes(const ap_model *m, int32_t pages) {
    size_t half = ((fil_stage_page_bytes(m) * (size_t)pages + 255) / 256) * 256;
    return 2 * half + (size_t)pages * sizeof(int32_t);
}

/* Every page the batch names is staged, shared prefix pages once per naming: the buffer grows to
 * the largest batch seen (a plan reads host mirrors already; this allocation is the plan's). */
ap_status fil_extend_nvfp4_reserve(ap_backend *b, const ap_batch *batch, ap_msgbuf *msg) {
    if (b->model.kv_dtype != AP_DTYPE_NVFP4 || batch->mode != AP_MODE_EXTEND) return AP_OK;
    const int32_t pages = batch->kv_page_indptr_host[batch->num_seqs];
    const size_t need = fil_stage_bytes(&b->model, pages);
    b->stage_pages = 0;
    if (need > b->stage_bytes) {
        ap_kit_device_free(b->stage); /* waits for the kernels still reading it */
        b->stage = NULL;
        b->stage_bytes = 0;
        ap_status st = ap_kit_device_alloc(need, &b->stage, FIL_NVFP4_WHO, msg);
        if (st != AP_OK) return st;
        b->stage_bytes = need;
    }
    b->stage_pages = pages;
    return AP_OK;
}

void fil_extend_nvfp4_free(ap_backend *b) {
    ap_kit_device_free(b->stage);
    b->stage = NULL;
    b->stage_bytes = 0;
}

/* K is staged exactly (e2m1 * e4m3) and its global scale moves into the softmax scale, as the
 * fp8 path folds k_scale; V is staged times its global scale (one rounding to 16 bits). The
 * extend then runs over a layer whose cache is the staged copy. */
ap_status fil_extend_nvfp4_run(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                               void *stream, ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    const size_t half =
        ((fil_stage_page_bytes(&b->model) * (size_t)b->stage_pages + 255) / 256) * 256;
    char *stage = b->stage;
    if (stage == NULL || kv->k_block_scales == NULL || kv->v_block_scales == NULL) {
        ap_msgbuf_add(msg, FIL_NVFP4_WHO ": layer %d: no staging buffer or block scales",
                      layer->layer_id);
        return AP_ERR_INVALID_ARGUMENT;
    }
    int32_t *indices = (int32_t *)(stage + 2 * half);
    ap_kit_nvfp4_stage_args st_args = {
        .pages = {kv->k_pages, kv->v_pages},
        .block_scales = {kv->k_block_scales, kv->v_block_scales},
        .multiplier = {1.0f, layer->v_scale},
        .out = {stage, stage + half},
        .out_dtype = b->model.dtype,
        .page_indices = b->plan.kv_page_indices,
        .staged_indices = indices,
        .num_pages = b->stage_pages,
        .page_size = kv->page_size,
        .num_kv_heads = kv->num_kv_heads,
        .head_dim = kv->head_dim_qk,
    };
    ap_status st = ap_kit_nvfp4_stage_run(&st_args, stream, FIL_NVFP4_WHO, msg);
    if (st != AP_OK) return st;
    ap_kv_cache staged_kv = *kv;
    staged_kv.dtype = b->model.dtype;
    staged_kv.k_pages = stage;
    staged_kv.v_pages = stage + half;
    staged_kv.k_block_scales = NULL;
    staged_kv.v_block_scales = NULL;
    ap_layer staged_layer = *layer;
    staged_layer.kv = &staged_kv;
    staged_layer.sm_scale = layer->sm_scale * layer->k_scale;
    fil_batch_plan staged_plan = b->plan;
    staged_plan.kv_page_indices = indices;
    return fil_extend_run(&b->model, &staged_layer, args, &staged_plan, stream, msg);
}
