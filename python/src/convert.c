/* convert.c: Python mappings to the core's model, options and device, and the core's structs back
 * to Python dicts. Unknown keys are errors, as in the YAML config: a typo must not pass. */
#include <stdlib.h>
#include <string.h>

#include "binding.h"

void ap_py_strings_free(ap_py_strings *strings) {
    for (size_t i = 0; i < strings->count; i++) free(strings->items[i]);
    free(strings->items);
    strings->items = NULL;
    strings->count = 0;
}

/* A copy of a str that lives in `strings`; NULL with an error set. */
static const char *ap_py_strings_keep(ap_py_strings *strings, PyObject *text, const char *what) {
    if (!PyUnicode_Check(text)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s must be a str", what);
        return NULL;
    }
    Py_ssize_t length = 0;
    const char *utf8 = PyUnicode_AsUTF8AndSize(text, &length);
    if (utf8 == NULL) return NULL;
    char **items = realloc(strings->items, (strings->count + 1) * sizeof *items);
    if (items == NULL) return (const char *)PyErr_NoMemory();
    strings->items = items;
    char *copy = malloc((size_t)length + 1);
    if (copy == NULL) return (const char *)PyErr_NoMemory();
    memcpy(copy, utf8, (size_t)length + 1);
    strings->items[strings->count++] = copy;
    return copy;
}

static int ap_py_dtype_from(PyObject *value, const char *what, ap_dtype *out) {
    if (!PyUnicode_Check(value)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s must be a dtype name such as 'bf16'", what);
        return -1;
    }
    const char *name = PyUnicode_AsUTF8AndSize(value, NULL);
    if (name == NULL) return -1;
    if (ap_dtype_parse(name, out) != AP_OK) {
        ap_py_raise(AP_ERR_INVALID_ARGUMENT);
        return -1;
    }
    return 0;
}

/* An int field in range for int32 (or int64 when `wide`). */
static int ap_py_int_from(PyObject *value, const char *what, int wide, int64_t *out) {
    if (!PyLong_Check(value)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s must be an int", what);
        return -1;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred()) return -1;
    if (!wide && (number < INT32_MIN || number > INT32_MAX)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s is %lld, outside int32", what, number);
        return -1;
    }
    *out = number;
    return 0;
}

enum { AP_PY_INT32, AP_PY_INT64, AP_PY_BOOL };

typedef struct ap_py_field {
    const char *key;
    size_t offset;
    int kind;
} ap_py_field;

#define AP_PY_MODEL_FIELD(name, kind) \
    { #name, offsetof(ap_model, name), kind }
static const ap_py_field ap_py_model_fields[] = {
    AP_PY_MODEL_FIELD(num_qo_heads, AP_PY_INT32),
    AP_PY_MODEL_FIELD(num_kv_heads, AP_PY_INT32),
    AP_PY_MODEL_FIELD(head_dim_qk, AP_PY_INT32),
    AP_PY_MODEL_FIELD(head_dim_v, AP_PY_INT32),
    AP_PY_MODEL_FIELD(kv_lora_rank, AP_PY_INT32),
    AP_PY_MODEL_FIELD(qk_rope_head_dim, AP_PY_INT32),
    AP_PY_MODEL_FIELD(qk_nope_head_dim, AP_PY_INT32),
    AP_PY_MODEL_FIELD(v_head_dim, AP_PY_INT32),
    AP_PY_MODEL_FIELD(page_size, AP_PY_INT32),
    AP_PY_MODEL_FIELD(num_layers, AP_PY_INT32),
    AP_PY_MODEL_FIELD(causal, AP_PY_BOOL),
    AP_PY_MODEL_FIELD(embedding, AP_PY_BOOL),
    AP_PY_MODEL_FIELD(max_batch, AP_PY_INT32),
    AP_PY_MODEL_FIELD(max_tokens, AP_PY_INT32),
    AP_PY_MODEL_FIELD(max_kv_len, AP_PY_INT64),
};
#define AP_PY_COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int ap_py_set_field(void *base, const ap_py_field *field, PyObject *value) {
    char what[64];
    snprintf(what, sizeof what, "model['%s']", field->key);
    int64_t number = 0;
    if (field->kind == AP_PY_BOOL) {
        int truth = PyObject_IsTrue(value);
        if (truth < 0) return -1;
        number = truth;
    } else if (ap_py_int_from(value, what, field->kind == AP_PY_INT64, &number) < 0) {
        return -1;
    }
    char *slot = (char *)base + field->offset;
    if (field->kind == AP_PY_INT64)
        *(int64_t *)slot = number;
    else
        *(int32_t *)slot = (int32_t)number;
    return 0;
}

