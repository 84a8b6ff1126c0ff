/* inspect_overview.c: ap-inspect's default listing: ABI, device, plugin files and backends. */
#include <stdio.h>
#include <string.h>

#include "caps_format.h"
#include "inspect.h"
#include "model_presets.h"

void ap_inspect_emit_device(ap_inspect *inspect) {
    const ap_device *device = &inspect->device;
    int usable = device->ordinal >= 0 && device->unusable_reason[0] == '\0';
    if (inspect->use_json) {
        ap_json *json = &inspect->json;
        ap_json_key(json, "device");
        ap_json_object_begin(json);
        ap_json_member_bool(json, "gpu_usable", usable);
        ap_json_member_string(json, "name", device->name);
        ap_json_member_int(json, "ordinal", device->ordinal);
        if (usable) {
            ap_json_member_int(json, "sm", device->cc_major * 10 + device->cc_minor);
            ap_json_member_int(json, "sm_count", device->sm_count);
            ap_json_member_int(json, "driver_version", device->driver_version);
            ap_json_member_int(json, "total_memory", device->total_memory);
        } else {
            ap_json_member_string(json, "unusable_reason", device->unusable_reason);
        }
        ap_json_object_end(json);
        return;
    }
    if (usable) {
        printf("Device: %s: sm_%d%d, %d SMs, driver %d.%d, %.1f GiB\n", device->name,
               device->cc_major, device->cc_minor, device->sm_count, device->driver_version / 1000,
               (device->driver_version % 1000) / 10,
               (double)device->total_memory / (1024.0 * 1024.0 * 1024.0));
    } else {
        printf("Device: no usable GPU (%s); CPU backends only\n",
               device->unusable_reason[0] ? device->unusable_reason : "no reason given");
    }
}

void ap_inspect_emit_verdict_reasons(ap_inspect *inspect, const char *reasons, const char *indent) {
    if (inspect->use_json) {
        ap_json_key(&inspect->json, "reasons");
        ap_json_array_begin(&inspect->json);
    }
    const char *line = reasons != NULL ? reasons : "";
    while (*line != '\0') {
        const char *end = strchr(line, '\n');
        size_t length = end != NULL ? (size_t)(end - line) : strlen(line);
        if (length > 0) {
            char text[1024], shown[1024];
            snprintf(text, sizeof(text), "%.*s", (int)length, line);
            ap_text_escape(text, shown, sizeof(shown));
            if (inspect->use_json)
                ap_json_string(&inspect->json, text);
            else
                printf("%s%s\n", indent, shown);
        }
        line += length;
        if (*line == '\n') line++;
    }
    if (inspect->use_json) ap_json_array_end(&inspect->json);
}

static void ap_inspect_emit_files(ap_inspect *inspect) {
    size_t count = ap_registry_file_count(inspect->registry);
    ap_json *json = &inspect->json;
    if (inspect->use_json) {
        ap_json_key(json, "plugin_files");
        ap_json_array_begin(json);
    } else {
        printf("\nPlugin files (%zu):\n", count);
        if (count == 0) printf("  none found (try --plugin-dir DIR or AP_PLUGIN_PATH)\n");
    }
    for (size_t i = 0; i < count; i++) {
        ap_file_record record;
        if (ap_registry_file(inspect->registry, i, &record) != AP_OK) continue;
        int loaded = record.status == AP_OK;
        if (inspect->use_json) {
            ap_json_object_begin(json);
            ap_json_member_string(json, "path", record.path);
            ap_json_member_bool(json, "loaded", loaded);
            ap_json_member_string(json, "status", ap_status_name(record.status));
            ap_json_member_string(json, "backend", record.backend);
            ap_json_member_string(json, "message", record.message ? record.message : "");
            ap_json_object_end(json);
            continue;
        }
        /* File names come from the folder: escaped like everything else shown from outside. */
        char path[4096], message[8192];
        ap_text_escape(record.path, path, sizeof(path));
        ap_text_escape(record.message, message, sizeof(message));
        if (loaded)
            printf("  loaded   %s -> %s\n", path, record.backend ? record.backend : "?");
        else
            printf("  refused  %s\n           %s: %s\n", path, ap_status_name(record.status),
                   message);
    }
    if (inspect->use_json) ap_json_array_end(json);
}

/* The model the verdict uses: the kind's preset, with the backend's first page size when it
 * lists sizes that exclude the preset's. Returns 0 when there is no preset of that kind. */
static int ap_inspect_typical_model(const ap_caps *caps, ap_attn_kind kind, ap_model *model,
                                    ap_options *options) {
    const ap_model_preset *preset = ap_preset_for_kind(kind);
    if (preset == NULL) return 0;
    *model = preset->model;
    memset(options, 0, sizeof(*options));
    options->struct_size = sizeof(*options);
    options->prefix_cache = options->chunked_prefill = options->cuda_graphs = AP_OPTION_UNSET;
    if (caps->page_sizes != NULL && caps->num_page_sizes > 0) {
        int listed = 0;
        for (size_t i = 0; i < caps->num_page_sizes; i++)
            if (caps->page_sizes[i] == model->page_size) listed = 1;
        if (!listed) options->page_size = caps->page_sizes[0];
    }
    return 1;
}

