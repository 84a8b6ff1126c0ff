/* plugin_api.h: the contract between the attnplug core and every backend plugin.
 *
 * Audience: plugin authors, in tree and third party. Hosts use <attnplug/attnplug.h> instead and
 * never touch the vtable. This header includes no CUDA header: streams travel as `void *`
 * (a cudaStream_t, or NULL for the default stream; cpu_ref ignores it).
 *
 * Rules that keep the ABI stable:
 *  - Every struct that crosses the boundary starts with `struct_size`, set by whoever fills it
 *    to sizeof(the struct) as it compiled it. Structs only ever grow at the end; a reader checks
 *    `struct_size` before touching a field that a later minor version added (AP_HAS_FIELD).
 *  - One symbol is exported per plugin: AP_PLUGIN_ENTRY ("ap_plugin_negotiate"), written by
 *    AP_PLUGIN_DEFINE(descriptor). The core calls it first, offering its ABI version; the plugin
 *    answers with the version it serves and its descriptor, or refuses. Majors must be equal;
 *    the plugin's minor may not exceed the core's.
 *  - Optional functionality is found by name through get_hook(); the name carries the signature
 *    version ("append_kv/1"), so a changed signature is a new name, never a crash.
 *  - Nothing here aborts or prints. Failing calls return an ap_status and write one line into
 *    the ap_msgbuf they were handed.
 */
#ifndef ATTNPLUG_PLUGIN_API_H
#define ATTNPLUG_PLUGIN_API_H

#include <dlpack/dlpack.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------------------
 * Versions and the entry symbol
 * ------------------------------------------------------------------------------------------- */

#define AP_ABI_VERSION_MAJOR 1 /* bumped on any incompatible change */
#define AP_ABI_VERSION_MINOR 1 /* bumped when fields or entries are appended */

#define AP_PLUGIN_ENTRY "ap_plugin_negotiate" /* the one symbol a plugin exports */

/* Mark the entry function: exported even when the plugin builds with -fvisibility=hidden. */
#if defined(__GNUC__)
#define AP_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define AP_PLUGIN_EXPORT
#endif

/* True when a struct filled by the other side is large enough to hold `field`. */
#define AP_HAS_FIELD(ptr, type, field) \
    ((ptr)->struct_size >= offsetof(type, field) + sizeof(((type *)0)->field))

/* ---------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------- */

typedef enum ap_status {
    AP_OK = 0,
    AP_ERR_INVALID_ARGUMENT = 1, /* a NULL, a negative size, a bad enum value */
    AP_ERR_SHAPE_MISMATCH = 2,   /* tensors or batch arrays disagree with the model or each other */
    AP_ERR_UNSUPPORTED = 3,      /* valid request this backend (or this hook) does not serve */
    AP_ERR_ABI_MISMATCH = 4,     /* plugin and core cannot agree on an ABI version */
    AP_ERR_LOAD = 5,             /* a plugin file could not be opened (dlopen failed) */
    AP_ERR_MISSING_SYMBOL = 6,   /* no entry symbol, or a NULL required vtable entry */
    AP_ERR_NOT_FOUND = 7,        /* no backend, file, rule or hook of that name */
    AP_ERR_OUT_OF_MEMORY = 8,    /* host or device allocation failed */
    AP_ERR_CONFIG = 9,           /* the YAML config is malformed or names something wrong */
    AP_ERR_NO_DEVICE = 10,       /* no CUDA driver, no GPU, or an incompatible architecture */
    AP_ERR_CUDA = 11,            /* a CUDA call or kernel launch failed */
    AP_ERR_REFUSED = 12,         /* a backend's validate() refused the model/options/device */
    AP_ERR_DUPLICATE = 13,       /* a second plugin with a backend name already taken */
    AP_ERR_INTERNAL = 14         /* a bug: an invariant of attnplug itself broke */
} ap_status;

/* ---------------------------------------------------------------------------------------------
 * Messages: a plugin writes its one-line error or its refusal reasons into a buffer the core owns
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_msgbuf {
    size_t struct_size;
    char *text;      /* NUL-terminated; reasons are separated by '\n' */
    size_t capacity; /* bytes at `text`, including room for the NUL */
    size_t length;   /* bytes used, excluding the NUL */
} ap_msgbuf;

/* Append one line to a message buffer (a '\n' separates it from the previous one). Truncates
 * silently at the capacity. Inline so plugins need no core symbol to use it. */
