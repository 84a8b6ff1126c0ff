/* plan.c: how a decode batch is cut: row blocks and KV splits, from the batch's shape alone. */
#include "mha.h"

int32_t mha_decode_row_blocks(int32_t group, int32_t max_q_len) {
    int32_t rows = group * (max_q_len > 0 ? max_q_len : 1);
    return (rows + MHA_BLOCK_ROWS - 1) / MHA_BLOCK_ROWS;
}

/* A batch with fewer CTAs than SMs has each CTA's KV tiles cut into as many splits as cover the
 * SMs twice (two CTAs fit an SM's shared memory for every variant). The count depends on the
 * batch's shape, never its lengths, so a captured graph stays valid; each CTA finds its tiles on
 * the device. ctas * splits <= 2 * sm_count bounds the partial-state workspace. */
int32_t mha_decode_num_splits(int32_t num_seqs, int32_t num_kv_heads, int32_t group,
                              int32_t max_q_len, int32_t sm_count, int32_t max_splits) {
    const int64_t ctas = (int64_t)num_seqs * num_kv_heads * mha_decode_row_blocks(group, max_q_len);
    if (ctas <= 0 || ctas >= sm_count) return 1;
    int64_t s = 2 * (int64_t)sm_count / ctas;
    if (s > max_splits) s = max_splits;
    return s < 1 ? 1 : (int32_t)s;
}
