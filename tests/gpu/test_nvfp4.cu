// test_nvfp4.cu: NVFP4 on the GPU (backends/common/nvfp4.cuh) against the host's nvfp4_host.h.
// Quantize: random and adversarial blocks, byte for byte. Dequantize: the fast prmt decode (half,
// bf16, float) of every value byte under every scale byte. Exits 77 without a GPU.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backends/common/nvfp4.cuh"

#define CHECK_CUDA(call) \
    do { \
        cudaError_t err_ = (call); \
        if (err_ != cudaSuccess) { \
            printf("CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
            return 1; \
        } \
    } while (0)

__global__ void quantize_blocks(const float *x, const float *globals, int blocks, uint32_t *words,
                                uint8_t *scales) {
    int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    float block[16];
    for (int i = 0; i < 16; i++) block[i] = x[(size_t)b * 16 + i];
    scales[b] = ap_nvfp4_quantize16(block, globals[b], words + 2 * (size_t)b);
}

// One thread per (scale byte, word): the three decode paths of 8 values.
__global__ void dequantize_words(const uint32_t *words, int num_words, float g, uint16_t *halves,
                                 uint16_t *bf16s, float *floats, uint16_t *raw_halves) {
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= 256 * num_words) return;
    uint8_t scale = (uint8_t)(t / num_words);
    uint32_t w = words[t % num_words];
    __half2 h[4];
    __nv_bfloat162 b[4];
    float f[8];
    uint32_t raw[4];
    ap_nvfp4_dequant8_half2(w, ap_nvfp4_scale_half2(scale), h);
    ap_nvfp4_dequant8_bf162(w, ap_nvfp4_scale_bf162(scale), b);
    ap_nvfp4_dequant8_float(w, scale, g, f);
    ap_nvfp4_e2m1x8_to_f16x2(w, raw);
    for (int v = 0; v < 8; v++) {
        size_t at = (size_t)t * 8 + v;
        halves[at] = __half_as_ushort(v % 2 ? __high2half(h[v / 2]) : __low2half(h[v / 2]));
        bf16s[at] =
            __bfloat16_as_ushort(v % 2 ? __high2bfloat16(b[v / 2]) : __low2bfloat16(b[v / 2]));
        floats[at] = f[v];
        raw_halves[at] = (uint16_t)(raw[v / 2] >> (16 * (v % 2)));
    }
}

// Seeded xorshift: the same blocks every run.
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static double uniform(double lo, double hi) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return lo + (hi - lo) * (double)(rng_state >> 11) / 9007199254740992.0;
}

// Random blocks of several shapes and global scales, then adversarial ones: all equal, one
// outlier, zeros, tiny, past the range, inf, NaN, every scale code.
static void make_blocks(std::vector<float> &x, std::vector<float> &globals) {
    const int random_blocks = 1 << 18;
    for (int b = 0; b < random_blocks; b++) {
        float g = (float)std::exp(uniform(std::log(1e-5), std::log(4.0)));
        globals.push_back(g);
        for (int i = 0; i < 16; i++) {
            double u = uniform(-1.0, 1.0);
            double v = b % 4 == 0   ? u
                       : b % 4 == 1 ? u * u * u * 40.0
                       : b % 4 == 2 ? std::copysign(std::exp(uniform(-14, 4)), u)
                                    : u * 6.0 * 448.0 * g * 1.2;
            x.push_back((float)v);
        }
    }
    for (int s = 0; s < 0x7f; s++)
        for (int variant = 0; variant < 8; variant++) {
            float g = variant % 2 ? 1.0f : 3.1e-3f;
            float amax = (float)(6.0 * ap_fp8_e4m3_to_float((uint8_t)s) * g);
            globals.push_back(g);
            for (int i = 0; i < 16; i++) {
                float v = amax * (float)uniform(-1.0, 1.0);
                if (variant == 2) v = amax;                                  // all equal
                if (variant == 3 && i == 5) v = -amax * 37.0f;               // one outlier
                if (variant == 4) v = i % 2 ? 0.0f : -0.0f;                  // zeros
                if (variant == 5 && i == 7) v = INFINITY;                    // inf
                if (variant == 6 && i == 11) v = NAN;                        // NaN
                if (variant == 7) v = (float)uniform(-1.0, 1.0) * 1e-7f * g; // tiny
                x.push_back(v);
            }
        }
}

