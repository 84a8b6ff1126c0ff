/* tensor.c: reading and writing elements of host DLTensors of any supported dtype and stride. */
#include "backends/numeric/host_numeric.h"
#include "cpu_ref.h"

static int cpu_elem_from_dl(DLDataType type, cpu_elem *out) {
    if (type.lanes != 1) return 0;
    if (type.code == kDLFloat && type.bits == 32)
        *out = CPU_ELEM_F32;
    else if (type.code == kDLFloat && type.bits == 16)
        *out = CPU_ELEM_F16;
    else if (type.code == kDLBfloat && type.bits == 16)
        *out = CPU_ELEM_BF16;
    else if (type.code == AP_DL_FLOAT8_E4M3FN && type.bits == 8)
        *out = CPU_ELEM_FP8_E4M3;
    else if (type.code == AP_DL_FLOAT8_E5M2 && type.bits == 8)
        *out = CPU_ELEM_FP8_E5M2;
    else if (type.code == kDLInt && type.bits == 32)
        *out = CPU_ELEM_I32;
    else
        return 0;
    return 1;
}

static size_t cpu_elem_bytes(cpu_elem elem) {
    switch (elem) {
        case CPU_ELEM_F32:
        case CPU_ELEM_I32: return 4;
        case CPU_ELEM_BF16:
        case CPU_ELEM_F16: return 2;
        default: return 1;
    }
}

const char *cpu_elem_name(cpu_elem elem) {
    static const char *const names[] = {"float32",  "bfloat16", "float16",
                                        "fp8_e4m3", "fp8_e5m2", "int32"};
    return (unsigned)elem < sizeof names / sizeof names[0] ? names[elem] : "?";
}

int cpu_elem_is_float_activation(cpu_elem elem) {
    return elem == CPU_ELEM_F32 || elem == CPU_ELEM_BF16 || elem == CPU_ELEM_F16;
}

int cpu_elem_is_fp8(cpu_elem elem) {
    return elem == CPU_ELEM_FP8_E4M3 || elem == CPU_ELEM_FP8_E5M2;
}

/* Host-readable devices only: cpu_ref dereferences every pointer it is given. */
static int cpu_device_is_host(DLDevice device) {
    return device.device_type == kDLCPU || device.device_type == kDLCUDAHost ||
           device.device_type == kDLCUDAManaged;
}

ap_status cpu_view_make(const DLTensor *tensor, const char *what, cpu_view *out, ap_msgbuf *msg) {
    memset(out, 0, sizeof *out);
    if (tensor == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: tensor %s is NULL", what);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (!cpu_device_is_host(tensor->device)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: tensor %s is on device type %d; cpu_ref reads host memory only",
                      what, (int)tensor->device.device_type);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (tensor->ndim < 1 || tensor->ndim > CPU_VIEW_MAX_DIMS || tensor->shape == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: tensor %s has %d dims (1 to %d expected)", what, tensor->ndim,
                      CPU_VIEW_MAX_DIMS);
        return AP_ERR_SHAPE_MISMATCH;
    }
    if (!cpu_elem_from_dl(tensor->dtype, &out->elem)) {
        ap_msgbuf_add(msg,
                      "cpu_ref: tensor %s has an unsupported dtype (code %u, %u bits, %u lanes)",
                      what, (unsigned)tensor->dtype.code, (unsigned)tensor->dtype.bits,
                      (unsigned)tensor->dtype.lanes);
        return AP_ERR_INVALID_ARGUMENT;
    }
    out->ndim = tensor->ndim;
    int64_t count = 1;
    for (int d = 0; d < tensor->ndim; d++) {
        if (tensor->shape[d] < 0) {
            ap_msgbuf_add(msg, "cpu_ref: tensor %s has a negative dim %d", what, d);
            return AP_ERR_SHAPE_MISMATCH;
        }
        out->shape[d] = tensor->shape[d];
        count *= tensor->shape[d];
    }
    /* strides NULL means compact row-major (DLPack's rule) */
    int64_t compact = 1;
    for (int d = tensor->ndim - 1; d >= 0; d--) {
        out->stride[d] = tensor->strides != NULL ? tensor->strides[d] : compact;
        compact *= out->shape[d];
    }
    if (count > 0 && tensor->data == NULL) {
        ap_msgbuf_add(msg, "cpu_ref: tensor %s has NULL data", what);
        return AP_ERR_INVALID_ARGUMENT;
    }
    out->base = (char *)tensor->data + tensor->byte_offset;
    return AP_OK;
}

