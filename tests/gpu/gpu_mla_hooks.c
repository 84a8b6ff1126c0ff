/* gpu_mla_hooks.c: trtllm_mla's hooks on the GPU: pack_prefix_chunk_kv/1 and the MLA append_kv/1
 * byte-exact against cpu_ref (and the host conversions cpu_ref uses), merge_state/1 against
 * float64 and cpu_ref. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/numeric/host_numeric.h"
#include "gpu_mla.h"
#include "gpu_rand.h"

static ap_options mt_no_options(void) {
    ap_options o = {.struct_size = sizeof o,
                    .prefix_cache = AP_OPTION_UNSET,
                    .chunked_prefill = AP_OPTION_UNSET,
                    .cuda_graphs = AP_OPTION_UNSET};
    return o;
}

/* ---- pack_prefix_chunk_kv/1 ------------------------------------------------------------------- */

typedef struct mt_pack_case {
    const char *name;
    int32_t tokens, heads, nope, v_dim; /* rope is DeepSeek's 64 */
    int strided;                        /* k_nope and v as views into one [T][H][nope + v] */
    int pe3;                            /* k_pe as [T][1][64] (a view into a wider row) */
    int quick;
} mt_pack_case;

static const mt_pack_case mt_pack_cases[] = {
    {"mla-pack-deepseek-t1-h128", 1, 128, 128, 128, 1, 0, 1},
    {"mla-pack-deepseek-t2-h128", 2, 128, 128, 128, 1, 1, 0},
    {"mla-pack-deepseek-t3-h16", 3, 16, 128, 128, 0, 0, 0},
    {"mla-pack-deepseek-t4-h128", 4, 128, 128, 128, 1, 1, 0},
    {"mla-pack-deepseek-t63-h16", 63, 16, 128, 128, 1, 0, 1},
    {"mla-pack-deepseek-t65-h128", 65, 128, 128, 128, 1, 1, 0},
    {"mla-pack-deepseek-t1000-h128", 1000, 128, 128, 128, 1, 1, 0},
    {"mla-pack-deepseek-t16384-h16", 16384, 16, 128, 128, 1, 0, 0},
    {"mla-pack-dims64-t300-h32", 300, 32, 64, 64, 0, 1, 0},
    {"mla-pack-dims192-256-t77-h16", 77, 16, 192, 256, 1, 0, 0},
    {"mla-pack-dims40-24-t33-h16", 33, 16, 40, 24, 1, 1, 1}, /* not 16-multiples: scalar path */
};