static int check_quantize(void) {
    std::vector<float> x, globals;
    make_blocks(x, globals);
    int blocks = (int)globals.size();
    float *d_x = nullptr, *d_g = nullptr;
    uint32_t *d_words = nullptr;
    uint8_t *d_scales = nullptr;
    CHECK_CUDA(cudaMalloc(&d_x, x.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_g, globals.size() * sizeof(float)));
    CHECK_CUDA(cudaMalloc(&d_words, (size_t)blocks * 8));
    CHECK_CUDA(cudaMalloc(&d_scales, (size_t)blocks));
    CHECK_CUDA(cudaMemcpy(d_x, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(d_g, globals.data(), globals.size() * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemset(d_words, 0xa5, (size_t)blocks * 8));
    quantize_blocks<<<(blocks + 127) / 128, 128>>>(d_x, d_g, blocks, d_words, d_scales);
    CHECK_CUDA(cudaGetLastError());
    std::vector<uint8_t> words((size_t)blocks * 8), scales((size_t)blocks);
    CHECK_CUDA(cudaMemcpy(words.data(), d_words, words.size(), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(scales.data(), d_scales, scales.size(), cudaMemcpyDeviceToHost));
    long mismatches = 0;
    for (int b = 0; b < blocks; b++) {
        uint8_t packed[8];
        uint8_t scale = ap_nvfp4_quantize_block(&x[(size_t)b * 16], globals[b], packed);
        int same = scale == scales[b] && memcmp(packed, &words[(size_t)b * 8], 8) == 0;
        if (!same && mismatches++ < 5)
            printf("quantize block %d (g %a): GPU scale 0x%02x, host 0x%02x\n", b,
                   (double)globals[b], scales[b], scale);
    }
    printf("quantize: %d blocks, %ld differ from the host\n", blocks, mismatches);
    cudaFree(d_x);
    cudaFree(d_g);
    cudaFree(d_words);
    cudaFree(d_scales);
    return mismatches != 0;
}

static uint32_t float_bits_or_nan(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    return std::isnan(x) ? 0x7fc00000u : bits; // any NaN matches any NaN
}

// Each of the 4 byte positions of the words sees every byte value.
static int check_dequantize(float g) {
    const int num_words = 256;
    std::vector<uint32_t> words(num_words);
    for (int j = 0; j < num_words; j++)
        words[j] = (uint32_t)(j & 255) | (uint32_t)((j + 67) & 255) << 8 |
                   (uint32_t)((j + 134) & 255) << 16 | (uint32_t)((j + 201) & 255) << 24;
    size_t values = (size_t)256 * num_words * 8;
    uint32_t *d_words = nullptr;
    uint16_t *d_halves = nullptr, *d_bf16s = nullptr, *d_raw = nullptr;
    float *d_floats = nullptr;
    CHECK_CUDA(cudaMalloc(&d_words, num_words * 4));
    CHECK_CUDA(cudaMalloc(&d_halves, values * 2));
    CHECK_CUDA(cudaMalloc(&d_bf16s, values * 2));
    CHECK_CUDA(cudaMalloc(&d_raw, values * 2));
    CHECK_CUDA(cudaMalloc(&d_floats, values * 4));
    CHECK_CUDA(cudaMemcpy(d_words, words.data(), num_words * 4, cudaMemcpyHostToDevice));
    dequantize_words<<<256 * num_words / 128, 128>>>(d_words, num_words, g, d_halves, d_bf16s,
                                                     d_floats, d_raw);
    CHECK_CUDA(cudaGetLastError());
    std::vector<uint16_t> halves(values), bf16s(values), raw(values);
    std::vector<float> floats(values);
    CHECK_CUDA(cudaMemcpy(halves.data(), d_halves, values * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(bf16s.data(), d_bf16s, values * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(raw.data(), d_raw, values * 2, cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(floats.data(), d_floats, values * 4, cudaMemcpyDeviceToHost));
    long bad[4] = {0, 0, 0, 0};
    for (size_t at = 0; at < values; at++) {
        size_t t = at / 8;
        int v = (int)(at % 8);
        uint8_t scale = (uint8_t)(t / num_words);
        uint32_t w = words[t % num_words];
        uint8_t packed[4];
        memcpy(packed, &w, 4);
        float unscaled = ap_nvfp4_unscaled(packed, scale, v); // exact in half and bf16
        float want_float = ap_nvfp4_dequantize(packed, scale, g, v);
        uint16_t want_raw = ap_float_to_f16(ap_e2m1_to_float((uint8_t)((w >> (4 * v)) & 15)));
        int nan = std::isnan(unscaled);
        int half_ok =
            nan ? std::isnan(ap_f16_to_float(halves[at])) : halves[at] == ap_float_to_f16(unscaled);
        int bf16_ok =
            nan ? std::isnan(ap_bf16_to_float(bf16s[at])) : bf16s[at] == ap_float_to_bf16(unscaled);
        int float_ok = float_bits_or_nan(floats[at]) == float_bits_or_nan(want_float);
        int oks[4] = {half_ok, bf16_ok, float_ok, raw[at] == want_raw};
        for (int k = 0; k < 4; k++)
            if (!oks[k] && bad[k]++ < 3)
                printf("dequantize path %d: word %08x value %d scale 0x%02x g %a: half %04x bf16 "
                       "%04x float %a raw %04x; host %a\n",
                       k, w, v, scale, (double)g, halves[at], bf16s[at], (double)floats[at],
                       raw[at], (double)want_float);
    }
    printf("dequantize g %g: %zu values; mismatches half %ld, bf16 %ld, float %ld, raw %ld\n",
           (double)g, values, bad[0], bad[1], bad[2], bad[3]);
    cudaFree(d_words);
    cudaFree(d_halves);
    cudaFree(d_bf16s);
    cudaFree(d_raw);
    cudaFree(d_floats);
    return bad[0] + bad[1] + bad[2] + bad[3] != 0;
}

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    int failed = check_quantize();
    failed |= check_dequantize(1.0f);
    failed |= check_dequantize(3.7e-3f);
    CHECK_CUDA(cudaDeviceSynchronize());
    printf("%s\n", failed ? "FAILED" : "ok");
    return failed;
}
