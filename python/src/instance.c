/* instance.c: the Instance type: kv spec, init_metadata, forward_extend/decode and the hooks.
 *
 * The per-layer calls are the hot path: positional arguments, tensors imported through DLPack
 * without a copy and given back right after the call; the core checks every shape and dtype
 * before the backend runs, and its refusal becomes attnplug.Error. The GIL is held across calls:
 * an instance serves one thread at a time (docs/ARCHITECTURE.md, Threads). The hooks are in
 * hooks.c. */
#include <stdlib.h>
#include <time.h>

#include "binding.h"

PyObject *ap_py_instance_type;

PyObject *ap_py_instance_wrap(ap_py_registry *registry, ap_instance *instance,
                              const ap_device *device, ap_py_strings *strings,
                              PyObject *keepalive) {
    PyTypeObject *type = (PyTypeObject *)ap_py_instance_type;
    allocfunc tp_alloc = (allocfunc)PyType_GetSlot(type, Py_tp_alloc);
    ap_py_instance *self = (ap_py_instance *)tp_alloc(type, 0);
    if (self == NULL) {
        ap_instance_close(instance);
        return NULL;
    }
    self->instance = instance;
    /* as the core decides where a backend's tensors live (ap_expected_device_type) */
    self->on_gpu = (ap_instance_caps(instance)->device_kinds & AP_DEVICE_KIND_CUDA) &&
                   device->ordinal >= 0 && device->unusable_reason[0] == '\0';
    Py_INCREF(registry);
    self->registry = (PyObject *)registry;
    registry->live_instances++;
    Py_XINCREF(keepalive);
    self->keepalive = keepalive;
    self->strings = *strings; /* taken: the caller's copy is emptied */
    memset(strings, 0, sizeof *strings);
    return (PyObject *)self;
}

static void ap_py_instance_free(ap_py_instance *self) {
    ap_py_tensors_release(&self->batch);
    if (self->instance != NULL) {
        ap_instance_close(self->instance);
        self->instance = NULL;
        ((ap_py_registry *)self->registry)->live_instances--;
    }
    ap_py_strings_free(&self->strings);
}

static void ap_py_instance_dealloc(PyObject *obj) {
    ap_py_instance *self = (ap_py_instance *)obj;
    ap_py_instance_free(self);
    Py_CLEAR(self->keepalive);
    Py_CLEAR(self->registry);
    ap_py_object_free(obj);
}

ap_instance *ap_py_live(PyObject *obj) {
    ap_instance *instance = ((ap_py_instance *)obj)->instance;
    if (instance == NULL) ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the instance is closed");
    return instance;
}

static PyObject *ap_py_instance_close(PyObject *self, PyObject *unused) {
    (void)unused;
    ap_py_instance_free((ap_py_instance *)self);
    Py_RETURN_NONE;
}

static PyObject *ap_py_instance_enter(PyObject *self, PyObject *unused) {
    (void)unused;
    Py_INCREF(self);
    return self;
}

static PyObject *ap_py_instance_exit(PyObject *self, PyObject *args) {
    (void)args;
    ap_py_instance_free((ap_py_instance *)self);
    Py_RETURN_FALSE;
}

static PyObject *ap_py_instance_kv_spec(PyObject *self, PyObject *unused) {
    (void)unused;
    ap_instance *instance = ap_py_live(self);
    if (instance == NULL) return NULL;
    ap_kv_spec spec;
    ap_status status = ap_instance_kv_spec(instance, &spec);
    if (status != AP_OK) return ap_py_raise(status);
    return Py_BuildValue("{s:n,s:n,s:n,s:n}", "k_bytes_per_page", (Py_ssize_t)spec.k_bytes_per_page,
                         "v_bytes_per_page", (Py_ssize_t)spec.v_bytes_per_page,
                         "scale_bytes_per_page", (Py_ssize_t)spec.scale_bytes_per_page, "alignment",
                         (Py_ssize_t)spec.alignment);
}

