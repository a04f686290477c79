/* qpack_avx2.c - AVX2 dot products of packed weight rows (kernels/qpack.h)
 * against interleaved qact rows, bitwise equal to qact_ref.c (specification
 * in qact.h): the packed counterparts of qact_avx2.c's stored-row kernels.
 *
 * Built with -mavx2 -mfma -mf16c; reached through the table matmul.c fills
 * when the chosen ISA is AVX2 (packed_dot, packed_dot_rows).  Compiled
 * under -std=c11, so GCC does not contract the explicit multiplies and
 * adds into FMAs (the reference order).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/qact.h"
#include "kernels/qact_avx2_common.h"
#include "kernels/qpack.h"

/* ---- packed rows (kernels/qpack.h) ----
 * Every 4-byte lane of a packed code vector belongs to one chunk, so
 * VPMADDUBSW + VPMADDWD leave each chunk's partial sums in its own lane
 * and plain vertical adds finish them: no horizontal reduction.  q4_0 and
 * q4_1 add eight VPMADDUBSW results in int16 first (|pair| <= 2*15*127,
 * eight of them <= 30480: exact).  A short last group (tc < 16 chunks) is
 * read with VPMASKMOVD: lanes past it load 0, score 0 * 0 and add +0 to
 * an accumulator that is never -0 (the reference skips them: same sum). */

/* The int16 pair sums of one packed code vector's low and high nibbles
 * (lo, hi) against a token's interleaved codes at a and a + 64. */
AI __m256i pk_pair16(__m256i lo, __m256i hi, const int8_t *a)
{
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a)),
                            _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 64))));
}

/* mxfp4: as pk_pair16 for signed values w (|w| <= 12), as |w| x sign(a, w):
 * each pair <= 2 * 12 * 127, four vectors' two pairs <= 24384 in int16. */
AI __m256i mx_pair16(__m256i lo, __m256i hi, const int8_t *a)
{
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)a);
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(a + 64));
    return _mm256_add_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(lo), _mm256_sign_epi8(a0, lo)),
                            _mm256_maddubs_epi16(_mm256_abs_epi8(hi), _mm256_sign_epi8(a1, hi)));
}

/* S[k] lane i = exact sum of chunk 8h+i of one group for token k (nvl
 * lanes valid); qs: the group's packed codes, vectors L bytes apart;
 * ag[k]: token k's interleaved codes of the group. */
AI void pk_half_sums(uint32_t t, const uint8_t *qs, int L, int h, int nvl, pk_row row,
                     const int8_t *const ag[NTM], int nt, __m256i S[NTM])
{
    const __m256i ones = _mm256_set1_epi16(1);
    if (t == DT_Q8_0) {
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int r = 0; r < 8; r++) {
            const __m256i w = pk_load(qs + L * r + 32 * h, nvl, row);
            const __m256i aw = _mm256_abs_epi8(w);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                const __m256i a = _mm256_loadu_si256((const __m256i *)(ag[k] + 64 * r + 32 * h));
                S[k] = _mm256_add_epi32(
                    S[k], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), ones));
            }
        }
        return;
    }
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    __m256i s16[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        s16[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        const __m256i v = pk_load(qs + L * i + 32 * h, nvl, row);
        __m256i lo = _mm256_and_si256(v, lo4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
        if (t == DT_MXFP4) {
            lo = mx_values(lo);
            hi = mx_values(hi);
        }
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            s16[k] = _mm256_add_epi16(s16[k], t == DT_MXFP4 ? mx_pair16(lo, hi, ag[k] + 128 * i + 32 * h)
                                                            : pk_pair16(lo, hi, ag[k] + 128 * i + 32 * h));
    }
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_madd_epi16(s16[k], ones);
}

/* q5_0, q5_1, q5_K: as the q4 sums, with bit 4 of each code from the
 * group's qh' lanes at qx (qpack.c: byte j, bit i / 4 + i = bit 4 of
 * the low / high nibble's code in byte j of vector i).  Codes < 32: two
 * vectors' pairs (<= 4 * 31 * 127) add up exactly in int16. */
AI void pk_half_sums5(const uint8_t *qs, const uint8_t *qx, int L, int h, int nvl, pk_row row,
                      const int8_t *const ag[NTM], int nt, __m256i S[NTM])
{
    const __m256i ones = _mm256_set1_epi16(1), lo4 = _mm256_set1_epi8(0x0F);
    const __m256i b4 = _mm256_set1_epi8(0x10);
    const __m256i q5 = pk_load(qx + 32 * h, nvl, row);
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_setzero_si256();
#pragma GCC unroll 2
    for (int pp = 0; pp < 2; pp++) {
        __m256i s16[NTM];
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            s16[k] = _mm256_setzero_si256();
#pragma GCC unroll 2
        for (int i = 2 * pp; i < 2 * pp + 2; i++) {
            const __m256i v = pk_load(qs + L * i + 32 * h, nvl, row);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, lo4),
                                               _mm256_and_si256(_mm256_slli_epi16(q5, 4 - i), b4));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4),
                                               _mm256_and_si256(_mm256_srli_epi16(q5, i), b4));
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++)
                s16[k] = _mm256_add_epi16(s16[k], pk_pair16(lo, hi, ag[k] + 128 * i + 32 * h));
        }
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm256_add_epi32(S[k], _mm256_madd_epi16(s16[k], ones));
    }
}

