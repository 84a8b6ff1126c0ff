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

/* "loaded: a, b, c" (or "none"): what a name no plugin provides could have been. */
static void ap_describe_loaded(const ap_registry *registry, char *text, size_t size) {
    size_t used = 0, count = ap_registry_backend_count(registry);
    int n = snprintf(text, size, "loaded: %s", count == 0 ? "none" : "");
    used = n > 0 && (size_t)n < size ? (size_t)n : size - 1;
    for (size_t i = 0; i < count; i++) {
        const ap_descriptor *desc = ap_registry_backend(registry, i);
        n = snprintf(text + used, size - used, "%s%s", i ? ", " : "", desc ? desc->name : "?");
        used = n > 0 && (size_t)n < size - used ? used + (size_t)n : size - 1;
    }
}

/* Names no plugin provides: for `backend:` a hard error; in a list they are skipped (a list may
 * name backends not built here), unless none of the list is known. A backend disabled by
 * AP_BACKENDS_DISABLE is known: the walk reports it refused, with the pattern. */
static ap_status ap_rule_check_known(const ap_config *config, const ap_config_rule_full *full,
                                     const ap_registry *registry) {
    const ap_config_rule *rule = &full->rule;
    size_t known = 0;
    char loaded[2048];
    for (size_t i = 0; i < rule->num_backends; i++) {
        char refusal[1024];
        if (ap_registry_find(registry, rule->backends[i]) != NULL ||
            ap_registry_refusal(registry, rule->backends[i], refusal, sizeof refusal)) {
            known++;
            continue;
        }
        const ap_config_pos *pos = &full->backend_pos[i];
        if (rule->explicit_single) {
            ap_describe_loaded(registry, loaded, sizeof loaded);
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
    ap_describe_loaded(registry, loaded, sizeof loaded);
    return ap_config_error(config->source, full->list_pos.line, full->list_pos.column,
                           "none of the backends [%s] is loaded (%s)", names, loaded);
}

ap_status ap_config_check_backends(const ap_config *config, const ap_registry *registry) {
    if (config == NULL || registry == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_config_check_backends: %s is NULL",
                            config == NULL ? "config" : "registry");
    for (size_t i = 0; i < config->num_rules; i++) {
        ap_status status = ap_rule_check_known(config, &config->rules[i], registry);
        if (status != AP_OK) return status;
    }
    ap_error_clear();
    return AP_OK;
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

/* What became of a rule's backends at open: for each one that passed the checks and failed
 * to open, create's status (else AP_OK) and message. */
typedef struct ap_walk_state {
    const char **names;    /* scratch: the backends still in the running */
    ap_status *create;     /* [num_backends] */
    char **create_message; /* [num_backends] owned, or NULL */
    size_t failures;
} ap_walk_state;

/* Note that `chosen` failed to open with `status` and the last error's message. */
static ap_status ap_walk_note_failure(const ap_config_rule *rule, ap_walk_state *state,
                                      const char *chosen, ap_status status) {
    size_t index = 0;
    while (index < rule->num_backends && strcmp(rule->backends[index], chosen) != 0) index++;
    if (index == rule->num_backends)
        return ap_error_set(AP_ERR_INTERNAL, "selection chose '%s', not in the rule", chosen);
    state->create[index] = status;
    state->create_message[index] = strdup(ap_last_error());
    state->failures++;
    if (state->create_message[index] == NULL)
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory recording a failed create");
    return status;
}

/* The message when nothing more serves but something did and failed to open: that failure is
 * the news, with its own status (out of memory, say), and the refusals of the rest follow. */
static ap_status ap_walk_fail_after_create(const ap_config_rule *rule, const ap_walk_state *state,
                                           size_t remaining) {
    char notes[2048] = "";
    size_t used = 0;
    ap_status status = AP_ERR_INTERNAL;
    for (size_t i = 0; i < rule->num_backends; i++) {
        if (state->create[i] == AP_OK) continue;
        status = state->create[i];
        int n = snprintf(notes + used, sizeof notes - used, "%s%s", used ? " | " : "",
                         state->create_message[i] ? state->create_message[i] : "out of memory");
        used = n > 0 && (size_t)n < sizeof notes - used ? used + (size_t)n : sizeof notes - 1;
    }
    return ap_error_set(status, "every backend that passed the checks failed to open: %s%s%s",
                        notes, remaining > 0 ? " | the others cannot serve: " : "",
                        remaining > 0 ? ap_last_error() : "");
}

/* Select, then create; when create fails, select again without that backend, keeping the
 * reason in `state`. `*walk` is the last selection pass. */
static ap_status ap_rule_walk(const ap_config *config, const ap_config_rule_full *full,
                              ap_registry *registry, const ap_model *model, const ap_device *device,
                              ap_walk_state *state, ap_instance **out, ap_selection **walk) {
    const ap_config_rule *rule = &full->rule;
    for (;;) {
        size_t count = 0;
        for (size_t i = 0; i < rule->num_backends; i++)
            if (state->create[i] == AP_OK) state->names[count++] = rule->backends[i];
        ap_status selected = AP_ERR_NOT_FOUND;
        ap_selection_destroy(*walk);
        *walk = NULL;
        if (count > 0)
            selected = ap_select(registry, state->names, count, rule->explicit_single, model,
                                 &rule->options, device, walk);
        if (selected != AP_OK && state->failures > 0)
            return ap_walk_fail_after_create(rule, state, count);
        if (selected != AP_OK) return selected;
        const char *chosen = ap_selection_chosen(*walk);
        if (chosen == NULL)
            return ap_error_set(AP_ERR_INTERNAL, "selection succeeded but chose no backend");
        ap_status status = ap_instance_open(registry, chosen, model, &rule->options, device, out);
        if (status == AP_OK) {
            ap_log(AP_LOG_CONFIG, "%s:%d: model '%s' runs on '%s'", config->source, rule->line,
                   model->name, chosen);
            return AP_OK;
        }
        ap_log(AP_LOG_CONFIG, "%s:%d: '%s' passed the checks but failed to open: %s",
               config->source, rule->line, chosen, ap_last_error());
        ap_status noted = ap_walk_note_failure(rule, state, chosen, status);
        /* An explicit backend is the only one allowed: its failure ends the walk. */
        if (noted != status || rule->explicit_single) return noted;
    }
}

/* The walk as the caller sees it: every backend in rule order up to the one opened, those that
 * failed to open with create's status and message, the rest with the last pass's verdicts. */
static ap_status ap_walk_report(const ap_config_rule *rule, const ap_walk_state *state,
                                const ap_selection *last, int opened, ap_selection **out) {
    ap_status status = ap_selection_new(rule->num_backends, out);
    size_t next = 0, count = ap_selection_count(last);
    const char *chosen = opened ? ap_selection_chosen(last) : NULL;
    for (size_t i = 0; i < rule->num_backends && status == AP_OK; i++) {
        if (state->create[i] != AP_OK) {
            char reasons[2304];
            snprintf(reasons, sizeof reasons, "passed the checks, but %s",
                     state->create_message[i] ? state->create_message[i] : "create failed");
            ap_verdict failed = {rule->backends[i], state->create[i], reasons, -1};
            status = ap_selection_add(*out, &failed, 0);
            continue;
        }
        if (next >= count) continue;
        const ap_verdict *verdict = ap_selection_verdict(last, next);
        if (strcmp(verdict->backend, rule->backends[i]) != 0) continue;
        next++;
        int is_chosen = chosen != NULL && strcmp(chosen, verdict->backend) == 0;
        status = ap_selection_add(*out, verdict, is_chosen);
        if (is_chosen) break;
    }
    if (status != AP_OK) {
        ap_selection_destroy(*out);
        *out = NULL;
    }
    return status;
}

/* Walk the rule and open the first that serves; with `report`, *walk becomes the whole walk
 * (ap_walk_report), else the last selection pass. */
static ap_status ap_rule_open(const ap_config *config, const ap_config_rule_full *full,
                              ap_registry *registry, const ap_model *model, const ap_device *device,
                              int report, ap_instance **out, ap_selection **walk) {
    const ap_config_rule *rule = &full->rule;
    ap_walk_state state = {calloc(rule->num_backends, sizeof *state.names),
                           calloc(rule->num_backends, sizeof *state.create),
                           calloc(rule->num_backends, sizeof *state.create_message), 0};
    ap_status status = AP_ERR_OUT_OF_MEMORY;
    if (state.names == NULL || state.create == NULL || state.create_message == NULL) {
        ap_error_set(status, "out of memory");
        goto out;
    }
    status = ap_rule_walk(config, full, registry, model, device, &state, out, walk);
    if (status != AP_OK) status = ap_rule_fail(config, full, model, status);
    if (report) {
        /* The report replaces the last pass; only running out of memory can stop it. */
        ap_selection *whole = NULL;
        ap_status reported = ap_walk_report(rule, &state, *walk, status == AP_OK, &whole);
        ap_selection_destroy(*walk);
        *walk = whole;
        if (reported != AP_OK) {
            ap_instance_close(*out);
            *out = NULL;
            status = reported;
        }
    }
out:
    for (size_t i = 0; state.create_message != NULL && i < rule->num_backends; i++)
        free(state.create_message[i]);
    free(state.names);
    free(state.create);
    free(state.create_message);
    return status;
}

ap_status ap_config_open(const ap_config *config, ap_registry *registry, const ap_model *model,
                         const ap_device *device, ap_instance **out, ap_selection **selection) {
    ap_selection *walk = NULL;
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
    status = ap_rule_open(config, full, registry, model, device, selection != NULL, out, &walk);
out:
    if (selection != NULL)
        *selection = walk;
    else
        ap_selection_destroy(walk);
    return status;
}
