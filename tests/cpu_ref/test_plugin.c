/* test_plugin.c: cpu_ref's negotiation, descriptor, validate, kv spec, hooks and bad input. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "scenario.h"
#include "tests/common/test_model.h"

static fx_plugin plugin;

static ap_model good_model(void) {
    ap_model m = ap_test_model("test/model", 8, 2, 128, 64, AP_DTYPE_BF16, AP_DTYPE_FP8_E4M3);
    m.max_tokens = 256;
    return m;
}

static size_t count_lines(const char *text) {
    if (text[0] == '\0') return 0;
    size_t lines = 1;
    for (; *text; text++) lines += *text == '\n';
    return lines;
}

static void test_negotiation(void **state) {
    (void)state;
    fx_msg msg;
    ap_negotiate_reply reply = {.struct_size = sizeof reply};
    ap_negotiate_offer same = {sizeof same, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR};
    fx_msg_init(&msg);
    assert_int_equal(plugin.negotiate(&same, &reply, &msg.buf), AP_OK);
    assert_int_equal(reply.plugin_abi_major, AP_ABI_VERSION_MAJOR);
    assert_int_equal(reply.plugin_abi_minor, AP_ABI_VERSION_MINOR);
    assert_non_null(reply.descriptor);
    /* a newer core of the same major gets our (older) minor */
    ap_negotiate_offer newer = {sizeof newer, AP_ABI_VERSION_MAJOR, AP_ABI_VERSION_MINOR + 3};
    reply = (ap_negotiate_reply){.struct_size = sizeof reply};
    assert_int_equal(plugin.negotiate(&newer, &reply, &msg.buf), AP_OK);
    assert_int_equal(reply.plugin_abi_minor, AP_ABI_VERSION_MINOR);
    /* another major is refused, with both versions named */
    ap_negotiate_offer other = {sizeof other, AP_ABI_VERSION_MAJOR + 1, 0};
    reply = (ap_negotiate_reply){.struct_size = sizeof reply};
    fx_msg_init(&msg);
    assert_int_equal(plugin.negotiate(&other, &reply, &msg.buf), AP_ERR_ABI_MISMATCH);
    assert_null(reply.descriptor);
    assert_non_null(strstr(msg.text, "2.0"));
    assert_non_null(strstr(msg.text, "1.1"));
    fx_msg_init(&msg);
    assert_int_equal(plugin.negotiate(NULL, &reply, &msg.buf), AP_ERR_INVALID_ARGUMENT);
    assert_true(msg.buf.length > 0);
}

static void test_descriptor_and_caps(void **state) {
    (void)state;
    const ap_descriptor *d = plugin.descriptor;
    assert_string_equal(d->name, "cpu_ref");
    assert_non_null(d->version);
    assert_non_null(d->description);
    const ap_caps *caps = d->caps;
    assert_int_equal(caps->struct_size, sizeof(ap_caps));
    assert_int_equal(caps->device_kinds, AP_DEVICE_KIND_CPU);
    assert_int_equal(caps->num_archs, 0);
    assert_int_equal(caps->attn_kinds, AP_ATTN_BIT(AP_ATTN_MHA) | AP_ATTN_BIT(AP_ATTN_MLA));
    assert_int_equal(caps->q_dtypes, AP_DTYPE_BIT(AP_DTYPE_F32) | AP_DTYPE_BIT(AP_DTYPE_BF16) |
                                         AP_DTYPE_BIT(AP_DTYPE_F16));
    assert_int_equal(caps->kv_dtypes, AP_DTYPE_BIT(AP_DTYPE_BF16) | AP_DTYPE_BIT(AP_DTYPE_F16) |
                                          AP_DTYPE_BIT(AP_DTYPE_FP8_E4M3) |
                                          AP_DTYPE_BIT(AP_DTYPE_FP8_E5M2) |
                                          AP_DTYPE_BIT(AP_DTYPE_NVFP4));
    assert_int_equal(caps->num_page_sizes, 0);
    assert_int_equal(caps->num_head_dims, 0);
    assert_int_equal(caps->phases, AP_PHASE_EXTEND | AP_PHASE_DECODE);
    assert_int_equal(caps->cuda_graph, AP_GRAPH_NONE);
    assert_int_equal(caps->features, AP_FEATURE_LSE | AP_FEATURE_NONCAUSAL |
                                         AP_FEATURE_LOGIT_SOFTCAP | AP_FEATURE_SLIDING_WINDOW |
                                         AP_FEATURE_EMBEDDING_SKIP_KV);
    assert_int_equal(caps->needs_host_mirrors, 1);
    const ap_vtable *vt = d->vtable;
    assert_true(vt->validate && vt->create && vt->destroy && vt->get_kv_spec && vt->init_metadata &&
                vt->forward_extend && vt->forward_decode && vt->get_hook);
}