/* q6_K: codes < 64 from the nibbles and the 2-bit planes at qx (qpack.c);
 * one vector's pair (<= 2 * 2 * 63 * 127) is exact in int16, and VPMADDWD
 * weights it by the half-chunk scale (sc0 for vectors 0-1, values 0-15;
 * sc1 for 2-3): S = sc0*r0 + sc1*r1 per chunk. */
AI void pk_half_sums6(const uint8_t *qs, const uint8_t *qx, int L, int h, __m256i sc0,
                      __m256i sc1, const int8_t *const ag[NTM], int nt, __m256i S[NTM])
{
    const __m256i lo4 = _mm256_set1_epi8(0x0F), b45 = _mm256_set1_epi8(0x30);
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + L * i + 32 * h));
        const __m256i q2 = _mm256_loadu_si256((const __m256i *)(qx + L * (i / 2) + 32 * h));
        const __m256i lb = i & 1 ? _mm256_slli_epi16(q2, 4) : q2;
        const __m256i hb = i & 1 ? _mm256_slli_epi16(q2, 2) : _mm256_srli_epi16(q2, 2);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(v, lo4), _mm256_and_si256(lb, b45));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), lo4),
                                           _mm256_and_si256(hb, b45));
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm256_add_epi32(S[k], _mm256_madd_epi16(pk_pair16(lo, hi, ag[k] + 128 * i + 32 * h),
                                                            i < 2 ? sc0 : sc1));
    }
}

/* K types: super-block h's scales as pk_group uses them. */
typedef struct pk_kscales {
    __m256 A, B;
    __m256i sc, mn;        /* q4_K, q5_K: sub-block scales and mins */
    __m256i e6, sc0, sc1;  /* q6_K: the 16 int8 scales as int16, and as pairs (s0,s0), (s1,s1) */
} pk_kscales;

AI pk_kscales pk_k_scales(uint32_t t, const uint8_t *wg, int tc, int h)
{
    pk_kscales r;
    r.sc = r.mn = r.e6 = r.sc0 = r.sc1 = _mm256_setzero_si256();
    if (t == DT_Q6_K) {
        half_fp16 d;
        memcpy(&d, wg + 2 * h, 2);
        r.A = _mm256_set1_ps(h2f(d));
        r.B = _mm256_setzero_ps();
        r.e6 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(wg + 2 * (tc / 8) + 16 * h)));
        r.sc0 = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(r.e6, 0xA0), 0xA0);
        r.sc1 = _mm256_shufflehi_epi16(_mm256_shufflelo_epi16(r.e6, 0xF5), 0xF5);
        return r;
    }
    const uint8_t *hd = wg + 16 * h; /* q4_K, q5_K: d, dmin, scales as stored */
    uint32_t u[4];
    int dw;
    qact_k4_scales(hd + 4, u);
    memcpy(&dw, hd, 4);
    r.sc = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)u[0], (int)u[1], 0, 0));
    r.mn = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)u[2], (int)u[3], 0, 0));
    float fd[4]; /* d, dmin: F16C converts exactly */
    _mm_storeu_ps(fd, _mm_cvtph_ps(_mm_cvtsi32_si128(dw)));
    r.A = _mm256_set1_ps(fd[0]);
    r.B = _mm256_set1_ps(-fd[1]);
    return r;
}

