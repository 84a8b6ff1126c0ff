/* engine.h: what the files of the example engine share: arguments, memory, batches, tensors. */
#ifndef AP_ENGINE_H
#define AP_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "attnplug.h"
#include "model_presets.h"

/* ---- command line (engine_main.c) ---------------------------------------------------------- */

typedef struct eng_args {
    const char *config_path; /* NULL: the shipped examples/configs/models.yaml */
    const char *model_name;  /* NULL: every preset some rule of the config matches */
    const char *model_spec;  /* --model-spec KEY=VAL,...: applied to each model run, or NULL */
    int32_t steps;           /* decode steps after the prefill */
    int32_t layers;          /* attention layers run per forward (each with its own cache) */
    int32_t batch;           /* sequences */
    int32_t prompt_len;      /* longest prompt; each sequence draws a length in 1..prompt_len */
    uint64_t seed;
    const char **plugin_dirs;
    size_t num_plugin_dirs;
    ap_dtype kv_dtype; /* --kv-dtype: replaces the rules' KV cache type; AP_DTYPE_NONE: keep */
    int cuda_graphs;   /* --cuda-graphs: decode in CUDA graphs (as a rule's cuda_graphs: true) */
} eng_args;

/* What became of one model. */
typedef enum eng_outcome {
    ENG_RAN = 0,        /* a backend served it and every check passed */
    ENG_NO_BACKEND = 1, /* known and expected: no backend of its rule can serve it here */
    ENG_FAILED = 2      /* a real error: create/forward failed, a check failed, bad input */
} eng_outcome;

typedef struct eng_context {
    const eng_args *args;
    ap_registry *registry;
    const ap_config *config;
    ap_device device;
} eng_context;

/* "s" unless `count` is 1: "1 model ran", "2 models ran". */
static inline const char *eng_plural(int64_t count) {
    return count == 1 ? "" : "s";
}

/* engine_model.c: select, allocate, run and check one model. */
eng_outcome eng_model_run(eng_context *context, const ap_model_preset *preset);

/* ---- random numbers (engine_tensor.c) ------------------------------------------------------- */

typedef struct eng_rng {
    uint64_t state;
} eng_rng;

void eng_rng_seed(eng_rng *rng, uint64_t seed);
uint64_t eng_rng_next(eng_rng *rng);
int32_t eng_rng_range(eng_rng *rng, int32_t low, int32_t high); /* uniform in [low, high] */
float eng_rng_uniform(eng_rng *rng);                            /* uniform in [-1, 1) */

/* ---- memory: host, or device through the CUDA runtime (engine_cuda.cu) --------------------- */

typedef struct eng_memory {
    int on_device;   /* 1: CUDA device memory on `ordinal`; 0: host memory */
    int32_t ordinal; /* CUDA device */
} eng_memory;

/* 1 when the engine was built with the CUDA runtime (the cuda meson feature). */
int eng_cuda_built(void);

ap_status eng_mem_alloc(const eng_memory *memory, size_t bytes, size_t alignment, void **out);
void eng_mem_free(const eng_memory *memory, void *pointer);
ap_status eng_mem_zero(const eng_memory *memory, void *pointer, size_t bytes);
ap_status eng_mem_upload(const eng_memory *memory, void *dst, const void *host_src, size_t bytes);
ap_status eng_mem_download(const eng_memory *memory, void *host_dst, const void *src, size_t bytes);
ap_status eng_mem_sync(const eng_memory *memory); /* wait for the device's queued work */
const char *eng_mem_error(void);                  /* the last CUDA error's text */

/* ---- tensors (engine_tensor.c) -------------------------------------------------------------- */

/* A dense tensor with its host staging copy and, for GPU backends, a device copy. */
typedef struct eng_tensor {
    DLTensor dl; /* what the backend sees: dl.data is host or device memory */
    int64_t shape[4];
    void *host;   /* host copy, always present */
    void *device; /* device copy, NULL for host backends (dl.data == host) */
    size_t bytes;
    ap_dtype dtype;
} eng_tensor;

ap_status eng_tensor_make(eng_tensor *tensor, const eng_memory *memory, ap_dtype dtype, int ndim,
                          const int64_t *shape);
