/* select.c: the verdict on each backend for a model and device, and walks over preference lists. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const ap_options ap_options_default = {
    .struct_size = sizeof(ap_options),
    .page_size = 0,
    .kv_dtype = AP_DTYPE_NONE,
    .prefix_cache = AP_OPTION_UNSET,
    .chunked_prefill = AP_OPTION_UNSET,
    .cuda_graphs = AP_OPTION_UNSET,
    .extra = NULL,
    .num_extra = 0,
};

/* The smallest structs a caller may hand in: those of ABI 1.0. Later minors append fields, and
 * a shorter struct from an older host is read up to its size with the rest left zero. */
#define AP_MODEL_MIN_SIZE (offsetof(ap_model, max_kv_len) + sizeof(int64_t))
#define AP_OPTIONS_MIN_SIZE (offsetof(ap_options, num_extra) + sizeof(size_t))

#define AP_REASONS_CAPACITY 4096

void ap_model_apply_options(const ap_model *model, const ap_options *options, ap_model *out) {
    if (out == NULL) return;
    memset(out, 0, sizeof *out);
    if (model != NULL) {
        size_t size = model->struct_size < sizeof *out ? model->struct_size : sizeof *out;
        memcpy(out, model, size);
    }
    out->struct_size = sizeof *out;
    if (options == NULL || options->struct_size < AP_OPTIONS_MIN_SIZE) return;
    if (options->page_size > 0) out->page_size = options->page_size;
    if (options->kv_dtype != AP_DTYPE_NONE) out->kv_dtype = options->kv_dtype;
}

static int ap_dtype_known(ap_dtype dtype) {
    return (unsigned)dtype < AP_DTYPE_COUNT && dtype != AP_DTYPE_NONE;
}

/* Every malformed field of the model, one line each. */
static void ap_model_problems(const ap_model *m, ap_msgbuf *msg) {
    if (m->kind != AP_ATTN_MHA && m->kind != AP_ATTN_MLA)
        ap_msgbuf_add(msg, "model.kind %d is not an attention kind", (int)m->kind);
    const struct {
        const char *field;
        int32_t value;
    } positive[] = {
        {"num_qo_heads", m->num_qo_heads}, {"num_kv_heads", m->num_kv_heads},
        {"head_dim_qk", m->head_dim_qk},   {"head_dim_v", m->head_dim_v},
        {"page_size", m->page_size},       {"num_layers", m->num_layers},
    };
    for (size_t i = 0; i < sizeof positive / sizeof positive[0]; i++) {
        if (positive[i].value <= 0)
            ap_msgbuf_add(msg, "model.%s is %d (must be > 0)", positive[i].field,
                          (int)positive[i].value);
    }
    if (!ap_dtype_known(m->dtype))
        ap_msgbuf_add(msg, "model.dtype %d is not a dtype", (int)m->dtype);
    if (!ap_dtype_known(m->kv_dtype))
        ap_msgbuf_add(msg, "model.kv_dtype %d is not a dtype", (int)m->kv_dtype);
    if (m->max_batch < 0 || m->max_tokens < 0 || m->max_kv_len < 0)
        ap_msgbuf_add(msg, "model.max_batch/max_tokens/max_kv_len must be >= 0 (0: no limit)");
    if (m->kind == AP_ATTN_MLA && (m->kv_lora_rank <= 0 || m->qk_rope_head_dim <= 0))
        ap_msgbuf_add(msg, "MLA model needs kv_lora_rank > 0 and qk_rope_head_dim > 0 (got %d, %d)",
                      (int)m->kv_lora_rank, (int)m->qk_rope_head_dim);
    if (m->kind == AP_ATTN_MLA && (m->qk_nope_head_dim < 0 || m->v_head_dim < 0))
        ap_msgbuf_add(msg, "MLA model has a negative qk_nope_head_dim or v_head_dim");
}

/* Join a '\n'-separated list into one line with "; " between the items. */
static void ap_lines_join(const char *lines, char *out, size_t capacity) {
    size_t used = 0;
    if (capacity == 0) return;
    for (const char *p = lines; *p != '\0' && used + 1 < capacity; p++) {
        if (*p == '\n') {
            if (used + 2 >= capacity) break;
            out[used++] = ';';
            out[used++] = ' ';
        } else {
            out[used++] = *p;
        }
    }
    out[used] = '\0';
}

/* AP_OK when the model is well formed (struct_size, kind, heads, dims, dtypes, page size), else
 * AP_ERR_INVALID_ARGUMENT with the last error set. */