AI int pk_has_min(uint32_t t)
{
    return t == DT_Q4_1 || t == DT_Q5_1;
}

/* acc[k][h] += v_c for the tc chunks of group g at wg. */
AI void pk_group(uint32_t t, const uint8_t *wg, int tc, pk_row row, const qact_view *xv, int64_t g,
                 int nt, __m256 acc[NTM][2])
{
    const int L = 4 * tc;
    const int kq = t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K;
    const uint8_t *qs = wg + qpack_qs_off(t, tc), *qx = wg + qpack_qx_off(t, tc);
    const uint8_t *dh = wg, *mh = wg + 2 * tc;
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        ag[k] = xv[k].qs + g * QACT_GROUP;
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const int nvl = tc - 8 * h < 8 ? tc - 8 * h : 8;
        if (nvl <= 0)
            break;
        const int64_t c0 = g * QACT_LANES + 8 * h;
        __m256i S[NTM];
        pk_kscales ks;
        if (kq) {
            ks = pk_k_scales(t, wg, tc, h);
        } else if (t == DT_MXFP4) { /* e[tc] */
            ks.A = mx_scales(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(dh + 8 * h))));
            ks.B = _mm256_setzero_ps();
        } else {
            ks.A = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(dh + 16 * h)));
            ks.B = pk_has_min(t) ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(mh + 16 * h)))
                                 : _mm256_setzero_ps();
        }
        if (nvl < 8 && !kq) { /* short group: the lanes past it read the group's
                                 * next field; they scale by +0, as zero padding would */
            const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32(nvl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
            ks.A = _mm256_and_ps(ks.A, keep);
            ks.B = _mm256_and_ps(ks.B, keep);
        }
        if (t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q5_K)
            pk_half_sums5(qs, qx, L, h, nvl, row, ag, nt, S);
        else if (t == DT_Q6_K)
            pk_half_sums6(qs, qx, L, h, ks.sc0, ks.sc1, ag, nt, S);
        else
            pk_half_sums(t, qs, L, h, nvl, row, ag, nt, S);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            const __m256 da = _mm256_loadu_ps(xv[k].d + c0);
            const __m256i asum = _mm256_loadu_si256((const __m256i *)(xv[k].s32 + c0));
            __m256i I = S[k];
            if (t == DT_Q4_K || t == DT_Q5_K) {
                I = _mm256_mullo_epi32(ks.sc, I);
                const __m256i J = _mm256_mullo_epi32(ks.mn, asum);
                acc[k][h] = _mm256_add_ps(
                    acc[k][h],
                    _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(ks.A, da), _mm256_cvtepi32_ps(I)),
                                  _mm256_mul_ps(_mm256_mul_ps(ks.B, da), _mm256_cvtepi32_ps(J))));
                continue;
            }
            if (t == DT_Q4_0)
                I = _mm256_sub_epi32(I, _mm256_slli_epi32(asum, 3));
            else if (t == DT_Q5_0)
                I = _mm256_sub_epi32(I, _mm256_slli_epi32(asum, 4));
            else if (t == DT_Q6_K)
                I = _mm256_sub_epi32(I, _mm256_slli_epi32(
                        _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(xv[k].s16 + 2 * c0)),
                                          ks.e6), 5));
            __m256 v = _mm256_mul_ps(_mm256_mul_ps(ks.A, da), _mm256_cvtepi32_ps(I));
            /* q4_0, q5_0, q8_0, q6_K, mxfp4: the reference's second term is +0,
             * and adding +0 to v and then to acc (never -0) changes nothing */
            if (pk_has_min(t))
                v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_mul_ps(ks.B, da), _mm256_cvtepi32_ps(asum)));
            acc[k][h] = _mm256_add_ps(acc[k][h], v);
        }
    }
}

