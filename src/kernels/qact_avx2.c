/* qact_avx2.c - AVX2 activation quantizer and weight x qact dot products,
 * bitwise equal to qact_ref.c (specification in qact.h).
 *
 * Built with -mavx2 -mfma -mf16c; reached through the table matmul.c fills
 * when the chosen ISA is AVX2.  Compiled under -std=c11, so GCC does not
 * contract the explicit multiplies and adds below into FMAs (the
 * reference order).
 *
 * Scheme: a row is walked in groups of 16 chunks (the reference's 16
 * accumulator lanes), each as two halves of 8 chunks held in one __m256
 * accumulator.  Per chunk the weight codes are unpacked once to 32
 * unsigned bytes and multiplied against the int8 activations of up to
 * QACT_MULTI_MAX tokens with VPMADDUBSW + VPMADDWD (u8 x s8 pairs into
 * int16, which cannot saturate for codes < 64; q8_0 uses |w| and
 * sign(a, w) instead of w + 128 so its pairs stay below 2^15, and so does
 * mxfp4 with its table values w = v[q], |w| <= 12: I = sum w*a directly).  Three
 * VPHADDD levels and one cross-lane add turn eight chunks' partial sums
 * into one vector of eight exact int32 chunk sums; q6_K weights each
 * 16-value half by its scale in the VPMADDWD step.  The integer identities
 * used (sum q*a = sum (q+128)*a - 128*asum; sc0*(r0-32*s0) + sc1*(r1-32*s1)
 * = sc0*r0 + sc1*r1 - 32*(sc0*s0 + sc1*s1)) are exact, so every chunk's
 * I and J equal the reference's, and the float part runs lane-parallel in
 * the reference's order.
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/qact.h"
#include "kernels/qact_avx2_common.h"
#include "kernels/quant_ref.h"

void qact_quantize_avx2(const float *x, int64_t n, void *dst)
{
    const int64_t np = qact_padded(n);
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + np);
    int32_t *s32 = (int32_t *)((uint8_t *)dst + np + np / 8);
    int16_t *s16 = (int16_t *)((uint8_t *)dst + np + np / 4);
    const int64_t nc = n / QACT_CHUNK;
    const __m256 absm = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256i perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t c = 0; c < nc; c++) {
        const float *xc = x + c * 32;
        __m256 v[4];
        #pragma GCC unroll 8
        for (int i = 0; i < 4; i++)
            v[i] = _mm256_loadu_ps(xc + 8 * i);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_and_ps(v[0], absm), _mm256_and_ps(v[1], absm)),
                                 _mm256_max_ps(_mm256_and_ps(v[2], absm), _mm256_and_ps(v[3], absm)));
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        const float amax = _mm_cvtss_f32(m4);
        const float dc = amax / 127.0f;
        const float id = dc != 0.0f ? 1.0f / dc : 0.0f;
        const __m256 vid = _mm256_set1_ps(id);
        __m256i q[4];
        #pragma GCC unroll 8
        for (int i = 0; i < 4; i++)
            q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], vid));
        /* |q| <= 127: the saturating packs are exact */
        const __m256i p01 = _mm256_packs_epi32(q[0], q[1]), p23 = _mm256_packs_epi32(q[2], q[3]);
        const __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        _mm256_storeu_si256((__m256i *)(qs + c * 32), b);
        const __m256i h0 = _mm256_add_epi32(q[0], q[1]), h1 = _mm256_add_epi32(q[2], q[3]);
        const __m256i hh = _mm256_hadd_epi32(h0, h1); /* [h0 h0 h1 h1 | h0 h0 h1 h1] pairs */
        const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(hh), _mm256_extracti128_si256(hh, 1));
        const int sh0 = _mm_extract_epi32(s, 0) + _mm_extract_epi32(s, 1);
        const int sh1 = _mm_extract_epi32(s, 2) + _mm_extract_epi32(s, 3);
        d[c] = dc;
        s32[c] = sh0 + sh1;
        s16[2 * c] = (int16_t)sh0;
        s16[2 * c + 1] = (int16_t)sh1;
    }
    qact_pad_tail(dst, n);
}

/* ---- weight unpacking: chunk c of a row -> 32 codes in value order ---- */

AI int is_k(uint32_t t)
{
    return t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K;
}

/* 16 bytes of nibbles: low nibbles are values 0..15, high 16..31 */
AI __m256i nib32(const uint8_t *qs)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(x, 4), x), _mm256_set1_epi8(0x0F));
}

