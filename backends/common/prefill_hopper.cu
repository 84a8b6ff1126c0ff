// prefill_hopper.cu: the host side of the kit's Hopper prefill kernel (prefill_hopper.cuh): which
// plans it takes, and one layer's launch. Built with its kernel only where the build emits sm_90a
// machine code (AP_KIT_HOPPER, from meson); elsewhere it takes no plan.
#include <cuda_runtime.h>
#include <stdint.h>

#include <atomic>
#include <cmath>

#include "cuda_status.cuh"
#include "paged_kv.cuh"
#include "prefill.h"
#include "prefill_hopper.h"
#include "prefill_internal.h"

#ifdef AP_KIT_HOPPER
#include "prefill_hopper.cuh"
#include "softmax_state.cuh"
#endif

#ifdef AP_KIT_HOPPER
namespace {

// Whether plans of head dims 64 / 64 take the Hopper kernel (Geo<64>: one 64-column chunk, V 64
// wide); false sends them back to the mma.sync kernel. H100: 0.87x cuDNN, the mma.sync kernel
// 0.60x (bench/results/2026-11-25-h100-merged.md).
constexpr bool kHopperServesD64 = true;
// The same for ragged head dims 256 / 256 (Geo<256>: 64-key tiles, a 2-stage ring). H100: 0.90x
// cuDNN, the mma.sync kernel 0.37x.
constexpr bool kHopperServesD256 = true;

// Whether the Hopper kernel serves these head dims from this K/V source: ragged 128 / 128,
// 192 / 128 (MLA's MHA form), 64 / 64 and 256 / 256; paged 128 / 128 and 64 / 64.
bool hopper_dims(int32_t qk, int32_t v, int paged) {
    if (qk == 64) return kHopperServesD64 && v == 64;
    if (qk == 256) return kHopperServesD256 && v == 256 && !paged;
    return v == 128 && (qk == 128 || (qk == 192 && !paged));
}

// Whether K/V of this dtype go to its fp8 kernel (prefill_hopper_f8.cuh): FP8_E4M3 from the
// ragged source at head dims 128 / 128 and 192 / 128.
bool hopper_f8_serves(ap_dtype kv_dtype, int32_t qk, int32_t v, int paged) {
    return kv_dtype == AP_DTYPE_FP8_E4M3 && !paged && v == 128 && (qk == 128 || qk == 192);
}

// log2 of a page size the Hopper kernel's paged source serves (a power of two >= 8: page boxes
// of >= 8 rows build the 128-byte swizzle's layout), else -1.
int ap_hopper_page_shift(int32_t page_size) {
    const int shift = ap_page_shift(page_size);
    return shift >= 3 ? shift : -1;
}

// Query rows of the kernel's work tiles for these head dims and source (ap_hopper::tile_rows_of).
int hopper_tile_rows(int32_t head_dim_qk, bool ragged) {
    return ap_hopper::tile_rows_of(head_dim_qk,
                                   ragged ? ap_hopper::kRagged : ap_hopper::kPagedTile);
}

// The plan's pack_shift (its work tiles hold hopper_tile_rows >> shift tokens), or -1 when its
// tile length is not one the kernel packs for this group.
int plan_pack_shift(const ap_kit_prefill_plan *plan) {
    const int32_t group = plan->num_kv_heads > 0 ? plan->num_qo_heads / plan->num_kv_heads : 0;
    const int rows = hopper_tile_rows(plan->head_dim_qk, plan->ragged != 0);
    for (int s = 0; (1 << s) <= group && (1 << s) <= rows; ++s) {
        if (group % (1 << s) == 0 && plan->tile_tokens == (rows >> s)) return s;
    }
    return -1;
}

// 1 when the current device is an sm_90 part (the kernel's sm_90a code runs there only).
int current_device_is_sm90() {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
        cudaGetLastError(); // no device: the plan goes to the mma.sync kernel
        return 0;
    }
    return major == 9 && minor == 0;
}