static ap_status ap_model_check(const ap_model *model) {
    if (model == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "model is NULL");
    if (model->struct_size < AP_MODEL_MIN_SIZE)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "model.struct_size is %zu, smaller than ABI 1.0's %zu",
                            model->struct_size, (size_t)AP_MODEL_MIN_SIZE);
    char text[1024], line[1024];
    ap_msgbuf msg = ap_msgbuf_over(text, sizeof text);
    ap_model_problems(model, &msg);
    if (msg.length == 0) return AP_OK;
    ap_lines_join(text, line, sizeof line);
    return ap_error_set(AP_ERR_INVALID_ARGUMENT, "invalid model '%s': %s",
                        model->name != NULL ? model->name : "(unnamed)", line);
}

static ap_status ap_options_check(const ap_options *o) {
    if (o->struct_size < AP_OPTIONS_MIN_SIZE)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "options.struct_size is %zu, smaller than ABI 1.0's %zu",
                            o->struct_size, (size_t)AP_OPTIONS_MIN_SIZE);
    if (o->page_size < 0)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "options.page_size is %d (must be >= 0)",
                            (int)o->page_size);
    if ((unsigned)o->kv_dtype >= AP_DTYPE_COUNT)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "options.kv_dtype %d is not a dtype",
                            (int)o->kv_dtype);
    const int32_t flags[] = {o->prefix_cache, o->chunked_prefill, o->cuda_graphs};
    for (size_t i = 0; i < 3; i++) {
        if (flags[i] < AP_OPTION_UNSET || flags[i] > 1)
            return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                                "options flag %d is not AP_OPTION_UNSET, 0 or 1", (int)flags[i]);
    }
    if (o->num_extra > 0 && o->extra == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "options.extra is NULL with num_extra %zu",
                            o->num_extra);
    return AP_OK;
}

static ap_status ap_device_check(const ap_device *device) {
    if (device == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "device is NULL");
    if (device->struct_size < sizeof(ap_device))
        return ap_error_set(AP_ERR_INVALID_ARGUMENT,
                            "device.struct_size is %zu, expected %zu (fill it with "
                            "ap_device_query or ap_device_cpu)",
                            device->struct_size, sizeof(ap_device));
    return AP_OK;
}

/* ---- list formatting for reasons ---------------------------------------------------------- */

static void ap_format_dtypes(uint32_t mask, char *out, size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (int d = 0; d < AP_DTYPE_COUNT && used < capacity; d++) {
        if (!(mask & AP_DTYPE_BIT(d))) continue;
        int n = snprintf(out + used, capacity - used, "%s%s", used > 0 ? ", " : "",
                         ap_dtype_str((ap_dtype)d));
        if (n > 0) used += (size_t)n;
    }
    if (out[0] == '\0') snprintf(out, capacity, "none");
}

static void ap_format_ints(const int32_t *values, size_t count, char *out, size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; i < count && used < capacity; i++) {
        int n = snprintf(out + used, capacity - used, "%s%d", i > 0 ? ", " : "", (int)values[i]);
        if (n > 0) used += (size_t)n;
    }
}

static void ap_format_archs(const ap_caps *caps, char *out, size_t capacity) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; caps->archs != NULL && i < caps->num_archs && used < capacity; i++) {
        ap_arch_target t = caps->archs[i];
        const char *sep = i > 0 ? ", " : "";
        int n;
        if (t.kind == AP_ARCH_PTX)
            n = snprintf(out + used, capacity - used, "%scompute_%d (PTX)", sep, (int)t.sm);
        else if (t.kind == AP_ARCH_SASS_SPECIFIC)
            n = snprintf(out + used, capacity - used, "%ssm_%da (SASS, arch-specific)", sep,
                         (int)t.sm);
        else
            n = snprintf(out + used, capacity - used, "%ssm_%d (SASS)", sep, (int)t.sm);
        if (n > 0) used += (size_t)n;
    }
    if (out[0] == '\0') snprintf(out, capacity, "no GPU target");
}

static int ap_int_in(int32_t value, const int32_t *values, size_t count) {
    if (values == NULL || count == 0) return 1; /* "any" */
    for (size_t i = 0; i < count; i++) {
        if (values[i] == value) return 1;
    }
    return 0;
}

/* ---- the stages of one verdict -------------------------------------------------------------- */