void eng_tensor_free(eng_tensor *tensor, const eng_memory *memory);
void eng_tensor_fill_random(eng_tensor *tensor, eng_rng *rng); /* host copy, uniform [-1, 1) */
ap_status eng_tensor_upload(eng_tensor *tensor, const eng_memory *memory);
ap_status eng_tensor_download(eng_tensor *tensor, const eng_memory *memory);
float eng_tensor_get(const eng_tensor *tensor, size_t index); /* host copy, as float */
size_t eng_tensor_count(const eng_tensor *tensor);
/* The host copy as a kDLCPU tensor of the same shape and dtype (what cpu_ref replays read). */
DLTensor eng_tensor_host_view(const eng_tensor *tensor);
/* ||got - want|| / ||want|| over the host copies; NaN when either holds a NaN or inf. */
double eng_tensor_rel_l2(const eng_tensor *got, const eng_tensor *want);

/* ---- batches and the paged cache (engine_batch.c) ------------------------------------------ */

/* The sequences of a run: their lengths and the pages each owns, for the whole run. */
typedef struct eng_sequences {
    int32_t num_seqs;
    int32_t page_size;
    int32_t num_pages;    /* pages in the pool */
    int32_t *prompt_lens; /* [num_seqs] */
    int32_t *seq_lens;    /* [num_seqs] tokens in the cache after the last forward */
    int32_t *page_table;  /* [num_seqs][pages_per_seq] pool pages, shuffled */
    int32_t pages_per_seq;
} eng_sequences;

ap_status eng_sequences_make(eng_sequences *seqs, eng_rng *rng, int32_t num_seqs,
                             int32_t prompt_len, int32_t steps, int32_t page_size);
void eng_sequences_free(eng_sequences *seqs);

/* One forward's batch arrays, host mirrors and (for GPU backends) device copies. */
typedef struct eng_batch {
    ap_batch batch;
    int32_t *host[6]; /* qo_indptr, kv_page_indptr, kv_page_indices, last_page_len, seq_lens,
                         positions */
    int32_t *device[6];
    size_t counts[6];
} eng_batch;

/* The prefill (every prompt, from an empty cache) or the next decode step (one token each).
 * with_pages = 0 leaves the page arrays NULL (embedding skip-KV). Advances seqs->seq_lens. */
ap_status eng_batch_make(eng_batch *batch, eng_sequences *seqs, ap_forward_mode mode,
                         int with_pages, const eng_memory *memory);
void eng_batch_free(eng_batch *batch, const eng_memory *memory);
/* The batch as a host reader (the cpu_ref replay) takes it: every array its host mirror. */
ap_batch eng_batch_host(const eng_batch *batch);

/* One layer's paged cache: the bytes the backend asked for, in host or device memory. */
typedef struct eng_cache {
    ap_kv_cache kv;
    size_t k_bytes, v_bytes, scale_bytes;
} eng_cache;

ap_status eng_cache_make(eng_cache *cache, const ap_model *model, const ap_kv_spec *spec,
                         int32_t num_pages, const eng_memory *memory);
void eng_cache_free(eng_cache *cache, const eng_memory *memory);

/* ---- the cpu_ref check (engine_check.c) ------------------------------------------------------ */

/* What one layer's last forward was, so cpu_ref can replay it on the same inputs. */
typedef struct eng_replay {
    const ap_model *model;     /* the served model, options applied */
    const ap_options *options; /* the rule's options */
    const ap_layer *layer;     /* the layer as the backend ran it */
    const eng_cache *cache;    /* the cache before the forward (host copy below) */
    void *cache_k_host, *cache_v_host, *cache_scales_host[2];
    const eng_batch *batch; /* host mirrors */
    ap_forward_mode mode;
    int save_kv;
    const eng_tensor *q, *k, *v, *out; /* host copies; out holds the backend's result */
} eng_replay;

/* Replay on cpu_ref and compare by relative L2 error. Returns AP_ERR_UNSUPPORTED (with the
 * reason in `why`) when cpu_ref cannot replay it, else AP_OK with `*rel_error` set. */
ap_status eng_check_against_cpu_ref(ap_registry *registry, const eng_replay *replay,
                                    double *rel_error, char *why, size_t why_size);

/* Largest relative L2 error allowed against cpu_ref for a KV cache dtype. */
double eng_check_tolerance(ap_dtype kv_dtype);

/* A cpu_ref instance for `model` on the CPU with the rule's options (less backend-specific
 * keys), for a replay; AP_ERR_UNSUPPORTED with the reason in `why` when cpu_ref refuses it. */
