/* inspect_config.c: ap-inspect --config: validate a config, list its rules, walk a selection. */
#include <stdio.h>
#include <string.h>

#include "caps_format.h"
#include "inspect.h"
#include "model_presets.h"

static const char *ap_tristate_name(int32_t value) {
    return value == AP_OPTION_UNSET ? "unset" : value ? "on" : "off";
}

/* "page_size=16 kv_dtype=bf16 prefix_cache=on ..." for the text listing. */
static void ap_options_describe(const ap_options *options, char *text, size_t size) {
    char page[16] = "model", extras[512] = "";
    if (options->page_size > 0) snprintf(page, sizeof(page), "%d", options->page_size);
    size_t used = 0;
    for (size_t i = 0; i < options->num_extra && used + 1 < sizeof(extras); i++) {
        int n = snprintf(extras + used, sizeof(extras) - used, " %s=%s", options->extra[i].key,
                         options->extra[i].value);
        if (n > 0) used += (size_t)n;
    }
    snprintf(text, size,
             "page_size=%s kv_dtype=%s prefix_cache=%s chunked_prefill=%s "
             "cuda_graphs=%s%s%s",
             page, options->kv_dtype == AP_DTYPE_NONE ? "model" : ap_dtype_str(options->kv_dtype),
             ap_tristate_name(options->prefix_cache), ap_tristate_name(options->chunked_prefill),
             ap_tristate_name(options->cuda_graphs), used ? " extra:" : "", extras);
}

static void ap_json_member_tristate(ap_json *json, const char *key, int32_t value) {
    ap_json_key(json, key);
    if (value == AP_OPTION_UNSET)
        ap_json_null(json);
    else
        ap_json_bool(json, value);
}

static void ap_inspect_rule_json(ap_json *json, size_t index, const ap_config_rule *rule) {
    ap_json_object_begin(json);
    ap_json_member_int(json, "index", (int64_t)index + 1);
    ap_json_member_int(json, "line", rule->line);
    ap_json_member_string(json, "pattern", rule->pattern);
    ap_json_member_bool(json, "explicit_single", rule->explicit_single);
    ap_json_key(json, "backends");
    ap_json_array_begin(json);
    for (size_t b = 0; b < rule->num_backends; b++) ap_json_string(json, rule->backends[b]);
    ap_json_array_end(json);
    ap_json_key(json, "options");
    ap_json_object_begin(json);
    ap_json_member_int(json, "page_size", rule->options.page_size);
    ap_json_member_string(
        json, "kv_dtype",
        rule->options.kv_dtype == AP_DTYPE_NONE ? NULL : ap_dtype_str(rule->options.kv_dtype));
    ap_json_member_tristate(json, "prefix_cache", rule->options.prefix_cache);
    ap_json_member_tristate(json, "chunked_prefill", rule->options.chunked_prefill);
    ap_json_member_tristate(json, "cuda_graphs", rule->options.cuda_graphs);
    ap_json_key(json, "extra");
    ap_json_object_begin(json);
    for (size_t e = 0; e < rule->options.num_extra; e++)
        ap_json_member_string(json, rule->options.extra[e].key, rule->options.extra[e].value);
    ap_json_object_end(json);
    ap_json_object_end(json);
    ap_json_object_end(json);
}

static void ap_inspect_rule_text(size_t index, const ap_config_rule *rule) {
    printf("  %zu. %s  (line %d)\n", index + 1, rule->pattern, rule->line);
    printf("       backends: ");
    for (size_t b = 0; b < rule->num_backends; b++)
        printf("%s%s", b ? " > " : "", rule->backends[b]);
    printf(rule->explicit_single ? "  (explicit: a refusal is an error)\n"
                                 : "  (preference list: the first that serves)\n");
    char options[768];
    ap_options_describe(&rule->options, options, sizeof(options));
    printf("       options:  %s\n", options);
}

/* The rules, a warning for each backend name no loaded plugin provides, and an error when a
 * rule can never open (an unknown `backend:`, a list of unknown names only): AP_INSPECT_ERROR. */
