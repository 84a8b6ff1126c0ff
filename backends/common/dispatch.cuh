// dispatch.cuh: from a call's run-time shape (head dim, query and cache dtypes, page size) to
// the template arguments of the kernel built for it, once for every kernel family. A launcher
// writes its kernel's instantiation as a generic lambda and lets these pick the types:
//
//   return ap_dispatch_head_dim(head_dim, fallback, [&](auto dim) {
//       return ap_dispatch_q(q_dtype, fallback, [&](auto q) {
//           using QT = typename decltype(q)::type;
//           return ap_dispatch_kv<QT>(kv_dtype, fallback, [&](auto kv) {
//               return variant<decltype(dim)::value, typename decltype(kv)::type, QT>();
//           });
//       });
//   });
//
// Each returns `fallback` for a value with no kernel, so a shape the caller did not build is a
// refusal with a message, never a launch. Page sizes are not template arguments: paged_kv.cuh's
// lookup takes a POW2 flag (a shift by ap_page_shift) or divides, and a host whose kernel has
// only the shift path refuses other sizes.
#ifndef AP_COMMON_DISPATCH_CUH
#define AP_COMMON_DISPATCH_CUH

#include <type_traits>

#include "dtype.cuh"
#include "plugin_api.h"

template <typename T> struct ap_type_tag { using type = T; };

// The cache element types a kit kernel reads, besides the 16-bit ones: nvfp4 is a tag (two
// values a byte, block scales beside; nvfp4.cuh decodes them).
struct ap_nvfp4 {};

// Head dims 64, 128 and 256, the ones MHA kernels build, as std::integral_constant<int, D>.
template <typename R, typename F> R ap_dispatch_head_dim(int head_dim, R fallback, F &&f) {
    switch (head_dim) {
        case 64: return f(std::integral_constant<int, 64>{});
        case 128: return f(std::integral_constant<int, 128>{});
        case 256: return f(std::integral_constant<int, 256>{});
        default: return fallback;
    }
}

// Queries (and outputs) bf16 or f16.
template <typename R, typename F> R ap_dispatch_q(ap_dtype q_dtype, R fallback, F &&f) {
    if (q_dtype == AP_DTYPE_BF16) return f(ap_type_tag<__nv_bfloat16>{});
    if (q_dtype == AP_DTYPE_F16) return f(ap_type_tag<__half>{});
    return fallback;
}

// The cache under queries of type QT: QT itself (a 16-bit cache has the query dtype), fp8 e4m3,
// and nvfp4 where the caller says it has a kernel for it.
template <typename QT, bool NVFP4 = false, typename R, typename F>
R ap_dispatch_kv(ap_dtype kv_dtype, R fallback, F &&f) {
    const ap_dtype q_dtype = std::is_same<QT, __half>::value ? AP_DTYPE_F16 : AP_DTYPE_BF16;
    if (kv_dtype == AP_DTYPE_FP8_E4M3) return f(ap_type_tag<ap_fp8_e4m3>{});
    if constexpr (NVFP4)
        if (kv_dtype == AP_DTYPE_NVFP4) return f(ap_type_tag<ap_nvfp4>{});
    if (kv_dtype == q_dtype) return f(ap_type_tag<QT>{});
    return fallback;
}

// Any cache a kit kernel writes, whatever the input dtype: bf16, f16, fp8 e4m3, and nvfp4 where
// the caller says it has a kernel for it (the paged append converts between 16-bit types).
template <bool NVFP4 = false, typename R, typename F>
R ap_dispatch_cache(ap_dtype kv_dtype, R fallback, F &&f) {
    switch (kv_dtype) {
        case AP_DTYPE_BF16: return f(ap_type_tag<__nv_bfloat16>{});
        case AP_DTYPE_F16: return f(ap_type_tag<__half>{});
        case AP_DTYPE_FP8_E4M3: return f(ap_type_tag<ap_fp8_e4m3>{});
        case AP_DTYPE_NVFP4:
            if constexpr (NVFP4) return f(ap_type_tag<ap_nvfp4>{});
            return fallback;
        default: return fallback;
    }
}

#endif // AP_COMMON_DISPATCH_CUH