static void mt_pack_case_run(mt_ctx *ctx, const mt_pack_case *c, uint64_t seed) {
    const int64_t T = c->tokens, H = c->heads, N = c->nope, R = 64, V = c->v_dim;
    const int64_t kvw = c->strided ? N + V : 0; /* row width of the joint k_nope|v buffer */
    const int64_t pew = c->pe3 ? 576 + 64 : 64; /* k_pe rows inside a wider latent row */
    size_t kn_elems = (size_t)T * H * (c->strided ? kvw : N);
    size_t v_elems = c->strided ? 0 : (size_t)T * H * V;
    size_t pe_elems = (size_t)T * pew;
    size_t ko_bytes = (size_t)T * H * (N + R), vo_bytes = (size_t)T * H * V;
    uint16_t *kn = malloc(kn_elems * 2), *vv = malloc((v_elems > 0 ? v_elems : 1) * 2);
    uint16_t *pe = malloc(pe_elems * 2);
    uint8_t *ko = malloc(ko_bytes), *vo = malloc(vo_bytes), *rko = malloc(ko_bytes),
            *rvo = malloc(vo_bytes);
    void *dkn = mt_dev_alloc(kn_elems * 2), *dv = mt_dev_alloc(v_elems * 2);
    void *dpe = mt_dev_alloc(pe_elems * 2), *dko = mt_dev_alloc(ko_bytes),
         *dvo = mt_dev_alloc(vo_bytes);
    ap_instance *inst = NULL, *ref = NULL;
    char detail[200] = "";
    int ok = kn && vv && pe && ko && vo && rko && rvo && dkn && dv && dpe && dko && dvo;
    for (size_t i = 0; ok && i < kn_elems; i++) kn[i] = mt_bf16(gpu_rand_uniform(&seed, -3, 3));
    for (size_t i = 0; ok && i < v_elems; i++) vv[i] = mt_bf16(gpu_rand_uniform(&seed, -3, 3));
    for (size_t i = 0; ok && i < pe_elems; i++) pe[i] = mt_bf16(gpu_rand_uniform(&seed, -3, 3));
    if (ok && T > 2) kn[5] = mt_bf16(1e4f); /* past fp8's 448 after the scale: saturates */
    ok = ok && mt_upload(dkn, kn, kn_elems * 2) && mt_upload(dv, vv, v_elems * 2) &&
         mt_upload(dpe, pe, pe_elems * 2) && mt_cuda_ok(cudaMemset(dko, 0xa5, ko_bytes), "m") &&
         mt_cuda_ok(cudaMemset(dvo, 0xa5, vo_bytes), "m");
    ap_model m = mt_mla_model(c->heads, 64, AP_DTYPE_BF16);
    m.qk_nope_head_dim = c->nope;
    m.v_head_dim = c->v_dim;
    ap_options o = mt_no_options();
    if (ok && ap_instance_open(ctx->registry, MT_BACKEND, &m, &o, &ctx->device, &inst) != AP_OK) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    /* tensors: (device, host) pairs with the same strides */
    const int64_t kn_str[3] = {H * (c->strided ? kvw : N), c->strided ? kvw : N, 1};
    const int64_t v_str[3] = {H * (c->strided ? kvw : V), c->strided ? kvw : V, 1};
    const int64_t pe2_str[2] = {pew, 1}, pe3_str[3] = {pew, 64, 1};
    const int64_t pe_off = c->pe3 ? 576 : 0;
    mt_tensor t[2][5];
    for (int side = 0; ok && side < 2; side++) {
        int dev = side == 0;
        uint16_t *bkn = dev ? dkn : (void *)kn, *bpe = dev ? dpe : (void *)pe;
        uint16_t *bv = c->strided ? bkn + N : (uint16_t *)(dev ? dv : (void *)vv);
        mt_tensor_make(&t[side][0], bkn, AP_DTYPE_BF16, dev, 3, (int64_t[]){T, H, N}, kn_str);
        if (c->pe3)
            mt_tensor_make(&t[side][1], bpe + pe_off, AP_DTYPE_BF16, dev, 3, (int64_t[]){T, 1, R},
                           pe3_str);
        else
            mt_tensor_make(&t[side][1], bpe, AP_DTYPE_BF16, dev, 2, (int64_t[]){T, R}, pe2_str);
        mt_tensor_make(&t[side][2], bv, AP_DTYPE_BF16, dev, 3, (int64_t[]){T, H, V}, v_str);
        mt_tensor_make(&t[side][3], dev ? dko : (void *)rko, AP_DTYPE_FP8_E4M3, dev, 3,
                       (int64_t[]){T, H, N + R}, NULL);
        mt_tensor_make(&t[side][4], dev ? dvo : (void *)rvo, AP_DTYPE_FP8_E4M3, dev, 3,
                       (int64_t[]){T, H, V}, NULL);
    }
    ap_pack_kv_args a[2];
    for (int side = 0; side < 2; side++)
        a[side] = (ap_pack_kv_args){.struct_size = sizeof(ap_pack_kv_args),
                                    .k_nope = &t[side][0].dl,
                                    .k_pe = &t[side][1].dl,
                                    .v = &t[side][2].dl,
                                    .k_out = &t[side][3].dl,
                                    .v_out = &t[side][4].dl,
                                    .k_scale = 0.0173f,
                                    .v_scale = 0.0291f};
    if (ok && ap_instance_pack_prefix_chunk_kv(inst, &a[0], ctx->stream) != AP_OK) {
        snprintf(detail, sizeof detail, "pack: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync") &&
         mt_download(ko, dko, ko_bytes) && mt_download(vo, dvo, vo_bytes);
    /* cpu_ref serves the pack for any model; an MHA stand-in fixes no dim */
    ap_model mref = {.struct_size = sizeof mref,
                     .name = "pack-ref",
                     .kind = AP_ATTN_MHA,
                     .num_qo_heads = c->heads,
                     .num_kv_heads = c->heads,
                     .head_dim_qk = 64,
                     .head_dim_v = 64,
                     .dtype = AP_DTYPE_BF16,
                     .kv_dtype = AP_DTYPE_BF16,
                     .page_size = 16,
                     .num_layers = 1,
                     .causal = 1,
                     .max_batch = 1,
                     .max_tokens = 1,
                     .max_kv_len = 16};
    if (ok && (ap_instance_open(ctx->registry, "cpu_ref", &mref, &o, &ctx->cpu, &ref) != AP_OK ||
               ap_instance_pack_prefix_chunk_kv(ref, &a[1], NULL) != AP_OK)) {
        snprintf(detail, sizeof detail, "cpu_ref pack: %s", ap_last_error());
        ok = 0;
    }
    if (ok) {
        size_t diff = 0;
        for (size_t i = 0; i < ko_bytes; i++) diff += ko[i] != rko[i];
        for (size_t i = 0; i < vo_bytes; i++) diff += vo[i] != rvo[i];
        snprintf(detail, sizeof detail, "%zu of %zu bytes differ from cpu_ref", diff,
                 ko_bytes + vo_bytes);
        ok = diff == 0;
    }
    mt_verdict(ctx, c->name, ok, detail);
    ap_instance_close(inst);
    ap_instance_close(ref);
    free(kn), free(vv), free(pe), free(ko), free(vo), free(rko), free(rvo);
    cudaFree(dkn), cudaFree(dv), cudaFree(dpe), cudaFree(dko), cudaFree(dvo);
}

void mt_run_pack_cases(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_pack_cases / sizeof mt_pack_cases[0]; i++) {
        const mt_pack_case *c = &mt_pack_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_pack_case_run(ctx, c, gpu_rand_next(&s));
    }
}