/* ---- init_metadata ------------------------------------------------------------------------------ */

enum {
    AP_PY_QO,
    AP_PY_PAGE_INDPTR,
    AP_PY_PAGE_INDICES,
    AP_PY_LAST_LEN,
    AP_PY_SEQ_LENS,
    AP_PY_POSITIONS,
    AP_PY_ARRAYS
};
static const char *const ap_py_array_names[AP_PY_ARRAYS] = {
    "qo_indptr", "kv_page_indptr", "kv_page_indices", "kv_last_page_len", "seq_lens", "positions"};

/* A batch array: 1-D dense int32 on `device_type`, of `length` elements unless length < 0. */
static int ap_py_check_array(const char *name, const DLTensor *t, int device_type, int64_t length) {
    if (t->ndim != 1 || t->dtype.code != kDLInt || t->dtype.bits != 32 || t->dtype.lanes != 1) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH,
                        "%s must be a 1-D int32 array (%d-D, code %d, "
                        "%d bits)",
                        name, (int)t->ndim, (int)t->dtype.code, (int)t->dtype.bits);
        return -1;
    }
    if (t->strides != NULL && t->shape[0] > 1 && t->strides[0] != 1) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s must be contiguous", name);
        return -1;
    }
    if ((int)t->device.device_type != device_type) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s is on DLPack device type %d, expected %d",
                        name, (int)t->device.device_type, device_type);
        return -1;
    }
    if (length >= 0 && t->shape[0] != length) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "%s has %lld elements, expected %lld", name,
                        (long long)t->shape[0], (long long)length);
        return -1;
    }
    return 0;
}

static const int32_t *ap_py_ints(const DLTensor *t) {
    return t == NULL ? NULL : (const int32_t *)((const char *)t->data + t->byte_offset);
}

/* The lengths every array must have, from qo_indptr and kv_page_indices, and the sizes of
 * arrays on the host; the core then checks the values. */
static int ap_py_batch_fill(DLTensor *const *dev, DLTensor *const *host, int device_type,
                            ap_batch *b) {
    if (dev[AP_PY_QO]->ndim != 1 || dev[AP_PY_QO]->shape[0] < 1 ||
        dev[AP_PY_QO]->shape[0] - 1 > INT32_MAX) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "qo_indptr must be 1-D with num_seqs + 1 >= 1 "
                                               "elements");
        return -1;
    }
    int64_t n = dev[AP_PY_QO]->shape[0] - 1;
    int64_t pages = dev[AP_PY_PAGE_INDICES] != NULL ? dev[AP_PY_PAGE_INDICES]->shape[0] : 0;
    const int64_t lengths[AP_PY_ARRAYS] = {n + 1, n + 1, -1, n, n, -1};
    for (int a = 0; a < AP_PY_ARRAYS; a++) {
        if (dev[a] != NULL &&
            ap_py_check_array(ap_py_array_names[a], dev[a], device_type, lengths[a]) < 0)
            return -1;
        if (host[a] == NULL) continue;
        /* a host mirror has its device array's length */
        if (dev[a] == NULL) {
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "host['%s'] given without %s",
                            ap_py_array_names[a], ap_py_array_names[a]);
            return -1;
        }
        if (ap_py_check_array(ap_py_array_names[a], host[a], kDLCPU, dev[a]->shape[0]) < 0)
            return -1;
    }
    if (dev[AP_PY_PAGE_INDICES] != NULL && pages > INT32_MAX) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "kv_page_indices has more than INT32_MAX pages");
        return -1;
    }
    b->num_seqs = (int32_t)n;
    b->num_pages_total = (int32_t)pages;
    b->qo_indptr = ap_py_ints(dev[AP_PY_QO]);
    b->kv_page_indptr = ap_py_ints(dev[AP_PY_PAGE_INDPTR]);
    b->kv_page_indices = ap_py_ints(dev[AP_PY_PAGE_INDICES]);
    b->kv_last_page_len = ap_py_ints(dev[AP_PY_LAST_LEN]);
    b->seq_lens = ap_py_ints(dev[AP_PY_SEQ_LENS]);
    b->positions = ap_py_ints(dev[AP_PY_POSITIONS]);
    b->qo_indptr_host = ap_py_ints(host[AP_PY_QO]);
    b->kv_page_indptr_host = ap_py_ints(host[AP_PY_PAGE_INDPTR]);
    b->kv_page_indices_host = ap_py_ints(host[AP_PY_PAGE_INDICES]);
    b->kv_last_page_len_host = ap_py_ints(host[AP_PY_LAST_LEN]);
    b->seq_lens_host = ap_py_ints(host[AP_PY_SEQ_LENS]);
    b->positions_host = ap_py_ints(host[AP_PY_POSITIONS]);
    return 0;
}