/* byte i = 0x10 where bit i of qh is set */
AI __m256i bit4_from_bits32(uint32_t qh)
{
    const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i sel = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i b = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), rep), sel);
    return _mm256_and_si256(_mm256_cmpeq_epi8(b, sel), _mm256_set1_epi8(0x10));
}

AI __m256i unpack_legacy(uint32_t t, const uint8_t *w, int64_t c)
{
    uint32_t qh;
    switch (t) {
    case DT_Q4_0: return nib32(((const block_q4_0 *)w + c)->qs);
    case DT_Q4_1: return nib32(((const block_q4_1 *)w + c)->qs);
    case DT_Q5_0: {
        const block_q5_0 *b = (const block_q5_0 *)w + c;
        memcpy(&qh, b->qh, 4);
        return _mm256_or_si256(nib32(b->qs), bit4_from_bits32(qh));
    }
    case DT_Q5_1: {
        const block_q5_1 *b = (const block_q5_1 *)w + c;
        memcpy(&qh, b->qh, 4);
        return _mm256_or_si256(nib32(b->qs), bit4_from_bits32(qh));
    }
    case DT_MXFP4: return mx_values(nib32(((const block_mxfp4 *)w + c)->qs));
    default: /* q8_0: the signed codes (see the file comment) */
        return _mm256_loadu_si256((const __m256i *)((const block_q8_0 *)w + c)->qs);
    }
}

AI __m256i unpack_k(uint32_t t, const uint8_t *w, int64_t c)
{
    const int j = (int)(c % 8);
    const __m256i lo4 = _mm256_set1_epi8(0x0F);
    if (t == DT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)w + c / 8;
        const int h = j / 4, k = j % 4;
        __m256i lo = _mm256_loadu_si256((const __m256i *)(b->ql + 64 * h + (k & 1) * 32));
        if (k >= 2)
            lo = _mm256_srli_epi16(lo, 4);
        lo = _mm256_and_si256(lo, lo4);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(b->qh + 32 * h));
        const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)),
                                            _mm256_set1_epi8(3));
        return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
    }
    /* q4_K and q5_K share the scales and qs offsets */
    const uint8_t *blk = t == DT_Q4_K ? (const uint8_t *)((const block_q4_K *)w + c / 8)
                                      : (const uint8_t *)((const block_q5_K *)w + c / 8);
    const uint8_t *qs = t == DT_Q4_K ? ((const block_q4_K *)blk)->qs : ((const block_q5_K *)blk)->qs;
    __m256i x = _mm256_loadu_si256((const __m256i *)(qs + 32 * (j / 2)));
    if (j & 1)
        x = _mm256_srli_epi16(x, 4);
    x = _mm256_and_si256(x, lo4);
    if (t == DT_Q5_K) {
        const __m256i m = _mm256_set1_epi8((char)(1 << j));
        const __m256i qh = _mm256_loadu_si256((const __m256i *)((const block_q5_K *)blk)->qh);
        const __m256i on = _mm256_cmpeq_epi8(_mm256_and_si256(qh, m), m);
        x = _mm256_or_si256(x, _mm256_and_si256(on, _mm256_set1_epi8(0x10)));
    }
    return x;
}

/* Eight int32 partial sums of one chunk against activations a. */
AI __m256i chunk_dot(uint32_t t, __m256i u, const int8_t *ap, __m256i w16)
{
    const __m256i a = _mm256_loadu_si256((const __m256i *)ap);
    if (t == DT_Q8_0 || t == DT_MXFP4)
        return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(u), _mm256_sign_epi8(a, u)), w16);
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), w16);
}

/* S[k] lane i = the exact integer sum of chunk c0+i (i < nvalid, else 0)
 * for token k; q6_K: sc0*r0 + sc1*r1 of its halves. */
