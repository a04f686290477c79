/* qpack_avx512.c - AVX-512 VNNI dot kernels over packed weight rows
 * (kernels/qpack.h), bitwise equal to qact_ref.c (specification in qact.h).
 *
 * Built with the AVX-512 flags; reached through the table matmul.c fills
 * when the chosen ISA is AVX-512 (packed_dot, packed_dot_rows,
 * packed_tile).  Shares its helpers with qact_avx512.c
 * (qact_avx512_common.h).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/qact.h"
#include "kernels/qact_avx512_common.h"
#include "kernels/qpack.h"

/* ---- one packed row ----
 * Every 4-byte lane of a packed code vector belongs to one chunk, so
 * VPDPBUSD leaves chunk c's sum in lane c directly: eight of them per
 * group and token (two accumulators to halve the dependency chain), no
 * combine steps.  q8_0 feeds w + 128 (xor 0x80) as in group_raw.  A short
 * last group (tc < 16 chunks) is read with masked loads: lanes past it
 * score 0 * 0 and add +0 to an accumulator that is never -0 (the
 * reference skips them: same sum). */

/* 64 bytes at p, the first 4 tc of them (tc == 16: a plain load). */
AI __m512i pk_load(const uint8_t *p, int tc)
{
    if (tc == QACT_LANES)
        return _mm512_loadu_si512(p);
    return _mm512_maskz_loadu_epi8((__mmask64)((1ull << (4 * tc)) - 1), p);
}

/* tc f16 values at p as 16 floats (zero past tc). */
AI __m512 pk_halfs(const uint8_t *p, int tc)
{
    if (tc == QACT_LANES)
        return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << tc) - 1), p));
}

/* q5_*, q6_K code vectors i (low and high nibbles) with their extra bits
 * from x (qpack.c): q5: the qh' lanes; q6_K: plane i/2. */
AI void pk_wide_codes(uint32_t t, __m512i v, __m512i x, int i, __m512i *lo, __m512i *hi)
{
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(v, lo4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
    if (t == DT_Q6_K) {
        const __m512i b45 = _mm512_set1_epi8(0x30);
        const __m512i lb = i & 1 ? _mm512_slli_epi16(x, 4) : x;
        const __m512i hb = i & 1 ? _mm512_slli_epi16(x, 2) : _mm512_srli_epi16(x, 2);
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(lb, b45));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(hb, b45));
        return;
    }
    const __m512i b4 = _mm512_set1_epi8(0x10);
    *lo = _mm512_or_si512(*lo, _mm512_and_si512(_mm512_slli_epi16(x, 4 - i), b4));
    *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_srli_epi16(x, i), b4));
}

/* Code vector pair i (0..3) of a group as unsigned bytes: lo against the
 * activation bytes at 128 i, hi against those at 128 i + 64 (4-bit types:
 * the low and high nibbles of vector i; q8_0: vectors 2i and 2i + 1, + 128).
 * q5: the group's qh' lanes (q5_*), loaded once by the caller; pin: keep
 * each code vector in a register (below). */
AI void pk_codes(uint32_t t, const uint8_t *qs, const uint8_t *qx, __m512i q5, int tc, int i,
                 int pin, __m512i *lo, __m512i *hi)
{
    const int L = 4 * tc;
    if (t == DT_Q8_0) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
        *lo = _mm512_xor_si512(pk_load(qs + L * 2 * i, tc), bias);
        *hi = _mm512_xor_si512(pk_load(qs + L * (2 * i + 1), tc), bias);
        return;
    }
    __m512i v = pk_load(qs + L * i, tc);
    if (pin) /* the two-row tile: one load for the mask and the shift, not two folded
              * (2048 x 2048 q4_0: 112.6 -> 124 GMAC/s); the one-row path folds them
              * (pinned, a one-token decode of the 1.1B Q4_0 ran 0.83x) */
        __asm__("" : "+v"(v));
    if (t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q5_K || t == DT_Q6_K) {
        pk_wide_codes(t, v, t == DT_Q6_K ? pk_load(qx + L * (i / 2), tc) : q5, i, lo, hi);
        return;
    }
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    *lo = _mm512_and_si512(v, lo4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
    if (t == DT_MXFP4) {
        *lo = mx_codes(*lo);
        *hi = mx_codes(*hi);
    }
}

AI __m512i pk_q5(uint32_t t, const uint8_t *qx, int tc)
{
    return t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q5_K ? pk_load(qx, tc) : _mm512_setzero_si512();
}

/* S0[k], S1[k] lane c: chunk c's sums for token k; q6_K: S0 over values
 * 0-15 (vectors 0-1), S1 over 16-31, for the half scales. */
AI void pk_sums(uint32_t t, const uint8_t *qs, const uint8_t *qx, int tc,
                const int8_t *const ag[NTM], int nt, __m512i S0[NTM], __m512i S1[NTM])
{
    const __m512i q5 = pk_q5(t, qx, tc);
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        __m512i lo, hi;
        pk_codes(t, qs, qx, q5, tc, i, 0, &lo, &hi);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            const __m512i a0 = _mm512_loadu_si512(ag[k] + 128 * i);
            const __m512i a1 = _mm512_loadu_si512(ag[k] + 128 * i + 64);
            if (t == DT_Q6_K && i >= 2) {
                S1[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S1[k], lo, a0), hi, a1);
            } else if (t == DT_Q6_K) {
                S0[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S0[k], lo, a0), hi, a1);
            } else {
                S0[k] = _mm512_dpbusd_epi32(S0[k], lo, a0);
                S1[k] = _mm512_dpbusd_epi32(S1[k], hi, a1);
            }
        }
    }
}

/* A group's weight scales: A, B per chunk lane; K types the super-block
 * scales (one super-block when tc == 8: lanes 8-15 score zero sums with
 * its finite scales). */
typedef struct pk_scales {
    __m512 A, B;
    __m512i sc, mn;       /* q4_K, q5_K */
    __m512i e6, sc0, sc1; /* q6_K: the 32 int8 scales as int16; per lane s0, s1 */
} pk_scales;