/* One key of the model mapping. */
static int ap_py_model_key(const char *key, PyObject *value, ap_model *out,
                           ap_py_strings *strings) {
    if (strcmp(key, "name") == 0) {
        if (value == Py_None) return 0;
        out->name = ap_py_strings_keep(strings, value, "model['name']");
        return out->name != NULL ? 0 : -1;
    }
    if (strcmp(key, "kind") == 0) {
        const char *kind = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, NULL) : NULL;
        if (kind != NULL && strcmp(kind, "mha") == 0) {
            out->kind = AP_ATTN_MHA;
        } else if (kind != NULL && strcmp(kind, "mla") == 0) {
            out->kind = AP_ATTN_MLA;
        } else {
            PyErr_Clear();
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "model['kind'] must be 'mha' or 'mla'");
            return -1;
        }
        return 0;
    }
    if (strcmp(key, "dtype") == 0) return ap_py_dtype_from(value, "model['dtype']", &out->dtype);
    if (strcmp(key, "kv_dtype") == 0)
        return ap_py_dtype_from(value, "model['kv_dtype']", &out->kv_dtype);
    for (size_t i = 0; i < AP_PY_COUNT(ap_py_model_fields); i++)
        if (strcmp(key, ap_py_model_fields[i].key) == 0)
            return ap_py_set_field(out, &ap_py_model_fields[i], value);
    ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "model has an unknown key '%s'", key);
    return -1;
}

int ap_py_model_from(PyObject *mapping, ap_model *out, ap_py_strings *strings) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->kind = AP_ATTN_MHA;
    out->causal = 1;
    if (!PyDict_Check(mapping)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "model must be a dict (see attnplug.Model)");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(mapping, &position, &key, &value)) {
        const char *text = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;
        if (text == NULL) {
            PyErr_Clear();
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "model keys must be str");
            return -1;
        }
        if (ap_py_model_key(text, value, out, strings) < 0) return -1;
    }
    return 0;
}

/* A tri-state option: None (unset), or a bool. */
static int ap_py_tristate(PyObject *value, int32_t *out) {
    if (value == Py_None) {
        *out = AP_OPTION_UNSET;
        return 0;
    }
    int truth = PyObject_IsTrue(value);
    if (truth < 0) return -1;
    *out = truth;
    return 0;
}

/* options['extra']: {"backend.key": "value"} into an array the caller frees. */
static int ap_py_extra_from(PyObject *mapping, ap_options *out, ap_option_kv **extra,
                            ap_py_strings *strings) {
    if (mapping == Py_None) return 0;
    if (!PyDict_Check(mapping)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "options['extra'] must be a dict of str");
        return -1;
    }
    Py_ssize_t count = PyDict_Size(mapping);
    if (count == 0) return 0;
    *extra = calloc((size_t)count, sizeof **extra);
    if (*extra == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t position = 0;
    size_t used = 0;
    while (PyDict_Next(mapping, &position, &key, &value)) {
        const char *k = ap_py_strings_keep(strings, key, "options['extra'] keys");
        const char *v =
            k != NULL ? ap_py_strings_keep(strings, value, "options['extra'] values") : NULL;
        if (v == NULL) return -1;
        (*extra)[used].key = k;
        (*extra)[used].value = v;
        used++;
    }
    out->extra = *extra;
    out->num_extra = used;
    return 0;
}

int ap_py_options_from(PyObject *mapping, ap_options *out, ap_option_kv **extra,
                       ap_py_strings *strings) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    out->prefix_cache = out->chunked_prefill = out->cuda_graphs = AP_OPTION_UNSET;
    *extra = NULL;
    if (mapping == Py_None) return 0;
    if (!PyDict_Check(mapping)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "options must be a dict or None");
        return -1;
    }
    PyObject *key, *value;
    Py_ssize_t position = 0;
    while (PyDict_Next(mapping, &position, &key, &value)) {
        const char *text = PyUnicode_Check(key) ? PyUnicode_AsUTF8AndSize(key, NULL) : NULL;
        int64_t number = 0;
        int status = 0;
        if (text == NULL) {
            PyErr_Clear();
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "options keys must be str");
            return -1;
        } else if (strcmp(text, "page_size") == 0) {
            status =
                value == Py_None ? 0 : ap_py_int_from(value, "options['page_size']", 0, &number);
            out->page_size = (int32_t)number;
        } else if (strcmp(text, "kv_dtype") == 0) {
            status = value == Py_None
                         ? 0
                         : ap_py_dtype_from(value, "options['kv_dtype']", &out->kv_dtype);
        } else if (strcmp(text, "prefix_cache") == 0) {
            status = ap_py_tristate(value, &out->prefix_cache);
        } else if (strcmp(text, "chunked_prefill") == 0) {
            status = ap_py_tristate(value, &out->chunked_prefill);
        } else if (strcmp(text, "cuda_graphs") == 0) {
            status = ap_py_tristate(value, &out->cuda_graphs);
        } else if (strcmp(text, "extra") == 0) {
            status = ap_py_extra_from(value, out, extra, strings);
        } else {
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "options has an unknown key '%s'", text);
            return -1;
        }
        if (status < 0) return -1;
    }
    return 0;
}