/* ---- a short last group of 1..4 chunks in 128-bit lanes ----
 * q4_0, q4_1 and q8_0: pk_group's sums and scaling for h = 0 (so bitwise
 * the reference) in 128-bit vectors, where pk_group spends a whole 256-bit
 * half group; two chunks (rows of 576 = 512 + 64 values, SmolLM2's width)
 * put two code vectors in a register.  A row of 576 values took 36% (q4_1)
 * and 52% (q8_0) longer than one of 512 before (Zen 1, one thread, four
 * tokens, tests/tools/qact_bench); 576 x 576, one / four tokens: q4_1
 * 31.8 / 86.3 us -> 26.0 / 75.1, q8_0 39.2 / 115.4 -> 30.3 / 93.4. */
#define PK_TAIL_MAX 4

AI int pk_tail_fits(uint32_t t, int tc, pk_row row)
{
    return tc <= PK_TAIL_MAX && row.end - row.begin >= 16 &&
           (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0);
}

/* S[k] lanes j < tc = the exact sum of chunk j of the short group for token
 * k (a[k]: its interleaved codes of the group), lanes past tc 0.  Two
 * chunks (576-value rows) pair two 8-byte code vectors in a register. */
AI void pk_tail_sums(uint32_t t, const uint8_t *qs, int tc, pk_row row, const int8_t *const a[NTM],
                     int nt, __m128i S[NTM])
{
    const int L = 4 * tc;
    const __m128i ones = _mm_set1_epi16(1), m = _mm_set1_epi8(0x0F);
    __m128i s16[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        S[k] = s16[k] = _mm_setzero_si128();
    if (t == DT_Q8_0) {
        const int nv = tc == 2 ? 4 : 8; /* slots r (values 4r..4r+3 of each chunk) a load */
#pragma GCC unroll 8
        for (int r = 0; r < nv; r++) {
            const __m128i wv = pk_load_tail(qs + (tc == 2 ? 16 : L) * r, row), aw = _mm_abs_epi8(wv);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                const __m128i ak = tc == 2 ? pk_load2x8(a[k] + 128 * r, a[k] + 128 * r + 64)
                                           : _mm_loadu_si128((const __m128i *)(a[k] + 64 * r));
                S[k] = _mm_add_epi32(
                    S[k], _mm_madd_epi16(_mm_maddubs_epi16(aw, _mm_sign_epi8(ak, wv)), ones));
            }
        }
    } else {
#pragma GCC unroll 4
        for (int i = 0; i < 4; i++) {
            if (tc == 2) { /* low nibbles against slot 2i, high against 2i + 1 */
                const __m128i v = _mm_loadl_epi64((const __m128i *)(qs + 8 * i));
                const __m128i lh = _mm_unpacklo_epi64(_mm_and_si128(v, m),
                                                      _mm_and_si128(_mm_srli_epi16(v, 4), m));
#pragma GCC unroll 8
                for (int k = 0; k < nt; k++)
                    s16[k] = _mm_add_epi16(s16[k], _mm_maddubs_epi16(lh, pk_load2x8(a[k] + 128 * i,
                                                                                   a[k] + 128 * i + 64)));
                continue;
            }
            const __m128i v = pk_load_tail(qs + L * i, row);
            const __m128i lo = _mm_and_si128(v, m), hi = _mm_and_si128(_mm_srli_epi16(v, 4), m);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                const int8_t *ak = a[k] + 128 * i;
                s16[k] = _mm_add_epi16(
                    s16[k], _mm_add_epi16(_mm_maddubs_epi16(lo, _mm_loadu_si128((const __m128i *)ak)),
                                          _mm_maddubs_epi16(hi, _mm_loadu_si128((const __m128i *)(ak + 64)))));
            }
        }
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm_madd_epi16(s16[k], ones);
    }
    if (tc == 2) /* lanes 0, 1 and 2, 3 hold the same two chunks */
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            S[k] = _mm_move_epi64(_mm_add_epi32(S[k], _mm_unpackhi_epi64(S[k], S[k])));
}

