/* registry.c: the Registry type (discovery, inspection, selection, opening) and the Config type. */
#include <stdlib.h>

#include "binding.h"

PyObject *ap_py_registry_type;
PyObject *ap_py_config_type;

#define AP_PY_REGISTRY(self) (((ap_py_registry *)(self))->registry)

static int ap_py_registry_live(PyObject *self) {
    if (AP_PY_REGISTRY(self) != NULL) return 0;
    ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the registry is closed");
    return -1;
}

static int ap_py_registry_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"search_dirs", "no_default_paths", NULL};
    PyObject *dirs = Py_None;
    int no_defaults = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|Op:Registry", keywords, &dirs, &no_defaults))
        return -1;
    if (AP_PY_REGISTRY(self) != NULL) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "Registry.__init__ called twice");
        return -1;
    }
    PyObject *list = dirs == Py_None ? PyList_New(0) : PySequence_List(dirs);
    if (list == NULL) return -1;
    Py_ssize_t count = PyList_Size(list);
    const char **paths = calloc((size_t)count + 1, sizeof *paths);
    int result = -1;
    if (paths == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GetItem(list, i); /* borrowed; str or os.PathLike */
        PyObject *path = PyOS_FSPath(item);
        if (path == NULL) goto out;
        /* The path object stays alive in `list` through the replacement below. */
        if (PyList_SetItem(list, i, path) < 0) goto out;
        paths[i] = PyUnicode_Check(path) ? PyUnicode_AsUTF8AndSize(path, NULL) : NULL;
        if (paths[i] == NULL) {
            if (!PyErr_Occurred())
                ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "search_dirs must hold str paths");
            goto out;
        }
    }
    ap_registry_options options = {
        .struct_size = sizeof options,
        .search_dirs = paths,
        .num_search_dirs = (size_t)count,
        .flags = no_defaults ? AP_REGISTRY_NO_DEFAULT_PATHS : 0,
    };
    ap_status status = ap_registry_create(&options, &((ap_py_registry *)self)->registry);
    if (status != AP_OK) {
        ap_py_raise(status);
        goto out;
    }
    result = 0;
out:
    free(paths);
    Py_DECREF(list);
    return result;
}

static void ap_py_registry_dealloc(PyObject *self) {
    /* Instances hold a reference, so none lives here; nothing is left to refuse the destroy. */
    if (AP_PY_REGISTRY(self) != NULL) (void)ap_registry_destroy(AP_PY_REGISTRY(self));
    ap_py_object_free(self);
}

static PyObject *ap_py_registry_close(PyObject *self, PyObject *unused) {
    (void)unused;
    ap_py_registry *r = (ap_py_registry *)self;
    if (r->registry == NULL) Py_RETURN_NONE;
    if (r->live_instances > 0)
        return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                               "the registry has %zd open instance(s): close them first",
                               r->live_instances);
    ap_status status = ap_registry_destroy(r->registry);
    r->registry = NULL;
    if (status != AP_OK) return ap_py_raise(status);
    Py_RETURN_NONE;
}

static PyObject *ap_py_registry_path_call(PyObject *self, PyObject *arg,
                                          ap_status (*call)(ap_registry *, const char *)) {
    if (ap_py_registry_live(self) < 0) return NULL;
    PyObject *path = PyOS_FSPath(arg);
    if (path == NULL) return NULL;
    const char *text = PyUnicode_Check(path) ? PyUnicode_AsUTF8AndSize(path, NULL) : NULL;
    ap_status status = text != NULL ? call(AP_PY_REGISTRY(self), text) : AP_OK;
    Py_DECREF(path);
    if (text == NULL) {
        if (!PyErr_Occurred()) ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the path must be a str");
        return NULL;
    }
    if (status != AP_OK) return ap_py_raise(status);
    Py_RETURN_NONE;
}

static PyObject *ap_py_registry_add_dir(PyObject *self, PyObject *arg) {
    return ap_py_registry_path_call(self, arg, ap_registry_add_dir);
}

static PyObject *ap_py_registry_load_file(PyObject *self, PyObject *arg) {
    return ap_py_registry_path_call(self, arg, ap_registry_load_file);
}