/* ---- append_kv/1 (MLA) ------------------------------------------------------------------------ */

typedef struct mt_append_case {
    const char *name;
    int32_t tokens, heads, page_size;
    ap_dtype kv_dtype;
    int32_t q_dim; /* 64: q_rope; 0: no q */
    int q_strided; /* q_rope as the rope slice of a [T][H][192] projection output */
    int is_neox, in_place, quick;
} mt_append_case;

static const mt_append_case mt_append_cases[] = {
    {"mla-append-bf16-h16-p64-neox-t1", 1, 16, 64, AP_DTYPE_BF16, 64, 0, 1, 0, 1},
    {"mla-append-fp8-h128-p32-gptj-t100", 100, 128, 32, AP_DTYPE_FP8_E4M3, 64, 0, 0, 0, 1},
    {"mla-append-fp8-h16-p64-gptj-strided-inplace", 257, 16, 64, AP_DTYPE_FP8_E4M3, 64, 1, 0, 1, 0},
    {"mla-append-bf16-h128-p64-neox-strided", 300, 128, 64, AP_DTYPE_BF16, 64, 1, 1, 0, 0},
    {"mla-append-bf16-h128-p64-noq-t5000", 5000, 128, 64, AP_DTYPE_BF16, 0, 0, 1, 0, 0},
    {"mla-append-fp8-h16-p64-gptj-t16384", 16384, 16, 64, AP_DTYPE_FP8_E4M3, 64, 0, 0, 0, 0},
};

/* The host's expectation, the way cpu_ref's rope.c computes it: float32, no fused multiply-add
 * (this file is ISO C, so the compiler does not contract), then one rounding to the cache type. */
static void mt_rope_row(const uint16_t *in, float *out, int width, int neox, const float *cs) {
    const int r0 = width - 64;
    for (int d = 0; d < width; d++) out[d] = mt_bf16_f(in[d]);
    for (int i = 0; i < 32; i++) {
        int a = neox ? r0 + i : r0 + 2 * i, b = neox ? r0 + i + 32 : r0 + 2 * i + 1;
        float x = mt_bf16_f(in[a]), y = mt_bf16_f(in[b]);
        float c = cs[i], s = cs[32 + i];
        float xc = x * c, ys = y * s, yc = y * c, xs = x * s;
        out[a] = xc - ys;
        out[b] = yc + xs;
    }
}

/* Host and device tensors of one append: k [T][1][576]; q_rope [T][H][64] as the last 64 of
 * rows of width qw (192: the slice of a q projection output, read and written in place). */
typedef struct mt_append_views {
    mt_tensor k, q, q_out, pos, loc, cs;
    ap_kv_cache kv;
    ap_layer layer;
    ap_append_kv_args args;
} mt_append_views;

static void mt_append_views_make(mt_append_views *v, const mt_append_case *c, int dev, void *k,
                                 void *q, void *q_out, void *pos, void *loc, void *cs, void *cache,
                                 int64_t num_pages, int max_pos, float k_scale) {
    const int64_t T = c->tokens, H = c->heads, qw = c->q_strided ? 192 : 64;
    const int64_t q_str[3] = {H * qw, qw, 1};
    mt_tensor_make(&v->k, k, AP_DTYPE_BF16, dev, 3, (int64_t[]){T, 1, 576}, NULL);
    mt_tensor_make(&v->q, (uint16_t *)q + (qw - 64), AP_DTYPE_BF16, dev, 3, (int64_t[]){T, H, 64},
                   q_str);
    mt_tensor_make(&v->q_out, (uint16_t *)q_out + (qw - 64), AP_DTYPE_BF16, dev, 3,
                   (int64_t[]){T, H, 64}, q_str);
    mt_tensor_make(&v->pos, pos, AP_DTYPE_NONE, dev, 1, (int64_t[]){T}, NULL);
    mt_tensor_make(&v->loc, loc, AP_DTYPE_NONE, dev, 1, (int64_t[]){T}, NULL);
    mt_tensor_make(&v->cs, cs, AP_DTYPE_F32, dev, 2, (int64_t[]){max_pos, 64}, NULL);
    v->kv = (ap_kv_cache){.struct_size = sizeof(ap_kv_cache),
                          .layout = AP_KV_LAYOUT_NHD,
                          .dtype = c->kv_dtype,
                          .page_size = c->page_size,
                          .num_pages = (int32_t)num_pages,
                          .num_kv_heads = 1,
                          .head_dim_qk = 576,
                          .head_dim_v = 512,
                          .k_pages = cache};
    v->layer = (ap_layer){.struct_size = sizeof(ap_layer),
                          .sm_scale = 0.07f,
                          .k_scale = k_scale,
                          .v_scale = k_scale,
                          .window_left = -1,
                          .kv = &v->kv};
    v->args = (ap_append_kv_args){.struct_size = sizeof(ap_append_kv_args),
                                  .q = c->q_dim > 0 ? &v->q.dl : NULL,
                                  .q_out = c->q_dim > 0 ? &v->q_out.dl : NULL,
                                  .k = &v->k.dl,
                                  .v = NULL,
                                  .positions = &v->pos.dl,
                                  .out_loc = &v->loc.dl,
                                  .cos_sin = &v->cs.dl,
                                  .rotary_dim = 64,
                                  .is_neox = c->is_neox};
}

