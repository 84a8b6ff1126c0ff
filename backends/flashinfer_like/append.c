/* append.c: the append_kv/1 hook: the kit's fused RoPE + quantize + paged append, one launch. */
#include "glue.h"

ap_status fil_append_kv(ap_backend *b, const ap_layer *layer, const ap_append_kv_args *args,
                        void *stream, ap_msgbuf *msg) {
    if (b == NULL) {
        ap_msgbuf_add(msg, FIL_NAME ": append_kv without an instance");
        return AP_ERR_INVALID_ARGUMENT;
    }
    return ap_kit_append_kv(&b->model, b->device_ordinal, layer, args, stream, FIL_NAME, msg);
}
