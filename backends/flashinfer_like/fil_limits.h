/* fil_limits.h: what flashinfer_like serves, stated once: the caps (plugin.c), validate() and the
 * kernels' launchers read it. */
#ifndef AP_FIL_LIMITS_H
#define AP_FIL_LIMITS_H

#include <stdint.h>

/* Head dims with a compiled kernel (qk and v equal). */
#define FIL_HEAD_DIMS 64, 128, 256
#define FIL_HEAD_DIMS_TEXT "64, 128 or 256"

/* Page sizes: powers of two, so decode splits a position into page and offset by a shift
 * (extend takes any page size; the intersection is what the caps publish). */
#define FIL_PAGE_SIZES 1, 2, 4, 8, 16, 32, 64, 128
#define FIL_PAGE_SIZES_TEXT "a power of two from 1 to 128"

/* Query heads per KV head: one group is the rows of one decode warp's (or extend CTA's) MMAs. */
#define FIL_MAX_GROUP 8

/* NVFP4 KV: extend stages the batch's pages as 16-bit (extend_nvfp4.c); decode reads nvfp4 only
 * once decode.cu does (FIL_NVFP4_DECODE 1). Until then validate() refuses nvfp4 for a model
 * that decodes (every model but an embedding one), and decode's workspace is sized as fp8's. */
#define FIL_NVFP4_DECODE 0

static inline int fil_head_dim_served(int32_t head_dim) {
    static const int32_t dims[] = {FIL_HEAD_DIMS};
    for (unsigned i = 0; i < sizeof dims / sizeof dims[0]; i++)
        if (dims[i] == head_dim) return 1;
    return 0;
}

static inline int fil_page_size_served(int32_t page_size) {
    static const int32_t sizes[] = {FIL_PAGE_SIZES};
    for (unsigned i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] == page_size) return 1;
    return 0;
}

#endif /* AP_FIL_LIMITS_H */