ap_status eng_open_cpu_ref(ap_registry *registry, const ap_model *model,
                           const ap_options *rule_options, ap_instance **out, char *why,
                           size_t why_size);

/* ---- MLA models (engine_mla.c) ---------------------------------------------------------------
 * Chunked-prefix prefill in MLA's MHA form, merged by merge_state/1, the latent rows appended by
 * append_kv/1, then absorbed decode steps over the latent cache; checked against cpu_ref when
 * another backend serves. `memory` says where the backend's tensors live. */
eng_outcome eng_mla_run(eng_context *context, const ap_options *options, ap_instance *instance,
                        const eng_memory *memory, eng_rng *rng);

/* ---- --kv-dtype (engine_kv_compare.c) ------------------------------------------------------ */

/* Open the model's backend through the config, its KV dtype replaced by --kv-dtype when given.
 * `options` receives the options the backend was opened with. */
ap_status eng_open_model(const eng_context *context, const ap_model *model, ap_options *options,
                         ap_instance **out, ap_selection **walk);

/* A bf16-cache twin of the run on cpu_ref, fed the same batches and activations. */
typedef struct eng_shadow {
    ap_instance *ref;
    eng_cache cache; /* one layer, host memory, bf16 */
    ap_layer layer;
    ap_dtype kv_dtype; /* the run's cache type */
    double prefill_error, last_error, worst_decode_error;
} eng_shadow;

ap_status eng_shadow_open(eng_shadow *shadow, ap_registry *registry, const ap_model *served,
                          const ap_options *options, const ap_layer *like, int32_t num_pages);
/* After one forward of the run: the same forward on the twin, and the run's (downloaded) output
 * against the twin's. */
ap_status eng_shadow_step(eng_shadow *shadow, const eng_batch *batch, ap_forward_mode mode,
                          const eng_tensor *q, const eng_tensor *k, const eng_tensor *v,
                          const eng_tensor *out);
void eng_shadow_report(const eng_shadow *shadow, int32_t layers, int32_t steps);
void eng_shadow_close(eng_shadow *shadow);

/* ---- embedding skip-KV vs the cached path (engine_embed_compare.c) ------------------------ */

/* What the comparison reads of a run served in skip-KV mode, after its checked prefill. */
typedef struct eng_embed_input {
    eng_context *context;
    const ap_options *options; /* the rule's (prefix caching off) */
    ap_instance *skip_instance;
    const eng_sequences *seqs;
    const ap_layer *layers; /* [num_layers], no cache */
    eng_tensor *q, *k, *v, *out;
    const eng_memory *memory;
} eng_embed_input;

/* The same backend opened again with prefix caching on (its cached path), the same q/k/v through
 * every layer of both; prints per-layer time of each and the cosine similarity of the outputs
 * (FAIL at <= 0.99). */
eng_outcome eng_embed_compare(const eng_embed_input *in);

/* ---- --cuda-graphs (engine_graph.cu; engine_graph_host.c without CUDA) --------------------
 * After each eager decode step, the same step as a CUDA-graph replay: every layer's
 * forward_decode captured once (after cuda_graph/1) on buffers of the step's shape, then per step
 * the batch arrays and activations copied in, init_metadata, one graph launch. */
typedef struct eng_graph eng_graph;

typedef struct eng_graph_timing {
    double step_ms;   /* init_metadata + launch + the GPU's work, host wall time */
    double plan_us;   /* init_metadata on the host */
    double launch_us; /* cudaGraphLaunch on the host */
    int equal;        /* the replay's out equals the eager step's bit for bit */
    int captured;     /* this step captured the graph */
} eng_graph_timing;

ap_status eng_graph_open(eng_graph **out, const eng_batch *batch, const eng_tensor *q,
                         const eng_tensor *k, const eng_tensor *v, const eng_tensor *o);
ap_status eng_graph_step(eng_graph *g, ap_instance *instance, const ap_layer *layers,
                         int32_t num_layers, const eng_batch *batch, const eng_tensor *q,
                         const eng_tensor *k, const eng_tensor *v, const eng_tensor *eager_out,
                         int save_kv, eng_graph_timing *timing);
void eng_graph_close(eng_graph *g);

#endif /* AP_ENGINE_H */
