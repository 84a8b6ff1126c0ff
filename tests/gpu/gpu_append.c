/* gpu_append.c: a GPU backend's KV append (append_kv/1, save_kv) and nvfp4 extend vs cpu_ref. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attnplug.h"
#include "backends/numeric/nvfp4_host.h"
#include "gpu_mem.h"
#include "gpu_rand.h"
#include "gpu_registry.h"
#include "paged_layout.h"

/* Every cache byte is compared, values and nvfp4 block scales, the untouched slots too (they keep
 * the poison both sides started from): an append is byte-exact or it fails. The nvfp4 extend's
 * output is judged against cpu_ref attending over the same bytes (rel L2 < 2e-2, issue 11). */

#define GA_POISON 0xd5 /* bf16 0xd5d5, fp8 0xd5, nvfp4 codes 5 / -3: finite, wrong */
#define GA_EXTEND_TOL 2e-2

typedef struct ga_case {
    const char *name;
    int extend; /* 0: append_kv/1; 1: forward_extend with save_kv over the cache */
    ap_dtype q, kv;
    int32_t page, dim, hq, hk;
    const char *seqs;
    int32_t rotary, neox, with_q, stride; /* append: RoPE, q optional, positions/out_loc stride */
    int adversarial; /* nvfp4: zero blocks, one outlier per block, values past the range */
} ga_case;

#define BF AP_DTYPE_BF16
#define HF AP_DTYPE_F16
#define F8 AP_DTYPE_FP8_E4M3
#define N4 AP_DTYPE_NVFP4

/* Positional rows: name, q dtype, kv dtype, page size, head dim, qo heads, kv heads, batch
 * ("prefix:q_len,..."); appends add rotary dim, neox, q given, positions/out_loc stride. */
#define GA_APPEND(n, q_, kv_, pg, d, hq_, hk_, seqs_, rot, nx, wq, st, adv) \
    { \
        .name = n, .extend = 0, .q = q_, .kv = kv_, .page = pg, .dim = d, .hq = hq_, .hk = hk_, \
        .seqs = seqs_, .rotary = rot, .neox = nx, .with_q = wq, .stride = st, .adversarial = adv \
    }
#define GA_EXTEND(n, q_, kv_, pg, d, hq_, hk_, seqs_, adv) \
    { \
        .name = n, .extend = 1, .q = q_, .kv = kv_, .page = pg, .dim = d, .hq = hq_, .hk = hk_, \
        .seqs = seqs_, .rotary = 0, .neox = 0, .with_q = 0, .stride = 1, .adversarial = adv \
    }

