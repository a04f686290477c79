/* gdn_avx2.c - the Gated DeltaNet step with AVX2 (gdn.h): two 8-wide
 * accumulators per row and pass, lo = the reference's acc[0..7] and hi =
 * acc[8..15].
 *
 * Rows go two at a time and the passes are pipelined: while pass 2 runs on
 * rows j, j+1 (their deltas known), pass 1 runs on rows j+2, j+3 in the
 * same loop over the key dims, so eight independent sums are in flight
 * (all sixteen registers busy: two rows, not four) and the wait for a
 * pair's delta overlaps the next pair's work; one reduction serves both
 * (lanes 0, 1 pass 2's rows, 2, 3 pass 1's).  Pass 1 does not store the
 * decayed row: pass 2 loads the row again (from L1) and rounds M * decay
 * again, the same bits, so M is written once per token (half the stores)
 * and pass 1's loads never meet stores in flight two rows behind them (4
 * KiB behind at dk = 512).  A block short of 16 (dk % 16) is
 * masked: its lanes j < dk % 16 are the reference's tail, the others keep
 * their sums (blended back).  Bitwise equal to the reference: the same mul
 * and fmas per element, the same tree (additions commute bitwise), delta
 * and o by the same sub, mul. */
#include <immintrin.h>
#include <stdint.h>

void gdn_step_avx2(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                   const float *v, float decay, float beta, float scale, float *delta, float *o);

/* The two accumulators of one row, or one 16-value block of k or q. */
typedef struct v16 {
    __m256 lo, hi;
} v16;

static inline v16 load16(const float *p)
{
    v16 r = {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)};
    return r;
}

/* The masks of the lanes j < t of a block (t = dk % 16, 1..15). */
typedef struct tail_mask {
    __m256i lo, hi;
} tail_mask;

static inline tail_mask tail_masks(int32_t t)
{
    const __m256i vt = _mm256_set1_epi32(t);
    tail_mask m = {_mm256_cmpgt_epi32(vt, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)),
                   _mm256_cmpgt_epi32(vt, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15))};
    return m;
}

/* Zeros outside the mask. */
static inline v16 load16_tail(const float *p, tail_mask t)
{
    v16 r = {_mm256_maskload_ps(p, t.lo), _mm256_maskload_ps(p + 8, t.hi)};
    return r;
}

/* Pass 1 on 8 values of one row: returns fma(m * decay, k, acc). */
static inline __m256 decay8(const float *m, __m256 kk, __m256 vdec, __m256 acc)
{
    return _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(m), vdec), kk, acc);
}

/* Pass 2 on 8 values of one row: m = fma(d, k, m * decay) stored, returns
 * fma(m, q, acc). */
static inline __m256 update8(float *m, __m256 vdec, __m256 d, __m256 kk, __m256 qq, __m256 acc)
{
    const __m256 x = _mm256_fmadd_ps(d, kk, _mm256_mul_ps(_mm256_loadu_ps(m), vdec));
    _mm256_storeu_ps(m, x);
    return _mm256_fmadd_ps(x, qq, acc);
}

static inline v16 decay_dot(const float *m, v16 kk, __m256 vdec, v16 a)
{
    a.lo = decay8(m, kk.lo, vdec, a.lo);
    a.hi = decay8(m + 8, kk.hi, vdec, a.hi);
    return a;
}

static inline v16 update_dot(float *m, __m256 vdec, __m256 d, v16 kk, v16 qq, v16 a)
{
    a.lo = update8(m, vdec, d, kk.lo, qq.lo, a.lo);
    a.hi = update8(m + 8, vdec, d, kk.hi, qq.hi, a.hi);
    return a;
}

/* fma(x, y, acc) on the lanes of mask, acc elsewhere. */
static inline __m256 fma_masked(__m256 x, __m256 y, __m256 acc, __m256i mask)
{
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(x, y, acc), _mm256_castsi256_ps(mask));
}

/* The same on the lanes of t only (kk, qq loaded with zeros elsewhere); the
 * other lanes of the accumulators are returned as they were. */
static inline v16 decay_dot_tail(const float *m, tail_mask t, v16 kk, __m256 vdec, v16 a)
{
    const __m256 lo = _mm256_mul_ps(_mm256_maskload_ps(m, t.lo), vdec);
    const __m256 hi = _mm256_mul_ps(_mm256_maskload_ps(m + 8, t.hi), vdec);
    a.lo = fma_masked(lo, kk.lo, a.lo, t.lo);
    a.hi = fma_masked(hi, kk.hi, a.hi, t.hi);
    return a;
}

