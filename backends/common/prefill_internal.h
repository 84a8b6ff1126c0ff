/* prefill_internal.h: what the kit's prefill plan (host) and prefill kernel (device) share. */
#ifndef AP_COMMON_PREFILL_INTERNAL_H
#define AP_COMMON_PREFILL_INTERNAL_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* KV positions per unit of the plan's work estimate (the kernels' own tiles are 32 or 64). */
#define AP_KIT_PREFILL_TILE_KV 64

/* One work item, 16 bytes so the kernel reads it with one vector load. */
typedef struct ap_kit_prefill_item {
    int32_t seq;      /* sequence index in the batch */
    int32_t q_start;  /* first new token of the tile, counted from the sequence's first */
    int32_t kv_tiles; /* KV tiles the item visits: the sort key, longest first */
    int32_t unused;
} ap_kit_prefill_item;

/* Packed query rows per CTA the kernel was built with for these head dims, or 0 when none. */
int32_t ap_kit_prefill_default_tile_rows(int32_t head_dim_qk, int32_t head_dim_v);

/* 1 when a kernel with tile_rows rows per CTA was compiled for these head dims (benchmark builds
 * add variants), else 0. */
int32_t ap_kit_prefill_tile_rows_built(int32_t head_dim_qk, int32_t head_dim_v, int32_t tile_rows);

#ifdef __cplusplus
}
#endif

#endif /* AP_COMMON_PREFILL_INTERNAL_H */