static const ga_case ga_cases[] = {
    GA_APPEND("append_bf16_p16_d128_g4_neox", BF, BF, 16, 128, 32, 8, "0:7,1030:1,13:77", 128, 1, 1,
              1, 0),
    GA_APPEND("append_f16_p1_d64_g1_noq_stride2", HF, HF, 1, 64, 4, 4, "5:9", 64, 1, 0, 2, 0),
    GA_APPEND("append_fp8_p32_d128_g4_gptj64", BF, F8, 32, 128, 8, 2, "100:33,0:1", 64, 0, 1, 3, 0),
    GA_APPEND("append_fp8_f16_staged_gptj20", HF, F8, 16, 64, 8, 8, "3:17,0:5", 20, 0, 1, 1, 0),
    GA_APPEND("append_nvfp4_p16_d128_g4_neox", BF, N4, 16, 128, 32, 8, "0:7,1030:1,13:77", 128, 1,
              1, 1, 0),
    GA_APPEND("append_nvfp4_f16_p64_d64_g8_noq", HF, N4, 64, 64, 8, 1, "4095:1x8", 64, 0, 0, 2, 0),
    GA_APPEND("append_nvfp4_p32_d256_g8_staged40", BF, N4, 32, 256, 16, 2, "100:33,0:1,7:3", 40, 1,
              1, 1, 0),
    GA_APPEND("append_nvfp4_p1_d128_g1_stride3", BF, N4, 1, 128, 8, 8, "3:5", 128, 1, 1, 3, 0),
    GA_APPEND("append_nvfp4_f16_gptj_partial", HF, N4, 32, 128, 16, 4, "0:129,64:3", 32, 0, 1, 1,
              0),
    GA_APPEND("append_nvfp4_2047_tokens", BF, N4, 16, 128, 32, 8, "0:2047", 128, 1, 1, 1, 0),
    GA_APPEND("append_nvfp4_adversarial", BF, N4, 16, 128, 8, 2, "0:31,5:2", 128, 1, 1, 1, 1),
    /* the split kernel's wide roles: 96 q rows (6 passes: 2 CTAs per token), 48 K/V rows (3) */
    GA_APPEND("append_nvfp4_wide_g4_neox", BF, N4, 16, 128, 96, 24, "3:9,0:2", 128, 1, 1, 1, 0),
    /* D256 (8 rows a pass): 80 q rows and 80 K/V rows, 10 passes each: 2 CTAs of 8 passes a role */
    GA_APPEND("append_nvfp4_wide_d256_neox", BF, N4, 16, 256, 80, 40, "3:9,0:2", 256, 1, 1, 1, 0),
    GA_EXTEND("extend_nvfp4_p16_d128_g4", BF, N4, 16, 128, 32, 8, "0:7,519:129,13:1,100:77", 0),
    GA_EXTEND("extend_nvfp4_f16_p1_d64_g4", HF, N4, 1, 64, 4, 1, "1031:333,17:20", 0),
    GA_EXTEND("extend_nvfp4_p64_d256_g8", BF, N4, 64, 256, 8, 1, "200:55,0:31", 0),
    GA_EXTEND("extend_nvfp4_long_prefix", BF, N4, 32, 128, 16, 4, "4999:1,4000:7,1:1", 0),
    GA_EXTEND("extend_nvfp4_adversarial", BF, N4, 16, 128, 8, 2, "300:40,0:9", 1),
    /* save_kv's append (the same kernel without RoPE) into 16-bit and fp8 caches */
    GA_EXTEND("extend_savekv_bf16", BF, BF, 16, 128, 8, 2, "13:20,0:7", 0),
    GA_EXTEND("extend_savekv_fp8_f16", HF, F8, 32, 64, 8, 1, "100:33,0:5", 0),
};

/* One case's memory: the backend's copies (gpu_buf target) and cpu_ref's (host blocks *_ref). */
typedef struct ga_run {
    const ga_case *c;
    gpu_layout lay;
    ap_model model;
    float k_scale, v_scale;
    size_t value_bytes, scale_bytes; /* of one cache (K or V) over the whole pool */
    gpu_buf q, k, v, q_out, cache[4], ints, out_loc, positions, cos_sin, out;
    void *ref[4], *q_out_ref, *out_ref;
    ap_instance *gpu, *cpu;
} ga_run;

static size_t ga_elem_bits(ap_dtype t) {
    return (size_t)ap_dtype_size_bits(t);
}

/* Real value -> stored element of a 16-bit or fp8 cache, as cpu_ref stores it. */
static void ga_store(ap_dtype t, void *base, size_t i, float x, float scale) {
    uint16_t h;
    switch (t) {
        case AP_DTYPE_BF16: h = ap_float_to_bf16(x), memcpy((char *)base + 2 * i, &h, 2); break;
        case AP_DTYPE_F16: h = ap_float_to_f16(x), memcpy((char *)base + 2 * i, &h, 2); break;
        case AP_DTYPE_FP8_E4M3: ((uint8_t *)base)[i] = ap_float_to_fp8_e4m3(x / scale); break;
        default: break;
    }
}

static float ga_load16(ap_dtype t, const void *base, size_t i) {
    uint16_t h;
    memcpy(&h, (const char *)base + 2 * i, 2);
    return t == AP_DTYPE_BF16 ? ap_bf16_to_float(h) : ap_f16_to_float(h);
}

/* Input row values: uniform, or for adversarial cases per block of 16: all zero, one outlier
 * of 1000x, values past nvfp4's range (6 * 448 * g), or plain. */
