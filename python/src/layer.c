/* layer.c: the Layer type: one attention layer's parameters and its paged KV cache (ap_layer).
 *
 * The cache is the caller's tensors, [num_pages][page_size][num_kv_heads][head_dim] (NHD), taken
 * once through DLPack and held while the Layer lives, so a forward call imports only q, k, v and
 * out. The core checks the cache's dims against the model; this file checks that the tensors
 * hold what the ap_kv_cache it builds says they hold (the core cannot see their shapes). */
#include <math.h>
#include <stdlib.h>

#include "binding.h"

PyObject *ap_py_layer_type;

/* The KV dtype a tensor's DLPack dtype names; NONE for raw bytes (fp8 from a DLPack 0.x
 * producer, nvfp4) whose meaning the caller must give. -1: not a cache dtype. */
static int ap_py_kv_dtype_of(DLDataType t, ap_dtype *out) {
    *out = AP_DTYPE_NONE;
    if (t.lanes != 1) return -1;
    if (t.code == kDLBfloat && t.bits == 16)
        *out = AP_DTYPE_BF16;
    else if (t.code == kDLFloat && t.bits == 16)
        *out = AP_DTYPE_F16;
    else if (t.code == AP_DL_FLOAT8_E4M3FN && t.bits == 8)
        *out = AP_DTYPE_FP8_E4M3;
    else if (t.code == AP_DL_FLOAT8_E5M2 && t.bits == 8)
        *out = AP_DTYPE_FP8_E5M2;
    else if (!((t.code == kDLUInt || t.code == kDLInt) && t.bits == 8))
        return -1;
    return 0;
}

static int ap_py_dense(const DLTensor *t) {
    if (t->strides == NULL) return 1;
    int64_t compact = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != compact) return 0;
        compact *= t->shape[i];
    }
    return 1;
}

/* One page tensor: 4-D, dense, with the dims and device of the K one (`like`, NULL for K). */
static int ap_py_check_pages(const char *name, const DLTensor *t, const DLTensor *like,
                             int check_last) {
    if (t->ndim != 4) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH,
                        "%s must be 4-D [num_pages][page_size][num_kv_heads][head_dim], not %d-D",
                        name, (int)t->ndim);
        return -1;
    }
    if (!ap_py_dense(t)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "%s must be dense (row-major)", name);
        return -1;
    }
    if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDA &&
        t->device.device_type != kDLCUDAManaged) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                        "%s is on DLPack device type %d (CPU or CUDA only)", name,
                        (int)t->device.device_type);
        return -1;
    }
    if (like == NULL) return 0;
    for (int i = 0; i < (check_last ? 4 : 3); i++) {
        if (t->shape[i] != like->shape[i]) {
            ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "%s has %lld in dim %d where k_pages has %lld",
                            name, (long long)t->shape[i], i, (long long)like->shape[i]);
            return -1;
        }
    }
    if (t->device.device_type != like->device.device_type ||
        t->device.device_id != like->device.device_id || t->dtype.code != like->dtype.code ||
        t->dtype.bits != like->dtype.bits) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "%s differs from k_pages in device or dtype", name);
        return -1;
    }
    return 0;
}

static void *ap_py_data(const DLTensor *t) {
    return t == NULL ? NULL : (char *)t->data + t->byte_offset;
}

/* The cache's dtype: the tensor's own, or `kv_dtype` for raw bytes; both must agree. */
static int ap_py_layer_dtype(const DLTensor *k, PyObject *kv_dtype, ap_dtype *out) {
    ap_dtype from_tensor;
    if (ap_py_kv_dtype_of(k->dtype, &from_tensor) < 0) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH,
                        "k_pages has DLPack dtype code %d, %d bits: a KV cache is bf16, f16, "
                        "float8 or uint8 bytes",
                        (int)k->dtype.code, (int)k->dtype.bits);
        return -1;
    }
    ap_dtype asked = AP_DTYPE_NONE;
    if (kv_dtype != Py_None) {
        const char *name =
            PyUnicode_Check(kv_dtype) ? PyUnicode_AsUTF8AndSize(kv_dtype, NULL) : NULL;
        if (name == NULL || ap_dtype_parse(name, &asked) != AP_OK) {
            PyErr_Clear();
            ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "kv_dtype must be a dtype name such as "
                                                     "'fp8_e4m3'");
            return -1;
        }
    }
    if (from_tensor == AP_DTYPE_NONE) { /* bytes */
        if (asked != AP_DTYPE_FP8_E4M3 && asked != AP_DTYPE_FP8_E5M2 && asked != AP_DTYPE_NVFP4) {
            ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH,
                            "k_pages holds bytes: pass kv_dtype='fp8_e4m3', 'fp8_e5m2' or "
                            "'nvfp4'");
            return -1;
        }
        *out = asked;
        return 0;
    }
    if (asked != AP_DTYPE_NONE && asked != from_tensor) {
        ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "kv_dtype is %s but k_pages holds %s",
                        ap_dtype_str(asked), ap_dtype_str(from_tensor));
        return -1;
    }
    *out = from_tensor;
    return 0;
}

