/* dlpack_import.c: take tensors from torch, CuPy, JAX or numpy through DLPack, with no copy.
 *
 * The consumer side of the Python DLPack protocol: ask the object for __dlpack_device__, then for
 * a capsule through __dlpack__ (versioned "dltensor_versioned" where the producer speaks DLPack 1,
 * else the legacy "dltensor"), rename the capsule "used_..." so its destructor leaves the tensor
 * to us, and call the managed tensor's deleter once the call is over. The deleter is what keeps
 * the producer's memory alive in between, so the producer object itself need not be held. */
#include "binding.h"

/* DLPack 1.x's versioned managed tensor. The system header may be DLPack 0.6, which lacks it;
 * the layout is the standard's and starts with the version, so a 1.x capsule reads the same. */
typedef struct ap_py_dlpack_version {
    uint32_t major;
    uint32_t minor;
} ap_py_dlpack_version;

typedef struct ap_py_managed_versioned {
    ap_py_dlpack_version version;
    void *manager_ctx;
    void (*deleter)(struct ap_py_managed_versioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} ap_py_managed_versioned;

#define AP_PY_DLPACK_FLAG_READ_ONLY (1ull << 0)

static PyObject *ap_py_kwargs_cpu;   /* {"max_version": (1, 1)} */
static PyObject *ap_py_legacy_types; /* types whose __dlpack__ refused max_version: a set */
static PyObject *ap_py_str_dlpack;   /* "__dlpack__" */
static PyObject *ap_py_str_device;   /* "__dlpack_device__" */
static PyObject *ap_py_max_version;  /* (1, 1) */

static int ap_py_dlpack_init(void) {
    if (ap_py_kwargs_cpu != NULL) return 0;
    ap_py_str_dlpack = PyUnicode_InternFromString("__dlpack__");
    ap_py_str_device = PyUnicode_InternFromString("__dlpack_device__");
    ap_py_max_version = Py_BuildValue("(ii)", 1, 1);
    ap_py_legacy_types = PySet_New(NULL);
    ap_py_kwargs_cpu = PyDict_New();
    if (!ap_py_str_dlpack || !ap_py_str_device || !ap_py_max_version || !ap_py_legacy_types ||
        !ap_py_kwargs_cpu)
        return -1;
    return PyDict_SetItemString(ap_py_kwargs_cpu, "max_version", ap_py_max_version);
}

/* keyword arguments of __dlpack__: max_version when `versioned`, and the stream for CUDA */
static PyObject *ap_py_dlpack_kwargs(int device_type, intptr_t stream, int versioned) {
    if (device_type == kDLCPU && versioned) {
        Py_INCREF(ap_py_kwargs_cpu);
        return ap_py_kwargs_cpu;
    }
    PyObject *kwargs = PyDict_New();
    if (kwargs == NULL) return NULL;
    int failed = 0;
    if (device_type != kDLCPU) {
        /* The producer orders its pending work before `stream` (DLPack: 1 = legacy default). */
        PyObject *value = PyLong_FromSsize_t((Py_ssize_t)(stream == 0 ? 1 : stream));
        failed = value == NULL || PyDict_SetItemString(kwargs, "stream", value) < 0;
        Py_XDECREF(value);
    }
    if (!failed && versioned)
        failed = PyDict_SetItemString(kwargs, "max_version", ap_py_max_version) < 0;
    if (failed) Py_CLEAR(kwargs);
    return kwargs;
}

static PyObject *ap_py_dlpack_call(PyObject *method, int device_type, intptr_t stream,
                                   int versioned) {
    PyObject *kwargs = ap_py_dlpack_kwargs(device_type, stream, versioned);
    if (kwargs == NULL) return NULL;
    PyObject *empty = PyTuple_New(0);
    PyObject *capsule = empty != NULL ? PyObject_Call(method, empty, kwargs) : NULL;
    Py_XDECREF(empty);
    Py_DECREF(kwargs);
    return capsule;
}

/* The capsule from obj.__dlpack__(...): versioned first, unless this type refused it before.
 * Producers older than DLPack 1 (numpy < 2) take no max_version: they are asked the legacy
 * way, and their type is remembered so the next call asks so at once. */
static PyObject *ap_py_dlpack_capsule(PyObject *obj, int device_type, intptr_t stream) {
    PyObject *method = PyObject_GetAttr(obj, ap_py_str_dlpack);
    if (method == NULL) return NULL;
    PyObject *type = (PyObject *)Py_TYPE(obj);
    int legacy = PySet_Contains(ap_py_legacy_types, type);
    PyObject *capsule = NULL;
    if (legacy == 0) {
        capsule = ap_py_dlpack_call(method, device_type, stream, 1);
        if (capsule == NULL && PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            capsule = ap_py_dlpack_call(method, device_type, stream, 0);
            if (capsule != NULL && PySet_Add(ap_py_legacy_types, type) < 0) Py_CLEAR(capsule);
        }
    } else if (legacy == 1) {
        capsule = ap_py_dlpack_call(method, device_type, stream, 0);
    }
    Py_DECREF(method);
    return capsule;
}

/* The short name of obj's type, for messages ("ndarray"); the limited API has no tp_name. */
static void ap_py_type_name(PyObject *obj, char *out, size_t capacity) {
    snprintf(out, capacity, "?");
    PyObject *name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    const char *text =
        name != NULL && PyUnicode_Check(name) ? PyUnicode_AsUTF8AndSize(name, NULL) : NULL;
    if (text != NULL) snprintf(out, capacity, "%s", text);
    if (text == NULL) PyErr_Clear();
    Py_XDECREF(name);
}

/* Take the managed tensor out of a capsule and mark the capsule used. */
static int ap_py_take_capsule(PyObject *capsule, const char *name, ap_py_tensor *out) {
    if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        ap_py_managed_versioned *managed = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        if (managed == NULL) return -1;
        if (managed->version.major != 1) {
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                            "%s: DLPack version %u.%u is not one this binding reads (1.x)", name,
                            managed->version.major, managed->version.minor);
            return -1;
        }
        if (PyCapsule_SetName(capsule, "used_dltensor_versioned") < 0) return -1;
        out->managed = managed;
        out->versioned = 1;
        out->read_only = (managed->flags & AP_PY_DLPACK_FLAG_READ_ONLY) != 0;
        out->tensor = &managed->dl_tensor;
    } else if (PyCapsule_IsValid(capsule, "dltensor")) {
        DLManagedTensor *managed = PyCapsule_GetPointer(capsule, "dltensor");
        if (managed == NULL) return -1;
        if (PyCapsule_SetName(capsule, "used_dltensor") < 0) return -1;
        out->managed = managed;
        out->versioned = 0;
        out->read_only = 0;
        out->tensor = &managed->dl_tensor;
    } else {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                        "%s: __dlpack__ returned no unused 'dltensor' or 'dltensor_versioned' "
                        "capsule",
                        name);
        return -1;
    }
    Py_INCREF(capsule);
    out->capsule = capsule;
    return 0;
}