static inline v16 update_dot_tail(float *m, tail_mask t, __m256 vdec, __m256 d, v16 kk, v16 qq,
                                  v16 a)
{
    const __m256 lo =
        _mm256_fmadd_ps(d, kk.lo, _mm256_mul_ps(_mm256_maskload_ps(m, t.lo), vdec));
    const __m256 hi =
        _mm256_fmadd_ps(d, kk.hi, _mm256_mul_ps(_mm256_maskload_ps(m + 8, t.hi), vdec));
    _mm256_maskstore_ps(m, t.lo, lo);
    _mm256_maskstore_ps(m + 8, t.hi, hi);
    a.lo = fma_masked(lo, qq.lo, a.lo, t.lo);
    a.hi = fma_masked(hi, qq.hi, a.hi, t.hi);
    return a;
}

/* The sum of one row: lanes j + j+8 (lo + hi), then j + j+4, j + j+2, 0 + 1. */
static inline float reduce1(v16 a)
{
    const __m256 r8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_movehdup_ps(r2)));
}

/* The sums of four rows, lane r row r, the same tree on all four at once. */
static inline __m128 reduce4(v16 a0, v16 a1, v16 a2, v16 a3)
{
    /* j + j+8 */
    const __m256 r0 = _mm256_add_ps(a0.lo, a0.hi), r1 = _mm256_add_ps(a1.lo, a1.hi);
    const __m256 r2 = _mm256_add_ps(a2.lo, a2.hi), r3 = _mm256_add_ps(a3.lo, a3.hi);
    /* j + j+4: [r4 of row 0 | r4 of row 1], [r4 of row 2 | r4 of row 3] */
    const __m256 u01 = _mm256_add_ps(_mm256_permute2f128_ps(r0, r1, 0x20),
                                     _mm256_permute2f128_ps(r0, r1, 0x31));
    const __m256 u23 = _mm256_add_ps(_mm256_permute2f128_ps(r2, r3, 0x20),
                                     _mm256_permute2f128_ps(r2, r3, 0x31));
    /* j + j+2: [r2 of row 0, r2 of row 2 | r2 of row 1, r2 of row 3] */
    const __m256 w2 = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x44),
                                    _mm256_shuffle_ps(u01, u23, 0xEE));
    /* 0 + 1: [s0, s2, s0, s2 | s1, s3, s1, s3] */
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(w2, w2, 0x88),
                                   _mm256_shuffle_ps(w2, w2, 0xDD));
    return _mm_unpacklo_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1));
}

/* Pass 1 of two rows (B, B + dk): their sums in lanes 0, 1. */
static __m128 pass1_2(const float *B, int32_t dk, const float *k, __m256 vdec)
{
    const float *n0 = B, *n1 = B + dk;
    const __m256 z = _mm256_setzero_ps();
    v16 b0 = {z, z}, b1 = b0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        const v16 kk = load16(k + i);
        b0 = decay_dot(n0 + i, kk, vdec, b0);
        b1 = decay_dot(n1 + i, kk, vdec, b1);
    }
    if (i < dk) {
        const tail_mask t = tail_masks(dk - i);
        const v16 kk = load16_tail(k + i, t);
        b0 = decay_dot_tail(n0 + i, t, kk, vdec, b0);
        b1 = decay_dot_tail(n1 + i, t, kk, vdec, b1);
    }
    return reduce4(b0, b1, b0, b1);
}

/* Pass 2 of two rows (M, M + dk, by d0, d1): their sums in lanes 0, 1.  The
 * last pair's; the others go with the next pair's pass 1 (pass2_pass1_2). */
static __m128 pass2_2(float *M, int32_t dk, const float *q, const float *k, __m256 d0,
                      __m256 d1, __m256 vdec)
{
    float *m0 = M, *m1 = M + dk;
    const __m256 z = _mm256_setzero_ps();
    v16 a0 = {z, z}, a1 = a0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        const v16 kk = load16(k + i), qq = load16(q + i);
        a0 = update_dot(m0 + i, vdec, d0, kk, qq, a0);
        a1 = update_dot(m1 + i, vdec, d1, kk, qq, a1);
    }
    if (i < dk) {
        const tail_mask t = tail_masks(dk - i);
        const v16 kk = load16_tail(k + i, t), qq = load16_tail(q + i, t);
        a0 = update_dot_tail(m0 + i, t, vdec, d0, kk, qq, a0);
        a1 = update_dot_tail(m1 + i, t, vdec, d1, kk, qq, a1);
    }
    return reduce4(a0, a1, a0, a1);
}

/* Pass 2 of the two rows at A (by d0, d1) and pass 1 of the two at B, in
 * one loop, lo halves then hi halves (k and q one half at a time: the
 * registers hold no more).  Returns A's sums in lanes 0, 1 and B's in
 * lanes 2, 3. */
