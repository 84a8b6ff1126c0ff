/* engine_main.c: attnplug-engine, the example host: every model of a config through its backend. */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"

#define ENG_EXIT_OK 0
#define ENG_EXIT_ERROR 1
#define ENG_EXIT_USAGE 2

static void eng_usage(FILE *stream) {
    fputs("usage: attnplug-engine [--config FILE] [--model NAME] [--model-spec K=V,...]\n"
          "                       [--steps N] [--layers L] [--batch B] [--prompt-len P]\n"
          "                       [--seed S] [--plugin-dir DIR] [--kv-dtype T] [--cuda-graphs]\n"
          "\n"
          "Runs each example model that a rule of the config matches (or the one --model names)\n"
          "on the backend the config selects here: a prefill of B random prompts (1..P tokens)\n"
          "and N decode steps over L layers (at most the model's own) with random activations;\n"
          "prints the selection walk, per-step times and, for any backend but cpu_ref, its\n"
          "error against cpu_ref. S is a non-negative integer (decimal or 0x hex).\n"
          "--model-spec overrides the shape of the models run, as ap-inspect's does (e.g.\n"
          "qo_heads=16: DeepSeek-V3's heads per GPU at tensor parallelism 8).\n"
          "Defaults: the shipped examples/configs/models.yaml, --steps 8 --layers 2 --batch 4\n"
          "--prompt-len 64, a fresh seed (printed).\n"
          "--kv-dtype T (bf16, f16, fp8_e4m3, fp8_e5m2, nvfp4) replaces every rule's KV cache\n"
          "type and, unless T is bf16, reports the output against a bf16 cache's on the same\n"
          "inputs.\n"
          "--cuda-graphs (or a rule's cuda_graphs: true) also runs each decode step as a CUDA\n"
          "graph captured once (backends whose caps allow it), replayed on the step's inputs:\n"
          "eager and graph time per step, the replay checked equal to the eager step.\n"
          "\n"
          "Exit status: 0 when every model ran and passed, or had no backend that can serve it\n"
          "here (refused by every backend of its rule: a known gap, reported); 1 on a real\n"
          "error (a backend failed, a check failed, bad config) or when no model ran at all;\n"
          "2 on a usage error.\n",
          stream);
}

static int eng_parse_int(const char *text, const char *what, int32_t min, int32_t max,
                         int32_t *out) {
    char *end = NULL;
    long value = strtol(text, &end, 10);
    if (end == text || *end != '\0' || value < min || value > max) {
        fprintf(stderr, "attnplug-engine: %s must be an integer in %d..%d, got '%s'\n", what, min,
                max, text);
        return 0;
    }
    *out = (int32_t)value;
    return 1;
}

/* strtoull takes "-5" as 2^64 - 5 and skips spaces: a seed starts with a digit, fits 64 bits. */
static int eng_parse_seed(const char *text, uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 0);
    if (!isdigit((unsigned char)text[0]) || end == text || *end != '\0' || errno == ERANGE) {
        fprintf(stderr,
                "attnplug-engine: --seed must be a non-negative integer below 2^64, got '%s'\n",
                text);
        return 0;
    }
    *out = value;
    return 1;
}

enum {
    ENG_OPT_CONFIG = 256,
    ENG_OPT_MODEL,
    ENG_OPT_MODEL_SPEC,
    ENG_OPT_STEPS,
    ENG_OPT_LAYERS,
    ENG_OPT_BATCH,
    ENG_OPT_PROMPT,
    ENG_OPT_SEED,
    ENG_OPT_PLUGIN_DIR,
    ENG_OPT_KV_DTYPE,
    ENG_OPT_CUDA_GRAPHS
};

