// test_div_rcp.cu: dtype.cuh's ap_div_rcp (n / d by multiply-high, add and shift) against plain
// division on the host, over its documented range 0 <= n < 2^31, 1 <= d <= 2^31; no GPU.
#include <cstdio>

#include "backends/common/dtype.cuh"

static long checked;

// n / d with the magic r, against n / d; prints the first few misses.
static long check(uint32_t n, uint32_t d, ap_div_rcp r) {
    checked++;
    const uint32_t got = ap_div_rcp_apply(n, r);
    if (got == n / d) return 0;
    static int shown;
    if (shown++ < 5) printf("ap_div_rcp: %u / %u gave %u, not %u\n", n, d, got, n / d);
    return 1;
}

// The quotient's steps (k * d - 1, k * d) for k in a geometric spread, the range's ends, and a
// stretch of pseudo-random n.
static long check_divisor(uint32_t d, ap_div_rcp r) {
    const uint32_t top = 0x7fffffffu;
    long bad = check(0, d, r) + check(1, d, r) + check(top, d, r) + check(top - 1, d, r);
    for (uint64_t k = 1; k * d <= top; k += 1 + k / 64) {
        const uint64_t n = k * d;
        bad += check((uint32_t)(n - 1), d, r) + check((uint32_t)n, d, r);
        if (n + 1 <= top) bad += check((uint32_t)(n + 1), d, r);
    }
    uint32_t x = 0x9e3779b9u ^ d;
    for (int i = 0; i < 2000; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        bad += check(x & top, d, r);
    }
    return bad;
}

int main(void) {
    long bad = 0;
    for (uint32_t d = 1; d <= 4096; d++) bad += check_divisor(d, ap_div_rcp_make(d));
    const uint32_t big[] = {4097u,          65535u,         65536u,     65537u,         1000003u,
                            (1u << 24) + 1, (1u << 30) - 1, 1u << 30,   (1u << 30) + 1, 3u << 29,
                            0x7ffffffeu,    0x7fffffffu,    0x80000000u};
    for (uint32_t d : big) bad += check_divisor(d, ap_div_rcp_make(d));
    // every n for divisors the kernels use (heads counts, 72 units of a latent row) and a prime
    const uint32_t every[] = {3u, 72u, 641u};
    for (uint32_t d : every) {
        const ap_div_rcp r = ap_div_rcp_make(d);
        for (uint32_t n = 0; n < 0x80000000u; n++) bad += check(n, d, r);
    }
    // the check itself can fail: a multiplier one too small must be caught for 7
    ap_div_rcp wrong = ap_div_rcp_make(7);
    wrong.mul -= 1;
    long caught = 0;
    for (uint32_t n = 0; n < 0x80000000u && caught == 0; n++)
        caught += ap_div_rcp_apply(n, wrong) != n / 7;
    printf("ap_div_rcp: %ld quotients, %ld wrong; a wrong multiplier %s\n", checked, bad,
           caught ? "caught" : "NOT caught");
    return bad != 0 || caught == 0;
}
