/* module.c: the attnplug._attnplug module: its error type, module functions and types. */
#include <stdarg.h>
#include <stdio.h>

#include "binding.h"

PyObject *ap_py_error_type;

/* Build attnplug.Error(message) with .status, .code, .message (and `attribute` when not NULL),
 * and raise it. */
static PyObject *ap_py_raise_text(ap_status status, const char *message, const char *attribute,
                                  PyObject *value) {
    PyObject *error = PyObject_CallFunction(ap_py_error_type, "s", message);
    if (error == NULL) return NULL;
    PyObject *name = PyUnicode_FromString(ap_status_name(status));
    PyObject *code = PyLong_FromLong((long)status);
    PyObject *text = PyUnicode_FromString(message);
    if (name != NULL && code != NULL && text != NULL &&
        PyObject_SetAttrString(error, "status", name) == 0 &&
        PyObject_SetAttrString(error, "code", code) == 0 &&
        PyObject_SetAttrString(error, "message", text) == 0 &&
        (attribute == NULL || value == NULL ||
         PyObject_SetAttrString(error, attribute, value) == 0))
        PyErr_SetObject(ap_py_error_type, error);
    Py_XDECREF(name);
    Py_XDECREF(code);
    Py_XDECREF(text);
    Py_DECREF(error);
    return NULL;
}

PyObject *ap_py_raise_with(ap_status status, const char *attribute, PyObject *value) {
    const char *message = ap_last_error();
    if (message == NULL || message[0] == '\0') message = ap_status_name(status);
    return ap_py_raise_text(status, message, attribute, value);
}

PyObject *ap_py_raise(ap_status status) {
    return ap_py_raise_with(status, NULL, NULL);
}

PyObject *ap_py_raise_msg(ap_status status, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    if (n < 0) message[0] = '\0';
    return ap_py_raise_text(status, message, NULL, NULL);
}

void ap_py_object_free(PyObject *self) {
    freefunc tp_free = (freefunc)PyType_GetSlot(Py_TYPE(self), Py_tp_free);
    PyObject *type = (PyObject *)Py_TYPE(self);
    tp_free(self);
    Py_DECREF(type);
}

int ap_py_add_type(PyObject *module, PyType_Spec *spec, PyObject **out) {
    PyObject *type = PyType_FromSpec(spec);
    if (type == NULL) return -1;
    const char *short_name = strrchr(spec->name, '.');
    short_name = short_name != NULL ? short_name + 1 : spec->name;
    Py_INCREF(type);
    if (PyModule_AddObject(module, short_name, type) < 0) {
        Py_DECREF(type);
        Py_DECREF(type);
        return -1;
    }
    *out = type;
    return 0;
}

/* ---- module functions ------------------------------------------------------------------------ */

static PyObject *ap_py_core_abi_version(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    uint32_t major = 0, minor = 0;
    ap_core_abi_version(&major, &minor);
    return Py_BuildValue("(II)", (unsigned)major, (unsigned)minor);
}

static PyObject *ap_py_status_name(PyObject *self, PyObject *arg) {
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred()) return NULL;
    return PyUnicode_FromString(ap_status_name((ap_status)code));
}

static PyObject *ap_py_device(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *which = Py_None;
    if (!PyArg_ParseTuple(args, "|O:device", &which)) return NULL;
    ap_device device;
    if (ap_py_device_from(which, &device) < 0) return NULL;
    return ap_py_device_to_dict(&device);
}

static PyObject *ap_py_last_error(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    return PyUnicode_FromString(ap_last_error());
}

