/* hadamard_avx2.c - Walsh-Hadamard rows with AVX2 (hadamard.h): stages
 * h >= 8 on whole vectors, h = 1, 2, 4 within each 8-value vector by
 * permutes and a sign blend; the same adds and subtracts as the reference,
 * in the same order (no FMA), so the result is bitwise equal. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

void hadamard_rows_avx2(float *x, int64_t n_rows, int32_t d);

/* One in-vector stage: lanes i and i ^ h (h = 1, 2, 4): low lane a + b,
 * high lane a - b, where a is the low lane's value and b the high's. */
static inline __m256 stage_in(__m256 v, __m256 partner, __m256 hi_mask)
{
    __m256 sum = _mm256_add_ps(v, partner);      /* low lane: a + b */
    __m256 dif = _mm256_sub_ps(partner, v);      /* high lane: a - b (partner is a) */
    return _mm256_blendv_ps(sum, dif, hi_mask);
}

/* Rows shorter than a vector: the reference's stages (hadamard.c, not
 * called from here: the ISA files depend on nothing of the module that
 * chooses them). */
static void row_small(float *x, int32_t d, float norm)
{
    for (int32_t h = 1; h < d; h *= 2)
        for (int32_t i = 0; i < d; i += 2 * h)
            for (int32_t j = i; j < i + h; j++) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
    for (int32_t j = 0; j < d; j++)
        x[j] *= norm;
}

void hadamard_rows_avx2(float *x, int64_t n_rows, int32_t d)
{
    const float norm = 1.0f / sqrtf((float)d);
    const __m256 vnorm = _mm256_set1_ps(norm);
    const __m256 m1 = _mm256_castsi256_ps(_mm256_setr_epi32(0, -1, 0, -1, 0, -1, 0, -1));
    const __m256 m2 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, -1, -1, 0, 0, -1, -1));
    const __m256 m4 = _mm256_castsi256_ps(_mm256_setr_epi32(0, 0, 0, 0, -1, -1, -1, -1));
    for (int64_t r = 0; r < n_rows; r++, x += d) {
        if (d < 8) {
            row_small(x, d, norm);
            continue;
        }
        for (int32_t i = 0; i < d; i += 8) {
            __m256 v = _mm256_loadu_ps(x + i);
            v = stage_in(v, _mm256_permute_ps(v, 0xB1), m1);           /* swap pairs */
            v = stage_in(v, _mm256_permute_ps(v, 0x4E), m2);           /* swap halves of 4 */
            v = stage_in(v, _mm256_permute2f128_ps(v, v, 0x01), m4);   /* swap 128-bit lanes */
            _mm256_storeu_ps(x + i, v);
        }
        for (int32_t h = 8; h < d; h *= 2)
            for (int32_t i = 0; i < d; i += 2 * h)
                for (int32_t j = i; j < i + h; j += 8) {
                    __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
                    _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
                    _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
                }
        for (int32_t j = 0; j < d; j += 8)
            _mm256_storeu_ps(x + j, _mm256_mul_ps(_mm256_loadu_ps(x + j), vnorm));
    }
}