int ap_py_device_from(PyObject *obj, ap_device *out) {
    memset(out, 0, sizeof *out);
    out->struct_size = sizeof *out;
    if (PyUnicode_Check(obj)) {
        const char *text = PyUnicode_AsUTF8AndSize(obj, NULL);
        if (text == NULL) return -1;
        if (strcmp(text, "cpu") != 0) {
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                            "device must be None, 'cpu' or a CUDA ordinal, not '%s'", text);
            return -1;
        }
        ap_device_cpu(out, "");
        return 0;
    }
    int64_t ordinal = 0;
    if (obj != Py_None && ap_py_int_from(obj, "device", 0, &ordinal) < 0) return -1;
    /* No usable GPU leaves `out` as the CPU with the reason: the caller may carry on there. */
    (void)ap_device_query((int32_t)ordinal, out);
    return 0;
}

/* ---- back to Python --------------------------------------------------------------------------- */

/* Names of the set bits of `mask` through `namer`, as a list. */
static PyObject *ap_py_dtype_list(uint32_t mask) {
    PyObject *list = PyList_New(0);
    for (int d = 1; list != NULL && d < AP_DTYPE_COUNT; d++) {
        if (!(mask & AP_DTYPE_BIT(d))) continue;
        PyObject *name = PyUnicode_FromString(ap_dtype_str((ap_dtype)d));
        if (name == NULL || PyList_Append(list, name) < 0) Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *ap_py_int_list(const int32_t *values, size_t count) {
    if (values == NULL || count == 0) Py_RETURN_NONE; /* any */
    PyObject *list = PyList_New((Py_ssize_t)count);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *value = PyLong_FromLong(values[i]);
        if (value == NULL)
            Py_CLEAR(list);
        else
            PyList_SetItem(list, (Py_ssize_t)i, value);
    }
    return list;
}

PyObject *ap_py_model_to_dict(const ap_model *m) {
    return Py_BuildValue(
        "{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:s,s:s,s:i,s:i,s:O,s:O,s:i,s:i,s:L}", "name",
        m->name != NULL ? m->name : "", "kind", ap_attn_kind_name(m->kind), "num_qo_heads",
        m->num_qo_heads, "num_kv_heads", m->num_kv_heads, "head_dim_qk", m->head_dim_qk,
        "head_dim_v", m->head_dim_v, "kv_lora_rank", m->kv_lora_rank, "qk_rope_head_dim",
        m->qk_rope_head_dim, "qk_nope_head_dim", m->qk_nope_head_dim, "v_head_dim", m->v_head_dim,
        "dtype", ap_dtype_str(m->dtype), "kv_dtype", ap_dtype_str(m->kv_dtype), "page_size",
        m->page_size, "num_layers", m->num_layers, "causal", m->causal ? Py_True : Py_False,
        "embedding", m->embedding ? Py_True : Py_False, "max_batch", m->max_batch, "max_tokens",
        m->max_tokens, "max_kv_len", (long long)m->max_kv_len);
}

static PyObject *ap_py_archs(const ap_caps *caps) {
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < caps->num_archs; i++) {
        const ap_arch_target *t = &caps->archs[i];
        char name[32];
        if (t->kind == AP_ARCH_PTX)
            snprintf(name, sizeof name, "compute_%d", (int)t->sm);
        else
            snprintf(name, sizeof name, "sm_%d%s", (int)t->sm,
                     t->kind == AP_ARCH_SASS_SPECIFIC ? "a" : "");
        PyObject *text = PyUnicode_FromString(name);
        if (text == NULL || PyList_Append(list, text) < 0) Py_CLEAR(list);
        Py_XDECREF(text);
    }
    return list;
}

static PyObject *ap_py_names(uint64_t mask, const char *const *names, size_t count) {
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        if (!(mask & (1ull << i))) continue;
        PyObject *text = PyUnicode_FromString(names[i]);
        if (text == NULL || PyList_Append(list, text) < 0) Py_CLEAR(list);
        Py_XDECREF(text);
    }
    return list;
}

