/* test_prefill_schedule.c: the Hopper prefill kernel's persistent tile order
 * (backends/common/prefill_schedule.h) on the host, over many shapes: the order's reference
 * (band_tile) gives every (item, head) tile exactly once; bands of whole groups, band after band,
 * never more than band_kv K/V heads; in a band the plan's items in order and, per item, the band's
 * heads one after another. And the kernel's rounds (ap_hopper_round_tile) over grids of several
 * sizes: every tile exactly once and where the reference puts it, a round's tiles all of one
 * band, a band's rounds in its order with the snake, the bands' rounds back to back, and no tile
 * after a CTA's end; the dynamic schedule's tile by index (ap_hopper_queue_tile) equal to the
 * reference's, none past the last; and the band's growth to the grid (ap_hopper_band_kv). */
#include <stdio.h>
#include <stdlib.h>

#include "backends/common/prefill_schedule.h"
#include "tests/common/test_expect.h"

/* The order's reference (prefill_schedule.h): tile t (0 <= t < num_items * num_qo_heads), its plan
 * item and query head. num_qo_heads is a multiple of group; band_kv >= 1. */
static void band_tile(int t, int num_items, int num_qo_heads, int group, int band_kv, int *item,
                      int *head) {
    const int band = group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
    const int h0 = t / (num_items * band) * band;                       /* the band's first head */
    const int u = t - h0 * num_items;                                   /* t's index in its band */
    const int nh = band < num_qo_heads - h0 ? band : num_qo_heads - h0; /* the last may be short */
    *item = u / nh;
    *head = h0 + (u - *item * nh);
}

static void check_shape(int num_items, int num_qo_heads, int group, int band_kv) {
    const int tiles = num_items * num_qo_heads;
    unsigned char *seen = calloc((size_t)tiles, 1);
    if (seen == NULL) {
        failures++;
        return;
    }
    const int band = group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
    int prev_item = -1, prev_head = -1, band_start = 0, bad = 0;
    for (int t = 0; t < tiles && bad < 3; t++) {
        int item = -1, head = -1, q_item = -1, q_head = -1;
        band_tile(t, num_items, num_qo_heads, group, band_kv, &item, &head);
        /* the dynamic schedule's tile t: the order itself */
        const int q =
            ap_hopper_queue_tile(t, num_items, num_qo_heads, group, band_kv, &q_item, &q_head);
        bad += q != 1 || q_item != item || q_head != head;
        EXPECT(q == 1 && q_item == item && q_head == head,
               "items %d heads %d/%d band %d: queue tile %d -> %d (%d, %d), the order (%d, %d)",
               num_items, num_qo_heads, group, band_kv, t, q, q_item, q_head, item, head);
        if (item < 0 || item >= num_items || head < 0 || head >= num_qo_heads) {
            EXPECT(0, "items %d heads %d/%d band %d: tile %d -> (%d, %d) out of range", num_items,
                   num_qo_heads, group, band_kv, t, item, head);
            bad++;
            continue;
        }
        if (seen[item * num_qo_heads + head]++) {
            EXPECT(0, "items %d heads %d/%d band %d: (%d, %d) twice", num_items, num_qo_heads,
                   group, band_kv, item, head);
            bad++;
        }
        /* the band of this tile: heads [h0, h0 + nh), h0 a multiple of the band (whole groups) */
        const int h0 = head / band * band;
        const int nh = num_qo_heads - h0 < band ? num_qo_heads - h0 : band;
        if (t == 0 || h0 != prev_head / band * band) {
            /* a new band starts where the previous one's tiles ended, at its first item and head */
            EXPECT(item == 0 && head == h0 && t == band_start,
                   "items %d heads %d/%d band %d: tile %d opens band %d at (%d, %d)", num_items,
                   num_qo_heads, group, band_kv, t, h0, item, head);
            EXPECT(t == 0 || h0 > prev_head, "bands out of order at tile %d", t);
            band_start = t + num_items * nh;
        } else if (head == h0) {
            EXPECT(item == prev_item + 1 && prev_head == h0 + nh - 1,
                   "items %d heads %d/%d band %d: tile %d: item %d after (%d, %d)", num_items,
                   num_qo_heads, group, band_kv, t, item, prev_item, prev_head);
        } else {
            EXPECT(item == prev_item && head == prev_head + 1,
                   "items %d heads %d/%d band %d: tile %d: (%d, %d) after (%d, %d)", num_items,
                   num_qo_heads, group, band_kv, t, item, head, prev_item, prev_head);
        }
        EXPECT(nh % group == 0 && nh / group <= band_kv, "band of %d heads (group %d, %d K/V)", nh,
               group, band_kv);
        prev_item = item;
        prev_head = head;
    }
    int item = -1, head = -1;
    EXPECT(
        ap_hopper_queue_tile(tiles, num_items, num_qo_heads, group, band_kv, &item, &head) == -1 &&
            ap_hopper_queue_tile(tiles + 7, num_items, num_qo_heads, group, band_kv, &item,
                                 &head) == -1 &&
            ap_hopper_queue_tile(-1, num_items, num_qo_heads, group, band_kv, &item, &head) == -1,
        "items %d heads %d/%d band %d: a queue tile past the last", num_items, num_qo_heads, group,
        band_kv);
    for (int i = 0; i < tiles && bad == 0; i++)
        if (!seen[i]) {
            EXPECT(0, "items %d heads %d/%d band %d: (%d, %d) never", num_items, num_qo_heads,
                   group, band_kv, i / num_qo_heads, i % num_qo_heads);
            bad++;
        }
    free(seen);
}

