/* prefill_hopper.h: the kit's Hopper prefill path (prefill_hopper.cu): the plan and the run reach
 * it when the shape, the build (sm_90a machine code) and the current device (sm_90) allow it;
 * the mma.sync kernel (prefill_kernel.cu) serves everything else. */
#ifndef AP_COMMON_PREFILL_HOPPER_H
#define AP_COMMON_PREFILL_HOPPER_H

#include "prefill.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Packed query rows per CTA of the Hopper kernel for this plan: 128 / pack tokens of one sequence
 * times the group, so its items are (128 / pack)-token tiles, pack the query heads of a group a
 * work tile holds (the largest power of two dividing the group: a group of 4 gives tiles of 32
 * tokens x 4 heads, 128 rows); 192 for 128 at head dim 64 over the ragged source (three consumer
 * warpgroups: tiles of 48 tokens x 4 heads). 0 where it does not serve: today args'
 * kv_dtype BF16 or F16 (the caller says so; unset keeps the mma.sync kernel), a ragged K/V
 * source with head dims 128 / 128, 64 / 64, 256 / 256 or 192 / 128 (MLA's MHA form) or a paged
 * one with head dims 128 / 128 or 64 / 64 and a page size that is a power of two >= 8, a build with sm_90a code and a current
 * device of compute capability 9.0. Its plans then run only calls with Q, K and V of that 16-bit type. */
int32_t ap_kit_prefill_hopper_tile_rows(const ap_kit_prefill_plan_args *args);

/* Runs one layer of a plan built for the Hopper kernel (plan->hopper). Same contract as
 * ap_kit_prefill_run, which hands such plans here. */
ap_status ap_kit_prefill_hopper_run(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                                    void *stream, const char *who, ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* AP_COMMON_PREFILL_HOPPER_H */