static void ga_fill(const ga_case *c, void *data, size_t count, float bound, float g, int kv,
                    uint64_t *rng) {
    for (size_t i = 0; i < count; i++) {
        float x = gpu_rand_uniform(rng, -bound, bound);
        if (c->adversarial && kv) {
            size_t block = i / 16;
            if (block % 4 == 1) x = 0.0f;
            if (block % 4 == 2 && i % 16 == 3) x *= 1000.0f;
            if (block % 4 == 3) x *= 6.0f * 448.0f * g * 2.0f;
        }
        ga_store(c->q, data, i, x, 1.0f);
    }
}

/* The prefix rows every sequence has cached, written on the host as cpu_ref stores them; the
 * rest of the pool keeps the poison. */
static void ga_fill_prefix(ga_run *r, uint64_t *rng) {
    const ga_case *c = r->c;
    const int32_t *qo = r->lay.ints + r->lay.off_qo_indptr;
    size_t row = (size_t)c->dim;
    float vals[256];
    for (int32_t s = 0; s < r->lay.num_seqs; s++) {
        int32_t len = r->lay.ints[r->lay.off_seq_lens + (size_t)s];
        int32_t prefix = len - (qo[s + 1] - qo[s]);
        for (int32_t pos = 0; pos < prefix; pos++) {
            int64_t slot = gpu_layout_slot(&r->lay, s, pos);
            for (int kv = 0; kv < 2; kv++) {
                float g = kv ? r->v_scale : r->k_scale;
                for (int32_t h = 0; h < c->hk; h++) {
                    size_t e = ((size_t)slot * (size_t)c->hk + (size_t)h) * row;
                    for (size_t d = 0; d < row; d++) vals[d] = gpu_rand_uniform(rng, -2.0f, 2.0f);
                    if (c->kv != N4) {
                        for (size_t d = 0; d < row; d++)
                            ga_store(c->kv, r->cache[kv].host, e + d, vals[d], g);
                        continue;
                    }
                    for (size_t b = 0; b < row / 16; b++)
                        ((uint8_t *)r->cache[2 + kv].host)[e / 16 + b] = ap_nvfp4_quantize_block(
                            vals + 16 * b, g, (uint8_t *)r->cache[kv].host + e / 2 + 8 * b);
                }
            }
        }
    }
}

static ap_status ga_alloc(ga_run *r) {
    const ga_case *c = r->c;
    size_t t = (size_t)r->lay.num_tokens, in = ga_elem_bits(c->q) / 8;
    size_t slots = (size_t)r->lay.num_pages_pool * (size_t)c->page * (size_t)c->hk * (size_t)c->dim;
    size_t max_pos = (size_t)r->lay.max_seq_len, rd = c->rotary > 0 ? (size_t)c->rotary : 2;
    r->value_bytes = slots * ga_elem_bits(c->kv) / 8;
    r->scale_bytes = c->kv == N4 ? slots / 16 : 0;
    size_t sizes[4] = {r->value_bytes, r->value_bytes, r->scale_bytes, r->scale_bytes};
    ap_status st = AP_OK;
    gpu_buf *bufs[] = {&r->q,       &r->k,         &r->v,       &r->q_out, &r->out,
                       &r->out_loc, &r->positions, &r->cos_sin, &r->ints};
    size_t bytes[] = {t * c->hq * c->dim * in, t * c->hk * c->dim * in, t * c->hk * c->dim * in,
                      t * c->hq * c->dim * in, t * c->hq * c->dim * in, t * c->stride * 4 + 4,
                      t * c->stride * 4 + 4,   max_pos * rd * 4,        r->lay.num_ints * 4};
    for (size_t i = 0; i < 9 && st == AP_OK; i++) st = gpu_buf_alloc(bufs[i], bytes[i], 1);
    for (int i = 0; i < 4 && st == AP_OK; i++) {
        st = gpu_buf_alloc(&r->cache[i], sizes[i] ? sizes[i] : 16, 1);
        r->ref[i] = malloc(sizes[i] ? sizes[i] : 16);
        if (r->ref[i] == NULL) st = AP_ERR_OUT_OF_MEMORY;
    }
    r->q_out_ref = malloc(r->q_out.bytes);
    r->out_ref = malloc(r->out.bytes);
    return st == AP_OK && r->q_out_ref && r->out_ref ? st : AP_ERR_OUT_OF_MEMORY;
}

