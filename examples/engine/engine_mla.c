/* engine_mla.c: an MLA model through the engine: chunked-prefix prefill, latent append, decode. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_mla.h"

static double eng_mla_now_ms(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec * 1e3 + (double)now.tv_nsec / 1e6;
}

/* One ragged forward_extend with the layer's scales replaced by the pass's own. */
static ap_status eng_mla_extend(const eng_mla_side *side, const eng_mla_rows *rows,
                                const ap_layer *layer, float k_scale, float v_scale, DLTensor *q,
                                DLTensor *k, DLTensor *v, DLTensor *out, DLTensor *lse) {
    ap_batch batch = side->host ? eng_mla_rows_host(rows) : rows->batch;
    ap_layer pass = *layer;
    pass.k_scale = k_scale, pass.v_scale = v_scale;
    pass.kv = NULL; /* the ragged source reads no cache */
    ap_forward_args args = {
        .struct_size = sizeof args, .q = q, .k = k, .v = v, .out = out, .lse = lse};
    ap_status status = ap_instance_init_metadata(side->instance, &batch, NULL);
    if (status == AP_OK) status = ap_instance_forward_extend(side->instance, &pass, &args, NULL);
    return status;
}

/* One layer's chunked-prefix prefill in MLA's MHA form:
 *   (out, lse)     = attention of the new tokens over their own K/V, causal
 *   for each chunk:  pack its stand-ins (fp8), (o_c, lse_c) = attention over it, no mask,
 *                    (out, lse) = merge_state((out, lse), (o_c, lse_c))
 * The latent rows were appended first (the backend side only: the replay reads no cache). */
static ap_status eng_mla_prefill_layer(eng_mla *m, eng_mla_side *side, const ap_layer *layer) {
    int host = side->host;
    DLTensor q = eng_mla_dl(&m->q, host), k = eng_mla_dl(&m->k_new, host);
    DLTensor v = eng_mla_dl(&m->v_new, host);
    ap_status status =
        eng_mla_extend(side, &m->new_rows, layer, 1.0f, 1.0f, &q, &k, &v, &side->out, &side->lse);
    for (int32_t c = 0; c < m->num_chunks && status == AP_OK; c++) {
        eng_mla_chunk *chunk = &m->chunks[c];
        DLTensor k_nope = eng_mla_dl(&chunk->k_nope, host), k_pe = eng_mla_dl(&chunk->k_pe, host);
        DLTensor v_in = eng_mla_dl(&chunk->v, host), k_out = eng_mla_dl(&chunk->k, host);
        DLTensor v_out = eng_mla_dl(&chunk->v_packed, host);
        if (chunk->packed) {
            ap_pack_kv_args pack = {sizeof pack, &k_nope, &k_pe,          &v_in,
                                    &k_out,      &v_out,  chunk->k_scale, chunk->v_scale};
            status = ap_instance_pack_prefix_chunk_kv(side->instance, &pack, NULL);
        }
        if (status == AP_OK)
            status = eng_mla_extend(side, &chunk->rows, layer, chunk->k_scale, chunk->v_scale, &q,
                                    &k_out, &v_out, &side->out_chunk, &side->lse_chunk);
        ap_merge_state_args merge = {sizeof merge,     &side->out, &side->lse, &side->out_chunk,
                                     &side->lse_chunk, &side->out, &side->lse};
        if (status == AP_OK) status = ap_instance_merge_state(side->instance, &merge, NULL);
    }
    return status;
}

/* Every layer: append the prompts' latent rows (k_pe rotated), then the chunked prefill. */
static ap_status eng_mla_prefill(eng_mla *m, double *ms) {
    eng_mla_side side = {m->instance,     0,  m->out.dl, m->lse.dl, m->out_chunk.dl,
                         m->lse_chunk.dl, {0}};
    ap_append_kv_args append = {.struct_size = sizeof append,
                                .k = &m->lat.dl,
                                .positions = &m->lat_pos.dl,
                                .out_loc = &m->lat_loc.dl,
                                .cos_sin = &m->cos_sin.dl,
                                .rotary_dim = m->model->qk_rope_head_dim,
                                .is_neox = 0};
    double start = eng_mla_now_ms();
    ap_status status = AP_OK;
    for (int32_t l = 0; l < m->model->num_layers && status == AP_OK; l++) {
        status = ap_instance_append_kv(m->instance, &m->layers[l], &append, NULL);
        if (status == AP_OK) status = eng_mla_prefill_layer(m, &side, &m->layers[l]);
    }
    if (status == AP_OK) status = eng_mem_sync(&m->memory);
    *ms = eng_mla_now_ms() - start;
    for (int32_t i = 0; i < m->seqs.num_seqs; i++) m->seqs.seq_lens[i] = m->seqs.prompt_lens[i];
    return status;
}