static void test_validate(void **state) {
    (void)state;
    fx_msg msg;
    ap_model m = good_model();
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->validate(&m, NULL, NULL, &msg.buf), AP_OK);
    assert_int_equal(msg.buf.length, 0);
    /* every reason at once, one line each */
    m.kind = AP_ATTN_MLA;
    m.kv_dtype = AP_DTYPE_NVFP4;
    m.head_dim_v = 72; /* nvfp4 rows are whole blocks of 16 */
    m.dtype = AP_DTYPE_FP8_E4M3;
    m.num_kv_heads = 3;
    m.page_size = 0;
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->validate(&m, NULL, NULL, &msg.buf), AP_ERR_REFUSED);
    assert_int_equal(count_lines(msg.text), 5);
    assert_non_null(strstr(msg.text, "MLA"));
    assert_non_null(strstr(msg.text, "nvfp4 KV cache needs head dims that are multiples of 16"));
    assert_non_null(strstr(msg.text, "query dtype"));
    assert_non_null(strstr(msg.text, "heads"));
    assert_non_null(strstr(msg.text, "page size"));
    /* unknown backend option: a typo must not pass */
    m = good_model();
    ap_option_kv extra[] = {{"pagesize", "16"}};
    ap_options options = {.struct_size = sizeof options, .extra = extra, .num_extra = 1};
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->validate(&m, &options, NULL, &msg.buf), AP_ERR_REFUSED);
    assert_non_null(strstr(msg.text, "pagesize"));
    /* f32 KV is not a cache type cpu_ref serves */
    m.kv_dtype = AP_DTYPE_F32;
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->validate(&m, NULL, NULL, &msg.buf), AP_ERR_REFUSED);
    /* create refuses the same, leaving no instance */
    ap_backend *backend = (ap_backend *)&m;
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf), AP_ERR_REFUSED);
    assert_null(backend);
    plugin.vt->destroy(NULL);
}

static void test_kv_spec_and_hooks(void **state) {
    (void)state;
    fx_msg msg;
    fx_msg_init(&msg);
    ap_dtype kv_dtypes[] = {AP_DTYPE_FP8_E4M3, AP_DTYPE_BF16};
    size_t elem[] = {1, 2};
    for (int i = 0; i < 2; i++) {
        ap_model m = good_model();
        m.kv_dtype = kv_dtypes[i];
        ap_backend *backend = NULL;
        assert_int_equal(plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf), AP_OK);
        ap_kv_spec spec = {.struct_size = sizeof spec};
        assert_int_equal(plugin.vt->get_kv_spec(backend, &spec, &msg.buf), AP_OK);
        assert_int_equal(spec.k_bytes_per_page, 16 * 2 * 128 * elem[i]);
        assert_int_equal(spec.v_bytes_per_page, 16 * 2 * 64 * elem[i]);
        assert_int_equal(spec.scale_bytes_per_page, 0);
        assert_int_equal(spec.alignment, 64);
        assert_non_null(plugin.vt->get_hook(backend, AP_HOOK_APPEND_KV_V1));
        assert_non_null(plugin.vt->get_hook(backend, AP_HOOK_PACK_PREFIX_CHUNK_KV_V1));
        assert_non_null(plugin.vt->get_hook(backend, AP_HOOK_MERGE_STATE_V1));
        assert_null(plugin.vt->get_hook(backend, AP_HOOK_CUDA_GRAPH_V1));
        assert_null(plugin.vt->get_hook(backend, "append_kv/2"));
        assert_null(plugin.vt->get_hook(backend, NULL));
        /* the caps declare exactly the hooks get_hook answers, for ap-inspect's listing */
        const ap_caps *caps = plugin.descriptor->caps;
        assert_int_equal(caps->num_hooks, 3);
        for (size_t h = 0; h < caps->num_hooks; h++)
            assert_non_null(plugin.vt->get_hook(backend, caps->hooks[h]));
        assert_string_equal(caps->hooks[2], AP_HOOK_MERGE_STATE_V1);
        plugin.vt->destroy(backend);
    }
    /* nvfp4: two values per byte, one scale byte per 16 values (sized for the wider of K, V) */
    ap_model m = good_model();
    m.kv_dtype = AP_DTYPE_NVFP4;
    ap_backend *backend = NULL;
    assert_int_equal(plugin.vt->validate(&m, NULL, NULL, &msg.buf), AP_OK);
    assert_int_equal(plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf), AP_OK);
    ap_kv_spec spec = {.struct_size = sizeof spec};
    assert_int_equal(plugin.vt->get_kv_spec(backend, &spec, &msg.buf), AP_OK);
    assert_int_equal(spec.k_bytes_per_page, 16 * 2 * 128 / 2);
    assert_int_equal(spec.v_bytes_per_page, 16 * 2 * 64 / 2);
    assert_int_equal(spec.scale_bytes_per_page, 16 * 2 * 128 / 16);
    plugin.vt->destroy(backend);
}

