/* ssm_avx2.c - the Mamba-2 scan with AVX2 (ssm.h): two 8-wide
 * accumulators per row, lo = the reference's acc[0..7] and hi =
 * acc[8..15].  Rows go four at a time: each 16-value block of B and C is
 * read once for the four, each state block is loaded, updated, stored and
 * multiplied into its row's accumulators from the same registers, and the
 * four rows are reduced together.  A block short of 16 (N % 16) is
 * masked: its lanes j < N % 16 are the reference's tail, the others keep
 * their sums (blended back).  Bitwise equal to the reference: the same
 * mul, the same two fmas per element, the same tree (additions commute
 * bitwise). */
#include <immintrin.h>
#include <stdint.h>

void ssm_scan_avx2(float *s, const float *x, const float *B, const float *C, float dA, float dt,
                   int32_t P, int32_t N, float *y);

/* The two accumulators of one row. */
typedef struct acc16 {
    __m256 lo, hi;
} acc16;

/* One 8-value half block of one row: s = fma(s, dA, b * xdt) stored,
 * returns fma(s, c, acc). */
static inline __m256 half(float *s, __m256 b, __m256 c, __m256 vda, __m256 xdt, __m256 acc)
{
    const __m256 v = _mm256_fmadd_ps(_mm256_loadu_ps(s), vda, _mm256_mul_ps(b, xdt));
    _mm256_storeu_ps(s, v);
    return _mm256_fmadd_ps(v, c, acc);
}

static inline acc16 block(float *s, const float *B, const float *C, __m256 vda, __m256 xdt,
                          acc16 a)
{
    a.lo = half(s, _mm256_loadu_ps(B), _mm256_loadu_ps(C), vda, xdt, a.lo);
    a.hi = half(s + 8, _mm256_loadu_ps(B + 8), _mm256_loadu_ps(C + 8), vda, xdt, a.hi);
    return a;
}

/* The same on the lanes of m only (b, c loaded with zeros elsewhere); the
 * other lanes of acc are returned as they were. */
static inline __m256 half_tail(float *s, __m256i m, __m256 b, __m256 c, __m256 vda, __m256 xdt,
                               __m256 acc)
{
    const __m256 v = _mm256_fmadd_ps(_mm256_maskload_ps(s, m), vda, _mm256_mul_ps(b, xdt));
    _mm256_maskstore_ps(s, m, v);
    return _mm256_blendv_ps(acc, _mm256_fmadd_ps(v, c, acc), _mm256_castsi256_ps(m));
}

/* The masks of the lanes j < t of a block (t = N % 16, 1..15). */
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

static inline acc16 block_tail(float *s, const float *B, const float *C, tail_mask m, __m256 vda,
                               __m256 xdt, acc16 a)
{
    a.lo = half_tail(s, m.lo, _mm256_maskload_ps(B, m.lo), _mm256_maskload_ps(C, m.lo), vda, xdt,
                     a.lo);
    a.hi = half_tail(s + 8, m.hi, _mm256_maskload_ps(B + 8, m.hi),
                     _mm256_maskload_ps(C + 8, m.hi), vda, xdt, a.hi);
    return a;
}

/* y of one row: lanes j + j+8 (lo + hi), then j + j+4, j + j+2, 0 + 1. */
static inline float reduce1(acc16 a)
{
    const __m256 r8 = _mm256_add_ps(a.lo, a.hi);
    const __m128 r4 = _mm_add_ps(_mm256_castps256_ps128(r8), _mm256_extractf128_ps(r8, 1));
    const __m128 r2 = _mm_add_ps(r4, _mm_movehl_ps(r4, r4));
    return _mm_cvtss_f32(_mm_add_ss(r2, _mm_movehdup_ps(r2)));
}

/* y of four rows into y[0..3], the same tree on all four at once. */
static inline void reduce4(acc16 a0, acc16 a1, acc16 a2, acc16 a3, float *y)
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
    const __m256 v = _mm256_add_ps(_mm256_shuffle_ps(u01, u23, 0x44),
                                   _mm256_shuffle_ps(u01, u23, 0xEE));
    /* 0 + 1: [y0, y2, y0, y2 | y1, y3, y1, y3] */
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(v, v, 0x88), _mm256_shuffle_ps(v, v, 0xDD));
    _mm_storeu_ps(y, _mm_unpacklo_ps(_mm256_castps256_ps128(w), _mm256_extractf128_ps(w, 1)));
}

/* Four rows p .. p+3 (state rows s, s + N, ...). */
static void rows4(float *s, const float *x, const float *B, const float *C, __m256 vda,
                  float dt, int32_t N, float *y)
{
    const __m256 x0 = _mm256_set1_ps(x[0] * dt), x1 = _mm256_set1_ps(x[1] * dt);
    const __m256 x2 = _mm256_set1_ps(x[2] * dt), x3 = _mm256_set1_ps(x[3] * dt);
    float *s0 = s, *s1 = s + N, *s2 = s + 2 * (int64_t)N, *s3 = s + 3 * (int64_t)N;
    const __m256 z = _mm256_setzero_ps();
    acc16 a0 = {z, z}, a1 = a0, a2 = a0, a3 = a0;
    int32_t n = 0;
    for (; n + 16 <= N; n += 16) {
        a0 = block(s0 + n, B + n, C + n, vda, x0, a0);
        a1 = block(s1 + n, B + n, C + n, vda, x1, a1);
        a2 = block(s2 + n, B + n, C + n, vda, x2, a2);
        a3 = block(s3 + n, B + n, C + n, vda, x3, a3);
    }
    if (n < N) {
        const tail_mask m = tail_masks(N - n);
        a0 = block_tail(s0 + n, B + n, C + n, m, vda, x0, a0);
        a1 = block_tail(s1 + n, B + n, C + n, m, vda, x1, a1);
        a2 = block_tail(s2 + n, B + n, C + n, m, vda, x2, a2);
        a3 = block_tail(s3 + n, B + n, C + n, m, vda, x3, a3);
    }
    reduce4(a0, a1, a2, a3, y);
}

/* One row (the rows left over from the groups of four). */
static float row1(float *s, float xv, const float *B, const float *C, __m256 vda, float dt,
                  int32_t N)
{
    const __m256 xdt = _mm256_set1_ps(xv * dt);
    acc16 a = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int32_t n = 0;
    for (; n + 16 <= N; n += 16)
        a = block(s + n, B + n, C + n, vda, xdt, a);
    if (n < N)
        a = block_tail(s + n, B + n, C + n, tail_masks(N - n), vda, xdt, a);
    return reduce1(a);
}

void ssm_scan_avx2(float *s, const float *x, const float *B, const float *C, float dA, float dt,
                   int32_t P, int32_t N, float *y)
{
    const __m256 vda = _mm256_set1_ps(dA);
    int32_t p = 0;
    for (; p + 4 <= P; p += 4)
        rows4(s + (int64_t)p * N, x + p, B, C, vda, dt, N, y + p);
    for (; p < P; p++)
        y[p] = row1(s + (int64_t)p * N, x[p], B, C, vda, dt, N);
}
