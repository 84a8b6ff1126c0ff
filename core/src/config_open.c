/* config_open.c: a model's rule found in the config, its backends walked, one instance opened. */
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config_internal.h"

const ap_config_rule *ap_config_match(const ap_config *config, const char *model_name) {
    if (config == NULL || model_name == NULL) {
        ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_match: %s is NULL",
                     config == NULL ? "config" : "model_name");
        return NULL;
    }
    for (size_t i = 0; i < config->num_rules; i++) {
        const ap_config_rule *rule = &config->rules[i].rule;
        /* No FNM_PATHNAME: "*" must cover "org/model" names. */
        if (fnmatch(rule->pattern, model_name, 0) == 0) {
            ap_log(AP_LOG_CONFIG, "%s:%d:%d: rule '%s' matches model '%s'", config->source,
                   rule->line, config->rules[i].column, rule->pattern, model_name);
            return rule;
        }
    }
    ap_error_set(AP_ERR_NOT_FOUND, "no rule in %s matches model '%s'", config->source, model_name);
    return NULL;
}

/* "a, b, c" (or "none") of the loaded backends, and why a file that would have provided
 * `wanted` was refused: the likeliest explanation of an unknown name. */
static void ap_describe_loaded(const ap_registry *registry, const char *wanted, char *text,
                               size_t size) {
    size_t used = 0, count = ap_registry_backend_count(registry);
    int n = snprintf(text, size, "loaded: %s", count == 0 ? "none" : "");
    used = n > 0 && (size_t)n < size ? (size_t)n : size - 1;
    for (size_t i = 0; i < count; i++) {
        const ap_descriptor *desc = ap_registry_backend(registry, i);
        n = snprintf(text + used, size - used, "%s%s", i ? ", " : "", desc ? desc->name : "?");
        used = n > 0 && (size_t)n < size - used ? used + (size_t)n : size - 1;
    }
    for (size_t i = 0, files = ap_registry_file_count(registry); i < files && wanted; i++) {
        ap_file_record record;
        if (ap_registry_file(registry, i, &record) != AP_OK || record.status == AP_OK) continue;
        if (record.backend == NULL || strcmp(record.backend, wanted) != 0) continue;
        n = snprintf(text + used, size - used, "; %s provides it but was refused: %s", record.path,
                     record.message);
        used = n > 0 && (size_t)n < size - used ? used + (size_t)n : size - 1;
    }
}

/* Names no plugin provides: for `backend:` a hard error; in a list they are skipped (a list may
 * name backends not built here), unless none of the list is known. */
static ap_status ap_rule_check_known(const ap_config *config, const ap_config_rule_full *full,
                                     const ap_registry *registry) {
    const ap_config_rule *rule = &full->rule;
    size_t known = 0;
    char loaded[2048];
    for (size_t i = 0; i < rule->num_backends; i++) {
        if (ap_registry_find(registry, rule->backends[i]) != NULL) {
            known++;
            continue;
        }
        const ap_config_pos *pos = &full->backend_pos[i];
        if (rule->explicit_single) {
            ap_describe_loaded(registry, rule->backends[i], loaded, sizeof loaded);
            return ap_config_error(config->source, pos->line, pos->column,
                                   "unknown backend '%s' (%s)", rule->backends[i], loaded);
        }
        ap_log(AP_LOG_CONFIG, "%s:%d:%d: backend '%s' is not loaded here; skipped", config->source,
               pos->line, pos->column, rule->backends[i]);
    }
    if (known > 0) return AP_OK;
    char names[512] = "";
    size_t used = 0;
    for (size_t i = 0; i < rule->num_backends; i++) {
        int n =
            snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", rule->backends[i]);
        if (n > 0 && (size_t)n < sizeof names - used) used += (size_t)n;
    }
    ap_describe_loaded(registry, NULL, loaded, sizeof loaded);
    return ap_config_error(config->source, full->list_pos.line, full->list_pos.column,
                           "none of the backends [%s] is loaded (%s)", names, loaded);
}

/* Wrap the last error (from selection or create) with where the rule was written. */
static ap_status ap_rule_fail(const ap_config *config, const ap_config_rule_full *full,
                              const ap_model *model, ap_status status) {
    char *reasons = strdup(ap_last_error());
    ap_error_set(status, "%s:%d:%d: rule '%s' for model '%s': %s", config->source,
                 full->list_pos.line, full->list_pos.column, full->rule.pattern, model->name,
                 reasons != NULL ? reasons : "(out of memory)");
    free(reasons);
    return status;
}