int ap_py_tensor_import(PyObject *obj, const char *name, int optional, int writable,
                        int device_type, intptr_t stream, ap_py_tensor *out) {
    memset(out, 0, sizeof *out);
    if (obj == Py_None) {
        if (optional) return 0;
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s is None (required)", name);
        return -1;
    }
    if (ap_py_dlpack_init() < 0) return -1;
    PyObject *capsule = NULL;
    if (PyCapsule_CheckExact(obj)) {
        capsule = obj;
        Py_INCREF(capsule);
    } else {
        if (device_type < 0 && ap_py_device_type(&obj, 1, &device_type) < 0) return -1;
        capsule = ap_py_dlpack_capsule(obj, device_type, stream);
        if (capsule == NULL) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                char type_name[64];
                ap_py_type_name(obj, type_name, sizeof type_name);
                ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                                "%s: a %s is not a DLPack tensor (no __dlpack__)", name, type_name);
            }
            return -1;
        }
    }
    int status = ap_py_take_capsule(capsule, name, out);
    Py_DECREF(capsule);
    if (status < 0) return -1;
    if (writable && out->read_only) {
        ap_py_tensor_release(out);
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s is read-only, and the call writes it", name);
        return -1;
    }
    return 0;
}

void ap_py_tensor_release(ap_py_tensor *t) {
    if (t->managed != NULL) {
        if (t->versioned) {
            ap_py_managed_versioned *managed = t->managed;
            if (managed->deleter != NULL) managed->deleter(managed);
        } else {
            DLManagedTensor *managed = t->managed;
            if (managed->deleter != NULL) managed->deleter(managed);
        }
    }
    Py_XDECREF(t->capsule);
    memset(t, 0, sizeof *t);
}

