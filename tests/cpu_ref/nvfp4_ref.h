/* nvfp4_ref.h: an independent NVFP4 quantizer for the tests, written from the definition. */
#ifndef AP_TEST_NVFP4_REF_H
#define AP_TEST_NVFP4_REF_H

#include <stdint.h>

/* Nothing here comes from backends/common: values from the formats' definitions, rounding by a
 * nearest-value search over every code (ties to the even code), the recipe of nvfp4_host.h's
 * comment spelled out in float32 operations. */
double nr_e2m1_value(int code); /* code 0..15 */
double nr_e4m3_value(int code); /* code 0..255; NaN for 0x7f and 0xff */
int nr_e2m1_encode(float y);    /* saturating at +-6; sign from the sign bit; NaN -> 0 */
int nr_e4m3_encode(float x);    /* saturating at +-448; NaN -> 0x7f */
/* The block recipe; returns the scale byte, writes 8 bytes (low nibble first). */
uint8_t nr_quantize_block(const float *x, float g, uint8_t *packed);
/* Value i of a block in double: e2m1 * e4m3 * g, each factor exact, one double product. */
double nr_dequantize(const uint8_t *packed, uint8_t scale, float g, int i);

#endif /* AP_TEST_NVFP4_REF_H */