/* num_tokens, max_q_len and max_seq_len from the host mirrors, unless the caller gave them
 * (a batch without mirrors must). Positions, when given, count the tokens too. */
static int ap_py_batch_counts(ap_batch *b, DLTensor *const *dev, int64_t num_tokens,
                              int64_t max_q_len, int64_t max_seq_len) {
    const int32_t *qo = b->qo_indptr_host, *seq = b->seq_lens_host;
    if (num_tokens < 0 && qo != NULL) num_tokens = qo[b->num_seqs];
    if (num_tokens < 0 && dev[AP_PY_POSITIONS] != NULL) num_tokens = dev[AP_PY_POSITIONS]->shape[0];
    if (max_q_len < 0 && qo != NULL) {
        max_q_len = 0;
        for (int32_t i = 0; i < b->num_seqs; i++)
            if (qo[i + 1] - qo[i] > max_q_len) max_q_len = qo[i + 1] - qo[i];
    }
    if (max_seq_len < 0 && seq != NULL) {
        max_seq_len = 0;
        for (int32_t i = 0; i < b->num_seqs; i++)
            if (seq[i] > max_seq_len) max_seq_len = seq[i];
    }
    if (num_tokens < 0 || max_q_len < 0 || max_seq_len < 0) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                        "a batch without host mirrors needs num_tokens, max_q_len and "
                        "max_seq_len");
        return -1;
    }
    if (num_tokens > INT32_MAX || max_q_len > INT32_MAX || max_seq_len > INT32_MAX) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "a batch count exceeds int32");
        return -1;
    }
    if (dev[AP_PY_POSITIONS] != NULL && dev[AP_PY_POSITIONS]->shape[0] != num_tokens) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH,
                        "positions has %lld elements, expected %lld "
                        "(num_tokens)",
                        (long long)dev[AP_PY_POSITIONS]->shape[0], (long long)num_tokens);
        return -1;
    }
    b->num_tokens = (int32_t)num_tokens;
    b->max_q_len = (int32_t)max_q_len;
    b->max_seq_len = (int32_t)max_seq_len;
    return 0;
}

static int ap_py_mode_from(PyObject *mode, ap_forward_mode *out) {
    const char *text = PyUnicode_Check(mode) ? PyUnicode_AsUTF8AndSize(mode, NULL) : NULL;
    if (text != NULL && strcmp(text, "extend") == 0) {
        *out = AP_MODE_EXTEND;
        return 0;
    }
    if (text != NULL && strcmp(text, "decode") == 0) {
        *out = AP_MODE_DECODE;
        return 0;
    }
    PyErr_Clear();
    ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "mode must be 'extend' or 'decode'");
    return -1;
}