int ap_py_tensors_add(ap_py_tensors *set, PyObject *obj, const char *name, int optional,
                      int writable, int device_type, intptr_t stream, DLTensor **out) {
    if (set->count >= AP_PY_MAX_TENSORS) {
        ap_py_raise_msg(AP_ERR_INTERNAL, "more than %d tensors in one call", AP_PY_MAX_TENSORS);
        return -1;
    }
    ap_py_tensor *t = &set->items[set->count];
    if (ap_py_tensor_import(obj, name, optional, writable, device_type, stream, t) < 0) return -1;
    set->count++;
    *out = t->tensor;
    return 0;
}

void ap_py_tensors_release(ap_py_tensors *set) {
    for (int i = set->count - 1; i >= 0; i--) ap_py_tensor_release(&set->items[i]);
    set->count = 0;
}

int ap_py_device_type(PyObject *const *objs, int count, int *device_type) {
    if (ap_py_dlpack_init() < 0) return -1;
    *device_type = kDLCPU;
    for (int i = 0; i < count; i++) {
        if (objs[i] == Py_None || PyCapsule_CheckExact(objs[i])) continue;
        PyObject *answer = PyObject_CallMethodObjArgs(objs[i], ap_py_str_device, NULL);
        if (answer == NULL) {
            if (PyErr_ExceptionMatches(PyExc_AttributeError)) {
                PyErr_Clear();
                char type_name[64];
                ap_py_type_name(objs[i], type_name, sizeof type_name);
                ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                                "a %s is not a DLPack tensor (no __dlpack_device__)", type_name);
            }
            return -1;
        }
        int type = -1, id = 0;
        int parsed = PyArg_ParseTuple(answer, "ii", &type, &id);
        Py_DECREF(answer);
        if (!parsed) return -1;
        if (type != kDLCPU) {
            *device_type = type;
            return 0;
        }
    }
    return 0;
}

/* torch.cuda.current_stream, looked up once torch is loaded; NULL until then. */
static PyObject *ap_py_torch_current_stream;

int ap_py_stream(PyObject *stream_obj, int device_type, intptr_t *out) {
    *out = 0;
    if (stream_obj != Py_None) {
        Py_ssize_t value = PyLong_AsSsize_t(stream_obj);
        if (value == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                            "stream must be an int (a cudaStream_t's address) or None");
            return -1;
        }
        *out = (intptr_t)value;
        return 0;
    }
    if (device_type != kDLCUDA && device_type != kDLCUDAManaged) return 0;
    if (ap_py_torch_current_stream == NULL) {
        PyObject *modules = PyImport_GetModuleDict(); /* borrowed */
        PyObject *torch = PyDict_GetItemString(modules, "torch");
        if (torch == NULL) return 0; /* no torch: the legacy default stream */
        PyObject *cuda = PyObject_GetAttrString(torch, "cuda");
        if (cuda == NULL) return -1;
        ap_py_torch_current_stream = PyObject_GetAttrString(cuda, "current_stream");
        Py_DECREF(cuda);
        if (ap_py_torch_current_stream == NULL) return -1;
    }
    PyObject *current = PyObject_CallObject(ap_py_torch_current_stream, NULL);
    if (current == NULL) return -1;
    PyObject *handle = PyObject_GetAttrString(current, "cuda_stream");
    Py_DECREF(current);
    if (handle == NULL) return -1;
    Py_ssize_t value = PyLong_AsSsize_t(handle);
    Py_DECREF(handle);
    if (value == -1 && PyErr_Occurred()) return -1;
    *out = (intptr_t)value;
    return 0;
}