AI pk_scales pk_k_scales(uint32_t t, const uint8_t *wg, int tc)
{
    pk_scales r;
    r.sc = r.mn = r.e6 = r.sc0 = r.sc1 = _mm512_setzero_si512();
    if (t == DT_Q6_K) {
        half_fp16 d[2];
        memcpy(&d[0], wg, 2);
        memcpy(&d[1], wg + (tc > 8 ? 2 : 0), 2);
        r.A = _mm512_insertf32x8(_mm512_set1_ps(h2f(d[0])), _mm256_set1_ps(h2f(d[1])), 1);
        r.B = _mm512_setzero_ps();
        const uint8_t *sp = wg + 2 * (tc / 8);
        const __m256i sb = tc > 8 ? _mm256_loadu_si256((const __m256i *)sp)
                                  : _mm256_maskz_loadu_epi8(0xFFFF, sp);
        r.e6 = _mm512_cvtepi8_epi16(sb);
        r.sc0 = _mm512_srai_epi32(_mm512_slli_epi32(r.e6, 16), 16);
        r.sc1 = _mm512_srai_epi32(r.e6, 16);
        return r;
    }
    const uint8_t *h0 = wg, *h1 = wg + (tc > 8 ? 16 : 0); /* q4_K, q5_K heads */
    uint32_t u0[4], u1[4];
    half_fp16 d[4];
    qact_k4_scales(h0 + 4, u0);
    qact_k4_scales(h1 + 4, u1);
    memcpy(&d[0], h0, 4);
    memcpy(&d[2], h1, 4);
    r.sc = _mm512_cvtepu8_epi32(_mm_setr_epi32((int)u0[0], (int)u0[1], (int)u1[0], (int)u1[1]));
    r.mn = _mm512_cvtepu8_epi32(_mm_setr_epi32((int)u0[2], (int)u0[3], (int)u1[2], (int)u1[3]));
    float fd[4]; /* d0, dmin0, d1, dmin1: F16C converts exactly */
    _mm_storeu_ps(fd, _mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)d)));
    r.A = _mm512_insertf32x8(_mm512_set1_ps(fd[0]), _mm256_set1_ps(fd[2]), 1);
    r.B = _mm512_insertf32x8(_mm512_set1_ps(-fd[1]), _mm256_set1_ps(-fd[3]), 1);
    return r;
}

AI pk_scales pk_group_scales(uint32_t t, const uint8_t *wg, int tc)
{
    if (t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K)
        return pk_k_scales(t, wg, tc);
    pk_scales ks;
    ks.sc = ks.mn = ks.e6 = ks.sc0 = ks.sc1 = _mm512_setzero_si512();
    if (t == DT_MXFP4) { /* e[tc] */
        const __m128i e = tc == QACT_LANES ? _mm_loadu_si128((const __m128i *)wg)
                                           : _mm_maskz_loadu_epi8((__mmask16)((1u << tc) - 1), wg);
        ks.A = mx_scales(_mm512_cvtepu8_epi32(e));
        ks.B = _mm512_setzero_ps();
        return ks;
    }
    ks.A = pk_halfs(wg, tc);
    ks.B = t == DT_Q4_1 || t == DT_Q5_1 ? pk_halfs(wg + 2 * tc, tc) : _mm512_setzero_ps();
    return ks;
}

/* acc + one token's v for the group: its sums S0, S1, its chunk sums asum,
 * scales da and (q6_K) half sums at s16, in the reference's order. */
AI __m512 pk_finish(uint32_t t, const pk_scales *ks, __m512i S0, __m512i S1, __m512i asum,
                    __m512 da, const int16_t *s16, __m512 acc)
{
    __m512i I = _mm512_add_epi32(S0, S1);
    if (t == DT_Q4_K || t == DT_Q5_K) {
        I = _mm512_mullo_epi32(ks->sc, I);
        const __m512i J = _mm512_mullo_epi32(ks->mn, asum);
        return _mm512_add_ps(
            acc, _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(ks->A, da), _mm512_cvtepi32_ps(I)),
                               _mm512_mul_ps(_mm512_mul_ps(ks->B, da), _mm512_cvtepi32_ps(J))));
    }
    if (t == DT_Q4_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 3));
    else if (t == DT_Q5_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 4));
    else if (t == DT_Q8_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 7));
    else if (t == DT_MXFP4)
        I = _mm512_sub_epi32(I, _mm512_mullo_epi32(asum, _mm512_set1_epi32(12)));
    else if (t == DT_Q6_K)
        I = _mm512_sub_epi32(
            _mm512_add_epi32(_mm512_mullo_epi32(ks->sc0, S0), _mm512_mullo_epi32(ks->sc1, S1)),
            _mm512_slli_epi32(_mm512_madd_epi16(_mm512_loadu_si512(s16), ks->e6), 5));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(ks->A, da), _mm512_cvtepi32_ps(I));
    /* q4_0, q5_0, q8_0, q6_K, mxfp4: the reference's second term is +0, and
     * adding +0 to v and then to acc (never -0) changes nothing */
    if (t == DT_Q4_1 || t == DT_Q5_1)
        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(ks->B, da), _mm512_cvtepi32_ps(asum)));
    return _mm512_add_ps(acc, v);
}

AI void pk_group(uint32_t t, const uint8_t *wg, int tc, const qact_view *xv, int64_t g, int nt,
                 __m512 acc[NTM])
{
    __m512i S0[NTM], S1[NTM];
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S0[k] = S1[k] = _mm512_setzero_si512();
        ag[k] = xv[k].qs + g * QACT_GROUP;
    }
    pk_sums(t, wg + qpack_qs_off(t, tc), wg + qpack_qx_off(t, tc), tc, ag, nt, S0, S1);
    const pk_scales ks = pk_group_scales(t, wg, tc);
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        acc[k] = pk_finish(t, &ks, S0[k], S1[k], _mm512_loadu_si512(xv[k].s32 + g * QACT_LANES),
                           _mm512_loadu_ps(xv[k].d + g * QACT_LANES),
                           xv[k].s16 + 2 * g * QACT_LANES, acc[k]);
}

