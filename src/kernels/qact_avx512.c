/* qact_avx512.c - AVX-512 VNNI activation quantizer and weight x qact dot
 * products, bitwise equal to qact_ref.c (specification in qact.h).
 *
 * Built with -mavx512*; reached through the table matmul.c fills when the
 * chosen ISA is AVX-512 (which requires VNNI).
 *
 * Scheme: the row is walked in groups of 16 chunks (512 values; the last
 * group's weights are copied into a zero-padded stack buffer, activation
 * rows are zero-padded by the quantizer).  Per chunk pair the weight codes
 * are unpacked to 64 unsigned bytes and VPDPBUSD'd against the int8
 * activations of up to QACT_MULTI_MAX tokens (unpacking is shared by the
 * tokens).  Three "combine" steps (pairwise lane sums, two permutes and an
 * add) turn the 8 pair vectors into one vector of 16 exact per-chunk
 * integer sums, lane = chunk within the group (after two steps the lanes
 * are 16-value halves, where q6_K applies its scales).  The f32 part then
 * runs lane-parallel in exactly the reference's order: lane c of the
 * accumulator is the reference's acc[c % 16].
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/qact.h"
#include "kernels/qact_avx512_common.h"
#include "kernels/quant_ref.h"

/* lanes (2i, 2i+1) of u -> lane i; of v -> lane 8+i */
AI __m512i combine(__m512i u, __m512i v)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
    return _mm512_add_epi32(_mm512_permutex2var_epi32(u, ie, v), _mm512_permutex2var_epi32(u, io, v));
}

void qact_quantize_avx512(const float *x, int64_t n, void *dst)
{
    const int64_t np = qact_padded(n);
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + np);
    int32_t *s32 = (int32_t *)((uint8_t *)dst + np + np / 8);
    int16_t *s16 = (int16_t *)((uint8_t *)dst + np + np / 4);
    const int64_t nc = n / QACT_CHUNK;
    for (int64_t c = 0; c < nc; c++) {
        const __m512 x0 = _mm512_loadu_ps(x + c * 32), x1 = _mm512_loadu_ps(x + c * 32 + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float dc = amax / 127.0f;
        const float id = dc != 0.0f ? 1.0f / dc : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, vid));
        const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, vid));
        _mm_storeu_si128((__m128i *)(qs + c * 32), _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128((__m128i *)(qs + c * 32 + 16), _mm512_cvtepi32_epi8(q1));
        const int h0 = _mm512_reduce_add_epi32(q0), h1 = _mm512_reduce_add_epi32(q1);
        d[c] = dc;
        s32[c] = h0 + h1;
        s16[2 * c] = (int16_t)h0;
        s16[2 * c + 1] = (int16_t)h1;
    }
    qact_pad_tail(dst, n);
}

/* ---- weight unpacking: chunk pair p (chunks 2p, 2p+1) of a group ---- */

/* [a, a, b, b] from two 16-byte rows, then low nibbles in 128-bit lanes
 * 0 and 2, high nibbles in 1 and 3: chunk layout of a legacy 4-bit block */
AI __m512i nib_pair(const uint8_t *a, const uint8_t *b)
{
    const __m512i x = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)a))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)b)), 1);
    const __m512i sh = _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4);
    return _mm512_and_si512(_mm512_srlv_epi64(x, sh), _mm512_set1_epi8(0x0F));
}

AI __m512i add16_where(__m512i x, __mmask64 k)
{
    return _mm512_mask_add_epi8(x, k, x, _mm512_set1_epi8(16));
}

AI __m512i unpack_legacy(uint32_t t, const uint8_t *wg, int p)
{
    const size_t bs = block_bytes(t);
    const uint8_t *b0 = wg + (size_t)(2 * p) * bs, *b1 = b0 + bs;
    uint32_t h0, h1;
    switch (t) {
    case DT_Q4_0: return nib_pair(b0 + 2, b1 + 2);
    case DT_Q4_1: return nib_pair(b0 + 4, b1 + 4);
    case DT_MXFP4: return mx_codes(nib_pair(b0 + 1, b1 + 1));
    case DT_Q5_0:
        memcpy(&h0, b0 + 2, 4), memcpy(&h1, b1 + 2, 4);
        return add16_where(nib_pair(b0 + 6, b1 + 6), _cvtu64_mask64(h0 | (uint64_t)h1 << 32));
    case DT_Q5_1:
        memcpy(&h0, b0 + 4, 4), memcpy(&h1, b1 + 4, 4);
        return add16_where(nib_pair(b0 + 8, b1 + 8), _cvtu64_mask64(h0 | (uint64_t)h1 << 32));
    default: { /* q8_0: signed codes + 128 */
        const __m512i x = _mm512_inserti64x4(
            _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b0 + 2))),
            _mm256_loadu_si256((const __m256i *)(b1 + 2)), 1);
        return _mm512_xor_si512(x, _mm512_set1_epi8((char)0x80));
    }
    }
}

