/* plan.c: how a decode batch is cut: rows per CTA and KV splits, from the batch's size alone. */
#include "mla.h"

int32_t mla_decode_block_rows(int32_t num_heads, int32_t max_q_len) {
    return num_heads * max_q_len <= 16 ? 16 : 64;
}

/* A CTA holds ~230 KB of shared memory, so one runs per SM: with fewer (sequence, row block)
 * pairs than SMs, each pair's KV tiles are cut into as many splits as fill the SMs once. The
 * count depends on the batch's size, never its lengths, so a captured graph stays valid; each CTA
 * finds its tiles on the device. ctas * splits <= sm_count bounds the partial-state workspace. */
int32_t mla_decode_num_splits(int32_t num_seqs, int32_t num_heads, int32_t max_q_len,
                              int32_t sm_count, int32_t max_splits) {
    const int32_t m = mla_decode_block_rows(num_heads, max_q_len);
    const int64_t ctas = (int64_t)num_seqs * ((num_heads * max_q_len + m - 1) / m);
    if (ctas <= 0 || ctas >= sm_count) return 1;
    int64_t s = sm_count / ctas;
    if (s > max_splits) s = max_splits;
    return s < 1 ? 1 : (int32_t)s;
}