static PyObject *ap_py_registry_scan(PyObject *self, PyObject *unused) {
    (void)unused;
    if (ap_py_registry_live(self) < 0) return NULL;
    ap_status status = ap_registry_scan(AP_PY_REGISTRY(self));
    if (status != AP_OK) return ap_py_raise(status);
    Py_RETURN_NONE;
}

static PyObject *ap_py_registry_files(PyObject *self, PyObject *unused) {
    (void)unused;
    if (ap_py_registry_live(self) < 0) return NULL;
    size_t count = ap_registry_file_count(AP_PY_REGISTRY(self));
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        ap_file_record record;
        if (ap_registry_file(AP_PY_REGISTRY(self), i, &record) != AP_OK) continue;
        PyObject *item = Py_BuildValue("{s:s,s:s,s:i,s:s,s:z}", "path", record.path, "status",
                                       ap_status_name(record.status), "code", (int)record.status,
                                       "message", record.message, "backend", record.backend);
        if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

static PyObject *ap_py_backend_to_dict(ap_registry *registry, const ap_descriptor *desc) {
    return Py_BuildValue("{s:s,s:s,s:s,s:z,s:N}", "name", desc->name, "version", desc->version,
                         "description", desc->description, "path",
                         ap_registry_backend_path(registry, desc->name), "caps",
                         ap_py_caps_to_dict(desc->caps));
}

static PyObject *ap_py_registry_backends(PyObject *self, PyObject *unused) {
    (void)unused;
    if (ap_py_registry_live(self) < 0) return NULL;
    ap_registry *registry = AP_PY_REGISTRY(self);
    size_t count = ap_registry_backend_count(registry);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *item = ap_py_backend_to_dict(registry, ap_registry_backend(registry, i));
        if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
        Py_XDECREF(item);
    }
    return list;
}

/* The (model, options, device) triple most calls take, parsed into one place. */
typedef struct ap_py_request {
    ap_model model;
    ap_options options;
    ap_option_kv *extra;
    ap_device device;
    ap_py_strings strings;
} ap_py_request;

static int ap_py_request_parse(ap_py_request *request, PyObject *model, PyObject *options,
                               PyObject *device) {
    memset(request, 0, sizeof *request);
    if (ap_py_model_from(model, &request->model, &request->strings) < 0 ||
        ap_py_options_from(options, &request->options, &request->extra, &request->strings) < 0 ||
        ap_py_device_from(device, &request->device) < 0)
        return -1;
    return 0;
}

static void ap_py_request_free(ap_py_request *request) {
    free(request->extra);
    ap_py_strings_free(&request->strings);
}

static PyObject *ap_py_registry_check(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"name", "model", "options", "device", NULL};
    const char *name;
    PyObject *model, *options = Py_None, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|OO:check", keywords, &name, &model, &options,
                                     &device))
        return NULL;
    if (ap_py_registry_live(self) < 0) return NULL;
    ap_py_request request;
    PyObject *result = NULL;
    if (ap_py_request_parse(&request, model, options, device) == 0) {
        ap_verdict verdict;
        (void)ap_registry_check(AP_PY_REGISTRY(self), name, &request.model, &request.options,
                                &request.device, &verdict);
        result = ap_py_verdict_to_dict(&verdict);
    }
    ap_py_request_free(&request);
    return result;
}

static PyObject *ap_py_selection_to_dict(const ap_selection *selection) {
    size_t count = ap_selection_count(selection);
    PyObject *verdicts = PyList_New(0);
    for (size_t i = 0; verdicts != NULL && i < count; i++) {
        PyObject *item = ap_py_verdict_to_dict(ap_selection_verdict(selection, i));
        if (item == NULL || PyList_Append(verdicts, item) < 0) Py_CLEAR(verdicts);
        Py_XDECREF(item);
    }
    if (verdicts == NULL) return NULL;
    return Py_BuildValue("{s:z,s:N}", "chosen", ap_selection_chosen(selection), "verdicts",
                         verdicts);
}

