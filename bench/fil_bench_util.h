/* fil_bench_util.h: what the standalone kernel bench programs share: CUDA checks, opening a plugin. */
#ifndef AP_FIL_BENCH_UTIL_H
#define AP_FIL_BENCH_UTIL_H

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "plugin_api.h"

/* A bench program stops at the first failing CUDA call: its numbers would mean nothing. */
#define CHECK_CUDA(call) \
    do { \
        cudaError_t err_ = (call); \
        if (err_ != cudaSuccess) { \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                    cudaGetErrorString(err_)); \
            exit(2); \
        } \
    } while (0)

/* dlopen a plugin file and negotiate, as the core would; the descriptor or NULL (message
 * printed). The library stays open for the life of the program. */
static inline const ap_descriptor *fil_bench_open_plugin(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return NULL;
    }
    ap_plugin_negotiate_fn negotiate = (ap_plugin_negotiate_fn)dlsym(lib, AP_PLUGIN_ENTRY);
    char text[512] = "";
    ap_msgbuf msg = {sizeof(ap_msgbuf), text, sizeof text, 0};
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR};
    ap_negotiate_reply reply = {sizeof reply, 0, 0, NULL};
    if (negotiate == NULL || negotiate(&offer, &reply, &msg) != AP_OK) {
        fprintf(stderr, "negotiation failed: %s\n", text);
        return NULL;
    }
    return reply.descriptor;
}

/* GPU 0 as an ap_device, read through the runtime (the core reads the driver instead). */
static inline void fil_bench_device(ap_device *dev, cudaDeviceProp *prop) {
    CHECK_CUDA(cudaGetDeviceProperties(prop, 0));
    memset(dev, 0, sizeof *dev);
    dev->struct_size = sizeof *dev;
    dev->ordinal = 0;
    dev->cc_major = prop->major, dev->cc_minor = prop->minor;
    dev->sm_count = prop->multiProcessorCount;
    dev->total_memory = (int64_t)prop->totalGlobalMem;
    snprintf(dev->name, sizeof dev->name, "%.120s", prop->name);
}

/* Make `warmup` untimed calls, then `runs` calls with one event pair each (they queue back to
 * back, so the events time the GPU's work, not the host's); `call(i)` makes call i. The times
 * come back sorted: [runs / 2] is the median. */
template <typename F>
static std::vector<float> fil_bench_time_calls(int warmup, int runs, F &&call) {
    for (int i = 0; i < warmup; i++) call(i);
    std::vector<cudaEvent_t> ev(2 * runs);
    for (auto &e : ev) CHECK_CUDA(cudaEventCreate(&e));
    for (int i = 0; i < runs; i++) {
        CHECK_CUDA(cudaEventRecord(ev[2 * i]));
        call(i);
        CHECK_CUDA(cudaEventRecord(ev[2 * i + 1]));
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaGetLastError());
    std::vector<float> ms(runs);
    for (int i = 0; i < runs; i++)
        CHECK_CUDA(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
    for (auto &e : ev) cudaEventDestroy(e);
    std::sort(ms.begin(), ms.end());
    return ms;
}

#endif /* AP_FIL_BENCH_UTIL_H */