/* ---- a short last group of q4_0, q4_1 and q8_0 in 128-bit vectors ----
 * A row of 576 values is a group and two chunks: pk_group's masked 512-bit
 * pass costs a whole group for those two.  tc <= 4 chunks fit one 128-bit
 * lane set: the same code bytes (4 tc per vector row, masked loads), the
 * first 16 bytes of each 64-byte activation row (chunk c's four bytes at
 * lane c, as pk_group reads them), and the same epilogue per lane in the
 * same order; lanes 4-15 of acc get +0 (pk_group's lanes past tc add
 * (0 * da) * I, a zero too; acc is never -0).  Integer sums are exact, so
 * one accumulator gives pk_group's S0 + S1. */
AI int pk_tail4_fits(uint32_t t, int tc)
{
    return tc <= 4 && (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0);
}

AI __m128i pk_load4(const uint8_t *p, int tc)
{
    return _mm_maskz_loadu_epi8((__mmask16)((1u << (4 * tc)) - 1), p);
}

AI void pk_tail4(uint32_t t, const uint8_t *wg, int tc, const qact_view *xv, int64_t g, int nt,
                 __m512 acc[NTM])
{
    const uint8_t *qs = wg + qpack_qs_off(t, tc);
    const int L = 4 * tc;
    __m128i S[NTM];
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S[k] = _mm_setzero_si128();
        ag[k] = xv[k].qs + g * QACT_GROUP;
    }
    if (t == DT_Q8_0) {
        const __m128i bias = _mm_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m128i u = _mm_xor_si128(pk_load4(qs + L * r, tc), bias);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++)
                S[k] = _mm_dpbusd_epi32(S[k], u,
                                        _mm_loadu_si128((const __m128i *)(ag[k] + 64 * r)));
        }
    } else {
        const __m128i lo4 = _mm_set1_epi8(0x0F);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m128i v = pk_load4(qs + L * i, tc);
            const __m128i lo = _mm_and_si128(v, lo4);
            const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                const __m128i a0 = _mm_loadu_si128((const __m128i *)(ag[k] + 128 * i));
                const __m128i a1 = _mm_loadu_si128((const __m128i *)(ag[k] + 128 * i + 64));
                S[k] = _mm_dpbusd_epi32(_mm_dpbusd_epi32(S[k], lo, a0), hi, a1);
            }
        }
    }
    const __mmask8 hm = (__mmask8)((1u << tc) - 1);
    const __m128 A = _mm_cvtph_ps(_mm_maskz_loadu_epi16(hm, wg));
    const __m128 B = t == DT_Q4_1 ? _mm_cvtph_ps(_mm_maskz_loadu_epi16(hm, wg + 2 * tc))
                                  : _mm_setzero_ps();
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m128i asum = _mm_loadu_si128((const __m128i *)(xv[k].s32 + g * QACT_LANES));
        const __m128 da = _mm_loadu_ps(xv[k].d + g * QACT_LANES);
        __m128i I = S[k];
        if (t == DT_Q4_0)
            I = _mm_sub_epi32(I, _mm_slli_epi32(asum, 3));
        else if (t == DT_Q8_0)
            I = _mm_sub_epi32(I, _mm_slli_epi32(asum, 7));
        __m128 v = _mm_mul_ps(_mm_mul_ps(A, da), _mm_cvtepi32_ps(I));
        if (t == DT_Q4_1)
            v = _mm_add_ps(v, _mm_mul_ps(_mm_mul_ps(B, da), _mm_cvtepi32_ps(asum)));
        acc[k] = _mm512_add_ps(acc[k], _mm512_zextps128_ps512(v));
    }
}

/* ---- two packed rows at once ----
 * pk_group for rows w0 and w1 with every activation load serving both
 * rows: 2 rows x nt tokens of integer sums (one accumulator each, q6_K two
 * for its half scales: the sums are exact, so pk_group's S0 + S1 in any
 * order), then per token the activation sums and scales loaded once and
 * pk_finish per row.  Full groups only. */
AI void pk_group2(uint32_t t, const uint8_t *w0, const uint8_t *w1, const qact_view *xv,
                  int64_t g, int nt, __m512 acc0[NTM], __m512 acc1[NTM])
{
    const int tc = QACT_LANES;
    const uint8_t *qs0 = w0 + qpack_qs_off(t, tc), *qs1 = w1 + qpack_qs_off(t, tc);
    const uint8_t *qx0 = w0 + qpack_qx_off(t, tc), *qx1 = w1 + qpack_qx_off(t, tc);
    const __m512i q50 = pk_q5(t, qx0, tc), q51 = pk_q5(t, qx1, tc);
    __m512i S0[NTM], S1[NTM], T0[NTM], T1[NTM]; /* rows 0 and 1; T: q6_K's second half */
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S0[k] = S1[k] = T0[k] = T1[k] = _mm512_setzero_si512();
        ag[k] = xv[k].qs + g * QACT_GROUP;
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i lo0, hi0, lo1, hi1;
        pk_codes(t, qs0, qx0, q50, tc, i, 1, &lo0, &hi0);
        pk_codes(t, qs1, qx1, q51, tc, i, 1, &lo1, &hi1);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            __m512i a0 = _mm512_loadu_si512(ag[k] + 128 * i);
            __m512i a1 = _mm512_loadu_si512(ag[k] + 128 * i + 64);
            __asm__("" : "+v"(a0), "+v"(a1)); /* one load for both rows, not two folded */
            if (t == DT_Q6_K && i >= 2) {
                T0[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(T0[k], lo0, a0), hi0, a1);
                T1[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(T1[k], lo1, a0), hi1, a1);
            } else {
                S0[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S0[k], lo0, a0), hi0, a1);
                S1[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S1[k], lo1, a0), hi1, a1);
            }
        }
    }
    const pk_scales ks0 = pk_group_scales(t, w0, tc), ks1 = pk_group_scales(t, w1, tc);
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m512i asum = _mm512_loadu_si512(xv[k].s32 + g * QACT_LANES);
        const __m512 da = _mm512_loadu_ps(xv[k].d + g * QACT_LANES);
        const int16_t *s16 = xv[k].s16 + 2 * g * QACT_LANES;
        acc0[k] = pk_finish(t, &ks0, S0[k], T0[k], asum, da, s16, acc0[k]);
        acc1[k] = pk_finish(t, &ks1, S1[k], T1[k], asum, da, s16, acc1[k]);
    }
}