/* The hook names the caps declare (ABI 1.1), decoded leniently: they are a plugin's bytes. */
static PyObject *ap_py_hooks(const ap_caps *caps) {
    PyObject *list = PyList_New(0);
    if (list == NULL || !AP_HAS_FIELD(caps, ap_caps, num_hooks) || caps->hooks == NULL) return list;
    for (size_t i = 0; list != NULL && i < caps->num_hooks; i++) {
        if (caps->hooks[i] == NULL) continue;
        const char *name = caps->hooks[i];
        PyObject *text = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strnlen(name, 256), "replace");
        if (text == NULL || PyList_Append(list, text) < 0) Py_CLEAR(list);
        Py_XDECREF(text);
    }
    return list;
}

PyObject *ap_py_caps_to_dict(const ap_caps *caps) {
    static const char *const devices[] = {"cpu", "cuda"};
    static const char *const kinds[] = {"mha", "mla"};
    static const char *const phases[] = {"extend", "decode"};
    static const char *const features[] = {
        "lse",   "embedding_skip_kv", "sliding_window", "logit_softcap",
        "sinks", "split_kv",          "noncausal"};
    static const char *const graph[] = {"none", "decode_only", "all"};
    unsigned level = (unsigned)caps->cuda_graph;
    return Py_BuildValue(
        "{s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:N,s:s,s:N,s:O,s:N}", "device_kinds",
        ap_py_names(caps->device_kinds, devices, 2), "archs", ap_py_archs(caps), "attn_kinds",
        ap_py_names(caps->attn_kinds, kinds, 2), "q_dtypes", ap_py_dtype_list(caps->q_dtypes),
        "kv_dtypes", ap_py_dtype_list(caps->kv_dtypes), "page_sizes",
        ap_py_int_list(caps->page_sizes, caps->num_page_sizes), "head_dims",
        ap_py_int_list(caps->head_dims, caps->num_head_dims), "phases",
        ap_py_names(caps->phases, phases, 2), "cuda_graph", level < 3 ? graph[level] : "unknown",
        "features", ap_py_names(caps->features, features, 7), "needs_host_mirrors",
        caps->needs_host_mirrors ? Py_True : Py_False, "hooks", ap_py_hooks(caps));
}

PyObject *ap_py_device_to_dict(const ap_device *d) {
    return Py_BuildValue("{s:i,s:s,s:i,s:i,s:i,s:i,s:L,s:s}", "ordinal", d->ordinal, "name",
                         d->name, "cc_major", d->cc_major, "cc_minor", d->cc_minor, "sm_count",
                         d->sm_count, "driver_version", d->driver_version, "total_memory",
                         (long long)d->total_memory, "unusable_reason", d->unusable_reason);
}

/* '\n'-separated reasons as a list of lines. */
static PyObject *ap_py_lines(const char *text) {
    PyObject *list = PyList_New(0);
    while (list != NULL && text != NULL && *text != '\0') {
        const char *end = strchr(text, '\n');
        size_t length = end != NULL ? (size_t)(end - text) : strlen(text);
        PyObject *line = PyUnicode_FromStringAndSize(text, (Py_ssize_t)length);
        if (line == NULL || PyList_Append(list, line) < 0) Py_CLEAR(list);
        Py_XDECREF(line);
        text = end != NULL ? end + 1 : text + length;
    }
    return list;
}

PyObject *ap_py_verdict_to_dict(const ap_verdict *v) {
    return Py_BuildValue(
        "{s:s,s:O,s:s,s:i,s:N,s:i}", "backend", v->backend != NULL ? v->backend : "", "usable",
        v->status == AP_OK ? Py_True : Py_False, "status", ap_status_name(v->status), "code",
        (int)v->status, "reasons", ap_py_lines(v->reasons), "arch_index", v->arch_index);
}

static PyObject *ap_py_tristate_to(int32_t value) {
    if (value == AP_OPTION_UNSET) Py_RETURN_NONE;
    return PyBool_FromLong(value);
}

PyObject *ap_py_options_to_dict(const ap_options *o) {
    PyObject *extra = PyDict_New();
    for (size_t i = 0; extra != NULL && i < o->num_extra; i++) {
        PyObject *value = PyUnicode_FromString(o->extra[i].value);
        if (value == NULL || PyDict_SetItemString(extra, o->extra[i].key, value) < 0)
            Py_CLEAR(extra);
        Py_XDECREF(value);
    }
    if (extra == NULL) return NULL;
    return Py_BuildValue("{s:i,s:s,s:N,s:N,s:N,s:N}", "page_size", o->page_size, "kv_dtype",
                         ap_dtype_str(o->kv_dtype), "prefix_cache",
                         ap_py_tristate_to(o->prefix_cache), "chunked_prefill",
                         ap_py_tristate_to(o->chunked_prefill), "cuda_graphs",
                         ap_py_tristate_to(o->cuda_graphs), "extra", extra);
}