/* acc[k][0] lanes 0..tc-1 += v_c for the tc (1..PK_TAIL_MAX) chunks of the
 * row's last group g at wg (pk_tail_fits). */
AI void pk_tail(uint32_t t, const uint8_t *wg, int tc, pk_row row, const qact_view *xv, int64_t g,
                int nt, __m256 acc[NTM][2])
{
    const int8_t *a[NTM];
    __m128i S[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++)
        a[k] = xv[k].qs + g * QACT_GROUP;
    pk_tail_sums(t, wg + qpack_qs_off(t, tc), tc, row, a, nt, S);
    /* the scales of lanes past tc read the group's next field: scaled by +0 */
    const __m128 keep =
        _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_set1_epi32(tc), _mm_setr_epi32(0, 1, 2, 3)));
    const __m128 A = _mm_and_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)wg)), keep);
    const __m128 B =
        pk_has_min(t) ? _mm_and_ps(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)(wg + 2 * tc))), keep)
                      : _mm_setzero_ps();
    const int64_t c0 = g * QACT_LANES;
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m128 da = _mm_loadu_ps(xv[k].d + c0);
        const __m128i asum = _mm_loadu_si128((const __m128i *)(xv[k].s32 + c0));
        __m128i I = S[k];
        if (t == DT_Q4_0)
            I = _mm_sub_epi32(I, _mm_slli_epi32(asum, 3));
        __m128 v = _mm_mul_ps(_mm_mul_ps(A, da), _mm_cvtepi32_ps(I));
        if (pk_has_min(t))
            v = _mm_add_ps(v, _mm_mul_ps(_mm_mul_ps(B, da), _mm_cvtepi32_ps(asum)));
        acc[k][0] =
            _mm256_insertf128_ps(acc[k][0], _mm_add_ps(_mm256_castps256_ps128(acc[k][0]), v), 0);
    }
}

/* acc[k][h] (zeroed by the caller) += every chunk's v_c of packed row w for
 * the nt tokens xv; pf: what each group prefetches ahead (a QACT_PF_ level,
 * qact_prefetch_w). */
AI void pk_row_acc(uint32_t t, int64_t n, const void *w, const qact_view *xv, int nt,
                   __m256 acc[NTM][2], int pf)
{
    const uint8_t *wb = w;
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = t == DT_Q6_K ? 2 * sizeof(block_q6_K) : QACT_LANES * chunk_wbytes(t);
    const pk_row row = {wb, wb + nc * chunk_wbytes(t)};
    for (int64_t g = 0; g < full; g++) {
        const uint8_t *wg = wb + g * gb;
        qact_prefetch_w(wg, gb, pf, QACT2_PREFETCH);
        pk_group(t, wg, QACT_LANES, row, xv, g, nt, acc);
    }
    const int tc = (int)(nc % QACT_LANES);
    if (tc && pk_tail_fits(t, tc, row))
        pk_tail(t, wb + full * gb, tc, row, xv, full, nt, acc);
    else if (tc)
        pk_group(t, wb + full * gb, tc, row, xv, full, nt, acc);
}

AI void pk_dot_type(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt,
                    float *out)
{
    qact_view xv[NTM];
    __m256 acc[NTM][2];
    acc_begin(xq, xs, n, nt, xv, acc);
    pk_row_acc(t, n, w, xv, nt, acc, qact_pf_level(nt == 1));
    acc_end(acc, nt, out);
}

/* One token against n_rows packed rows (row r at w + r rs): y[r] = the nt = 1
 * dot, bitwise.  Four rows' reductions run as one transposed pass of the
 * same additions (qact_reduce16: lanes i + i+8, then + i+4, + i+2, + i+1),
 * and the setup of a call is paid once for all the rows. */
