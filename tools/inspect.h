/* inspect.h: what the parts of ap-inspect share: its arguments, the registry and the device. */
#ifndef AP_INSPECT_H
#define AP_INSPECT_H

#include <stdio.h>

#include "attnplug.h"
#include "json_writer.h"

/* Exit codes of ap-inspect. */
#define AP_INSPECT_OK 0
#define AP_INSPECT_ERROR 1
#define AP_INSPECT_USAGE 2

typedef struct ap_inspect {
    const char *backend;     /* `ap-inspect BACKEND`, or NULL for all */
    const char *config_path; /* --config */
    const char *model_name;  /* --model */
    const char *model_spec;  /* --model-spec */
    int use_json;            /* --json */
    ap_registry *registry;   /* scanned */
    ap_device device;        /* from ap_device_query, or the CPU with its reason */
    ap_json json;            /* the --json writer on stdout */
} ap_inspect;

/* The default listing (or one backend's): core version, device, plugin files, backends. */
int ap_inspect_overview(ap_inspect *inspect);

/* --config: validate a config; with --model, also walk its selection on this device. */
int ap_inspect_config(ap_inspect *inspect, const ap_config *config);

/* Shared pieces of output, in text or JSON depending on inspect->use_json. */
void ap_inspect_emit_device(ap_inspect *inspect);
void ap_inspect_emit_verdict_reasons(ap_inspect *inspect, const char *reasons, const char *indent);

#endif /* AP_INSPECT_H */