/* Check a view's rank and shape; a negative entry of `shape` accepts any size. */
ap_status cpu_view_expect(const cpu_view *view, const char *what, int ndim, const int64_t *shape,
                          ap_msgbuf *msg) {
    int ok = view->ndim == ndim;
    for (int d = 0; ok && d < ndim; d++) ok = shape[d] < 0 || view->shape[d] == shape[d];
    if (ok) return AP_OK;
    char got[96] = "", want[96] = "";
    size_t got_len = 0, want_len = 0;
    for (int d = 0; d < view->ndim && got_len < sizeof got; d++)
        got_len += (size_t)snprintf(got + got_len, sizeof got - got_len, "[%lld]",
                                    (long long)view->shape[d]);
    for (int d = 0; d < ndim && want_len < sizeof want; d++) {
        if (shape[d] < 0)
            want_len += (size_t)snprintf(want + want_len, sizeof want - want_len, "[*]");
        else
            want_len += (size_t)snprintf(want + want_len, sizeof want - want_len, "[%lld]",
                                         (long long)shape[d]);
    }
    ap_msgbuf_add(msg, "cpu_ref: tensor %s has shape %s, expected %s", what, got, want);
    return AP_ERR_SHAPE_MISMATCH;
}

static char *cpu_view_address(const cpu_view *view, const int64_t *index) {
    int64_t offset = 0;
    for (int d = 0; d < view->ndim; d++) offset += index[d] * view->stride[d];
    return view->base + offset * (int64_t)cpu_elem_bytes(view->elem);
}

float cpu_view_get(const cpu_view *view, const int64_t *index) {
    const char *at = cpu_view_address(view, index);
    uint16_t half;
    float f;
    int32_t i;
    switch (view->elem) {
        case CPU_ELEM_F32: memcpy(&f, at, 4); return f;
        case CPU_ELEM_BF16: memcpy(&half, at, 2); return ap_bf16_to_float(half);
        case CPU_ELEM_F16: memcpy(&half, at, 2); return ap_f16_to_float(half);
        case CPU_ELEM_FP8_E4M3: return ap_fp8_e4m3_to_float((uint8_t)*at);
        case CPU_ELEM_FP8_E5M2: return ap_fp8_e5m2_to_float((uint8_t)*at);
        case CPU_ELEM_I32: memcpy(&i, at, 4); return (float)i;
    }
    return 0.0f;
}

/* Store `value` rounded to the view's dtype (fp8 saturating, per host_numeric.h). */
void cpu_view_set(const cpu_view *view, const int64_t *index, float value) {
    char *at = cpu_view_address(view, index);
    uint16_t half;
    int32_t i;
    switch (view->elem) {
        case CPU_ELEM_F32: memcpy(at, &value, 4); break;
        case CPU_ELEM_BF16:
            half = ap_float_to_bf16(value);
            memcpy(at, &half, 2);
            break;
        case CPU_ELEM_F16:
            half = ap_float_to_f16(value);
            memcpy(at, &half, 2);
            break;
        case CPU_ELEM_FP8_E4M3: *at = (char)ap_float_to_fp8_e4m3(value); break;
        case CPU_ELEM_FP8_E5M2: *at = (char)ap_float_to_fp8_e5m2(value); break;
        case CPU_ELEM_I32:
            i = (int32_t)value;
            memcpy(at, &i, 4);
            break;
    }
}

int32_t cpu_view_get_i32(const cpu_view *view, int64_t i) {
    int32_t value;
    memcpy(&value, view->base + i * view->stride[0] * 4, 4);
    return value;
}