static void mt_append_case_run(mt_ctx *ctx, const mt_append_case *c, uint64_t seed) {
    const int64_t T = c->tokens, H = c->heads, P = c->page_size, qw = c->q_strided ? 192 : 64;
    const int64_t num_pages = (T + P - 1) / P + 2, slots = num_pages * P;
    const int max_pos = 70000;
    const size_t elem = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t cache_bytes = (size_t)slots * 576 * elem, k_elems = (size_t)T * 576;
    const size_t q_elems = (size_t)T * H * qw;
    const float k_scale = 0.0213f;
    uint16_t *k = malloc(k_elems * 2), *q = malloc(q_elems * 2), *qo = malloc(q_elems * 2);
    uint16_t *ref_q = malloc(q_elems * 2), *want_q = malloc(q_elems * 2);
    int32_t *pos = malloc((size_t)T * 4), *loc = malloc((size_t)T * 4);
    int32_t *perm = malloc((size_t)slots * 4);
    float *cs = malloc((size_t)max_pos * 64 * 4), *row = malloc(576 * 4);
    uint8_t *cache = malloc(cache_bytes), *want = malloc(cache_bytes), *ref = malloc(cache_bytes);
    void *dk = mt_dev_alloc(k_elems * 2), *dq = mt_dev_alloc(q_elems * 2);
    void *dqo = c->in_place ? dq : mt_dev_alloc(q_elems * 2), *dcache = mt_dev_alloc(cache_bytes);
    int32_t *dpos = mt_dev_alloc((size_t)T * 4), *dloc = mt_dev_alloc((size_t)T * 4);
    float *dcs = mt_dev_alloc((size_t)max_pos * 64 * 4);
    ap_instance *inst = NULL, *cpu = NULL;
    char detail[240] = "";
    int ok = k && q && qo && ref_q && want_q && pos && loc && perm && cs && row && cache && want &&
             ref && dk && dq && dqo && dcache && dpos && dloc && dcs;
    for (int p = 0; ok && p < max_pos; p++)
        for (int i = 0; i < 32; i++) {
            double f = pow(10000.0, -2.0 * i / 64.0);
            cs[(size_t)p * 64 + i] = (float)cos(p * f);
            cs[(size_t)p * 64 + 32 + i] = (float)sin(p * f);
        }
    for (int64_t i = 0; ok && i < slots; i++) perm[i] = (int32_t)i;
    for (int64_t i = slots - 1; ok && i > 0; i--) {
        int64_t j = gpu_rand_below(&seed, (uint32_t)i + 1);
        int32_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int64_t t = 0; ok && t < T; t++) {
        pos[t] = (int32_t)gpu_rand_below(&seed, max_pos);
        loc[t] = perm[t];
    }
    for (size_t i = 0; ok && i < k_elems; i++) k[i] = mt_bf16(gpu_rand_uniform(&seed, -4, 4));
    for (size_t i = 0; ok && i < q_elems; i++) q[i] = mt_bf16(gpu_rand_uniform(&seed, -4, 4));
    for (size_t i = 0; ok && i < cache_bytes; i++) want[i] = ref[i] = 0x5a;
    for (size_t i = 0; ok && i < q_elems; i++) /* what the rope slice leaves around it */
        want_q[i] = ref_q[i] = c->in_place ? q[i] : 0xffff;
    ok = ok && mt_upload(dk, k, k_elems * 2) && mt_upload(dq, q, q_elems * 2) &&
         mt_upload(dpos, pos, (size_t)T * 4) && mt_upload(dloc, loc, (size_t)T * 4) &&
         mt_upload(dcs, cs, (size_t)max_pos * 64 * 4) &&
         mt_cuda_ok(cudaMemset(dcache, 0x5a, cache_bytes), "memset");
    if (ok && !c->in_place) ok = mt_cuda_ok(cudaMemset(dqo, 0xff, q_elems * 2), "m");
    /* the host expectation, rope.c's arithmetic */
    for (int64_t t = 0; ok && t < T; t++) {
        const float *cst = cs + (size_t)pos[t] * 64;
        mt_rope_row(k + t * 576, row, 576, c->is_neox, cst);
        for (int d = 0; d < 576; d++) {
            size_t idx = (size_t)loc[t] * 576 + d;
            if (elem == 1)
                want[idx] = ap_float_to_fp8_e4m3(row[d] / k_scale);
            else
                ((uint16_t *)want)[idx] = mt_bf16(row[d]);
        }
        for (int64_t h = 0; c->q_dim > 0 && h < H; h++) {
            uint16_t *src = q + (t * H + h) * qw + (qw - 64);
            mt_rope_row(src, row, 64, c->is_neox, cst);
            for (int d = 0; d < 64; d++) want_q[(t * H + h) * qw + (qw - 64) + d] = mt_bf16(row[d]);
        }
    }
    ap_model m = mt_mla_model(c->heads, c->page_size, c->kv_dtype);
    ap_options o = mt_no_options();
    if (ok && ap_instance_open(ctx->registry, MT_BACKEND, &m, &o, &ctx->device, &inst) != AP_OK) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    mt_append_views gv, hv;
    mt_append_views_make(&gv, c, 1, dk, dq, dqo, dpos, dloc, dcs, dcache, num_pages, max_pos,
                         k_scale);
    if (ok && ap_instance_append_kv(inst, &gv.layer, &gv.args, ctx->stream) != AP_OK) {
        snprintf(detail, sizeof detail, "append: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync") &&
         mt_download(cache, dcache, cache_bytes) && mt_download(qo, dqo, q_elems * 2);
    /* cpu_ref on host copies: q_out in place over a copy of q, or into a poisoned buffer */
    uint16_t *hq = malloc(q_elems * 2), *hqo = c->in_place ? NULL : malloc(q_elems * 2);
    if (ok && hq != NULL && (c->in_place || hqo != NULL)) {
        memcpy(hq, q, q_elems * 2);
        if (hqo != NULL) memset(hqo, 0xff, q_elems * 2);
        mt_append_views_make(&hv, c, 0, k, hq, c->in_place ? hq : hqo, pos, loc, cs, ref, num_pages,
                             max_pos, k_scale);
        int have = ap_instance_open(ctx->registry, "cpu_ref", &m, &o, &ctx->cpu, &cpu) == AP_OK;
        if (have && ap_instance_append_kv(cpu, &hv.layer, &hv.args, NULL) != AP_OK) {
            snprintf(detail, sizeof detail, "cpu_ref append: %s", ap_last_error());
            ok = 0;
        }
        if (have && ok) memcpy(ref_q, c->in_place ? hq : hqo, q_elems * 2);
        if (!have) memcpy(ref, want, cache_bytes), memcpy(ref_q, want_q, q_elems * 2);
    }
    if (ok) {
        size_t diff = 0, qdiff = 0, rdiff = 0, rqdiff = 0;
        for (size_t i = 0; i < cache_bytes; i++)
            diff += cache[i] != want[i], rdiff += cache[i] != ref[i];
        for (size_t i = 0; i < q_elems; i++)
            qdiff += qo[i] != want_q[i], rqdiff += qo[i] != ref_q[i];
        snprintf(detail, sizeof detail,
                 "vs cpu_ref: cache %zu, q %zu bytes/elems differ; vs host rope: %zu, %zu "
                 "(of %zu, %zu)",
                 rdiff, rqdiff, diff, qdiff, cache_bytes, q_elems);
        ok = diff == 0 && qdiff == 0 && rdiff == 0 && rqdiff == 0;
    }
    mt_verdict(ctx, c->name, ok, detail);
    ap_instance_close(inst);
    ap_instance_close(cpu);
    free(hq), free(hqo);
    free(k), free(q), free(qo), free(ref_q), free(want_q), free(pos), free(loc), free(perm);
    free(cs), free(row), free(cache), free(want), free(ref);
    cudaFree(dk), cudaFree(dq), cudaFree(dcache), cudaFree(dpos), cudaFree(dloc), cudaFree(dcs);
    if (!c->in_place) cudaFree(dqo);
}

/* --cpu-only: the host rope expectation against cpu_ref's append (MLA form), no GPU. */
static void mt_append_selfcheck(mt_ctx *ctx, const mt_append_case *c, uint64_t seed) {
    const int64_t T = c->tokens, H = c->heads, P = c->page_size, qw = c->q_strided ? 192 : 64;
    const int64_t num_pages = (T + P - 1) / P + 2, slots = num_pages * P;
    const int max_pos = 4096;
    const size_t elem = c->kv_dtype == AP_DTYPE_FP8_E4M3 ? 1 : 2;
    const size_t cache_bytes = (size_t)slots * 576 * elem, q_elems = (size_t)T * H * qw;
    const float k_scale = 0.0213f;
    uint16_t *k = malloc((size_t)T * 576 * 2), *q = malloc(q_elems * 2), *qo = malloc(q_elems * 2);
    uint16_t *want_q = malloc(q_elems * 2);
    int32_t *pos = malloc((size_t)T * 4), *loc = malloc((size_t)T * 4);
    float *cs = malloc((size_t)max_pos * 64 * 4), row[576];
    uint8_t *cache = malloc(cache_bytes), *want = malloc(cache_bytes);
    ap_instance *cpu = NULL;
    char detail[200] = "";
    int ok = k && q && qo && want_q && pos && loc && cs && cache && want;
    for (int p = 0; ok && p < max_pos; p++)
        for (int i = 0; i < 32; i++) {
            double f = pow(10000.0, -2.0 * i / 64.0);
            cs[(size_t)p * 64 + i] = (float)cos(p * f);
            cs[(size_t)p * 64 + 32 + i] = (float)sin(p * f);
        }
    for (int64_t t = 0; ok && t < T; t++)
        pos[t] = (int32_t)gpu_rand_below(&seed, max_pos), loc[t] = (int32_t)(slots - 1 - t);
    for (size_t i = 0; ok && i < (size_t)T * 576; i++)
        k[i] = mt_bf16(gpu_rand_uniform(&seed, -4, 4));
    for (size_t i = 0; ok && i < q_elems; i++) q[i] = mt_bf16(gpu_rand_uniform(&seed, -4, 4));
    if (ok) {
        memset(cache, 0x5a, cache_bytes), memset(want, 0x5a, cache_bytes);
        memcpy(qo, q, q_elems * 2), memcpy(want_q, q, q_elems * 2);
    }
    for (int64_t t = 0; ok && t < T; t++) {
        const float *cst = cs + (size_t)pos[t] * 64;
        mt_rope_row(k + t * 576, row, 576, c->is_neox, cst);
        for (int d = 0; d < 576; d++) {
            size_t idx = (size_t)loc[t] * 576 + d;
            if (elem == 1)
                want[idx] = ap_float_to_fp8_e4m3(row[d] / k_scale);
            else
                ((uint16_t *)want)[idx] = mt_bf16(row[d]);
        }
        for (int64_t h = 0; c->q_dim > 0 && h < H; h++) {
            mt_rope_row(q + (t * H + h) * qw + (qw - 64), row, 64, c->is_neox, cst);
            for (int d = 0; d < 64; d++) want_q[(t * H + h) * qw + (qw - 64) + d] = mt_bf16(row[d]);
        }
    }
    ap_model m = mt_mla_model(c->heads, c->page_size, c->kv_dtype);
    ap_options o = mt_no_options();
    mt_append_views hv;
    mt_append_views_make(&hv, c, 0, k, qo, qo, pos, loc, cs, cache, num_pages, max_pos, k_scale);
    if (ok && (ap_instance_open(ctx->registry, "cpu_ref", &m, &o, &ctx->cpu, &cpu) != AP_OK ||
               ap_instance_append_kv(cpu, &hv.layer, &hv.args, NULL) != AP_OK)) {
        snprintf(detail, sizeof detail, "cpu_ref append: %s", ap_last_error());
        ok = 0;
    }
    if (ok) {
        size_t diff = 0, qdiff = 0;
        for (size_t i = 0; i < cache_bytes; i++) diff += cache[i] != want[i];
        for (size_t i = 0; i < q_elems; i++) qdiff += qo[i] != want_q[i];
        snprintf(detail, sizeof detail, "host rope vs cpu_ref: cache %zu, q %zu differ", diff,
                 qdiff);
        ok = diff == 0 && qdiff == 0;
    }
    mt_verdict(ctx, c->name, ok, detail);
    ap_instance_close(cpu);
    free(k), free(q), free(qo), free(want_q), free(pos), free(loc), free(cs), free(cache),
        free(want);
}

void mt_run_append_selfcheck(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_append_cases / sizeof mt_append_cases[0]; i++) {
        const mt_append_case *c = &mt_append_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_append_selfcheck(ctx, c, gpu_rand_next(&s));
    }
}