/* [a, a] from one 32-byte row */
AI __m512i dup256(const uint8_t *a)
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)a);
    return _mm512_inserti64x4(_mm512_castsi256_si512(v), v, 1);
}

AI __m512i unpack_k(uint32_t t, const uint8_t *wg, int p)
{
    const int sb = p / 4, pj = p % 4; /* superblock, pair within it */
    const uint8_t *blk = wg + (size_t)sb * block_bytes(t);
    if (t == DT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)blk;
        const int h = pj / 2, k0 = 2 * (pj & 1);
        __m512i lo = _mm512_loadu_si512(b->ql + 64 * h);
        if (pj & 1)
            lo = _mm512_srli_epi16(lo, 4);
        lo = _mm512_and_si512(lo, _mm512_set1_epi8(0x0F));
        const __m512i sh = _mm512_inserti64x4(_mm512_set1_epi16((short)(2 * k0)),
                                              _mm256_set1_epi16((short)(2 * k0 + 2)), 1);
        __m512i hi = _mm512_and_si512(_mm512_srlv_epi16(dup256(b->qh + 32 * h), sh),
                                      _mm512_set1_epi8(3));
        return _mm512_or_si512(lo, _mm512_slli_epi16(hi, 4));
    }
    const uint8_t *qs = t == DT_Q4_K ? ((const block_q4_K *)blk)->qs : ((const block_q5_K *)blk)->qs;
    const __m512i sh = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    __m512i x = _mm512_and_si512(_mm512_srlv_epi64(dup256(qs + 32 * pj), sh), _mm512_set1_epi8(0x0F));
    if (t == DT_Q5_K) {
        const __m512i bm = _mm512_inserti64x4(_mm512_set1_epi8((char)(1 << (2 * pj))),
                                              _mm256_set1_epi8((char)(2 << (2 * pj))), 1);
        x = add16_where(x, _mm512_test_epi8_mask(dup256(((const block_q5_K *)blk)->qh), bm));
    }
    return x;
}

/* Per-group weight scales: A, B per chunk lane; for K types the integer
 * sub-block scales (sc, m) or q6_K's half scales (sc6[2]). */
typedef struct group_scales {
    __m512 A, B;
    __m512i sc, m, sc6[2];
} group_scales;

/* nv: valid blocks in the group (legacy: 1..16 blocks, K: 1..2
 * superblocks); blocks past nv are not read and score zero. */