/* 2^16 tokens x 2^17 KV heads x 2 bytes x 2^30 dims is 2^64 bytes: refused, not wrapped to 0. */
static void test_kv_spec_overflow(void **state) {
    (void)state;
    fx_msg msg;
    fx_msg_init(&msg);
    ap_model m = good_model();
    m.kv_dtype = AP_DTYPE_BF16;
    m.page_size = 1 << 16;
    m.num_qo_heads = m.num_kv_heads = 1 << 17;
    m.head_dim_qk = m.head_dim_v = 1 << 30;
    ap_backend *backend = NULL;
    assert_int_equal(plugin.vt->create(&m, NULL, NULL, &backend, &msg.buf), AP_OK);
    ap_kv_spec spec = {.struct_size = sizeof spec};
    assert_int_equal(plugin.vt->get_kv_spec(backend, &spec, &msg.buf), AP_ERR_INVALID_ARGUMENT);
    assert_string_equal(msg.text, "cpu_ref: a KV page of 65536 tokens x 131072 KV heads x head "
                                  "dims 1073741824/1073741824 does not fit in size_t bytes");
    plugin.vt->destroy(backend);
}

/* A small valid scenario to break one thing of. */
static sc_case small_case(void) {
    sc_case c = {
        .q_dtype = AP_DTYPE_BF16,
        .kv_dtype = AP_DTYPE_FP8_E4M3,
        .page_size = 4,
        .num_kv_heads = 2,
        .group = 2,
        .head_dim_qk = 16,
        .head_dim_v = 16,
        .causal = 1,
        .window_left = -1,
        .save_kv = 1,
        .with_lse = 1,
        .num_seqs = 2,
        .prefix = {3, 0},
        .q_len = {2, 5},
    };
    return c;
}

/* Snapshot of every buffer the plugin could write, to prove a refused call wrote nothing. */
typedef struct snapshot {
    unsigned char *k_pages, *v_pages, *out, *lse, *k_scales, *v_scales;
} snapshot;

static snapshot snapshot_take(const sc_scenario *s) {
    snapshot snap = {malloc(s->k_bytes),           malloc(s->v_bytes),
                     malloc(s->out.bytes),         malloc(s->lse.bytes),
                     malloc(s->k_scale_bytes + 1), malloc(s->v_scale_bytes + 1)};
    memcpy(snap.k_pages, s->k_pages, s->k_bytes);
    memcpy(snap.v_pages, s->v_pages, s->v_bytes);
    memcpy(snap.out, s->out.buffer, s->out.bytes);
    memcpy(snap.lse, s->lse.buffer, s->lse.bytes);
    if (s->k_scale_bytes) memcpy(snap.k_scales, s->k_scales, s->k_scale_bytes);
    if (s->v_scale_bytes) memcpy(snap.v_scales, s->v_scales, s->v_scale_bytes);
    return snap;
}

