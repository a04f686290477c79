/* qwide_avx2.c - AVX2 dot of packed q8_0 rows against interleaved qwide
 * (int16) rows, bitwise equal to qwide_dot_q8_0_ref (specification in
 * qwide.h).  Built with -mavx2 -mfma -mf16c, under -std=c11 (no FMA
 * contraction: the reference's order).
 *
 * A packed code vector holds four codes of each of eight chunks in its
 * 32-bit lanes (qpack.h); shifting each 16-bit lane left by 8 and back
 * (arithmetic) sign-extends its even bytes in place, shifting right by 8
 * its odd bytes.  The interleaved activations hold the matching codes, so
 * VPMADDWD leaves each chunk's products in its own lane and vertical adds
 * finish the chunk sums (each lane <= 8 * 2 * 2 * 128 * 32767 < 2^31). */
#include <immintrin.h>

#include "kernels/qact_avx2_common.h"
#include "kernels/qwide.h"

/* acc[k] += v_c for the chunks 8h .. 8h + nvl - 1 of group g (tc chunks
 * at wg) against the nt tokens' rows xv. */
AI void qw_half(const uint8_t *wg, int tc, int h, int nvl, pk_row row, const qwide_view *xv,
                int64_t g, int nt, __m256 acc[NTM])
{
    const uint8_t *qs = wg + 2 * (size_t)tc; /* after d[tc] */
    const int L = 4 * tc;
    __m256i S[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int r = 0; r < 8; r++) {
        const __m256i wv = pk_load(qs + L * r + 32 * h, nvl, row);
        const __m256i we = _mm256_srai_epi16(_mm256_slli_epi16(wv, 8), 8);
        const __m256i wo = _mm256_srai_epi16(wv, 8);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            const int16_t *a = xv[k].cs + g * QACT_GROUP + 64 * r + 32 * h;
            const __m256i pe = _mm256_madd_epi16(we, _mm256_loadu_si256((const __m256i *)a));
            const __m256i po = _mm256_madd_epi16(wo, _mm256_loadu_si256((const __m256i *)(a + 16)));
            S[k] = _mm256_add_epi32(S[k], _mm256_add_epi32(pe, po));
        }
    }
    __m256 A = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wg + 16 * h)));
    if (nvl < 8) /* the lanes past the group read its codes: scaled by +0 */
        A = _mm256_and_ps(A, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                 _mm256_set1_epi32(nvl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))));
    const int64_t c0 = g * QACT_LANES + 8 * h;
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m256 da = _mm256_loadu_ps(xv[k].d + c0);
        acc[k] = _mm256_add_ps(acc[k], _mm256_mul_ps(_mm256_mul_ps(A, da), _mm256_cvtepi32_ps(S[k])));
    }
}

/* qw_half for nvl <= 4 chunks (a short group's last) in 128-bit vectors:
 * the same sums and scaling.  Two chunks (rows of 576 = 512 + 64 values,
 * SmolLM2's width) take two slots a vector: slot r's 8 code bytes and
 * slot r + 1's, lanes 0-1 and 2-3, folded at the end. */
AI void qw_quarter(const uint8_t *wg, int tc, int h, int nvl, pk_row row, const qwide_view *xv,
                   int64_t g, int nt, __m256 acc[NTM])
{
    const uint8_t *qs = wg + 2 * (size_t)tc;
    const int L = 4 * tc, pair = nvl == 2 && tc == 2;
    __m128i S[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm_setzero_si128();
#pragma GCC unroll 8
    for (int r = 0; r < 8; r += 1 + pair) {
        const __m128i wv = pk_load_tail(qs + L * r + 32 * h, row);
        const __m128i we = _mm_srai_epi16(_mm_slli_epi16(wv, 8), 8), wo = _mm_srai_epi16(wv, 8);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            const int16_t *a = xv[k].cs + g * QACT_GROUP + 64 * r + 32 * h;
            const __m128i ae = pair ? pk_load2x8((const int8_t *)a, (const int8_t *)(a + 64))
                                    : _mm_loadu_si128((const __m128i *)a);
            const __m128i ao = pair ? pk_load2x8((const int8_t *)(a + 16), (const int8_t *)(a + 80))
                                    : _mm_loadu_si128((const __m128i *)(a + 16));
            S[k] = _mm_add_epi32(S[k], _mm_add_epi32(_mm_madd_epi16(we, ae), _mm_madd_epi16(wo, ao)));
        }
    }
    if (pair) /* lanes 2, 3: slots r + 1 of chunks 0, 1 */
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm_move_epi64(_mm_add_epi32(S[k], _mm_unpackhi_epi64(S[k], S[k])));
    const __m128 A = _mm_and_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(wg + 16 * h))),
                                _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(nvl),
                                                                 _mm_setr_epi32(0, 1, 2, 3))));
    const int64_t c0 = g * QACT_LANES + 8 * h;
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m128 v = _mm_mul_ps(_mm_mul_ps(A, _mm_loadu_ps(xv[k].d + c0)), _mm_cvtepi32_ps(S[k]));
        acc[k] = _mm256_insertf128_ps(acc[k], _mm_add_ps(_mm256_castps256_ps128(acc[k]), v), 0);
    }
}

AI void qw_dot(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    (void)t;
    const uint8_t *wb = w;
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = QACT_LANES * sizeof(block_q8_0);
    const pk_row row = {wb, wb + nc * sizeof(block_q8_0)};
    qwide_view xv[NTM];
    __m256 acc[NTM][2];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        xv[k] = qwide_view_of((const uint8_t *)xq + (size_t)k * xs, n);
        acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    }
    const int tc = (int)(nc % QACT_LANES);
#pragma GCC unroll 1
    for (int h = 0; h < 2; h++) { /* the row once per half: nt accumulators live, not 2 nt */
        __m256 a[NTM];
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            a[k] = _mm256_setzero_ps();
        for (int64_t g = 0; g < full; g++) {
            const uint8_t *wg = wb + g * gb;
            if (h == 0)
                for (size_t o = 0; o < gb; o += 64)
                    _mm_prefetch((const char *)wg + QACT2_PREFETCH + o, _MM_HINT_T0);
            qw_half(wg, QACT_LANES, h, 8, row, xv, g, nt, a);
        }
        const int nvl = tc - 8 * h < 8 ? tc - 8 * h : 8;
        if (nvl > 0 && nvl <= 4 && row.end - row.begin >= 16)
            qw_quarter(wb + full * gb, tc, h, nvl, row, xv, full, nt, a);
        else if (nvl > 0)
            qw_half(wb + full * gb, tc, h, nvl, row, xv, full, nt, a);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            acc[k][h] = a[k];
    }
    acc_end(acc, nt, out);
}

QACT_NT_ENTRY(qw_dot_entry, qw_dot, DT_Q8_0)

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

void qwide_dot_q8_0_packed_avx2(int64_t n, const void *w, const void *xq, size_t xs, int nt,
                                float *out)
{
    qw_dot_entry(n, w, xq, xs, nt, out);
}