/* acc[k] += the full groups' v of packed row w for the nt tokens xv; pf:
 * what each group prefetches ahead (a QACT_PF_ level, qact_prefetch_w). */
AI void pk_row_groups(uint32_t t, int64_t n, const void *w, const qact_view *xv, int nt,
                      __m512 acc[NTM], int pf)
{
    const int64_t full = n / QACT_CHUNK / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    for (int64_t g = 0; g < full; g++) {
        qact_prefetch_w((const uint8_t *)w + g * gb, gb, pf, QACT_PREFETCH);
        pk_group(t, (const uint8_t *)w + g * gb, QACT_LANES, xv, g, nt, acc);
    }
}

/* acc[k] (zeroed by the caller) += every group's v of packed row w for the
 * nt tokens xv (pf as pk_row_groups). */
AI void pk_row_acc(uint32_t t, int64_t n, const void *w, const qact_view *xv, int nt,
                   __m512 acc[NTM], int pf)
{
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    pk_row_groups(t, n, w, xv, nt, acc, pf);
    const int tc = (int)(nc % QACT_LANES);
    if (tc && pk_tail4_fits(t, tc))
        pk_tail4(t, (const uint8_t *)w + full * gb, tc, xv, full, nt, acc);
    else if (tc)
        pk_group(t, (const uint8_t *)w + full * gb, tc, xv, full, nt, acc);
}

AI void pk_dot_type(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt,
                    float *out)
{
    qact_view xv[NTM];
    __m512 acc[NTM];
    acc_begin(xq, xs, n, nt, xv, acc);
    pk_row_acc(t, n, w, xv, nt, acc, qact_pf_level(nt == 1));
    acc_end(acc, nt, out);
}

/* pk_tail4 for rows w0 and w1 at once: row 0's codes in the low 128 bits,
 * row 1's in the high, every token's activation row in both halves; the
 * same sums and per-lane epilogue, the halves added to acc0 and acc1. */
AI __m256i pk_load4x2(const uint8_t *p0, const uint8_t *p1, int tc)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(pk_load4(p0, tc)), pk_load4(p1, tc), 1);
}

AI __m256 pk_halfs4x2(const uint8_t *p0, const uint8_t *p1, int tc)
{
    const __mmask8 hm = (__mmask8)((1u << tc) - 1);
    return _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_maskz_loadu_epi16(hm, p0),
                                              _mm_maskz_loadu_epi16(hm, p1)));
}

AI void pk_tail4x2(uint32_t t, const uint8_t *w0, const uint8_t *w1, int tc, const qact_view *xv,
                   int64_t g, int nt, __m512 acc0[NTM], __m512 acc1[NTM])
{
    const uint8_t *q0 = w0 + qpack_qs_off(t, tc), *q1 = w1 + qpack_qs_off(t, tc);
    const int L = 4 * tc;
    __m256i S[NTM];
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S[k] = _mm256_setzero_si256();
        ag[k] = xv[k].qs + g * QACT_GROUP;
    }
    if (t == DT_Q8_0) {
        const __m256i bias = _mm256_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m256i u = _mm256_xor_si256(pk_load4x2(q0 + L * r, q1 + L * r, tc), bias);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++)
                S[k] = _mm256_dpbusd_epi32(
                    S[k], u, _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(ag[k] + 64 * r))));
        }
    } else {
        const __m256i lo4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m256i v = pk_load4x2(q0 + L * i, q1 + L * i, tc);
            const __m256i lo = _mm256_and_si256(v, lo4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                const __m256i a0 = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(ag[k] + 128 * i)));
                const __m256i a1 = _mm256_broadcastsi128_si256(
                    _mm_loadu_si128((const __m128i *)(ag[k] + 128 * i + 64)));
                S[k] = _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(S[k], lo, a0), hi, a1);
            }
        }
    }
    const __m256 A = pk_halfs4x2(w0, w1, tc);
    const __m256 B = t == DT_Q4_1 ? pk_halfs4x2(w0 + 2 * tc, w1 + 2 * tc, tc) : _mm256_setzero_ps();
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m256i asum = _mm256_broadcastsi128_si256(
            _mm_loadu_si128((const __m128i *)(xv[k].s32 + g * QACT_LANES)));
        const __m256 da = _mm256_broadcast_ps((const __m128 *)(xv[k].d + g * QACT_LANES));
        __m256i I = S[k];
        if (t == DT_Q4_0)
            I = _mm256_sub_epi32(I, _mm256_slli_epi32(asum, 3));
        else if (t == DT_Q8_0)
            I = _mm256_sub_epi32(I, _mm256_slli_epi32(asum, 7));
        __m256 v = _mm256_mul_ps(_mm256_mul_ps(A, da), _mm256_cvtepi32_ps(I));
        if (t == DT_Q4_1)
            v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(B, da), _mm256_cvtepi32_ps(asum)));
        acc0[k] = _mm512_add_ps(acc0[k], _mm512_zextps128_ps512(_mm256_castps256_ps128(v)));
        acc1[k] = _mm512_add_ps(acc1[k], _mm512_zextps128_ps512(_mm256_extractf128_ps(v, 1)));
    }
}

/* ---- the 1-2 chunk tail of a row pair for four tokens in one pass ----
 * A row of 576 values (the default model's width) is a group and two
 * chunks; pk_tail4x2 gives each token a pass over the pair's tails with
 * half its lanes padding.  Here the pair's tails for all four tokens fill
 * one 512-bit vector: 128-bit lane k is token k, its dwords [row 0 chunk
 * 0, row 0 chunk 1, row 1 chunk 0, row 1 chunk 1] (chunk 1 a zero pad
 * when tc == 1).  The activations' side does not depend on the rows: it
 * is laid out once per tile call (pk_tail_acts), lane k holding token k's
 * two chunks twice.  Each lane's sums and epilogue are pk_tail4x2's (exact
 * integer sums, the same float operations per lane), and lanes 0..tc-1
 * of each (row, token) are added to its accumulator, the others left as
 * they are (pk_tail4x2 adds +0 there; acc is never -0: the same bits). */
