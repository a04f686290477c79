/* gdn_avx512.c - the Gated DeltaNet step with AVX-512 (gdn.h): one 16-wide
 * accumulator per row and pass, lane j the reference's acc[j].
 *
 * Rows go four at a time and the passes are pipelined: while pass 2 runs
 * on rows j..j+3 (their deltas known), pass 1 runs on rows j+4..j+7 in the
 * same loop over the key dims, so eight independent sums are in flight and
 * the wait for a group's delta (its pass-1 sums reduced) overlaps the next
 * group's work.  Pass 1 does not store the decayed row: pass 2 loads the
 * row again (from L1) and rounds M * decay again, the same bits, so M is
 * written once per token (half the stores) and pass 1's loads never meet
 * stores in flight four rows behind them (4 KiB behind at dk = 256: they
 * would alias, and the loads wait).  Each 16-value block of k and q is
 * loaded once per group.  A block short of 16 (dk % 16) is masked: its
 * lanes j < dk % 16 are the reference's tail, the others keep their sums.
 * Bitwise equal to the reference: the same mul and fmas per element, the
 * same tree (additions commute bitwise), delta and o by the same sub, mul. */
#include <immintrin.h>
#include <stdint.h>

#include "kernels/lanes16_avx512.h"

void gdn_step_avx512(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                     const float *v, float decay, float beta, float scale, float *delta,
                     float *o);

/* Pass 1 on one block of one row: returns fma(m * decay, k, acc). */
static inline __m512 decay_dot(const float *m, __m512 kk, __m512 vdec, __m512 acc)
{
    return _mm512_fmadd_ps(_mm512_mul_ps(_mm512_loadu_ps(m), vdec), kk, acc);
}

/* The same on the lanes of t only (kk loaded with zeros elsewhere); the
 * other lanes of acc are returned as they were. */
static inline __m512 decay_dot_tail(const float *m, __mmask16 t, __m512 kk, __m512 vdec,
                                    __m512 acc)
{
    return _mm512_mask3_fmadd_ps(_mm512_mul_ps(_mm512_maskz_loadu_ps(t, m), vdec), kk, acc, t);
}

/* Pass 2 on one block of one row: m = fma(d, k, m * decay) stored, returns
 * fma(m, q, acc). */
static inline __m512 update_dot(float *m, __m512 vdec, __m512 d, __m512 kk, __m512 qq,
                                __m512 acc)
{
    const __m512 x = _mm512_fmadd_ps(d, kk, _mm512_mul_ps(_mm512_loadu_ps(m), vdec));
    _mm512_storeu_ps(m, x);
    return _mm512_fmadd_ps(x, qq, acc);
}

static inline __m512 update_dot_tail(float *m, __mmask16 t, __m512 vdec, __m512 d, __m512 kk,
                                     __m512 qq, __m512 acc)
{
    const __m512 x = _mm512_fmadd_ps(d, kk, _mm512_mul_ps(_mm512_maskz_loadu_ps(t, m), vdec));
    _mm512_mask_storeu_ps(m, t, x);
    return _mm512_mask3_fmadd_ps(x, qq, acc, t);
}


/* The sums of four rows, lane r row r, the same tree on all four at once.
 * The 128-bit quarters are named by the lanes they hold: a row's quarters
 * q0 (lanes 0-3) .. q3 (12-15). */
static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3)
{
    /* j + j+8: [a.q0 a.q1 b.q0 b.q1] + [a.q2 a.q3 b.q2 b.q3] = r8 of a | r8 of b */
    const __m512 t01 = _mm512_add_ps(_mm512_shuffle_f32x4(a0, a1, 0x44),
                                     _mm512_shuffle_f32x4(a0, a1, 0xEE));
    const __m512 t23 = _mm512_add_ps(_mm512_shuffle_f32x4(a2, a3, 0x44),
                                     _mm512_shuffle_f32x4(a2, a3, 0xEE));
    /* j + j+4: quarter r of u = r4 of row r */
    const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t01, t23, 0x88),
                                   _mm512_shuffle_f32x4(t01, t23, 0xDD));
    /* j + j+2, then 0 + 1, within each quarter: lane 4r holds the sum of row r */
    const __m512 w2 = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));
    const __m512 w = _mm512_add_ps(w2, _mm512_permute_ps(w2, 0xB1));
    const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps128(_mm512_permutexvar_ps(idx, w));
}

