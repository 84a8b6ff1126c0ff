/* plan.c: how a decode batch is cut (row blocks and KV splits, from the batch's shape alone), and
 * which kernel a short extend takes. */
#include "mha.h"

/* One warp's 16 rows per (sequence, KV head) leave three warps of a 4-warp CTA idle in a
 * GQA decode (group <= 16): they take other keys of each step instead, and the states merge at
 * the end. D = 256 stages of 4 x 32 keys would not fit twice in shared memory: 2 there. */
int32_t mha_decode_key_warps(int32_t group, int32_t max_q_len, int32_t head_dim) {
    const int32_t rows = group * (max_q_len > 0 ? max_q_len : 1);
    if (rows <= 16 && head_dim <= 128) return 4;
    return rows <= 32 ? 2 : 1;
}

int32_t mha_decode_row_blocks(int32_t group, int32_t max_q_len, int32_t key_warps) {
    const int32_t rows = group * (max_q_len > 0 ? max_q_len : 1);
    const int32_t block = MHA_BLOCK_ROWS / key_warps;
    return (rows + block - 1) / block;
}

/* The CTAs of one wave: `slots` = CTAs resident per SM x SMs. A batch with fewer CTAs than a wave,
 * or whose last wave would run mostly empty, has each CTA's KV tiles cut into s splits. When one
 * wave of s = slots / ctas splits is >= 85% full, that s: every CTA fills and drains its ring
 * once, so a second wave of smaller CTAs only adds fills (B1 L8192 H8 on 132 slots: 16 splits of
 * 4 stages in one wave, not 29 of 2-3 stages in 1.76 waves); none when the CTAs alone fill one
 * wave >= 85%. Else the smallest s that fills at
 * least one wave with the last wave >= 85% full (B64 L4096 H8: 512 CTAs on 396 slots run 1.3
 * waves; 2 splits make 2.6, 3 make 3.9). The count depends on the batch's shape, never its
 * lengths, so a captured graph stays valid; each CTA finds its tiles on the device.
 * ctas * s * heads_per_cta <= MHA_SPLIT_WAVES * slots whenever s > 1 bounds the partial-state
 * workspace (a partial slot per (sequence, KV head, split); v2h's CTAs take two KV heads). */
int32_t mha_decode_num_splits(int32_t num_seqs, int32_t num_kv_heads, int32_t group,
                              int32_t max_q_len, int32_t head_dim, int32_t slots,
                              int32_t max_splits, int32_t heads_per_cta) {
    const int32_t kw = mha_decode_key_warps(group, max_q_len, head_dim);
    const int32_t hpc = heads_per_cta == 2 ? 2 : 1; /* partial slots per CTA and split */
    const int64_t ctas =
        (int64_t)num_seqs * (num_kv_heads / hpc) * mha_decode_row_blocks(group, max_q_len, kw);
    if (ctas <= 0 || slots <= 0) return 1;
    /* A batch that fills one wave >= 85% already runs unsplit: no second wave, no combine (H100,
     * 2026-11-27: nvfp4 B64 L4096, 512 CTAs in 528 slots, 0.1280 ms unsplit against 0.1358 ms
     * in 2 splits, the count chosen before this rule: 2 waves, also >= 85% full). Two-head CTAs
     * count twice: 256 of them at B64 ran 0.1204-0.1211 ms unsplit, 0.1293-0.1307 in 2 splits. */
    if (ctas < slots && ctas * hpc * 100 >= (int64_t)slots * 85) return 1;
    if (ctas < slots) {
        /* the wave of splits, two-head CTAs again counting twice (B8 L32768 v2h: 32 CTAs x 8,
         * 0.1258-0.1273 ms on the H100, 2026-11-27, against 0.1307 with x 16) */
        const int64_t units = ctas * hpc;
        const int64_t one_wave = slots / units < max_splits ? slots / units : max_splits;
        if (one_wave > 1 && units * one_wave * 100 >= (int64_t)slots * 85 &&
            ctas * one_wave * hpc <= (int64_t)MHA_SPLIT_WAVES * slots)
            return (int32_t)one_wave;
    }
    int32_t best = 1;
    double best_fill = 0.0;
    for (int32_t s = 1; s <= max_splits; s++) {
        const int64_t total = ctas * s;
        if (s > 1 && total * hpc > (int64_t)MHA_SPLIT_WAVES * slots) break;
        const int64_t waves = (total + slots - 1) / slots;
        const double fill = (double)total / (double)(waves * slots);
        if (total >= slots && fill >= 0.85) return s;
        if (fill > best_fill + 1e-9) {
            best_fill = fill;
            best = s;
        }
    }
    return best;
}