AI void pk_rows_type(uint32_t t, int64_t n, const void *w, size_t rs, int64_t n_rows,
                     const void *xq, float *y)
{
    const qact_view xv[NTM] = {qact_view_of(xq, n)};
    int64_t r = 0;
    /* rows of whole groups and a 1-4 chunk tail (576 values: the default
     * model) prefetched four at a time, whole, 8 KiB ahead into L2 and not
     * into L1 (their groups' own near and far prefetches off): streamed
     * from DRAM on one thread (Zen 4, KVANT_ISA=avx2) q4_1 19.4-20.3 ->
     * 23.8-32.1 GMAC/s, q4_0 24.8-26.2 -> 29.3-30.5; a default-model
     * decode's body against its head in perf samples 3.42 / 3.48 -> 3.06 /
     * 3.19.  Rows of whole groups keep their groups' prefetches. */
    const int64_t tc = n / QACT_CHUNK % QACT_LANES;
    const int block_pf = tc && tc <= PK_TAIL_MAX && (t == DT_Q4_0 || t == DT_Q4_1 || t == DT_Q8_0);
    for (; r + 4 <= n_rows; r += 4) {
        __m128 x4[4];
        if (block_pf)
            qact_prefetch_l2((const uint8_t *)w + (size_t)r * rs, 4 * rs);
#pragma GCC unroll 1
        for (int j = 0; j < 4; j++) {
            __m256 acc[NTM][2];
            acc[0][0] = acc[0][1] = _mm256_setzero_ps();
            pk_row_acc(t, n, (const uint8_t *)w + (size_t)(r + j) * rs, xv, 1, acc,
                       block_pf ? QACT_PF_NONE : QACT_PF_FAR);
            const __m256 x8 = _mm256_add_ps(acc[0][0], acc[0][1]);
            x4[j] = _mm_add_ps(_mm256_castps256_ps128(x8), _mm256_extractf128_ps(x8, 1));
        }
        _MM_TRANSPOSE4_PS(x4[0], x4[1], x4[2], x4[3]); /* x4[i]: lane i of the four rows */
        _mm_storeu_ps(y + r, _mm_add_ps(_mm_add_ps(x4[0], x4[2]), _mm_add_ps(x4[1], x4[3])));
    }
    for (; r < n_rows; r++)
        pk_dot_type(t, n, (const uint8_t *)w + (size_t)r * rs, xq, 0, 1, y + r);
}

/* ---- packed q4_0 against four tokens whose rows fit in L1 ----
 * The same arithmetic as pk_dot_type (so bitwise the reference), laid out
 * for the common prefill shape: the row walked twice, lanes 0-7 of every
 * group and then lanes 8-15, so each token needs one accumulator (four in
 * all, not eight), and every token's codes, scales and sums addressed from
 * one base and the qact row stride.  Measured on AVX2 (Zen 3, one thread,
 * the tiled matmul, quiet machine): 1.21-1.54x pk_dot_type at n = 2048 and
 * 1.21-1.36x at 4096; at 8192 the four rows leave L1 between the two walks
 * and the generic kernel stays (PK4_L1_BYTES). */
#define PK4_L1_BYTES (24 * 1024)

/* s += the pair sums of code vector (lo, hi) against the codes of token k
 * of this half group (a: token 0's, xs: the qact row stride). */
#define PK4_SUM(s, k)                                                                           \
    do {                                                                                        \
        const int8_t *ak_ = a + (k) * xs + 128 * i;                                             \
        s = _mm256_add_epi16(s, pk_pair16(lo, hi, ak_));                                        \
    } while (0)

/* acc += (A * d) * (float)(S - 8 asum) for token k's chunks c0 .. c0 + 7. */
#define PK4_EPI(s, acc, k)                                                                      \
    do {                                                                                        \
        const uint8_t *xk_ = x + (k) * xs + np;                                                 \
        const __m256 da_ = _mm256_loadu_ps((const float *)xk_ + c0);                            \
        const __m256i as_ = _mm256_loadu_si256((const __m256i *)(xk_ + np / 8) + c0 / 8);       \
        const __m256i I_ = _mm256_sub_epi32(_mm256_madd_epi16(s, ones), _mm256_slli_epi32(as_, 3)); \
        acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_mul_ps(A, da_), _mm256_cvtepi32_ps(I_)));  \
    } while (0)

/* n % QACT_GROUP == 0, four tokens; pf: what each group prefetches (a
 * QACT_PF_ level, qact_prefetch_w). */