// The call against its plan and what the kernel reads: AP_OK or a message.
ap_status hopper_check(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                       const char *who, ap_msgbuf *msg) {
    if (p == NULL) {
        ap_msgbuf_add(msg, "%s: NULL params", who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const int paged = p->kv_indptr == NULL;
    const bool f8 = hopper_f8_serves(p->kv_dtype, p->head_dim_qk, p->head_dim_v, paged);
    if ((p->q_dtype != AP_DTYPE_BF16 && p->q_dtype != AP_DTYPE_F16) ||
        (p->kv_dtype != p->q_dtype && !f8)) {
        ap_msgbuf_add(msg,
                      "%s: the Hopper prefill kernel (this plan's) reads BF16 or F16 Q with K and "
                      "V of the same dtype, or FP8_E4M3 K and V from the ragged source at head "
                      "dims 128 / 128 and 192 / 128; not q dtype %d with kv dtype %d (%s, head "
                      "dims %d / %d)",
                      who, (int)p->q_dtype, (int)p->kv_dtype, paged ? "paged" : "ragged",
                      p->head_dim_qk, p->head_dim_v);
        return AP_ERR_UNSUPPORTED;
    }
    if (f8 && !(p->k_scale > 0.f && p->v_scale > 0.f && std::isfinite(p->k_scale) &&
                std::isfinite(p->v_scale))) {
        ap_msgbuf_add(msg, "%s: fp8 K/V needs finite positive k_scale and v_scale (%g, %g)", who,
                      (double)p->k_scale, (double)p->v_scale);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (paged != !plan->ragged || !hopper_dims(p->head_dim_qk, p->head_dim_v, paged) ||
        plan->head_dim_qk != p->head_dim_qk || plan->head_dim_v != p->head_dim_v ||
        plan->num_qo_heads != p->num_qo_heads || plan->num_kv_heads != p->num_kv_heads ||
        p->num_kv_heads <= 0 || p->num_qo_heads % p->num_kv_heads != 0 ||
        plan->causal != (p->causal != 0) || plan_pack_shift(plan) < 0) {
        ap_msgbuf_add(msg,
                      "%s: the Hopper plan (%s, head dims %d/%d, heads %d/%d, causal %d, %d-token "
                      "tiles) does not match the call (%s, head dims %d/%d, heads %d/%d, causal "
                      "%d)",
                      who, plan->ragged ? "ragged" : "paged", plan->head_dim_qk, plan->head_dim_v,
                      plan->num_qo_heads, plan->num_kv_heads, plan->causal, plan->tile_tokens,
                      paged ? "paged" : "ragged", p->head_dim_qk, p->head_dim_v, p->num_qo_heads,
                      p->num_kv_heads, p->causal != 0);
        return AP_ERR_INVALID_ARGUMENT;
    }
    const void *k = paged ? p->k_pages : p->k;
    const void *v = paged ? p->v_pages : p->v;
    const uintptr_t any = (uintptr_t)p->q | (uintptr_t)k | (uintptr_t)v;
    if (p->q == NULL || k == NULL || v == NULL || p->out == NULL || p->qo_indptr == NULL ||
        (any & 15) != 0) {
        ap_msgbuf_add(msg,
                      "%s: q, out, qo_indptr and the K/V source must be set, q/k/v 16-byte "
                      "aligned",
                      who);
        return AP_ERR_INVALID_ARGUMENT;
    }
    if (paged && (ap_hopper_page_shift(p->page_size) < 0 || p->kv_page_indptr == NULL ||
                  p->kv_page_indices == NULL || p->kv_last_page_len == NULL)) {
        ap_msgbuf_add(msg,
                      "%s: the Hopper kernel's paged source needs a page size that is a power of "
                      "two >= 8 (not %d) and the page table (indptr, indices, last page lengths)",
                      who, p->page_size);
        return AP_ERR_INVALID_ARGUMENT;
    }
    return AP_OK;
}

// The K and V maps of the call's source: ragged rows, or the paged caches (one box per page).
template <int kD>
int hopper_kv_maps(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan, CUtensorMap *mk,
                   CUtensorMap *mv) {
    using G = ap_hopper::Geo<kD>;
    using GP = ap_hopper::Geo<kD, ap_hopper::kPagedTile>; /* both paged kernels' K/V tiles */
    const int hkv = p->num_kv_heads;
    if (p->kv_indptr == NULL) {
        return ap_hopper::make_paged_map(mk, p->k_pages, hkv, p->page_size, kD, GP::kKeys) != 0 ||
               ap_hopper::make_paged_map(mv, p->v_pages, hkv, p->page_size, G::kDv, GP::kKeys) != 0;
    }
    const int nkv = plan->num_kv_rows > 0 ? plan->num_kv_rows : 1;
    return ap_hopper::make_map(mk, p->k, nkv, hkv, kD, G::kKeys) != 0 ||
           ap_hopper::make_map(mv, p->v, nkv, hkv, G::kDv, G::kKeys) != 0;
}

// A plan's split-KV parts: 1 unless it split (a plan built by hand may leave the field 0).
int32_t plan_splits(const ap_kit_prefill_plan *plan) {
    return plan->splits > 1 ? plan->splits : 1;
}

// The kernel parameters both launches share: the plan's items and the call's batch, heads and
// scales (the caller adds the paged source and the grid's persistence).
ap_hopper::Params hopper_params(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan) {
    ap_hopper::Params kp = {};
    kp.items = static_cast<const ap_hopper::Item *>(plan->items);
    kp.qo_indptr = p->qo_indptr;
    kp.kv_indptr = p->kv_indptr;
    kp.num_kv_heads = p->num_kv_heads;
    kp.out = p->out;
    kp.lse = p->lse;
    kp.num_qo_heads = p->num_qo_heads;
    kp.group = p->num_qo_heads / p->num_kv_heads;
    kp.causal = p->causal != 0;
    kp.scale_log2 = p->sm_scale * ap_log2e;
    kp.sm_scale = p->sm_scale;
    kp.num_items = plan->num_items;
    kp.k_scale = p->k_scale;
    kp.v_scale = p->v_scale;
    kp.pack_shift = plan_pack_shift(plan); /* hopper_check: >= 0 */
    kp.splits = plan_splits(plan);
    kp.out_heads = p->num_qo_heads * kp.splits;
    if (kp.splits > 1) { /* the parts' rows, merged by hopper_merge_splits */
        kp.out = plan->split_out;
        kp.lse = plan->split_lse;
    }
    return kp;
}

// A split plan's merge of its parts into the call's out and lse, after the kernel.
ap_status hopper_merge_splits(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                              cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    const ap_kit_merge_rows_args args = {
        .partial_out = plan->split_out,
        .partial_lse = plan->split_lse,
        .tokens = plan->num_q_tokens,
        .heads = p->num_qo_heads,
        .parts = plan->splits,
        .width = p->head_dim_v,
        .out_dtype = p->q_dtype,
        .out = p->out,
        .lse = p->lse,
    };
    return ap_kit_merge_rows_run(&args, stream, who, msg);
}

template <typename T, int kMode, int kD, int kPaged>
ap_status hopper_launch(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                        cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    static std::atomic<uint64_t> ready{0};
    constexpr int kSmem = ap_hopper::Geo<kD, kPaged>::kSmem;
    ap_status st = ap_cuda_smem_optin_once(ap_hopper::prefill_hopper_kernel<T, kMode, kD, kPaged>,
                                           kSmem, ready, who, msg);
    if (st != AP_OK) return st;
    ap_hopper::Params kp = hopper_params(p, plan);
    CUtensorMap mq, mk, mv;
    if (ap_hopper::q_map(&mq, p->q, plan->num_q_tokens, p->num_qo_heads, kD, kp.pack_shift,
                         ap_hopper::Geo<kD, kPaged>::kTileRows) != 0 ||
        hopper_kv_maps<kD>(p, plan, &mk, &mv) != 0) {
        ap_msgbuf_add(msg, "%s: cuTensorMapEncodeTiled failed (or is not in the driver)", who);
        return AP_ERR_CUDA;
    }
    if (kPaged != ap_hopper::kRagged) {
        kp.kv_indptr = p->kv_page_indptr;
        kp.kv_page_indices = p->kv_page_indices;
        kp.kv_last_page_len = p->kv_last_page_len;
        kp.v_pages = p->v_pages;
        kp.page_shift = ap_hopper_page_shift(p->page_size);
    }
    const dim3 grid = ap_hopper::launch_schedule(kp, kD, kPaged);
    ap_hopper::use_dynamic<kD, kMode, kPaged>(kp, plan->tile_counters, plan->min_kv_tiles);
    ap_hopper::prefill_hopper_kernel<T, kMode, kD, kPaged>
        <<<grid, ap_hopper::Geo<kD, kPaged>::kThreads, kSmem, stream>>>(mq, mk, mv, kp);
    return ap_cuda_launch_status(who, "prefill_hopper_kernel", msg);
}

// One layer's launch over fp8 K/V (ragged; Q/K head dim 128 or 192, V 128): the fp8 kernel, its
// grid by the same rule as the 16-bit one.
template <typename T, int kD>
ap_status hopper_launch_f8(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                           cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    static std::atomic<uint64_t> ready{0};
    constexpr int kSmem = ap_hopper::GeoF8<kD>::kSmem;
    ap_status st =
        ap_cuda_smem_optin_once(ap_hopper::prefill_hopper_f8_kernel<T, kD>, kSmem, ready, who, msg);
    if (st != AP_OK) return st;
    const int nkv = plan->num_kv_rows > 0 ? plan->num_kv_rows : 1;
    ap_hopper::Params kp = hopper_params(p, plan);
    CUtensorMap mq, mk, mv;
    if (ap_hopper::q_map(&mq, p->q, plan->num_q_tokens, p->num_qo_heads, kD, kp.pack_shift) != 0 ||
        ap_hopper::make_map_f8(&mk, p->k, nkv, p->num_kv_heads, kD) != 0 ||
        ap_hopper::make_map_f8(&mv, p->v, nkv, p->num_kv_heads, 128) != 0) {
        ap_msgbuf_add(msg, "%s: cuTensorMapEncodeTiled failed (or is not in the driver)", who);
        return AP_ERR_CUDA;
    }
    const dim3 grid = ap_hopper::launch_schedule(kp, kD, ap_hopper::kRagged);
    ap_hopper::prefill_hopper_f8_kernel<T, kD>
        <<<grid, ap_hopper::kThreads, kSmem, stream>>>(mq, mk, mv, kp);
    return ap_cuda_launch_status(who, "prefill_hopper_f8_kernel", msg);
}

// The consumer mode by the ring's depth, the faster on the H100
// (bench/results/2026-11-25-h100-hopper-prefill.md): with 2 stages the plain consumers (the
// overlapped ones wait on loads), with 3 the overlapped ping-pong ones, on the persistent grid too
// (fav-bench, 2026-11-26: causal B4 S4096 H32/8 D128 582 TFLOP/s with ping-pong, 566 with the
// overlapped consumers alone; non-causal 628 / 594). Q/K 192 wide (MLA's MHA form) and 256
// (64-key tiles) have a 2-stage ring whose K tiles are released after S = Q K, so ping-pong there
// too.
constexpr int kHopperMode = ap_hopper::kStages >= 3 ? 2 : 0;
constexpr int kHopperModeD256 = 2;

template <typename T>
ap_status hopper_dispatch(const ap_kit_prefill_params *p, const ap_kit_prefill_plan *plan,
                          cudaStream_t stream, const char *who, ap_msgbuf *msg) {
    if (p->kv_dtype == AP_DTYPE_FP8_E4M3) { // hopper_check: ragged, 128 / 128 or 192 / 128
        if (p->head_dim_qk == 192) return hopper_launch_f8<T, 192>(p, plan, stream, who, msg);
        return hopper_launch_f8<T, 128>(p, plan, stream, who, msg);
    }
    using namespace ap_hopper;
    if (p->head_dim_qk == 192) return hopper_launch<T, 2, 192, kRagged>(p, plan, stream, who, msg);
    if (p->head_dim_qk == 256)
        return hopper_launch<T, kHopperModeD256, 256, kRagged>(p, plan, stream, who, msg);
    // the paged source (hopper_check: head dims 128 and 64): its kernel by paged_source
    const bool ring = p->kv_indptr == NULL &&
                      paged_source(p->num_qo_heads / p->num_kv_heads, p->head_dim_qk) == kPagedRing;
    if (p->head_dim_qk == 64) {
        if (ring) return hopper_launch<T, kHopperMode, 64, kPagedRing>(p, plan, stream, who, msg);
        if (p->kv_indptr == NULL)
            return hopper_launch<T, kHopperMode, 64, kPagedTile>(p, plan, stream, who, msg);
        return hopper_launch<T, kHopperMode, 64, kRagged>(p, plan, stream, who, msg);
    }
    if (ring) return hopper_launch<T, kHopperMode, 128, kPagedRing>(p, plan, stream, who, msg);
    if (p->kv_indptr == NULL)
        return hopper_launch<T, kHopperMode, 128, kPagedTile>(p, plan, stream, who, msg);
    return hopper_launch<T, kHopperMode, 128, kRagged>(p, plan, stream, who, msg);
}

} // namespace

extern "C" int32_t ap_kit_prefill_hopper_tile_rows(const ap_kit_prefill_plan_args *args) {
    if (args == NULL ||
        (args->kv_dtype != AP_DTYPE_BF16 && args->kv_dtype != AP_DTYPE_F16 &&
         !hopper_f8_serves(args->kv_dtype, args->head_dim_qk, args->head_dim_v,
                           args->kv_indptr_host == NULL)) ||
        (args->kv_indptr_host == NULL && ap_hopper_page_shift(args->page_size) < 0) ||
        !hopper_dims(args->head_dim_qk, args->head_dim_v, args->kv_indptr_host == NULL) ||
        args->num_kv_heads <= 0 || args->num_qo_heads <= 0 ||
        args->num_qo_heads % args->num_kv_heads != 0 ||
        args->num_qo_heads / args->num_kv_heads > AP_KIT_PREFILL_MAX_GROUP ||
        ap_hopper::encode_tiled_fn() == nullptr || !current_device_is_sm90())
        return 0;
    // GQA packing by the batch's lengths (pack_shift_for): plan_build's items are then
    // hopper_tile_rows >> shift tokens long (tile_rows / group)
    const int32_t group = args->num_qo_heads / args->num_kv_heads;
    const int rows = hopper_tile_rows(args->head_dim_qk, args->kv_indptr_host != NULL);
    const int shift = ap_hopper::pack_shift_for(args->qo_indptr_host, args->num_seqs, group, rows);
    return (rows * group) >> shift;
}

extern "C" int32_t ap_kit_prefill_hopper_splits(const ap_kit_prefill_plan *plan,
                                                int64_t longest_keys) {
    const int shift = plan_pack_shift(plan);
    if (shift < 0) return 1;
    const int64_t tiles = (int64_t)plan->num_items * (plan->num_qo_heads >> shift);
    return ap_kit_prefill_split_count(tiles, longest_keys, ap_hopper::device_sm_count());
}

extern "C" ap_status ap_kit_prefill_hopper_run(const ap_kit_prefill_params *p,
                                               const ap_kit_prefill_plan *plan, void *stream,
                                               const char *who, ap_msgbuf *msg) {
    // K/V of another type than Q (fp8) that the fp8 kernel does not serve (the paged source, head
    // dims 64 and 256), in a plan whose tiles the mma.sync kernel also runs (its built rows per
    // CTA: MLA's qk 192 / v 128, one query head per KV head): the same items there. Only plans of
    // one head per work tile: a packed plan's rows can match a build too, but whether a batch packs
    // depends on its lengths, and such a call is served or refused by the model, not the batch.
    if (p != NULL && plan != NULL && p->kv_dtype != p->q_dtype &&
        !hopper_f8_serves(p->kv_dtype, p->head_dim_qk, p->head_dim_v, p->kv_indptr == NULL) &&
        plan->tile_tokens == ap_hopper::kRows &&
        ap_kit_prefill_tile_rows_built(plan->head_dim_qk, plan->head_dim_v, plan->tile_rows)) {
        ap_kit_prefill_plan mma = *plan;
        mma.hopper = 0;
        return ap_kit_prefill_run(p, &mma, stream, who, msg);
    }
    ap_status st = hopper_check(p, plan, who, msg);
    if (st != AP_OK || plan->num_items == 0 || plan->num_q_tokens == 0) return st;
    const int32_t splits = plan_splits(plan);
    if ((int64_t)plan->num_items * p->num_qo_heads * splits > INT32_MAX / 2) { // the order's ints
        ap_msgbuf_add(msg, "%s: %d work items x %d query heads x %d parts is too many work tiles",
                      who, plan->num_items, p->num_qo_heads, splits);
        return AP_ERR_UNSUPPORTED;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    st = p->q_dtype == AP_DTYPE_BF16 ? hopper_dispatch<__nv_bfloat16>(p, plan, s, who, msg)
                                     : hopper_dispatch<__half>(p, plan, s, who, msg);
    if (st != AP_OK || splits == 1) return st;
    return hopper_merge_splits(p, plan, s, who, msg); /* the parts' rows into out and lse */
}

extern "C" int32_t ap_kit_prefill_plan_ragged_ok(const ap_kit_prefill_plan *plan) {
    return plan != NULL && (!plan->hopper || hopper_tile_rows(plan->head_dim_qk, true) ==
                                                 hopper_tile_rows(plan->head_dim_qk, false));
}

#else // no sm_90a code in this build: every plan goes to the mma.sync kernel

extern "C" int32_t ap_kit_prefill_plan_ragged_ok(const ap_kit_prefill_plan *plan) {
    return plan != NULL && !plan->hopper;
}

extern "C" int32_t ap_kit_prefill_hopper_tile_rows(const ap_kit_prefill_plan_args *args) {
    (void)args;
    return 0;
}

extern "C" int32_t ap_kit_prefill_hopper_splits(const ap_kit_prefill_plan *plan,
                                                int64_t longest_keys) {
    (void)plan;
    (void)longest_keys;
    return 1;
}

extern "C" ap_status ap_kit_prefill_hopper_run(const ap_kit_prefill_params *p,
                                               const ap_kit_prefill_plan *plan, void *stream,
                                               const char *who, ap_msgbuf *msg) {
    (void)p;
    (void)plan;
    (void)stream;
    ap_msgbuf_add(msg, "%s: this build has no Hopper prefill kernel (no sm_90a code)", who);
    return AP_ERR_UNSUPPORTED;
}

#endif

// Both builds (ap_kit_prefill_plan_ragged_ok has a form in each; without sm_90a code no plan is a
// Hopper one, so this returns 0).
extern "C" int32_t ap_kit_prefill_fresh_in_place(const ap_kit_prefill_plan *plan, int32_t fresh,
                                                 const ap_model *model, const ap_layer *layer,
                                                 const ap_forward_args *args, int32_t num_tokens,
                                                 ap_kit_prefill_params *params,
                                                 ap_kit_prefill_plan *ragged) {
    if (!fresh || plan == NULL || !plan->hopper || !ap_kit_prefill_plan_ragged_ok(plan) ||
        !args->save_kv || args->k == NULL || args->v == NULL || layer->kv->dtype != model->dtype ||
        model->kv_dtype != model->dtype ||
        (model->dtype != AP_DTYPE_BF16 && model->dtype != AP_DTYPE_F16))
        return 0;
    /* the same work items over the ragged source: with no prefix, item kv_tiles count the
     * sequence's own tokens either way; the K/V rows are the new tokens', by qo_indptr */
    *ragged = *plan;
    ragged->ragged = 1;
    ragged->num_kv_rows = num_tokens;
    params->k = ap_kit_data(args->k);
    params->v = ap_kit_data(args->v);
    params->kv_indptr = params->qo_indptr;
    return 1;
}