static PyMethodDef ap_py_functions[] = {
    {"core_abi_version", ap_py_core_abi_version, METH_NOARGS,
     "core_abi_version() -> (major, minor)\n\nThe plugin ABI version the core offers."},
    {"status_name", ap_py_status_name, METH_O,
     "status_name(code) -> str\n\nThe name of an ap_status code, e.g. 'AP_ERR_UNSUPPORTED'."},
    {"device", ap_py_device, METH_VARARGS,
     "device(which=None) -> dict\n\nThe device as the core sees it: None for CUDA device 0, an int "
     "ordinal, or 'cpu'. Without a usable GPU it is the CPU (ordinal -1) with "
     "'unusable_reason' saying why."},
    {"last_error", ap_py_last_error, METH_NOARGS,
     "last_error() -> str\n\nThe core's last error message on this thread."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef ap_py_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "attnplug._attnplug",
    .m_doc = "attnplug's host API (core/include/attnplug.h) for Python; use the attnplug package.",
    .m_size = -1,
    .m_methods = ap_py_functions,
};

static int ap_py_add_constants(PyObject *module) {
    static const struct {
        const char *name;
        long value;
    } constants[] = {
        {"OK", AP_OK},
        {"ERR_INVALID_ARGUMENT", AP_ERR_INVALID_ARGUMENT},
        {"ERR_SHAPE_MISMATCH", AP_ERR_SHAPE_MISMATCH},
        {"ERR_UNSUPPORTED", AP_ERR_UNSUPPORTED},
        {"ERR_ABI_MISMATCH", AP_ERR_ABI_MISMATCH},
        {"ERR_LOAD", AP_ERR_LOAD},
        {"ERR_MISSING_SYMBOL", AP_ERR_MISSING_SYMBOL},
        {"ERR_NOT_FOUND", AP_ERR_NOT_FOUND},
        {"ERR_OUT_OF_MEMORY", AP_ERR_OUT_OF_MEMORY},
        {"ERR_CONFIG", AP_ERR_CONFIG},
        {"ERR_NO_DEVICE", AP_ERR_NO_DEVICE},
        {"ERR_CUDA", AP_ERR_CUDA},
        {"ERR_REFUSED", AP_ERR_REFUSED},
        {"ERR_DUPLICATE", AP_ERR_DUPLICATE},
        {"ERR_INTERNAL", AP_ERR_INTERNAL},
        {"ABI_VERSION_MAJOR", AP_ABI_VERSION_MAJOR},
        {"ABI_VERSION_MINOR", AP_ABI_VERSION_MINOR},
    };
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(module, constants[i].name, constants[i].value) < 0) return -1;
    static const struct {
        const char *name;
        const char *value;
    } hooks[] = {
        {"HOOK_APPEND_KV_V1", AP_HOOK_APPEND_KV_V1},
        {"HOOK_PACK_PREFIX_CHUNK_KV_V1", AP_HOOK_PACK_PREFIX_CHUNK_KV_V1},
        {"HOOK_MERGE_STATE_V1", AP_HOOK_MERGE_STATE_V1},
        {"HOOK_CUDA_GRAPH_V1", AP_HOOK_CUDA_GRAPH_V1},
    };
    for (size_t i = 0; i < sizeof hooks / sizeof hooks[0]; i++)
        if (PyModule_AddStringConstant(module, hooks[i].name, hooks[i].value) < 0) return -1;
    return 0;
}

PyMODINIT_FUNC PyInit__attnplug(void);
PyMODINIT_FUNC PyInit__attnplug(void) {
    PyObject *module = PyModule_Create(&ap_py_module);
    if (module == NULL) return NULL;
    ap_py_error_type = PyErr_NewExceptionWithDoc(
        "attnplug.Error",
        "A failed attnplug call. .status is the ap_status name ('AP_ERR_SHAPE_MISMATCH'), .code "
        "its number, .message the core's (or the binding's) one-line explanation.",
        PyExc_RuntimeError, NULL);
    if (ap_py_error_type == NULL) goto fail;
    Py_INCREF(ap_py_error_type);
    if (PyModule_AddObject(module, "Error", ap_py_error_type) < 0) {
        Py_DECREF(ap_py_error_type);
        goto fail;
    }
    if (ap_py_add_constants(module) < 0 || ap_py_registry_init_type(module) < 0 ||
        ap_py_config_init_type(module) < 0 || ap_py_instance_init_type(module) < 0 ||
        ap_py_layer_init_type(module) < 0)
        goto fail;
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}
