/* hooks.c: the Instance methods of the optional hooks (append_kv/1, pack_prefix_chunk_kv/1,
 * merge_state/1, cuda_graph/1) and the lookup of any hook by name. */
#include "binding.h"

/* Each hook is one method: parse, import its tensors into one set, fill its args struct, call the
 * core's typed wrapper (AP_ERR_UNSUPPORTED where the backend lacks the hook), give the tensors
 * back. A new hook is one more such function, its prototype in binding.h and a line in the
 * Instance's method table (instance.c). */

/* The device type and stream of a hook call, from its first tensor. */
static int ap_py_call_stream(PyObject *first, PyObject *stream_obj, int *device_type,
                             intptr_t *stream) {
    if (ap_py_device_type(&first, 1, device_type) < 0) return -1;
    return ap_py_stream(stream_obj, *device_type, stream);
}

/* Finish a hook call: raise on failure, give the tensors back. */
static PyObject *ap_py_hook_done(ap_status status, ap_py_tensors *held) {
    PyObject *result = status == AP_OK ? Py_None : ap_py_raise(status);
    Py_XINCREF(result);
    ap_py_tensors_release(held);
    return result;
}

PyObject *ap_py_instance_append_kv(PyObject *obj, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"layer",      "k", "v",     "positions", "out_loc", "cos_sin",
                               "rotary_dim", "q", "q_out", "is_neox",   "stream",  NULL};
    PyObject *layer_obj, *k_obj, *v_obj, *pos_obj, *loc_obj, *cs_obj, *q_obj = Py_None;
    PyObject *q_out_obj = Py_None, *stream_obj = Py_None;
    int rotary_dim, is_neox = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!OOOOOi|$OOpO:append_kv", keywords,
                                     (PyTypeObject *)ap_py_layer_type, &layer_obj, &k_obj, &v_obj,
                                     &pos_obj, &loc_obj, &cs_obj, &rotary_dim, &q_obj, &q_out_obj,
                                     &is_neox, &stream_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    int device_type;
    intptr_t stream;
    if (instance == NULL || ap_py_call_stream(k_obj, stream_obj, &device_type, &stream) < 0)
        return NULL;
    ap_py_tensors held = {.count = 0};
    ap_append_kv_args hook = {
        .struct_size = sizeof hook, .rotary_dim = rotary_dim, .is_neox = is_neox};
    DLTensor *q, *k, *v, *positions, *out_loc, *cos_sin;
    if (ap_py_tensors_add(&held, k_obj, "k", 0, 0, device_type, stream, &k) < 0 ||
        ap_py_tensors_add(&held, v_obj, "v", 0, 0, device_type, stream, &v) < 0 ||
        ap_py_tensors_add(&held, pos_obj, "positions", 0, 0, device_type, stream, &positions) < 0 ||
        ap_py_tensors_add(&held, loc_obj, "out_loc", 0, 0, device_type, stream, &out_loc) < 0 ||
        ap_py_tensors_add(&held, cs_obj, "cos_sin", 0, 0, device_type, stream, &cos_sin) < 0 ||
        ap_py_tensors_add(&held, q_obj, "q", 1, 0, device_type, stream, &q) < 0 ||
        ap_py_tensors_add(&held, q_out_obj, "q_out", 1, 1, device_type, stream, &hook.q_out) < 0 ||
        ap_py_layer_matches((const ap_py_layer *)layer_obj, k) < 0) {
        ap_py_tensors_release(&held);
        return NULL;
    }
    hook.q = q;
    hook.k = k;
    hook.v = v;
    hook.positions = positions;
    hook.out_loc = out_loc;
    hook.cos_sin = cos_sin;
    ap_status status = ap_instance_append_kv(instance, &((const ap_py_layer *)layer_obj)->layer,
                                             &hook, (void *)stream);
    return ap_py_hook_done(status, &held);
}

