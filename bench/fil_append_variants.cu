// fil_append_variants.cu: the benchmark build of flashinfer_like's fused append: the plugin's
// kernel file with its launch exported twice, as the plugin picks (fil_append_rope_run_rows) and
// with every call on the staged kernel (fil_append_rope_run_staged), for fil_append_bench.
#define fil_append_rope_run fil_append_rope_run_rows
#include "backends/flashinfer_like/append_rope.cu"
#undef fil_append_rope_run

extern "C" ap_status fil_append_rope_run_staged(const fil_append_rope_params *p, void *stream,
                                                ap_msgbuf *msg) {
    return append_rope_run(p, false, stream, msg);
}