/* Lane r of x in every lane. */
static inline __m512 lane(__m128 x, int r)
{
    return _mm512_permutexvar_ps(_mm512_set1_epi32(r), _mm512_castps128_ps512(x));
}

/* The mask of the lanes j < dk - i of the last block (dk - i in 1..15). */
static inline __mmask16 tail_mask(int32_t w)
{
    return (__mmask16)((1u << w) - 1);
}

/* Pass 1 of four rows (M, M + dk, ...): their sums, lane r row r. */
static __m128 pass1_4(const float *M, int32_t dk, const float *k, __m512 vdec)
{
    const float *m0 = M, *m1 = M + dk, *m2 = M + 2 * (int64_t)dk, *m3 = M + 3 * (int64_t)dk;
    __m512 b0 = _mm512_setzero_ps(), b1 = b0, b2 = b0, b3 = b0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        const __m512 kk = _mm512_loadu_ps(k + i);
        b0 = decay_dot(m0 + i, kk, vdec, b0);
        b1 = decay_dot(m1 + i, kk, vdec, b1);
        b2 = decay_dot(m2 + i, kk, vdec, b2);
        b3 = decay_dot(m3 + i, kk, vdec, b3);
    }
    if (i < dk) {
        const __mmask16 t = tail_mask(dk - i);
        const __m512 kk = _mm512_maskz_loadu_ps(t, k + i);
        b0 = decay_dot_tail(m0 + i, t, kk, vdec, b0);
        b1 = decay_dot_tail(m1 + i, t, kk, vdec, b1);
        b2 = decay_dot_tail(m2 + i, t, kk, vdec, b2);
        b3 = decay_dot_tail(m3 + i, t, kk, vdec, b3);
    }
    return reduce4(b0, b1, b2, b3);
}

/* Pass 2 of four rows (M, M + dk, ...), row r by lane r of d: their sums,
 * lane r row r.  The last group's; the others go with the next group's
 * pass 1 (pass2_pass1_4). */
static __m128 pass2_4(float *M, int32_t dk, const float *q, const float *k, __m128 d,
                      __m512 vdec)
{
    float *m0 = M, *m1 = M + dk, *m2 = M + 2 * (int64_t)dk, *m3 = M + 3 * (int64_t)dk;
    const __m512 d0 = lane(d, 0), d1 = lane(d, 1), d2 = lane(d, 2), d3 = lane(d, 3);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        const __m512 kk = _mm512_loadu_ps(k + i), qq = _mm512_loadu_ps(q + i);
        a0 = update_dot(m0 + i, vdec, d0, kk, qq, a0);
        a1 = update_dot(m1 + i, vdec, d1, kk, qq, a1);
        a2 = update_dot(m2 + i, vdec, d2, kk, qq, a2);
        a3 = update_dot(m3 + i, vdec, d3, kk, qq, a3);
    }
    if (i < dk) {
        const __mmask16 t = tail_mask(dk - i);
        const __m512 kk = _mm512_maskz_loadu_ps(t, k + i), qq = _mm512_maskz_loadu_ps(t, q + i);
        a0 = update_dot_tail(m0 + i, t, vdec, d0, kk, qq, a0);
        a1 = update_dot_tail(m1 + i, t, vdec, d1, kk, qq, a1);
        a2 = update_dot_tail(m2 + i, t, vdec, d2, kk, qq, a2);
        a3 = update_dot_tail(m3 + i, t, vdec, d3, kk, qq, a3);
    }
    return reduce4(a0, a1, a2, a3);
}

/* Pass 2 of the four rows at A (row r by lane r of d) and pass 1 of the
 * four at B, in one loop: A's sums in *sa, B's in *sb (lane r row r). */
