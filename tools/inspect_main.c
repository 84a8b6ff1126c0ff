/* inspect_main.c: ap-inspect's command line: what is installed, what it can do, why not here. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"

static void ap_inspect_usage(FILE *stream) {
    fputs(
        "usage: ap-inspect [OPTIONS] [BACKEND]\n"
        "\n"
        "Lists the attnplug core's ABI version, the GPU (or why none is usable), every plugin\n"
        "file found and what became of it, and each backend's capabilities and verdict here.\n"
        "With BACKEND, shows that backend only.\n"
        "\n"
        "  --plugin-dir DIR      also search DIR for plugins (repeatable, searched first)\n"
        "  --config FILE         validate a YAML config (no GPU needed) and list its rules\n"
        "  --model NAME          with --config: walk the selection for this model here\n"
        "  --model-spec K=V,...  override the model's shape (kind, qo_heads, kv_heads, head_dim,\n"
        "                        dtype, kv_dtype, page_size, layers, embedding, ...)\n"
        "  --json                print the same as JSON\n"
        "  -h, --help            this help\n"
        "\n"
        "Exit status: 0 ok, 1 error (config invalid, selection failed, backend not found),\n"
        "2 usage.\n",
        stream);
}

enum { AP_OPT_CONFIG = 256, AP_OPT_MODEL, AP_OPT_MODEL_SPEC, AP_OPT_PLUGIN_DIR, AP_OPT_JSON };

/* Parse the command line into `inspect` and `dirs`; returns -1 to go on, else an exit code. */
static int ap_inspect_parse(int argc, char **argv, ap_inspect *inspect, const char **dirs,
                            size_t *num_dirs) {
    static const struct option options[] = {
        {"config", required_argument, NULL, AP_OPT_CONFIG},
        {"model", required_argument, NULL, AP_OPT_MODEL},
        {"model-spec", required_argument, NULL, AP_OPT_MODEL_SPEC},
        {"plugin-dir", required_argument, NULL, AP_OPT_PLUGIN_DIR},
        {"json", no_argument, NULL, AP_OPT_JSON},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt;
    while ((opt = getopt_long(argc, argv, "h", options, NULL)) != -1) {
        switch (opt) {
            case AP_OPT_CONFIG: inspect->config_path = optarg; break;
            case AP_OPT_MODEL: inspect->model_name = optarg; break;
            case AP_OPT_MODEL_SPEC: inspect->model_spec = optarg; break;
            case AP_OPT_PLUGIN_DIR: dirs[(*num_dirs)++] = optarg; break;
            case AP_OPT_JSON: inspect->use_json = 1; break;
            case 'h': ap_inspect_usage(stdout); return AP_INSPECT_OK;
            default: ap_inspect_usage(stderr); return AP_INSPECT_USAGE;
        }
    }
    if (optind < argc) inspect->backend = argv[optind++];
    if (optind < argc) {
        fprintf(stderr, "ap-inspect: unexpected argument '%s'\n", argv[optind]);
        return AP_INSPECT_USAGE;
    }
    if ((inspect->model_name != NULL || inspect->model_spec != NULL) &&
        inspect->config_path == NULL) {
        fprintf(stderr, "ap-inspect: --model and --model-spec need --config\n");
        return AP_INSPECT_USAGE;
    }
    if (inspect->model_spec != NULL && inspect->model_name == NULL) {
        fprintf(stderr, "ap-inspect: --model-spec needs --model\n");
        return AP_INSPECT_USAGE;
    }
    if (inspect->backend != NULL && inspect->config_path != NULL) {
        fprintf(stderr, "ap-inspect: give either BACKEND or --config, not both\n");
        return AP_INSPECT_USAGE;
    }
    return -1;
}

/* A config that does not parse: the error names file:line:column. */
static int ap_inspect_config_invalid(ap_inspect *inspect, ap_status status) {
    const char *message = ap_last_error();
    if (inspect->use_json) {
        ap_json_object_begin(&inspect->json);
        ap_json_key(&inspect->json, "config");
        ap_json_object_begin(&inspect->json);
        ap_json_member_string(&inspect->json, "path", inspect->config_path);
        ap_json_member_bool(&inspect->json, "valid", 0);
        ap_json_member_string(&inspect->json, "status", ap_status_name(status));
        ap_json_member_string(&inspect->json, "error", message);
        ap_json_object_end(&inspect->json);
        ap_json_object_end(&inspect->json);
        ap_json_finish(&inspect->json);
    } else {
        printf("Config %s: INVALID\n  %s\n", inspect->config_path, message);
    }
    return AP_INSPECT_ERROR;
}

/* Make the registry over the host folders and the config's plugin_path, and scan it. */
static int ap_inspect_open_registry(ap_inspect *inspect, const char *const *dirs, size_t num_dirs,
                                    const ap_config *config) {
    ap_registry_options options = {sizeof(ap_registry_options), dirs, num_dirs, 0};
    ap_status status = ap_registry_create(&options, &inspect->registry);
    if (status != AP_OK) {
        fprintf(stderr, "ap-inspect: cannot create the registry: %s\n", ap_last_error());
        return AP_INSPECT_ERROR;
    }
    for (size_t i = 0; config != NULL && i < ap_config_plugin_path_count(config); i++) {
        if (ap_registry_add_dir(inspect->registry, ap_config_plugin_path(config, i)) != AP_OK) {
            fprintf(stderr, "ap-inspect: plugin_path '%s': %s\n", ap_config_plugin_path(config, i),
                    ap_last_error());
            return AP_INSPECT_ERROR;
        }
    }
    /* A scan that meets unusable files still succeeds; the files are listed with reasons. */
    status = ap_registry_scan(inspect->registry);
    if (status != AP_OK) {
        fprintf(stderr, "ap-inspect: scanning for plugins failed: %s: %s\n", ap_status_name(status),
                ap_last_error());
        return AP_INSPECT_ERROR;
    }
    return -1;
}

int main(int argc, char **argv) {
    ap_inspect inspect;
    memset(&inspect, 0, sizeof(inspect));
    ap_json_init(&inspect.json, stdout);
    const char **dirs = calloc((size_t)argc + 1, sizeof(*dirs));
    if (dirs == NULL) return AP_INSPECT_ERROR;
    size_t num_dirs = 0;
    ap_config *config = NULL;

    int code = ap_inspect_parse(argc, argv, &inspect, dirs, &num_dirs);
    if (code >= 0) goto out;

    if (inspect.config_path != NULL) {
        ap_status status = ap_config_load(inspect.config_path, &config);
        if (status != AP_OK) {
            code = ap_inspect_config_invalid(&inspect, status);
            goto out;
        }
    }
    code = ap_inspect_open_registry(&inspect, dirs, num_dirs, config);
    if (code >= 0) goto out;

    /* Without a GPU the query fills the CPU device with the reason: that is an answer. */
    ap_device_query(0, &inspect.device);

    code = config != NULL ? ap_inspect_config(&inspect, config) : ap_inspect_overview(&inspect);
    if (inspect.use_json && ap_json_finish(&inspect.json) != 0) code = AP_INSPECT_ERROR;
out:
    fflush(stdout);
    if (config != NULL) ap_config_destroy(config);
    if (inspect.registry != NULL) ap_registry_destroy(inspect.registry);
    free(dirs);
    return code;
}
