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

/* Split-KV (prefill.h, ap_kit_prefill_plan_args.split_space): parts of at least
 * AP_KIT_PREFILL_SPLIT_KEYS keys, at most AP_KIT_PREFILL_MAX_SPLITS of them. */
#define AP_KIT_PREFILL_SPLIT_KEYS 512
#define AP_KIT_PREFILL_MAX_SPLITS 16

/* The parts each work tile's keys are cut into for a launch of `tiles` work tiles on `sms` SMs
 * whose longest tile reads `longest_keys` keys: as many as fit the SMs beside the tiles
 * (sms / tiles, so the parts run in one wave), no more than the longest keys hold parts of
 * AP_KIT_PREFILL_SPLIT_KEYS, no more than AP_KIT_PREFILL_MAX_SPLITS; 1 (no split) below 2. */
int32_t ap_kit_prefill_split_count(int64_t tiles, int64_t longest_keys, int32_t sms);

/* A Hopper plan's parts (ap_kit_prefill_split_count over its work tiles, items x head slots, on
 * the current device's SMs), the plan's items built and sorted (the longest first: its kv_tiles
 * give longest_keys); 1 without a device. prefill_hopper.cu. */
struct ap_kit_prefill_plan;
int32_t ap_kit_prefill_hopper_splits(const struct ap_kit_prefill_plan *plan, int64_t longest_keys);

/* Packed query rows per CTA the kernel was built with for these head dims, or 0 when none. */
int32_t ap_kit_prefill_default_tile_rows(int32_t head_dim_qk, int32_t head_dim_v);

/* 1 when a kernel with tile_rows rows per CTA was compiled for these head dims (benchmark builds
 * add variants), else 0. */
int32_t ap_kit_prefill_tile_rows_built(int32_t head_dim_qk, int32_t head_dim_v, int32_t tile_rows);

#ifdef __cplusplus
}
#endif

#endif /* AP_COMMON_PREFILL_INTERNAL_H */
