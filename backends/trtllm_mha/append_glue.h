/* append_glue.h: where trtllm_mha's append_kv/1 finds the fused RoPE + quantize + paged append
 * kernel. One source, shared with flashinfer_like: today flashinfer_like's append_rope.cu,
 * compiled into this plugin too; when the kernel moves into the kit, only this header and the
 * meson source line change. */
#ifndef AP_MHA_APPEND_GLUE_H
#define AP_MHA_APPEND_GLUE_H

#include "backends/flashinfer_like/fil.h"

typedef fil_append_rope_params mha_append_params;

static inline ap_status mha_append_run(const mha_append_params *params, void *stream,
                                       ap_msgbuf *msg) {
    return fil_append_rope_run(params, stream, msg);
}

#endif /* AP_MHA_APPEND_GLUE_H */