static int ap_inspect_rules(ap_inspect *inspect, const ap_config *config) {
    ap_json *json = &inspect->json;
    size_t count = ap_config_rule_count(config);
    if (inspect->use_json) {
        ap_json_key(json, "rules");
        ap_json_array_begin(json);
    } else {
        printf("Rules (%zu, first match wins):\n", count);
    }
    for (size_t i = 0; i < count; i++) {
        const ap_config_rule *rule = ap_config_rule_at(config, i);
        if (inspect->use_json)
            ap_inspect_rule_json(json, i, rule);
        else
            ap_inspect_rule_text(i, rule);
    }
    if (inspect->use_json) {
        ap_json_array_end(json);
        ap_json_key(json, "warnings");
        ap_json_array_begin(json);
    }
    for (size_t i = 0; i < count; i++) {
        const ap_config_rule *rule = ap_config_rule_at(config, i);
        for (size_t b = 0; b < rule->num_backends; b++) {
            if (ap_registry_find(inspect->registry, rule->backends[b]) != NULL) continue;
            char warning[512];
            snprintf(warning, sizeof(warning),
                     "rule %zu (line %d, '%s'): no loaded plugin provides backend '%s'", i + 1,
                     rule->line, rule->pattern, rule->backends[b]);
            if (inspect->use_json)
                ap_json_string(json, warning);
            else
                printf("warning: %s\n", warning);
        }
    }
    if (inspect->use_json) ap_json_array_end(json);
    ap_status status = ap_config_check_backends(config, inspect->registry);
    if (inspect->use_json) {
        ap_json_member_string(json, "error", status == AP_OK ? NULL : ap_last_error());
    } else if (status != AP_OK) {
        printf("error: %s\n", ap_last_error());
    }
    return status == AP_OK ? AP_INSPECT_OK : AP_INSPECT_ERROR;
}

/* The model named on the command line: a preset, or a generic MHA base for --model-spec. */
static int ap_inspect_resolve_model(ap_inspect *inspect, ap_model *model, int *is_preset) {
    const ap_model_preset *preset = ap_preset_find(inspect->model_name);
    *is_preset = preset != NULL;
    if (preset == NULL && inspect->model_spec == NULL) {
        fprintf(stderr, "ap-inspect: unknown model '%s'; known models:", inspect->model_name);
        for (size_t i = 0; i < ap_preset_count(); i++)
            fprintf(stderr, " %s", ap_preset_at(i)->name);
        fprintf(stderr, " (or give its shape with --model-spec)\n");
        return 0;
    }
    *model = preset != NULL ? preset->model : ap_preset_for_kind(AP_ATTN_MHA)->model;
    model->name = preset != NULL ? preset->name : inspect->model_name;
    if (inspect->model_spec != NULL) {
        char error[256] = "";
        if (ap_preset_apply_spec(model, inspect->model_spec, error, sizeof(error)) != AP_OK) {
            fprintf(stderr, "ap-inspect: --model-spec: %s\n", error);
            return 0;
        }
    }
    return 1;
}

static void ap_inspect_candidate(ap_inspect *inspect, size_t index, const char *name,
                                 const ap_verdict *verdict, int chosen) {
    ap_json *json = &inspect->json;
    const char *state = verdict == NULL            ? "not tried"
                        : verdict->status == AP_OK ? "usable"
                                                   : "refused";
    if (inspect->use_json) {
        ap_json_object_begin(json);
        ap_json_member_string(json, "backend", name);
        ap_json_member_string(json, "verdict", state);
        ap_json_member_bool(json, "chosen", chosen);
        ap_json_member_string(json, "status",
                              verdict != NULL ? ap_status_name(verdict->status) : NULL);
        ap_inspect_emit_verdict_reasons(inspect, verdict ? verdict->reasons : "", "");
        ap_json_object_end(json);
        return;
    }
    const char *label = "not tried (an earlier one serves)";
    if (verdict != NULL) label = verdict->status == AP_OK ? "USABLE" : "REFUSED";
    printf("  %zu. %-16s %s", index + 1, name, label);
    if (verdict != NULL && verdict->status != AP_OK)
        printf(" (%s)", ap_status_name(verdict->status));
    printf("%s\n", chosen ? "  <- chosen" : "");
    if (verdict != NULL && verdict->status != AP_OK)
        ap_inspect_emit_verdict_reasons(inspect, verdict->reasons, "       - ");
}

static int ap_inspect_no_rule(ap_inspect *inspect, const char *model_name) {
    ap_json *json = &inspect->json;
    if (inspect->use_json) {
        ap_json_key(json, "selection");
        ap_json_object_begin(json);
        ap_json_member_string(json, "model", model_name);
        ap_json_member_string(json, "error", "no rule matches this model");
        ap_json_member_string(json, "chosen", NULL);
        ap_json_object_end(json);
    } else {
        printf("\nSelection for %s: no rule of the config matches this name\n", model_name);
    }
    return AP_INSPECT_ERROR;
}

