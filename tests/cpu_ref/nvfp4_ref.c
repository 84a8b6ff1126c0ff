/* nvfp4_ref.c: the tests' own NVFP4 quantizer: value lists and nearest-value searches. */
#include "nvfp4_ref.h"

#include <math.h>

double nr_e2m1_value(int code) {
    static const double magnitudes[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
    double m = magnitudes[code & 7];
    return (code & 8) ? -m : m;
}

/* (-1)^s * 2^(e - 7) * (1 + m / 8), or 2^-6 * m / 8 for e = 0; e = 15, m = 7 is NaN. */
double nr_e4m3_value(int code) {
    int e = (code >> 3) & 15, m = code & 7;
    if (e == 15 && m == 7) return NAN;
    double magnitude = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
    return (code & 0x80) ? -magnitude : magnitude;
}

/* The code among `count` ascending non-negative magnitudes (value(c) for c < count) nearest to
 * a >= 0; on a tie the even code. Past the last magnitude: the last (saturation). */
static int nr_nearest(double a, int count, double (*value)(int)) {
    if (a >= value(count - 1)) return count - 1; /* saturation (also for inf) */
    int best = 0;
    double best_distance = INFINITY;
    for (int c = 0; c < count; c++) {
        double distance = fabs(value(c) - a);
        if (distance < best_distance || (distance == best_distance && (c & 1) == 0)) {
            best = c;
            best_distance = distance;
        }
    }
    return best;
}

int nr_e2m1_encode(float y) {
    if (isnan(y)) return 0;
    return nr_nearest(fabs((double)y), 8, nr_e2m1_value) | (signbit(y) ? 8 : 0);
}

int nr_e4m3_encode(float x) {
    if (isnan(x)) return 0x7f;
    return nr_nearest(fabs((double)x), 0x7f, nr_e4m3_value) | (signbit(x) ? 0x80 : 0);
}

uint8_t nr_quantize_block(const float *x, float g, uint8_t *packed) {
    float amax = 0.0f;
    for (int i = 0; i < 16; i++) {
        if (isnan(x[i])) {
            for (int b = 0; b < 8; b++) packed[b] = 0;
            return 0x7f;
        }
        if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
    }
    float six_g = 6.0f * g;
    float scale_value = amax / six_g;
    int scale = nr_e4m3_encode(scale_value);
    float decoded = (float)nr_e4m3_value(scale);
    float inv = 0.0f;
    if (decoded != 0.0f) {
        float step = decoded * g;
        inv = 1.0f / step;
    }
    for (int b = 0; b < 8; b++) {
        float low = x[2 * b] * inv, high = x[2 * b + 1] * inv;
        packed[b] = (uint8_t)(nr_e2m1_encode(low) | (nr_e2m1_encode(high) << 4));
    }
    return (uint8_t)scale;
}

double nr_dequantize(const uint8_t *packed, uint8_t scale, float g, int i) {
    int code = (i & 1) ? packed[i / 2] >> 4 : packed[i / 2] & 15;
    return nr_e2m1_value(code) * nr_e4m3_value(scale) * (double)g;
}