/* The backend's verdict on this device for a typical model of each kind it declares. */
static void ap_inspect_emit_verdicts(ap_inspect *inspect, const ap_descriptor *desc) {
    ap_json *json = &inspect->json;
    if (inspect->use_json) {
        ap_json_key(json, "verdicts");
        ap_json_array_begin(json);
    }
    for (int k = AP_ATTN_MHA; k <= AP_ATTN_MLA; k++) {
        if (!(desc->caps->attn_kinds & AP_ATTN_BIT(k))) continue;
        ap_model model;
        ap_options options;
        if (!ap_inspect_typical_model(desc->caps, (ap_attn_kind)k, &model, &options)) continue;
        ap_verdict verdict;
        memset(&verdict, 0, sizeof(verdict));
        ap_status status = ap_registry_check(inspect->registry, desc->name, &model, &options,
                                             &inspect->device, &verdict);
        if (status != AP_OK && verdict.reasons == NULL) verdict.reasons = ap_last_error();
        ap_model applied;
        ap_model_apply_options(&model, &options, &applied);
        char shape[256], arch[32] = "";
        ap_model_describe(&applied, shape, sizeof(shape));
        if (verdict.arch_index >= 0 && (size_t)verdict.arch_index < desc->caps->num_archs)
            ap_arch_target_name(desc->caps->archs[verdict.arch_index], arch, sizeof(arch));
        if (inspect->use_json) {
            ap_json_object_begin(json);
            ap_json_member_string(json, "model", model.name);
            ap_json_member_string(json, "shape", shape);
            ap_json_member_bool(json, "usable", status == AP_OK);
            ap_json_member_string(json, "status", ap_status_name(status));
            ap_json_member_string(json, "arch", arch[0] ? arch : NULL);
            ap_inspect_emit_verdict_reasons(inspect, verdict.reasons, "");
            ap_json_object_end(json);
            continue;
        }
        printf("  here:         %s for %s (%s)", status == AP_OK ? "USABLE" : "REFUSED", model.name,
               shape);
        if (arch[0]) printf(", runs %s", arch);
        printf("\n");
        if (status != AP_OK) {
            printf("                %s:\n", ap_status_name(status));
            ap_inspect_emit_verdict_reasons(inspect, verdict.reasons, "                  - ");
        }
    }
    if (inspect->use_json) ap_json_array_end(json);
}

/* A list member in JSON: `values` NULL/0 means "any" (a string), else an array of ints. */
static void ap_json_member_int_set(ap_json *json, const char *key, const int32_t *values,
                                   size_t count) {
    ap_json_key(json, key);
    if (values == NULL || count == 0) {
        ap_json_string(json, "any");
        return;
    }
    ap_json_array_begin(json);
    for (size_t i = 0; i < count; i++) ap_json_int(json, values[i]);
    ap_json_array_end(json);
}

static void ap_json_member_names(ap_json *json, const char *key, const char *list) {
    /* `list` is "a, b, c" or "none"/"any" from caps_format: split it into an array. */
    ap_json_key(json, key);
    ap_json_array_begin(json);
    if (strcmp(list, "none") != 0) {
        const char *item = list;
        while (*item != '\0') {
            const char *end = strstr(item, ", ");
            size_t length = end != NULL ? (size_t)(end - item) : strlen(item);
            char name[64];
            snprintf(name, sizeof(name), "%.*s", (int)length, item);
            ap_json_string(json, name);
            item += length;
            if (end != NULL) item += 2;
        }
    }
    ap_json_array_end(json);
}

static void ap_inspect_emit_caps_json(ap_json *json, const ap_caps *caps) {
    char list[512];
    ap_list_device_kinds(caps->device_kinds, list, sizeof(list));
    ap_json_member_names(json, "device_kinds", list);
    ap_json_key(json, "archs");
    ap_json_array_begin(json);
    for (size_t i = 0; caps->archs != NULL && i < caps->num_archs; i++) {
        char name[32];
        ap_arch_target_name(caps->archs[i], name, sizeof(name));
        ap_json_object_begin(json);
        ap_json_member_string(json, "target", name);
        ap_json_member_int(json, "sm", caps->archs[i].sm);
        ap_json_member_string(json, "code", caps->archs[i].kind == AP_ARCH_PTX ? "ptx" : "sass");
        ap_json_member_bool(json, "arch_specific", caps->archs[i].kind == AP_ARCH_SASS_SPECIFIC);
        ap_json_object_end(json);
    }
    ap_json_array_end(json);
    ap_list_attn_kinds(caps->attn_kinds, list, sizeof(list));
    ap_json_member_names(json, "attention", list);
    ap_list_dtypes(caps->q_dtypes, list, sizeof(list));
    ap_json_member_names(json, "q_dtypes", list);
    ap_list_dtypes(caps->kv_dtypes, list, sizeof(list));
    ap_json_member_names(json, "kv_dtypes", list);
    ap_json_member_int_set(json, "page_sizes", caps->page_sizes, caps->num_page_sizes);
    ap_json_member_int_set(json, "head_dims", caps->head_dims, caps->num_head_dims);
    ap_list_phases(caps->phases, list, sizeof(list));
    ap_json_member_names(json, "phases", list);
    ap_json_member_string(json, "cuda_graph", ap_graph_level_label(caps->cuda_graph));
    ap_list_features(caps->features, list, sizeof(list));
    ap_json_member_names(json, "features", list);
    ap_json_member_bool(json, "needs_host_mirrors", caps->needs_host_mirrors);
    ap_list_hooks(caps, list, sizeof(list));
    ap_json_member_names(json, "hooks", list);
}

