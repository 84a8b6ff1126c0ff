/* model_presets.c: the table of example models shared by ap-inspect and the example engine. */
#include "model_presets.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define AP_PRESET_LLAMA "meta-llama/Llama-3-8B"
#define AP_PRESET_DEEPSEEK "deepseek-ai/DeepSeek-V3"
#define AP_PRESET_QWEN_EMB "Qwen/Qwen3-Embedding-8B"

/* Shapes per GPU (no tensor parallelism). MLA's head dims are the absorbed-decode view: the
 * latent cache row is kv_lora_rank + qk_rope_head_dim wide and V is the latent itself. */
static const ap_model_preset ap_presets[] = {
    {AP_PRESET_LLAMA,
     "Llama-3-8B-like GQA: 32 query heads, 8 KV heads, head dim 128, bf16, 32 layers",
     {.struct_size = sizeof(ap_model),
      .name = AP_PRESET_LLAMA,
      .kind = AP_ATTN_MHA,
      .num_qo_heads = 32,
      .num_kv_heads = 8,
      .head_dim_qk = 128,
      .head_dim_v = 128,
      .dtype = AP_DTYPE_BF16,
      .kv_dtype = AP_DTYPE_BF16,
      .page_size = 16,
      .num_layers = 32,
      .causal = 1,
      .max_batch = 256,
      .max_tokens = 8192,
      .max_kv_len = 8192}},
    {AP_PRESET_DEEPSEEK,
     "DeepSeek-V3-like MLA: 128 heads, kv_lora_rank 512, rope 64, nope 128, v 128, 61 layers",
     {.struct_size = sizeof(ap_model),
      .name = AP_PRESET_DEEPSEEK,
      .kind = AP_ATTN_MLA,
      .num_qo_heads = 128,
      .num_kv_heads = 1,
      .head_dim_qk = 576,
      .head_dim_v = 512,
      .kv_lora_rank = 512,
      .qk_rope_head_dim = 64,
      .qk_nope_head_dim = 128,
      .v_head_dim = 128,
      .dtype = AP_DTYPE_BF16,
      .kv_dtype = AP_DTYPE_BF16,
      .page_size = 64,
      .num_layers = 61,
      .causal = 1,
      .max_batch = 128,
      .max_tokens = 8192,
      .max_kv_len = 16384}},
    {AP_PRESET_QWEN_EMB,
     "Qwen3-Embedding-like: embedding model, 32 query heads, 8 KV heads, head dim 128, 36 layers",
     {.struct_size = sizeof(ap_model),
      .name = AP_PRESET_QWEN_EMB,
      .kind = AP_ATTN_MHA,
      .num_qo_heads = 32,
      .num_kv_heads = 8,
      .head_dim_qk = 128,
      .head_dim_v = 128,
      .dtype = AP_DTYPE_BF16,
      .kv_dtype = AP_DTYPE_BF16,
      .page_size = 16,
      .num_layers = 36,
      .causal = 1,
      .embedding = 1,
      .max_batch = 64,
      .max_tokens = 8192,
      .max_kv_len = 8192}},
};

#define AP_PRESET_COUNT (sizeof(ap_presets) / sizeof(ap_presets[0]))

size_t ap_preset_count(void) {
    return AP_PRESET_COUNT;
}

const ap_model_preset *ap_preset_at(size_t index) {
    return index < AP_PRESET_COUNT ? &ap_presets[index] : NULL;
}

const ap_model_preset *ap_preset_find(const char *name) {
    if (name == NULL) return NULL;
    for (size_t i = 0; i < AP_PRESET_COUNT; i++)
        if (strcmp(ap_presets[i].name, name) == 0) return &ap_presets[i];
    for (size_t i = 0; i < AP_PRESET_COUNT; i++)
        if (strcasecmp(ap_presets[i].name, name) == 0) return &ap_presets[i];
    return NULL;
}

const ap_model_preset *ap_preset_for_kind(ap_attn_kind kind) {
    for (size_t i = 0; i < AP_PRESET_COUNT; i++)
        if (ap_presets[i].model.kind == kind && !ap_presets[i].model.embedding)
            return &ap_presets[i];
    return NULL;
}

/* Parse a whole decimal integer in [min, max]. */
static int ap_spec_int(const char *text, long long min, long long max, long long *out) {
    char *end = NULL;
    errno = 0;
    long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max) return 0;
    *out = value;
    return 1;
}

typedef enum ap_spec_field {
    AP_SPEC_I32,
    AP_SPEC_I64,
    AP_SPEC_DTYPE,
    AP_SPEC_KIND,
    AP_SPEC_HEAD_DIM
} ap_spec_field;

typedef struct ap_spec_key {
    const char *key;
    ap_spec_field type;
    size_t offset;
    long long min, max;
} ap_spec_key;

#define AP_SPEC_I32_KEY(key, field, min, max) \
    { key, AP_SPEC_I32, offsetof(ap_model, field), min, max }