void mt_run_append_cases(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_append_cases / sizeof mt_append_cases[0]; i++) {
        const mt_append_case *c = &mt_append_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_append_case_run(ctx, c, gpu_rand_next(&s));
    }
}

/* ---- merge_state/1 ----------------------------------------------------------------------------- */

typedef struct mt_merge_case {
    const char *name;
    int32_t tokens, heads, dim;
    ap_dtype dtype;
    int in_place, quick;
} mt_merge_case;

static const mt_merge_case mt_merge_cases[] = {
    {"mla-merge-bf16-t100-h128-d128", 100, 128, 128, AP_DTYPE_BF16, 0, 1},
    {"mla-merge-f32-t7-h16-d512-inplace", 7, 16, 512, AP_DTYPE_F32, 1, 0},
    {"mla-merge-f16-t4096-h16-d128", 4096, 16, 128, AP_DTYPE_F16, 0, 0},
};

static double mt_load(const void *p, ap_dtype dt, size_t i) {
    if (dt == AP_DTYPE_F32) return ((const float *)p)[i];
    if (dt == AP_DTYPE_F16) return ap_f16_to_float(((const uint16_t *)p)[i]);
    return mt_bf16_f(((const uint16_t *)p)[i]);
}

static void mt_store(void *p, ap_dtype dt, size_t i, float x) {
    if (dt == AP_DTYPE_F32)
        ((float *)p)[i] = x;
    else if (dt == AP_DTYPE_F16)
        ((uint16_t *)p)[i] = ap_float_to_f16(x);
    else
        ((uint16_t *)p)[i] = mt_bf16(x);
}

