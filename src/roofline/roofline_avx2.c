/* roofline_avx2.c - AVX2 kernels for the roofline probes: a streaming
 * 64-bit sum (read bandwidth), 12 independent FMA chains, and 6
 * independent int8 chains of VPMADDUBSW + VPADDW (32 u8 x s8 products
 * summed in int16 pairs, the inner step of the packed 4-bit kernels: the
 * most int8 products an AVX2 core multiplies a second).  Its operands are
 * made opaque each round so the compiler cannot hoist the multiplies out
 * of the loop (it did, until 2026-12-06: the probe then timed VPADDD).
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
    __m256i a = _mm256_set1_epi8(3);
    __m256i w0 = _mm256_set1_epi8(-3), w1 = _mm256_set1_epi8(-2), w2 = _mm256_set1_epi8(-1);
    __m256i w3 = _mm256_set1_epi8(1), w4 = _mm256_set1_epi8(2), w5 = _mm256_set1_epi8(3);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0;
    for (int64_t i = 0; i < iters; i++) {
        /* opaque operands: the multiplies stay in the loop, one per chain */
        __asm__ volatile("" : "+x"(a), "+x"(w0), "+x"(w1), "+x"(w2), "+x"(w3), "+x"(w4), "+x"(w5));
        s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(a, w0));
        s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(a, w1));
        s2 = _mm256_add_epi16(s2, _mm256_maddubs_epi16(a, w2));
        s3 = _mm256_add_epi16(s3, _mm256_maddubs_epi16(a, w3));
        s4 = _mm256_add_epi16(s4, _mm256_maddubs_epi16(a, w4));
        s5 = _mm256_add_epi16(s5, _mm256_maddubs_epi16(a, w5));
    }
    const __m256i s = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(s0, s1), s2),
                                       _mm256_add_epi16(_mm256_add_epi16(s3, s4), s5));
    uint32_t lane[8], t = 0;
    _mm256_storeu_si256((__m256i *)lane, s);
    for (int k = 0; k < 8; k++)
        t += lane[k];
    return (int32_t)t;
}
