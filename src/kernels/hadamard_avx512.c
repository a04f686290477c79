/* hadamard_avx512.c - Walsh-Hadamard rows with AVX-512 (hadamard.h):
 * stages h >= 16 on whole vectors, h = 1, 2, 4, 8 within each 16-value
 * vector by permutes and a masked blend; rows shorter than 16 take the
 * AVX2 rows.  Bitwise equal to the reference (same operations, no FMA). */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

void hadamard_rows_avx2(float *x, int64_t n_rows, int32_t d);
void hadamard_rows_avx512(float *x, int64_t n_rows, int32_t d);

/* lanes l (mask bit clear) get v + partner = a + b, lanes l ^ h (bit set)
 * partner - v = a - b */
static inline __m512 stage_in(__m512 v, __m512 partner, __mmask16 hi)
{
    return _mm512_mask_blend_ps(hi, _mm512_add_ps(v, partner), _mm512_sub_ps(partner, v));
}

void hadamard_rows_avx512(float *x, int64_t n_rows, int32_t d)
{
    if (d < 16) {
        hadamard_rows_avx2(x, n_rows, d);
        return;
    }
    const __m512 vnorm = _mm512_set1_ps(1.0f / sqrtf((float)d));
    for (int64_t r = 0; r < n_rows; r++, x += d) {
        for (int32_t i = 0; i < d; i += 16) {
            __m512 v = _mm512_loadu_ps(x + i);
            v = stage_in(v, _mm512_permute_ps(v, 0xB1), 0xAAAA);         /* pairs */
            v = stage_in(v, _mm512_permute_ps(v, 0x4E), 0xCCCC);         /* halves of 4 */
            v = stage_in(v, _mm512_shuffle_f32x4(v, v, 0xB1), 0xF0F0);   /* 128-bit pairs */
            v = stage_in(v, _mm512_shuffle_f32x4(v, v, 0x4E), 0xFF00);   /* 256-bit halves */
            _mm512_storeu_ps(x + i, v);
        }
        for (int32_t h = 16; h < d; h *= 2)
            for (int32_t i = 0; i < d; i += 2 * h)
                for (int32_t j = i; j < i + h; j += 16) {
                    __m512 a = _mm512_loadu_ps(x + j), b = _mm512_loadu_ps(x + j + h);
                    _mm512_storeu_ps(x + j, _mm512_add_ps(a, b));
                    _mm512_storeu_ps(x + j + h, _mm512_sub_ps(a, b));
                }
        for (int32_t j = 0; j < d; j += 16)
            _mm512_storeu_ps(x + j, _mm512_mul_ps(_mm512_loadu_ps(x + j), vnorm));
    }
}