static void pk_q4_0_x4(int64_t n, const void *w, const void *xq, size_t xs, float *out, int pf)
{
    const int64_t np = qact_padded(n), ng = n / QACT_GROUP;
    const uint8_t *x = xq;
    const size_t gb = QACT_LANES * sizeof(block_q4_0);
    const __m256i m = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    _Alignas(32) float l[QACT_MULTI_MAX][QACT_LANES];
    for (int h = 0; h < 2; h++) {
        __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
        for (int64_t g = 0; g < ng; g++) {
            const uint8_t *wg = (const uint8_t *)w + g * gb;
            const uint8_t *qs = wg + qpack_qs_off(DT_Q4_0, QACT_LANES) + 32 * h;
            const int8_t *a = (const int8_t *)x + g * QACT_GROUP + 32 * h;
            const int64_t c0 = g * QACT_LANES + 8 * h;
            if (h == 0)
                qact_prefetch_w(wg, gb, pf, QACT2_PREFETCH);
            __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
            for (int i = 0; i < 4; i++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 64 * i));
                const __m256i lo = _mm256_and_si256(v, m);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
                PK4_SUM(s0, 0);
                PK4_SUM(s1, 1);
                PK4_SUM(s2, 2);
                PK4_SUM(s3, 3);
            }
            const __m256 A = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wg + 16 * h)));
            PK4_EPI(s0, acc0, 0);
            PK4_EPI(s1, acc1, 1);
            PK4_EPI(s2, acc2, 2);
            PK4_EPI(s3, acc3, 3);
        }
        _mm256_store_ps(l[0] + 8 * h, acc0);
        _mm256_store_ps(l[1] + 8 * h, acc1);
        _mm256_store_ps(l[2] + 8 * h, acc2);
        _mm256_store_ps(l[3] + 8 * h, acc3);
    }
    for (int k = 0; k < QACT_MULTI_MAX; k++)
        out[k] = qact_reduce16(l[k]);
}

QACT_NT_ENTRY(p2_q4_0_any, pk_dot_type, DT_Q4_0)

static void p2_q4_0(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    if (nt == QACT_MULTI_MAX && n % QACT_GROUP == 0 &&
        QACT_MULTI_MAX * qact_row_bytes(n) <= PK4_L1_BYTES)
        pk_q4_0_x4(n, w, xq, xs, out, QACT_PF_NEAR);
    else
        p2_q4_0_any(n, w, xq, xs, nt, out);
}
QACT_NT_ENTRY(p2_q4_1, pk_dot_type, DT_Q4_1)
QACT_NT_ENTRY(p2_q8_0, pk_dot_type, DT_Q8_0)
QACT_NT_ENTRY(p2_q4_K, pk_dot_type, DT_Q4_K)
QACT_NT_ENTRY(p2_q5_0, pk_dot_type, DT_Q5_0)
QACT_NT_ENTRY(p2_q5_1, pk_dot_type, DT_Q5_1)
QACT_NT_ENTRY(p2_q5_K, pk_dot_type, DT_Q5_K)
QACT_NT_ENTRY(p2_q6_K, pk_dot_type, DT_Q6_K)
QACT_NT_ENTRY(p2_mxfp4, pk_dot_type, DT_MXFP4)

#define PK_ROWS_ENTRY(name, type)                                                              \
    static void name(int64_t n, const void *w, size_t rs, int64_t n_rows, const void *xq,     \
                     float *y)                                                                 \
    {                                                                                          \
        pk_rows_type(type, n, w, rs, n_rows, xq, y);                                           \
    }
PK_ROWS_ENTRY(r2_q4_0, DT_Q4_0)
PK_ROWS_ENTRY(r2_q4_1, DT_Q4_1)
PK_ROWS_ENTRY(r2_q8_0, DT_Q8_0)
PK_ROWS_ENTRY(r2_q4_K, DT_Q4_K)
PK_ROWS_ENTRY(r2_q5_0, DT_Q5_0)
PK_ROWS_ENTRY(r2_q5_1, DT_Q5_1)
PK_ROWS_ENTRY(r2_q5_K, DT_Q5_K)
PK_ROWS_ENTRY(r2_q6_K, DT_Q6_K)
PK_ROWS_ENTRY(r2_mxfp4, DT_MXFP4)