static void ga_free(ga_run *r) {
    gpu_buf *bufs[] = {&r->q,        &r->k,         &r->v,       &r->q_out, &r->out,
                       &r->out_loc,  &r->positions, &r->cos_sin, &r->ints,  &r->cache[0],
                       &r->cache[1], &r->cache[2],  &r->cache[3]};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gpu_buf_free(bufs[i]);
    for (int i = 0; i < 4; i++) free(r->ref[i]);
    free(r->q_out_ref);
    free(r->out_ref);
    if (r->gpu != NULL) ap_instance_close(r->gpu);
    if (r->cpu != NULL) ap_instance_close(r->cpu);
    gpu_layout_free(&r->lay);
}

/* Inputs drawn, positions / slots (strided), cos/sin; both sides' caches alike; uploaded. */
static ap_status ga_inputs(ga_run *r, uint64_t *rng) {
    const ga_case *c = r->c;
    const int32_t *qo = r->lay.ints + r->lay.off_qo_indptr;
    const int32_t *pos = r->lay.ints + r->lay.off_positions;
    ga_fill(c, r->q.host, r->q.bytes / (ga_elem_bits(c->q) / 8), 2.0f, r->k_scale, 0, rng);
    ga_fill(c, r->k.host, r->k.bytes / (ga_elem_bits(c->q) / 8), 2.0f, r->k_scale, 1, rng);
    ga_fill(c, r->v.host, r->v.bytes / (ga_elem_bits(c->q) / 8), 1.0f, r->v_scale, 1, rng);
    for (int i = 0; i < 4; i++) memset(r->cache[i].host, GA_POISON, r->cache[i].bytes);
    ga_fill_prefix(r, rng);
    for (int i = 0; i < 4; i++) memcpy(r->ref[i], r->cache[i].host, r->cache[i].bytes);
    memset(r->out_loc.host, 0xff, r->out_loc.bytes);
    memset(r->positions.host, 0xff, r->positions.bytes);
    for (int32_t s = 0; s < r->lay.num_seqs; s++)
        for (int32_t t = qo[s]; t < qo[s + 1]; t++) {
            ((int32_t *)r->out_loc.host)[(size_t)t * c->stride] =
                (int32_t)gpu_layout_slot(&r->lay, s, pos[t]);
            ((int32_t *)r->positions.host)[(size_t)t * c->stride] = pos[t];
        }
    int32_t rd = c->rotary > 0 ? c->rotary : 2, half = rd / 2;
    for (int32_t p = 0; p < r->lay.max_seq_len; p++)
        for (int32_t i = 0; i < half; i++) {
            double angle = p * pow(10000.0, -2.0 * i / rd);
            ((float *)r->cos_sin.host)[(size_t)p * rd + i] = (float)cos(angle);
            ((float *)r->cos_sin.host)[(size_t)p * rd + half + i] = (float)sin(angle);
        }
    memcpy(r->ints.host, r->lay.ints, r->ints.bytes);
    gpu_buf *up[] = {&r->q,    &r->k,        &r->v,        &r->out_loc,  &r->positions, &r->cos_sin,
                     &r->ints, &r->cache[0], &r->cache[1], &r->cache[2], &r->cache[3]};
    ap_status st = AP_OK;
    for (size_t i = 0; i < sizeof up / sizeof up[0] && st == AP_OK; i++) st = gpu_buf_upload(up[i]);
    if (st == AP_OK) st = gpu_buf_fill_target(&r->q_out, GA_POISON);
    if (st == AP_OK) st = gpu_buf_fill_target(&r->out, GA_POISON);
    memset(r->q_out_ref, GA_POISON, r->q_out.bytes);
    memset(r->out_ref, GA_POISON, r->out.bytes);
    return st;
}