/* v2h: one CTA over KV heads 2j and 2j + 1 (decode.cu, decode_keys_m.cuh), auto's kernel where
 * the keys-on-M v2 would run (nvfp4, D = 128, <= 8 rows per KV head) and the heads pair up (H100,
 * 2026-11-27: B64 L4096 H32/8 0.1204-0.1211 ms unsplit against v2's 0.1290, B8 L32768 0.1312
 * against 0.1373, B256 L1024 0.1258 against 0.1340). */
int32_t mha_decode_heads_per_cta(ap_dtype kv_dtype, int32_t head_dim, int32_t group,
                                 int32_t max_q_len, int32_t num_kv_heads, int32_t keys_m) {
    const int32_t rows = group * (max_q_len > 0 ? max_q_len : 1);
    return keys_m == MHA_KEYS_M_AUTO && kv_dtype == AP_DTYPE_NVFP4 && head_dim == 128 &&
                   rows >= 1 && rows <= 8 && num_kv_heads > 0 && num_kv_heads % 2 == 0
               ? 2
               : 1;
}

int32_t mha_decode_keys_m_for(int32_t keys_m, int32_t heads_per_cta) {
    if (heads_per_cta == 2) return MHA_KEYS_M_V2H;
    return keys_m == MHA_KEYS_M_V2 || keys_m == MHA_KEYS_M_V2H ? MHA_KEYS_M_AUTO : keys_m;
}

/* With more than 16 rows per (sequence, KV head) the decode kernel splits its CTA's four warps by
 * rows, not keys (two or one key warps) and slows by a third, while the kit's prefill with its
 * split-KV plan runs such a batch in about the time of 4 new tokens. H200, 2026-11-28 (call 159;
 * 32 / 8 heads, D128, bf16, page 16; ms, decode kernel against prefill):
 *   - over 8192: B4 q5 0.063 / 0.050, q8 0.068 / 0.051; B16 q5 0.187 / 0.142, q8 0.191 / 0.142;
 *     B64 q5 0.719 / 0.632, q8 0.735 / 0.545-0.641;
 *   - over 2048: B4 q5 0.027 / 0.025, q8 0.032 / 0.025; B64 q5 0.193 / 0.168, q8 0.197 / 0.171;
 *   - 16 rows or fewer (q <= 4) the decode kernel is as fast or faster (B4 q2 over 2048: 0.019
 *     against 0.025), and so is one sequence (B1 q5 over 8192: 0.028 against 0.032);
 *   - fp8 caches stay on the decode kernel: the prefill stages them to bf16 first (B4 q8 0.052
 *     against 0.107).
 * auto takes the prefill within what was measured: head dim 128, groups up to 4 (so q >= 5 at
 * group 4), two or more sequences, a longest sequence of 2048 or more, split-KV on (option
 * split_kv: the prefill's gain is its split). */
int32_t mha_short_extend_prefill(int32_t option, int32_t max_q_len, const ap_model *model,
                                 int32_t num_seqs, int32_t max_seq_len, int32_t split_kv) {
    if (option == MHA_SHORT_EXTEND_DECODE || max_q_len < 2 || max_q_len > MHA_MAX_Q_LEN ||
        model->num_kv_heads <= 0 || model->dtype != model->kv_dtype ||
        (model->kv_dtype != AP_DTYPE_BF16 && model->kv_dtype != AP_DTYPE_F16))
        return 0;
    if (option == MHA_SHORT_EXTEND_PREFILL) return 1;
    const int32_t group = model->num_qo_heads / model->num_kv_heads;
    return split_kv && model->head_dim_qk == 128 && group <= 4 && num_seqs >= 2 &&
           max_seq_len >= 2048 && mha_decode_key_warps(group, max_q_len, model->head_dim_qk) < 4;
}
