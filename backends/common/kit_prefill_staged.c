/* kit_prefill_staged.c: a paged prefill's plan over a cache the kit may stage to 16 bits (nvfp4,
 * fp8), with the fall-back to fp8 as stored where there is no memory to stage it (prefill.h). */
#include "kit.h"
#include "prefill.h"

ap_status ap_kit_prefill_plan_staged(ap_kit_prefill_plan_args *args, const ap_model *model,
                                     int32_t pages, ap_kit_nvfp4_stager *stager, void *stream,
                                     ap_kit_prefill_plan *plan, int32_t *staged, const char *who,
                                     ap_msgbuf *msg) {
    int32_t replan = 0;
    *staged = 0;
    args->kv_dtype = ap_kit_staged_kv_dtype(model);
    ap_status st = ap_kit_prefill_plan_build(args, stream, plan, who, msg);
    if (st == AP_OK)
        st = ap_kit_stage_reserve(stager, model, pages, plan->hopper, staged, &replan, who, msg);
    if (st == AP_OK && replan) { /* no memory to stage the fp8 cache: read as stored */
        args->kv_dtype = model->kv_dtype;
        st = ap_kit_prefill_plan_build(args, stream, plan, who, msg);
    }
    return st;
}