/* Returns -1 to go on, else an exit code. */
static int eng_parse_args(int argc, char **argv, eng_args *args) {
    static const struct option options[] = {
        {"config", required_argument, NULL, ENG_OPT_CONFIG},
        {"model", required_argument, NULL, ENG_OPT_MODEL},
        {"model-spec", required_argument, NULL, ENG_OPT_MODEL_SPEC},
        {"steps", required_argument, NULL, ENG_OPT_STEPS},
        {"layers", required_argument, NULL, ENG_OPT_LAYERS},
        {"batch", required_argument, NULL, ENG_OPT_BATCH},
        {"prompt-len", required_argument, NULL, ENG_OPT_PROMPT},
        {"seed", required_argument, NULL, ENG_OPT_SEED},
        {"plugin-dir", required_argument, NULL, ENG_OPT_PLUGIN_DIR},
        {"kv-dtype", required_argument, NULL, ENG_OPT_KV_DTYPE},
        {"cuda-graphs", no_argument, NULL, ENG_OPT_CUDA_GRAPHS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt, ok = 1;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1 && ok) {
        switch (opt) {
            case ENG_OPT_CONFIG: args->config_path = optarg; break;
            case ENG_OPT_MODEL: args->model_name = optarg; break;
            case ENG_OPT_MODEL_SPEC: args->model_spec = optarg; break;
            case ENG_OPT_STEPS:
                ok = eng_parse_int(optarg, "--steps", 0, 100000, &args->steps);
                break;
            case ENG_OPT_LAYERS:
                ok = eng_parse_int(optarg, "--layers", 1, 1024, &args->layers);
                break;
            case ENG_OPT_BATCH:
                ok = eng_parse_int(optarg, "--batch", 1, 65536, &args->batch);
                break;
            case ENG_OPT_PROMPT:
                ok = eng_parse_int(optarg, "--prompt-len", 1, 1 << 20, &args->prompt_len);
                break;
            case ENG_OPT_SEED: ok = eng_parse_seed(optarg, &args->seed); break;
            case ENG_OPT_PLUGIN_DIR: args->plugin_dirs[args->num_plugin_dirs++] = optarg; break;
            case ENG_OPT_KV_DTYPE:
                ok = ap_dtype_parse(optarg, &args->kv_dtype) == AP_OK &&
                     args->kv_dtype != AP_DTYPE_F32;
                if (!ok)
                    fprintf(stderr, "attnplug-engine: --kv-dtype: unknown cache type '%s'\n",
                            optarg);
                break;
            case ENG_OPT_CUDA_GRAPHS: args->cuda_graphs = 1; break;
            case 'h': eng_usage(stdout); return ENG_EXIT_OK;
            default: eng_usage(stderr); return ENG_EXIT_USAGE;
        }
    }
    if (!ok) return ENG_EXIT_USAGE;
    if (optind < argc) {
        fprintf(stderr, "attnplug-engine: unexpected argument '%s'\n", argv[optind]);
        return ENG_EXIT_USAGE;
    }
    if (args->model_spec != NULL) {
        /* a bad key or value is a usage error, found before any model runs */
        ap_model scratch = ap_preset_at(0)->model;
        char error[256];
        if (ap_preset_apply_spec(&scratch, args->model_spec, error, sizeof(error)) != AP_OK) {
            fprintf(stderr, "attnplug-engine: --model-spec: %s\n", error);
            return ENG_EXIT_USAGE;
        }
    }
    if ((int64_t)args->batch * args->prompt_len > INT32_MAX / 2) {
        fprintf(stderr, "attnplug-engine: --batch x --prompt-len is too large\n");
        return ENG_EXIT_USAGE;
    }
    return -1;
}

/* The shipped config: from the current directory (the repo root), next to the executable in the
 * build tree (build/examples/models.yaml, copied there by meson), or the installed copy. */
static const char *eng_default_config(char *buffer, size_t size) {
    if (access("examples/configs/models.yaml", R_OK) == 0) {
        snprintf(buffer, size, "examples/configs/models.yaml");
        return buffer;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) return NULL;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash == NULL) return NULL;
    *slash = '\0';
    static const char *const relative[] = {"../models.yaml",
                                           "../share/attnplug/configs/models.yaml"};
    for (size_t i = 0; i < sizeof(relative) / sizeof(relative[0]); i++) {
        snprintf(buffer, size, "%s/%s", exe, relative[i]);
        if (access(buffer, R_OK) == 0) return buffer;
    }
    return NULL;
}

/* Whether the engine runs `preset`: the one --model names, else every one a rule matches. */
static int eng_runs_preset(const eng_context *context, const ap_model_preset *preset) {
    const char *named = context->args->model_name;
    if (named != NULL) return preset == ap_preset_find(named);
    return ap_config_match(context->config, preset->name) != NULL;
}

/* --layers beyond a model's own count would run layers the model does not have: a usage
 * error, named before anything runs. Returns -1 to go on, else the exit code. */
static int eng_check_layers(const eng_context *context) {
    for (size_t i = 0; i < ap_preset_count(); i++) {
        const ap_model_preset *preset = ap_preset_at(i);
        if (!eng_runs_preset(context, preset)) continue;
        if (context->args->layers > preset->model.num_layers) {
            fprintf(stderr, "attnplug-engine: --layers %d is more than %s has (%d layers)\n",
                    context->args->layers, preset->name, preset->model.num_layers);
            return ENG_EXIT_USAGE;
        }
    }
    return -1;
}