/* Select, then create; when create fails, select again without that backend, keeping the
 * reason. `names` and `failed` have room for every backend of the rule. */
static ap_status ap_rule_walk(const ap_config *config, const ap_config_rule_full *full,
                              ap_registry *registry, const ap_model *model, const ap_device *device,
                              const char **names, char *failed, ap_instance **out,
                              ap_selection **walk) {
    const ap_config_rule *rule = &full->rule;
    ap_status status = AP_OK;
    char notes[2048] = "";
    size_t used = 0, failures = 0;
    for (;;) {
        size_t count = 0;
        for (size_t i = 0; i < rule->num_backends; i++)
            if (!failed[i]) names[count++] = rule->backends[i];
        ap_status selected = AP_ERR_NOT_FOUND;
        if (count > 0) {
            ap_selection_destroy(*walk);
            *walk = NULL;
            selected = ap_select(registry, names, count, rule->explicit_single, model,
                                 &rule->options, device, walk);
        }
        /* Nothing more serves, but something did and failed to open: that failure is the news,
         * with its own status (out of memory, say), and the refusals of the rest follow. */
        if (selected != AP_OK && failures > 0) {
            ap_error_set(status, "every backend that passed the checks failed to open: %s%s%s",
                         notes, count > 0 ? " | the others cannot serve: " : "",
                         count > 0 ? ap_last_error() : "");
            return status;
        }
        if (selected != AP_OK) return selected;
        const char *chosen = ap_selection_chosen(*walk);
        if (chosen == NULL)
            return ap_error_set(AP_ERR_INTERNAL, "selection succeeded but chose no backend");
        status = ap_instance_open(registry, chosen, model, &rule->options, device, out);
        if (status == AP_OK) {
            ap_log(AP_LOG_CONFIG, "%s:%d: model '%s' runs on '%s'", config->source, rule->line,
                   model->name, chosen);
            return AP_OK;
        }
        if (rule->explicit_single) return status;
        size_t index = 0;
        while (index < rule->num_backends && strcmp(rule->backends[index], chosen) != 0) index++;
        if (index == rule->num_backends)
            return ap_error_set(AP_ERR_INTERNAL, "selection chose '%s', not in the rule", chosen);
        failed[index] = 1;
        failures++;
        int n =
            snprintf(notes + used, sizeof notes - used, "%s%s", used ? " | " : "", ap_last_error());
        used = n > 0 && (size_t)n < sizeof notes - used ? used + (size_t)n : sizeof notes - 1;
        ap_log(AP_LOG_CONFIG, "%s:%d: '%s' passed the checks but failed to open; walking on: %s",
               config->source, rule->line, chosen, ap_last_error());
    }
}

ap_status ap_config_open(const ap_config *config, ap_registry *registry, const ap_model *model,
                         const ap_device *device, ap_instance **out, ap_selection **selection) {
    ap_selection *walk = NULL;
    const char **names = NULL;
    char *failed = NULL;
    ap_status status = AP_OK;
    if (selection != NULL) *selection = NULL;
    if (out != NULL) *out = NULL;
    if (config == NULL || registry == NULL || model == NULL || device == NULL || out == NULL) {
        status =
            ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_open: a required argument is NULL");
        goto out;
    }
    if (model->name == NULL) {
        status = ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_open: the model has no name");
        goto out;
    }
    const ap_config_rule *rule = ap_config_match(config, model->name);
    if (rule == NULL) {
        status = AP_ERR_NOT_FOUND;
        goto out;
    }
    const ap_config_rule_full *full = (const ap_config_rule_full *)rule;
    status = ap_rule_check_known(config, full, registry);
    if (status != AP_OK) {
        /* The caller still gets the walk, each name with its verdict; the message stays ours. */
        if (selection != NULL) {
            char *message = strdup(ap_last_error());
            ap_select(registry, rule->backends, rule->num_backends, rule->explicit_single, model,
                      &rule->options, device, &walk);
            ap_error_set(status, "%s", message != NULL ? message : "out of memory");
            free(message);
        }
        goto out;
    }
    names = calloc(rule->num_backends, sizeof *names);
    failed = calloc(rule->num_backends, 1);
    if (names == NULL || failed == NULL) {
        status = ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    status = ap_rule_walk(config, full, registry, model, device, names, failed, out, &walk);
    if (status != AP_OK) status = ap_rule_fail(config, full, model, status);
out:
    free(names);
    free(failed);
    if (selection != NULL)
        *selection = walk;
    else
        ap_selection_destroy(walk);
    return status;
}
