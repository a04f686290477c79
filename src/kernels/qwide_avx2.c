/* qwide_avx2.c - AVX2 dot of packed q8_0 rows against interleaved qwide
 * (int16) rows, bitwise equal to qwide_dot_q8_0_ref (specification in
 * qwide.h).  Built with -mavx2 -mfma -mf16c, under -std=c11 (no FMA
 * contraction: the reference's order).
 *
 * The packed kernel's body is qwide_body.h, here with VPMADDWD and adds. */
#include <immintrin.h>

#include "kernels/qact_avx2_common.h"
#include "kernels/qwide.h"

#define QW_MADD2_256(S, we, ae, wo, ao)                                                         \
    _mm256_add_epi32((S), _mm256_add_epi32(_mm256_madd_epi16((we), (ae)), _mm256_madd_epi16((wo), (ao))))
#define QW_MADD2_128(S, we, ae, wo, ao)                                                         \
    _mm_add_epi32((S), _mm_add_epi32(_mm_madd_epi16((we), (ae)), _mm_madd_epi16((wo), (ao))))
#include "kernels/qwide_body.h"

QW_ENTRIES(avx2)

/* ---- stored q8_0 rows (the file's layout: --no-pack) against in-order
 * qwide rows, a token at a time: each chunk's 32 products in eight lanes,
 * eight chunks' lanes summed by one tree of VPHADDD. */

/* The eight int32 lanes of chunk c's products: sign-extended codes times
 * the token's codes. */
AI __m256i qs_chunk(const block_q8_0 *b, const int16_t *a)
{
    const __m256i q = _mm256_loadu_si256((const __m256i *)b->qs);
    const __m256i lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(q));
    const __m256i hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256(q, 1));
    return _mm256_add_epi32(_mm256_madd_epi16(lo, _mm256_loadu_si256((const __m256i *)a)),
                            _mm256_madd_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 16))));
}

/* The exact sums of chunks c .. c + 7 (lanes 0..7). */
AI __m256i qs_sums8(const block_q8_0 *b, const int16_t *a)
{
    __m256i h[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        h[i] = _mm256_hadd_epi32(qs_chunk(b + 2 * i, a + 64 * i), qs_chunk(b + 2 * i + 1, a + 64 * i + 32));
    const __m256i q0 = _mm256_hadd_epi32(h[0], h[1]), q1 = _mm256_hadd_epi32(h[2], h[3]);
    return _mm256_add_epi32(_mm256_permute2x128_si256(q0, q1, 0x20),
                            _mm256_permute2x128_si256(q0, q1, 0x31));
}

static float qs_dot1(int64_t n, const block_q8_0 *b, qwide_view v)
{
    const int64_t nc = n / QACT_CHUNK;
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t c = 0;
    for (; c + 8 <= nc; c += 8) {
        const __m128i d16 = _mm_setr_epi16((short)b[c].d, (short)b[c + 1].d, (short)b[c + 2].d,
                                           (short)b[c + 3].d, (short)b[c + 4].d, (short)b[c + 5].d,
                                           (short)b[c + 6].d, (short)b[c + 7].d);
        const __m256 v8 = _mm256_mul_ps(_mm256_mul_ps(_mm256_cvtph_ps(d16), _mm256_loadu_ps(v.d + c)),
                                        _mm256_cvtepi32_ps(qs_sums8(b + c, v.cs + c * QACT_CHUNK)));
        acc[c / 8 % 2] = _mm256_add_ps(acc[c / 8 % 2], v8);
    }
    float l[QACT_LANES];
    _mm256_storeu_ps(l, acc[0]);
    _mm256_storeu_ps(l + 8, acc[1]);
    for (; c < nc; c++) { /* the last chunks: the reference's arithmetic */
        int32_t raw = 0;
        for (int i = 0; i < QACT_CHUNK; i++)
            raw += (int32_t)b[c].qs[i] * v.cs[c * QACT_CHUNK + i];
        l[c % QACT_LANES] += (h2f(b[c].d) * v.d[c]) * (float)raw;
    }
    return qact_reduce16(l);
}

void qwide_dot_q8_0_avx2(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    for (int k = 0; k < nt; k++)
        out[k] = qs_dot1(n, w, qwide_view_of((const uint8_t *)xq + (size_t)k * xs, n));
}
