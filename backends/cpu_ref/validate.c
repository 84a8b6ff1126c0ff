/* validate.c: may cpu_ref serve this model? Every reason it cannot, no allocation. */
#include "cpu_ref.h"

static int cpu_dtype_in(ap_dtype dtype, uint32_t mask) {
    return (unsigned)dtype < AP_DTYPE_COUNT && (mask & AP_DTYPE_BIT(dtype)) != 0;
}

static void cpu_validate_kv_dtype(ap_dtype kv_dtype, ap_msgbuf *reasons, int *refused) {
    if (cpu_dtype_in(kv_dtype, CPU_KV_DTYPES)) return;
    *refused = 1;
    if (kv_dtype == AP_DTYPE_NVFP4)
        ap_msgbuf_add(reasons, "cpu_ref: the nvfp4 KV cache is not implemented");
    else
        ap_msgbuf_add(reasons,
                      "cpu_ref: KV cache dtype %s is not one of bf16, f16, fp8_e4m3, "
                      "fp8_e5m2",
                      ap_dtype_str(kv_dtype));
}

/* MLA: one latent KV head of kv_lora_rank + qk_rope_head_dim values per token, V its first
 * kv_lora_rank (the absorbed form); qk_nope_head_dim and v_head_dim size the MHA form of chunked
 * prefill, 0 when the host never runs it. Any widths: the loops take them as they come. */
static void cpu_validate_mla(const ap_model *model, ap_msgbuf *reasons, int *refused) {
    if (model->kv_lora_rank <= 0 || model->qk_rope_head_dim <= 0 || model->num_kv_heads != 1 ||
        model->head_dim_qk != model->kv_lora_rank + model->qk_rope_head_dim ||
        model->head_dim_v != model->kv_lora_rank) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      "cpu_ref: MLA needs kv_lora_rank > 0, qk_rope_head_dim > 0, one KV head, "
                      "head_dim_qk = kv_lora_rank + qk_rope_head_dim and head_dim_v = "
                      "kv_lora_rank (got %d, %d, %d KV heads, %d, %d)",
                      model->kv_lora_rank, model->qk_rope_head_dim, model->num_kv_heads,
                      model->head_dim_qk, model->head_dim_v);
    }
    if (model->qk_nope_head_dim < 0 || model->v_head_dim < 0 ||
        (model->qk_nope_head_dim > 0) != (model->v_head_dim > 0)) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      "cpu_ref: MLA qk_nope_head_dim %d and v_head_dim %d must both be > 0 (the "
                      "MHA form of chunked prefill) or both 0",
                      model->qk_nope_head_dim, model->v_head_dim);
    }
}

static void cpu_validate_shape(const ap_model *model, ap_msgbuf *reasons, int *refused) {
    if (model->kind == AP_ATTN_MLA) {
        cpu_validate_mla(model, reasons, refused);
    } else if (model->kind != AP_ATTN_MHA) {
        *refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: unknown attention kind %d", (int)model->kind);
    }
    if (model->num_qo_heads <= 0 || model->num_kv_heads <= 0 ||
        model->num_qo_heads % model->num_kv_heads != 0) {
        *refused = 1;
        ap_msgbuf_add(reasons,
                      "cpu_ref: %d query heads and %d KV heads: both must be > 0 and "
                      "the KV heads must divide the query heads",
                      model->num_qo_heads, model->num_kv_heads);
    }
    if (model->head_dim_qk <= 0 || model->head_dim_v <= 0) {
        *refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: head dims qk %d and v %d must be > 0", model->head_dim_qk,
                      model->head_dim_v);
    }
    if (model->page_size < 1) {
        *refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: page size %d must be >= 1", model->page_size);
    }
}

/* cpu_ref takes no backend-specific option: an unknown key is most likely a typo, and a typo
 * must not pass silently. */
static void cpu_validate_options(const ap_options *options, ap_msgbuf *reasons, int *refused) {
    if (options == NULL) return;
    if (options->struct_size < sizeof(ap_options)) {
        *refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: ap_options struct_size %zu < %zu", options->struct_size,
                      sizeof(ap_options));
        return;
    }
    for (size_t i = 0; i < options->num_extra && options->extra != NULL; i++) {
        *refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: unknown option '%s' (cpu_ref takes none)",
                      options->extra[i].key != NULL ? options->extra[i].key : "(null)");
    }
}

ap_status cpu_validate(const ap_model *model, const ap_options *options, const ap_device *device,
                       ap_msgbuf *reasons) {
    (void)device; /* the CPU serves whatever GPU there is, or none */
    if (model == NULL) {
        ap_msgbuf_add(reasons, "cpu_ref: no model given");
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (model->struct_size < sizeof(ap_model)) {
        ap_msgbuf_add(reasons, "cpu_ref: ap_model struct_size %zu < %zu (an older ABI)",
                      model->struct_size, sizeof(ap_model));
        return AP_ERR_REFUSED;
    }
    int refused = 0;
    cpu_validate_shape(model, reasons, &refused);
    if (!cpu_dtype_in(model->dtype, CPU_Q_DTYPES)) {
        refused = 1;
        ap_msgbuf_add(reasons, "cpu_ref: query dtype %s is not one of f32, bf16, f16",
                      ap_dtype_str(model->dtype));
    }
    cpu_validate_kv_dtype(model->kv_dtype, reasons, &refused);
    cpu_validate_options(options, reasons, &refused);
    return refused ? AP_ERR_REFUSED : AP_OK;
}