/* Walk the matching rule's backends for the model on this device, as ap_config_open does. */
static int ap_inspect_walk(ap_inspect *inspect, const ap_config *config, ap_model model,
                           int is_preset) {
    ap_json *json = &inspect->json;
    const ap_config_rule *rule = ap_config_match(config, model.name);
    if (rule == NULL) return ap_inspect_no_rule(inspect, model.name);
    ap_model applied;
    ap_model_apply_options(&model, &rule->options, &applied);
    char shape[256];
    ap_model_describe(&applied, shape, sizeof(shape));
    /* Opened for real, as a host would: a backend that passes every check but fails create
     * must not be shown as chosen. The instance is closed at once. */
    ap_selection *selection = NULL;
    ap_instance *instance = NULL;
    ap_status status =
        ap_config_open(config, inspect->registry, &model, &inspect->device, &instance, &selection);
    char error[2048];
    ap_text_escape(status != AP_OK ? ap_last_error() : "", error, sizeof error);
    ap_instance_close(instance);
    const char *chosen = selection != NULL ? ap_selection_chosen(selection) : NULL;
    if (inspect->use_json) {
        ap_json_key(json, "selection");
        ap_json_object_begin(json);
        ap_json_member_string(json, "model", model.name);
        ap_json_member_bool(json, "preset", is_preset);
        ap_json_member_string(json, "shape", shape);
        ap_json_member_int(json, "rule", rule->line);
        ap_json_member_string(json, "pattern", rule->pattern);
        ap_json_key(json, "candidates");
        ap_json_array_begin(json);
    } else {
        printf("\nSelection for %s (%s)\n", model.name,
               is_preset ? "built-in example model" : "shape from --model-spec");
        printf("  model as the backends see it: %s\n", shape);
        printf("  rule: '%s' (line %d)\n", rule->pattern, rule->line);
    }
    size_t tried = selection != NULL ? ap_selection_count(selection) : 0;
    for (size_t i = 0; i < rule->num_backends; i++) {
        const ap_verdict *verdict = i < tried ? ap_selection_verdict(selection, i) : NULL;
        int is_chosen = chosen != NULL && verdict != NULL && verdict->status == AP_OK &&
                        strcmp(chosen, rule->backends[i]) == 0;
        ap_inspect_candidate(inspect, i, rule->backends[i], verdict, is_chosen);
    }
    if (inspect->use_json) {
        ap_json_array_end(json);
        ap_json_member_string(json, "chosen", chosen);
        if (chosen == NULL) ap_json_member_string(json, "error", error);
        ap_json_object_end(json);
    } else if (chosen != NULL) {
        printf("Chosen: %s\n", chosen);
    } else {
        printf("No backend of this rule can serve %s here (%s)\n", model.name,
               ap_status_name(status));
        printf("  %s\n", error);
    }
    ap_selection_destroy(selection);
    return chosen != NULL ? AP_INSPECT_OK : AP_INSPECT_ERROR;
}

int ap_inspect_config(ap_inspect *inspect, const ap_config *config) {
    ap_json *json = &inspect->json;
    size_t num_paths = ap_config_plugin_path_count(config);
    ap_model model;
    int is_preset = 0, code = AP_INSPECT_OK;
    /* Resolved before any output, so a bad --model leaves no half-written document. */
    if (inspect->model_name != NULL && !ap_inspect_resolve_model(inspect, &model, &is_preset))
        return AP_INSPECT_ERROR;
    if (inspect->use_json) {
        ap_json_object_begin(json);
        ap_json_key(json, "config");
        ap_json_object_begin(json);
        ap_json_member_string(json, "path", inspect->config_path);
        ap_json_member_bool(json, "valid", 1);
        ap_json_member_int(json, "version", ap_config_version(config));
        ap_json_key(json, "plugin_path");
        ap_json_array_begin(json);
        for (size_t i = 0; i < num_paths; i++)
            ap_json_string(json, ap_config_plugin_path(config, i));
        ap_json_array_end(json);
        code = ap_inspect_rules(inspect, config);
        ap_json_object_end(json);
    } else {
        printf("Config %s: valid (version %d, %zu rules)\n", inspect->config_path,
               ap_config_version(config), ap_config_rule_count(config));
        for (size_t i = 0; i < num_paths; i++)
            printf("  plugin_path: %s\n", ap_config_plugin_path(config, i));
        code = ap_inspect_rules(inspect, config);
    }
    if (inspect->model_name != NULL) {
        if (!inspect->use_json) printf("\n");
        ap_inspect_emit_device(inspect);
        int walked = ap_inspect_walk(inspect, config, model, is_preset);
        if (code == AP_INSPECT_OK) code = walked;
    }
    if (inspect->use_json) ap_json_object_end(json);
    return code;
}
