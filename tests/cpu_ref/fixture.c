/* fixture.c: opening cpu_ref directly, seeded random numbers and host tensors for its tests. */
#include "fixture.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backends/common/host_numeric.h"

int fx_plugin_open(fx_plugin *plugin) {
    memset(plugin, 0, sizeof *plugin);
    const char *path = getenv("AP_CPU_REF_PLUGIN");
    if (path == NULL) {
        fprintf(stderr, "AP_CPU_REF_PLUGIN is not set (meson test sets it)\n");
        return -1;
    }
    plugin->handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (plugin->handle == NULL) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return -1;
    }
    void *entry = dlsym(plugin->handle, AP_PLUGIN_ENTRY);
    memcpy(&plugin->negotiate, &entry, sizeof entry);
    if (plugin->negotiate == NULL) {
        fprintf(stderr, "%s has no %s\n", path, AP_PLUGIN_ENTRY);
        return -1;
    }
    ap_negotiate_offer offer = {sizeof offer, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR};
    ap_negotiate_reply reply = {.struct_size = sizeof reply};
    fx_msg msg;
    fx_msg_init(&msg);
    if (plugin->negotiate(&offer, &reply, &msg.buf) != AP_OK || reply.descriptor == NULL) {
        fprintf(stderr, "negotiation failed: %s\n", msg.text);
        return -1;
    }
    plugin->descriptor = reply.descriptor;
    plugin->vt = reply.descriptor->vtable;
    return 0;
}

void fx_plugin_close(fx_plugin *plugin) {
    if (plugin->handle != NULL) dlclose(plugin->handle);
    memset(plugin, 0, sizeof *plugin);
}

void fx_msg_init(fx_msg *msg) {
    msg->text[0] = '\0';
    msg->buf.struct_size = sizeof msg->buf;
    msg->buf.text = msg->text;
    msg->buf.capacity = sizeof msg->text;
    msg->buf.length = 0;
}

static uint64_t fx_rng_state;

uint64_t fx_seed_init(void) {
    const char *fixed = getenv("AP_TEST_SEED");
    uint64_t seed;
    if (fixed != NULL) {
        seed = strtoull(fixed, NULL, 0);
    } else {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        seed = (uint64_t)now.tv_nsec ^ ((uint64_t)now.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
    }
    if (seed == 0) seed = 0x9e3779b97f4a7c15ull;
    fprintf(stderr, "random seed: AP_TEST_SEED=%llu\n", (unsigned long long)seed);
    fx_rng_state = seed;
    return seed;
}

/* xorshift64*: plenty for test data */
uint64_t fx_rand_u64(void) {
    fx_rng_state ^= fx_rng_state >> 12;
    fx_rng_state ^= fx_rng_state << 25;
    fx_rng_state ^= fx_rng_state >> 27;
    return fx_rng_state * 0x2545f4914f6cdd1dull;
}

double fx_rand_uniform(double lo, double hi) {
    double x;
    do {
        x = lo + (hi - lo) * ((double)(fx_rand_u64() >> 11) / 9007199254740992.0);
    } while (x == 0.0);
    return x;
}

int fx_rand_int(int lo, int hi) {
    return lo + (int)(fx_rand_u64() % (uint64_t)(hi - lo + 1));
}

size_t fx_dtype_bytes(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_F32: return 4;
        case AP_DTYPE_BF16:
        case AP_DTYPE_F16: return 2;
        case AP_DTYPE_FP8_E4M3:
        case AP_DTYPE_FP8_E5M2: return 1;
        default: return 4; /* int32 */
    }
}

const char *fx_dtype_name(ap_dtype dtype) {
    switch (dtype) {
        case AP_DTYPE_F32: return "f32";
        case AP_DTYPE_BF16: return "bf16";
        case AP_DTYPE_F16: return "f16";
        case AP_DTYPE_FP8_E4M3: return "e4m3";
        case AP_DTYPE_FP8_E5M2: return "e5m2";
        default: return "i32";
    }
}

static DLDataType fx_dl_type(ap_dtype dtype) {
    DLDataType type = {kDLInt, 32, 1};
    switch (dtype) {
        case AP_DTYPE_F32: type = (DLDataType){kDLFloat, 32, 1}; break;
        case AP_DTYPE_BF16: type = (DLDataType){kDLBfloat, 16, 1}; break;
        case AP_DTYPE_F16: type = (DLDataType){kDLFloat, 16, 1}; break;
        case AP_DTYPE_FP8_E4M3: type = (DLDataType){AP_DL_FLOAT8_E4M3FN, 8, 1}; break;
        case AP_DTYPE_FP8_E5M2: type = (DLDataType){AP_DL_FLOAT8_E5M2, 8, 1}; break;
        default: break;
    }
    return type;
}