static PyObject *ap_py_registry_select(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"names", "model", "options", "device", "explicit_single", NULL};
    PyObject *names, *model, *options = Py_None, *device = Py_None;
    int explicit_single = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|OOp:select", keywords, &names, &model,
                                     &options, &device, &explicit_single))
        return NULL;
    if (ap_py_registry_live(self) < 0) return NULL;
    PyObject *list = PySequence_List(names);
    if (list == NULL) return NULL;
    Py_ssize_t count = PyList_Size(list);
    const char **texts = calloc((size_t)count + 1, sizeof *texts);
    PyObject *result = NULL;
    ap_py_request request;
    memset(&request, 0, sizeof request);
    if (texts == NULL) {
        PyErr_NoMemory();
        goto out;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GetItem(list, i);
        texts[i] = PyUnicode_Check(item) ? PyUnicode_AsUTF8AndSize(item, NULL) : NULL;
        if (texts[i] == NULL) {
            if (!PyErr_Occurred())
                ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "names must be a sequence of str");
            goto out;
        }
    }
    if (ap_py_request_parse(&request, model, options, device) < 0) goto out;
    ap_selection *selection = NULL;
    (void)ap_select(AP_PY_REGISTRY(self), texts, (size_t)count, explicit_single, &request.model,
                    &request.options, &request.device, &selection);
    if (selection == NULL) {
        ap_py_raise(AP_ERR_OUT_OF_MEMORY);
        goto out;
    }
    result = ap_py_selection_to_dict(selection);
    ap_selection_destroy(selection);
out:
    ap_py_request_free(&request);
    free(texts);
    Py_DECREF(list);
    return result;
}

static PyObject *ap_py_registry_open(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"name", "model", "options", "device", NULL};
    const char *name;
    PyObject *model, *options = Py_None, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "sO|OO:open", keywords, &name, &model, &options,
                                     &device))
        return NULL;
    if (ap_py_registry_live(self) < 0) return NULL;
    ap_py_request request;
    PyObject *result = NULL;
    if (ap_py_request_parse(&request, model, options, device) == 0) {
        ap_instance *instance = NULL;
        ap_status status = ap_instance_open(AP_PY_REGISTRY(self), name, &request.model,
                                            &request.options, &request.device, &instance);
        if (status != AP_OK)
            ap_py_raise(status);
        else /* the instance keeps the option strings its backend may point into */
            result = ap_py_instance_wrap((ap_py_registry *)self, instance, &request.device,
                                         &request.strings, NULL);
    }
    ap_py_request_free(&request);
    return result;
}

static PyObject *ap_py_registry_open_config(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"config", "model", "device", NULL};
    PyObject *config, *model, *device = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|O:open_config", keywords,
                                     (PyTypeObject *)ap_py_config_type, &config, &model, &device))
        return NULL;
    if (ap_py_registry_live(self) < 0) return NULL;
    ap_config *cfg = ((ap_py_config *)config)->config;
    if (cfg == NULL) return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the config is closed");
    ap_py_request request;
    PyObject *result = NULL;
    if (ap_py_request_parse(&request, model, Py_None, device) == 0) {
        ap_instance *instance = NULL;
        ap_selection *selection = NULL;
        ap_status status = ap_config_open(cfg, AP_PY_REGISTRY(self), &request.model,
                                          &request.device, &instance, &selection);
        if (status != AP_OK) {
            /* every verdict rides on the error as .selection */
            PyObject *walk = selection != NULL ? ap_py_selection_to_dict(selection) : NULL;
            if (walk != NULL || selection == NULL) ap_py_raise_with(status, "selection", walk);
            Py_XDECREF(walk);
        } else {
            PyObject *opened = ap_py_instance_wrap((ap_py_registry *)self, instance,
                                                   &request.device, &request.strings, config);
            PyObject *walk = opened != NULL ? ap_py_selection_to_dict(selection) : NULL;
            if (walk != NULL)
                result = Py_BuildValue("(NN)", opened, walk);
            else
                Py_XDECREF(opened);
        }
        if (selection != NULL) ap_selection_destroy(selection);
    }
    ap_py_request_free(&request);
    return result;
}

