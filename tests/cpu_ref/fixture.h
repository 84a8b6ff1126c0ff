/* fixture.h: what the cpu_ref tests share: the plugin opened directly, seeded random numbers,
 * host tensors written and read independently of the plugin's own code. */
#ifndef AP_TEST_CPU_REF_FIXTURE_H
#define AP_TEST_CPU_REF_FIXTURE_H

#include <stdint.h>

#include "plugin_api.h"

/* The plugin, opened with dlopen from $AP_CPU_REF_PLUGIN and negotiated at ABI 1.0. */
typedef struct fx_plugin {
    void *handle;
    ap_plugin_negotiate_fn negotiate;
    const ap_descriptor *descriptor;
    const ap_vtable *vt;
} fx_plugin;

int fx_plugin_open(fx_plugin *plugin); /* 0 on success; prints why not */
void fx_plugin_close(fx_plugin *plugin);

/* A message buffer on the stack of a test. */
typedef struct fx_msg {
    ap_msgbuf buf;
    char text[2048];
} fx_msg;
void fx_msg_init(fx_msg *msg);

/* Random numbers: one seed per run, printed (AP_TEST_SEED=N replays it). */
uint64_t fx_seed_init(void);
uint64_t fx_rand_u64(void);
double fx_rand_uniform(double lo, double hi); /* never exactly 0 */
int fx_rand_int(int lo, int hi);              /* inclusive */

/* A host tensor owning its buffer. Dense unless made with fx_tensor_strided. */
typedef struct fx_tensor {
    DLTensor dl;
    int64_t shape[4];
    int64_t strides[4];
    void *buffer;
    size_t bytes;
    ap_dtype dtype; /* AP_DTYPE_NONE for int32 */
} fx_tensor;

size_t fx_dtype_bytes(ap_dtype dtype); /* AP_DTYPE_NONE: int32 */
void fx_tensor_make(fx_tensor *t, ap_dtype dtype, int ndim, const int64_t *shape);
/* Each dim's stride is the dense one times `pad` extra elements in the last dim, and the data
 * starts `offset_elems` elements into the buffer through byte_offset. */
void fx_tensor_strided(fx_tensor *t, ap_dtype dtype, int ndim, const int64_t *shape,
                       int64_t last_dim_pad, uint64_t offset_elems);
void fx_tensor_free(fx_tensor *t);
float fx_tensor_get(const fx_tensor *t, const int64_t *index);
void fx_tensor_set(fx_tensor *t, const int64_t *index, float value); /* rounds to dtype */
int32_t *fx_tensor_i32(fx_tensor *t);                                /* dense int32 data */

/* One value rounded to a dtype and read back (fp8 without any scale, saturating). */
float fx_round_to(ap_dtype dtype, float value);
/* Encode/decode one element into/from raw bytes. */
void fx_encode(ap_dtype dtype, void *at, float value);
float fx_decode(ap_dtype dtype, const void *at);
const char *fx_dtype_name(ap_dtype dtype);

/* RoPE, naively: cos_sin [max_position][rotary_dim] float32 gets row p = cos(p * f_i) for
 * i < rotary_dim/2, then sin(p * f_i), f_i = 10000^(-2i/rotary_dim); fx_rope_naive rotates
 * row[0 .. rotary_dim) at position pos, pair (a, b) = (i, i + rot/2) for neox, (2i, 2i + 1)
 * otherwise: a' = a*c - b*s, b' = b*c + a*s in float32. */
void fx_rope_table(fx_tensor *cos_sin);
void fx_rope_naive(const fx_tensor *cos_sin, float *row, int rotary_dim, int is_neox, int pos);

/* sqrt(sum (got - want)^2) / sqrt(sum want^2) */
double fx_rel_l2(const double *got, const double *want, size_t count);

#endif /* AP_TEST_CPU_REF_FIXTURE_H */