/* The rounds of a g-CTA grid over that order. */
static void check_rounds(int num_items, int num_qo_heads, int group, int band_kv, int g) {
    const int tiles = num_items * num_qo_heads;
    unsigned char *seen = calloc((size_t)tiles + 1, 1);
    if (seen == NULL) {
        failures++;
        return;
    }
    const int band = group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
    int bad = 0, done = 0, prev_band = 0, band_round = 0, rounds = 0;
    /* the rounds each band needs, back to back */
    for (int h0 = 0; h0 < num_qo_heads; h0 += band) {
        const int nh = num_qo_heads - h0 < band ? num_qo_heads - h0 : band;
        rounds += (num_items * nh + g - 1) / g;
    }
    for (int r = 0; r < rounds + 3 && bad < 3; r++) {
        int round_band = -1, ended = 0;
        for (int c = 0; c < g && bad < 3; c++) {
            int item = -1, head = -1;
            const int k = ap_hopper_round_tile(r, c, g, num_items, num_qo_heads, group, band_kv,
                                               &item, &head);
            if (k < 0) {
                ended++;
                continue;
            }
            if (r >= rounds) {
                EXPECT(0, "items %d heads %d/%d band %d grid %d: round %d of %d gives %d",
                       num_items, num_qo_heads, group, band_kv, g, r, rounds, k);
                bad++;
                continue;
            }
            if (k == 0) continue;
            if (item < 0 || item >= num_items || head < 0 || head >= num_qo_heads ||
                seen[item * num_qo_heads + head]++) {
                EXPECT(0, "items %d heads %d/%d band %d grid %d: round %d CTA %d -> (%d, %d)",
                       num_items, num_qo_heads, group, band_kv, g, r, c, item, head);
                bad++;
                continue;
            }
            done++;
            const int b = head / band;
            if (round_band < 0) round_band = b;
            bad += b != round_band;
            EXPECT(b == round_band, "round %d mixes bands %d and %d", r, round_band, b);
            if (b != prev_band) {
                bad += b != prev_band + 1;
                EXPECT(b == prev_band + 1, "band %d after band %d at round %d", b, prev_band, r);
                prev_band = b;
                band_round = r;
            }
            /* the tile's index in its band: the snake of the band's round */
            const int nh = num_qo_heads - b * band < band ? num_qo_heads - b * band : band;
            const int rb = r - band_round;
            const int want = rb * g + ((rb & 1) ? g - 1 - c : c);
            int ref_item = -1, ref_head = -1; /* the band order's own mapping of that tile */
            band_tile(b * band * num_items + want, num_items, num_qo_heads, group, band_kv,
                      &ref_item, &ref_head);
            bad += ref_item != item || ref_head != head;
            EXPECT(ref_item == item && ref_head == head,
                   "round %d CTA %d: (%d, %d), the band order says (%d, %d)", r, c, item, head,
                   ref_item, ref_head);
            bad += item * nh + (head - b * band) != want;
            EXPECT(item * nh + (head - b * band) == want,
                   "items %d heads %d/%d band %d grid %d: round %d CTA %d: band tile %d, not %d",
                   num_items, num_qo_heads, group, band_kv, g, r, c, item * nh + head - b * band,
                   want);
        }
        bad += (ended == 0) != (r < rounds) || (ended == g) != (r >= rounds);
        EXPECT((ended == 0) == (r < rounds) && (ended == g) == (r >= rounds),
               "items %d heads %d/%d band %d grid %d: round %d of %d: %d CTAs ended", num_items,
               num_qo_heads, group, band_kv, g, r, rounds, ended);
    }
    EXPECT(bad > 0 || done == tiles, "items %d heads %d/%d band %d grid %d: %d tiles of %d",
           num_items, num_qo_heads, group, band_kv, g, done, tiles);
    free(seen);
}