/* The layer over one side's cache. */
static void ga_layer(const ga_run *r, int gpu, ap_kv_cache *kv, ap_layer *layer) {
    const ga_case *c = r->c;
    gpu_layout_kv_cache(&r->lay, c->kv, c->hk, c->dim, gpu ? r->cache[0].target : r->ref[0],
                        gpu ? r->cache[1].target : r->ref[1], kv);
    if (c->kv == N4) {
        kv->k_block_scales = gpu ? r->cache[2].target : r->ref[2];
        kv->v_block_scales = gpu ? r->cache[3].target : r->ref[3];
    }
    *layer = (ap_layer){.struct_size = sizeof *layer,
                        .sm_scale = 1.0f / sqrtf((float)c->dim),
                        .k_scale = r->k_scale,
                        .v_scale = r->v_scale,
                        .window_left = -1,
                        .kv = kv};
}

static ap_status ga_append_call(const ga_run *r, int gpu, void *stream) {
    const ga_case *c = r->c;
    int64_t t = r->lay.num_tokens;
    ap_kv_cache kv;
    ap_layer layer;
    ga_layer(r, gpu, &kv, &layer);
#define GA_SIDE(buf) (gpu ? (buf).target : (buf).host)
    gpu_tensor q, q_out, k, v, positions, out_loc, cos_sin;
    gpu_tensor_make(&q, GA_SIDE(r->q), c->q, gpu, 3, t, c->hq, c->dim);
    gpu_tensor_make(&q_out, gpu ? r->q_out.target : r->q_out_ref, c->q, gpu, 3, t, c->hq, c->dim);
    gpu_tensor_make(&k, GA_SIDE(r->k), c->q, gpu, 3, t, c->hk, c->dim);
    gpu_tensor_make(&v, GA_SIDE(r->v), c->q, gpu, 3, t, c->hk, c->dim);
    gpu_tensor_make_i32(&positions, GA_SIDE(r->positions), gpu, t);
    gpu_tensor_make_i32(&out_loc, GA_SIDE(r->out_loc), gpu, t);
    gpu_tensor_make(&cos_sin, GA_SIDE(r->cos_sin), AP_DTYPE_F32, gpu, 2, r->lay.max_seq_len,
                    c->rotary, 0);
#undef GA_SIDE
    int64_t stride[1] = {c->stride};
    positions.dl.strides = out_loc.dl.strides = c->stride > 1 ? stride : NULL;
    ap_append_kv_args args = {.struct_size = sizeof args,
                              .q = c->with_q ? &q.dl : NULL,
                              .q_out = c->with_q ? &q_out.dl : NULL,
                              .k = &k.dl,
                              .v = &v.dl,
                              .positions = &positions.dl,
                              .out_loc = &out_loc.dl,
                              .cos_sin = &cos_sin.dl,
                              .rotary_dim = c->rotary,
                              .is_neox = c->neox};
    return ap_instance_append_kv(gpu ? r->gpu : r->cpu, &layer, &args, stream);
}

static ap_status ga_extend_call(const ga_run *r, int gpu, void *stream) {
    const ga_case *c = r->c;
    int64_t t = r->lay.num_tokens;
    ap_kv_cache kv;
    ap_layer layer;
    ga_layer(r, gpu, &kv, &layer);
    gpu_tensor q, k, v, out;
    gpu_tensor_make(&q, gpu ? r->q.target : r->q.host, c->q, gpu, 3, t, c->hq, c->dim);
    gpu_tensor_make(&k, gpu ? r->k.target : r->k.host, c->q, gpu, 3, t, c->hk, c->dim);
    gpu_tensor_make(&v, gpu ? r->v.target : r->v.host, c->q, gpu, 3, t, c->hk, c->dim);
    gpu_tensor_make(&out, gpu ? r->out.target : r->out_ref, c->q, gpu, 3, t, c->hq, c->dim);
    ap_forward_args args = {.struct_size = sizeof args,
                            .q = &q.dl,
                            .k = &k.dl,
                            .v = &v.dl,
                            .out = &out.dl,
                            .save_kv = 1};
    ap_batch batch;
    gpu_layout_batch(&r->lay, AP_MODE_EXTEND, gpu ? r->ints.target : NULL, &batch);
    ap_instance *inst = gpu ? r->gpu : r->cpu;
    ap_status st = ap_instance_init_metadata(inst, &batch, stream);
    return st == AP_OK ? ap_instance_forward_extend(inst, &layer, &args, stream) : st;
}

