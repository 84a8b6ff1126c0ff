/* gpu_harness.c: checks one backend against cpu_ref on every case its capabilities accept. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "gpu_case_run.h"
#include "gpu_cases.h"
#include "gpu_rand.h"
#include "gpu_registry.h"

#define GPU_MAX_CASES 128
#define GPU_MAX_DIRS 8

typedef struct gpu_args {
    const char *backend;
    const char *filter; /* run only cases whose name contains it */
    const char *dirs[GPU_MAX_DIRS];
    size_t num_dirs;
    uint64_t seed;
    int have_seed;
    int quick;
} gpu_args;

static void gpu_usage(FILE *to) {
    fprintf(to, "usage: gpu-harness BACKEND [--seed N] [--quick] [--filter TEXT] "
                "[--plugin-dir DIR]...\n"
                "Runs BACKEND and cpu_ref on the same random paged inputs for every case of the\n"
                "table BACKEND accepts and compares out, lse and the KV cache each wrote.\n"
                "Exit: 0 all passed, 1 a failure, 77 skipped (no GPU, backend not built).\n");
}

static int gpu_args_parse(int argc, char **argv, gpu_args *args) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--seed") == 0 && has_value) {
            args->seed = strtoull(argv[++i], NULL, 0);
            args->have_seed = 1;
        } else if (strcmp(arg, "--filter") == 0 && has_value) {
            args->filter = argv[++i];
        } else if (strcmp(arg, "--plugin-dir") == 0 && has_value && args->num_dirs < GPU_MAX_DIRS) {
            args->dirs[args->num_dirs++] = argv[++i];
        } else if (strcmp(arg, "--quick") == 0) {
            args->quick = 1;
        } else if (strcmp(arg, "--help") == 0) {
            gpu_usage(stdout);
            exit(0);
        } else if (arg[0] != '-' && args->backend == NULL) {
            args->backend = arg;
        } else {
            fprintf(stderr, "unknown or incomplete argument: %s\n", arg);
            return 0;
        }
    }
    return args->backend != NULL;
}

/* Open the registry and check that both backends are there. Returns an exit code, or -1. A
 * backend that is not registered is skipped only when no file for it failed to load: a plugin
 * that was built but does not load is a failure, not a skip. */
static int gpu_registry_open(const gpu_args *args, ap_registry **out) {
    ap_registry_options options = {
        .struct_size = sizeof options,
        .search_dirs = args->dirs,
        .num_search_dirs = args->num_dirs,
    };
    if (ap_registry_create(&options, out) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    if (ap_registry_scan(*out) != AP_OK) fprintf(stderr, "scan: %s\n", ap_last_error());
    return gpu_backend_present(*out, args->backend);
}

/* The device the backend runs on. Returns an exit code, or -1 to carry on. */
static int gpu_device_open(gpu_ctx *ctx) {
    const ap_descriptor *desc = ap_registry_find(ctx->registry, ctx->backend);
    ap_device_cpu(&ctx->cpu, "");
    ctx->on_device = (desc->caps->device_kinds & AP_DEVICE_KIND_CUDA) != 0;
    if (!ctx->on_device) {
        ctx->device = ctx->cpu;
        return -1;
    }
    const int code = gpu_device_usable(&ctx->device);
    if (code >= 0) return code;
    cudaStream_t stream = NULL;
    if (cudaSetDevice(ctx->device.ordinal) != cudaSuccess ||
        cudaStreamCreate(&stream) != cudaSuccess) {
        fprintf(stderr, "cannot start CUDA on device %d: %s\n", ctx->device.ordinal,
                cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    ctx->stream = stream;
    printf("device %d: %s, sm_%d%d, %d SMs, driver %d\n", ctx->device.ordinal, ctx->device.name,
           ctx->device.cc_major, ctx->device.cc_minor, ctx->device.sm_count,
           ctx->device.driver_version);
    return -1;
}

/* A fault a kernel left behind poisons the CUDA context: every later case would fail too. */
static int gpu_context_broken(const gpu_ctx *ctx) {
    if (!ctx->on_device) return 0;
    cudaError_t err = cudaDeviceSynchronize();
    if (err == cudaSuccess) err = cudaGetLastError();
    if (err == cudaSuccess) return 0;
    printf("CUDA context broken (%s): stopping here\n", cudaGetErrorString(err));
    return 1;
}

static int gpu_run_cases(const gpu_ctx *ctx, const gpu_args *args) {
    static gpu_case cases[GPU_MAX_CASES];
    size_t count = gpu_cases_all(cases, GPU_MAX_CASES);
    size_t passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < count; i++) {
        const gpu_case *c = &cases[i];
        if (args->filter != NULL && strstr(c->name, args->filter) == NULL) continue;
        if (args->quick && !c->quick) continue;
        /* each case draws from its own stream, so a filtered rerun sees the same inputs */
        uint64_t case_seed = args->seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        gpu_outcome outcome = gpu_case_run(ctx, c, gpu_rand_next(&case_seed));
        fflush(stdout);
        passed += outcome == GPU_PASS;
        failed += outcome == GPU_FAIL;
        skipped += outcome == GPU_SKIP;
        if (outcome == GPU_FAIL && gpu_context_broken(ctx)) break;
    }
    printf("summary: %s vs cpu_ref: %zu passed, %zu failed, %zu skipped (seed %llu)\n",
           ctx->backend, passed, failed, skipped, (unsigned long long)args->seed);
    if (failed > 0) return 1;
    return passed == 0 ? GPU_EXIT_SKIP : 0;
}

int main(int argc, char **argv) {
    gpu_args args = {0};
    gpu_ctx ctx = {0};
    if (!gpu_args_parse(argc, argv, &args)) {
        gpu_usage(stderr);
        return 2;
    }
    if (!args.have_seed) args.seed = gpu_rand_fresh_seed();
    printf("gpu-harness: backend %s, seed %llu (rerun with --seed %llu)\n", args.backend,
           (unsigned long long)args.seed, (unsigned long long)args.seed);
    int code = gpu_registry_open(&args, &ctx.registry);
    ctx.backend = args.backend;
    if (code < 0) code = gpu_device_open(&ctx);
    if (code < 0) code = gpu_reference_present(ctx.registry);
    if (code < 0) code = gpu_run_cases(&ctx, &args);
    if (ctx.stream != NULL) cudaStreamDestroy((cudaStream_t)ctx.stream);
    if (ctx.registry != NULL) ap_registry_destroy(ctx.registry);
    return code;
}