static void mt_merge_case_run(mt_ctx *ctx, const mt_merge_case *c, uint64_t seed) {
    const size_t rows = (size_t)c->tokens * c->heads, n = rows * c->dim;
    const size_t es = c->dtype == AP_DTYPE_F32 ? 4 : 2;
    void *oa = malloc(n * es), *ob = malloc(n * es), *oo = malloc(n * es);
    float *la = malloc(rows * 4), *lb = malloc(rows * 4), *lo = malloc(rows * 4);
    double *want = malloc(n * 8), *got = malloc(n * 8), *wl = malloc(rows * 8),
           *gl = malloc(rows * 8);
    void *doa = mt_dev_alloc(n * es), *dob = mt_dev_alloc(n * es);
    void *doo = c->in_place ? doa : mt_dev_alloc(n * es);
    float *dla = mt_dev_alloc(rows * 4), *dlb = mt_dev_alloc(rows * 4);
    float *dlo = c->in_place ? dla : mt_dev_alloc(rows * 4);
    ap_instance *inst = NULL;
    char detail[200] = "";
    int ok = oa && ob && oo && la && lb && lo && want && got && wl && gl && doa && dob && doo &&
             dla && dlb && dlo;
    for (size_t i = 0; ok && i < n; i++) {
        mt_store(oa, c->dtype, i, gpu_rand_uniform(&seed, -2, 2));
        mt_store(ob, c->dtype, i, gpu_rand_uniform(&seed, -2, 2));
    }
    for (size_t r = 0; ok && r < rows; r++) {
        la[r] = gpu_rand_uniform(&seed, -5, 12);
        lb[r] = gpu_rand_uniform(&seed, -5, 12);
        if (r % 13 == 3) la[r] = -INFINITY; /* no keys on one side */
        if (r % 17 == 5) lb[r] = -INFINITY;
        if (r % 97 == 7) la[r] = lb[r] = -INFINITY; /* on neither */
    }
    for (size_t r = 0; ok && r < rows; r++) {
        double m = fmax(la[r], lb[r]);
        double wa = m == -INFINITY ? 0 : exp(la[r] - m), wb = m == -INFINITY ? 0 : exp(lb[r] - m);
        wl[r] = m == -INFINITY ? -INFINITY : m + log(wa + wb);
        for (int d = 0; d < c->dim; d++) {
            size_t i = r * c->dim + d;
            want[i] =
                m == -INFINITY
                    ? 0
                    : (wa * mt_load(oa, c->dtype, i) + wb * mt_load(ob, c->dtype, i)) / (wa + wb);
        }
    }
    ok = ok && mt_upload(doa, oa, n * es) && mt_upload(dob, ob, n * es) &&
         mt_upload(dla, la, rows * 4) && mt_upload(dlb, lb, rows * 4);
    if (ok && !c->in_place)
        ok = mt_cuda_ok(cudaMemset(doo, 0xff, n * es), "m") &&
             mt_cuda_ok(cudaMemset(dlo, 0xff, rows * 4), "m");
    ap_model m = mt_mla_model(16, 64, AP_DTYPE_BF16);
    ap_options o = mt_no_options();
    if (ok && ap_instance_open(ctx->registry, MT_BACKEND, &m, &o, &ctx->device, &inst) != AP_OK) {
        snprintf(detail, sizeof detail, "open: %s", ap_last_error());
        ok = 0;
    }
    const int64_t oshape[3] = {c->tokens, c->heads, c->dim}, lshape[2] = {c->tokens, c->heads};
    mt_tensor ta, tb, to, tla, tlb, tlo;
    mt_tensor_make(&ta, doa, c->dtype, 1, 3, oshape, NULL);
    mt_tensor_make(&tb, dob, c->dtype, 1, 3, oshape, NULL);
    mt_tensor_make(&to, doo, c->dtype, 1, 3, oshape, NULL);
    mt_tensor_make(&tla, dla, AP_DTYPE_F32, 1, 2, lshape, NULL);
    mt_tensor_make(&tlb, dlb, AP_DTYPE_F32, 1, 2, lshape, NULL);
    mt_tensor_make(&tlo, dlo, AP_DTYPE_F32, 1, 2, lshape, NULL);
    ap_merge_state_args a = {.struct_size = sizeof a,
                             .o_a = &ta.dl,
                             .lse_a = &tla.dl,
                             .o_b = &tb.dl,
                             .lse_b = &tlb.dl,
                             .o = &to.dl,
                             .lse = &tlo.dl};
    ap_status st = ok ? ap_instance_merge_state(inst, &a, ctx->stream) : AP_OK;
    if (ok && st != AP_OK) {
        snprintf(detail, sizeof detail, "merge_state: %s", ap_last_error());
        ok = 0;
    }
    ok = ok && mt_cuda_ok(cudaStreamSynchronize(ctx->stream), "sync") &&
         mt_download(oo, doo, n * es) && mt_download(lo, dlo, rows * 4);
    if (ok) {
        size_t bad_o = 0, bad_l = 0, bad_inf = 0;
        for (size_t i = 0; i < n; i++) got[i] = mt_load(oo, c->dtype, i);
        for (size_t r = 0; r < rows; r++) {
            gl[r] = lo[r];
            if (wl[r] == -INFINITY) {
                bad_inf += gl[r] != -INFINITY;
                gl[r] = wl[r] = 0;
            }
        }
        double eo = mt_rel_l2(got, want, n, &bad_o), el = mt_rel_l2(gl, wl, rows, &bad_l);
        int w = snprintf(detail, sizeof detail, "f64: out %.2e lse %.2e (%zu bad)", eo, el,
                         bad_o + bad_l + bad_inf);
        ok = bad_o + bad_l + bad_inf == 0 && eo < (c->dtype == AP_DTYPE_F32 ? 1e-5 : 5e-3) &&
             el < 1e-5;
        /* cpu_ref's merge on the same host inputs: ours within a rounding of it */
        ap_instance *cpu = NULL;
        void *ho = malloc(n * es);
        float *hl = malloc(rows * 4);
        if (ho != NULL && hl != NULL &&
            ap_instance_open(ctx->registry, "cpu_ref", &m, &o, &ctx->cpu, &cpu) == AP_OK) {
            mt_tensor ha, hb, hoo, hla, hlb, hlo;
            mt_tensor_make(&ha, oa, c->dtype, 0, 3, oshape, NULL);
            mt_tensor_make(&hb, ob, c->dtype, 0, 3, oshape, NULL);
            mt_tensor_make(&hoo, ho, c->dtype, 0, 3, oshape, NULL);
            mt_tensor_make(&hla, la, AP_DTYPE_F32, 0, 2, lshape, NULL);
            mt_tensor_make(&hlb, lb, AP_DTYPE_F32, 0, 2, lshape, NULL);
            mt_tensor_make(&hlo, hl, AP_DTYPE_F32, 0, 2, lshape, NULL);
            ap_merge_state_args ha_args = {.struct_size = sizeof ha_args,
                                           .o_a = &ha.dl,
                                           .lse_a = &hla.dl,
                                           .o_b = &hb.dl,
                                           .lse_b = &hlb.dl,
                                           .o = &hoo.dl,
                                           .lse = &hlo.dl};
            if (ap_instance_merge_state(cpu, &ha_args, NULL) == AP_OK) {
                for (size_t i = 0; i < n; i++) want[i] = mt_load(ho, c->dtype, i);
                size_t lse_mismatch = 0;
                for (size_t r = 0; r < rows; r++) {
                    double x = hl[r], y = lo[r];
                    if (x == -INFINITY || y == -INFINITY)
                        lse_mismatch += x != y;
                    else if (fabs(x - y) > 1e-5 * fmax(1.0, fabs(x)))
                        lse_mismatch++;
                }
                double ec = mt_rel_l2(got, want, n, &bad_o);
                snprintf(detail + w, sizeof detail - (size_t)w,
                         "; cpu_ref: out %.2e, %zu lse differ", ec, lse_mismatch);
                ok = ok && bad_o == 0 && ec < (c->dtype == AP_DTYPE_F32 ? 1e-6 : 5e-3) &&
                     lse_mismatch == 0;
            } else {
                snprintf(detail + w, sizeof detail - (size_t)w, "; cpu_ref merge: %s",
                         ap_last_error());
                ok = 0;
            }
        }
        ap_instance_close(cpu);
        free(ho);
        free(hl);
    }
    mt_verdict(ctx, c->name, ok, detail);
    ap_instance_close(inst);
    free(oa), free(ob), free(oo), free(la), free(lb), free(lo), free(want), free(got), free(wl),
        free(gl);
    cudaFree(doa), cudaFree(dob), cudaFree(dla), cudaFree(dlb);
    if (!c->in_place) cudaFree(doo), cudaFree(dlo);
}

void mt_run_merge_cases(mt_ctx *ctx, uint64_t seed) {
    for (size_t i = 0; i < sizeof mt_merge_cases / sizeof mt_merge_cases[0]; i++) {
        const mt_merge_case *c = &mt_merge_cases[i];
        if (!mt_selected(ctx, c->name, c->quick)) continue;
        uint64_t s = seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
        mt_merge_case_run(ctx, c, gpu_rand_next(&s));
    }
}