AI group_scales load_scales(uint32_t t, const uint8_t *wg, int nv)
{
    group_scales s;
    s.sc = s.m = s.sc6[0] = s.sc6[1] = _mm512_setzero_si512();
    if (!is_k(t)) {
        const __m512i idx = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((int)block_bytes(t)));
        const __mmask16 km = (__mmask16)(nv >= 16 ? 0xFFFF : (1u << nv) - 1);
        const __m512i g = /* d | m << 16 (mxfp4: e | qs[0..2] << 8) */
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), km, idx, wg, 1);
        if (t == DT_MXFP4) {
            s.A = mx_scales(_mm512_and_si512(g, _mm512_set1_epi32(0xFF)));
            s.B = _mm512_setzero_ps();
            return s;
        }
        s.A = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g));
        s.B = t == DT_Q4_1 || t == DT_Q5_1
                  ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)))
                  : _mm512_setzero_ps();
        return s;
    }
    const size_t bs = nv > 1 ? block_bytes(t) : 0; /* one superblock: lanes 8-15 see
                                                     * zero sums, any finite scale */
    if (t == DT_Q6_K) {
        const block_q6_K *b0 = (const block_q6_K *)wg, *b1 = (const block_q6_K *)(wg + bs);
        s.A = _mm512_insertf32x8(_mm512_set1_ps(h2f(b0->d)),
                                 _mm256_set1_ps(h2f(b1->d)), 1);
        s.B = _mm512_setzero_ps();
        s.sc6[0] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b0->scales));
        s.sc6[1] = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b1->scales));
        return s;
    }
    /* q4_K / q5_K share d, dmin, scales at the same offsets */
    const block_q4_K *b0 = (const block_q4_K *)wg, *b1 = (const block_q4_K *)(wg + bs);
    uint32_t u0[4], u1[4];
    qact_k4_scales(b0->scales, u0);
    qact_k4_scales(b1->scales, u1);
    s.sc = _mm512_cvtepu8_epi32(_mm_setr_epi32((int)u0[0], (int)u0[1], (int)u1[0], (int)u1[1]));
    s.m = _mm512_cvtepu8_epi32(_mm_setr_epi32((int)u0[2], (int)u0[3], (int)u1[2], (int)u1[3]));
    s.A = _mm512_insertf32x8(_mm512_set1_ps(h2f(b0->d)),
                             _mm256_set1_ps(h2f(b1->d)), 1);
    s.B = _mm512_insertf32x8(_mm512_set1_ps(-h2f(b0->dmin)),
                             _mm256_set1_ps(-h2f(b1->dmin)), 1);
    return s;
}

AI __m512i unpack(uint32_t t, const uint8_t *wg, int p)
{
    return is_k(t) ? unpack_k(t, wg, p) : unpack_legacy(t, wg, p);
}

/* Per-chunk raw sums of group g for nt tokens: S[k] lane c = sum u*a of
 * chunk 16g+c (q6_K: already sum over halves of sc*(raw_h - 32*s16)). */
AI void group_raw(uint32_t t, const uint8_t *wg, const qact_view *xv, int64_t g, int nt,
                  int npairs, const group_scales *gs, __m512i S[NTM])
{
    __m512i R[NTM][2];
    #pragma GCC unroll 8
    for (int h = 0; h < 2; h++) {
        __m512i Q[NTM][2];
        #pragma GCC unroll 8
        for (int qd = 0; qd < 2; qd++) {
            __m512i P[NTM][2];
            #pragma GCC unroll 8
            for (int pp = 0; pp < 2; pp++) {
                const int p = 4 * h + 2 * qd + pp;
                if (p >= npairs) {
                    #pragma GCC unroll 8
                    for (int k = 0; k < nt; k++)
                        P[k][pp] = _mm512_setzero_si512();
                    continue;
                }
                const __m512i u = unpack(t, wg, p);
#pragma GCC unroll 4
                for (int k = 0; k < nt; k++)
                    P[k][pp] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), u,
                                                   _mm512_loadu_si512(xv[k].qs + g * QACT_GROUP + 64 * p));
            }
#pragma GCC unroll 4
            for (int k = 0; k < nt; k++)
                Q[k][qd] = combine(P[k][0], P[k][1]);
        }
#pragma GCC unroll 4
        for (int k = 0; k < nt; k++) {
            R[k][h] = combine(Q[k][0], Q[k][1]);
            if (t == DT_Q6_K) {
                const __m512i a16 = _mm512_cvtepi16_epi32(
                    _mm256_loadu_si256((const __m256i *)(xv[k].s16 + g * 32 + 16 * h)));
                R[k][h] = _mm512_mullo_epi32(gs->sc6[h], _mm512_sub_epi32(R[k][h], _mm512_slli_epi32(a16, 5)));
            }
        }
    }
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++)
        S[k] = combine(R[k][0], R[k][1]);
}