static void ap_inspect_emit_caps_text(const ap_caps *caps) {
    char list[512];
    ap_list_device_kinds(caps->device_kinds, list, sizeof(list));
    printf("  runs on:      %s\n", list);
    ap_list_archs(caps, list, sizeof(list));
    printf("  archs:        %s\n", list);
    ap_list_attn_kinds(caps->attn_kinds, list, sizeof(list));
    printf("  attention:    %s\n", list);
    ap_list_dtypes(caps->q_dtypes, list, sizeof(list));
    printf("  q dtypes:     %s\n", list);
    ap_list_dtypes(caps->kv_dtypes, list, sizeof(list));
    printf("  kv dtypes:    %s\n", list);
    ap_list_ints(caps->page_sizes, caps->num_page_sizes, list, sizeof(list));
    printf("  page sizes:   %s\n", list);
    ap_list_ints(caps->head_dims, caps->num_head_dims, list, sizeof(list));
    printf("  head dims:    %s\n", list);
    ap_list_phases(caps->phases, list, sizeof(list));
    printf("  phases:       %s\n", list);
    printf("  cuda graphs:  %s\n", ap_graph_level_label(caps->cuda_graph));
    ap_list_features(caps->features, list, sizeof(list));
    printf("  features:     %s\n", list);
    printf("  host mirrors: %s\n",
           caps->needs_host_mirrors ? "read by init_metadata" : "not needed");
    ap_list_hooks(caps, list, sizeof(list));
    printf("  hooks:        %s\n", list);
}

static void ap_inspect_emit_backend(ap_inspect *inspect, const ap_descriptor *desc) {
    const char *path = ap_registry_backend_path(inspect->registry, desc->name);
    if (inspect->use_json) {
        ap_json *json = &inspect->json;
        ap_json_object_begin(json);
        ap_json_member_string(json, "name", desc->name);
        ap_json_member_string(json, "version", desc->version);
        ap_json_member_string(json, "description", desc->description);
        ap_json_member_string(json, "file", path);
        ap_inspect_emit_caps_json(json, desc->caps);
        ap_inspect_emit_verdicts(inspect, desc);
        ap_json_object_end(json);
        return;
    }
    printf("\n%s %s: %s\n", desc->name, desc->version ? desc->version : "?",
           desc->description ? desc->description : "");
    char shown[4096];
    ap_text_escape(path ? path : "?", shown, sizeof(shown));
    printf("  file:         %s\n", shown);
    ap_inspect_emit_caps_text(desc->caps);
    ap_inspect_emit_verdicts(inspect, desc);
}

int ap_inspect_overview(ap_inspect *inspect) {
    uint32_t major = 0, minor = 0;
    ap_core_abi_version(&major, &minor);
    const ap_descriptor *only = NULL;
    if (inspect->backend != NULL) {
        only = ap_registry_find(inspect->registry, inspect->backend);
        if (only == NULL) {
            fprintf(stderr,
                    "ap-inspect: no backend named '%s' was loaded (see ap-inspect's "
                    "plugin file list)\n",
                    inspect->backend);
            return AP_INSPECT_ERROR;
        }
    }
    ap_json *json = &inspect->json;
    size_t count = ap_registry_backend_count(inspect->registry);
    if (inspect->use_json) {
        char version[32];
        snprintf(version, sizeof(version), "%u.%u", major, minor);
        ap_json_object_begin(json);
        ap_json_member_string(json, "core_abi", version);
        ap_inspect_emit_device(inspect);
        if (only == NULL) ap_inspect_emit_files(inspect);
        ap_json_key(json, "backends");
        ap_json_array_begin(json);
    } else {
        printf("attnplug core ABI %u.%u\n", major, minor);
        ap_inspect_emit_device(inspect);
        if (only == NULL) {
            ap_inspect_emit_files(inspect);
            printf("\nBackends (%zu):\n", count);
        }
    }
    for (size_t i = 0; i < count; i++) {
        const ap_descriptor *desc = ap_registry_backend(inspect->registry, i);
        if (desc == NULL || (only != NULL && desc != only)) continue;
        ap_inspect_emit_backend(inspect, desc);
    }
    if (inspect->use_json) {
        ap_json_array_end(json);
        ap_json_object_end(json);
    }
    return AP_INSPECT_OK;
}
