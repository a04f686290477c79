/* half.c - scalar fp16 / bf16 conversions (see half.h). */
#include "kernels/half.h"

#include <string.h>

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float half_fp16_to_f32(half_fp16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t man = h & 0x3FF;
    if (exp == 0x1F) /* inf / nan: keep payload */
        return f32_from_bits(sign | 0x7F800000u | (man << 13));
    if (exp != 0)
        return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
    /* zero or subnormal: man * 2^-24, exact in f32 */
    float v = (float)man * 0x1p-24f;
    return f32_from_bits(sign | f32_bits(v));
}

/* Round to nearest even, overflow to inf, nan stays nan (quiet); the
 * algorithm of Maratyszcza's FP16 library (also ggml's), which matches F16C. */
half_fp16 half_f32_to_fp16(float f)
{
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = ((f < 0 ? -f : f) * scale_to_inf) * scale_to_zero;
    uint32_t w = f32_bits(f);
    uint32_t shl1_w = w + w;
    uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u)
        bias = 0x71000000u;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    uint32_t mantissa_bits = bits & 0x00000FFFu;
    uint32_t nonsign = exp_bits + mantissa_bits;
    return (half_fp16)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

float half_bf16_to_f32(half_bf16 h)
{
    return f32_from_bits((uint32_t)h << 16);
}

half_bf16 half_f32_to_bf16(float f)
{
    uint32_t u = f32_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) /* nan: truncate, force quiet */
        return (half_bf16)((u >> 16) | 64);
    return (half_bf16)((u + (0x7FFFu + ((u >> 16) & 1))) >> 16);
}