static void snapshot_expect_same(snapshot *snap, const sc_scenario *s) {
    assert_memory_equal(snap->k_pages, s->k_pages, s->k_bytes);
    assert_memory_equal(snap->v_pages, s->v_pages, s->v_bytes);
    assert_memory_equal(snap->out, s->out.buffer, s->out.bytes);
    assert_memory_equal(snap->lse, s->lse.buffer, s->lse.bytes);
    if (s->k_scale_bytes) assert_memory_equal(snap->k_scales, s->k_scales, s->k_scale_bytes);
    if (s->v_scale_bytes) assert_memory_equal(snap->v_scales, s->v_scales, s->v_scale_bytes);
    free(snap->k_pages);
    free(snap->v_pages);
    free(snap->out);
    free(snap->lse);
    free(snap->k_scales);
    free(snap->v_scales);
}

typedef void (*breaker)(sc_scenario *s);

static void break_page_index(sc_scenario *s) {
    s->page_indices[1] = s->num_pages;
}
static void break_page_index_negative(sc_scenario *s) {
    s->page_indices[0] = -1;
}
static void break_q_shape(sc_scenario *s) {
    s->q.shape[2] = 8;
}
static void break_out_heads(sc_scenario *s) {
    s->out.shape[1] = 1;
}
static void break_out_dtype(sc_scenario *s) {
    s->out.dl.dtype = (DLDataType){kDLFloat, 32, 1};
}
static void break_lse_dtype(sc_scenario *s) {
    s->lse.dl.dtype = (DLDataType){kDLFloat, 16, 1};
}
static void break_q_device(sc_scenario *s) {
    s->q.dl.device = (DLDevice){kDLCUDA, 0};
}
static void break_k_missing(sc_scenario *s) {
    s->args.k = NULL;
}
static void break_kv_dtype(sc_scenario *s) {
    s->kv.dtype = AP_DTYPE_FP8_E5M2;
}
static void break_kv_heads(sc_scenario *s) {
    s->kv.num_kv_heads = 1;
}
static void break_k_scale(sc_scenario *s) {
    s->layer.k_scale = 0.0f;
}
static void break_last_page(sc_scenario *s) {
    s->last_page_len[0] += 1;
}
static void break_qo_indptr(sc_scenario *s) {
    s->qo_indptr[1] = 9;
}
static void break_seq_len(sc_scenario *s) {
    s->seq_lens[1] = 2;
}
static void break_decode_mode(sc_scenario *s) {
    s->batch.mode = AP_MODE_DECODE;
}
static void break_mirror(sc_scenario *s) {
    s->batch.qo_indptr_host = NULL;
}
static void break_args_size(sc_scenario *s) {
    s->args.struct_size = 8;
}

static void break_k_scale_inf(sc_scenario *s) {
    s->layer.k_scale = INFINITY;
}
static void break_v_scale_nan(sc_scenario *s) {
    s->layer.v_scale = NAN;
}
static void break_k_block_scales(sc_scenario *s) {
    s->kv.k_block_scales = NULL;
}
static void break_v_block_scales(sc_scenario *s) {
    s->kv.v_block_scales = NULL;
}

static void expect_refusal_of(sc_case c, breaker how, ap_status want, const char *name) {
    sc_scenario s;
    if (sc_build(&s, &plugin, &c) != 0) fail_msg("%s: could not build", name);
    how(&s);
    snapshot snap = snapshot_take(&s);
    fx_msg msg;
    ap_status got = sc_run(&s, &plugin, &msg);
    if (got != want)
        fail_msg("%s: status %d, expected %d (%s)", name, (int)got, (int)want, msg.text);
    if (msg.buf.length == 0) fail_msg("%s: refused without a message", name);
    snapshot_expect_same(&snap, &s);
    sc_free(&s, &plugin);
}

static void expect_refusal(breaker how, ap_status want, const char *name) {
    expect_refusal_of(small_case(), how, want, name);
}