PyObject *ap_py_instance_pack_prefix_chunk_kv(PyObject *obj, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"k_nope",  "k_pe",    "v",      "k_out", "v_out",
                               "k_scale", "v_scale", "stream", NULL};
    PyObject *k_nope_obj, *k_pe_obj, *v_obj, *k_out_obj, *v_out_obj, *stream_obj = Py_None;
    float k_scale = 1.0f, v_scale = 1.0f;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$ffO:pack_prefix_chunk_kv", keywords,
                                     &k_nope_obj, &k_pe_obj, &v_obj, &k_out_obj, &v_out_obj,
                                     &k_scale, &v_scale, &stream_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    int device_type;
    intptr_t stream;
    if (instance == NULL || ap_py_call_stream(k_nope_obj, stream_obj, &device_type, &stream) < 0)
        return NULL;
    ap_py_tensors held = {.count = 0};
    ap_pack_kv_args hook = {.struct_size = sizeof hook, .k_scale = k_scale, .v_scale = v_scale};
    DLTensor *k_nope, *k_pe, *v;
    if (ap_py_tensors_add(&held, k_nope_obj, "k_nope", 0, 0, device_type, stream, &k_nope) < 0 ||
        ap_py_tensors_add(&held, k_pe_obj, "k_pe", 0, 0, device_type, stream, &k_pe) < 0 ||
        ap_py_tensors_add(&held, v_obj, "v", 0, 0, device_type, stream, &v) < 0 ||
        ap_py_tensors_add(&held, k_out_obj, "k_out", 0, 1, device_type, stream, &hook.k_out) < 0 ||
        ap_py_tensors_add(&held, v_out_obj, "v_out", 0, 1, device_type, stream, &hook.v_out) < 0) {
        ap_py_tensors_release(&held);
        return NULL;
    }
    hook.k_nope = k_nope;
    hook.k_pe = k_pe;
    hook.v = v;
    return ap_py_hook_done(ap_instance_pack_prefix_chunk_kv(instance, &hook, (void *)stream),
                           &held);
}

PyObject *ap_py_instance_merge_state(PyObject *obj, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"o_a", "lse_a", "o_b", "lse_b", "o", "lse", "stream", NULL};
    PyObject *o_a_obj, *lse_a_obj, *o_b_obj, *lse_b_obj, *o_obj, *lse_obj = Py_None;
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOOO|$OO:merge_state", keywords, &o_a_obj,
                                     &lse_a_obj, &o_b_obj, &lse_b_obj, &o_obj, &lse_obj,
                                     &stream_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    int device_type;
    intptr_t stream;
    if (instance == NULL || ap_py_call_stream(o_a_obj, stream_obj, &device_type, &stream) < 0)
        return NULL;
    ap_py_tensors held = {.count = 0};
    ap_merge_state_args hook = {.struct_size = sizeof hook};
    DLTensor *o_a, *lse_a, *o_b, *lse_b;
    if (ap_py_tensors_add(&held, o_a_obj, "o_a", 0, 0, device_type, stream, &o_a) < 0 ||
        ap_py_tensors_add(&held, lse_a_obj, "lse_a", 0, 0, device_type, stream, &lse_a) < 0 ||
        ap_py_tensors_add(&held, o_b_obj, "o_b", 0, 0, device_type, stream, &o_b) < 0 ||
        ap_py_tensors_add(&held, lse_b_obj, "lse_b", 0, 0, device_type, stream, &lse_b) < 0 ||
        ap_py_tensors_add(&held, o_obj, "o", 0, 1, device_type, stream, &hook.o) < 0 ||
        ap_py_tensors_add(&held, lse_obj, "lse", 1, 1, device_type, stream, &hook.lse) < 0) {
        ap_py_tensors_release(&held);
        return NULL;
    }
    hook.o_a = o_a;
    hook.lse_a = lse_a;
    hook.o_b = o_b;
    hook.lse_b = lse_b;
    return ap_py_hook_done(ap_instance_merge_state(instance, &hook, (void *)stream), &held);
}

PyObject *ap_py_instance_cuda_graph_prepare(PyObject *obj, PyObject *args, PyObject *kwargs) {
    static char *keywords[] = {"max_batch", "stream", NULL};
    int max_batch;
    PyObject *stream_obj = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "i|$O:cuda_graph_prepare", keywords, &max_batch,
                                     &stream_obj))
        return NULL;
    ap_instance *instance = ap_py_live(obj);
    intptr_t stream;
    int device_type = ((ap_py_instance *)obj)->on_gpu ? kDLCUDA : kDLCPU;
    if (instance == NULL || ap_py_stream(stream_obj, device_type, &stream) < 0) return NULL;
    ap_py_tensors none = {.count = 0};
    return ap_py_hook_done(ap_instance_cuda_graph_prepare(instance, max_batch, (void *)stream),
                           &none);
}

PyObject *ap_py_instance_has_hook(PyObject *obj, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:has_hook", &name)) return NULL;
    ap_instance *instance = ap_py_live(obj);
    if (instance == NULL) return NULL;
    return PyBool_FromLong(ap_instance_has_hook(instance, name));
}

PyObject *ap_py_instance_hook_address(PyObject *obj, PyObject *args) {
    const char *name;
    if (!PyArg_ParseTuple(args, "s:hook_address", &name)) return NULL;
    ap_instance *instance = ap_py_live(obj);
    if (instance == NULL) return NULL;
    void *hook = ap_instance_hook(instance, name);
    if (hook == NULL) return ap_py_raise(AP_ERR_NOT_FOUND);
    return PyLong_FromVoidPtr(hook);
}
