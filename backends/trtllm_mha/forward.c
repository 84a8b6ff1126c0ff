/* forward.c: init_metadata, forward_decode / forward_extend: checks, the KV append, the kernels. */
#include <stdint.h>

#include "backends/common/prefill_hopper.h"
#include "backends/common/prefill_internal.h"
#include "glue.h"

/* ---- the plan ------------------------------------------------------------------------------- */

/* A prefill batch (some sequence with more than MHA_MAX_Q_LEN new tokens, or a short extend that
 * mha_short_extend_on_prefill sends there): the kit's work list, built from the batch's host
 * mirrors and moved in one copy. Such a batch is never captured. */
static ap_status mha_plan_prefill(ap_backend *b, const ap_batch *batch, void *stream,
                                  ap_msgbuf *msg) {
    const ap_model *m = &b->model;
    ap_kit_plan_buffer *buffer = &b->prefill_buffer;
    if (buffer->host == NULL) {
        ap_msgbuf_add(msg,
                      MHA_NAME ": prefill: %d new tokens in one sequence: the decode kernel takes "
                               "1..%d and the kit's prefill kernel does not serve this model "
                               "(q %s, kv %s, group %d)",
                      batch->max_q_len, MHA_MAX_Q_LEN, ap_dtype_str(m->dtype),
                      ap_dtype_str(m->kv_dtype), m->num_qo_heads / m->num_kv_heads);
        return AP_ERR_UNSUPPORTED;
    }
    if (batch->qo_indptr_host == NULL || batch->kv_page_indptr_host == NULL ||
        batch->kv_last_page_len_host == NULL) {
        ap_msgbuf_add(msg,
                      MHA_NAME ": prefill: a batch of more than %d new tokens per sequence "
                               "is planned from its host mirrors (qo_indptr, kv_page_indptr, "
                               "kv_last_page_len)",
                      MHA_MAX_Q_LEN);
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_plan_buffer_begin(buffer, MHA_NAME, msg);
    if (st != AP_OK) return st;
    ap_kit_prefill_plan_args args = ap_kit_prefill_paged_args(m, batch);
    args.host_scratch = buffer->host;
    args.device_buffer = buffer->dev;
    args.buffer_bytes = buffer->bytes;
    args.caller_uploads = 1;
    args.tile_counters = buffer->tile_counters;
    args.split_space = buffer; /* split-KV for a short chunk over a long prefix */
    mha_plan *p = &b->plan;
    p->fresh = ap_kit_batch_fresh(batch, m->page_size);
    /* the K/V type the kernel reads: nvfp4 pages are staged to the query's type first, fp8 ones
     * too where the plan is then the Hopper kernel's (its paged source reads 16-bit K/V only;
     * the mma.sync kernel reads fp8 as stored). 16-bit lets the kit plan for its Hopper kernel,
     * with the dynamic tile schedule */
    st =
        ap_kit_prefill_plan_staged(&args, m, batch->kv_page_indptr_host[batch->num_seqs], &b->stage,
                                   stream, &p->prefill_plan, &p->staged, MHA_NAME ": prefill", msg);
    if (st == AP_OK && p->prefill_plan.num_items > 0)
        st = ap_kit_plan_buffer_upload(
            buffer, (size_t)p->prefill_plan.num_items * sizeof(ap_kit_prefill_item), stream,
            MHA_NAME, msg);
    return st;
}

/* Whether this batch runs on the kit's prefill kernel instead of the decode kernel: a short
 * extend (2..MHA_MAX_Q_LEN new tokens a sequence) option short_extend sends there
 * (mha_short_extend_prefill, plan.c), which the prefill can take: the host mirrors its plan reads
 * and the Hopper kernel (the mma.sync one is no faster than the decode kernel). Extend only:
 * forward_decode's batches stay on the decode kernel, so their graph capture holds. */
static int mha_short_extend_on_prefill(const ap_backend *b, const ap_batch *batch,
                                       int32_t max_q_len) {
    const ap_model *m = &b->model;
    if (batch->mode != AP_MODE_EXTEND ||
        !mha_short_extend_prefill(b->short_extend, max_q_len, m, batch->num_seqs,
                                  batch->max_seq_len, b->split_kv) ||
        b->prefill_buffer.host == NULL || batch->qo_indptr_host == NULL ||
        batch->kv_page_indptr_host == NULL || batch->kv_last_page_len_host == NULL)
        return 0;
    ap_kit_prefill_plan_args args = ap_kit_prefill_paged_args(m, batch);
    args.kv_dtype = m->kv_dtype;
    return ap_kit_prefill_hopper_tile_rows(&args) > 0;
}

/* Decode and multi-token decode read only the batch's scalars here and launch one kernel (the new
 * tokens' cache slots, from the device arrays): no host mirror, no copy, no allocation, so every
 * call after it may be captured in a CUDA graph. */
ap_status mha_init_metadata(ap_backend *b, const ap_batch *batch, void *stream, ap_msgbuf *msg) {
    if (b == NULL || batch == NULL || batch->struct_size < offsetof(ap_batch, kv_indptr)) {
        ap_msgbuf_add(msg, MHA_NAME ": init_metadata needs an instance and a batch");
        return AP_ERR_INVALID_ARGUMENT;
    }
    mha_plan *p = &b->plan;
    memset(p, 0, sizeof *p);
    if (AP_HAS_FIELD(batch, ap_batch, kv_indptr_host) &&
        (batch->kv_indptr != NULL || batch->kv_indptr_host != NULL)) {
        ap_msgbuf_add(msg, MHA_NAME ": a ragged K/V source (kv_indptr) is not served: trtllm_mha "
                                    "attends over the paged cache");
        return AP_ERR_UNSUPPORTED;
    }
    if (batch->num_seqs > 0 && (batch->qo_indptr == NULL || batch->kv_page_indptr == NULL ||
                                batch->kv_page_indices == NULL || batch->seq_lens == NULL)) {
        ap_msgbuf_add(msg, MHA_NAME ": the batch needs qo_indptr, the page arrays and seq_lens "
                                    "on the device");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (batch->num_tokens > b->model.max_tokens || batch->num_seqs > b->model.max_batch) {
        ap_msgbuf_add(msg, MHA_NAME ": batch of %d sequences, %d tokens past the model's %d, %d",
                      batch->num_seqs, batch->num_tokens, b->model.max_batch, b->model.max_tokens);
        return AP_ERR_INVALID_ARGUMENT;
    }
    p->mode = batch->mode;
    p->num_seqs = batch->num_seqs;
    p->num_tokens = batch->num_tokens;
    p->max_q_len = batch->max_q_len > 0 ? batch->max_q_len : 1;
    p->qo_indptr = batch->qo_indptr;
    p->kv_page_indptr = batch->kv_page_indptr;
    p->kv_page_indices = batch->kv_page_indices;
    p->kv_last_page_len = batch->kv_last_page_len;
    p->seq_lens = batch->seq_lens;
    const int32_t group = b->model.num_qo_heads / b->model.num_kv_heads;
    const int32_t heads_per_cta =
        mha_decode_heads_per_cta(b->model.kv_dtype, b->model.head_dim_qk, group, p->max_q_len,
                                 b->model.num_kv_heads, b->keys_m);
    p->num_splits = b->split_kv
                        ? mha_decode_num_splits(p->num_seqs, b->model.num_kv_heads, group,
                                                p->max_q_len, b->model.head_dim_qk, b->wave_slots,
                                                MHA_MAX_SPLITS, heads_per_cta)
                        : 1;
    /* the flat schedule (one wave of its kernel: 2 partial slots per CTA in the workspace) cuts
     * units between CTAs: with split-KV on only */
    p->flat_ctas = b->split_kv && b->schedule == MHA_SCHEDULE_FLAT ? b->flat_slots : 0;
    ap_status st = ap_kit_set_device(b->device_ordinal, MHA_NAME, msg);
    p->prefill =
        p->max_q_len > MHA_MAX_Q_LEN || mha_short_extend_on_prefill(b, batch, p->max_q_len);
    if (st == AP_OK && p->prefill) st = mha_plan_prefill(b, batch, stream, msg);
    if (st == AP_OK && p->num_tokens > 0) {
        const mha_slots_params sp = {
            .qo_indptr = p->qo_indptr,
            .kv_page_indptr = p->kv_page_indptr,
            .kv_page_indices = p->kv_page_indices,
            .seq_lens = p->seq_lens,
            .num_seqs = p->num_seqs,
            .num_tokens = p->num_tokens,
            .page_size = b->model.page_size,
            .slots = b->slots,
        };
        st = mha_slots_run(&sp, stream, msg);
    }
    p->ready = st == AP_OK;
    return st;
}

/* ---- the forwards --------------------------------------------------------------------------- */

/* What the core leaves to us (plugin_api.h's promise covers shapes, dtypes, density, devices):
 * 16-byte aligned rows and pages, and the layer features the caps do not declare. */
static ap_status mha_layer_args_check(const ap_layer *layer, const ap_forward_args *args,
                                      ap_msgbuf *msg) {
    const ap_kv_cache *kv = layer->kv;
    if (layer->logit_softcap != 0.f || layer->window_left >= 0) {
        ap_msgbuf_add(msg, MHA_NAME ": layer %d asks for %s, which this backend does not serve",
                      layer->layer_id,
                      layer->logit_softcap != 0.f ? "a logit softcap" : "a sliding window");
        return AP_ERR_UNSUPPORTED;
    }
    if ((uintptr_t)kv->k_pages % 16 != 0 || (uintptr_t)kv->v_pages % 16 != 0 ||
        (uintptr_t)kv->k_block_scales % 16 != 0 || (uintptr_t)kv->v_block_scales % 16 != 0) {
        ap_msgbuf_add(msg, MHA_NAME ": layer %d's pages and scales must be 16-byte aligned",
                      layer->layer_id);
        return AP_ERR_UNSUPPORTED;
    }
    ap_status st = ap_kit_aligned(args->q, "q", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->out, "out", 16, MHA_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->lse, "lse", sizeof(float), MHA_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->k, "k", 16, MHA_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->v, "v", 16, MHA_NAME, msg);
    return st;
}

static ap_status mha_run_prefill(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                                 void *stream, ap_msgbuf *msg) {
    const mha_plan *p = &b->plan;
    const int32_t *page_indices = p->kv_page_indices;
    ap_kit_nvfp4_staged staged;
    if (p->staged) { /* staged to the query's type first */
        ap_status st = ap_kit_nvfp4_stager_run(&b->stage, &b->model, layer, page_indices, stream,
                                               &staged, MHA_NAME ": staged prefill", msg);
        if (st != AP_OK) return st;
        layer = &staged.layer;
        page_indices = staged.page_indices;
    }
    const ap_kv_cache *kv = layer->kv;
    ap_kit_prefill_params kit = {
        .q = ap_kit_data(args->q),
        .out = ap_kit_data(args->out),
        .lse = args->lse != NULL ? (float *)ap_kit_data(args->lse) : NULL,
        .q_dtype = b->model.dtype,
        .kv_dtype = kv->dtype,
        .head_dim_qk = kv->head_dim_qk,
        .head_dim_v = kv->head_dim_v,
        .num_qo_heads = b->model.num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .causal = 1,
        .sm_scale = layer->sm_scale,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .qo_indptr = p->qo_indptr,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .page_size = kv->page_size,
        .kv_page_indptr = p->kv_page_indptr,
        .kv_page_indices = page_indices,
        .kv_last_page_len = p->kv_last_page_len,
    };
    /* a fresh prefill reads its saved k / v in place where the plan's tiles allow (the kit) */
    ap_kit_prefill_plan ragged;
    const int in_place = ap_kit_prefill_fresh_in_place(&p->prefill_plan, p->fresh, &b->model, layer,
                                                       args, p->num_tokens, &kit, &ragged);
    return ap_kit_prefill_run(&kit, in_place ? &ragged : &p->prefill_plan, stream,
                              MHA_NAME ": prefill", msg);
}

static ap_status mha_forward(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             ap_forward_mode mode, void *stream, ap_msgbuf *msg) {
    const char *entry = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (b == NULL || layer == NULL || layer->kv == NULL || args == NULL) {
        ap_msgbuf_add(msg, MHA_NAME ": forward_%s needs an instance, a layer and its args", entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const mha_plan *p = &b->plan;
    if (!p->ready || p->mode != mode) {
        ap_msgbuf_add(msg, MHA_NAME ": forward_%s without init_metadata of a %s batch", entry,
                      entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = mha_layer_args_check(layer, args, msg);
    if (st != AP_OK || p->num_tokens == 0) return st;
    st = ap_kit_set_device(b->device_ordinal, MHA_NAME, msg);
    if (st == AP_OK && args->save_kv)
        st = ap_kit_save_kv(&b->model, layer, args, b->slots, p->num_tokens, stream, MHA_NAME, msg);
    if (st != AP_OK) return st;
    if (p->prefill) return mha_run_prefill(b, layer, args, stream, msg);
    const ap_kv_cache *kv = layer->kv;
    const mha_decode_params dp = {
        .q = ap_kit_data(args->q),
        .out = ap_kit_data(args->out),
        .lse = args->lse != NULL ? (float *)ap_kit_data(args->lse) : NULL,
        .q_dtype = b->model.dtype,
        .kv_dtype = kv->dtype,
        .k_pages = kv->k_pages,
        .v_pages = kv->v_pages,
        .k_scales = kv->k_block_scales,
        .v_scales = kv->v_block_scales,
        .k_scale = layer->k_scale,
        .v_scale = layer->v_scale,
        .sm_scale = layer->sm_scale,
        .head_dim = kv->head_dim_qk,
        .page_size = kv->page_size,
        .num_qo_heads = b->model.num_qo_heads,
        .num_kv_heads = kv->num_kv_heads,
        .num_seqs = p->num_seqs,
        .max_q_len = p->max_q_len,
        .qo_indptr = p->qo_indptr,
        .kv_page_indptr = p->kv_page_indptr,
        .kv_page_indices = p->kv_page_indices,
        .seq_lens = p->seq_lens,
        .num_splits = p->num_splits,
        .flat_ctas = p->flat_ctas,
        .keys_m = b->keys_m,
        .partial_out = b->partial_out,
        .partial_lse = b->partial_lse,
    };
    return mha_decode_run(&dp, stream, msg);
}

ap_status mha_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return mha_forward(b, layer, args, AP_MODE_DECODE, stream, msg);
}

/* Extend: 1..8 new tokens per sequence (speculative verification, MTP) on the decode kernel,
 * causal among themselves, the extra rows on the same K/V tiles, unless option short_extend
 * sends them to the kit's prefill kernel (mha_short_extend_on_prefill); longer ones on the kit's
 * prefill kernel (planned in init_metadata). */
ap_status mha_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    return mha_forward(b, layer, args, AP_MODE_EXTEND, stream, msg);
}