static void test_bad_input(void **state) {
    (void)state;
    expect_refusal(break_page_index, AP_ERR_SHAPE_MISMATCH, "page index past the cache");
    expect_refusal(break_page_index_negative, AP_ERR_SHAPE_MISMATCH, "negative page index");
    expect_refusal(break_q_shape, AP_ERR_SHAPE_MISMATCH, "q head dim");
    expect_refusal(break_out_heads, AP_ERR_SHAPE_MISMATCH, "out heads");
    expect_refusal(break_out_dtype, AP_ERR_INVALID_ARGUMENT, "out dtype");
    expect_refusal(break_lse_dtype, AP_ERR_INVALID_ARGUMENT, "lse dtype");
    expect_refusal(break_q_device, AP_ERR_INVALID_ARGUMENT, "q on a GPU");
    expect_refusal(break_k_missing, AP_ERR_INVALID_ARGUMENT, "save_kv without k");
    expect_refusal(break_kv_dtype, AP_ERR_SHAPE_MISMATCH, "cache dtype");
    expect_refusal(break_kv_heads, AP_ERR_SHAPE_MISMATCH, "cache heads");
    expect_refusal(break_k_scale, AP_ERR_INVALID_ARGUMENT, "zero fp8 scale");
    expect_refusal(break_last_page, AP_ERR_SHAPE_MISMATCH, "last page length");
    expect_refusal(break_qo_indptr, AP_ERR_SHAPE_MISMATCH, "qo_indptr");
    expect_refusal(break_seq_len, AP_ERR_SHAPE_MISMATCH, "seq_len below q_len");
    expect_refusal(break_decode_mode, AP_ERR_SHAPE_MISMATCH, "decode with 2 tokens");
    expect_refusal(break_mirror, AP_ERR_INVALID_ARGUMENT, "no host mirror");
    expect_refusal(break_args_size, AP_ERR_INVALID_ARGUMENT, "args struct_size");
    /* nvfp4: global scales finite and > 0, both block-scale buffers present */
    sc_case c = small_case();
    c.kv_dtype = AP_DTYPE_NVFP4;
    expect_refusal_of(c, break_k_scale, AP_ERR_INVALID_ARGUMENT, "zero nvfp4 global scale");
    expect_refusal_of(c, break_k_scale_inf, AP_ERR_INVALID_ARGUMENT, "inf nvfp4 global scale");
    expect_refusal_of(c, break_v_scale_nan, AP_ERR_INVALID_ARGUMENT, "NaN nvfp4 global scale");
    expect_refusal_of(c, break_k_block_scales, AP_ERR_INVALID_ARGUMENT, "no K block scales");
    expect_refusal_of(c, break_v_block_scales, AP_ERR_INVALID_ARGUMENT, "no V block scales");
    expect_refusal_of(c, break_page_index, AP_ERR_SHAPE_MISMATCH, "nvfp4 page index");
}

/* An instance on pages of one token (f32 queries, bf16 cache), for the batch-rule tests. */
static ap_backend *page1_instance(fx_msg *msg) {
    ap_model m = good_model();
    m.page_size = 1;
    m.dtype = AP_DTYPE_F32;
    m.kv_dtype = AP_DTYPE_BF16;
    fx_msg_init(msg);
    ap_backend *backend = NULL;
    assert_int_equal(plugin.vt->create(&m, NULL, NULL, &backend, &msg->buf), AP_OK);
    return backend;
}

/* CSR arrays whose steps are each >= 0 only because int32 subtraction wraps: qo_indptr (and
 * kv_page_indptr) 0, 5, INT32_MIN, -1, 10 end at 10, but sequence 1 would start at token
 * INT32_MIN and claim 2^31 - 5 tokens. init_metadata must refuse them, not plan writes there. */