static inline __m128 pass2_pass1_2(float *A, const float *B, int32_t dk, const float *q,
                                   const float *k, __m256 d0, __m256 d1, __m256 vdec)
{
    float *m0 = A, *m1 = A + dk;
    const float *n0 = B, *n1 = B + dk;
    const __m256 z = _mm256_setzero_ps();
    v16 a0 = {z, z}, a1 = a0, b0 = a0, b1 = a0;
    int32_t i = 0;
    for (; i + 16 <= dk; i += 16) {
        __m256 kk = _mm256_loadu_ps(k + i), qq = _mm256_loadu_ps(q + i);
        b0.lo = decay8(n0 + i, kk, vdec, b0.lo);
        a0.lo = update8(m0 + i, vdec, d0, kk, qq, a0.lo);
        b1.lo = decay8(n1 + i, kk, vdec, b1.lo);
        a1.lo = update8(m1 + i, vdec, d1, kk, qq, a1.lo);
        kk = _mm256_loadu_ps(k + i + 8), qq = _mm256_loadu_ps(q + i + 8);
        b0.hi = decay8(n0 + i + 8, kk, vdec, b0.hi);
        a0.hi = update8(m0 + i + 8, vdec, d0, kk, qq, a0.hi);
        b1.hi = decay8(n1 + i + 8, kk, vdec, b1.hi);
        a1.hi = update8(m1 + i + 8, vdec, d1, kk, qq, a1.hi);
    }
    if (i < dk) {
        const tail_mask t = tail_masks(dk - i);
        const v16 kk = load16_tail(k + i, t), qq = load16_tail(q + i, t);
        b0 = decay_dot_tail(n0 + i, t, kk, vdec, b0);
        a0 = update_dot_tail(m0 + i, t, vdec, d0, kk, qq, a0);
        b1 = decay_dot_tail(n1 + i, t, kk, vdec, b1);
        a1 = update_dot_tail(m1 + i, t, vdec, d1, kk, qq, a1);
    }
    return reduce4(a0, a1, b0, b1);
}

/* Both passes of one row (the row left over from the pairs). */
static void row1(float *m, int32_t dk, const float *q, const float *k, float vj, __m256 vdec,
                 float beta, float scale, float *delta, float *o)
{
    const int32_t nb = dk & ~15;
    const tail_mask t = tail_masks(dk - nb);
    const __m256 z = _mm256_setzero_ps();
    v16 a = {z, z};
    for (int32_t i = 0; i < nb; i += 16)
        a = decay_dot(m + i, load16(k + i), vdec, a);
    if (nb < dk)
        a = decay_dot_tail(m + nb, t, load16_tail(k + nb, t), vdec, a);
    const float dj = (vj - reduce1(a)) * beta;
    const __m256 d = _mm256_set1_ps(dj);
    *delta = dj;
    a.lo = a.hi = z;
    for (int32_t i = 0; i < nb; i += 16)
        a = update_dot(m + i, vdec, d, load16(k + i), load16(q + i), a);
    if (nb < dk)
        a = update_dot_tail(m + nb, t, vdec, d, load16_tail(k + nb, t), load16_tail(q + nb, t),
                            a);
    *o = reduce1(a) * scale;
}

/* Two floats at p into lanes 0, 1 (any alignment), and back. */
static inline __m128 load2(const float *p)
{
    return _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)p));
}

static inline void store2(float *p, __m128 x)
{
    _mm_storel_epi64((__m128i *)p, _mm_castps_si128(x));
}

void gdn_step_avx2(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                   const float *v, float decay, float beta, float scale, float *delta, float *o)
{
    const __m256 vdec = _mm256_set1_ps(decay);
    const __m128 vbeta = _mm_set1_ps(beta), vscale = _mm_set1_ps(scale);
    const int32_t g = dv & ~1; /* rows in pairs */
    __m128 s1 = g ? pass1_2(M, dk, k, vdec) : _mm_setzero_ps(); /* the next pair's sums */
    for (int32_t j = 0; j < g; j += 2) {
        float *m = M + (int64_t)j * dk;
        const __m128 d = _mm_mul_ps(_mm_sub_ps(load2(v + j), s1), vbeta);
        store2(delta + j, d);
        const __m256 d0 = _mm256_broadcastss_ps(d), d1 = _mm256_broadcastss_ps(_mm_movehdup_ps(d));
        __m128 s;
        if (j + 2 < g) {
            s = pass2_pass1_2(m, m + 2 * (int64_t)dk, dk, q, k, d0, d1, vdec);
            s1 = _mm_movehl_ps(s, s);
        } else
            s = pass2_2(m, dk, q, k, d0, d1, vdec);
        store2(o + j, _mm_mul_ps(s, vscale));
    }
    if (g < dv)
        row1(M + (int64_t)g * dk, dk, q, k, v[g], vdec, beta, scale, delta + g, o + g);
}