static PyObject *ap_py_instance_init_metadata(PyObject *obj, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"mode",
                               "qo_indptr",
                               "seq_lens",
                               "kv_page_indptr",
                               "kv_page_indices",
                               "kv_last_page_len",
                               "positions",
                               "host",
                               "num_tokens",
                               "max_q_len",
                               "max_seq_len",
                               "stream",
                               NULL};
    PyObject *mode_obj, *objs[AP_PY_ARRAYS] = {0}, *host_obj = Py_None, *stream_obj = Py_None;
    long long num_tokens = -1, max_q_len = -1, max_seq_len = -1;
    for (int a = 0; a < AP_PY_ARRAYS; a++) objs[a] = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|OOOO$OLLLO:init_metadata", keywords,
                                     &mode_obj, &objs[AP_PY_QO], &objs[AP_PY_SEQ_LENS],
                                     &objs[AP_PY_PAGE_INDPTR], &objs[AP_PY_PAGE_INDICES],
                                     &objs[AP_PY_LAST_LEN], &objs[AP_PY_POSITIONS], &host_obj,
                                     &num_tokens, &max_q_len, &max_seq_len, &stream_obj))
        return NULL;
    ap_py_instance *self = (ap_py_instance *)obj;
    ap_instance *instance = ap_py_live(obj);
    ap_forward_mode mode;
    if (instance == NULL || ap_py_mode_from(mode_obj, &mode) < 0) return NULL;
    if (host_obj != Py_None && !PyDict_Check(host_obj))
        return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "host must be a dict of host arrays");

    int device_type;
    intptr_t stream;
    if (ap_py_device_type(objs, AP_PY_ARRAYS, &device_type) < 0 ||
        ap_py_stream(stream_obj, device_type, &stream) < 0)
        return NULL;
    /* The previous batch's arrays go back only now: its plan is being replaced. */
    ap_py_tensors_release(&self->batch);
    DLTensor *dev[AP_PY_ARRAYS] = {0}, *host[AP_PY_ARRAYS] = {0};
    for (int a = 0; a < AP_PY_ARRAYS; a++) {
        if (ap_py_tensors_add(&self->batch, objs[a], ap_py_array_names[a],
                              a != AP_PY_QO && a != AP_PY_SEQ_LENS, 0, device_type, stream,
                              &dev[a]) < 0)
            goto fail;
        PyObject *mirror = host_obj != Py_None
                               ? PyDict_GetItemString(host_obj, ap_py_array_names[a])
                               : NULL; /* borrowed */
        if (mirror != NULL) {
            if (ap_py_tensors_add(&self->batch, mirror, ap_py_array_names[a], 1, 0, kDLCPU, 0,
                                  &host[a]) < 0)
                goto fail;
        } else if (device_type == kDLCPU && host_obj == Py_None) {
            host[a] = dev[a]; /* host arrays are their own mirrors */
        }
    }
    if (host_obj != Py_None) {
        Py_ssize_t known = 0;
        for (int a = 0; a < AP_PY_ARRAYS; a++)
            known += PyDict_GetItemString(host_obj, ap_py_array_names[a]) != NULL;
        if (known != PyDict_Size(host_obj)) {
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                            "host has a key that is not a batch array name (qo_indptr, "
                            "kv_page_indptr, kv_page_indices, kv_last_page_len, seq_lens, "
                            "positions)");
            goto fail;
        }
    }
    ap_batch batch = {.struct_size = sizeof batch, .mode = mode};
    if (ap_py_batch_fill(dev, host, device_type, &batch) < 0 ||
        ap_py_batch_counts(&batch, dev, num_tokens, max_q_len, max_seq_len) < 0)
        goto fail;
    ap_status status = ap_instance_init_metadata(instance, &batch, (void *)stream);
    if (status != AP_OK) {
        ap_py_raise(status);
        goto fail;
    }
    Py_RETURN_NONE;
fail:
    ap_py_tensors_release(&self->batch);
    return NULL;
}

/* ---- forward_extend / forward_decode ------------------------------------------------------------ */

int ap_py_layer_matches(const ap_py_layer *layer, const DLTensor *q) {
    const ap_py_tensor *k = &layer->pages.items[0];
    if (k->tensor == NULL) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "the layer was never initialised");
        return -1;
    }
    const DLDevice *a = &k->tensor->device, *b = &q->device;
    if (a->device_type != b->device_type || a->device_id != b->device_id) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                        "the layer's KV cache is on DLPack device (%d, %d), q on (%d, %d)",
                        (int)a->device_type, (int)a->device_id, (int)b->device_type,
                        (int)b->device_id);
        return -1;
    }
    return 0;
}