/* ap_hopper_band_kv over a g-CTA grid: every band but the last holds at least g tiles (when the
 * launch has that many), so only a band's last round can leave CTAs idle, and the rounds are at
 * most ceil(tiles / g) + bands - 1. */
static void check_band_growth(int num_items, int num_qo_heads, int group, int base, int g) {
    const int band_kv = ap_hopper_band_kv(base, num_items, g, group);
    const int band = group * band_kv < num_qo_heads ? group * band_kv : num_qo_heads;
    const int bands = (num_qo_heads + band - 1) / band, tiles = num_items * num_qo_heads;
    int rounds = 0;
    for (int h0 = 0; h0 < num_qo_heads; h0 += band) {
        const int nh = num_qo_heads - h0 < band ? num_qo_heads - h0 : band;
        EXPECT(h0 + band >= num_qo_heads || num_items * nh >= g,
               "items %d heads %d/%d base %d grid %d: band of %d K/V heads holds %d tiles",
               num_items, num_qo_heads, group, base, g, band_kv, num_items * nh);
        rounds += (num_items * nh + g - 1) / g;
    }
    EXPECT(band_kv >= base && rounds <= (tiles + g - 1) / g + bands - 1,
           "items %d heads %d/%d base %d grid %d: band %d, %d rounds for %d tiles", num_items,
           num_qo_heads, group, base, g, band_kv, rounds, tiles);
}

int main(void) {
    static const int heads[] = {1, 2, 4, 8, 12, 20, 24, 32, 40, 64, 96, 128};
    static const int groups[] = {1, 2, 3, 4, 8, 16};
    static const int bands[] = {1, 3, 8, 64};
    int shapes = 0;
    for (int items = 1; items <= 37; items += 4)
        for (size_t h = 0; h < sizeof heads / sizeof heads[0]; h++)
            for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++) {
                if (heads[h] % groups[g] != 0) continue;
                for (size_t b = 0; b < sizeof bands / sizeof bands[0]; b++) {
                    check_shape(items, heads[h], groups[g], bands[b]);
                    for (int grid = 1; grid <= 133; grid += grid < 8 ? 3 : 62)
                        check_rounds(items, heads[h], groups[g], bands[b], grid);
                    shapes++;
                }
            }
    /* the shapes of the H100 runs: 128 items x H32/8 (one band), H32/32 (four), MLA's H128/128 */
    check_shape(128, 32, 4, 8);
    check_shape(128, 32, 1, 8);
    check_shape(32, 128, 1, 8);
    for (int items = 1; items <= 600; items += items < 16 ? 1 : 97)
        for (int g = 1; g <= 132; g += 13)
            for (int base = 1; base <= 8; base *= 8) {
                check_band_growth(items, 8, 1, base, g); /* packed H32/8: 8 slots */
                check_band_growth(items, 32, 4, base, g);
                check_band_growth(items, 40, 5, base, g);
            }
    /* the engine's four short packed sequences: 8 items x 8 slots on 64 CTAs, one round */
    EXPECT(ap_hopper_band_kv(1, 8, 64, 1) == 8, "engine batch band %d",
           ap_hopper_band_kv(1, 8, 64, 1));
    check_rounds(128, 32, 4, 8, 132);
    check_rounds(512, 8, 1, 1, 132); /* packed: H32/8 as 8 head slots, bands of one */
    check_rounds(32, 128, 1, 8, 132);
    printf("%d shapes: %s\n", shapes + 3, failures == 0 ? "ok" : "FAILED");
    return failures != 0;
}