/* Device kind and arch: can this backend's code run on this device at all? */
static ap_status ap_stage_device(const char *name, const ap_caps *caps, const ap_device *device,
                                 ap_msgbuf *reasons, int *arch_index) {
    int gpu = device->ordinal >= 0 && device->unusable_reason[0] == '\0' && device->cc_major > 0;
    if (gpu && (caps->device_kinds & AP_DEVICE_KIND_CUDA)) {
        *arch_index =
            ap_arch_pick(caps->archs, caps->num_archs, device->cc_major, device->cc_minor);
        if (*arch_index >= 0) {
            ap_arch_target t = caps->archs[*arch_index];
            ap_log(AP_LOG_SELECT, "%s: arch ok: %s%d%s on sm_%d%d", name,
                   t.kind == AP_ARCH_PTX ? "compute_" : "sm_", (int)t.sm,
                   t.kind == AP_ARCH_SASS_SPECIFIC ? "a" : "", (int)device->cc_major,
                   (int)device->cc_minor);
            return AP_OK;
        }
        char archs[512];
        ap_format_archs(caps, archs, sizeof archs);
        ap_msgbuf_add(reasons, "compiled for %s; this GPU is sm_%d%d", archs, (int)device->cc_major,
                      (int)device->cc_minor);
        return AP_ERR_NO_DEVICE;
    }
    if (caps->device_kinds & AP_DEVICE_KIND_CPU) {
        ap_log(AP_LOG_SELECT, "%s: device ok: runs on the CPU", name);
        return AP_OK;
    }
    if (caps->device_kinds & AP_DEVICE_KIND_CUDA) {
        const char *why = device->unusable_reason[0] != '\0'
                              ? device->unusable_reason
                              : "the device given is the CPU, not a GPU";
        ap_msgbuf_add(reasons, "needs a CUDA GPU: %s", why);
        return AP_ERR_NO_DEVICE;
    }
    ap_msgbuf_add(reasons, "declares no device kind it runs on (caps.device_kinds = 0x%x)",
                  (unsigned)caps->device_kinds);
    return AP_ERR_UNSUPPORTED;
}

/* What the model itself asks of any backend, beyond well-formed fields. */
static void ap_stage_model_shape(const ap_model *m, ap_msgbuf *reasons) {
    if (m->num_qo_heads % m->num_kv_heads != 0)
        ap_msgbuf_add(reasons, "num_qo_heads %d is not a multiple of num_kv_heads %d",
                      (int)m->num_qo_heads, (int)m->num_kv_heads);
    if (m->kind != AP_ATTN_MLA) return;
    if (m->num_kv_heads != 1)
        ap_msgbuf_add(reasons, "MLA model has num_kv_heads %d (the latent cache has 1)",
                      (int)m->num_kv_heads);
    if (m->head_dim_qk != m->kv_lora_rank + m->qk_rope_head_dim)
        ap_msgbuf_add(reasons, "MLA head_dim_qk %d != kv_lora_rank %d + qk_rope_head_dim %d",
                      (int)m->head_dim_qk, (int)m->kv_lora_rank, (int)m->qk_rope_head_dim);
    if (m->head_dim_v != m->kv_lora_rank)
        ap_msgbuf_add(reasons, "MLA head_dim_v %d != kv_lora_rank %d", (int)m->head_dim_v,
                      (int)m->kv_lora_rank);
}

