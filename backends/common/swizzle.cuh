// swizzle.cuh: where a 16-byte chunk of a shared-memory tile row lives, so ldmatrix is bank-free.
#ifndef AP_COMMON_SWIZZLE_CUH
#define AP_COMMON_SWIZZLE_CUH

// 16-byte chunk `chunk` of tile row `row` (rows of CHUNKS chunks) sits at chunk ^ f(row), so the
// 8 rows an ldmatrix reads at one logical chunk fall into 8 different bank groups: for rows of
// >= 128 bytes f is the row's low 3 bits; 64-byte rows pack two to a 128-byte line: bits 1..2;
// 32-byte rows four: bit 2.
template <int CHUNKS> __device__ __forceinline__ int ap_swizzle(int row, int chunk) {
    static_assert(CHUNKS >= 2, "rows of at least 32 bytes");
    return CHUNKS >= 8 ? (chunk ^ (row & 7))
                       : (CHUNKS == 4 ? (chunk ^ ((row >> 1) & 3)) : (chunk ^ ((row >> 2) & 1)));
}

#endif // AP_COMMON_SWIZZLE_CUH
