/* engine_graph_host.c: --cuda-graphs in a build without CUDA: there is nothing to capture. */
#include "engine.h"

ap_status eng_graph_open(eng_graph **out, const eng_batch *batch, const eng_tensor *q,
                         const eng_tensor *k, const eng_tensor *v, const eng_tensor *o) {
    (void)batch, (void)q, (void)k, (void)v, (void)o;
    *out = NULL;
    return AP_ERR_UNSUPPORTED;
}

ap_status eng_graph_step(eng_graph *g, ap_instance *instance, const ap_layer *layers,
                         int32_t num_layers, const eng_batch *batch, const eng_tensor *q,
                         const eng_tensor *k, const eng_tensor *v, const eng_tensor *eager_out,
                         int save_kv, eng_graph_timing *timing) {
    (void)g, (void)instance, (void)layers, (void)num_layers, (void)batch, (void)q, (void)k;
    (void)v, (void)eager_out, (void)save_kv, (void)timing;
    return AP_ERR_UNSUPPORTED;
}

void eng_graph_close(eng_graph *g) {
    (void)g;
}