/* q_nope [B][H][512] and q_rope [B][H][64]: views into q_all [B][H][576], read in place. */
static void eng_mla_q_views(eng_mla *m, int host, DLTensor *q_nope, DLTensor *q_rope) {
    const ap_model *md = m->model;
    int64_t b = m->q_all.shape[0], h = md->num_qo_heads, width = md->head_dim_qk;
    m->view_shapes[0][0] = m->view_shapes[1][0] = b;
    m->view_shapes[0][1] = m->view_shapes[1][1] = h;
    m->view_shapes[0][2] = md->kv_lora_rank;
    m->view_shapes[1][2] = md->qk_rope_head_dim;
    m->view_strides[0] = h * width, m->view_strides[1] = width, m->view_strides[2] = 1;
    *q_nope = eng_mla_dl(&m->q_all, host);
    q_nope->shape = m->view_shapes[0];
    q_nope->strides = m->view_strides;
    *q_rope = *q_nope;
    q_rope->shape = m->view_shapes[1];
    q_rope->byte_offset += (uint64_t)md->kv_lora_rank * (ap_dtype_size_bits(md->dtype) / 8);
}

/* One layer of a decode step: the new latent row appended (k_pe and q_rope rotated, q_rope into
 * q_rope_rot), then absorbed attention over the latent cache. */
static ap_status eng_mla_decode_layer(eng_mla *m, eng_mla_side *side, const ap_layer *layer) {
    int host = side->host;
    DLTensor q_nope, q_rope, k = eng_mla_dl(&m->lat_step, host);
    DLTensor pos = eng_mla_dl(&m->pos_step, host), loc = eng_mla_dl(&m->loc_step, host);
    DLTensor cos_sin = eng_mla_dl(&m->cos_sin, host);
    eng_mla_q_views(m, host, &q_nope, &q_rope);
    ap_append_kv_args append = {sizeof append, &q_rope,  &side->q_rope_out,          &k, NULL, &pos,
                                &loc,          &cos_sin, m->model->qk_rope_head_dim, 0};
    ap_status status = ap_instance_append_kv(side->instance, layer, &append, NULL);
    ap_forward_args args = {
        .struct_size = sizeof args, .q = &q_nope, .out = &side->out, .q_rope = &side->q_rope_out};
    if (status == AP_OK) status = ap_instance_forward_decode(side->instance, layer, &args, NULL);
    return status;
}

/* A host copy of the last layer's latent pages: the state its next step starts from. */
static ap_status eng_mla_snapshot(eng_mla *m) {
    const eng_cache *c = &m->caches[m->model->num_layers - 1];
    free(m->snapshot);
    m->snapshot = malloc(c->k_bytes ? c->k_bytes : 1);
    if (m->snapshot == NULL) return AP_ERR_OUT_OF_MEMORY;
    return eng_mem_download(&m->memory, m->snapshot, c->kv.k_pages, c->k_bytes);
}

static ap_status eng_mla_decode_step(eng_mla *m, int checked, double *ms) {
    ap_status status = eng_mla_step_inputs(m);
    if (status == AP_OK && checked) status = eng_mla_snapshot(m);
    if (status != AP_OK) return status;
    eng_mla_side side = {m->instance, 0, m->out_step.dl, {0}, {0}, {0}, m->q_rope_rot.dl};
    double start = eng_mla_now_ms();
    status = ap_instance_init_metadata(m->instance, &m->batch.batch, NULL);
    for (int32_t l = 0; l < m->model->num_layers && status == AP_OK; l++)
        status = eng_mla_decode_layer(m, &side, &m->layers[l]);
    if (status == AP_OK) status = eng_mem_sync(&m->memory);
    *ms = eng_mla_now_ms() - start;
    return status;
}

/* The last layer of the prefill (decode = 0) or of the last decode step, replayed on cpu_ref
 * from the same host inputs into `want` (decode: over a snapshot of the latent pages). */
