/* model_presets.h: the example models that ap-inspect and the example engine know by name. */
#ifndef AP_MODEL_PRESETS_H
#define AP_MODEL_PRESETS_H

#include <stddef.h>

#include "attnplug.h"

/* One known model: its config-facing name, a one-line summary and its per-GPU shape. */
typedef struct ap_model_preset {
    const char *name;    /* what config rules match, e.g. "meta-llama/Llama-3-8B" */
    const char *summary; /* one line for listings */
    ap_model model;      /* model.name points at `name` */
} ap_model_preset;

size_t ap_preset_count(void);
const ap_model_preset *ap_preset_at(size_t index);

/* The preset named `name` (exact, then case-insensitive), or NULL. */
const ap_model_preset *ap_preset_find(const char *name);

/* The first preset whose attention kind is `kind` (and, for MHA, not an embedding model). */
const ap_model_preset *ap_preset_for_kind(ap_attn_kind kind);

/* Apply "KEY=VAL,KEY=VAL" to `model`. Keys: kind, qo_heads, kv_heads, head_dim (qk and v),
 * head_dim_qk, head_dim_v, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim,
 * dtype, kv_dtype, page_size, layers, causal, embedding, max_batch, max_tokens, max_kv_len.
 * On a bad key or value, returns AP_ERR_INVALID_ARGUMENT and writes why into `error`. */
ap_status ap_preset_apply_spec(ap_model *model, const char *spec, char *error, size_t error_size);

/* One line describing a model's shape: "mha 32q/8kv d128/128 bf16 kv=bf16 page=16 layers=32". */
void ap_model_describe(const ap_model *model, char *text, size_t size);

#endif /* AP_MODEL_PRESETS_H */