typedef struct pk_tail_acts {
    __m512i a[4][2]; /* the bytes at 128 i (against lo codes) and 128 i + 64 (hi); q8_0: 64 r */
    __m512i asum;    /* the chunks' code sums */
    __m512 da;       /* the chunks' scales */
} pk_tail_acts;

AI int pk_tail2x4_fits(uint32_t t, int tc, int nt)
{
    return nt == NTM && tc >= 1 && tc <= 2 && (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0);
}

/* Token k's 8 bytes at off from p[k] twice in 128-bit lane k. */
AI __m512i pk_lanes4(const uint8_t *const p[NTM], size_t off)
{
    __m512i v = _mm512_castsi128_si512(_mm_set1_epi64x(*(const long long *)(p[0] + off)));
    v = _mm512_inserti32x4(v, _mm_set1_epi64x(*(const long long *)(p[1] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_set1_epi64x(*(const long long *)(p[2] + off)), 2);
    return _mm512_inserti32x4(v, _mm_set1_epi64x(*(const long long *)(p[3] + off)), 3);
}

AI void pk_tail_acts_of(const qact_view *xv, int64_t g, pk_tail_acts *ta)
{
    const uint8_t *qs[NTM], *ds[NTM], *ss[NTM];
#pragma GCC unroll 4
    for (int k = 0; k < NTM; k++) {
        qs[k] = (const uint8_t *)(xv[k].qs + g * QACT_GROUP);
        ds[k] = (const uint8_t *)(xv[k].d + g * QACT_LANES);
        ss[k] = (const uint8_t *)(xv[k].s32 + g * QACT_LANES);
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        ta->a[i][0] = pk_lanes4(qs, (size_t)(128 * i));
        ta->a[i][1] = pk_lanes4(qs, (size_t)(128 * i + 64));
    }
    ta->asum = pk_lanes4(ss, 0);
    ta->da = _mm512_castsi512_ps(pk_lanes4(ds, 0));
}

/* Rows w0's and w1's 4 tc bytes at off, side by side (zero past tc). */
AI __m128i pk_pair8(const uint8_t *w0, const uint8_t *w1, size_t off, int tc)
{
    const __mmask16 m = (__mmask16)((1u << (4 * tc)) - 1);
    return _mm_unpacklo_epi64(_mm_maskz_loadu_epi8(m, w0 + off), _mm_maskz_loadu_epi8(m, w1 + off));
}

/* Rows w0's and w1's tc f16 scales at off as [w0 c0, w0 c1, w1 c0, w1 c1]. */
AI __m512 pk_pair_halfs(const uint8_t *w0, const uint8_t *w1, size_t off, int tc)
{
    const __mmask8 m = (__mmask8)((1u << tc) - 1);
    const __m128i h = _mm_unpacklo_epi32(_mm_maskz_loadu_epi16(m, w0 + off),
                                         _mm_maskz_loadu_epi16(m, w1 + off));
    return _mm512_broadcast_f32x4(_mm_cvtph_ps(h));
}

/* The tail's v (lanes as above): computed before the pair's groups, whose
 * sums do not feed it, so that its chain of loads, sums and scaling runs
 * under the groups' work (a row of 576 values has one group: at the end,
 * the chain was a quarter of the tile's time). */
AI __m512 pk_tail2x4_v(uint32_t t, const uint8_t *w0, const uint8_t *w1, int tc,
                       const pk_tail_acts *ta)
{
    const size_t qo = qpack_qs_off(t, tc);
    const int L = 4 * tc;
    const __m128i lo4 = _mm_set1_epi8(0x0F);
    __m512i S[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()}; /* two chains */
    if (t == DT_Q8_0) { /* code vector r (w + 128) against the activations at 64 r */
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m128i u = _mm_xor_si128(pk_pair8(w0, w1, qo + (size_t)(L * r), tc),
                                            _mm_set1_epi8((char)0x80));
            S[r & 1] = _mm512_dpbusd_epi32(S[r & 1], _mm512_broadcast_i32x4(u),
                                           ta->a[r / 2][r % 2]);
        }
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m128i v = pk_pair8(w0, w1, qo + (size_t)(L * i), tc);
            const __m512i lo = _mm512_broadcast_i32x4(_mm_and_si128(v, lo4));
            const __m512i hi = _mm512_broadcast_i32x4(_mm_and_si128(_mm_srli_epi16(v, 4), lo4));
            S[i & 1] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S[i & 1], lo, ta->a[i][0]), hi,
                                           ta->a[i][1]);
        }
    }
    __m512i I = _mm512_add_epi32(S[0], S[1]);
    const __m512 A = pk_pair_halfs(w0, w1, 0, tc);
    if (t == DT_Q4_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(ta->asum, 3));
    else if (t == DT_Q8_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(ta->asum, 7));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(A, ta->da), _mm512_cvtepi32_ps(I));
    if (t == DT_Q4_1) {
        const __m512 B = pk_pair_halfs(w0, w1, (size_t)(2 * tc), tc);
        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(B, ta->da), _mm512_cvtepi32_ps(ta->asum)));
    }
    return v;
}