/* Bytes that differ between the backend's buffer and cpu_ref's. */
static size_t ga_differ(const void *a, const void *b, size_t bytes) {
    size_t n = 0;
    for (size_t i = 0; i < bytes; i++) n += ((const uint8_t *)a)[i] != ((const uint8_t *)b)[i];
    return n;
}

/* ||out - ref|| / ||ref|| over every element; NaN when an element is not finite. */
static double ga_rel_l2(ap_dtype t, const void *out, const void *ref, size_t count) {
    double num = 0, den = 0;
    for (size_t i = 0; i < count; i++) {
        double a = ga_load16(t, out, i), b = ga_load16(t, ref, i);
        if (!isfinite(a) || !isfinite(b)) return NAN;
        num += (a - b) * (a - b);
        den += b * b;
    }
    return den > 0 ? sqrt(num / den) : NAN;
}

static int ga_judge(const ga_run *r) {
    const ga_case *c = r->c;
    size_t cache_diff = 0, q_diff = 0;
    for (int i = 0; i < 4; i++)
        cache_diff += ga_differ(r->cache[i].host, r->ref[i], r->cache[i].bytes);
    if (!c->extend && c->with_q) q_diff = ga_differ(r->q_out.host, r->q_out_ref, r->q_out.bytes);
    double err = 0;
    if (c->extend)
        err = ga_rel_l2(c->q, r->out.host, r->out_ref,
                        (size_t)r->lay.num_tokens * (size_t)c->hq * (size_t)c->dim);
    int pass = cache_diff == 0 && q_diff == 0 && (!c->extend || err < GA_EXTEND_TOL);
    printf("%s  %-40s cache bytes differing %zu of %zu, q_out %zu", pass ? "PASS" : "FAIL", c->name,
           cache_diff, 2 * (r->value_bytes + r->scale_bytes), q_diff);
    if (c->extend) printf(", out rel L2 %.3e (tol %.0e)", err, GA_EXTEND_TOL);
    printf("\n");
    return pass;
}

static const ap_options ga_options = {.struct_size = sizeof(ap_options),
                                      .prefix_cache = AP_OPTION_UNSET,
                                      .chunked_prefill = AP_OPTION_UNSET,
                                      .cuda_graphs = AP_OPTION_UNSET};

