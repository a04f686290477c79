/* lanes16_avx512.h - the reduction of 16 partial sums that kernels/ssm.h and
 * kernels/gdn.h specify (lanes j + j+8, then j + j+4, j + j+2, 0 + 1), on
 * AVX-512: one zmm of partial sums to the float the scalar references give.
 * Header only; included by the *_avx512.c kernels alone (they are compiled
 * with the AVX-512 flags). */
#ifndef KVANT_LANES16_AVX512_H
#define KVANT_LANES16_AVX512_H

#include <immintrin.h>

static inline float lanes16_sum(__m512 acc)
{
    const __m256 r8 = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
    const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_movehdup_ps(r2)));
}

#endif
