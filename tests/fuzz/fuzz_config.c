/* fuzz_config.c: libFuzzer target: any bytes through the config parser, matching and selection. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "model_presets.h"

/* Loaded once: cpu_ref and the fixtures a config can name (good, create_fails, dup, ...). */
static ap_registry *fuzz_registry;
static ap_device fuzz_cpu;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    const char *dirs[] = {AP_FUZZ_CPU_REF_DIR, AP_FUZZ_FIXTURE_DIR};
    ap_registry_options options = {sizeof options, dirs, 2, AP_REGISTRY_NO_DEFAULT_PATHS};
    if (ap_registry_create(&options, &fuzz_registry) != AP_OK ||
        ap_registry_scan(fuzz_registry) != AP_OK ||
        ap_registry_find(fuzz_registry, "cpu_ref") == NULL) {
        fprintf(stderr, "fuzz_config: no registry with cpu_ref: %s\n", ap_last_error());
        abort();
    }
    ap_device_cpu(&fuzz_cpu, "fuzzing: no GPU");
    return 0;
}

/* Open `model` through the config, as a host does, and read back the whole walk. */
static void fuzz_open(const ap_config *config, const ap_model *model) {
    ap_instance *instance = NULL;
    ap_selection *walk = NULL;
    ap_status status = ap_config_open(config, fuzz_registry, model, &fuzz_cpu, &instance, &walk);
    if ((status == AP_OK) != (instance != NULL)) abort(); /* the contract, checked */
    for (size_t i = 0; i < ap_selection_count(walk); i++) {
        const ap_verdict *verdict = ap_selection_verdict(walk, i);
        if (verdict == NULL || verdict->backend == NULL || verdict->reasons == NULL) abort();
    }
    if (status == AP_OK && ap_selection_chosen(walk) == NULL) abort();
    ap_instance_close(instance);
    ap_selection_destroy(walk);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ap_config *config = NULL;
    if (ap_config_parse((const char *)data, size, "fuzz.yaml", &config) != AP_OK) {
        if (config != NULL || ap_last_error()[0] == '\0') abort(); /* a refusal has a message */
        return 0;
    }
    ap_config_check_backends(config, fuzz_registry);
    for (size_t i = 0; i < ap_preset_count(); i++) fuzz_open(config, &ap_preset_at(i)->model);
    /* Each rule's pattern as a model name: reaches rules the presets' names do not match. */
    for (size_t i = 0; i < ap_config_rule_count(config) && i < 8; i++) {
        ap_model model = ap_preset_at(0)->model;
        model.name = ap_config_rule_at(config, i)->pattern;
        fuzz_open(config, &model);
    }
    ap_config_destroy(config);
    return 0;
}
