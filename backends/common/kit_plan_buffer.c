/* kit_plan_buffer.c: the batch plan in pinned memory, moved to the device in one copy per batch
 * (allocated and freed in kit_runtime.cu). */
#include "kit.h"

ap_status ap_kit_plan_buffer_begin(ap_kit_plan_buffer *buffer, const char *who, ap_msgbuf *msg) {
    if (!buffer->copy_pending) return AP_OK;
    ap_status st = ap_kit_event_wait(buffer->copied, who, msg);
    if (st == AP_OK) buffer->copy_pending = 0;
    return st;
}

ap_status ap_kit_plan_buffer_upload(ap_kit_plan_buffer *buffer, size_t bytes, void *stream,
                                    const char *who, ap_msgbuf *msg) {
    ap_status st = ap_kit_copy_to_device(buffer->dev, buffer->host, bytes, stream, who,
                                         "cudaMemcpyAsync of the batch plan", msg);
    if (st == AP_OK) st = ap_kit_event_record(buffer->copied, stream, who, msg);
    if (st == AP_OK) buffer->copy_pending = 1;
    return st;
}
