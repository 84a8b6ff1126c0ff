/* engine_graph.cu: --cuda-graphs: the decode step of every layer captured once in a CUDA graph and
 * replayed each step on the same step's batch and activations, timed beside the eager step and
 * checked equal to it bit for bit. */
#include <cuda_runtime.h>

#include <stdlib.h>
#include <string.h>
#include <time.h>

extern "C" {
#include "engine.h"
}

/* The addresses the graph holds: the batch arrays and q/k/v/out, copied in before each replay
 * (a host engine keeps such buffers for its largest batch). */
struct eng_graph {
    cudaStream_t stream;
    cudaGraphExec_t exec;
    int32_t *arrays[6];
    size_t capacity[6];
    void *q, *k, *v, *out;
    size_t q_bytes, k_bytes, v_bytes, out_bytes;
    void *host_eager, *host_graph; /* out, downloaded for the comparison */
};

static double eng_graph_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

static ap_status eng_graph_cuda(cudaError_t error) {
    return error == cudaSuccess ? AP_OK : AP_ERR_CUDA;
}

extern "C" void eng_graph_close(eng_graph *g) {
    if (g == NULL) return;
    if (g->exec != NULL) cudaGraphExecDestroy(g->exec);
    for (int i = 0; i < 6; i++) cudaFree(g->arrays[i]);
    cudaFree(g->q);
    cudaFree(g->k);
    cudaFree(g->v);
    cudaFree(g->out);
    free(g->host_eager);
    free(g->host_graph);
    if (g->stream != NULL) cudaStreamDestroy(g->stream);
    free(g);
}

/* Buffers for a decode step of `batch`'s shape: its arrays' counts and q/k/v/out's bytes. */
extern "C" ap_status eng_graph_open(eng_graph **out, const eng_batch *batch, const eng_tensor *q,
                                    const eng_tensor *k, const eng_tensor *v, const eng_tensor *o) {
    eng_graph *g = (eng_graph *)calloc(1, sizeof *g);
    *out = g;
    if (g == NULL) return AP_ERR_OUT_OF_MEMORY;
    ap_status st = eng_graph_cuda(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    for (int i = 0; i < 6 && st == AP_OK; i++) {
        g->capacity[i] = batch->counts[i];
        if (g->capacity[i] > 0)
            st = eng_graph_cuda(cudaMalloc(&g->arrays[i], g->capacity[i] * sizeof(int32_t)));
    }
    g->q_bytes = q->bytes;
    g->k_bytes = k->bytes;
    g->v_bytes = v->bytes;
    g->out_bytes = o->bytes;
    if (st == AP_OK) st = eng_graph_cuda(cudaMalloc(&g->q, g->q_bytes));
    if (st == AP_OK) st = eng_graph_cuda(cudaMalloc(&g->k, g->k_bytes));
    if (st == AP_OK) st = eng_graph_cuda(cudaMalloc(&g->v, g->v_bytes));
    if (st == AP_OK) st = eng_graph_cuda(cudaMalloc(&g->out, g->out_bytes));
    g->host_eager = malloc(g->out_bytes);
    g->host_graph = malloc(g->out_bytes);
    if (st == AP_OK && (g->host_eager == NULL || g->host_graph == NULL)) st = AP_ERR_OUT_OF_MEMORY;
    return st;
}

/* The step's arrays and activations into the graph's buffers, and the batch pointing at them. */
static ap_status eng_graph_stage(eng_graph *g, const eng_batch *batch, const eng_tensor *q,
                                 const eng_tensor *k, const eng_tensor *v, ap_batch *staged) {
    ap_status st = AP_OK;
    for (int i = 0; i < 6 && st == AP_OK; i++) {
        if (batch->counts[i] > g->capacity[i]) return AP_ERR_INVALID_ARGUMENT;
        if (batch->counts[i] > 0)
            st = eng_graph_cuda(cudaMemcpyAsync(g->arrays[i], batch->device[i],
                                                batch->counts[i] * sizeof(int32_t),
                                                cudaMemcpyDeviceToDevice, g->stream));
    }
    if (q->bytes != g->q_bytes || k->bytes != g->k_bytes || v->bytes != g->v_bytes)
        return AP_ERR_INVALID_ARGUMENT;
    if (st == AP_OK)
        st = eng_graph_cuda(
            cudaMemcpyAsync(g->q, q->device, g->q_bytes, cudaMemcpyDeviceToDevice, g->stream));
    if (st == AP_OK)
        st = eng_graph_cuda(
            cudaMemcpyAsync(g->k, k->device, g->k_bytes, cudaMemcpyDeviceToDevice, g->stream));
    if (st == AP_OK)
        st = eng_graph_cuda(
            cudaMemcpyAsync(g->v, v->device, g->v_bytes, cudaMemcpyDeviceToDevice, g->stream));
    *staged = batch->batch;
    staged->qo_indptr = g->arrays[0];
    staged->kv_page_indptr = g->arrays[1];
    staged->kv_page_indices = g->arrays[2];
    staged->kv_last_page_len = g->arrays[3];
    staged->seq_lens = g->arrays[4];
    staged->positions = g->arrays[5];
    return st;
}

/* Capture every layer's forward_decode once, on the staged buffers. */
static ap_status eng_graph_capture(eng_graph *g, ap_instance *instance, const ap_layer *layers,
                                   int32_t num_layers, const eng_tensor *q, const eng_tensor *k,
                                   const eng_tensor *v, const eng_tensor *o, int save_kv) {
    DLTensor tq = q->dl, tk = k->dl, tv = v->dl, to = o->dl;
    tq.data = g->q;
    tk.data = g->k;
    tv.data = g->v;
    to.data = g->out;
    ap_forward_args args = {sizeof(ap_forward_args), &tq, &tk, &tv, &to, NULL, save_kv, NULL};
    ap_status st =
        eng_graph_cuda(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal));
    if (st != AP_OK) return st;
    for (int32_t l = 0; l < num_layers && st == AP_OK; l++)
        st = ap_instance_forward_decode(instance, &layers[l], &args, g->stream);
    cudaGraph_t graph = NULL;
    ap_status end = eng_graph_cuda(cudaStreamEndCapture(g->stream, &graph));
    if (st == AP_OK) st = end;
    if (st == AP_OK) st = eng_graph_cuda(cudaGraphInstantiate(&g->exec, graph, 0));
    if (graph != NULL) cudaGraphDestroy(graph);
    return st;
}

