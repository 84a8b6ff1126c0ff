/* forward.c: forward_decode / forward_extend: check the layer and tensors, append K/V, attend. */
#include <stdint.h>

#include "glue.h"

/* ---- what the core leaves to us ------------------------------------------------------------- */

/* The core checked every tensor's shape, dtype, device and density, the layer's cache against the
 * model and the planned batch (plugin_api.h's promise). Left to a backend: alignment and its own
 * limits. */

/* The kernels move rows 16 bytes at a time: a dense tensor's rows (head dims 64, 128, 256) stay
 * 16-byte aligned when its base is; lse and index arrays need their element's alignment. */
static ap_status fil_args_aligned(const ap_forward_args *args, ap_msgbuf *msg) {
    ap_status st = ap_kit_aligned(args->q, "q", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->out, "out", 16, FIL_NAME, msg);
    if (st == AP_OK) st = ap_kit_aligned(args->lse, "lse", sizeof(float), FIL_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->k, "k", 16, FIL_NAME, msg);
    if (st == AP_OK && args->save_kv) st = ap_kit_aligned(args->v, "v", 16, FIL_NAME, msg);
    return st;
}

/* Features the caps do not declare: refused here, since the core does not check layers for them. */
static ap_status fil_layer_served(const ap_layer *layer, ap_msgbuf *msg) {
    if (layer->logit_softcap == 0.f && layer->window_left < 0) return AP_OK;
    ap_msgbuf_add(msg, FIL_NAME ": layer %d asks for %s, which this backend does not serve",
                  layer->layer_id,
                  layer->logit_softcap != 0.f ? "a logit softcap" : "a sliding window");
    return AP_ERR_UNSUPPORTED;
}

/* Checks shared by both forwards, then the append of the new K/V when asked. */
static ap_status fil_forward_begin(ap_backend *b, const ap_layer *layer,
                                   const ap_forward_args *args, ap_forward_mode mode, void *stream,
                                   ap_msgbuf *msg) {
    const char *entry = mode == AP_MODE_DECODE ? "decode" : "extend";
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": forward_%s without an instance", entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!b->plan.ready || b->plan.mode != mode) {
        ap_msgbuf_add(msg, FIL_NAME ": forward_%s without init_metadata of a %s batch", entry,
                      entry);
        return AP_ERR_INVALID_ARGUMENT;
    }
    ap_status st = fil_layer_served(layer, msg);
    if (st == AP_OK) st = ap_kit_cache_aligned(layer, FIL_NAME, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st; /* an empty batch: nothing to run */
    st = fil_args_aligned(args, msg);
    if (st == AP_OK) st = ap_kit_set_device(b->device_ordinal, FIL_NAME, msg);
    if (st != AP_OK || !args->save_kv) return st;
    return ap_kit_save_kv(&b->model, layer, args, b->plan.slots, b->plan.num_tokens, stream,
                          FIL_NAME, msg);
}

ap_status fil_forward_decode(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_DECODE, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    return fil_decode_run(&b->model, layer, args, &b->plan, stream, msg);
}

ap_status fil_forward_extend(ap_backend *b, const ap_layer *layer, const ap_forward_args *args,
                             void *stream, ap_msgbuf *msg) {
    ap_status st = fil_forward_begin(b, layer, args, AP_MODE_EXTEND, stream, msg);
    if (st != AP_OK || b->plan.num_tokens == 0) return st;
    if (b->plan.extend_staged) /* staged to 16 bits first (extend_nvfp4.c) */
        return fil_extend_nvfp4_run(b, layer, args, stream, msg);
    return fil_extend_run(&b->model, layer, args, &b->plan, stream, msg);
}