static PyMethodDef ap_py_registry_methods[] = {
    {"add_dir", ap_py_registry_add_dir, METH_O,
     "add_dir(path)\n\nAdd a folder to search, after the folders given at creation."},
    {"scan", ap_py_registry_scan, METH_NOARGS,
     "scan()\n\nDiscover and load plugins (the given folders, added ones, AP_PLUGIN_PATH or "
     "AP_ADD_PLUGIN_PATH, the install folder, the build tree). Unusable files are recorded."},
    {"load_file", ap_py_registry_load_file, METH_O, "load_file(path)\n\nLoad one plugin file."},
    {"files", ap_py_registry_files, METH_NOARGS,
     "files() -> list[dict]\n\nEvery plugin file seen: path, status, code, message, backend."},
    {"backends", ap_py_registry_backends, METH_NOARGS,
     "backends() -> list[dict]\n\nLoaded backends by name: name, version, description, path, "
     "caps."},
    {"check", (PyCFunction)(void (*)(void))ap_py_registry_check, METH_VARARGS | METH_KEYWORDS,
     "check(name, model, options=None, device=None) -> dict\n\nThe core's verdict on one "
     "backend: backend, usable, status, code, reasons (list), arch_index."},
    {"select", (PyCFunction)(void (*)(void))ap_py_registry_select, METH_VARARGS | METH_KEYWORDS,
     "select(names, model, options=None, device=None, explicit_single=False) -> dict\n\nWalk a "
     "preference list: {'chosen': name or None, 'verdicts': [...]}."},
    {"open", (PyCFunction)(void (*)(void))ap_py_registry_open, METH_VARARGS | METH_KEYWORDS,
     "open(name, model, options=None, device=None) -> Instance\n\nCheck then create backend "
     "`name` for the model. A refusal raises Error with every reason."},
    {"open_config", (PyCFunction)(void (*)(void))ap_py_registry_open_config,
     METH_VARARGS | METH_KEYWORDS,
     "open_config(config, model, device=None) -> (Instance, selection)\n\nMatch the model's "
     "rule and open the first backend of its list that serves. On failure the Error has "
     ".selection with every verdict."},
    {"close", ap_py_registry_close, METH_NOARGS,
     "close()\n\nFree the registry now (instances must be closed first)."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot ap_py_registry_slots[] = {
    {Py_tp_doc, "Registry(search_dirs=None, no_default_paths=False)\n\nPlugin discovery and "
                "loading; call scan() to load. See attnplug.open_registry."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, ap_py_registry_init},
    {Py_tp_dealloc, ap_py_registry_dealloc},
    {Py_tp_methods, ap_py_registry_methods},
    {0, NULL},
};

static PyType_Spec ap_py_registry_spec = {
    .name = "attnplug._attnplug.Registry",
    .basicsize = sizeof(ap_py_registry),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = ap_py_registry_slots,
};

int ap_py_registry_init_type(PyObject *module) {
    return ap_py_add_type(module, &ap_py_registry_spec, &ap_py_registry_type);
}

/* ---- Config ------------------------------------------------------------------------------------ */

static void ap_py_config_dealloc(PyObject *self) {
    ap_config_destroy(((ap_py_config *)self)->config);
    ap_py_object_free(self);
}

static PyObject *ap_py_config_new_from(PyTypeObject *type, ap_config *config) {
    allocfunc tp_alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    PyObject *self = tp_alloc(type, 0);
    if (self == NULL) {
        ap_config_destroy(config);
        return NULL;
    }
    ((ap_py_config *)self)->config = config;
    return self;
}

static PyObject *ap_py_config_load(PyObject *cls, PyObject *arg) {
    PyObject *path = PyOS_FSPath(arg);
    if (path == NULL) return NULL;
    const char *text = PyUnicode_Check(path) ? PyUnicode_AsUTF8AndSize(path, NULL) : NULL;
    ap_config *config = NULL;
    ap_status status = text != NULL ? ap_config_load(text, &config) : AP_OK;
    Py_DECREF(path);
    if (text == NULL) {
        if (!PyErr_Occurred()) ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the path must be a str");
        return NULL;
    }
    if (status != AP_OK) return ap_py_raise(status);
    return ap_py_config_new_from((PyTypeObject *)cls, config);
}

static PyObject *ap_py_config_parse(PyObject *cls, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"text", "source_name", NULL};
    const char *text, *source = "<string>";
    Py_ssize_t length;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s#|s:parse", keywords, &text, &length, &source))
        return NULL;
    ap_config *config = NULL;
    ap_status status = ap_config_parse(text, (size_t)length, source, &config);
    if (status != AP_OK) return ap_py_raise(status);
    return ap_py_config_new_from((PyTypeObject *)cls, config);
}

static PyObject *ap_py_rule_to_dict(const ap_config_rule *rule) {
    PyObject *backends = PyList_New((Py_ssize_t)rule->num_backends);
    for (size_t i = 0; backends != NULL && i < rule->num_backends; i++) {
        PyObject *name = PyUnicode_FromString(rule->backends[i]);
        if (name == NULL)
            Py_CLEAR(backends);
        else
            PyList_SetItem(backends, (Py_ssize_t)i, name);
    }
    if (backends == NULL) return NULL;
    return Py_BuildValue("{s:s,s:N,s:O,s:N,s:i}", "pattern", rule->pattern, "backends", backends,
                         "explicit_single", rule->explicit_single ? Py_True : Py_False, "options",
                         ap_py_options_to_dict(&rule->options), "line", rule->line);
}

static PyObject *ap_py_config_rules(PyObject *self, PyObject *unused) {
    (void)unused;
    ap_config *config = ((ap_py_config *)self)->config;
    size_t count = ap_config_rule_count(config);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *rule = ap_py_rule_to_dict(ap_config_rule_at(config, i));
        if (rule == NULL || PyList_Append(list, rule) < 0) Py_CLEAR(list);
        Py_XDECREF(rule);
    }
    return list;
}