static ap_status eng_mla_replay(eng_mla *m, ap_instance *ref, int decode, eng_tensor *want) {
    eng_memory host = {0, -1};
    eng_tensor scratch[4]; /* lse, out_chunk, lse_chunk; q_rope rotated */
    memset(scratch, 0, sizeof scratch);
    eng_mla_side side = {ref, 1, eng_tensor_host_view(want), {0}, {0}, {0}, {0}};
    int32_t last = m->model->num_layers - 1;
    ap_layer layer = m->layers[last];
    ap_kv_cache kv = m->caches[last].kv;
    ap_status status = AP_OK;
    if (decode) {
        kv.k_pages = m->snapshot;
        layer.kv = &kv;
        status = eng_tensor_make(&scratch[3], &host, m->q_rope_rot.dtype, 3, m->q_rope_rot.shape);
        side.q_rope_out = eng_tensor_host_view(&scratch[3]);
        ap_batch batch = eng_batch_host(&m->batch);
        if (status == AP_OK) status = ap_instance_init_metadata(ref, &batch, NULL);
        if (status == AP_OK) status = eng_mla_decode_layer(m, &side, &layer);
    } else {
        status = eng_tensor_make(&scratch[0], &host, AP_DTYPE_F32, 2, m->lse.shape);
        if (status == AP_OK)
            status = eng_tensor_make(&scratch[1], &host, want->dtype, 3, want->shape);
        if (status == AP_OK)
            status = eng_tensor_make(&scratch[2], &host, AP_DTYPE_F32, 2, m->lse.shape);
        side.lse = eng_tensor_host_view(&scratch[0]);
        side.out_chunk = eng_tensor_host_view(&scratch[1]);
        side.lse_chunk = eng_tensor_host_view(&scratch[2]);
        if (status == AP_OK) status = eng_mla_prefill_layer(m, &side, &layer);
    }
    for (int i = 0; i < 4; i++) eng_tensor_free(&scratch[i], &host);
    return status;
}

/* Outputs finite, and (unless cpu_ref ran them) equal to cpu_ref's replay within the limit of
 * the cache's dtype, by relative L2 error. */
static eng_outcome eng_mla_check(eng_mla *m, int decode) {
    eng_tensor *got = decode ? &m->out_step : &m->out;
    if (eng_tensor_download(got, &m->memory) != AP_OK) {
        printf("  error: reading the output back: %s\n", eng_mem_error());
        return ENG_FAILED;
    }
    for (size_t i = 0; i < eng_tensor_count(got); i++)
        if (!isfinite(eng_tensor_get(got, i))) {
            printf("  error: the %s output holds NaN or inf\n", decode ? "decode" : "prefill");
            return ENG_FAILED;
        }
    if (strcmp(ap_instance_backend(m->instance), "cpu_ref") == 0) {
        printf("  check: cpu_ref is the reference itself; outputs all finite\n");
        return ENG_RAN;
    }
    char why[1024] = "";
    ap_instance *ref = NULL;
    if (eng_open_cpu_ref(m->context->registry, m->model, &m->rule->options, &ref, why,
                         sizeof why) != AP_OK) {
        printf("  check: skipped: %s\n", why);
        return ENG_RAN;
    }
    eng_memory host = {0, -1};
    eng_tensor want;
    ap_status status = eng_tensor_make(&want, &host, got->dtype, got->dl.ndim, got->shape);
    if (status == AP_OK) memset(want.host, 0xff, want.bytes); /* unwritten shows as NaN */
    if (status == AP_OK) status = eng_mla_replay(m, ref, decode, &want);
    double error = status == AP_OK ? eng_tensor_rel_l2(got, &want) : NAN;
    if (status != AP_OK) printf("  check: error: cpu_ref failed to replay: %s\n", ap_last_error());
    eng_tensor_free(&want, &host);
    ap_instance_close(ref);
    if (status != AP_OK) return ENG_FAILED;
    double limit = eng_check_tolerance(m->model->kv_dtype);
    int pass = isfinite(error) && error <= limit;
    printf("  check vs cpu_ref (layer %d, %s, %d sequences): rel L2 error %.3e (limit %.0e): %s\n",
           m->model->num_layers - 1, decode ? "last decode step" : "prefill", m->seqs.num_seqs,
           error, limit, pass ? "ok" : "FAIL");
    return pass ? ENG_RAN : ENG_FAILED;
}