static inline void ap_msgbuf_add(ap_msgbuf *msg, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static inline void ap_msgbuf_add(ap_msgbuf *msg, const char *fmt, ...) {
    if (msg == NULL || msg->text == NULL || msg->capacity == 0) return;
    if (msg->length + 1 >= msg->capacity) return;
    if (msg->length > 0) msg->text[msg->length++] = '\n';
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(msg->text + msg->length, msg->capacity - msg->length, fmt, args);
    va_end(args);
    if (n < 0) n = 0;
    msg->length += (size_t)n;
    if (msg->length >= msg->capacity) msg->length = msg->capacity - 1;
    msg->text[msg->length] = '\0';
}

/* ---------------------------------------------------------------------------------------------
 * Element types
 * ------------------------------------------------------------------------------------------- */

/* Element types of activations and of the KV cache. Used both as values and as bits in masks. */
typedef enum ap_dtype {
    AP_DTYPE_NONE = 0,     /* "unset": options leave the model's choice */
    AP_DTYPE_F32 = 1,      /* IEEE float32 */
    AP_DTYPE_BF16 = 2,     /* bfloat16 */
    AP_DTYPE_F16 = 3,      /* IEEE float16 */
    AP_DTYPE_FP8_E4M3 = 4, /* float8 e4m3fn (max 448, no inf), value = stored * layer scale */
    AP_DTYPE_FP8_E5M2 = 5, /* float8 e5m2 (max 57344), value = stored * layer scale */
    AP_DTYPE_NVFP4 = 6     /* 4-bit e2m1 pairs + one e4m3 scale per 16 values + fp32 global scale */
} ap_dtype;
#define AP_DTYPE_COUNT 7
#define AP_DTYPE_BIT(d) (1u << (unsigned)(d))

/* The canonical name of a dtype ("bf16", "fp8_e4m3", ...), for messages; "unknown" when out of
 * range. Inline so plugins name dtypes in their reasons without a core symbol. */
static inline const char *ap_dtype_str(ap_dtype dtype) {
    static const char *const names[AP_DTYPE_COUNT] = {"none",     "f32",      "bf16", "f16",
                                                      "fp8_e4m3", "fp8_e5m2", "nvfp4"};
    return (unsigned)dtype < AP_DTYPE_COUNT ? names[dtype] : "unknown";
}

/* Bits of one element: 32, 16, 8, 4 (nvfp4: the values only, not their block scales); 0 for
 * none and out-of-range values. */
static inline size_t ap_dtype_size_bits(ap_dtype dtype) {
    static const unsigned char bits[AP_DTYPE_COUNT] = {0, 32, 16, 16, 8, 8, 4};
    return (unsigned)dtype < AP_DTYPE_COUNT ? bits[dtype] : 0;
}

/* DLPack 0.6 (Debian 12) predates float8 codes. These are DLPack 1.1's numbers, so tensors built
 * by newer producers (PyTorch, JAX) read the same. */
#ifndef AP_DL_FLOAT8_E4M3FN
#define AP_DL_FLOAT8_E4M3FN 10
#define AP_DL_FLOAT8_E5M2 12
#endif

/* The DLPack type of a tensor holding `dtype` elements: f32, bf16, f16 and the two fp8 formats.
 * None and nvfp4 (packed pairs with scales, no DLPack code) give lanes 0, which no tensor has. */
static inline DLDataType ap_dtype_to_dl(ap_dtype dtype) {
    DLDataType dl;
    dl.code = kDLFloat;
    dl.bits = (uint8_t)(dtype == AP_DTYPE_NVFP4 ? 0 : ap_dtype_size_bits(dtype));
    dl.lanes = (uint16_t)(dl.bits != 0);
    if (dtype == AP_DTYPE_BF16) dl.code = kDLBfloat;
    if (dtype == AP_DTYPE_FP8_E4M3) dl.code = AP_DL_FLOAT8_E4M3FN;
    if (dtype == AP_DTYPE_FP8_E5M2) dl.code = AP_DL_FLOAT8_E5M2;
    return dl;
}

/* 1 when a DLPack type is exactly the one ap_dtype_to_dl gives for `dtype`, else 0. */
static inline int ap_dtype_is_dl(DLDataType dl, ap_dtype dtype) {
    DLDataType want = ap_dtype_to_dl(dtype);
    return want.lanes == 1 && dl.lanes == 1 && dl.code == want.code && dl.bits == want.bits;
}

/* ---------------------------------------------------------------------------------------------
 * Devices and architectures
 * ------------------------------------------------------------------------------------------- */

/* The device a backend is asked to serve. The core fills it (from the CUDA driver, read at run
 * time) or a test injects one. ordinal < 0 means "the CPU, no GPU". */
typedef struct ap_device {
    size_t struct_size;
    int32_t ordinal;              /* CUDA device ordinal; -1 for the CPU */
    int32_t cc_major;             /* compute capability, e.g. 9 for Hopper; 0 on the CPU */
    int32_t cc_minor;             /* e.g. 0 for sm_90 */
    int32_t sm_count;             /* multiprocessors */
    int32_t driver_version;       /* cuDriverGetVersion(), e.g. 13000; 0 when no driver */
    int64_t total_memory;         /* bytes of device memory */
    int32_t l2_bytes;             /* L2 cache size */
    int32_t smem_per_block_optin; /* largest dynamic shared memory a block may opt into */
    char name[128];               /* "NVIDIA H100 80GB HBM3", or "cpu" */
    char unusable_reason[160];    /* why no GPU is usable ("no CUDA driver: ..."), "" when usable */
} ap_device;

/* One compiled GPU target of a plugin. */
typedef enum ap_arch_kind {
    AP_ARCH_SASS = 0,          /* sm_XY machine code: runs on X.Z with Z >= Y */
    AP_ARCH_SASS_SPECIFIC = 1, /* sm_XYa machine code: runs only on exactly X.Y */
    AP_ARCH_PTX = 2            /* compute_XY PTX: JIT-compiled on any X.Y or newer */
} ap_arch_kind;

typedef struct ap_arch_target {
    int32_t sm;        /* 10 * major + minor, e.g. 90 */
    ap_arch_kind kind; /* what form the code is in */
} ap_arch_target;

/* ---------------------------------------------------------------------------------------------
 * Static capabilities: for listing and fast filtering before a plugin's validate() runs
 * ------------------------------------------------------------------------------------------- */

typedef enum ap_attn_kind {
    AP_ATTN_MHA = 0, /* multi-head attention, covering GQA and MQA */
    AP_ATTN_MLA = 1  /* DeepSeek multi-head latent attention over a compressed cache */
} ap_attn_kind;
#define AP_ATTN_BIT(k) (1u << (unsigned)(k))

#define AP_PHASE_EXTEND 0x1u /* prefill / extend over new tokens */
#define AP_PHASE_DECODE 0x2u /* one new token per sequence */

typedef enum ap_graph_level {
    AP_GRAPH_NONE = 0,        /* nothing may be captured in a CUDA graph */
    AP_GRAPH_DECODE_ONLY = 1, /* forward_decode is capturable after the cuda_graph/1 hook ran */
    AP_GRAPH_ALL = 2          /* extend and decode are capturable */
} ap_graph_level;

/* Feature bits (ap_caps.features). */
#define AP_FEATURE_LSE (1ull << 0)               /* writes the log-sum-exp of each row */
#define AP_FEATURE_EMBEDDING_SKIP_KV (1ull << 1) /* embedding mode: no KV cache write or read */
#define AP_FEATURE_SLIDING_WINDOW (1ull << 2)    /* honours ap_layer.window_left */
#define AP_FEATURE_LOGIT_SOFTCAP (1ull << 3)     /* honours ap_layer.logit_softcap */
#define AP_FEATURE_SINKS (1ull << 4)             /* attention sinks */
#define AP_FEATURE_SPLIT_KV (1ull << 5)          /* splits long KV across CTAs (flash-decoding) */
#define AP_FEATURE_NONCAUSAL (1ull << 6)         /* honours ap_model.causal == 0 */

#define AP_DEVICE_KIND_CPU 0x1u  /* runs on the host CPU, no GPU needed */
#define AP_DEVICE_KIND_CUDA 0x2u /* needs a CUDA GPU matching one of `archs` */

typedef struct ap_caps {
    size_t struct_size;
    uint32_t device_kinds;       /* AP_DEVICE_KIND_* bits */
    const ap_arch_target *archs; /* compiled GPU targets; NULL/0 for CPU-only backends */
    size_t num_archs;
    uint32_t attn_kinds;       /* AP_ATTN_BIT(...) */
    uint32_t q_dtypes;         /* AP_DTYPE_BIT(...) of queries and outputs */
    uint32_t kv_dtypes;        /* AP_DTYPE_BIT(...) of the KV cache */
    const int32_t *page_sizes; /* allowed page sizes; NULL/0 means any page size >= 1 */
    size_t num_page_sizes;
    const int32_t *head_dims; /* allowed qk head dims (MHA); NULL/0 means any */
    size_t num_head_dims;
    uint32_t phases;            /* AP_PHASE_* */
    ap_graph_level cuda_graph;  /* what may be captured */
    uint64_t features;          /* AP_FEATURE_* */
    int32_t needs_host_mirrors; /* 1: init_metadata reads the batch's host arrays */

    /* ABI 1.1: the hook names ("append_kv/1", ...) this backend's instances answer in get_hook,
     * for listing before any instance exists. get_hook stays the authority: an instance may
     * offer fewer (a hook that does not apply to its model). NULL / 0: not declared. Read only
     * when AP_HAS_FIELD(caps, ap_caps, num_hooks). */
    const char *const *hooks;
    size_t num_hooks;
} ap_caps;

/* ---------------------------------------------------------------------------------------------
 * The model, options, KV cache, batch and layer
 * ------------------------------------------------------------------------------------------- */

/* What one model looks like to a backend, per GPU (after tensor parallelism). */
typedef struct ap_model {
    size_t struct_size;
    const char *name;         /* matched against the config's rules, e.g. "meta-llama/Llama-3-8B" */
    ap_attn_kind kind;        /* MHA (incl. GQA/MQA) or MLA */
    int32_t num_qo_heads;     /* query heads on this GPU */
    int32_t num_kv_heads;     /* KV heads on this GPU; must divide num_qo_heads. 1 for MLA */
    int32_t head_dim_qk;      /* MHA: q/k head dim. MLA: kv_lora_rank + qk_rope_head_dim (576) */
    int32_t head_dim_v;       /* MHA: v head dim. MLA: kv_lora_rank (512) in absorbed decode */
    int32_t kv_lora_rank;     /* MLA only: latent width (512 in DeepSeek-V3), else 0 */
    int32_t qk_rope_head_dim; /* MLA only: RoPE part of q/k (64), else 0 */
    int32_t qk_nope_head_dim; /* MLA only: non-RoPE part of q/k per head (128), else 0 */
    int32_t v_head_dim;       /* MLA only: v head dim in MHA-style prefill (128), else 0 */
    ap_dtype dtype;           /* queries, new K/V and outputs: BF16 or F16 */
    ap_dtype kv_dtype;        /* KV cache element type (options may override) */
    int32_t page_size;        /* tokens per KV page (options may override) */
    int32_t num_layers;       /* attention layers */
    int32_t causal;           /* 1: token i attends to positions <= its own */
    int32_t embedding;        /* 1: an embedding model (prefill only, never decodes) */
    int32_t max_batch;        /* largest number of sequences in one forward */
    int32_t max_tokens;       /* largest number of new tokens in one forward */
    int64_t max_kv_len;       /* longest sequence (prefix + new) the host will run */
} ap_model;

/* One backend-specific option, passed through from YAML untouched. */
typedef struct ap_option_kv {
    const char *key;
    const char *value;
} ap_option_kv;

#define AP_OPTION_UNSET (-1) /* tri-state int options: unset, 0 (off), 1 (on) */

/* Options chosen by the config for one model. The core applies page_size and kv_dtype to the
 * model before a backend sees it, so a backend reads those from ap_model alone. */
typedef struct ap_options {
    size_t struct_size;
    int32_t page_size;         /* 0: keep the model's */
    ap_dtype kv_dtype;         /* AP_DTYPE_NONE: keep the model's */
    int32_t prefix_cache;      /* radix/prefix caching: AP_OPTION_UNSET, 0 or 1 (unset = on) */
    int32_t chunked_prefill;   /* AP_OPTION_UNSET, 0 or 1 (unset = off) */
    int32_t cuda_graphs;       /* AP_OPTION_UNSET, 0 or 1 (unset = off) */
    const ap_option_kv *extra; /* backend-specific keys, in config order */
    size_t num_extra;
} ap_options;

/* Where one layer's KV cache lives. Layout NHD, per page:
 *   k_pages: [num_pages][page_size][num_kv_heads][head_dim_qk] elements of `dtype`
 *   v_pages: [num_pages][page_size][num_kv_heads][head_dim_v]  (NULL for MLA's single latent)
 * For NVFP4, two 4-bit values share a byte (low nibble first) and *_block_scales hold one
 * e4m3 byte per 16 values in the same [page][slot][head][dim/16] order. The host allocates
 * following the backend's ap_kv_spec. Device pointers for GPU backends, host for cpu_ref. */
typedef enum ap_kv_layout {
    AP_KV_LAYOUT_NHD = 0 /* [page][slot][head][dim]: the token-major layout SGLang uses */
} ap_kv_layout;

typedef struct ap_kv_cache {
    size_t struct_size;
    ap_kv_layout layout;
    ap_dtype dtype;
    int32_t page_size;
    int32_t num_pages;
    int32_t num_kv_heads;
    int32_t head_dim_qk;
    int32_t head_dim_v;
    void *k_pages;
    void *v_pages;
    void *k_block_scales; /* NVFP4 only, else NULL */
    void *v_block_scales; /* NVFP4 only, else NULL */
} ap_kv_cache;

/* Bytes a backend needs per page and layer, and the alignment of each base pointer. */
typedef struct ap_kv_spec {
    size_t struct_size;
    size_t k_bytes_per_page;
    size_t v_bytes_per_page;
    size_t scale_bytes_per_page; /* per k and per v; 0 unless NVFP4 */
    size_t alignment;            /* of every base pointer, in bytes */
} ap_kv_spec;

typedef enum ap_forward_mode {
    AP_MODE_EXTEND = 0, /* any number of new tokens per sequence, over a cached prefix */
    AP_MODE_DECODE = 1  /* exactly one new token per sequence */
} ap_forward_mode;

/* One forward's batch, in CSR form. Arrays of int32. Sequence i has
 *   q_len[i]   = qo_indptr[i+1] - qo_indptr[i]   new tokens (1 in decode)
 *   seq_lens[i]                                  tokens in the cache after this forward
 *   prefix     = seq_lens[i] - q_len[i]          tokens cached before it
 *   pages        kv_page_indices[kv_page_indptr[i] .. kv_page_indptr[i+1])
 *   seq_lens[i] == (num_pages - 1) * page_size + kv_last_page_len[i]   (num_pages >= 1)
 * New token j of sequence i sits at position prefix + j of its sequence. For an embedding
 * batch that skips the cache the page arrays may be NULL.
 * Device arrays are device pointers for GPU backends; the *_host mirrors are host pointers
 * that a backend with caps.needs_host_mirrors reads in init_metadata (cpu_ref reads only them).
 *
 * The core's promise: before init_metadata it checks, and a backend may trust,
 *  - struct_size covers ABI 1.0; mode is extend or decode; 1 <= num_seqs <= model.max_batch;
 *    1 <= num_tokens <= model.max_tokens; decode: no embedding model, num_tokens == num_seqs;
 *  - qo_indptr and seq_lens set; the three page arrays set (NULL only for an embedding model on
 *    an AP_FEATURE_EMBEDDING_SKIP_KV backend); every host mirror set when caps say
 *    needs_host_mirrors.
 * When the host mirrors are given, also: both indptrs start at 0, never decrease and end at
 * num_tokens / num_pages_total; every q_len is 1 in decode; q_len <= seq_len <= model.max_kv_len;
 * max_q_len and max_seq_len are the maxima; EVERY SEQUENCE HAS AT LEAST ONE PAGE (an empty
 * sequence is not sent; a sequence with no page is refused) and its pages hold exactly seq_len
 * (the formula above, last in 1..page_size); every page index >= 0. Each forward's layer cache
 * is then checked to hold the largest page index. The device arrays are not read: without host
 * mirrors (graph replay) they reach the backend unchecked. A backend checks only its own,
 * stricter limits; one that indexes host arrays by the batch may check again for a third-party
 * core (the CUDA kit's ap_kit_batch_check states the same rules). */
typedef struct ap_batch {
    size_t struct_size;
    ap_forward_mode mode;
    int32_t num_seqs;
    int32_t num_tokens;              /* qo_indptr[num_seqs]: new tokens in this forward */
    int32_t max_q_len;               /* largest q_len[i] */
    int32_t max_seq_len;             /* largest seq_lens[i] */
    int32_t num_pages_total;         /* kv_page_indptr[num_seqs] */
    const int32_t *qo_indptr;        /* [num_seqs + 1] */
    const int32_t *kv_page_indptr;   /* [num_seqs + 1] */
    const int32_t *kv_page_indices;  /* [num_pages_total] */
    const int32_t *kv_last_page_len; /* [num_seqs], in 1..page_size */
    const int32_t *seq_lens;         /* [num_seqs] */
    const int32_t *positions;        /* [num_tokens] RoPE positions (used by append_kv/1) */
    const int32_t *qo_indptr_host;
    const int32_t *kv_page_indptr_host;
    const int32_t *kv_page_indices_host;
    const int32_t *kv_last_page_len_host;
    const int32_t *seq_lens_host;
    const int32_t *positions_host;

    /* ABI 1.1: a ragged K/V source for forward_extend. A backend reads these fields only when
     * AP_HAS_FIELD(batch, ap_batch, kv_causal) holds; an ABI 1.0 host's batch ends above.
     * kv_indptr NULL: keys come from the paged cache (and the new tokens), as described above.
     * kv_indptr set: the batch reads no cache. Sequence i's keys and values are rows
     * kv_indptr[i] .. kv_indptr[i+1] of args->k and args->v (kv_len[i] of them), and
     *   kv_causal = 1: query row j of a sequence with q_len rows sees keys 0 .. kv_len - q_len + j
     *                  (causal aligned to the end; kv_indptr equal to qo_indptr is plain ragged
     *                  prefill over the new tokens, or an embedding forward that skips the cache)
     *   kv_causal = 0: every query row sees every key of its sequence (a packed prefix chunk of
     *                  MLA chunked prefill, whose keys all precede the new tokens).
     * With kv_causal = 1 every sequence has kv_len >= q_len; with 0 a sequence may have no key
     * (a chunk that does not reach it): its rows get out = 0 and lse = -inf, which merge_state/1
     * passes over. k and v have the model's activation dtype or fp8_e4m3 (as
     * pack_prefix_chunk_kv/1 writes them), real value = stored * layer->k_scale / v_scale.
     * MHA models take k [kv][Hkv][head_dim_qk], v [kv][Hkv][head_dim_v]. MLA uses it in the MHA
     * form only: q [T][H][qk_nope + qk_rope] (no q_rope), k [kv][H][qk_nope + qk_rope],
     * v [kv][H][v_head_dim], out [T][H][v_head_dim] (the MHA form without kv_indptr attends over
     * the new tokens' own k/v, masked as model.causal says). save_kv must be 0; page arrays may
     * be NULL (and are not read), and so may layer->kv. Backends that read mirrors need
     * kv_indptr_host; a batch without the source leaves kv_indptr and kv_indptr_host NULL and
     * num_kv_tokens 0. */
    const int32_t *kv_indptr;      /* [num_seqs + 1], device (host pointer for cpu_ref), or NULL */
    const int32_t *kv_indptr_host; /* host mirror, read by backends with needs_host_mirrors */
    int32_t num_kv_tokens;         /* kv_indptr[num_seqs]; 0 when kv_indptr is NULL */
    int32_t kv_causal;             /* 1: causal aligned to the end; 0: no mask */
} ap_batch;

/* One layer's parameters and its view of the KV cache. */
typedef struct ap_layer {
    size_t struct_size;
    int32_t layer_id;
    float sm_scale;      /* softmax scale, usually 1/sqrt(head_dim_qk) */
    float logit_softcap; /* 0: off; else logits = cap * tanh(logits / cap) */
    float k_scale;       /* fp8: real K = stored * k_scale; nvfp4: the global scale. 1 otherwise.
                          * MLA: the scale of the whole latent row [c | k_pe] (V = c included) */
    float v_scale;       /* the same for V; unused by MLA's latent cache */
    int32_t window_left; /* sliding window: attend to the last window_left + 1 positions; -1 off */
    const ap_kv_cache *kv;
} ap_layer;

/* Tensors of one forward call. Shapes, row-major, dense in the last dim:
 *   q   [num_tokens][num_qo_heads][head_dim_qk]
 *   k   [num_tokens][num_kv_heads][head_dim_qk]   new keys, or NULL (already in the cache)
 *   v   [num_tokens][num_kv_heads][head_dim_v]
 *   out [num_tokens][num_qo_heads][head_dim_v]
 *   lse [num_tokens][num_qo_heads] float32, natural log of the softmax denominator over the
 *       scaled logits (optional: NULL)
 * save_kv = 1 writes k/v into the cache (quantized when it is fp8/nvfp4) before attending.
 *
 * MLA, absorbed form (forward_decode; and forward_extend over the paged cache): the cache holds
 * one latent row per token, [c | k_pe] = kv_lora_rank + qk_rope_head_dim values (576 = 512 + 64
 * in DeepSeek-V3), one KV "head" that every query head reads; v_pages is NULL.
 *   q      [T][Hq][kv_lora_rank]     q_nope, already absorbed (W_UK folded in)
 *   q_rope [T][Hq][qk_rope_head_dim] its rope part, already rotated
 *          q and q_rope are read where they are: each row dense, the rows at any stride (slices
 *          of one wider tensor pass, nothing is concatenated). Or q [T][Hq][576] and q_rope NULL.
 *   k      [T][1][576] the new tokens' latent rows (k_pe already rotated), for save_kv; v NULL
 *   out    [T][Hq][kv_lora_rank]     (W_UV is the host's to apply)
 *   logit  = sm_scale * (q_nope . c + q_rope . k_pe),  out = softmax . c,  lse as above.
 *   Scales: the whole 576-wide row is one tensor quantized with layer->k_scale (fp8: stored =
 *   saturate(x / k_scale), real = stored * k_scale, for c and k_pe alike, so V = c uses k_scale
 *   too); layer->v_scale is not used by the latent cache.
 * MTP / speculative verification (1..n query tokens per sequence) is an EXTEND batch in this
 * absorbed form: decode stays exactly one token per sequence. New token j of a sequence with
 * q_len new tokens sits at position prefix + j and sees positions 0 .. prefix + j (causal among
 * the new tokens, aligned to the end), over the paged latent cache.
 * MLA, MHA form (chunked prefill, forward_extend): q [T][Hq][qk_nope + qk_rope] without q_rope;
 * per-head k [kv][Hq][qk_nope + qk_rope] and v [kv][Hq][v_head_dim] (see ap_batch's ragged K/V
 * source); out [T][Hq][v_head_dim].
 *
 * The core's promise: before forward_* it checks, and a backend may trust, that a batch of this
 * mode is planned; struct_size covers ABI 1.0; save_kv is 0 or 1 (1 only when the plan had all
 * page arrays); the layer and its cache are the model's (layout, dtype, page size, heads, dims,
 * pages enough for the batch's largest page index, fp8 scales finite and > 0); every given
 * tensor has the shape above with num_tokens of the planned batch (k and v: num_kv_tokens rows
 * with the ragged K/V source, where they may also be fp8_e4m3), the model's dtype (lse float32),
 * no negative dim, the instance's device (kDLCUDA with its ordinal, or kDLCPU), and q, out,
 * lse, k, v dense (MLA's absorbed q and q_rope: dense rows at any row stride); k and v come
 * together (MLA's absorbed k alone). Not checked: data pointers' alignment beyond the element,
 * and a backend's own limits (softcap, window, head dims): those are its to check. */
typedef struct ap_forward_args {
    size_t struct_size;
    const DLTensor *q;
    const DLTensor *k;
    const DLTensor *v;
    DLTensor *out;
    DLTensor *lse;
    int32_t save_kv;
    const DLTensor *q_rope; /* MLA only */
} ap_forward_args;

/* ---------------------------------------------------------------------------------------------
 * The vtable: required entries (a NULL one rejects the plugin at load, naming the entry)
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_backend ap_backend; /* a plugin's instance; opaque to the core */

typedef struct ap_vtable {
    size_t struct_size;

    /* Pre-flight: may this backend serve this model with these options on this device? No GPU
     * work, no allocation. Adds one line to `reasons` for EVERY cause of refusal (not just the
     * first) and returns AP_ERR_REFUSED, or returns AP_OK with `reasons` untouched. The model
     * already carries the options' page size and KV dtype. */
    ap_status (*validate)(const ap_model *model, const ap_options *options, const ap_device *device,
                          ap_msgbuf *reasons);

    /* Make an instance. Allocates what the backend needs for the model's largest batch. */
    ap_status (*create)(const ap_model *model, const ap_options *options, const ap_device *device,
                        ap_backend **out, ap_msgbuf *msg);

    /* Free an instance and everything it owns. NULL is a no-op. */
    void (*destroy)(ap_backend *backend);

    /* Bytes per page and layer the host must allocate for the KV cache, and their alignment. */
    ap_status (*get_kv_spec)(ap_backend *backend, ap_kv_spec *out, ap_msgbuf *msg);

    /* Plan one forward: once per batch, shared by all layers. May read the host mirrors when the
     * caps say so. Must not keep pointers into `batch` past the forward_* calls of this batch. */
    ap_status (*init_metadata)(ap_backend *backend, const ap_batch *batch, void *stream,
                               ap_msgbuf *msg);

    /* Run one layer of an extend (prefill) batch planned by the last init_metadata. */
    ap_status (*forward_extend)(ap_backend *backend, const ap_layer *layer,
                                const ap_forward_args *args, void *stream, ap_msgbuf *msg);

    /* Run one layer of a decode batch planned by the last init_metadata. */
    ap_status (*forward_decode)(ap_backend *backend, const ap_layer *layer,
                                const ap_forward_args *args, void *stream, ap_msgbuf *msg);

    /* Optional functionality by name ("append_kv/1"): a function pointer or NULL. Called once
     * per instance and name by the core; the answer must not change during the instance. */
    void *(*get_hook)(ap_backend *backend, const char *name);
} ap_vtable;

/* ---------------------------------------------------------------------------------------------
 * The descriptor and the negotiation
 * ------------------------------------------------------------------------------------------- */

typedef struct ap_descriptor {
    size_t struct_size;
    const char *name;        /* unique backend name: [a-z0-9_]+ */
    const char *version;     /* the plugin's own version, e.g. "0.1.0" */
    const char *description; /* one line */
    const ap_caps *caps;
    const ap_vtable *vtable;
} ap_descriptor;

/* What the core offers. */
typedef struct ap_negotiate_offer {
    size_t struct_size;
    uint32_t core_abi_major;
    uint32_t core_abi_minor;
} ap_negotiate_offer;

/* What the plugin answers. On refusal it returns AP_ERR_ABI_MISMATCH and explains in `msg`. */
typedef struct ap_negotiate_reply {
    size_t struct_size;
    uint32_t plugin_abi_major; /* the version the plugin serves */
    uint32_t plugin_abi_minor;
    const ap_descriptor *descriptor; /* static storage; lives as long as the plugin is open */
} ap_negotiate_reply;

typedef ap_status (*ap_plugin_negotiate_fn)(const ap_negotiate_offer *offer,
                                            ap_negotiate_reply *reply, ap_msgbuf *msg);

/* The negotiation every plugin does, written once (AP_PLUGIN_DEFINE calls it): the offer and the
 * reply must hold their ABI 1.0 fields; the core's major must equal ours and its minor may not be
 * below ours (it would not know our fields). A newer core of the same major gets our minor. */
static inline ap_status ap_plugin_negotiate_answer(const ap_descriptor *descriptor,
                                                   const ap_negotiate_offer *offer,
                                                   ap_negotiate_reply *reply, ap_msgbuf *msg) {
    const char *name = descriptor != NULL && descriptor->name != NULL ? descriptor->name : "plugin";
    if (offer == NULL || reply == NULL ||
        !AP_HAS_FIELD(offer, ap_negotiate_offer, core_abi_minor) ||
        !AP_HAS_FIELD(reply, ap_negotiate_reply, descriptor)) {
        ap_msgbuf_add(msg, "%s: negotiation needs an offer and a reply with struct_size set", name);
        return AP_ERR_INVALID_ARGUMENT;
    }
    uint32_t our_minor = AP_ABI_VERSION_MINOR; /* a variable: with minor 0 the test is moot */
    if (offer->core_abi_major != AP_ABI_VERSION_MAJOR || offer->core_abi_minor < our_minor) {
        ap_msgbuf_add(msg, "%s: built for plugin ABI %u.%u; the core offers %u.%u", name,
                      (unsigned)AP_ABI_VERSION_MAJOR, (unsigned)AP_ABI_VERSION_MINOR,
                      (unsigned)offer->core_abi_major, (unsigned)offer->core_abi_minor);
        return AP_ERR_ABI_MISMATCH;
    }
    reply->plugin_abi_major = AP_ABI_VERSION_MAJOR;
    reply->plugin_abi_minor = AP_ABI_VERSION_MINOR;
    reply->descriptor = descriptor;
    return AP_OK;
}

/* The start every create() shares, written once: `out` checked and cleared; the request
 * validated again (a third-party core may skip validate(): never build an instance it would
 * refuse); `size` zeroed bytes allocated for the instance, the model copied into it at
 * `model_offset` (struct_size set to this header's, the name dropped: the caller's string may not
 * outlive the call). Returns the instance, or NULL with *status and a message. The caller sets
 * *out only once the rest of its create() succeeded:
 *     ap_backend *b = ap_plugin_create_begin(my_validate, model, options, device, out,
 *                                            sizeof *b, offsetof(ap_backend, model), "my", msg, &st);
 */
static inline void *ap_plugin_create_begin(
    ap_status (*validate)(const ap_model *, const ap_options *, const ap_device *, ap_msgbuf *),
    const ap_model *model, const ap_options *options, const ap_device *device, ap_backend **out,
    size_t size, size_t model_offset, const char *name, ap_msgbuf *msg, ap_status *status) {
    if (out == NULL) {
        ap_msgbuf_add(msg, "%s: create needs somewhere to put the instance", name);
        *status = AP_ERR_INVALID_ARGUMENT;
        return NULL;
    }
    *out = NULL;
    *status = validate(model, options, device, msg);
    if (*status != AP_OK) return NULL;
    void *instance = calloc(1, size);
    if (instance == NULL) {
        ap_msgbuf_add(msg, "%s: out of host memory", name);
        *status = AP_ERR_OUT_OF_MEMORY;
        return NULL;
    }
    ap_model *copy = (ap_model *)((char *)instance + model_offset);
    memcpy(copy, model, sizeof *copy);
    copy->struct_size = sizeof *copy;
    copy->name = NULL;
    return instance;
}

#ifdef __cplusplus
#define AP_EXTERN_C extern "C"
#else
#define AP_EXTERN_C
#endif

/* A plugin's one exported entry, from its descriptor: write the descriptor (static storage) and
 * one line at file scope,
 *     AP_PLUGIN_DEFINE(&my_descriptor)
 * The argument is evaluated on each negotiation, so it may be a call that finishes the
 * descriptor first (flashinfer_like fills its caps' arch list so). */
#define AP_PLUGIN_DEFINE(descriptor) \
    AP_EXTERN_C AP_PLUGIN_EXPORT ap_status ap_plugin_negotiate( \
        const ap_negotiate_offer *offer, ap_negotiate_reply *reply, ap_msgbuf *msg); \
    AP_EXTERN_C AP_PLUGIN_EXPORT ap_status ap_plugin_negotiate( \
        const ap_negotiate_offer *offer, ap_negotiate_reply *reply, ap_msgbuf *msg) { \
        return ap_plugin_negotiate_answer((descriptor), offer, reply, msg); \
    }

/* ---------------------------------------------------------------------------------------------
 * Optional hooks, found by name. The core resolves each once per instance and wraps it; a host
 * gets AP_ERR_UNSUPPORTED where the hook is absent and takes its unfused path. Third parties
 * may define more names without an ABI change: "vendor.name/1".
 * ------------------------------------------------------------------------------------------- */

/* "append_kv/1": fused RoPE + quantize + paged KV append, one kernel.
 *   q, k       [num_tokens][heads][head_dim_qk]: rotated on the first rotary_dim dims of each
 *              head at positions[t]; q_out receives rotated q (q_out may alias q).
 *   v          [num_tokens][num_kv_heads][head_dim_v]: written as is (quantized).
 *   cos_sin    [max_position][rotary_dim] float32: cos in the first rotary_dim/2 columns, sin in
 *              the rest; row p holds cos(p * f_i), sin(p * f_i), f_i = base^(-2i/rotary_dim).
 *   is_neox    1: rotate pairs (i, i + rotary_dim/2); 0: interleaved pairs (2i, 2i+1).
 *   out_loc    [num_tokens] int32 slot = page * page_size + offset where token t is written.
 *   k and v are stored as round(x / layer->k_scale) (resp. v_scale) in the cache's dtype;
 *   nvfp4 quantizes blocks of 16 with k_scale / v_scale as the global scale (backends/common/
 *   nvfp4_host.h).
 * MLA form (the model's kind is MLA):
 *   k          [num_tokens][1][kv_lora_rank + qk_rope_head_dim]: the new latent rows [c | k_pe],
 *              k_pe not rotated yet; c is written as is, k_pe rotated, the whole row quantized
 *              with layer->k_scale (fp8: saturate(x / k_scale)) into head 0 of slot out_loc[t].
 *   v          NULL (V is the latent's first kv_lora_rank values).
 *   q, q_out   q_rope [num_tokens][num_qo_heads][qk_rope_head_dim], optional: rotated whole;
 *              read and written in place (rows dense, any row stride: the rope slice of the
 *              projection's q; q_out may alias q).
 *   rotary_dim == qk_rope_head_dim; is_neox as the model's RoPE (DeepSeek-V3: 0). */
#define AP_HOOK_APPEND_KV_V1 "append_kv/1"
typedef struct ap_append_kv_args {
    size_t struct_size;
    const DLTensor *q;
    DLTensor *q_out;
    const DLTensor *k;
    const DLTensor *v;
    const DLTensor *positions; /* int32 [num_tokens] */
    const DLTensor *out_loc;   /* int32 [num_tokens] */
    const DLTensor *cos_sin;   /* float32 [max_position][rotary_dim] */
    int32_t rotary_dim;        /* even, <= head_dim_qk */
    int32_t is_neox;
} ap_append_kv_args;
typedef ap_status (*ap_hook_append_kv_v1)(ap_backend *backend, const ap_layer *layer,
                                          const ap_append_kv_args *args, void *stream,
                                          ap_msgbuf *msg);

/* "pack_prefix_chunk_kv/1": MLA chunked prefill, concat + per-tensor FP8 quantize in one pass.
 *   k_nope [tokens][heads][qk_nope_head_dim]
 *   k_pe   [tokens][qk_rope_head_dim] or [tokens][1][qk_rope_head_dim]: broadcast over heads
 *   v      [tokens][heads][v_head_dim]
 *   k_out  [tokens][heads][qk_nope_head_dim + qk_rope_head_dim] fp8: k_nope first, then k_pe
 *   v_out  [tokens][heads][v_head_dim] fp8
 *   each output element = saturate_fp8(x / scale) with k_scale for K and v_scale for V.
 * Inputs may be strided (any DLTensor strides); outputs are dense. */
#define AP_HOOK_PACK_PREFIX_CHUNK_KV_V1 "pack_prefix_chunk_kv/1"
typedef struct ap_pack_kv_args {
    size_t struct_size;
    const DLTensor *k_nope;
    const DLTensor *k_pe;
    const DLTensor *v;
    DLTensor *k_out;
    DLTensor *v_out;
    float k_scale;
    float v_scale;
} ap_pack_kv_args;
typedef ap_status (*ap_hook_pack_prefix_chunk_kv_v1)(ap_backend *backend,
                                                     const ap_pack_kv_args *args, void *stream,
                                                     ap_msgbuf *msg);

/* "merge_state/1": the exact log-sum-exp merge of two partial attention results over disjoint
 * key sets (chunked prefill: the pass over the new tokens and the pass over a prefix chunk):
 *   m = max(lse_a, lse_b), w_a = exp(lse_a - m), w_b = exp(lse_b - m)
 *   o = (w_a * o_a + w_b * o_b) / (w_a + w_b),  lse = m + log(w_a + w_b)
 *   o_a, o_b, o  [tokens][heads][dim], one dtype (bf16, f16 or f32), dense
 *   lse_a, lse_b [tokens][heads] float32, natural log, as forward_extend writes it; lse optional
 * A row with lse = -inf on one side (no keys) takes the other side's o and lse exactly, and the
 * empty side's o is not read (it may hold anything, NaN included); -inf on both gives o = 0 and
 * lse = -inf. Other lse values are finite. o may alias o_a or o_b and lse may alias lse_a or
 * lse_b (in-place accumulation). Hosts call it through ap_instance_merge_state. */
#define AP_HOOK_MERGE_STATE_V1 "merge_state/1"
typedef struct ap_merge_state_args {
    size_t struct_size;
    const DLTensor *o_a;
    const DLTensor *lse_a;
    const DLTensor *o_b;
    const DLTensor *lse_b;
    DLTensor *o;
    DLTensor *lse; /* optional: NULL */
} ap_merge_state_args;
typedef ap_status (*ap_hook_merge_state_v1)(ap_backend *backend, const ap_merge_state_args *args,
                                            void *stream, ap_msgbuf *msg);

/* "cuda_graph/1": prepare for CUDA-graph capture of batches up to max_batch sequences. After it,
 * init_metadata allocates nothing and reads no host mirror, and the forward_* calls that the
 * caps' cuda_graph level names launch only kernels on `stream`. */
#define AP_HOOK_CUDA_GRAPH_V1 "cuda_graph/1"
typedef ap_status (*ap_hook_cuda_graph_v1)(ap_backend *backend, int32_t max_batch, void *stream,
                                           ap_msgbuf *msg);

#ifdef __cplusplus
}
#endif

#endif /* ATTNPLUG_PLUGIN_API_H */
