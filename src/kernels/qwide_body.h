/* qwide_body.h - kernels-internal: the packed q8_0 x qwide dot
 * (specification in qwide.h) as always-inline bodies, for the files that
 * compile it per ISA (qwide_avx2.c, qwide_avx512.c).  The includer
 * defines QW_MADD2_128(S, we, ae, wo, ao) (S plus the pairwise products
 * we*ae and wo*ao, summed into S's 32-bit lanes) and either QW_MADD2_256
 * likewise (AVX2: VPMADDWD, one sum a token) or QW_MADD_256(S, w, a) (S
 * plus w*a: AVX-512's accumulating VPDPWSSD, even and odd codes in two
 * sums a token, since one chain a token made the loop latency-bound:
 * 35.5 -> 44.2 GMAC/s on Zen 4, where AVX2 with two sums lost 8%).  Exact
 * integers, so every definition and order gives the same bits.  The
 * includer includes
 * qact_avx2_common.h and qwide.h first.
 *
 * A packed code vector holds four codes of each of eight chunks in its
 * 32-bit lanes (qpack.h); shifting each 16-bit lane left by 8 and back
 * (arithmetic) sign-extends its even bytes in place, shifting right by 8
 * its odd bytes.  The interleaved activations hold the matching codes, so
 * the pair products of a lane are one chunk's and vertical adds finish the
 * chunk sums (each lane <= 8 * 2 * 2 * 128 * 32767 < 2^31). */
#ifndef KVANT_QWIDE_BODY_H
#define KVANT_QWIDE_BODY_H

/* acc[k] += v_c for the chunks 8h .. 8h + nvl - 1 of group g (tc chunks
 * at wg) against the nt tokens' rows xv. */
AI void qw_half(const uint8_t *wg, int tc, int h, int nvl, pk_row row, const qwide_view *xv,
                int64_t g, int nt, __m256 acc[NTM])
{
    const uint8_t *qs = wg + 2 * (size_t)tc; /* after d[tc] */
    const int L = 4 * tc;
    __m256i S[NTM];
#ifndef QW_MADD2_256
    __m256i So[NTM];
#endif
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S[k] = _mm256_setzero_si256();
#ifndef QW_MADD2_256
        So[k] = S[k];
#endif
    }
#pragma GCC unroll 2
    for (int r = 0; r < 8; r++) {
        const __m256i wv = pk_load(qs + L * r + 32 * h, nvl, row);
        const __m256i we = _mm256_srai_epi16(_mm256_slli_epi16(wv, 8), 8);
        const __m256i wo = _mm256_srai_epi16(wv, 8);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            const int16_t *a = xv[k].cs + g * QACT_GROUP + 64 * r + 32 * h;
            const __m256i ae = _mm256_loadu_si256((const __m256i *)a);
            const __m256i ao = _mm256_loadu_si256((const __m256i *)(a + 16));
#ifdef QW_MADD2_256
            S[k] = QW_MADD2_256(S[k], we, ae, wo, ao);
#else
            S[k] = QW_MADD_256(S[k], we, ae);
            So[k] = QW_MADD_256(So[k], wo, ao);
#endif
        }
    }
#ifndef QW_MADD2_256
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_add_epi32(S[k], So[k]);
#endif
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
            S[k] = QW_MADD2_128(S[k], we, ae, wo, ao);
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

AI void qw_dot(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out,
               int pf)
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
            if (h == 0) /* near into L1 at most (pf; qact_prefetch_w's far L2
                           prefetch per group made the head of a one-token
                           step 1.36x slower: perf samples, default model, Zen 4) */
                qact_prefetch_w(wg, gb, pf, QACT2_PREFETCH);
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

/* Rows w + r rs (r < n_rows) against nt qwide rows: y[k ys + r], each
 * qw_dot's result. */
AI void qw_tile(uint32_t t, int64_t n, const void *w, size_t rs, int64_t n_rows, const void *xq,
                size_t xs, int nt, float *y, int64_t ys, int stream)
{
    /* a pass that reads rows with a short tail from DRAM (stream: the
     * default model's 576-value head at decode): each row whole 8 KiB ahead
     * into L2 and nothing into L1, as the rows kernels (qpack_*.c):
     * qact_bench --head q8_0 576 x 49152 (one token, one thread) 17.6-18.7
     * -> 21.9-23.7 GMAC/s on both ISAs; the per-group near prefetch stays
     * for the rest */
    const int block = stream && n % QACT_GROUP != 0;
    for (int64_t r = 0; r < n_rows; r++) {
        float o[NTM];
        if (block)
            qact_prefetch_l2((const uint8_t *)w + (size_t)r * rs, rs);
        qw_dot(t, n, (const uint8_t *)w + (size_t)r * rs, xq, xs, nt, o,
               block ? QACT_PF_NONE : QACT_PF_NEAR);
        for (int k = 0; k < nt; k++)
            y[k * ys + r] = o[k];
    }
}

/* Defines qwide_tile_q8_0_packed_<sfx> (qwide.h) from qw_dot, the token
 * count a constant in each; the tile walks its rows one at a time. */
#define QW_ENTRIES(sfx)                                                                         \
    QACT_TILE_ENTRY(qw_tile_entry, qw_tile, DT_Q8_0)                                            \
    void qwide_tile_q8_0_packed_##sfx(int64_t n, const void *w, size_t rs, int64_t n_rows,     \
                                      const void *xq, size_t xs, int nt, float *y, int64_t ys, \
                                      int stream)                                               \
    {                                                                                           \
        qw_tile_entry(n, w, rs, n_rows, xq, xs, nt, y, ys, stream);                             \
    }

#endif