static const ap_spec_key ap_spec_keys[] = {
    {"kind", AP_SPEC_KIND, offsetof(ap_model, kind), 0, 0},
    AP_SPEC_I32_KEY("qo_heads", num_qo_heads, 1, 4096),
    AP_SPEC_I32_KEY("kv_heads", num_kv_heads, 1, 4096),
    {"head_dim", AP_SPEC_HEAD_DIM, 0, 1, 4096},
    AP_SPEC_I32_KEY("head_dim_qk", head_dim_qk, 1, 4096),
    AP_SPEC_I32_KEY("head_dim_v", head_dim_v, 1, 4096),
    AP_SPEC_I32_KEY("kv_lora_rank", kv_lora_rank, 0, 4096),
    AP_SPEC_I32_KEY("qk_rope_head_dim", qk_rope_head_dim, 0, 4096),
    AP_SPEC_I32_KEY("qk_nope_head_dim", qk_nope_head_dim, 0, 4096),
    AP_SPEC_I32_KEY("v_head_dim", v_head_dim, 0, 4096),
    {"dtype", AP_SPEC_DTYPE, offsetof(ap_model, dtype), 0, 0},
    {"kv_dtype", AP_SPEC_DTYPE, offsetof(ap_model, kv_dtype), 0, 0},
    AP_SPEC_I32_KEY("page_size", page_size, 1, 1 << 20),
    AP_SPEC_I32_KEY("layers", num_layers, 1, 1 << 16),
    AP_SPEC_I32_KEY("causal", causal, 0, 1),
    AP_SPEC_I32_KEY("embedding", embedding, 0, 1),
    AP_SPEC_I32_KEY("max_batch", max_batch, 1, 1 << 24),
    AP_SPEC_I32_KEY("max_tokens", max_tokens, 1, 1 << 30),
    {"max_kv_len", AP_SPEC_I64, offsetof(ap_model, max_kv_len), 1, 1ll << 40},
};

/* Apply one KEY=VAL pair. */
static ap_status ap_spec_apply_one(ap_model *model, const char *key, const char *value, char *error,
                                   size_t error_size) {
    const size_t nkeys = sizeof(ap_spec_keys) / sizeof(ap_spec_keys[0]);
    const ap_spec_key *found = NULL;
    for (size_t i = 0; i < nkeys && found == NULL; i++)
        if (strcmp(ap_spec_keys[i].key, key) == 0) found = &ap_spec_keys[i];
    if (found == NULL) {
        snprintf(error, error_size, "unknown model-spec key '%s'", key);
        return AP_ERR_INVALID_ARGUMENT;
    }
    char *field = (char *)model + found->offset;
    long long number = 0;
    switch (found->type) {
        case AP_SPEC_KIND:
            if (strcmp(value, "mha") == 0)
                model->kind = AP_ATTN_MHA;
            else if (strcmp(value, "mla") == 0)
                model->kind = AP_ATTN_MLA;
            else
                goto bad_value;
            return AP_OK;
        case AP_SPEC_DTYPE: {
            ap_dtype dtype = AP_DTYPE_NONE;
            if (ap_dtype_parse(value, &dtype) != AP_OK) goto bad_value;
            memcpy(field, &dtype, sizeof(dtype));
            return AP_OK;
        }
        case AP_SPEC_HEAD_DIM:
            if (!ap_spec_int(value, found->min, found->max, &number)) goto bad_value;
            model->head_dim_qk = model->head_dim_v = (int32_t)number;
            return AP_OK;
        case AP_SPEC_I32: {
            if (!ap_spec_int(value, found->min, found->max, &number)) goto bad_value;
            int32_t narrow = (int32_t)number;
            memcpy(field, &narrow, sizeof(narrow));
            return AP_OK;
        }
        case AP_SPEC_I64: {
            if (!ap_spec_int(value, found->min, found->max, &number)) goto bad_value;
            int64_t wide = number;
            memcpy(field, &wide, sizeof(wide));
            return AP_OK;
        }
    }
bad_value:
    snprintf(error, error_size, "bad value '%s' for model-spec key '%s'", value, key);
    return AP_ERR_INVALID_ARGUMENT;
}

ap_status ap_preset_apply_spec(ap_model *model, const char *spec, char *error, size_t error_size) {
    if (model == NULL || spec == NULL) {
        snprintf(error, error_size, "no model or no spec");
        return AP_ERR_INVALID_ARGUMENT;
    }
    char *copy = strdup(spec);
    if (copy == NULL) {
        snprintf(error, error_size, "out of memory");
        return AP_ERR_OUT_OF_MEMORY;
    }
    ap_status status = AP_OK;
    char *save = NULL;
    for (char *pair = strtok_r(copy, ",", &save); pair != NULL && status == AP_OK;
         pair = strtok_r(NULL, ",", &save)) {
        char *equals = strchr(pair, '=');
        if (equals == NULL || equals == pair) {
            snprintf(error, error_size, "model-spec entry '%s' is not KEY=VALUE", pair);
            status = AP_ERR_INVALID_ARGUMENT;
            break;
        }
        *equals = '\0';
        status = ap_spec_apply_one(model, pair, equals + 1, error, error_size);
    }
    free(copy);
    return status;
}

void ap_model_describe(const ap_model *model, char *text, size_t size) {
    if (model->kind == AP_ATTN_MLA) {
        snprintf(text, size,
                 "mla %dq heads, kv_lora %d, rope %d, nope %d, v %d, %s, kv=%s, page=%d, "
                 "layers=%d%s",
                 model->num_qo_heads, model->kv_lora_rank, model->qk_rope_head_dim,
                 model->qk_nope_head_dim, model->v_head_dim, ap_dtype_str(model->dtype),
                 ap_dtype_str(model->kv_dtype), model->page_size, model->num_layers,
                 model->embedding ? ", embedding" : "");
        return;
    }
    snprintf(text, size, "mha %dq/%dkv heads, d%d/%d, %s, kv=%s, page=%d, layers=%d%s%s",
             model->num_qo_heads, model->num_kv_heads, model->head_dim_qk, model->head_dim_v,
             ap_dtype_str(model->dtype), ap_dtype_str(model->kv_dtype), model->page_size,
             model->num_layers, model->causal ? "" : ", non-causal",
             model->embedding ? ", embedding" : "");
}