static PyObject *ap_py_forward(PyObject *obj, PyObject *args, PyObject *kwargs,
                               ap_forward_mode mode) {
    static char *keywords[] = {"layer", "q",       "k",      "v",      "out",
                               "lse",   "save_kv", "q_rope", "stream", NULL};
    PyObject *layer_obj, *q_obj, *k_obj, *v_obj, *out_obj, *lse_obj = Py_None;
    PyObject *q_rope_obj = Py_None, *stream_obj = Py_None;
    int save_kv = 0;
    if (!PyArg_ParseTupleAndKeywords(
            args, kwargs,
            mode == AP_MODE_DECODE ? "O!OOOO|$OpOO:forward_decode" : "O!OOOO|$OpOO:forward_extend",
            keywords, (PyTypeObject *)ap_py_layer_type, &layer_obj, &q_obj, &k_obj, &v_obj,
            &out_obj, &lse_obj, &save_kv, &q_rope_obj, &stream_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    if (instance == NULL) return NULL;
    int device_type;
    intptr_t stream;
    if (ap_py_device_type(&q_obj, 1, &device_type) < 0 ||
        ap_py_stream(stream_obj, device_type, &stream) < 0)
        return NULL;
    ap_py_tensors held = {.count = 0};
    ap_forward_args fwd = {.struct_size = sizeof fwd, .save_kv = save_kv};
    DLTensor *q, *k, *v, *q_rope;
    PyObject *result = NULL;
    if (ap_py_tensors_add(&held, q_obj, "q", 0, 0, device_type, stream, &q) < 0 ||
        ap_py_tensors_add(&held, k_obj, "k", 1, 0, device_type, stream, &k) < 0 ||
        ap_py_tensors_add(&held, v_obj, "v", 1, 0, device_type, stream, &v) < 0 ||
        ap_py_tensors_add(&held, out_obj, "out", 0, 1, device_type, stream, &fwd.out) < 0 ||
        ap_py_tensors_add(&held, lse_obj, "lse", 1, 1, device_type, stream, &fwd.lse) < 0 ||
        ap_py_tensors_add(&held, q_rope_obj, "q_rope", 1, 0, device_type, stream, &q_rope) < 0 ||
        ap_py_layer_matches((const ap_py_layer *)layer_obj, q) < 0)
        goto out;
    fwd.q = q;
    fwd.k = k;
    fwd.v = v;
    fwd.q_rope = q_rope;
    const ap_layer *layer = &((const ap_py_layer *)layer_obj)->layer;
    ap_status status = mode == AP_MODE_DECODE
                           ? ap_instance_forward_decode(instance, layer, &fwd, (void *)stream)
                           : ap_instance_forward_extend(instance, layer, &fwd, (void *)stream);
    if (status != AP_OK) {
        ap_py_raise(status);
        goto out;
    }
    result = Py_None;
    Py_INCREF(result);
out:
    ap_py_tensors_release(&held);
    return result;
}

static PyObject *ap_py_instance_forward_extend(PyObject *self, PyObject *args, PyObject *kwargs) {
    return ap_py_forward(self, args, kwargs, AP_MODE_EXTEND);
}

static PyObject *ap_py_instance_forward_decode(PyObject *self, PyObject *args, PyObject *kwargs) {
    return ap_py_forward(self, args, kwargs, AP_MODE_DECODE);
}

/* _time_forward_decode(n, layer, q, k, v, out) -> seconds per call of the C API alone, the
 * tensors imported once: what the binding's overhead is measured against. */
static PyObject *ap_py_instance_time_decode(PyObject *obj, PyObject *args) {
    Py_ssize_t n;
    PyObject *layer_obj, *q_obj, *k_obj, *v_obj, *out_obj;
    if (!PyArg_ParseTuple(args, "nO!OOOO:_time_forward_decode", &n,
                          (PyTypeObject *)ap_py_layer_type, &layer_obj, &q_obj, &k_obj, &v_obj,
                          &out_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    if (instance == NULL) return NULL;
    if (n < 1) return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "n must be >= 1");
    ap_py_tensors held = {.count = 0};
    ap_forward_args fwd = {.struct_size = sizeof fwd};
    DLTensor *q, *k, *v;
    PyObject *result = NULL;
    if (ap_py_tensors_add(&held, q_obj, "q", 0, 0, -1, 0, &q) < 0 ||
        ap_py_tensors_add(&held, k_obj, "k", 1, 0, -1, 0, &k) < 0 ||
        ap_py_tensors_add(&held, v_obj, "v", 1, 0, -1, 0, &v) < 0 ||
        ap_py_tensors_add(&held, out_obj, "out", 0, 1, -1, 0, &fwd.out) < 0)
        goto out;
    fwd.q = q;
    fwd.k = k;
    fwd.v = v;
    const ap_layer *layer = &((const ap_py_layer *)layer_obj)->layer;
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (Py_ssize_t i = 0; i < n; i++) {
        ap_status status = ap_instance_forward_decode(instance, layer, &fwd, NULL);
        if (status != AP_OK) {
            ap_py_raise(status);
            goto out;
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    double seconds =
        (double)(end.tv_sec - start.tv_sec) + 1e-9 * (double)(end.tv_nsec - start.tv_nsec);
    result = PyFloat_FromDouble(seconds / (double)n);
out:
    ap_py_tensors_release(&held);
    return result;
}

/* ---- attributes ---------------------------------------------------------------------------------- */

static PyObject *ap_py_instance_get(PyObject *obj, void *closure) {
    ap_instance *instance = ap_py_live(obj);
    if (instance == NULL) return NULL;
    const char *field = closure;
    if (strcmp(field, "backend") == 0) return PyUnicode_FromString(ap_instance_backend(instance));
    if (strcmp(field, "model") == 0) return ap_py_model_to_dict(ap_instance_model(instance));
    return ap_py_caps_to_dict(ap_instance_caps(instance));
}

static PyObject *ap_py_instance_closed(PyObject *obj, void *closure) {
    (void)closure;
    return PyBool_FromLong(((ap_py_instance *)obj)->instance == NULL);
}

static PyGetSetDef ap_py_instance_getset[] = {
    {"backend", ap_py_instance_get, NULL, "The backend's name.", "backend"},
    {"model", ap_py_instance_get, NULL, "The model as the backend sees it (options applied).",
     "model"},
    {"caps", ap_py_instance_get, NULL, "The backend's static capabilities.", "caps"},
    {"closed", ap_py_instance_closed, NULL, "True once close() ran.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define AP_PY_KW(f) (PyCFunction)(void (*)(void))(f), METH_VARARGS | METH_KEYWORDS
static PyMethodDef ap_py_instance_methods[] = {
    {"kv_spec", ap_py_instance_kv_spec, METH_NOARGS,
     "kv_spec() -> dict\n\nBytes per page and layer the host allocates (k, v, scales) and their "
     "alignment."},
    {"init_metadata", AP_PY_KW(ap_py_instance_init_metadata),
     "init_metadata(mode, qo_indptr, seq_lens, kv_page_indptr=None, kv_page_indices=None, "
     "kv_last_page_len=None, positions=None, *, host=None, num_tokens=-1, max_q_len=-1, "
     "max_seq_len=-1, stream=None)\n\nPlan one forward ('extend' or 'decode'), shared by all "
     "layers. Arrays are 1-D int32 DLPack tensors on the backend's device; host mirrors (a dict "
     "of the same names, CPU arrays) are the arrays themselves when those are on the CPU. The "
     "arrays are held until the next init_metadata."},
    {"forward_extend", AP_PY_KW(ap_py_instance_forward_extend),
     "forward_extend(layer, q, k, v, out, *, lse=None, save_kv=False, q_rope=None, "
     "stream=None)\n\nOne layer of the planned extend batch. q [tokens][qo_heads][d_qk], k/v new "
     "keys and values (or None), out [tokens][qo_heads][d_v], lse [tokens][qo_heads] float32. "
     "stream: an int cudaStream_t; None = the caller's current stream."},
    {"forward_decode", AP_PY_KW(ap_py_instance_forward_decode),
     "forward_decode(layer, q, k, v, out, *, lse=None, save_kv=False, q_rope=None, "
     "stream=None)\n\nOne layer of the planned decode batch (one token per sequence)."},
    {"append_kv", AP_PY_KW(ap_py_instance_append_kv),
     "append_kv(layer, k, v, positions, out_loc, cos_sin, rotary_dim, *, q=None, q_out=None, "
     "is_neox=True, stream=None)\n\nThe append_kv/1 hook: RoPE + quantize + paged KV write. "
     "Error AP_ERR_UNSUPPORTED where the backend lacks it."},
    {"pack_prefix_chunk_kv", AP_PY_KW(ap_py_instance_pack_prefix_chunk_kv),
     "pack_prefix_chunk_kv(k_nope, k_pe, v, k_out, v_out, *, k_scale=1.0, v_scale=1.0, "
     "stream=None)\n\nThe pack_prefix_chunk_kv/1 hook (MLA chunked prefill)."},
    {"merge_state", AP_PY_KW(ap_py_instance_merge_state),
     "merge_state(o_a, lse_a, o_b, lse_b, o, *, lse=None, stream=None)\n\nThe merge_state/1 "
     "hook: two partial attention results over disjoint keys into one by log-sum-exp (o may be "
     "o_a, lse may be lse_a)."},
    {"cuda_graph_prepare", AP_PY_KW(ap_py_instance_cuda_graph_prepare),
     "cuda_graph_prepare(max_batch, *, stream=None)\n\nThe cuda_graph/1 hook."},
    {"has_hook", ap_py_instance_has_hook, METH_VARARGS,
     "has_hook(name) -> bool\n\nWhether the backend offers the hook 'name/version'."},
    {"hook_address", ap_py_instance_hook_address, METH_VARARGS,
     "hook_address(name) -> int\n\nThe raw function address of any hook (third-party names), "
     "for ctypes; Error AP_ERR_NOT_FOUND where absent."},
    {"_time_forward_decode", ap_py_instance_time_decode, METH_VARARGS,
     "_time_forward_decode(n, layer, q, k, v, out) -> float\n\nSeconds per call of the C API "
     "alone over n calls (tensors imported once): the baseline of the binding's overhead."},
    {"close", ap_py_instance_close, METH_NOARGS,
     "close()\n\nDestroy the backend instance now (also on garbage collection)."},
    {"__enter__", ap_py_instance_enter, METH_NOARGS, NULL},
    {"__exit__", ap_py_instance_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyObject *ap_py_instance_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    (void)type;
    (void)args;
    (void)kwargs;
    return ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                           "open an Instance with Registry.open or Registry.open_config");
}

static PyType_Slot ap_py_instance_slots[] = {
    {Py_tp_doc, "An opened backend instance for one model (Registry.open, open_config)."},
    {Py_tp_new, ap_py_instance_new},
    {Py_tp_dealloc, ap_py_instance_dealloc},
    {Py_tp_methods, ap_py_instance_methods},
    {Py_tp_getset, ap_py_instance_getset},
    {0, NULL},
};

static PyType_Spec ap_py_instance_spec = {
    .name = "attnplug._attnplug.Instance",
    .basicsize = sizeof(ap_py_instance),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = ap_py_instance_slots,
};

int ap_py_instance_init_type(PyObject *module) {
    return ap_py_add_type(module, &ap_py_instance_spec, &ap_py_instance_type);
}