static inline void pass2_pass1_4(float *A, const float *B, int32_t dk, const float *q,
                                 const float *k, __m128 d, __m512 vdec, __m128 *sa, __m128 *sb)
{
    float *m0 = A, *m1 = A + dk, *m2 = A + 2 * (int64_t)dk, *m3 = A + 3 * (int64_t)dk;
    const float *n0 = B, *n1 = B + dk, *n2 = B + 2 * (int64_t)dk, *n3 = B + 3 * (int64_t)dk;
    const __m512 d0 = lane(d, 0), d1 = lane(d, 1), d2 = lane(d, 2), d3 = lane(d, 3);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        const __m512 kk = _mm512_loadu_ps(k + i), qq = _mm512_loadu_ps(q + i);
        b0 = decay_dot(n0 + i, kk, vdec, b0);
        a0 = update_dot(m0 + i, vdec, d0, kk, qq, a0);
        b1 = decay_dot(n1 + i, kk, vdec, b1);
        a1 = update_dot(m1 + i, vdec, d1, kk, qq, a1);
        b2 = decay_dot(n2 + i, kk, vdec, b2);
        a2 = update_dot(m2 + i, vdec, d2, kk, qq, a2);
        b3 = decay_dot(n3 + i, kk, vdec, b3);
        a3 = update_dot(m3 + i, vdec, d3, kk, qq, a3);
    }
    if (i < dk) {
        const __mmask16 t = tail_mask(dk - i);
        const __m512 kk = _mm512_maskz_loadu_ps(t, k + i), qq = _mm512_maskz_loadu_ps(t, q + i);
        b0 = decay_dot_tail(n0 + i, t, kk, vdec, b0);
        a0 = update_dot_tail(m0 + i, t, vdec, d0, kk, qq, a0);
        b1 = decay_dot_tail(n1 + i, t, kk, vdec, b1);
        a1 = update_dot_tail(m1 + i, t, vdec, d1, kk, qq, a1);
        b2 = decay_dot_tail(n2 + i, t, kk, vdec, b2);
        a2 = update_dot_tail(m2 + i, t, vdec, d2, kk, qq, a2);
        b3 = decay_dot_tail(n3 + i, t, kk, vdec, b3);
        a3 = update_dot_tail(m3 + i, t, vdec, d3, kk, qq, a3);
    }
    *sa = reduce4(a0, a1, a2, a3);
    *sb = reduce4(b0, b1, b2, b3);
}

/* Both passes of one row (the rows left over from the groups of four). */
static void row1(float *m, int32_t dk, const float *q, const float *k, float vj, __m512 vdec,
                 float beta, float scale, float *delta, float *o)
{
    const int32_t nb = dk & ~15;
    const __mmask16 t = tail_mask(dk - nb);
    __m512 a = _mm512_setzero_ps();
    for (int32_t i = 0; i < nb; i += 16)
        a = decay_dot(m + i, _mm512_loadu_ps(k + i), vdec, a);
    if (nb < dk)
        a = decay_dot_tail(m + nb, t, _mm512_maskz_loadu_ps(t, k + nb), vdec, a);
    const float dj = (vj - lanes16_sum(a)) * beta;
    const __m512 d = _mm512_set1_ps(dj);
    *delta = dj;
    a = _mm512_setzero_ps();
    for (int32_t i = 0; i < nb; i += 16)
        a = update_dot(m + i, vdec, d, _mm512_loadu_ps(k + i), _mm512_loadu_ps(q + i), a);
    if (nb < dk)
        a = update_dot_tail(m + nb, t, vdec, d, _mm512_maskz_loadu_ps(t, k + nb),
                            _mm512_maskz_loadu_ps(t, q + nb), a);
    *o = lanes16_sum(a) * scale;
}

void gdn_step_avx512(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                     const float *v, float decay, float beta, float scale, float *delta,
                     float *o)
{
    const __m512 vdec = _mm512_set1_ps(decay);
    const __m128 vbeta = _mm_set1_ps(beta), vscale = _mm_set1_ps(scale);
    const int32_t g = dv & ~3; /* rows in groups of four */
    __m128 s1 = g ? pass1_4(M, dk, k, vdec) : _mm_setzero_ps(); /* the next group's sums */
    for (int32_t j = 0; j < g; j += 4) {
        float *m = M + (int64_t)j * dk;
        const __m128 d = _mm_mul_ps(_mm_sub_ps(_mm_loadu_ps(v + j), s1), vbeta);
        _mm_storeu_ps(delta + j, d);
        __m128 s2;
        if (j + 4 < g)
            pass2_pass1_4(m, m + 4 * (int64_t)dk, dk, q, k, d, vdec, &s2, &s1);
        else
            s2 = pass2_4(m, dk, q, k, d, vdec);
        _mm_storeu_ps(o + j, _mm_mul_ps(s2, vscale));
    }
    for (int32_t j = g; j < dv; j++)
        row1(M + (int64_t)j * dk, dk, q, k, v[j], vdec, beta, scale, delta + j, o + j);
}