static PyObject *ap_py_config_plugin_paths(PyObject *self, PyObject *unused) {
    (void)unused;
    ap_config *config = ((ap_py_config *)self)->config;
    size_t count = ap_config_plugin_path_count(config);
    PyObject *list = PyList_New(0);
    for (size_t i = 0; list != NULL && i < count; i++) {
        PyObject *path = PyUnicode_DecodeFSDefault(ap_config_plugin_path(config, i));
        if (path == NULL || PyList_Append(list, path) < 0) Py_CLEAR(list);
        Py_XDECREF(path);
    }
    return list;
}

static PyObject *ap_py_config_match(PyObject *self, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:match", &name)) return NULL;
    const ap_config_rule *rule = ap_config_match(((ap_py_config *)self)->config, name);
    if (rule == NULL) Py_RETURN_NONE;
    return ap_py_rule_to_dict(rule);
}

static PyObject *ap_py_config_version(PyObject *self, void *closure) {
    (void)closure;
    return PyLong_FromLong(ap_config_version(((ap_py_config *)self)->config));
}

static PyMethodDef ap_py_config_methods[] = {
    {"load", ap_py_config_load, METH_O | METH_CLASS,
     "Config.load(path) -> Config\n\nParse a YAML config file; errors name file:line:column."},
    {"parse", (PyCFunction)(void (*)(void))ap_py_config_parse,
     METH_VARARGS | METH_KEYWORDS | METH_CLASS,
     "Config.parse(text, source_name='<string>') -> Config\n\nParse YAML config text."},
    {"rules", ap_py_config_rules, METH_NOARGS,
     "rules() -> list[dict]\n\nThe rules in order: pattern, backends, explicit_single, options, "
     "line."},
    {"plugin_paths", ap_py_config_plugin_paths, METH_NOARGS,
     "plugin_paths() -> list[str]\n\nThe config's plugin_path folders, resolved against its "
     "file's folder."},
    {"match", ap_py_config_match, METH_VARARGS,
     "match(model_name) -> dict | None\n\nThe first rule whose glob matches the model name."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef ap_py_config_getset[] = {
    {"version", ap_py_config_version, NULL, "The config's version (1).", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *ap_py_config_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type;
    (void)args;
    (void)kwargs;
    return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                           "make a Config with Config.load(path) or Config.parse(text)");
}

static PyType_Slot ap_py_config_slots[] = {
    {Py_tp_doc, "A parsed YAML config: Config.load(path) or Config.parse(text)."},
    {Py_tp_new, ap_py_config_new},
    {Py_tp_dealloc, ap_py_config_dealloc},
    {Py_tp_methods, ap_py_config_methods},
    {Py_tp_getset, ap_py_config_getset},
    {0, NULL},
};

static PyType_Spec ap_py_config_spec = {
    .name = "attnplug._attnplug.Config",
    .basicsize = sizeof(ap_py_config),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = ap_py_config_slots,
};

int ap_py_config_init_type(PyObject *module) {
    return ap_py_add_type(module, &ap_py_config_spec, &ap_py_config_type);
}
