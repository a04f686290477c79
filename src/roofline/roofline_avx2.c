/* roofline_avx2.c - AVX2 kernels for the roofline probes: a streaming
 * 64-bit sum (read bandwidth), 12 independent FMA chains, and 12
 * independent int8 dot chains of VPMADDUBSW + VPMADDWD + VPADDD (the
 * sequence the AVX2 int8-activation kernels use per 32 weights).
 * Scalar twin of the read kernel: roofline_read_sum_ref in roofline.c
 * (bitwise equal: integer sums).  The compute probes compute nothing
 * meaningful; they are only timed. */
#include <immintrin.h>

#include "roofline/roofline_kernels.h"

uint64_t roofline_read_sum_avx2(const uint64_t *p, size_t n)
{
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_loadu_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_loadu_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_loadu_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_loadu_si256((const __m256i *)(p + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lane[4], s = 0;
    _mm256_storeu_si256((__m256i *)lane, a0);
    for (int k = 0; k < 4; k++)
        s += lane[k];
    return s;
}

float roofline_fma_avx2(int64_t iters)
{
    __m256 acc[12];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++)
        acc[k] = _mm256_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++)
            acc[k] = _mm256_fmadd_ps(acc[k], a, b);
    __m256 s = acc[0];
    for (int k = 1; k < 12; k++)
        s = _mm256_add_ps(s, acc[k]);
    float lane[8], t = 0;
    _mm256_storeu_ps(lane, s);
    for (int k = 0; k < 8; k++)
        t += lane[k];
    return t;
}

int32_t roofline_int8_avx2(int64_t iters)
{
    __m256i acc[12];
    const __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int k = 0; k < 12; k++)
        acc[k] = _mm256_set1_epi32(k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++)
            acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
    __m256i s = acc[0];
    for (int k = 1; k < 12; k++)
        s = _mm256_add_epi32(s, acc[k]);
    uint32_t lane[8], t = 0;
    _mm256_storeu_si256((__m256i *)lane, s);
    for (int k = 0; k < 8; k++)
        t += lane[k];
    return (int32_t)t;
}
