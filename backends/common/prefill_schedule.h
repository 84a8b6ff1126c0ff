/* prefill_schedule.h: the Hopper prefill kernel's persistent tile order (prefill_hopper.cuh's
 * tile_at), as plain C usable on the host (tests/kit/test_prefill_schedule.c) and the device.
 * Tiles are (plan item, query head) pairs. They come in bands of `band_kv` K/V heads (the band's
 * query heads are whole groups of `group`), band after band; in a band, the plan's items in
 * order (longest first), and for each item the band's heads, fastest. */
#ifndef AP_COMMON_PREFILL_SCHEDULE_H
#define AP_COMMON_PREFILL_SCHEDULE_H

#ifdef __CUDACC__
#define AP_KIT_HD __host__ __device__
#else
#define AP_KIT_HD
#endif

/* Tile t (0 <= t < num_items * num_qo_heads) of that order: its plan item and query head.
 * num_qo_heads is a multiple of group; band_kv >= 1. */
AP_KIT_HD static inline void ap_hopper_band_tile(int t, int num_items, int num_qo_heads, int group,
                                                 int band_kv, int *item, int *head) {
    const int band = group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
    const int h0 = t / (num_items * band) * band;                       /* the band's first head */
    const int u = t - h0 * num_items;                                   /* t's index in its band */
    const int nh = band < num_qo_heads - h0 ? band : num_qo_heads - h0; /* the last may be short */
    *item = u / nh;
    *head = h0 + (u - *item * nh);
}

#endif