/* Static capabilities: every mismatch, not only the first. */
static ap_status ap_stage_caps(const ap_caps *caps, const ap_model *m, const ap_options *options,
                               ap_msgbuf *reasons) {
    size_t before = reasons->length;
    char list[256];
    if (!(caps->attn_kinds & AP_ATTN_BIT(m->kind))) {
        const char *kinds =
            (caps->attn_kinds & AP_ATTN_BIT(AP_ATTN_MHA))
                ? ((caps->attn_kinds & AP_ATTN_BIT(AP_ATTN_MLA)) ? "mha, mla" : "mha")
                : ((caps->attn_kinds & AP_ATTN_BIT(AP_ATTN_MLA)) ? "mla" : "none");
        ap_msgbuf_add(reasons, "attention kind %s is not supported (supports %s)",
                      ap_attn_kind_name(m->kind), kinds);
    }
    if (!(caps->q_dtypes & AP_DTYPE_BIT(m->dtype))) {
        ap_format_dtypes(caps->q_dtypes, list, sizeof list);
        ap_msgbuf_add(reasons, "query dtype %s is not supported (supports %s)",
                      ap_dtype_str(m->dtype), list);
    }
    if (!(caps->kv_dtypes & AP_DTYPE_BIT(m->kv_dtype))) {
        ap_format_dtypes(caps->kv_dtypes, list, sizeof list);
        ap_msgbuf_add(reasons, "KV-cache dtype %s is not supported (supports %s)",
                      ap_dtype_str(m->kv_dtype), list);
    }
    if (!ap_int_in(m->page_size, caps->page_sizes, caps->num_page_sizes)) {
        ap_format_ints(caps->page_sizes, caps->num_page_sizes, list, sizeof list);
        ap_msgbuf_add(reasons, "page size %d is not supported (supports %s)", (int)m->page_size,
                      list);
    }
    /* caps.head_dims lists MHA head dims; an MLA backend's validate() checks its dims. */
    if (m->kind == AP_ATTN_MHA &&
        !ap_int_in(m->head_dim_qk, caps->head_dims, caps->num_head_dims)) {
        ap_format_ints(caps->head_dims, caps->num_head_dims, list, sizeof list);
        ap_msgbuf_add(reasons, "head dim %d is not supported (supports %s)", (int)m->head_dim_qk,
                      list);
    }
    if (!(caps->phases & AP_PHASE_EXTEND))
        ap_msgbuf_add(reasons, "extend (prefill) phase is not supported");
    if (!m->embedding && !(caps->phases & AP_PHASE_DECODE))
        ap_msgbuf_add(reasons, "decode phase is not supported (the model is not an embedding "
                               "model, so it decodes)");
    if (!m->causal && !(caps->features & AP_FEATURE_NONCAUSAL))
        ap_msgbuf_add(reasons, "non-causal attention is not supported");
    if (options->cuda_graphs == 1 && caps->cuda_graph == AP_GRAPH_NONE)
        ap_msgbuf_add(reasons, "options.cuda_graphs is on but the backend allows no CUDA-graph "
                               "capture");
    ap_stage_model_shape(m, reasons);
    return reasons->length > before ? AP_ERR_UNSUPPORTED : AP_OK;
}

/* The plugin's own pre-flight: its refusal becomes AP_ERR_REFUSED with its reasons. */
static ap_status ap_stage_validate(const ap_plugin *plugin, const ap_model *m,
                                   const ap_options *options, const ap_device *device,
                                   ap_msgbuf *reasons) {
    char text[AP_REASONS_CAPACITY];
    ap_msgbuf msg = ap_msgbuf_over(text, sizeof text);
    ap_status status = plugin->desc->vtable->validate(m, options, device, &msg);
    text[sizeof text - 1] = '\0';
    if (status == AP_OK) return AP_OK;
    if (msg.length == 0) {
        ap_msgbuf_add(reasons, "validate() refused without a reason (%s)", ap_status_name(status));
        return AP_ERR_REFUSED;
    }
    /* Re-add line by line so each keeps its own '\n' separation in `reasons`, escaped. */
    for (char *line = text; line != NULL && *line != '\0';) {
        char *end = strchr(line, '\n');
        if (end != NULL) *end = '\0';
        char escaped[AP_TEXT_LINE_MAX];
        ap_text_escape(line, escaped, sizeof escaped);
        ap_msgbuf_add(reasons, "%s", escaped);
        line = end != NULL ? end + 1 : NULL;
    }
    return AP_ERR_REFUSED;
}

/* One log line per refusal, its reasons joined. */
static void ap_log_refusal(const char *name, const char *stage, ap_status status,
                           const ap_msgbuf *reasons) {
    if (!ap_log_enabled(AP_LOG_SELECT)) return;
    char line[AP_REASONS_CAPACITY];
    ap_lines_join(reasons->text, line, sizeof line);
    ap_log(AP_LOG_SELECT, "%s: refused by %s (%s): %s", name, stage, ap_status_name(status), line);
}

/* The verdict on one backend for a checked model: every reason goes into `reasons`, the picked
 * entry of caps.archs into *arch_index (-1 when none). The last error is the caller's to set. */
