/* kit_reserve.c: device buffers that grow to the largest batch seen and are then kept (the
 * staging buffer, the split-KV workspace). */
#include "kit.h"

ap_status ap_kit_device_reserve(void **buffer, size_t *bytes, size_t need, const char *who,
                                ap_msgbuf *msg) {
    if (need <= *bytes) return AP_OK;
    ap_kit_device_free(*buffer); /* waits for the kernels still reading it */
    *buffer = NULL;
    *bytes = 0;
    const ap_status st = ap_kit_device_alloc(need, buffer, who, msg);
    if (st == AP_OK) *bytes = need;
    return st;
}