/* acc[k] += v_c for the 16 chunks of group g (reference order) */
AI void group_dot(uint32_t t, const uint8_t *wg, const qact_view *xv, int64_t g, int nt, int npairs,
               int nv, __m512 acc[NTM])
{
    const group_scales gs = load_scales(t, wg, nv);
    __m512i S[NTM] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                      _mm512_setzero_si512()};
    group_raw(t, wg, xv, g, nt, npairs, &gs, S);
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++) {
        const __m512i asum = _mm512_loadu_si512(xv[k].s32 + g * QACT_LANES);
        const __m512 da = _mm512_loadu_ps(xv[k].d + g * QACT_LANES);
        __m512i I = S[k], J = _mm512_setzero_si512();
        switch (t) {
        case DT_Q4_0: I = _mm512_sub_epi32(S[k], _mm512_slli_epi32(asum, 3)); break;
        case DT_Q5_0: I = _mm512_sub_epi32(S[k], _mm512_slli_epi32(asum, 4)); break;
        case DT_Q8_0: I = _mm512_sub_epi32(S[k], _mm512_slli_epi32(asum, 7)); break;
        case DT_MXFP4: I = _mm512_sub_epi32(S[k], _mm512_mullo_epi32(asum, _mm512_set1_epi32(12))); break;
        case DT_Q4_1:
        case DT_Q5_1: J = asum; break;
        case DT_Q4_K:
        case DT_Q5_K:
            I = _mm512_mullo_epi32(gs.sc, S[k]);
            J = _mm512_mullo_epi32(gs.m, asum);
            break;
        default: break;
        }
        const __m512 p = _mm512_mul_ps(_mm512_mul_ps(gs.A, da), _mm512_cvtepi32_ps(I));
        const __m512 q = _mm512_mul_ps(_mm512_mul_ps(gs.B, da), _mm512_cvtepi32_ps(J));
        acc[k] = _mm512_add_ps(acc[k], _mm512_add_ps(p, q));
    }
}

/* acc += the last, partial group's chunks (tc > 0 of them, stored layout,
 * also in packed rows). */
AI void tail_group(uint32_t t, const void *w, int64_t full, int tc, const qact_view *xv, int nt,
                   __m512 acc[NTM])
{
    const size_t gb = group_wbytes(t, QACT_LANES);
    /* Chunks past the row score +0 in every lane (zero activations,
     * finite or zero scales): the reference's sum.  An odd count would
     * read one block past the row: copy it to a zero-padded buffer. */
    const uint8_t *wt = (const uint8_t *)w + full * gb;
    _Alignas(64) uint8_t tail[QACT_LANES * sizeof(block_q8_0) + 64];
    if (tc % 2) {
        memset(tail, 0, sizeof tail);
        memcpy(tail, wt, group_wbytes(t, tc));
        wt = tail;
    }
    group_dot(t, wt, xv, full, nt, (tc + 1) / 2, is_k(t) ? tc / 8 : tc, acc);
}

AI void dot_type(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    qact_view xv[NTM];
    __m512 acc[NTM];
    acc_begin(xq, xs, n, nt, xv, acc);
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    for (int64_t g = 0; g < full; g++) {
        qact_prefetch_w((const uint8_t *)w + g * gb, gb, qact_pf_level(nt == 1),
                        QACT_PREFETCH);
        group_dot(t, (const uint8_t *)w + g * gb, xv, g, nt, 8, is_k(t) ? 2 : 16, acc);
    }
    const int tc = (int)(nc % QACT_LANES); /* chunks in the last, partial group */
    if (tc)
        tail_group(t, w, full, tc, xv, nt, acc);
    acc_end(acc, nt, out);
}

QACT_NT_ENTRY(vq_q4_0, dot_type, DT_Q4_0)
QACT_NT_ENTRY(vq_q4_1, dot_type, DT_Q4_1)
QACT_NT_ENTRY(vq_q5_0, dot_type, DT_Q5_0)
QACT_NT_ENTRY(vq_q5_1, dot_type, DT_Q5_1)
QACT_NT_ENTRY(vq_q8_0, dot_type, DT_Q8_0)
QACT_NT_ENTRY(vq_q4_K, dot_type, DT_Q4_K)
QACT_NT_ENTRY(vq_q5_K, dot_type, DT_Q5_K)
QACT_NT_ENTRY(vq_q6_K, dot_type, DT_Q6_K)
QACT_NT_ENTRY(vq_mxfp4, dot_type, DT_MXFP4)

qact_dot_fn qact_dot_avx512(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return vq_q4_0;
    case DT_Q4_1: return vq_q4_1;
    case DT_Q5_0: return vq_q5_0;
    case DT_Q5_1: return vq_q5_1;
    case DT_Q8_0: return vq_q8_0;
    case DT_Q4_K: return vq_q4_K;
    case DT_Q5_K: return vq_q5_K;
    case DT_Q6_K: return vq_q6_K;
    case DT_MXFP4: return vq_mxfp4;
    default: return NULL;
    }
}