/* Rows w + r rs (r < n_rows) against nt tokens: y[k ys + r], each bitwise
 * the packed dot's (q4_0's four-token kernel where it applies), the call's
 * setup paid once for the tile and the results stored by the kernel. */
AI void pk_tile_type(uint32_t t, int64_t n, const void *w, size_t rs, int64_t n_rows,
                     const void *xq, size_t xs, int nt, float *y, int64_t ys, int stream)
{
    const int x4 = t == DT_Q4_0 && nt == QACT_MULTI_MAX && n % QACT_GROUP == 0 &&
                   QACT_MULTI_MAX * qact_row_bytes(n) <= PK4_L1_BYTES;
    qact_view xv[NTM];
    __m256 acc[NTM][2];
    acc_begin(xq, xs, n, nt, xv, acc);
    for (int64_t r = 0; r < n_rows; r++) {
        const uint8_t *wr = (const uint8_t *)w + (size_t)r * rs;
        float o[NTM];
        if (x4) {
            pk_q4_0_x4(n, wr, xq, xs, o, qact_pf_level(stream));
        } else {
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++)
                acc[k][0] = acc[k][1] = _mm256_setzero_ps();
            pk_row_acc(t, n, wr, xv, nt, acc, qact_pf_level(stream));
            acc_end(acc, nt, o);
        }
        for (int k = 0; k < nt; k++)
            y[k * ys + r] = o[k];
    }
}

QACT_TILE_ENTRY(t2_q4_0, pk_tile_type, DT_Q4_0)
QACT_TILE_ENTRY(t2_q4_1, pk_tile_type, DT_Q4_1)
QACT_TILE_ENTRY(t2_q8_0, pk_tile_type, DT_Q8_0)
QACT_TILE_ENTRY(t2_q4_K, pk_tile_type, DT_Q4_K)
QACT_TILE_ENTRY(t2_q5_0, pk_tile_type, DT_Q5_0)
QACT_TILE_ENTRY(t2_q5_1, pk_tile_type, DT_Q5_1)
QACT_TILE_ENTRY(t2_q5_K, pk_tile_type, DT_Q5_K)
QACT_TILE_ENTRY(t2_q6_K, pk_tile_type, DT_Q6_K)
QACT_TILE_ENTRY(t2_mxfp4, pk_tile_type, DT_MXFP4)

qact_dot_tile_fn qpack_dot_tile_avx2(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return t2_q4_0;
    case DT_Q4_1: return t2_q4_1;
    case DT_Q8_0: return t2_q8_0;
    case DT_Q4_K: return t2_q4_K;
    case DT_Q5_0: return t2_q5_0;
    case DT_Q5_1: return t2_q5_1;
    case DT_Q5_K: return t2_q5_K;
    case DT_Q6_K: return t2_q6_K;
    case DT_MXFP4: return t2_mxfp4;
    default: return NULL;
    }
}

qact_dot_fn qpack_dot_avx2(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return p2_q4_0;
    case DT_Q4_1: return p2_q4_1;
    case DT_Q8_0: return p2_q8_0;
    case DT_Q4_K: return p2_q4_K;
    case DT_Q5_0: return p2_q5_0;
    case DT_Q5_1: return p2_q5_1;
    case DT_Q5_K: return p2_q5_K;
    case DT_Q6_K: return p2_q6_K;
    case DT_MXFP4: return p2_mxfp4;
    default: return NULL;
    }
}

qact_dot_rows_fn qpack_dot_rows_avx2(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return r2_q4_0;
    case DT_Q4_1: return r2_q4_1;
    case DT_Q8_0: return r2_q8_0;
    case DT_Q4_K: return r2_q4_K;
    case DT_Q5_0: return r2_q5_0;
    case DT_Q5_1: return r2_q5_1;
    case DT_Q5_K: return r2_q5_K;
    case DT_Q6_K: return r2_q6_K;
    case DT_MXFP4: return r2_mxfp4;
    default: return NULL;
    }
}