AI void half_sums(uint32_t t, const uint8_t *w, int64_t c0, int nvalid, const qact_view *xv,
                  int nt, __m256i S[NTM])
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i Qv[NTM][2];
    #pragma GCC unroll 8
    for (int q = 0; q < 2; q++) {
        __m256i Pr[NTM][2];
        #pragma GCC unroll 8
        for (int pp = 0; pp < 2; pp++) {
            __m256i P[NTM][2];
            #pragma GCC unroll 8
            for (int e = 0; e < 2; e++) {
                const int ci = 4 * q + 2 * pp + e;
                if (ci >= nvalid) {
                    #pragma GCC unroll 8
                    for (int k = 0; k < nt; k++)
                        P[k][e] = _mm256_setzero_si256();
                    continue;
                }
                const int64_t c = c0 + ci;
                const __m256i u = is_k(t) ? unpack_k(t, w, c) : unpack_legacy(t, w, c);
                __m256i w16 = ones;
                if (t == DT_Q6_K) {
                    const int8_t *sc = ((const block_q6_K *)w + c / 8)->scales + 2 * (c % 8);
                    w16 = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
                }
#pragma GCC unroll 4
                for (int k = 0; k < nt; k++)
                    P[k][e] = chunk_dot(t, u, xv[k].qs + c * QACT_CHUNK, w16);
            }
#pragma GCC unroll 4
            for (int k = 0; k < nt; k++)
                Pr[k][pp] = _mm256_hadd_epi32(P[k][0], P[k][1]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < nt; k++)
            Qv[k][q] = _mm256_hadd_epi32(Pr[k][0], Pr[k][1]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++)
        S[k] = _mm256_add_epi32(_mm256_permute2x128_si256(Qv[k][0], Qv[k][1], 0x20),
                                _mm256_permute2x128_si256(Qv[k][0], Qv[k][1], 0x31));
}


/* acc[k] += v_c for chunks c0 .. c0+7 (nvalid of them exist). */
AI void half_dot(uint32_t t, const uint8_t *w, int64_t c0, int nvalid, const qact_view *xv, int nt,
                 __m256 acc[NTM])
{
    __m256i S[NTM] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256()};
    half_sums(t, w, c0, nvalid, xv, nt, S);
    __m256 A, B = _mm256_setzero_ps();
    __m256i sc = _mm256_setzero_si256(), mn = _mm256_setzero_si256(), sc6 = sc;
    if (is_k(t)) {
        const uint8_t *blk = w + (size_t)(c0 / 8) * (t == DT_Q6_K ? sizeof(block_q6_K)
                                                     : t == DT_Q5_K ? sizeof(block_q5_K)
                                                                    : sizeof(block_q4_K));
        if (t == DT_Q6_K) {
            const block_q6_K *b = (const block_q6_K *)blk;
            A = _mm256_set1_ps(h2f(b->d));
            sc6 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)b->scales));
        } else {
            const block_q4_K *b = (const block_q4_K *)blk; /* same header for q5_K */
            uint32_t u[4];
            qact_k4_scales(b->scales, u);
            sc = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)u[0], (int)u[1], 0, 0));
            mn = _mm256_cvtepu8_epi32(_mm_setr_epi32((int)u[2], (int)u[3], 0, 0));
            A = _mm256_set1_ps(h2f(b->d));
            B = _mm256_set1_ps(-h2f(b->dmin));
        }
    } else if (t == DT_MXFP4) {
        _Alignas(32) uint32_t eb[8] = {0};
        #pragma GCC unroll 8
        for (int i = 0; i < nvalid; i++)
            eb[i] = ((const block_mxfp4 *)w + c0 + i)->e;
        A = mx_scales(_mm256_load_si256((const __m256i *)eb));
    } else {
        const size_t bs = t == DT_Q4_0 ? sizeof(block_q4_0) : t == DT_Q4_1 ? sizeof(block_q4_1)
                        : t == DT_Q5_0 ? sizeof(block_q5_0) : t == DT_Q5_1 ? sizeof(block_q5_1)
                                                                            : sizeof(block_q8_0);
        const int has_m = t == DT_Q4_1 || t == DT_Q5_1;
        _Alignas(16) uint16_t dh[8] = {0}, mh[8] = {0};
        #pragma GCC unroll 8
        for (int i = 0; i < nvalid; i++) {
            const uint8_t *b = w + (size_t)(c0 + i) * bs;
            memcpy(&dh[i], b, 2);
            if (has_m)
                memcpy(&mh[i], b + 2, 2);
        }
        A = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)dh));
        if (has_m)
            B = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)mh));
    }
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++) {
        const __m256i asum = _mm256_loadu_si256((const __m256i *)(xv[k].s32 + c0));
        const __m256 da = _mm256_loadu_ps(xv[k].d + c0);
        __m256i I = S[k], J = _mm256_setzero_si256();
        switch (t) {
        case DT_Q4_0: I = _mm256_sub_epi32(S[k], _mm256_slli_epi32(asum, 3)); break;
        case DT_Q5_0: I = _mm256_sub_epi32(S[k], _mm256_slli_epi32(asum, 4)); break;
        case DT_Q4_1:
        case DT_Q5_1: J = asum; break;
        case DT_Q4_K:
        case DT_Q5_K:
            I = _mm256_mullo_epi32(sc, S[k]);
            J = _mm256_mullo_epi32(mn, asum);
            break;
        case DT_Q6_K: {
            const __m256i s16 = _mm256_loadu_si256((const __m256i *)(xv[k].s16 + 2 * c0));
            I = _mm256_sub_epi32(S[k], _mm256_slli_epi32(_mm256_madd_epi16(s16, sc6), 5));
            break;
        }
        default: break; /* q8_0, mxfp4: S is already sum q*a */
        }
        const __m256 p = _mm256_mul_ps(_mm256_mul_ps(A, da), _mm256_cvtepi32_ps(I));
        const __m256 q = _mm256_mul_ps(_mm256_mul_ps(B, da), _mm256_cvtepi32_ps(J));
        acc[k] = _mm256_add_ps(acc[k], _mm256_add_ps(p, q));
    }
}