/* acc0[k], acc1[k] lanes 0..tc-1 += the tail's v of rows 0 and 1, token k. */
AI void pk_tail2x4_add(__m512 v, int tc, __m512 acc0[NTM], __m512 acc1[NTM])
{
    const __mmask16 m = (__mmask16)((1u << tc) - 1);
    /* 128-bit lane k to lane 0 (an immediate: spelled out per token, as an
     * unoptimized build does not unroll a loop into constants) */
#define PK_TAIL_ADD(k)                                                                          \
    do {                                                                                        \
        const __m512 vk = _mm512_shuffle_f32x4(v, v, k);                                        \
        acc0[k] = _mm512_mask_add_ps(acc0[k], m, acc0[k], vk);                                  \
        acc1[k] = _mm512_mask_add_ps(acc1[k], m, acc1[k], _mm512_permute_ps(vk, 0xEE));         \
    } while (0)
    _Static_assert(NTM == 4, "four tokens' lanes");
    PK_TAIL_ADD(0);
    PK_TAIL_ADD(1);
    PK_TAIL_ADD(2);
    PK_TAIL_ADD(3);
#undef PK_TAIL_ADD
}

/* y[k ys] = qact_reduce16(acc0[k]), y[k ys + 1] = that of acc1[k], k < NTM:
 * acc_end's additions for eight accumulators at once, transposed (lanes
 * i + i+8, then + i+4, + i+2, + i+1 of every accumulator in step), and
 * each token's two results stored as a pair. */
_Static_assert(QACT_MULTI_MAX == 4, "acc_store8 reduces two rows of four tokens");
AI void acc_store8(const __m512 acc0[NTM], const __m512 acc1[NTM], float *y, int64_t ys)
{
    __m256 x[8], v[4], z[2];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m512 a = j < 4 ? acc0[j] : acc1[j - 4];
        x[j] = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
    }
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) /* lanes 0-3: accumulator 2j, 4-7: 2j + 1 */
        v[j] = _mm256_add_ps(_mm256_permute2f128_ps(x[2 * j], x[2 * j + 1], 0x20),
                             _mm256_permute2f128_ps(x[2 * j], x[2 * j + 1], 0x31));
#pragma GCC unroll 2
    for (int j = 0; j < 2; j++) /* [4j, 4j + 2 | 4j + 1, 4j + 3], two lanes each */
        z[j] = _mm256_add_ps(_mm256_shuffle_ps(v[2 * j], v[2 * j + 1], 0x44),
                             _mm256_shuffle_ps(v[2 * j], v[2 * j + 1], 0xEE));
    /* accumulators [0, 2, 4, 6 | 1, 3, 5, 7] -> token pairs (acc0[k], acc1[k]) */
    const __m256 w = _mm256_add_ps(_mm256_shuffle_ps(z[0], z[1], 0x88),
                                   _mm256_shuffle_ps(z[0], z[1], 0xDD));
    const __m256 p = _mm256_permutexvar_ps(_mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7), w);
    const __m128 p01 = _mm256_castps256_ps128(p), p23 = _mm256_extractf128_ps(p, 1);
    _mm_storel_pi((__m64 *)y, p01);
    _mm_storeh_pi((__m64 *)(y + ys), p01);
    _mm_storel_pi((__m64 *)(y + 2 * ys), p23);
    _mm_storeh_pi((__m64 *)(y + 3 * ys), p23);
}

/* acc0[k], acc1[k] (zeroed by the caller) += every group's v of packed rows
 * w0 and w1 for the nt tokens xv; the short last group a row at a time
 * (q4_0, q4_1, q8_0 tails of 1-4 chunks: both rows in one pass), after
 * the others, as in pk_row_acc. */
AI void pk_pair_acc(uint32_t t, int64_t n, const uint8_t *w0, const uint8_t *w1,
                    const qact_view *xv, int nt, const pk_tail_acts *ta, int stream,
                    __m512 acc0[NTM], __m512 acc1[NTM])
{
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    const int tc = (int)(nc % QACT_LANES);
    const __m512 tail_v = ta ? pk_tail2x4_v(t, w0 + full * gb, w1 + full * gb, tc, ta)
                             : _mm512_setzero_ps();
    const int pf = qact_pf_level(stream);
    for (int64_t g = 0; g < full; g++) {
        qact_prefetch_w(w0 + g * gb, gb, pf, QACT_PREFETCH);
        qact_prefetch_w(w1 + g * gb, gb, pf, QACT_PREFETCH);
        pk_group2(t, w0 + g * gb, w1 + g * gb, xv, g, nt, acc0, acc1);
    }
    if (ta) {
        pk_tail2x4_add(tail_v, tc, acc0, acc1);
    } else if (tc && pk_tail4_fits(t, tc)) {
        pk_tail4x2(t, w0 + full * gb, w1 + full * gb, tc, xv, full, nt, acc0, acc1);
    } else if (tc) {
        pk_group(t, w0 + full * gb, tc, xv, full, nt, acc0);
        pk_group(t, w1 + full * gb, tc, xv, full, nt, acc1);
    }
}

/* Rows w + r rs (r < n_rows) against nt tokens: y[k ys + r], each bitwise
 * pk_dot_type's; two rows a pass, an odd last row alone, the call's setup
 * paid once for the tile. */
AI void pk_tile_type(uint32_t t, int64_t n, const void *w, size_t rs, int64_t n_rows,
                     const void *xq, size_t xs, int nt, float *y, int64_t ys, int stream)
{
    qact_view xv[NTM];
    __m512 acc0[NTM], acc1[NTM];
    acc_begin(xq, xs, n, nt, xv, acc0);
    const int64_t nc = n / QACT_CHUNK;
    pk_tail_acts tail_acts, *ta = NULL;
    if (n_rows >= 2 && pk_tail2x4_fits(t, (int)(nc % QACT_LANES), nt)) {
        pk_tail_acts_of(xv, nc / QACT_LANES, &tail_acts);
        ta = &tail_acts;
    }
    int64_t r = 0;
    for (; r + 2 <= n_rows; r += 2) {
        const uint8_t *w0 = (const uint8_t *)w + (size_t)r * rs;
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            acc0[k] = acc1[k] = _mm512_setzero_ps();
        pk_pair_acc(t, n, w0, w0 + rs, xv, nt, ta, stream, acc0, acc1);
        if (nt == NTM) {
            acc_store8(acc0, acc1, y + r, ys);
            continue;
        }
        float o0[NTM], o1[NTM];
        acc_end(acc0, nt, o0);
        acc_end(acc1, nt, o1);
        for (int k = 0; k < nt; k++)
            y[k * ys + r] = o0[k], y[k * ys + r + 1] = o1[k];
    }
    if (r < n_rows) {
        float o[NTM];
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            acc0[k] = _mm512_setzero_ps();
        pk_row_acc(t, n, (const uint8_t *)w + (size_t)r * rs, xv, nt, acc0,
                   qact_pf_level(stream));
        acc_end(acc0, nt, o);
        for (int k = 0; k < nt; k++)
            y[k * ys + r] = o[k];
    }
}

