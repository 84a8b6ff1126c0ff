/* scenario.h: one attention call built for cpu_ref and, separately, its dense reference. */
#ifndef AP_TEST_CPU_REF_SCENARIO_H
#define AP_TEST_CPU_REF_SCENARIO_H

#include "fixture.h"

#define SC_MAX_SEQS 8

/* What to run. */
typedef struct sc_case {
    ap_dtype q_dtype, kv_dtype;
    int page_size, num_kv_heads, group, head_dim_qk, head_dim_v;
    int causal;
    float softcap;   /* 0: off */
    int window_left; /* -1: off */
    int save_kv;     /* 1: the new tokens' k/v go into the cache in this call */
    int decode;      /* 1: forward_decode (every q_len must be 1) */
    int skip_kv;     /* 1: embedding mode: no pages, attend over the given k/v only */
    int with_lse;
    int num_seqs;
    int prefix[SC_MAX_SEQS];
    int q_len[SC_MAX_SEQS];
} sc_case;

/* Everything built for one case: the plugin's inputs and the test's own dense copies. */
typedef struct sc_scenario {
    sc_case c;
    int num_qo_heads, num_tokens, num_pages, pages_used;
    ap_model model;
    ap_backend *backend;
    int32_t qo_indptr[SC_MAX_SEQS + 1], kv_page_indptr[SC_MAX_SEQS + 1];
    int32_t last_page_len[SC_MAX_SEQS], seq_lens[SC_MAX_SEQS];
    int32_t *page_indices, *positions;
    ap_batch batch;
    ap_kv_cache kv;
    ap_layer layer;
    unsigned char *k_pages, *v_pages;   /* given to the plugin */
    unsigned char *k_expect, *v_expect; /* what they must hold afterwards */
    size_t k_bytes, v_bytes;
    unsigned char *k_scales, *v_scales;               /* nvfp4 block scales, else NULL */
    unsigned char *k_scales_expect, *v_scales_expect; /* what they must hold afterwards */
    size_t k_scale_bytes, v_scale_bytes;
    fx_tensor q, k, v, out, lse;
    ap_forward_args args;
    int kv_start[SC_MAX_SEQS]; /* first row of sequence i in k_ref / v_ref */
    double *k_ref, *v_ref;     /* [position][kv head][dim], dequantized, per sequence */
    double *out_ref, *lse_ref; /* [token][qo head][dim_v], [token][qo head] */
} sc_scenario;

/* Build the case (validate + create included); 0 on success. */
int sc_build(sc_scenario *s, const fx_plugin *plugin, const sc_case *c);
/* init_metadata then forward_extend/decode; the status of the first failing call. */
ap_status sc_run(sc_scenario *s, const fx_plugin *plugin, fx_msg *msg);
/* The dense double reference of the case, from the test's own copies. */
void sc_reference(sc_scenario *s);
/* Assert outputs, LSE and cache bytes against the reference. */
void sc_check(sc_scenario *s);
void sc_free(sc_scenario *s, const fx_plugin *plugin);
void sc_describe(const sc_case *c, char *text, size_t size);
/* Output tolerance (relative L2) for a q dtype. */
double sc_tolerance(ap_dtype q_dtype);

#endif /* AP_TEST_CPU_REF_SCENARIO_H */
