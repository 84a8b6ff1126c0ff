// test_nvfp4_decode.cu: nvfp4.cuh's host-compilable logic, run on the host (prmt emulated), no GPU:
// the prmt decode (tests/gpu/test_nvfp4.cu runs it with the real prmt: this one checks the tables,
// selectors and sign bits wherever nvcc exists), the shorter ap_nvfp4_hi_bytes / ap_nvfp4_pair14
// decode (value * 2^-14) the same way, and the quantizer's fast E2M1 codes.
#include <cstdio>
#include <cstring>

#include "backends/common/nvfp4.cuh"

// Every value of the word against the format's own decode, as half and as bf16 bits.
static int check_word(uint32_t w) {
    uint32_t halves[4], bf16s[4];
    ap_nvfp4_e2m1x8_to_f16x2(w, halves);
    ap_nvfp4_e2m1x8_to_bf16x2(w, bf16s);
    int bad = 0;
    for (int v = 0; v < 8; v++) {
        float want = ap_e2m1_to_float((uint8_t)((w >> (4 * v)) & 15));
        uint16_t half = (uint16_t)(halves[v / 2] >> (16 * (v % 2)));
        uint16_t bf16 = (uint16_t)(bf16s[v / 2] >> (16 * (v % 2)));
        if (half != ap_float_to_f16(want) || bf16 != ap_float_to_bf16(want)) {
            printf("word %08x value %d (%g): half %04x, want %04x; bf16 %04x, want %04x\n", w, v,
                   (double)want, half, ap_float_to_f16(want), bf16, ap_float_to_bf16(want));
            bad = 1;
        }
    }
    // the shorter decode: value v from byte v / 2 of .even / .odd, as value * 2^-14
    const ap_nvfp4_hi hi = ap_nvfp4_hi_bytes(w);
    for (int v = 0; v < 8; v++) {
        float want = ap_e2m1_to_float((uint8_t)((w >> (4 * v)) & 15)) / AP_NVFP4_UNBIAS14;
        uint32_t pair = ap_nvfp4_pair14(v % 2 ? hi.odd : hi.even, v / 2, (v / 2 + 1) % 4);
        uint16_t lo = (uint16_t)pair, up = (uint16_t)(pair >> 16);
        uint16_t up_want = ap_float_to_f16(
            ap_e2m1_to_float((uint8_t)((w >> (4 * (v % 2 + 2 * ((v / 2 + 1) % 4)))) & 15)) /
            AP_NVFP4_UNBIAS14);
        if (lo != ap_float_to_f16(want) || up != up_want) {
            printf("word %08x value %d (%g): pair14 %08x, want %04x low, %04x high\n", w, v,
                   (double)want, pair, ap_float_to_f16(want), up_want);
            bad = 1;
        }
    }
    return bad;
}

// ap_e2m1_code_fast against the compares of ap_float_to_e2m1: every float of magnitude below 8
// (every rounding boundary and the saturation lie there), each with both signs, then every 251st
// bit pattern of the rest (larger values, infinities, NaNs).
static long check_e2m1_fast(void) {
    long bad = 0;
    for (uint64_t b = 0; b < (1ull << 32);
         b += (b < 0x41000000u || (b >= 0x80000000u && b < 0xc1000000u)) ? 1 : 251) {
        const uint32_t u = (uint32_t)b;
        float y;
        memcpy(&y, &u, sizeof y);
        if ((uint32_t)ap_float_to_e2m1(y) != ap_e2m1_code_fast(y) && bad++ < 5)
            printf("e2m1 of %08x (%g): fast %u, want %u\n", u, (double)y, ap_e2m1_code_fast(y),
                   (unsigned)ap_float_to_e2m1(y));
    }
    printf("e2m1 fast codes on the host: %ld wrong\n", bad);
    return bad;
}

// ap_nvfp4_codes8 against ap_nvfp4_block_codes on blocks of scrambled values (exponents over the
// whole range, the block's reciprocal from its own scale), with and without a NaN flag.
static long check_codes8(void) {
    long bad = 0;
    uint32_t x = 0x9e3779b9u;
    for (int i = 0; i < 200000; i++) {
        float v[8];
        for (int k = 0; k < 8; k++) {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            const uint32_t bits = (x & 0x807fffffu) | ((100u + (x >> 8) % 60u) << 23);
            memcpy(&v[k], &bits, sizeof bits);
        }
        int has_nan = 0;
        float inv;
        ap_nvfp4_block_scale(ap_nvfp4_block_amax(v, 8, &has_nan), 0, 1.0f / 64, &inv);
        for (int nan_flag = 0; nan_flag < 2; nan_flag++) {
            uint8_t packed[4];
            ap_nvfp4_block_codes(v, 8, inv, nan_flag, packed);
            const uint32_t want = (uint32_t)packed[0] | (uint32_t)packed[1] << 8 |
                                  (uint32_t)packed[2] << 16 | (uint32_t)packed[3] << 24;
            if (ap_nvfp4_codes8(v, inv, nan_flag) != want && bad++ < 5)
                printf("codes8 block %d nan %d: %08x, want %08x\n", i, nan_flag,
                       ap_nvfp4_codes8(v, inv, nan_flag), want);
        }
    }
    printf("nvfp4 codes8 on the host: %ld wrong\n", bad);
    return bad;
}

int main(void) {
    long failures = 0, words = 0;
    // every 16-bit pattern in each half (the other half varied), then scrambled words
    for (uint32_t i = 0; i < 65536; i++) {
        failures += check_word(i | (~i * 0x9e37u) << 16);
        failures += check_word(i << 16 | (i * 0x7f4au & 0xffffu));
        words += 2;
    }
    uint32_t x = 0x12345678u;
    for (int i = 0; i < 1000000; i++, words++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        failures += check_word(x);
    }
    printf("nvfp4 prmt decode on the host: %ld words, %ld wrong\n", words, failures);
    failures += check_e2m1_fast() + check_codes8();
    return failures != 0;
}
