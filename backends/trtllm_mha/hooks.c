/* hooks.c: append_kv/1 (the kit's fused RoPE + quantize + append kernel) and cuda_graph/1. */
#include <stdint.h>

#include "glue.h"

/* append_kv/1: the kit's fused RoPE + quantize (fp8, nvfp4) + paged append, the one kernel
 * flashinfer_like's hook runs too. */
ap_status mha_hook_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                             void *stream, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, MHA_NAME ": append_kv without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return ap_kit_append_kv(&b->model, b->device_ordinal, layer, args, stream, MHA_NAME, msg);
}

/* Everything a captured decode touches was allocated at create for the model's max_batch and
 * max_tokens (partial states, slots), and init_metadata of a decode batch launches only the
 * slots kernel: nothing is left to prepare but the range check. */
ap_status mha_hook_cuda_graph(ap_backend *b, int32_t max_batch, void *stream, ap_msgbuf *msg) {
    (void)stream;
    if (b == NULL || max_batch <= 0 || max_batch > b->model.max_batch) {
        ap_msgbuf_add(msg, MHA_NAME ": cuda_graph needs an instance and max_batch in 1..%d",
                      b != NULL ? b->model.max_batch : 0);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}