static int ap_py_layer_init(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"k_pages",     "v_pages",        "layer_id",       "kv_dtype",
                               "sm_scale",    "logit_softcap",  "k_scale",        "v_scale",
                               "window_left", "k_block_scales", "v_block_scales", NULL};
    PyObject *k_obj, *v_obj = Py_None, *kv_dtype = Py_None, *sm_obj = Py_None;
    PyObject *k_scales_obj = Py_None, *v_scales_obj = Py_None;
    int layer_id = 0, window_left = -1;
    float softcap = 0.0f, k_scale = 1.0f, v_scale = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$iOOfffiOO:Layer", keywords, &k_obj, &v_obj,
                                     &layer_id, &kv_dtype, &sm_obj, &softcap, &k_scale, &v_scale,
                                     &window_left, &k_scales_obj, &v_scales_obj))
        return -1;
    ap_py_layer *layer = (ap_py_layer *)self;
    if (layer->layer.struct_size != 0) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT, "Layer.__init__ called twice");
        return -1;
    }
    DLTensor *k = NULL, *v = NULL, *k_scales = NULL, *v_scales = NULL;
    ap_py_tensors *held = &layer->pages;
    if (ap_py_tensors_add(held, k_obj, "k_pages", 0, 1, -1, 0, &k) < 0 ||
        ap_py_check_pages("k_pages", k, NULL, 0) < 0 ||
        ap_py_tensors_add(held, v_obj, "v_pages", 1, 1, -1, 0, &v) < 0 ||
        (v != NULL && ap_py_check_pages("v_pages", v, k, 0) < 0) ||
        ap_py_tensors_add(held, k_scales_obj, "k_block_scales", 1, 1, -1, 0, &k_scales) < 0 ||
        (k_scales != NULL && ap_py_check_pages("k_block_scales", k_scales, NULL, 0) < 0) ||
        ap_py_tensors_add(held, v_scales_obj, "v_block_scales", 1, 1, -1, 0, &v_scales) < 0 ||
        (v_scales != NULL && ap_py_check_pages("v_block_scales", v_scales, k_scales, 1) < 0))
        goto fail;
    ap_dtype dtype;
    if (ap_py_layer_dtype(k, kv_dtype, &dtype) < 0) goto fail;
    /* nvfp4 packs two values a byte; its block scales are one byte per 16 values. */
    int64_t per_byte = dtype == AP_DTYPE_NVFP4 ? 2 : 1;
    if ((dtype == AP_DTYPE_NVFP4) != (k_scales != NULL)) {
        ap_py_raise_msg(AP_ERR_INVALID_ARGUMENT,
                        "k_block_scales (and v_block_scales) are for, and required by, nvfp4");
        goto fail;
    }
    for (int i = 0; i < 3; i++) {
        if (k->shape[i] < 1 || k->shape[i] > INT32_MAX || k->shape[3] * per_byte > INT32_MAX ||
            (v != NULL && v->shape[3] * per_byte > INT32_MAX)) {
            ap_py_raise_msg(AP_ERR_SHAPE_MISMATCH, "k_pages has an empty or too large dim");
            goto fail;
        }
    }
    ap_kv_cache *kv = &layer->kv;
    kv->struct_size = sizeof *kv;
    kv->layout = AP_KV_LAYOUT_NHD;
    kv->dtype = dtype;
    kv->num_pages = (int32_t)k->shape[0];
    kv->page_size = (int32_t)k->shape[1];
    kv->num_kv_heads = (int32_t)k->shape[2];
    kv->head_dim_qk = (int32_t)(k->shape[3] * per_byte);
    kv->head_dim_v = v != NULL ? (int32_t)(v->shape[3] * per_byte) : kv->head_dim_qk;
    kv->k_pages = ap_py_data(k);
    kv->v_pages = ap_py_data(v);
    kv->k_block_scales = ap_py_data(k_scales);
    kv->v_block_scales = ap_py_data(v_scales);
    float scale = 1.0f / sqrtf((float)kv->head_dim_qk);
    if (sm_obj != Py_None) {
        double value = PyFloat_AsDouble(sm_obj);
        if (value == -1.0 && PyErr_Occurred()) goto fail;
        scale = (float)value;
    }
    layer->layer = (ap_layer){
        .struct_size = sizeof(ap_layer),
        .layer_id = layer_id,
        .sm_scale = scale,
        .logit_softcap = softcap,
        .k_scale = k_scale,
        .v_scale = v_scale,
        .window_left = window_left,
        .kv = kv,
    };
    return 0;
