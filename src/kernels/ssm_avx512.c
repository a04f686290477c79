/* ssm_avx512.c - the Mamba-2 scan with AVX-512 (ssm.h): one 16-wide
 * accumulator per row, lane j the reference's acc[j].  Rows go four at a
 * time: each 16-value block of B and C is loaded once for the four, each
 * state block is loaded, updated, stored and multiplied into its row's
 * accumulator from the same register, and the four accumulators are
 * reduced together.  A block short of 16 (N % 16) is masked: its lanes
 * j < N % 16 are the reference's tail, the others keep their sums.
 * Bitwise equal to the reference: the same mul, the same two fmas per
 * element, the same tree (additions commute bitwise). */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/lanes16_avx512.h"

void ssm_scan_avx512(float *s, const float *x, const float *B, const float *C, float dA,
                     float dt, int32_t P, int32_t N, float *y);

/* One block of one row: s = fma(s, dA, b * xdt) stored, returns fma(s, c, acc). */
static inline __m512 block(float *s, __m512 b, __m512 c, __m512 vda, __m512 xdt, __m512 acc)
{
    const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(s), vda, _mm512_mul_ps(b, xdt));
    _mm512_storeu_ps(s, v);
    return _mm512_fmadd_ps(v, c, acc);
}

/* The same on the lanes of m only (b, c loaded with zeros elsewhere); the
 * other lanes of acc are returned as they were. */
static inline __m512 block_tail(float *s, __mmask16 m, __m512 b, __m512 c, __m512 vda,
                                __m512 xdt, __m512 acc)
{
    const __m512 v = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, s), vda, _mm512_mul_ps(b, xdt));
    _mm512_mask_storeu_ps(s, m, v);
    return _mm512_mask3_fmadd_ps(v, c, acc, m);
}


/* y of four rows into y[0..3], the same tree on all four at once.  The
 * 128-bit quarters are named by the lanes they hold: a row's quarters q0
 * (lanes 0-3) .. q3 (12-15). */
static inline void reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *y)
{
    /* j + j+8: [a.q0 a.q1 b.q0 b.q1] + [a.q2 a.q3 b.q2 b.q3] = r8 of a | r8 of b */
    const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44),
                                     _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44),
                                     _mm512_shuffle_f32x4(a2, a3, 0xEE));
    /* j + j+4: quarter k of u = r4 of row k */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88),
                                   _mm512_shuffle_f32x4(t01, t23, 0xDD));
    /* j + j+2, then 0 + 1, within each quarter: lane 4k holds y of row k */
    const __m512 v = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    const __m512 w = _mm512_add_ps(v, _mm512_permute_ps(v, 0xB1));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 g = _mm512_permutexvar_ps(idx, w);
    _mm_storeu_ps(y, _mm512_castps512_ps128(g));
}

/* Four rows p .. p+3 (state rows s, s + N, ...). */
static void rows4(float *s, const float *x, const float *B, const float *C, __m512 vda,
                  float dt, int32_t N, float *y)
{
    const __m512 x0 = _mm512_set1_ps(x[0] * dt), x1 = _mm512_set1_ps(x[1] * dt);
    const __m512 x2 = _mm512_set1_ps(x[2] * dt), x3 = _mm512_set1_ps(x[3] * dt);
    float *s0 = s, *s1 = s + N, *s2 = s + 2 * (int64_t)N, *s3 = s + 3 * (int64_t)N;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int32_t n = 0;
    for (; n + 16 <= N; n += 16) {
        const __m512 b = _mm512_loadu_ps(B + n), c = _mm512_loadu_ps(C + n);
        a0 = block(s0 + n, b, c, vda, x0, a0);
        a1 = block(s1 + n, b, c, vda, x1, a1);
        a2 = block(s2 + n, b, c, vda, x2, a2);
        a3 = block(s3 + n, b, c, vda, x3, a3);
    }
    if (n < N) {
        const __mmask16 m = (__mmask16)((1u << (N - n)) - 1);
        const __m512 b = _mm512_maskz_loadu_ps(m, B + n), c = _mm512_maskz_loadu_ps(m, C + n);
        a0 = block_tail(s0 + n, m, b, c, vda, x0, a0);
        a1 = block_tail(s1 + n, m, b, c, vda, x1, a1);
        a2 = block_tail(s2 + n, m, b, c, vda, x2, a2);
        a3 = block_tail(s3 + n, m, b, c, vda, x3, a3);
    }
    reduce4(a0, a1, a2, a3, y);
}

/* One row (the rows left over from the groups of four). */
static float row1(float *s, float xv, const float *B, const float *C, __m512 vda, float dt,
                  int32_t N)
{
    const __m512 xdt = _mm512_set1_ps(xv * dt);
    __m512 a = _mm512_setzero_ps();
    int32_t n = 0;
    for (; n + 16 <= N; n += 16)
        a = block(s + n, _mm512_loadu_ps(B + n), _mm512_loadu_ps(C + n), vda, xdt, a);
    if (n < N) {
        const __mmask16 m = (__mmask16)((1u << (N - n)) - 1);
        a = block_tail(s + n, m, _mm512_maskz_loadu_ps(m, B + n), _mm512_maskz_loadu_ps(m, C + n),
                       vda, xdt, a);
    }
    return lanes16_sum(a);
}

void ssm_scan_avx512(float *s, const float *x, const float *B, const float *C, float dA,
                     float dt, int32_t P, int32_t N, float *y)
{
    const __m512 vda = _mm512_set1_ps(dA);
    int32_t p = 0;
    for (; p + 4 <= P; p += 4)
        rows4(s + (int64_t)p * N, x + p, B, C, vda, dt, N, y + p);
    for (; p < P; p++)
        y[p] = row1(s + (int64_t)p * N, x[p], B, C, vda, dt, N);
}