static ap_status ap_backend_check(ap_registry *registry, const char *name, const ap_model *model,
                                  const ap_options *options, const ap_device *device,
                                  ap_msgbuf *reasons, int *arch_index) {
    *arch_index = -1;
    ap_plugin *plugin = ap_registry_find_plugin(registry, name);
    if (plugin == NULL) {
        /* Refused at load on purpose (AP_BACKENDS_DISABLE) is not the same as absent. */
        char refusal[AP_REASONS_CAPACITY];
        if (ap_registry_refusal(registry, name, refusal, sizeof refusal)) {
            ap_msgbuf_add(reasons, "%s", refusal);
            ap_log(AP_LOG_SELECT, "%s: refused at load: %s", name, refusal);
            return AP_ERR_REFUSED;
        }
        ap_msgbuf_add(reasons, "no plugin provides backend '%s'", name);
        ap_log(AP_LOG_SELECT, "%s: not found", name);
        return AP_ERR_NOT_FOUND;
    }
    const ap_caps *caps = plugin->desc->caps;
    ap_status status = ap_stage_device(name, caps, device, reasons, arch_index);
    if (status != AP_OK) {
        ap_log_refusal(name, "the device check", status, reasons);
        return status;
    }
    status = ap_stage_caps(caps, model, options, reasons);
    if (status != AP_OK) {
        ap_log_refusal(name, "its static capabilities", status, reasons);
        return status;
    }
    ap_log(AP_LOG_SELECT, "%s: static capabilities ok", name);
    status = ap_stage_validate(plugin, model, options, device, reasons);
    if (status != AP_OK) {
        ap_log_refusal(name, "its validate()", status, reasons);
        return status;
    }
    ap_log(AP_LOG_SELECT, "%s: usable", name);
    return AP_OK;
}

/* Check the arguments shared by ap_registry_check and ap_select, and apply the options. */
static ap_status ap_check_inputs(ap_registry *registry, const ap_model *model,
                                 const ap_options **options, const ap_device *device,
                                 ap_model *applied) {
    if (registry == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "registry is NULL");
    ap_status status = ap_model_check(model);
    if (status != AP_OK) return status;
    if (*options == NULL) *options = &ap_options_default;
    status = ap_options_check(*options);
    if (status != AP_OK) return status;
    status = ap_device_check(device);
    if (status != AP_OK) return status;
    ap_model_apply_options(model, *options, applied);
    return ap_model_check(applied); /* options may have set a bad page size or dtype */
}

ap_status ap_registry_check(ap_registry *registry, const char *name, const ap_model *model,
                            const ap_options *options, const ap_device *device, ap_verdict *out) {
    static _Thread_local char name_copy[256];
    static _Thread_local char reasons_text[AP_REASONS_CAPACITY];
    if (out == NULL || name == NULL)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_registry_check: NULL %s",
                            out == NULL ? "out" : "name");
    snprintf(name_copy, sizeof name_copy, "%s", name);
    ap_msgbuf reasons = ap_msgbuf_over(reasons_text, sizeof reasons_text);
    *out = (ap_verdict){name_copy, AP_ERR_INVALID_ARGUMENT, reasons_text, -1};
    ap_model applied;
    ap_status status = ap_check_inputs(registry, model, &options, device, &applied);
    if (status != AP_OK) {
        ap_msgbuf_add(&reasons, "%s", ap_last_error());
        return status;
    }
    status =
        ap_backend_check(registry, name, &applied, options, device, &reasons, &out->arch_index);
    out->status = status;
    if (status == AP_OK) {
        ap_error_clear();
        return AP_OK;
    }
    char line[AP_REASONS_CAPACITY];
    ap_lines_join(reasons_text, line, sizeof line);
    if (status == AP_ERR_NOT_FOUND) return ap_error_set(status, "%s", line);
    return ap_error_set(status, "backend '%s' cannot serve model '%s': %s", name,
                        applied.name != NULL ? applied.name : "(unnamed)", line);
}

/* ---- walks over a preference list ------------------------------------------------------------ */

struct ap_selection {
    ap_verdict *verdicts; /* backend and reasons strings are owned here */
    size_t count;
    const char *chosen; /* points into verdicts[], or NULL */
};

void ap_selection_destroy(ap_selection *selection) {
    if (selection == NULL) return;
    for (size_t i = 0; i < selection->count; i++) {
        free((char *)selection->verdicts[i].backend);
        free((char *)selection->verdicts[i].reasons);
    }
    free(selection->verdicts);
    free(selection);
}

size_t ap_selection_count(const ap_selection *selection) {
    return selection != NULL ? selection->count : 0;
}

const ap_verdict *ap_selection_verdict(const ap_selection *selection, size_t index) {
    if (selection == NULL || index >= selection->count) return NULL;
    return &selection->verdicts[index];
}

const char *ap_selection_chosen(const ap_selection *selection) {
    return selection != NULL ? selection->chosen : NULL;
}