/* pk_tail4 for one token and four rows w + j rs (j < 4) at once, row j in
 * the 128-bit lane j of each vector: the same code bytes (masked loads),
 * the token's activation bytes in every lane, the same sums and per-lane
 * epilogue, lane j's v added to acc[j] as pk_tail4 adds it.  A row of 576
 * values (one group and two chunks: the default model's width) pays its
 * two-chunk tail once per four rows instead of once per row. */
AI __m512i pk_load4x4(const uint8_t *p, size_t rs, int tc)
{
    const __m256i lo = _mm256_inserti128_si256(_mm256_castsi128_si256(pk_load4(p, tc)),
                                               pk_load4(p + rs, tc), 1);
    const __m256i hi = _mm256_inserti128_si256(_mm256_castsi128_si256(pk_load4(p + 2 * rs, tc)),
                                               pk_load4(p + 3 * rs, tc), 1);
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* The tc f16 scales at p + j rs for j < 4 as 16 floats, row j's in lanes
 * 4j..4j+3 (zero past tc). */
AI __m512 pk_halfs4x4(const uint8_t *p, size_t rs, int tc)
{
    const __mmask8 hm = (__mmask8)((1u << tc) - 1);
    const __m128i a = _mm_unpacklo_epi64(_mm_maskz_loadu_epi16(hm, p),
                                         _mm_maskz_loadu_epi16(hm, p + rs));
    const __m128i b = _mm_unpacklo_epi64(_mm_maskz_loadu_epi16(hm, p + 2 * rs),
                                         _mm_maskz_loadu_epi16(hm, p + 3 * rs));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
}

AI void pk_tail4x4(uint32_t t, const uint8_t *wg, size_t rs, int tc, const qact_view *xv,
                   int64_t g, __m512 acc[4])
{
    const uint8_t *qs = wg + qpack_qs_off(t, tc);
    const int L = 4 * tc;
    const int8_t *ag = xv[0].qs + g * QACT_GROUP;
    __m512i S = _mm512_setzero_si512();
    if (t == DT_Q8_0) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++)
            S = _mm512_dpbusd_epi32(
                S, _mm512_xor_si512(pk_load4x4(qs + L * r, rs, tc), bias),
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ag + 64 * r))));
    } else {
        const __m512i lo4 = _mm512_set1_epi8(0x0F);
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            const __m512i v = pk_load4x4(qs + L * i, rs, tc);
            const __m512i lo = _mm512_and_si512(v, lo4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
            const __m512i a0 =
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ag + 128 * i)));
            const __m512i a1 =
                _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(ag + 128 * i + 64)));
            S = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(S, lo, a0), hi, a1);
        }
    }
    const __m512 A = pk_halfs4x4(wg, rs, tc);
    const __m512i asum =
        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(xv[0].s32 + g * QACT_LANES)));
    const __m512 da = _mm512_broadcast_f32x4(_mm_loadu_ps(xv[0].d + g * QACT_LANES));
    __m512i I = S;
    if (t == DT_Q4_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 3));
    else if (t == DT_Q8_0)
        I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 7));
    __m512 v = _mm512_mul_ps(_mm512_mul_ps(A, da), _mm512_cvtepi32_ps(I));
    if (t == DT_Q4_1)
        v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(pk_halfs4x4(wg + 2 * tc, rs, tc), da),
                                           _mm512_cvtepi32_ps(asum)));
    acc[0] = _mm512_add_ps(acc[0], _mm512_zextps128_ps512(_mm512_castps512_ps128(v)));
    acc[1] = _mm512_add_ps(acc[1], _mm512_zextps128_ps512(_mm512_extractf32x4_ps(v, 1)));
    acc[2] = _mm512_add_ps(acc[2], _mm512_zextps128_ps512(_mm512_extractf32x4_ps(v, 2)));
    acc[3] = _mm512_add_ps(acc[3], _mm512_zextps128_ps512(_mm512_extractf32x4_ps(v, 3)));
}

/* One token against n_rows packed rows (row r at w + r rs): y[r] = the nt = 1
 * dot, bitwise.  Four rows' reductions run as one transposed pass of the
 * same additions as qact_reduce16 (lanes i + i+8, then + i+4, + i+2,
 * + i+1), and the call's setup is paid once for all the rows (the AVX2
 * rows kernel's scheme, qpack_avx2.c). */
AI void pk_rows_type(uint32_t t, int64_t n, const void *w, size_t rs, int64_t n_rows,
                     const void *xq, float *y)
{
    const qact_view xv[NTM] = {qact_view_of(xq, n)};
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const int tc = (int)(nc % QACT_LANES);
    const size_t gb = group_wbytes(t, QACT_LANES);
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        __m128 x4[4];
        const uint8_t *w4 = (const uint8_t *)w + (size_t)r * rs;
        if (tc && pk_tail4_fits(t, tc)) { /* the groups row by row, the four tails at once */
            __m512 acc[4];
            /* the four rows (tails included) 8 KiB ahead into L2 at once, and
             * no prefetch into L1: rows of 576 values streamed from DRAM (the
             * default model's decode), one thread: 24-28 -> 34-39 GMAC/s
             * (q4_1; the groups' own near and far prefetches: 24-28; rows of
             * whole groups keep theirs, 43-46 against 26-39 this way) */
            qact_prefetch_l2(w4, 4 * rs);
#pragma GCC unroll 1
            for (int j = 0; j < 4; j++) {
                acc[j] = _mm512_setzero_ps();
                pk_row_groups(t, n, w4 + (size_t)j * rs, xv, 1, &acc[j], QACT_PF_NONE);
            }
            pk_tail4x4(t, w4 + full * gb, rs, tc, xv, full, acc);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const __m256 x8 = _mm256_add_ps(_mm512_castps512_ps256(acc[j]),
                                                _mm512_extractf32x8_ps(acc[j], 1));
                x4[j] = _mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1));
            }
            _MM_TRANSPOSE4_PS(x4[0], x4[1], x4[2], x4[3]);
            _mm_storeu_ps(y + r, _mm_add_ps(_mm_add_ps(x4[0], x4[2]), _mm_add_ps(x4[1], x4[3])));
            continue;
        }