extern "C" ap_status eng_graph_step(eng_graph *g, ap_instance *instance, const ap_layer *layers,
                                    int32_t num_layers, const eng_batch *batch, const eng_tensor *q,
                                    const eng_tensor *k, const eng_tensor *v,
                                    const eng_tensor *eager_out, int save_kv,
                                    eng_graph_timing *timing) {
    ap_batch staged;
    ap_status st = eng_graph_stage(g, batch, q, k, v, &staged);
    if (st == AP_OK) st = eng_graph_cuda(cudaStreamSynchronize(g->stream));
    if (st == AP_OK && g->exec == NULL) {
        st = ap_instance_cuda_graph_prepare(instance, staged.num_seqs, g->stream);
        if (st == AP_OK) st = ap_instance_init_metadata(instance, &staged, g->stream);
        if (st == AP_OK)
            st = eng_graph_capture(g, instance, layers, num_layers, q, k, v, eager_out, save_kv);
        if (st == AP_OK) st = eng_graph_cuda(cudaStreamSynchronize(g->stream));
        timing->captured = st == AP_OK;
    }
    if (st != AP_OK) return st;
    const double start = eng_graph_now_ms();
    st = ap_instance_init_metadata(instance, &staged, g->stream);
    const double planned = eng_graph_now_ms();
    if (st == AP_OK) st = eng_graph_cuda(cudaGraphLaunch(g->exec, g->stream));
    const double launched = eng_graph_now_ms();
    if (st == AP_OK) st = eng_graph_cuda(cudaStreamSynchronize(g->stream));
    timing->step_ms = eng_graph_now_ms() - start;
    timing->plan_us = (planned - start) * 1e3;
    timing->launch_us = (launched - planned) * 1e3;
    if (st == AP_OK)
        st =
            eng_graph_cuda(cudaMemcpy(g->host_graph, g->out, g->out_bytes, cudaMemcpyDeviceToHost));
    if (st == AP_OK)
        st = eng_graph_cuda(
            cudaMemcpy(g->host_eager, eager_out->device, g->out_bytes, cudaMemcpyDeviceToHost));
    timing->equal = st == AP_OK && memcmp(g->host_graph, g->host_eager, g->out_bytes) == 0;
    return st;
}