/* acc[k][c0/8 % 2] += v_c for the chunks of the last, partial group
 * [c0, nc), in the stored layout (packed rows keep it there too). */
AI void tail_dot(uint32_t t, const uint8_t *wb, int64_t c0, int64_t nc, const qact_view *xv,
                 int nt, __m256 acc[NTM][2])
{
    for (; c0 < nc; c0 += 8) {
        const int nvalid = (int)(nc - c0 < 8 ? nc - c0 : 8);
        __m256 a[NTM];
        const int h = (int)((c0 / 8) & 1);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            a[k] = acc[k][h];
        half_dot(t, wb, c0, nvalid, xv, nt, a);
#pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            acc[k][h] = a[k];
    }
}

AI void dot_type(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    qact_view xv[NTM];
    __m256 acc[NTM][2];
    acc_begin(xq, xs, n, nt, xv, acc);
    const uint8_t *wb = w;
    const int64_t nc = n / QACT_CHUNK;
    const size_t cb = chunk_wbytes(t);
    /* full 16-chunk groups: both halves with constant lane and count */
    int64_t c0 = 0;
    for (; c0 + 16 <= nc; c0 += 16) {
        qact_prefetch_w(wb + c0 * cb, 16 * cb, qact_pf_level(nt == 1), QACT2_PREFETCH);
        __m256 a0[NTM], a1[NTM];
        #pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            a0[k] = acc[k][0];
            a1[k] = acc[k][1];
        }
        half_dot(t, wb, c0, 8, xv, nt, a0);
        half_dot(t, wb, c0 + 8, 8, xv, nt, a1);
        #pragma GCC unroll 8
        for (int k = 0; k < nt; k++) {
            acc[k][0] = a0[k];
            acc[k][1] = a1[k];
        }
    }
    tail_dot(t, wb, c0, nc, xv, nt, acc);
    acc_end(acc, nt, out);
}

QACT_NT_ENTRY(v2_q4_0, dot_type, DT_Q4_0)
QACT_NT_ENTRY(v2_q4_1, dot_type, DT_Q4_1)
QACT_NT_ENTRY(v2_q5_0, dot_type, DT_Q5_0)
QACT_NT_ENTRY(v2_q5_1, dot_type, DT_Q5_1)
QACT_NT_ENTRY(v2_q8_0, dot_type, DT_Q8_0)
QACT_NT_ENTRY(v2_q4_K, dot_type, DT_Q4_K)
QACT_NT_ENTRY(v2_q5_K, dot_type, DT_Q5_K)
QACT_NT_ENTRY(v2_q6_K, dot_type, DT_Q6_K)
QACT_NT_ENTRY(v2_mxfp4, dot_type, DT_MXFP4)

qact_dot_fn qact_dot_avx2(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return v2_q4_0;
    case DT_Q4_1: return v2_q4_1;
    case DT_Q5_0: return v2_q5_0;
    case DT_Q5_1: return v2_q5_1;
    case DT_Q8_0: return v2_q8_0;
    case DT_Q4_K: return v2_q4_K;
    case DT_Q5_K: return v2_q5_K;
    case DT_Q6_K: return v2_q6_K;
    case DT_MXFP4: return v2_mxfp4;
    default: return NULL;
    }
}