#pragma GCC unroll 1
        for (int j = 0; j < 4; j++) {
            __m512 acc[NTM];
            acc[0] = _mm512_setzero_ps();
            pk_row_acc(t, n, w4 + (size_t)j * rs, xv, 1, acc, QACT_PF_FAR);
            const __m256 x8 = _mm256_add_ps(_mm512_castps512_ps256(acc[0]),
                                            _mm512_extractf32x8_ps(acc[0], 1));
            x4[j] = _mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1));
        }
        _MM_TRANSPOSE4_PS(x4[0], x4[1], x4[2], x4[3]); /* x4[i]: lane i of the four rows */
        _mm_storeu_ps(y + r, _mm_add_ps(_mm_add_ps(x4[0], x4[2]), _mm_add_ps(x4[1], x4[3])));
    }
    for (; r < n_rows; r++)
        pk_dot_type(t, n, (const uint8_t *)w + (size_t)r * rs, xq, 0, 1, y + r);
}

QACT_NT_ENTRY(p5_q4_0, pk_dot_type, DT_Q4_0)
QACT_NT_ENTRY(p5_q4_1, pk_dot_type, DT_Q4_1)
QACT_NT_ENTRY(p5_q8_0, pk_dot_type, DT_Q8_0)
QACT_NT_ENTRY(p5_q4_K, pk_dot_type, DT_Q4_K)
QACT_NT_ENTRY(p5_q5_0, pk_dot_type, DT_Q5_0)
QACT_NT_ENTRY(p5_q5_1, pk_dot_type, DT_Q5_1)
QACT_NT_ENTRY(p5_q5_K, pk_dot_type, DT_Q5_K)
QACT_NT_ENTRY(p5_q6_K, pk_dot_type, DT_Q6_K)
QACT_NT_ENTRY(p5_mxfp4, pk_dot_type, DT_MXFP4)

qact_dot_fn qpack_dot_avx512(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return p5_q4_0;
    case DT_Q4_1: return p5_q4_1;
    case DT_Q8_0: return p5_q8_0;
    case DT_Q4_K: return p5_q4_K;
    case DT_Q5_0: return p5_q5_0;
    case DT_Q5_1: return p5_q5_1;
    case DT_Q5_K: return p5_q5_K;
    case DT_Q6_K: return p5_q6_K;
    case DT_MXFP4: return p5_mxfp4;
    default: return NULL;
    }
}

QACT_TILE_ENTRY(t5_q4_0, pk_tile_type, DT_Q4_0)
QACT_TILE_ENTRY(t5_q4_1, pk_tile_type, DT_Q4_1)
QACT_TILE_ENTRY(t5_q8_0, pk_tile_type, DT_Q8_0)
QACT_TILE_ENTRY(t5_q4_K, pk_tile_type, DT_Q4_K)
QACT_TILE_ENTRY(t5_q5_0, pk_tile_type, DT_Q5_0)
QACT_TILE_ENTRY(t5_q5_1, pk_tile_type, DT_Q5_1)
QACT_TILE_ENTRY(t5_q5_K, pk_tile_type, DT_Q5_K)
QACT_TILE_ENTRY(t5_q6_K, pk_tile_type, DT_Q6_K)
QACT_TILE_ENTRY(t5_mxfp4, pk_tile_type, DT_MXFP4)

qact_dot_tile_fn qpack_dot_tile_avx512(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return t5_q4_0;
    case DT_Q4_1: return t5_q4_1;
    case DT_Q8_0: return t5_q8_0;
    case DT_Q4_K: return t5_q4_K;
    case DT_Q5_0: return t5_q5_0;
    case DT_Q5_1: return t5_q5_1;
    case DT_Q5_K: return t5_q5_K;
    case DT_Q6_K: return t5_q6_K;
    case DT_MXFP4: return t5_mxfp4;
    default: return NULL;
    }
}

#define PK_ROWS_ENTRY(name, type)                                                              \
    static void name(int64_t n, const void *w, size_t rs, int64_t n_rows, const void *xq,     \
                     float *y)                                                                 \
    {                                                                                          \
        pk_rows_type(type, n, w, rs, n_rows, xq, y);                                           \
    }
PK_ROWS_ENTRY(r5_q4_0, DT_Q4_0)
PK_ROWS_ENTRY(r5_q4_1, DT_Q4_1)
PK_ROWS_ENTRY(r5_q8_0, DT_Q8_0)
PK_ROWS_ENTRY(r5_q4_K, DT_Q4_K)
PK_ROWS_ENTRY(r5_q5_0, DT_Q5_0)
PK_ROWS_ENTRY(r5_q5_1, DT_Q5_1)
PK_ROWS_ENTRY(r5_q5_K, DT_Q5_K)
PK_ROWS_ENTRY(r5_q6_K, DT_Q6_K)
PK_ROWS_ENTRY(r5_mxfp4, DT_MXFP4)

qact_dot_rows_fn qpack_dot_rows_avx512(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return r5_q4_0;
    case DT_Q4_1: return r5_q4_1;
    case DT_Q8_0: return r5_q8_0;
    case DT_Q4_K: return r5_q4_K;
    case DT_Q5_0: return r5_q5_0;
    case DT_Q5_1: return r5_q5_1;
    case DT_Q5_K: return r5_q5_K;
    case DT_Q6_K: return r5_q6_K;
    case DT_MXFP4: return r5_mxfp4;
    default: return NULL;
    }
}
