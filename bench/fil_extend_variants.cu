// fil_extend_variants.cu: the benchmark build of flashinfer_like's extend: the kit's prefill
// kernel file compiled once more (its entry points renamed), so FIL_EXTEND_VARIANT picks other
// kernel options for bf16 head dim 128 (same 128-row tiling): 4 is the previous default (no
// kernel options), 5 adds kAlwaysRescale; anything else runs the plugin's own launch
// (extend.c built with fil_extend_run renamed fil_extend_run_plugin). Built by
// fil_extend_build.sh only.
#include <stdlib.h>

#define ap_kit_prefill_run ap_kit_prefill_run_variant_copy
#define ap_kit_prefill_default_tile_rows ap_kit_prefill_default_tile_rows_variant_copy
#define ap_kit_prefill_tile_rows_built ap_kit_prefill_tile_rows_built_variant_copy
#include "backends/common/prefill_kernel.cu"
#undef ap_kit_prefill_run
#undef ap_kit_prefill_default_tile_rows
#undef ap_kit_prefill_tile_rows_built

#include "backends/flashinfer_like/extend.h"

extern "C" ap_status fil_extend_run_plugin(const fil_attn_params *p, const fil_extend_plan *plan,
                                           void *stream, ap_msgbuf *msg);

extern "C" ap_status fil_extend_run(const fil_attn_params *p, const fil_extend_plan *plan,
                                    void *stream, ap_msgbuf *msg) {
    const char *env = getenv("FIL_EXTEND_VARIANT");
    const int variant = env ? atoi(env) : 0;
    if ((variant != 4 && variant != 5) || p == NULL || p->q_dtype != AP_DTYPE_BF16 ||
        p->kv.kv_dtype != AP_DTYPE_BF16 || p->kv.head_dim != 128)
        return fil_extend_run_plugin(p, plan, stream, msg);
    ap_kit_prefill_params kit;
    fil_extend_params_of(p, &kit);
    extend_args a;
    int num_blocks = 0;
    const char *who = "fil_extend_variants";
    ap_status st = extend_prepare(&kit, plan, &a, &num_blocks, who, msg);
    if (st != AP_OK || num_blocks == 0) return st;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    using QT = __nv_bfloat16;
    if (variant == 4)
        return extend_launch<128, 128, 2, 64, 2, QT, QT, 0>(a, num_blocks, s, who, msg);
    return extend_launch<128, 128, 2, 64, 2, QT, QT, kPagesEarly | kAlwaysRescale>(a, num_blocks, s,
                                                                                   who, msg);
}