/* The last error after a walk where nothing served: every candidate with its reasons. */
static ap_status ap_selection_fail(const ap_selection *sel, const ap_model *model, ap_status status,
                                   int explicit_single) {
    char text[AP_REASONS_CAPACITY * 2];
    size_t used = 0;
    const char *model_name = model->name != NULL ? model->name : "(unnamed)";
    int n = explicit_single
                ? snprintf(text, sizeof text,
                           "backend '%s' (the only one allowed) cannot serve "
                           "model '%s': ",
                           sel->verdicts[0].backend, model_name)
                : snprintf(text, sizeof text, "no backend can serve model '%s':", model_name);
    if (n > 0) used = (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
    for (size_t i = 0; i < sel->count && used + 1 < sizeof text; i++) {
        char line[AP_REASONS_CAPACITY];
        ap_lines_join(sel->verdicts[i].reasons, line, sizeof line);
        if (explicit_single)
            n = snprintf(text + used, sizeof text - used, "%s", line);
        else
            n = snprintf(text + used, sizeof text - used, "%s %s (%s): %s", i > 0 ? " |" : "",
                         sel->verdicts[i].backend, ap_status_name(sel->verdicts[i].status), line);
        if (n > 0) used += (size_t)n < sizeof text - used ? (size_t)n : sizeof text - used - 1;
    }
    return ap_error_set(status, "%s", text);
}

ap_status ap_selection_new(size_t capacity, ap_selection **out) {
    ap_selection *sel = calloc(1, sizeof *sel);
    if (sel != NULL) sel->verdicts = calloc(capacity > 0 ? capacity : 1, sizeof *sel->verdicts);
    if (sel == NULL || sel->verdicts == NULL) {
        free(sel);
        *out = NULL;
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory starting a selection");
    }
    *out = sel;
    return AP_OK;
}

ap_status ap_selection_add(ap_selection *sel, const ap_verdict *verdict, int chosen) {
    ap_verdict *v = &sel->verdicts[sel->count];
    *v = (ap_verdict){strdup(verdict->backend), verdict->status, strdup(verdict->reasons),
                      verdict->arch_index};
    if (v->backend == NULL || v->reasons == NULL) {
        free((char *)v->backend);
        free((char *)v->reasons);
        return ap_error_set(AP_ERR_OUT_OF_MEMORY, "out of memory recording a verdict");
    }
    sel->count++;
    if (chosen) sel->chosen = v->backend;
    return AP_OK;
}

/* Check one candidate and append its verdict (with owned strings) to the selection. */
static ap_status ap_selection_try(ap_selection *sel, ap_registry *registry, const char *name,
                                  const ap_model *applied, const ap_options *options,
                                  const ap_device *device) {
    char text[AP_REASONS_CAPACITY];
    ap_msgbuf reasons = ap_msgbuf_over(text, sizeof text);
    ap_verdict verdict = {name, AP_OK, text, -1};
    verdict.status =
        ap_backend_check(registry, name, applied, options, device, &reasons, &verdict.arch_index);
    return ap_selection_add(sel, &verdict, verdict.status == AP_OK);
}

ap_status ap_select(ap_registry *registry, const char *const *names, size_t count,
                    int explicit_single, const ap_model *model, const ap_options *options,
                    const ap_device *device, ap_selection **out) {
    if (out == NULL) return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_select: out is NULL");
    *out = NULL;
    if (names == NULL || count == 0)
        return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_select: no backend names given");
    for (size_t i = 0; i < count; i++) {
        if (names[i] == NULL)
            return ap_error_set(AP_ERR_INVALID_ARGUMENT, "ap_select: names[%zu] is NULL", i);
    }
    ap_model applied;
    ap_status status = ap_check_inputs(registry, model, &options, device, &applied);
    if (status != AP_OK) return status;
    ap_selection *sel;
    if (ap_selection_new(count, &sel) != AP_OK) return AP_ERR_OUT_OF_MEMORY;
    for (size_t i = 0; i < count && sel->chosen == NULL; i++) {
        status = ap_selection_try(sel, registry, names[i], &applied, options, device);
        if (status != AP_OK) {
            ap_selection_destroy(sel);
            return status;
        }
    }
    *out = sel;
    if (sel->chosen != NULL) {
        ap_log(AP_LOG_SELECT, "model '%s': chose %s after %zu candidate(s)",
               applied.name != NULL ? applied.name : "(unnamed)", sel->chosen, sel->count);
        ap_error_clear();
        return AP_OK;
    }
    int single = explicit_single && count == 1;
    return ap_selection_fail(sel, &applied, single ? sel->verdicts[0].status : AP_ERR_REFUSED,
                             single);
}
