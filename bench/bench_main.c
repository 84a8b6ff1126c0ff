/* bench_main.c: attnplug-bench: times a backend's decode and extend on the benchmark cases. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "bench_cases.h"
#include "bench_time.h"

#define BENCH_MAX_DIRS 8

typedef struct bench_args {
    const char *backend;
    const char *filter;
    const char *json_path;
    const char *dirs[BENCH_MAX_DIRS];
    size_t num_dirs;
    int runs;
    int list;
} bench_args;

static void bench_usage(FILE *to) {
    fprintf(to,
            "usage: attnplug-bench [--backend NAME] [--case TEXT] [--runs N] [--json FILE]\n"
            "                      [--plugin-dir DIR]... | --list\n"
            "Times NAME's forward_decode / forward_extend (default flashinfer_like) with CUDA\n"
            "events: warm-up, then the median of N calls (default 100, at least 50) rotating\n"
            "input sets so the KV cache read exceeds the L2. --list prints the cases as JSON.\n");
}

static int bench_args_parse(int argc, char **argv, bench_args *args) {
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int has_value = i + 1 < argc;
        if (strcmp(arg, "--backend") == 0 && has_value)
            args->backend = argv[++i];
        else if (strcmp(arg, "--case") == 0 && has_value)
            args->filter = argv[++i];
        else if (strcmp(arg, "--json") == 0 && has_value)
            args->json_path = argv[++i];
        else if (strcmp(arg, "--runs") == 0 && has_value)
            args->runs = atoi(argv[++i]);
        else if (strcmp(arg, "--plugin-dir") == 0 && has_value && args->num_dirs < BENCH_MAX_DIRS)
            args->dirs[args->num_dirs++] = argv[++i];
        else if (strcmp(arg, "--list") == 0)
            args->list = 1;
        else {
            fprintf(stderr, "unknown or incomplete argument: %s\n", arg);
            return 0;
        }
    }
    if (args->runs < 50) {
        fprintf(stderr, "--runs %d: at least 50 calls make a median\n", args->runs);
        return 0;
    }
    return 1;
}

static void bench_json_result(FILE *to, const bench_args *args, const bench_case *c,
                              const bench_result *r, int first) {
    fprintf(to,
            "%s  {\"case\": \"%s\", \"backend\": \"%s\", \"ok\": %s, \"status\": \"%s\", "
            "\"ms_median\": %.6f, \"ms_min\": %.6f, \"ms_p90\": %.6f, \"runs\": %d, \"sets\": %d, "
            "\"kv_bytes\": %.6e, \"flops\": %.6e, \"gbps\": %.3f, \"tflops\": %.3f, "
            "\"tokens_per_s\": %.1f}",
            first ? "" : ",\n", c->name, args->backend, r->ok ? "true" : "false", r->status,
            r->ms_median, r->ms_min, r->ms_p90, r->runs, r->sets, r->kv_bytes, bench_flops(c),
            r->gbps, r->tflops, r->tokens_per_s);
}

static void bench_print_result(const bench_case *c, const bench_result *r) {
    if (!r->ok) {
        printf("%-30s  not run: %s\n", c->name, r->status);
        return;
    }
    int decode = c->mode == AP_MODE_DECODE || c->rotary_dim > 0; /* GB/s */
    printf("%-30s  %9.4f ms (min %.4f, p90 %.4f, %d runs, %d sets)  %8.1f %s  %12.0f tok/s\n",
           c->name, r->ms_median, r->ms_min, r->ms_p90, r->runs, r->sets,
           decode ? r->gbps : r->tflops, decode ? "GB/s   " : "TFLOP/s", r->tokens_per_s);
}

static int bench_run(bench_ctx *ctx, const bench_args *args) {
    FILE *json = NULL;
    int failures = 0, first = 1;
    if (args->json_path != NULL && (json = fopen(args->json_path, "w")) == NULL) {
        perror(args->json_path);
        return 1;
    }
    printf("attnplug-bench: %s on %s (sm_%d%d, %d SMs, L2 %d MB)\n%s\n%s\n%s\n", args->backend,
           ctx->device.name, ctx->device.cc_major, ctx->device.cc_minor, ctx->device.sm_count,
           ctx->device.l2_bytes >> 20, BENCH_DECODE_METRIC, BENCH_EXTEND_METRIC,
           BENCH_APPEND_METRIC);
    if (json != NULL) fprintf(json, "[\n");
    for (size_t i = 0; i < bench_num_cases; i++) {
        const bench_case *c = &bench_cases[i];
        bench_result result;
        if (args->filter != NULL && strstr(c->name, args->filter) == NULL) continue;
        bench_case_time(ctx, c, &result);
        failures += !result.ok;
        bench_print_result(c, &result);
        fflush(stdout);
        if (json != NULL) bench_json_result(json, args, c, &result, first);
        first = 0;
    }
    if (json != NULL) {
        fprintf(json, "\n]\n");
        fclose(json);
    }
    return failures > 0;
}

int main(int argc, char **argv) {
    bench_args args = {.backend = "flashinfer_like", .runs = 100};
    bench_ctx ctx = {.warmup = 10};
    ap_registry *registry = NULL;
    if (!bench_args_parse(argc, argv, &args)) {
        bench_usage(stderr);
        return 2;
    }
    if (args.list) {
        bench_cases_write_json(stdout);
        return 0;
    }
    if (ap_device_query(0, &ctx.device) != AP_OK || ctx.device.unusable_reason[0] != '\0') {
        fprintf(stderr, "no usable GPU: %s\n", ctx.device.unusable_reason);
        return 77;
    }
    ap_registry_options options = {
        .struct_size = sizeof options, .search_dirs = args.dirs, .num_search_dirs = args.num_dirs};
    if (ap_registry_create(&options, &registry) != AP_OK || ap_registry_scan(registry) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    cudaStream_t stream = NULL;
    if (cudaSetDevice(ctx.device.ordinal) != cudaSuccess ||
        cudaStreamCreate(&stream) != cudaSuccess) {
        fprintf(stderr, "CUDA: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    ctx.registry = registry;
    ctx.backend = args.backend;
    ctx.stream = stream;
    ctx.runs = args.runs;
    int code = bench_run(&ctx, &args);
    cudaStreamDestroy(stream);
    ap_registry_destroy(registry);
    return code;
}