/* 1 pass, 0 fail, -1 skipped (the backend refuses the model or lacks the hook). */
static int ga_case_run(ap_registry *reg, const char *backend, const ap_device *dev,
                       const ga_case *c, uint64_t seed, void *stream) {
    ga_run r = {.c = c, .k_scale = 1.0f, .v_scale = 1.0f};
    uint64_t rng = seed;
    gpu_seq *seqs = NULL;
    int32_t n = 0;
    int result = 0;
    ap_device cpu;
    ap_device_cpu(&cpu, "");
    if (gpu_seqs_parse(c->seqs, &seqs, &n) != AP_OK ||
        gpu_layout_build(seqs, n, c->page, n + 2, &rng, &r.lay) != AP_OK) {
        printf("FAIL  %-40s bad batch\n", c->name);
        goto out;
    }
    if (c->kv == F8) r.k_scale = gpu_rand_uniform(&rng, 0.011f, 0.019f), r.v_scale = 0.007f;
    if (c->kv == N4) /* global scales off any power of two: amax 2 near 6 * 448 * g */
        r.k_scale = gpu_rand_uniform(&rng, 5e-4f, 9e-4f), r.v_scale = 3.3e-4f;
    gpu_layout_model(&r.lay, c->q, c->kv, c->hq, c->hk, c->dim, &r.model);
    r.model.name = c->name;
    r.model.embedding = c->kv == N4; /* extend-only where a backend's decode has no nvfp4 */
    if (ap_instance_open(reg, backend, &r.model, &ga_options, dev, &r.gpu) != AP_OK) {
        printf("SKIP  %-40s %s: %s\n", c->name, backend, ap_last_error());
        result = -1;
        goto out;
    }
    if (!c->extend && !ap_instance_has_hook(r.gpu, AP_HOOK_APPEND_KV_V1)) {
        printf("SKIP  %-40s %s has no append_kv/1\n", c->name, backend);
        result = -1;
        goto out;
    }
    if (ap_instance_open(reg, "cpu_ref", &r.model, &ga_options, &cpu, &r.cpu) != AP_OK ||
        ga_alloc(&r) != AP_OK || ga_inputs(&r, &rng) != AP_OK) {
        printf("FAIL  %-40s setup: %s\n", c->name, ap_last_error());
        goto out;
    }
    ap_status st = c->extend ? ga_extend_call(&r, 1, stream) : ga_append_call(&r, 1, stream);
    if (st == AP_OK && cudaStreamSynchronize(stream) != cudaSuccess) st = AP_ERR_CUDA;
    if (st != AP_OK) {
        printf("FAIL  %-40s %s: %s %s\n", c->name, backend, ap_status_name(st), ap_last_error());
        goto out;
    }
    gpu_buf *down[] = {&r.cache[0], &r.cache[1], &r.cache[2], &r.cache[3], &r.q_out, &r.out};
    for (size_t i = 0; i < 6 && st == AP_OK; i++) st = gpu_buf_download(down[i]);
    if (st == AP_OK) st = c->extend ? ga_extend_call(&r, 0, NULL) : ga_append_call(&r, 0, NULL);
    if (st != AP_OK) {
        printf("FAIL  %-40s cpu_ref or download: %s\n", c->name, ap_last_error());
        goto out;
    }
    result = ga_judge(&r);
out:
    free(seqs);
    ga_free(&r);
    return result;
}

int main(int argc, char **argv) {
    const char *dirs[8], *backend = NULL, *filter = NULL;
    size_t num_dirs = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--plugin-dir") == 0 && i + 1 < argc && num_dirs < 8)
            dirs[num_dirs++] = argv[++i];
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else
            backend = argv[i];
    }
    if (backend == NULL) {
        fprintf(stderr, "usage: gpu-append BACKEND [--filter TEXT] [--plugin-dir DIR]...\n");
        return 2;
    }
    ap_registry_options ro = {
        .struct_size = sizeof ro, .search_dirs = dirs, .num_search_dirs = num_dirs};
    ap_registry *reg = NULL;
    ap_device dev;
    if (ap_registry_create(&ro, &reg) != AP_OK || ap_registry_scan(reg) != AP_OK) {
        fprintf(stderr, "registry: %s\n", ap_last_error());
        return 1;
    }
    /* the backend, the reference and the device, each said apart when missing */
    int code = gpu_backend_present(reg, backend);
    if (code < 0) code = gpu_reference_present(reg);
    if (code < 0) code = gpu_device_usable(&dev);
    if (code >= 0) {
        ap_registry_destroy(reg);
        return code;
    }
    cudaStream_t stream = NULL;
    cudaSetDevice(dev.ordinal);
    cudaStreamCreate(&stream);
    int passed = 0, failed = 0, skipped = 0;
    for (size_t i = 0; i < sizeof ga_cases / sizeof ga_cases[0]; i++) {
        if (filter != NULL && strstr(ga_cases[i].name, filter) == NULL) continue;
        int res = ga_case_run(reg, backend, &dev, &ga_cases[i], 0x5eed0000u + i, stream);
        passed += res == 1, failed += res == 0, skipped += res == -1;
        fflush(stdout);
    }
    printf("summary: gpu-append %s vs cpu_ref: %d passed, %d failed, %d skipped\n", backend, passed,
           failed, skipped);
    cudaStreamDestroy(stream);
    ap_registry_destroy(reg);
    return failed > 0 ? 1 : passed == 0 ? 77 : 0;
}