void fx_tensor_strided(fx_tensor *t, ap_dtype dtype, int ndim, const int64_t *shape,
                       int64_t last_dim_pad, uint64_t offset_elems) {
    memset(t, 0, sizeof *t);
    t->dtype = dtype;
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t->shape[d] = shape[d];
        t->strides[d] = stride;
        stride *= shape[d] + (d == ndim - 1 ? last_dim_pad : 0);
    }
    size_t elem = fx_dtype_bytes(dtype);
    t->bytes = ((size_t)stride + offset_elems) * elem;
    t->buffer = malloc(t->bytes > 0 ? t->bytes : 1);
    /* poison: padding and unwritten elements read as garbage, never as zeros */
    memset(t->buffer, 0xA5, t->bytes);
    t->dl.data = t->buffer;
    t->dl.device = (DLDevice){kDLCPU, 0};
    t->dl.ndim = ndim;
    t->dl.dtype = fx_dl_type(dtype);
    t->dl.shape = t->shape;
    t->dl.strides = (last_dim_pad != 0 || offset_elems != 0) ? t->strides : NULL;
    t->dl.byte_offset = offset_elems * elem;
}

void fx_tensor_make(fx_tensor *t, ap_dtype dtype, int ndim, const int64_t *shape) {
    fx_tensor_strided(t, dtype, ndim, shape, 0, 0);
}

void fx_tensor_free(fx_tensor *t) {
    free(t->buffer);
    memset(t, 0, sizeof *t);
}

static char *fx_tensor_at(const fx_tensor *t, const int64_t *index) {
    int64_t offset = 0;
    for (int d = 0; d < t->dl.ndim; d++) offset += index[d] * t->strides[d];
    return (char *)t->buffer + t->dl.byte_offset + (size_t)offset * fx_dtype_bytes(t->dtype);
}

void fx_encode(ap_dtype dtype, void *at, float value) {
    uint16_t half;
    uint8_t byte;
    switch (dtype) {
        case AP_DTYPE_F32: memcpy(at, &value, 4); break;
        case AP_DTYPE_BF16:
            half = ap_float_to_bf16(value);
            memcpy(at, &half, 2);
            break;
        case AP_DTYPE_F16:
            half = ap_float_to_f16(value);
            memcpy(at, &half, 2);
            break;
        case AP_DTYPE_FP8_E4M3:
            byte = ap_float_to_fp8_e4m3(value);
            memcpy(at, &byte, 1);
            break;
        case AP_DTYPE_FP8_E5M2:
            byte = ap_float_to_fp8_e5m2(value);
            memcpy(at, &byte, 1);
            break;
        default: {
            int32_t i = (int32_t)value;
            memcpy(at, &i, 4);
        }
    }
}

float fx_decode(ap_dtype dtype, const void *at) {
    uint16_t half;
    uint8_t byte;
    float f;
    int32_t i;
    switch (dtype) {
        case AP_DTYPE_F32: memcpy(&f, at, 4); return f;
        case AP_DTYPE_BF16: memcpy(&half, at, 2); return ap_bf16_to_float(half);
        case AP_DTYPE_F16: memcpy(&half, at, 2); return ap_f16_to_float(half);
        case AP_DTYPE_FP8_E4M3: memcpy(&byte, at, 1); return ap_fp8_e4m3_to_float(byte);
        case AP_DTYPE_FP8_E5M2: memcpy(&byte, at, 1); return ap_fp8_e5m2_to_float(byte);
        default: memcpy(&i, at, 4); return (float)i;
    }
}

float fx_round_to(ap_dtype dtype, float value) {
    unsigned char bytes[4];
    fx_encode(dtype, bytes, value);
    return fx_decode(dtype, bytes);
}

float fx_tensor_get(const fx_tensor *t, const int64_t *index) {
    return fx_decode(t->dtype, fx_tensor_at(t, index));
}

void fx_tensor_set(fx_tensor *t, const int64_t *index, float value) {
    fx_encode(t->dtype, fx_tensor_at(t, index), value);
}

int32_t *fx_tensor_i32(fx_tensor *t) {
    return (int32_t *)((char *)t->buffer + t->dl.byte_offset);
}

double fx_rel_l2(const double *got, const double *want, size_t count) {
    double diff = 0.0, norm = 0.0;
    for (size_t i = 0; i < count; i++) {
        diff += (got[i] - want[i]) * (got[i] - want[i]);
        norm += want[i] * want[i];
    }
    return norm > 0.0 ? sqrt(diff / norm) : sqrt(diff);
}

void fx_rope_table(fx_tensor *cos_sin) {
    int rotary_dim = (int)cos_sin->shape[1], half = rotary_dim / 2;
    for (int p = 0; p < (int)cos_sin->shape[0]; p++)
        for (int i = 0; i < half; i++) {
            double angle = p * pow(10000.0, -2.0 * i / rotary_dim);
            fx_tensor_set(cos_sin, (int64_t[]){p, i}, (float)cos(angle));
            fx_tensor_set(cos_sin, (int64_t[]){p, half + i}, (float)sin(angle));
        }
}

void fx_rope_naive(const fx_tensor *cos_sin, float *row, int rotary_dim, int is_neox, int pos) {
    int half = rotary_dim / 2;
    float rotated[1024];
    memcpy(rotated, row, sizeof(float) * (size_t)rotary_dim);
    for (int i = 0; i < half; i++) {
        int a = is_neox ? i : 2 * i, b = is_neox ? i + half : 2 * i + 1;
        float c = fx_tensor_get(cos_sin, (int64_t[]){pos, i});
        float s = fx_tensor_get(cos_sin, (int64_t[]){pos, half + i});
        rotated[a] = row[a] * c - row[b] * s;
        rotated[b] = row[b] * c + row[a] * s;
    }
    memcpy(row, rotated, sizeof(float) * (size_t)rotary_dim);
}
