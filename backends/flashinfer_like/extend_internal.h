/* extend_internal.h: what the extend plan (host) and the extend kernel (device) share. */
#ifndef AP_FIL_EXTEND_INTERNAL_H
#define AP_FIL_EXTEND_INTERNAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* KV positions per unit of the plan's work estimate (the kernels' own tiles are 32 or 64). */
#define FIL_EXTEND_TILE_KV 64

/* One work item, 16 bytes so the kernel reads it with one vector load. */
typedef struct fil_extend_item {
    int32_t seq;      /* sequence index in the batch */
    int32_t q_start;  /* first new token of the tile, counted from the sequence's first */
    int32_t kv_tiles; /* KV tiles the item visits: the sort key, longest first */
    int32_t unused;
} fil_extend_item;

/* Packed query rows per CTA the kernel was built with for head_dim, or 0 when none. */
int32_t fil_extend_default_tile_rows(int32_t head_dim);

/* 1 when a kernel with tile_rows rows per CTA was compiled for head_dim (benchmark builds add
 * variants), else 0. */
int32_t fil_extend_tile_rows_built(int32_t head_dim, int32_t tile_rows);

#ifdef __cplusplus
}
#endif

#endif /* AP_FIL_EXTEND_INTERNAL_H */
