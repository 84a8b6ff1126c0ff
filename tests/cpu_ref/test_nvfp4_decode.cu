// test_nvfp4_decode.cu: nvfp4.cuh's prmt decode logic, run on the host (prmt emulated), no GPU.
// The GPU test (tests/gpu/test_nvfp4.cu) runs the same functions with the real prmt; this one
// checks the tables, selectors and sign bits wherever nvcc exists; and the shorter
// ap_nvfp4_hi_bytes / ap_nvfp4_pair14 decode (value * 2^-14) the same way.
#include <cstdio>

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
    return failures != 0;
}
