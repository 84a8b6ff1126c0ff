/* engine_mla.h: what engine_mla.c and engine_mla_inputs.c share: an MLA run's state. */
#ifndef AP_ENGINE_MLA_H
#define AP_ENGINE_MLA_H

#include "engine.h"

/* Prefix tokens per packed chunk of the chunked prefill. Small, so that the short runs of the
 * README and the tests still cut prompts into several chunks. */
#define ENG_MLA_CHUNK 16

/* The forward CSR of one ragged pass: qo_indptr, seq_lens and kv_indptr (host + device). */
enum { ENG_MLA_QO, ENG_MLA_SEQ_LENS, ENG_MLA_KV, ENG_MLA_ARRAYS };
typedef struct eng_mla_rows {
    int32_t *host[ENG_MLA_ARRAYS], *device[ENG_MLA_ARRAYS];
    ap_batch batch; /* for the backend: device arrays (host ones for CPU backends) and mirrors */
} eng_mla_rows;

/* One packed prefix chunk: the rows it covers of each sequence, the decompressed stand-ins and
 * the K/V the forward reads (fp8 from pack_prefix_chunk_kv/1, or the stand-ins' own type). */
typedef struct eng_mla_chunk {
    eng_mla_rows rows;
    eng_tensor k_nope, k_pe, v; /* [n][H][nope], [n][rope], [n][H][v_head] */
    eng_tensor k, v_packed;     /* [n][H][nope + rope], [n][H][v_head] */
    int packed;                 /* 1: k / v_packed come from the pack hook */
    float k_scale, v_scale;     /* the pack's per-tensor scales, the forward's layer scales */
} eng_mla_chunk;

/* Where one pass runs: the backend (its memory) or the cpu_ref replay (host copies), and the
 * outputs it writes. */
typedef struct eng_mla_side {
    ap_instance *instance;
    int host; /* 1: read host copies (the replay) */
    DLTensor out, lse, out_chunk, lse_chunk, q_rope_out;
} eng_mla_side;

typedef struct eng_mla {
    eng_context *context;
    const ap_config_rule *rule;
    ap_instance *instance;
    const ap_model *model;
    eng_memory memory;
    eng_rng *rng;
    eng_sequences seqs;
    eng_cache *caches;
    ap_layer *layers;
    int32_t *prefix; /* [num_seqs] prompt tokens cached before the prefill's new ones */
    int32_t new_tokens, prefix_tokens, num_chunks;
    eng_tensor cos_sin;
    /* the prefill: every prompt's latent rows, then the new tokens in the MHA form */
    eng_tensor lat, lat_pos, lat_loc;
    eng_mla_rows new_rows;
    eng_tensor q, k_new, v_new, out, lse, out_chunk, lse_chunk;
    eng_mla_chunk *chunks;
    /* a decode step: q [B][H][576] read as q_nope / q_rope views, new latent rows */
    eng_batch batch;
    eng_tensor q_all, q_rope_rot, lat_step, pos_step, loc_step, out_step;
    int64_t view_shapes[2][3], view_strides[3];
    void *snapshot; /* the last layer's latent pages before the checked step */
} eng_mla;

/* engine_mla_inputs.c: the run's tensors (backend memory, host copies kept) and batches. */
DLTensor eng_mla_dl(const eng_tensor *t, int host); /* the backend's tensor, or its host view */
ap_batch eng_mla_rows_host(const eng_mla_rows *rows);
ap_status eng_mla_prepare(eng_mla *m, int32_t steps);
ap_status eng_mla_rope_table(eng_mla *m, int32_t positions);
ap_status eng_mla_prefill_inputs(eng_mla *m);
ap_status eng_mla_step_inputs(eng_mla *m);
void eng_mla_free(eng_mla *m);

#endif /* AP_ENGINE_MLA_H */