static void test_indptr_wrap(void **state) {
    (void)state;
    fx_msg msg;
    ap_backend *backend = page1_instance(&msg);
    int32_t wrap[5] = {0, 5, INT32_MIN, -1, 10};
    int32_t seq_lens[4] = {5, INT32_MAX - 4, INT32_MAX, 11};
    ap_batch extend = {.struct_size = sizeof extend,
                       .mode = AP_MODE_EXTEND,
                       .num_seqs = 4,
                       .num_tokens = 10,
                       .qo_indptr_host = wrap,
                       .seq_lens_host = seq_lens};
    assert_int_equal(plugin.vt->init_metadata(backend, &extend, NULL, &msg.buf),
                     AP_ERR_SHAPE_MISMATCH);
    assert_non_null(strstr(msg.text, "qo_indptr"));
    /* decode: one token each, but kv_page_indptr 0, 1, INT32_MIN, -1, 1 over one page */
    int32_t qo[5] = {0, 1, 2, 3, 4}, pages[5] = {0, 1, INT32_MIN, -1, 1}, indices[1] = {0};
    int32_t last[4] = {1, 1, 1, 1}, decode_lens[4] = {1, INT32_MAX, INT32_MAX, 2};
    ap_batch decode = {.struct_size = sizeof decode,
                       .mode = AP_MODE_DECODE,
                       .num_seqs = 4,
                       .num_tokens = 4,
                       .num_pages_total = 1,
                       .qo_indptr_host = qo,
                       .kv_page_indptr_host = pages,
                       .kv_page_indices_host = indices,
                       .kv_last_page_len_host = last,
                       .seq_lens_host = decode_lens};
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->init_metadata(backend, &decode, NULL, &msg.buf),
                     AP_ERR_SHAPE_MISMATCH);
    assert_non_null(strstr(msg.text, "kv_page_indptr"));
    plugin.vt->destroy(backend);
}

/* plugin_api.h's batch rules: every sequence has at least one page. An empty sequence (q_len 0,
 * seq_len 0) with no page is refused as the core refuses it, naming the sequence. */
static void test_zero_page_sequence(void **state) {
    (void)state;
    fx_msg msg;
    ap_backend *backend = page1_instance(&msg);
    int32_t qo[3] = {0, 1, 1}, indptr[3] = {0, 1, 1}, indices[1] = {0}, last[2] = {1, 1};
    int32_t seq_lens[2] = {1, 0};
    ap_batch batch = {.struct_size = sizeof batch,
                      .mode = AP_MODE_EXTEND,
                      .num_seqs = 2,
                      .num_tokens = 1,
                      .num_pages_total = 1,
                      .qo_indptr_host = qo,
                      .kv_page_indptr_host = indptr,
                      .kv_page_indices_host = indices,
                      .kv_last_page_len_host = last,
                      .seq_lens_host = seq_lens};
    assert_int_equal(plugin.vt->init_metadata(backend, &batch, NULL, &msg.buf),
                     AP_ERR_SHAPE_MISMATCH);
    assert_non_null(strstr(msg.text, "sequence 1: 0 pages"));
    plugin.vt->destroy(backend);
}

static void test_call_order(void **state) {
    (void)state;
    sc_case c = small_case();
    sc_scenario s;
    assert_int_equal(sc_build(&s, &plugin, &c), 0);
    fx_msg msg;
    fx_msg_init(&msg);
    /* forward before any init_metadata */
    assert_int_equal(plugin.vt->forward_extend(s.backend, &s.layer, &s.args, NULL, &msg.buf),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(plugin.vt->init_metadata(s.backend, &s.batch, NULL, &msg.buf), AP_OK);
    /* an extend batch run as decode */
    fx_msg_init(&msg);
    assert_int_equal(plugin.vt->forward_decode(s.backend, &s.layer, &s.args, NULL, &msg.buf),
                     AP_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(msg.text, "decode"));
    /* a refused init_metadata drops the previous plan */
    s.batch.num_seqs = -1;
    assert_int_equal(plugin.vt->init_metadata(s.backend, &s.batch, NULL, &msg.buf),
                     AP_ERR_INVALID_ARGUMENT);
    assert_int_equal(plugin.vt->forward_extend(s.backend, &s.layer, &s.args, NULL, &msg.buf),
                     AP_ERR_INVALID_ARGUMENT);
    sc_free(&s, &plugin);
}

int main(void) {
    fx_seed_init();
    if (fx_plugin_open(&plugin) != 0) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_negotiation),        cmocka_unit_test(test_descriptor_and_caps),
        cmocka_unit_test(test_validate),           cmocka_unit_test(test_kv_spec_and_hooks),
        cmocka_unit_test(test_kv_spec_overflow),   cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_call_order),         cmocka_unit_test(test_indptr_wrap),
        cmocka_unit_test(test_zero_page_sequence),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    fx_plugin_close(&plugin);
    return failed;
}
