/* binding.h: what the files of the attnplug CPython extension (stable ABI) share. */
#ifndef ATTNPLUG_PY_BINDING_H
#define ATTNPLUG_PY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "attnplug.h"

/* ---- errors ------------------------------------------------------------------------------------
 * attnplug.Error carries .status (the ap_status name), .code (its number) and .message (the core's
 * last error, or the binding's own words). Every refusal of the binding raises it too, with the
 * status the core would have given (AP_ERR_SHAPE_MISMATCH for a wrong shape or dtype, ...). */
extern PyObject *ap_py_error_type;

/* Raise attnplug.Error for a failed core call: the status and ap_last_error(). Returns NULL. */
PyObject *ap_py_raise(ap_status status);

/* ap_py_raise with one more attribute on the error (`value` may be NULL: none). */
PyObject *ap_py_raise_with(ap_status status, const char *attribute, PyObject *value);

/* Raise attnplug.Error with the binding's own message. Returns NULL. */
PyObject *ap_py_raise_msg(ap_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* ---- tensors through DLPack --------------------------------------------------------------------
 * One imported tensor: the producer's managed tensor (legacy DLManagedTensor or versioned), whose
 * deleter keeps the producer's memory alive until ap_py_tensor_release. `tensor` points into it. */
typedef struct ap_py_tensor {
    DLTensor *tensor;  /* NULL when the argument was None */
    void *managed;     /* DLManagedTensor * or the versioned one */
    int versioned;     /* which deleter signature `managed` has */
    int read_only;     /* the producer marked it read-only (versioned flag) */
    PyObject *capsule; /* renamed "used_dltensor*" once taken, owned here */
} ap_py_tensor;

/* Import `obj` through its __dlpack__ (versioned capsule when the producer offers one, else the
 * legacy one; a capsule object is taken directly). `device_type` is the call's (from
 * ap_py_device_type; -1: ask this object): CUDA tensors are made ready on `stream` (the producer
 * orders its work before it, as the DLPack protocol says). `name` names the argument in messages.
 * None gives an empty ap_py_tensor when `optional`. Returns 0, or -1 with an error set. */
int ap_py_tensor_import(PyObject *obj, const char *name, int optional, int writable,
                        int device_type, intptr_t stream, ap_py_tensor *out);

/* Give the tensor back to its producer (calls the deleter); safe on an empty one. */
void ap_py_tensor_release(ap_py_tensor *t);

/* Up to AP_PY_MAX_TENSORS tensors of one call, released together. */
#define AP_PY_MAX_TENSORS 12
typedef struct ap_py_tensors {
    ap_py_tensor items[AP_PY_MAX_TENSORS];
    int count;
} ap_py_tensors;

/* Import one more into the set: the DLTensor (NULL for an optional None) through *out. */
int ap_py_tensors_add(ap_py_tensors *set, PyObject *obj, const char *name, int optional,
                      int writable, int device_type, intptr_t stream, DLTensor **out);
void ap_py_tensors_release(ap_py_tensors *set);

/* The device type all the non-None objects report through __dlpack_device__ (kDLCPU when none
 * does), to pick the stream before importing; -1 with an error set when one cannot say. */
int ap_py_device_type(PyObject *const *objs, int count, int *device_type);

/* The stream of a call: an explicit int, else (None) the caller's current stream: torch's
 * current CUDA stream when torch is loaded and a tensor is on CUDA, else the legacy default
 * stream (0). Returns 0, or -1 with an error set. */
int ap_py_stream(PyObject *stream_obj, int device_type, intptr_t *out);

/* ---- conversions -------------------------------------------------------------------------------- */

/* Strings held for a C struct that keeps pointers to them (model name, option extras). */
typedef struct ap_py_strings {
    char **items;
    size_t count;
} ap_py_strings;
void ap_py_strings_free(ap_py_strings *strings);

/* A mapping {"name": ..., "num_qo_heads": ...} into an ap_model; strings copied into `strings`. */
int ap_py_model_from(PyObject *mapping, ap_model *out, ap_py_strings *strings);
/* A mapping {"page_size": ..., "extra": {"backend.key": "value"}} (or None) into ap_options. */
int ap_py_options_from(PyObject *mapping, ap_options *out, ap_option_kv **extra,
                       ap_py_strings *strings);
/* None -> the device 0 as the CUDA driver sees it (the CPU with its reason when none);
 * "cpu" -> the CPU; an int -> that CUDA ordinal (the CPU with its reason when unusable). */
int ap_py_device_from(PyObject *obj, ap_device *out);

PyObject *ap_py_model_to_dict(const ap_model *model);
PyObject *ap_py_caps_to_dict(const ap_caps *caps);
PyObject *ap_py_device_to_dict(const ap_device *device);
PyObject *ap_py_verdict_to_dict(const ap_verdict *verdict);
PyObject *ap_py_options_to_dict(const ap_options *options);

/* ---- types -------------------------------------------------------------------------------------- */

extern PyObject *ap_py_registry_type;
extern PyObject *ap_py_config_type;
extern PyObject *ap_py_instance_type;
extern PyObject *ap_py_layer_type;

typedef struct ap_py_registry {
    PyObject_HEAD ap_registry *registry;
    Py_ssize_t live_instances; /* Instances keep the registry alive; counted for close() */
} ap_py_registry;

typedef struct ap_py_config {
    PyObject_HEAD ap_config *config;
} ap_py_config;

typedef struct ap_py_layer {
    PyObject_HEAD ap_layer layer;
    ap_kv_cache kv;
    ap_py_tensors pages; /* k, v and the nvfp4 block scales, held while the layer lives */
} ap_py_layer;

/* An opened backend instance (instance.c; its hook methods are in hooks.c). */
typedef struct ap_py_instance {
    PyObject_HEAD ap_instance *instance;
    PyObject *registry;  /* the Registry: outlives the instance */
    PyObject *keepalive; /* the Config whose rule options the backend got, or NULL */
    ap_py_strings strings;
    ap_py_tensors batch; /* the planned batch's arrays: a backend may read them until the next */
    int on_gpu;          /* the backend serves a CUDA device (its tensors are kDLCUDA) */
} ap_py_instance;

/* The instance of an Instance, or NULL with an error when it was closed. */
ap_instance *ap_py_live(PyObject *obj);

/* 0 when the layer's KV cache is on q's device; -1 with an error set otherwise. */
int ap_py_layer_matches(const ap_py_layer *layer, const DLTensor *q);

/* The hook methods (hooks.c), for the Instance's method table. */
PyObject *ap_py_instance_append_kv(PyObject *obj, PyObject *args, PyObject *kwargs);
PyObject *ap_py_instance_pack_prefix_chunk_kv(PyObject *obj, PyObject *args, PyObject *kwargs);
PyObject *ap_py_instance_merge_state(PyObject *obj, PyObject *args, PyObject *kwargs);
PyObject *ap_py_instance_cuda_graph_prepare(PyObject *obj, PyObject *args, PyObject *kwargs);
PyObject *ap_py_instance_has_hook(PyObject *obj, PyObject *args);
PyObject *ap_py_instance_hook_address(PyObject *obj, PyObject *args);

int ap_py_registry_init_type(PyObject *module);
int ap_py_config_init_type(PyObject *module);
int ap_py_instance_init_type(PyObject *module);
int ap_py_layer_init_type(PyObject *module);

/* Wrap an opened instance (Registry.open and open_config share it): takes `instance` and the
 * option strings its backend may point into; `keepalive` (the Config whose rule options it was
 * created with, or NULL) lives as long as the instance. */
PyObject *ap_py_instance_wrap(ap_py_registry *registry, ap_instance *instance,
                              const ap_device *device, ap_py_strings *strings, PyObject *keepalive);

/* The last step of every type's dealloc: free the object and drop its heap type's reference. */
void ap_py_object_free(PyObject *self);

/* Add a heap type made from `spec` to the module under its short name; stores it in *out. */
int ap_py_add_type(PyObject *module, PyType_Spec *spec, PyObject **out);

#endif /* ATTNPLUG_PY_BINDING_H */