static void eng_mla_rate(const char *what, int64_t tokens, int32_t layers, double ms) {
    printf("  %s: %lld tokens x %d layers in %.3f ms: %.0f tokens/s\n", what, (long long)tokens,
           layers, ms, ms > 0.0 ? (double)tokens / (ms / 1e3) : 0.0);
}

/* The prefill, checked; then the decode steps, the last one checked. */
static eng_outcome eng_mla_steps(eng_mla *m, int32_t steps) {
    const ap_model *md = m->model;
    printf("  batch: %d sequences, prompt lengths", m->seqs.num_seqs);
    for (int32_t i = 0; i < m->seqs.num_seqs; i++) printf(" %d", m->seqs.prompt_lens[i]);
    printf(" (%d tokens)\n", m->prefix_tokens + m->new_tokens);
    printf("  chunked prefix: %d cached prompt tokens, %d chunks of up to %d per sequence, %s, "
           "merged by merge_state/1\n",
           m->prefix_tokens, m->num_chunks, ENG_MLA_CHUNK,
           m->num_chunks > 0 && m->chunks[0].packed ? "packed to fp8 by pack_prefix_chunk_kv/1"
                                                    : "K/V in the activation type");
    double ms = 0.0, total_ms = 0.0;
    ap_status status = eng_mla_prefill(m, &ms);
    if (status != AP_OK) {
        printf("  error: prefill failed: %s: %s\n", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
        return ENG_FAILED;
    }
    eng_mla_rate("prefill", m->new_tokens, md->num_layers, ms);
    eng_outcome outcome = eng_mla_check(m, 0);
    for (int32_t s = 0; s < steps && outcome == ENG_RAN; s++) {
        status = eng_mla_decode_step(m, s == steps - 1, &ms);
        if (status != AP_OK) {
            printf("  error: decode step %d failed: %s: %s\n", s + 1, ap_status_name(status),
                   status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
            return ENG_FAILED;
        }
        char label[48];
        snprintf(label, sizeof label, "decode step %d", s + 1);
        eng_mla_rate(label, m->seqs.num_seqs, md->num_layers, ms);
        total_ms += ms;
    }
    if (outcome != ENG_RAN || steps == 0) return outcome;
    printf("  decode: %d steps, %.3f ms/step mean, %.0f tokens/s\n", steps, total_ms / steps,
           total_ms > 0.0 ? (double)steps * m->seqs.num_seqs / (total_ms / 1e3) : 0.0);
    return eng_mla_check(m, 1);
}

eng_outcome eng_mla_run(eng_context *context, const ap_config_rule *rule, ap_instance *instance,
                        const eng_memory *memory, eng_rng *rng) {
    eng_mla m;
    memset(&m, 0, sizeof m);
    m.context = context, m.rule = rule, m.instance = instance, m.memory = *memory, m.rng = rng;
    m.model = ap_instance_model(instance);
    printf("  backend: %s on %s\n", ap_instance_backend(instance),
           memory->on_device ? context->device.name : "the CPU (host memory)");
    const char *needed[] = {AP_HOOK_APPEND_KV_V1, AP_HOOK_MERGE_STATE_V1};
    for (int i = 0; i < 2; i++)
        if (!ap_instance_has_hook(instance, needed[i])) {
            printf("  error: this engine drives MLA through the %s hook, which %s lacks\n",
                   needed[i], ap_instance_backend(instance));
            return ENG_FAILED;
        }
    if (m.model->qk_nope_head_dim <= 0 || m.model->v_head_dim <= 0) {
        printf("  error: the MLA model has no qk_nope_head_dim/v_head_dim for its prefill\n");
        return ENG_FAILED;
    }
    int32_t steps = context->args->steps;
    ap_status status = eng_mla_prepare(&m, steps);
    if (status == AP_OK) status = eng_mla_rope_table(&m, context->args->prompt_len + steps + 1);
    if (status == AP_OK) status = eng_mla_prefill_inputs(&m);
    eng_outcome outcome = ENG_FAILED;
    if (status != AP_OK)
        printf("  error: allocating: %s: %s\n", ap_status_name(status),
               status == AP_ERR_CUDA ? eng_mem_error() : ap_last_error());
    else
        outcome = eng_mla_steps(&m, steps);
    eng_mla_free(&m);
    return outcome;
}
