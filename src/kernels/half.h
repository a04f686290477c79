/* half.h - IEEE half (fp16) and bfloat16 bit patterns and their scalar
 * conversions to and from f32.
 *
 * The bottom of src/kernels/: every kernel file and the traits table use
 * it, and it uses nothing.  The SIMD files convert with F16C or shifts and
 * are bitwise equal to these (test_dtype checks every f16 value).
 * Pure functions, thread-safe.
 */
#ifndef KVANT_HALF_H
#define KVANT_HALF_H

#include <stdint.h>

typedef uint16_t half_fp16; /* IEEE half, bit pattern */
typedef uint16_t half_bf16; /* bfloat16, bit pattern */

/* Exact (every half is an f32); inf and nan keep their payload. */
float half_fp16_to_f32(half_fp16 h);
/* Round to nearest even, overflow to inf, nan stays nan (quiet); F16C's
 * rounding. */
half_fp16 half_f32_to_fp16(float f);
float half_bf16_to_f32(half_bf16 h);
half_bf16 half_f32_to_bf16(float f); /* round to nearest even */

#endif