/* Run each model; the exit status follows the rule in the usage text. */
static int eng_run_models(eng_context *context) {
    int ran = 0, refused = 0, failed = 0;
    for (size_t i = 0; i < ap_preset_count(); i++) {
        const ap_model_preset *preset = ap_preset_at(i);
        if (!eng_runs_preset(context, preset)) continue;
        switch (eng_model_run(context, preset)) {
            case ENG_RAN: ran++; break;
            case ENG_NO_BACKEND: refused++; break;
            case ENG_FAILED: failed++; break;
        }
    }
    printf("\nengine: %d model%s ran, %d had no backend that can serve them here, %d failed\n", ran,
           eng_plural(ran), refused, failed);
    if (ran + refused + failed == 0)
        printf("engine: no rule of the config matches a known model\n");
    return failed == 0 && ran > 0 ? ENG_EXIT_OK : ENG_EXIT_ERROR;
}

/* The registry over --plugin-dir folders and the config's plugin_path, then the device. */
static int eng_open(eng_context *context, ap_config *config) {
    const eng_args *args = context->args;
    ap_registry_options options = {sizeof(ap_registry_options), args->plugin_dirs,
                                   args->num_plugin_dirs, 0};
    if (ap_registry_create(&options, &context->registry) != AP_OK) {
        fprintf(stderr, "attnplug-engine: %s\n", ap_last_error());
        return ENG_EXIT_ERROR;
    }
    for (size_t i = 0; i < ap_config_plugin_path_count(config); i++) {
        if (ap_registry_add_dir(context->registry, ap_config_plugin_path(config, i)) != AP_OK) {
            fprintf(stderr, "attnplug-engine: plugin_path: %s\n", ap_last_error());
            return ENG_EXIT_ERROR;
        }
    }
    if (ap_registry_scan(context->registry) != AP_OK) {
        fprintf(stderr, "attnplug-engine: plugin scan: %s\n", ap_last_error());
        return ENG_EXIT_ERROR;
    }
    printf("plugins:");
    for (size_t i = 0; i < ap_registry_backend_count(context->registry); i++)
        printf(" %s", ap_registry_backend(context->registry, i)->name);
    size_t files = ap_registry_file_count(context->registry);
    printf(" (%zu plugin file%s seen)\n", files, eng_plural((int64_t)files));
    /* No GPU is not an error: the device is then the CPU, with the reason. */
    ap_device_query(0, &context->device);
    if (context->device.ordinal >= 0 && context->device.unusable_reason[0] == '\0')
        printf("device: %s (sm_%d%d, %d SMs)\n", context->device.name, context->device.cc_major,
               context->device.cc_minor, context->device.sm_count);
    else
        printf("device: CPU only (%s)\n", context->device.unusable_reason);
    return -1;
}

int main(int argc, char **argv) {
    eng_args args = {NULL, NULL, NULL, 8, 2, 4, 64, 0, NULL, 0, AP_DTYPE_NONE, 0};
    args.seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    args.plugin_dirs = calloc((size_t)argc + 1, sizeof(*args.plugin_dirs));
    if (args.plugin_dirs == NULL) return ENG_EXIT_ERROR;
    /* Progress must show in a pipe or a log file as it happens, not when the buffer fills. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    eng_context context = {&args, NULL, NULL, {0}};
    ap_config *config = NULL;
    char config_buffer[PATH_MAX + 64];
    int code = eng_parse_args(argc, argv, &args);
    if (code >= 0) goto out;
    if (args.config_path == NULL)
        args.config_path = eng_default_config(config_buffer, sizeof(config_buffer));
    code = ENG_EXIT_ERROR;
    if (args.config_path == NULL) {
        fprintf(stderr, "attnplug-engine: no config given and examples/configs/models.yaml not "
                        "found (run from the repo root or pass --config)\n");
        goto out;
    }
    if (args.model_name != NULL && ap_preset_find(args.model_name) == NULL) {
        fprintf(stderr, "attnplug-engine: unknown model '%s'; known:", args.model_name);
        for (size_t i = 0; i < ap_preset_count(); i++)
            fprintf(stderr, " %s", ap_preset_at(i)->name);
        fprintf(stderr, "\n");
        code = ENG_EXIT_USAGE;
        goto out;
    }
    if (ap_config_load(args.config_path, &config) != AP_OK) {
        fprintf(stderr, "attnplug-engine: %s\n", ap_last_error());
        goto out;
    }
    context.config = config;
    code = eng_check_layers(&context);
    if (code >= 0) goto out;
    code = ENG_EXIT_ERROR;
    printf("attnplug-engine: config %s, seed %llu, %d layer%s, batch %d, prompts up to %d "
           "token%s, %d decode step%s\n",
           args.config_path, (unsigned long long)args.seed, args.layers, eng_plural(args.layers),
           args.batch, args.prompt_len, eng_plural(args.prompt_len), args.steps,
           eng_plural(args.steps));
    code = eng_open(&context, config);
    if (code < 0) code = eng_run_models(&context);
out:
    fflush(stdout);
    if (context.registry != NULL) ap_registry_destroy(context.registry);
    ap_config_destroy(config);
    free(args.plugin_dirs);
    return code;
}
