/* roofline_avx512.c - AVX-512 kernels for the roofline probes: a streaming
 * 64-bit sum (read bandwidth), 12 independent FMA chains and 12 independent
 * vpdpbusd chains (enough to cover a 4-cycle latency on two ports).
 * Scalar twin of the read kernel: roofline_read_sum_ref in roofline.c
 * (bitwise equal: integer sums).  The FMA/VNNI probes compute nothing
 * meaningful; they are only timed. */
#include <immintrin.h>

#include "roofline/roofline_kernels.h"

uint64_t roofline_read_sum_avx512(const uint64_t *p, size_t n)
{
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 32) {
        a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
        a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 8));
        a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 16));
        a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 24));
    }
    a0 = _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3));
    uint64_t lane[8], s = 0; /* not _mm512_reduce_add_epi64: its signed adds overflow (UB) */
    _mm512_storeu_si512(lane, a0);
    for (int k = 0; k < 8; k++)
        s += lane[k];
    return s;
}

float roofline_fma_avx512(int64_t iters)
{
    __m512 acc[12];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++)
        acc[k] = _mm512_set1_ps((float)k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++)
            acc[k] = _mm512_fmadd_ps(acc[k], a, b);
    __m512 s = acc[0];
    for (int k = 1; k < 12; k++)
        s = _mm512_add_ps(s, acc[k]);
    return _mm512_reduce_add_ps(s);
}

int32_t roofline_vnni_avx512(int64_t iters)
{
    __m512i acc[12];
    const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
    for (int k = 0; k < 12; k++)
        acc[k] = _mm512_set1_epi32(k);
    for (int64_t i = 0; i < iters; i++)
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++)
            acc[k] = _mm512_dpbusd_epi32(acc[k], a, b);
    __m512i s = acc[0];
    for (int k = 1; k < 12; k++)
        s = _mm512_add_epi32(s, acc[k]);
    uint32_t lane[16], t = 0; /* wrapping sum (the header's reduce adds signed: UB) */
    _mm512_storeu_si512(lane, s);
    for (int k = 0; k < 16; k++)
        t += lane[k];
    return (int32_t)t;
}
