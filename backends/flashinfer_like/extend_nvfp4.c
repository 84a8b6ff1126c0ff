/* extend_nvfp4.c: extend over an nvfp4 cache (and an fp8 one on the Hopper kernel): the kit
 * stages the batch's pages as 16-bit, then the 16-bit extend runs over that copy. */
#include <stdint.h>

#include "glue.h"

#define FIL_NVFP4_WHO FIL_NAME ": staged extend"

/* Every page the batch names is staged, shared prefix pages once per naming: an nvfp4 cache, and
 * an fp8 one whose plan is the Hopper kernel's (after fil_plan_extend); *replan as the kit's
 * ap_kit_stage_reserve says (an fp8 cache without memory to stage it). */
ap_status fil_extend_nvfp4_reserve(ap_backend *b, const ap_batch *batch, int32_t *replan,
                                   ap_msgbuf *msg) {
    *replan = 0;
    b->plan.extend_staged = 0;
    if (batch->mode != AP_MODE_EXTEND) return AP_OK;
    return ap_kit_stage_reserve(&b->stage, &b->model, batch->kv_page_indptr_host[batch->num_seqs],
                                b->plan.extend.hopper, &b->plan.extend_staged, replan,
                                FIL_NVFP4_WHO, msg);
}

void fil_extend_nvfp4_free(ap_backend *b) {
    ap_kit_nvfp4_stager_free(&b->stage);
}

ap_status fil_extend_nvfp4_run(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                               void *stream, ap_msgbuf *msg) {
    ap_kit_nvfp4_staged staged;
    ap_status st = ap_kit_nvfp4_stager_run(&b->stage, &b->model, layer, b->plan.kv_page_indices,
                                           stream, &staged, FIL_NVFP4_WHO, msg);
    if (st != AP_OK) return st;
    fil_batch_plan staged_plan = b->plan;
    staged_plan.kv_page_indices = staged.page_indices;
    return fil_extend_run(&b->model, &staged.layer, args, &staged_plan, stream, msg);
}
