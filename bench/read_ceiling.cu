// read_ceiling.cu: the HBM read rate of the decode's access patterns, with no math: what a
// decode of B64 L4096 H8 D128 bf16 (1 GiB of K and V) can reach at best in each cache layout.
//   dense   [B, H, S, D] K and V (torch SDPA's peers): a (sequence, head) reads 1 MiB contiguous
//   nhd     pages of 16 tokens x 8 heads x 256 bytes in random order (our paged cache): a
//           (sequence, head) reads 16 rows of 256 bytes, 2 KB apart, per page
//   hnd     the same pages with a head's 16 rows together (4 KB contiguous per page and head)
//   *_fp8   the same with 128-byte rows (fp8 D128: 512 MiB)
// One CTA of 256 threads per (sequence, head, K or V), 16 bytes a thread, 16 KB of loads in
// flight per CTA, streaming loads; GB/s count the bytes read once. Medians of 30 event-timed
// launches after warm-up. Last, split_start (below): how long a split-KV decode's CTAs wait for
// a query block that all of them read. Built as bench/read-ceiling (meson), or alone:
//   nvcc -O3 -std=c++17 -arch=sm_90a -I. -o /tmp/read-ceiling bench/read_ceiling.cu
//   bench/bench_fill.cu (one line), then /tmp/read-ceiling
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "bench_fill.h"

namespace {

constexpr int kSeqs = 64, kHeads = 8, kLen = 4096, kPage = 16;
constexpr int kPagesPerSeq = kLen / kPage;                         // 256
constexpr size_t kPoolBytes = (size_t)kSeqs * kLen * kHeads * 256; // 512 MiB per K or V (bf16)
constexpr int kInFlight = 4;                                       // rounds of loads per CTA batch

enum Layout { kDense = 0, kNhd = 1, kHnd = 2 };

// Byte offset of token row `tok` of page slot `page` for head h, by layout; ROW: bytes of a
// head's row (256: bf16 D128, 128: fp8 D128).
template <int LAYOUT, int ROW> __device__ __forceinline__ size_t row_at(int page, int h, int tok) {
    constexpr size_t kPageBytes = (size_t)kPage * kHeads * ROW;
    if (LAYOUT == kNhd) return (size_t)page * kPageBytes + (size_t)tok * kHeads * ROW + h * ROW;
    return (size_t)page * kPageBytes + (size_t)h * kPage * ROW + tok * ROW; // kHnd
}

// A round: 256 threads, ROW / 16 a row, so 4096 / ROW rows (a page of 16 for ROW 256, two for
// 128); kInFlight rounds of loads in flight.
template <int LAYOUT, int ROW>
__global__ void __launch_bounds__(256)
    read_kernel(const uint8_t *k, const uint8_t *v, const int *pages, unsigned *sink) {
    constexpr int kLanes = ROW / 16, kRows = 256 / kLanes, kPagesPerRound = kRows / kPage;
    const int item = blockIdx.x; // (seq, head, K or V)
    const int seq = item / (2 * kHeads), h = item / 2 % kHeads;
    const uint8_t *base = item % 2 ? v : k;
    const int r = threadIdx.x / kLanes, col = threadIdx.x % kLanes * 16;
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int p0 = 0; p0 < kPagesPerSeq; p0 += kInFlight * kPagesPerRound) {
        uint4 x[kInFlight];
#pragma unroll
        for (int i = 0; i < kInFlight; i++) {
            const int page = p0 + i * kPagesPerRound + r / kPage, tok = r % kPage;
            size_t off;
            if (LAYOUT == kDense) // [seq, head] of 4096 rows, contiguous
                off = ((size_t)(seq * kHeads + h) * kLen + (size_t)page * kPage + tok) * ROW;
            else
                off = row_at<LAYOUT, ROW>(__ldg(pages + seq * kPagesPerSeq + page), h, tok);
            x[i] = __ldcs(reinterpret_cast<const uint4 *>(base + off + col));
        }
#pragma unroll
        for (int i = 0; i < kInFlight; i++) {
            acc.x ^= x[i].x;
            acc.y ^= x[i].y;
            acc.z ^= x[i].z;
            acc.w ^= x[i].w;
        }
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) atomicAdd(sink, 1u); // never: no DCE
}

// Split-KV's start, B1 (trtllm_mla B1 L32768 H16's shape): 128 CTAs each read an 18 KB query
// block, then stream their own 288 KB of KV (4 tiles of 72 KB); the query block is one for all
// (shared: a single sequence's query, as every split of B1 reads it) or each CTA's own. The L2 is
// flushed before each launch; per CTA the globaltimer at its start, with its query read, at its
// end (ns).
constexpr int kSplitCtas = 128, kQBytes = 18432, kKvBytes = 4 * 73728;
__global__ void __launch_bounds__(256)
    split_start_kernel(const uint8_t *q, const uint8_t *kv, int shared_q, unsigned long long *t,
                       unsigned *sink) {
    unsigned long long t0, t1, t2;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    const uint8_t *qb = q + (shared_q ? 0 : (size_t)blockIdx.x * kQBytes);
    uint4 acc = make_uint4(0, 0, 0, 0);
    for (int i = threadIdx.x; i < kQBytes / 16; i += 256) {
        const uint4 x = __ldcg(reinterpret_cast<const uint4 *>(qb) + i);
        acc.x ^= x.x;
        acc.y ^= x.y;
    }
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
    const uint4 *kb = reinterpret_cast<const uint4 *>(kv + (size_t)blockIdx.x * kKvBytes);
    for (int i0 = 0; i0 < kKvBytes / 16; i0 += 256 * 8) {
        uint4 x[8];
#pragma unroll
        for (int i = 0; i < 8; i++) x[i] = __ldcs(kb + i0 + i * 256 + threadIdx.x);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            acc.z ^= x[i].z;
            acc.w ^= x[i].w;
        }
    }
    __syncthreads();
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t2));
    if (threadIdx.x == 0) {
        t[3 * blockIdx.x] = t0;
        t[3 * blockIdx.x + 1] = t1;
        t[3 * blockIdx.x + 2] = t2;
    }
    if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x9e3779b9u) atomicAdd(sink, 1u);
}