fail:
    ap_py_tensors_release(held);
    memset(&layer->kv, 0, sizeof layer->kv);
    return -1;
}

static void ap_py_layer_dealloc(PyObject *self) {
    ap_py_tensors_release(&((ap_py_layer *)self)->pages);
    ap_py_object_free(self);
}

static PyObject *ap_py_layer_get(PyObject *self, void *closure) {
    const ap_py_layer *layer = (const ap_py_layer *)self;
    const char *field = closure;
    const ap_kv_cache *kv = &layer->kv;
    if (strcmp(field, "layer_id") == 0) return PyLong_FromLong(layer->layer.layer_id);
    if (strcmp(field, "sm_scale") == 0) return PyFloat_FromDouble(layer->layer.sm_scale);
    if (strcmp(field, "logit_softcap") == 0) return PyFloat_FromDouble(layer->layer.logit_softcap);
    if (strcmp(field, "k_scale") == 0) return PyFloat_FromDouble(layer->layer.k_scale);
    if (strcmp(field, "v_scale") == 0) return PyFloat_FromDouble(layer->layer.v_scale);
    if (strcmp(field, "window_left") == 0) return PyLong_FromLong(layer->layer.window_left);
    if (strcmp(field, "kv_dtype") == 0) return PyUnicode_FromString(ap_dtype_str(kv->dtype));
    if (strcmp(field, "num_pages") == 0) return PyLong_FromLong(kv->num_pages);
    if (strcmp(field, "page_size") == 0) return PyLong_FromLong(kv->page_size);
    if (strcmp(field, "num_kv_heads") == 0) return PyLong_FromLong(kv->num_kv_heads);
    if (strcmp(field, "head_dim_qk") == 0) return PyLong_FromLong(kv->head_dim_qk);
    return PyLong_FromLong(kv->head_dim_v);
}

#define AP_PY_LAYER_FIELD(name, doc) \
    { #name, ap_py_layer_get, NULL, doc, #name }
static PyGetSetDef ap_py_layer_getset[] = {
    AP_PY_LAYER_FIELD(layer_id, "The layer's index in the model."),
    AP_PY_LAYER_FIELD(sm_scale, "Softmax scale (default 1/sqrt(head_dim_qk))."),
    AP_PY_LAYER_FIELD(logit_softcap, "0: off; else logits = cap * tanh(logits / cap)."),
    AP_PY_LAYER_FIELD(k_scale, "fp8: real K = stored * k_scale; nvfp4: the global scale."),
    AP_PY_LAYER_FIELD(v_scale, "fp8: real V = stored * v_scale."),
    AP_PY_LAYER_FIELD(window_left, "Sliding window (-1: off)."),
    AP_PY_LAYER_FIELD(kv_dtype, "The cache's element type."),
    AP_PY_LAYER_FIELD(num_pages, "Pages in the cache."),
    AP_PY_LAYER_FIELD(page_size, "Tokens per page."),
    AP_PY_LAYER_FIELD(num_kv_heads, "KV heads per token."),
    AP_PY_LAYER_FIELD(head_dim_qk, "K head dim."),
    AP_PY_LAYER_FIELD(head_dim_v, "V head dim."),
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot ap_py_layer_slots[] = {
    {Py_tp_doc,
     "Layer(k_pages, v_pages=None, *, layer_id=0, kv_dtype=None, sm_scale=None, "
     "logit_softcap=0.0, k_scale=1.0, v_scale=1.0, window_left=-1, k_block_scales=None, "
     "v_block_scales=None)\n\nOne layer's parameters and paged KV cache. k_pages and v_pages "
     "are DLPack tensors [num_pages][page_size][num_kv_heads][head_dim] (NHD) of the cache's "
     "dtype (uint8 bytes with kv_dtype='fp8_e4m3'/'fp8_e5m2'/'nvfp4'), on the backend's device. "
     "They are held, not copied, while the Layer lives."},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_init, ap_py_layer_init},
    {Py_tp_dealloc, ap_py_layer_dealloc},
    {Py_tp_getset, ap_py_layer_getset},
    {0, NULL},
};

static PyType_Spec ap_py_layer_spec = {
    .name = "attnplug._attnplug.Layer",
    .basicsize = sizeof(ap_py_layer),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = ap_py_layer_slots,
};

int ap_py_layer_init_type(PyObject *module) {
    return ap_py_add_type(module, &ap_py_layer_spec, &ap_py_layer_type);
}
