/* prefill_schedule.h: the Hopper prefill kernel's persistent tile order (prefill_hopper.cuh's
 * tile_at), as plain C usable on the host (tests/kit/test_prefill_schedule.c, which holds the
 * order's plain reference, one tile index at a time) and the device. Tiles are (plan item, query
 * head) pairs. They come in bands of `band_kv` K/V heads (the band's query heads are whole groups
 * of `group`), band after band; in a band, the plan's items in order (longest first), and for each
 * item the band's heads, fastest. */
#ifndef AP_COMMON_PREFILL_SCHEDULE_H
#define AP_COMMON_PREFILL_SCHEDULE_H

#ifdef __CUDACC__
#define AP_KIT_HD __host__ __device__
#else
#define AP_KIT_HD
#endif

/* The band (K/V heads) of a launch of num_items items over a g-CTA grid, group head slots per
 * K/V head: `base`, grown so that a band holds at least g tiles (num_items x band x group): a
 * band runs on rounds of its own (ap_hopper_round_tile), so a band of fewer tiles than CTAs would
 * leave the rest of each of its rounds idle (a few short sequences packed in bands of one ran 8
 * bands in 8 rounds of a few CTAs: H100, 2026-11-27). */
AP_KIT_HD static inline int ap_hopper_band_kv(int base, int num_items, int g, int group) {
    const long long per_kv = (long long)num_items * (group > 0 ? group : 1);
    const long long need = per_kv > 0 ? (g + per_kv - 1) / per_kv : 1;
    return need > base ? (int)need : base;
}

/* The order's bands: a full band's query heads (band_kv K/V heads' groups, at most all), band
 * b's own (the last may hold fewer), and band b's tile u as (item, head): items in order, the
 * band's heads fastest. */
AP_KIT_HD static inline int ap_hopper_band_heads(int num_qo_heads, int group, int band_kv) {
    return group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
}
AP_KIT_HD static inline int ap_hopper_band_nh(int b, int band, int num_qo_heads) {
    return num_qo_heads - b * band < band ? num_qo_heads - b * band : band;
}
AP_KIT_HD static inline void ap_hopper_band_tile(int b, int band, int nh, int u, int *item,
                                                 int *head) {
    *item = u / nh;
    *head = b * band + (u - *item * nh);
}

/* The persistent grid's tile for CTA c of g in round r, each band on rounds of its own: band b
 * (items x nh heads) takes rounds b R .. b R + R_b - 1, R = ceil(items x
 * band / g) the rounds of a full band and R_b those of band b, and in its round rb the CTA takes
 * the band's tile rb g + c (rb even) or rb g + g - 1 - c (rb odd), a snake. So each band's
 * longest-first order is balanced over the CTAs on its own, and the sum of the bands is too
 * (running the bands back to back in one order mixed a band's last, shortest tiles with the
 * next band's longest in a round, and the snake then left a fifth of the SM time idle at the
 * end: H100, 2026-11-27). Returns 1 with (item, head); 0 where the band's last round has no
 * tile for this CTA; -1 past the last round. */
AP_KIT_HD static inline int ap_hopper_round_tile(int r, int c, int g, int num_items,
                                                 int num_qo_heads, int group, int band_kv,
                                                 int *item, int *head) {
    /* int throughout: ap_kit_prefill_hopper_run refuses more than INT32_MAX / 2 tiles */
    const int band = ap_hopper_band_heads(num_qo_heads, group, band_kv);
    const int bands = (num_qo_heads + band - 1) / band;
    const int full = (num_items * band + g - 1) / g; /* rounds of a full band */
    const int b = full > 0 && r / full < bands ? r / full : bands - 1;
    const int nh = ap_hopper_band_nh(b, band, num_qo_heads);
    const int rb = r - b * full;
    if (rb * g >= num_items * nh) {
        return -1; /* b is the last band here, and its rounds are over */
    }
    const int t = rb * g + ((rb & 1) ? g - 1 - c : c);
    if (t >= num_items * nh) {
        return 0;
    }
    ap_hopper_band_tile(b, band, nh, t, item, head);
    return 1;
}

/* The order's tile t itself (the dynamic schedule: prefill_hopper.cuh's claim_load, whose CTAs
 * take the tiles one at a time from a counter in this order): band after band, in a band the
 * items in order and the band's heads fastest, as ap_hopper_round_tile's bands without its
 * rounds. Returns 1 with (item, head), -1 for t outside 0 .. num_items x num_qo_heads - 1. */
AP_KIT_HD static inline int ap_hopper_queue_tile(int t, int num_items, int num_qo_heads, int group,
                                                 int band_kv, int *item, int *head) {
    if (t < 0 || t >= num_items * num_qo_heads) {
        return -1;
    }
    const int band = ap_hopper_band_heads(num_qo_heads, group, band_kv);
    const int b = t / (num_items * band);
    ap_hopper_band_tile(b, band, ap_hopper_band_nh(b, band, num_qo_heads), t - b * band * num_items,
                        item, head);
    return 1;
}

#endif