#define CK(x) \
    do { \
        cudaError_t e_ = (x); \
        if (e_ != cudaSuccess) { \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); \
            return 1; \
        } \
    } while (0)

template <int LAYOUT, int ROW>
int time_layout(const char *name, const uint8_t *k, const uint8_t *v, const int *pages,
                unsigned *sink) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    const int items = kSeqs * kHeads * 2;
    for (int i = 0; i < 3; i++) read_kernel<LAYOUT, ROW><<<items, 256>>>(k, v, pages, sink);
    std::vector<float> ms(30);
    for (float &t : ms) {
        CK(cudaEventRecord(a));
        read_kernel<LAYOUT, ROW><<<items, 256>>>(k, v, pages, sink);
        CK(cudaEventRecord(b));
        CK(cudaEventSynchronize(b));
        CK(cudaEventElapsedTime(&t, a, b));
    }
    CK(cudaGetLastError());
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    const double bytes = 2.0 * kPoolBytes * ROW / 256;
    printf("%-10s %.4f ms  %7.1f GB/s (min %.4f ms)\n", name, med, bytes / med / 1e6, ms[0]);
    return 0;
}

int split_start(const uint8_t *k, const uint8_t *v, unsigned *sink) {
    unsigned long long *t = nullptr;
    uint8_t *flush = nullptr;
    const size_t flush_bytes = (size_t)256 << 20;
    CK(cudaMalloc(&t, sizeof(unsigned long long) * 3 * kSplitCtas));
    CK(cudaMalloc(&flush, flush_bytes));
    std::vector<unsigned long long> h(3 * kSplitCtas);
    for (int shared = 1; shared >= 0; shared--) {
        std::vector<double> q_med, end_med, end_max;
        for (int run = 0; run < 9; run++) {
            CK(cudaMemset(flush, run, flush_bytes)); // the L2 holds neither q nor kv
            split_start_kernel<<<kSplitCtas, 256>>>(k, v, shared, t, sink);
            CK(cudaDeviceSynchronize());
            CK(cudaMemcpy(h.data(), t, sizeof(unsigned long long) * h.size(),
                          cudaMemcpyDeviceToHost));
            unsigned long long t0 = h[0];
            for (int c = 0; c < kSplitCtas; c++) t0 = std::min(t0, h[3 * c]);
            std::vector<double> qs, es;
            for (int c = 0; c < kSplitCtas; c++) {
                qs.push_back((h[3 * c + 1] - t0) / 1e3);
                es.push_back((h[3 * c + 2] - t0) / 1e3);
            }
            std::sort(qs.begin(), qs.end());
            std::sort(es.begin(), es.end());
            q_med.push_back(qs[qs.size() / 2]);
            end_med.push_back(es[es.size() / 2]);
            end_max.push_back(es.back());
        }
        std::sort(q_med.begin(), q_med.end());
        std::sort(end_med.begin(), end_med.end());
        std::sort(end_max.begin(), end_max.end());
        printf("split start, %s query: query read by %.2f us (median CTA), end %.2f us median, "
               "%.2f us last (medians of 9)\n",
               shared ? "one shared" : "per-CTA", q_med[4], end_med[4], end_max[4]);
    }
    cudaFree(t);
    cudaFree(flush);
    return 0;
}

} // namespace

int main() {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("read-ceiling on %s: 1 GiB of K and V, B%d L%d H%d D128 bf16\n", prop.name, kSeqs, kLen,
           kHeads);
    uint8_t *k = nullptr, *v = nullptr;
    int *pages = nullptr;
    unsigned *sink = nullptr;
    CK(cudaMalloc(&k, kPoolBytes));
    CK(cudaMalloc(&v, kPoolBytes));
    CK(cudaMalloc(&pages, sizeof(int) * kSeqs * kPagesPerSeq));
    CK(cudaMalloc(&sink, sizeof(unsigned)));
    CK((cudaError_t)bench_fill_random(k, kPoolBytes / 2, AP_DTYPE_BF16, 2.f, 1, 0));
    CK((cudaError_t)bench_fill_random(v, kPoolBytes / 2, AP_DTYPE_BF16, 2.f, 2, 0));
    std::vector<int> perm(kSeqs * kPagesPerSeq);
    for (size_t i = 0; i < perm.size(); i++) perm[i] = (int)i;
    int rc = 0;
    for (int shuffled = 0; shuffled < 2; shuffled++) {
        if (shuffled) std::shuffle(perm.begin(), perm.end(), std::mt19937(1234));
        CK(cudaMemcpy(pages, perm.data(), sizeof(int) * perm.size(), cudaMemcpyHostToDevice));
        printf("page table %s\n", shuffled ? "shuffled" : "in order");
        if (!shuffled) rc |= time_layout<kDense, 256>("dense", k, v, pages, sink);
        rc |= time_layout<kNhd, 256>("nhd", k, v, pages, sink);
        rc |= time_layout<kHnd, 256>("hnd", k, v, pages, sink);
        if (!shuffled) rc |= time_layout<kDense, 128>("dense fp8", k, v, pages, sink);
        rc |= time_layout<kNhd, 128>("nhd fp8", k, v, pages, sink);
    }
    rc |= split_start(k, v, sink);
    return rc;
}
