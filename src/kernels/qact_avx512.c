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
#include "kernels/qpack.h"
#include "kernels/quant_ref.h"

#define AI static inline __attribute__((always_inline))

/* One f16 to f32 with F16C (exact, as half_fp16_to_f32, without the call). */
AI float h2f(half_fp16 h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#define NTM QACT_MULTI_MAX

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

static size_t block_bytes(uint32_t t)
{
    switch (t) {
    case DT_Q4_0: return sizeof(block_q4_0);
    case DT_Q4_1: return sizeof(block_q4_1);
    case DT_Q5_0: return sizeof(block_q5_0);
    case DT_Q5_1: return sizeof(block_q5_1);
    case DT_Q8_0: return sizeof(block_q8_0);
    case DT_MXFP4: return sizeof(block_mxfp4);
    case DT_Q4_K: return sizeof(block_q4_K);
    case DT_Q5_K: return sizeof(block_q5_K);
    default: return sizeof(block_q6_K);
    }
}

AI int is_k(uint32_t t)
{
    return t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K;
}

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

/* mxfp4: codes (bytes 0..15) -> u = table value + 12, in 0..24 (qact_ref.c) */
AI __m512i mx_codes(__m512i codes)
{
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)dt_mxfp4_values));
    return _mm512_add_epi8(_mm512_shuffle_epi8(v, codes), _mm512_set1_epi8(12));
}

/* mxfp4: sixteen E8M0 bytes (as int32 lanes) -> 2^(e-128) (dt_e8m0_half_bits) */
AI __m512 mx_scales(__m512i e)
{
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i big = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
    const __m512i small = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e, one), small, big));
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

/* Bytes of weights per 16-chunk group, and for the last partial group. */
AI size_t group_wbytes(uint32_t t, int64_t chunks)
{
    return is_k(t) ? (size_t)(chunks / 8) * block_bytes(t) : (size_t)chunks * block_bytes(t);
}

#define QACT_PREFETCH 2048 /* bytes ahead of the weights being dotted */

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

/* xv[k] = the view of token k's qact row (xq + k xs), acc[k] = 0, k < nt. */
AI void acc_begin(const void *xq, size_t xs, int64_t n, int nt, qact_view xv[NTM],
                  __m512 acc[NTM])
{
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        xv[k] = qact_view_of((const uint8_t *)xq + (size_t)k * xs, n);
        acc[k] = _mm512_setzero_ps();
    }
}

/* out[k] = qact_reduce16(acc[k]), k < nt. */
AI void acc_end(const __m512 acc[NTM], int nt, float *out)
{
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        float a[QACT_LANES];
        _mm512_storeu_ps(a, acc[k]);
        out[k] = qact_reduce16(a);
    }
}

AI void dot_type(uint32_t t, int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    qact_view xv[NTM];
    __m512 acc[NTM];
    acc_begin(xq, xs, n, nt, xv, acc);
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    for (int64_t g = 0; g < full; g++) {
        /* software prefetch: see KQ_PREFETCH in quant_avx512.c */
        for (size_t o = 0; o < gb; o += 64)
            _mm_prefetch((const char *)w + g * gb + QACT_PREFETCH + o, _MM_HINT_T0);
        group_dot(t, (const uint8_t *)w + g * gb, xv, g, nt, 8, is_k(t) ? 2 : 16, acc);
    }
    const int tc = (int)(nc % QACT_LANES); /* chunks in the last, partial group */
    if (tc)
        tail_group(t, w, full, tc, xv, nt, acc);
    acc_end(acc, nt, out);
}

/* ---- packed rows (kernels/qpack.h) ----
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

/* S0[k], S1[k] lane c: chunk c's sums for token k; q6_K: S0 over values
 * 0-15 (vectors 0-1), S1 over 16-31, for the half scales. */
AI void pk_sums(uint32_t t, const uint8_t *qs, const uint8_t *qx, int tc,
                const int8_t *const ag[NTM], int nt, __m512i S0[NTM], __m512i S1[NTM])
{
    const int L = 4 * tc;
    if (t == DT_Q8_0) {
        const __m512i bias = _mm512_set1_epi8((char)0x80);
#pragma GCC unroll 8
        for (int r = 0; r < 8; r += 2) {
            const __m512i u0 = _mm512_xor_si512(pk_load(qs + L * r, tc), bias);
            const __m512i u1 = _mm512_xor_si512(pk_load(qs + L * r + L, tc), bias);
#pragma GCC unroll 8
            for (int k = 0; k < nt; k++) {
                S0[k] = _mm512_dpbusd_epi32(S0[k], u0, _mm512_loadu_si512(ag[k] + 64 * r));
                S1[k] = _mm512_dpbusd_epi32(S1[k], u1, _mm512_loadu_si512(ag[k] + 64 * r + 64));
            }
        }
        return;
    }
    const int wide = t == DT_Q5_0 || t == DT_Q5_1 || t == DT_Q5_K || t == DT_Q6_K;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i q5 = wide && t != DT_Q6_K ? pk_load(qx, tc) : _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int i = 0; i < 4; i++) {
        const __m512i v = pk_load(qs + L * i, tc);
        __m512i lo, hi;
        if (wide) {
            pk_wide_codes(t, v, t == DT_Q6_K ? pk_load(qx + L * (i / 2), tc) : q5, i, &lo, &hi);
        } else {
            lo = _mm512_and_si512(v, lo4);
            hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
        }
        if (t == DT_MXFP4) {
            lo = mx_codes(lo);
            hi = mx_codes(hi);
        }
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

/* K types: the group's super-block scales (one super-block when tc == 8:
 * lanes 8-15 score zero sums with its finite scales). */
typedef struct pk_kscales {
    __m512 A, B;
    __m512i sc, mn;       /* q4_K, q5_K */
    __m512i e6, sc0, sc1; /* q6_K: the 32 int8 scales as int16; per lane s0, s1 */
} pk_kscales;

AI pk_kscales pk_k_scales(uint32_t t, const uint8_t *wg, int tc)
{
    pk_kscales r;
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

AI void pk_group(uint32_t t, const uint8_t *wg, int tc, const qact_view *xv, int64_t g, int nt,
                 __m512 acc[NTM])
{
    const int kq = t == DT_Q4_K || t == DT_Q5_K || t == DT_Q6_K;
    const int has_m = t == DT_Q4_1 || t == DT_Q5_1;
    __m512i S0[NTM], S1[NTM];
    const int8_t *ag[NTM];
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        S0[k] = S1[k] = _mm512_setzero_si512();
        ag[k] = xv[k].qs + g * QACT_GROUP;
    }
    pk_sums(t, wg + qpack_qs_off(t, tc), wg + qpack_qx_off(t, tc), tc, ag, nt, S0, S1);
    pk_kscales ks;
    if (kq) {
        ks = pk_k_scales(t, wg, tc);
    } else if (t == DT_MXFP4) { /* e[tc] */
        const __m128i e = tc == QACT_LANES ? _mm_loadu_si128((const __m128i *)wg)
                                           : _mm_maskz_loadu_epi8((__mmask16)((1u << tc) - 1), wg);
        ks.A = mx_scales(_mm512_cvtepu8_epi32(e));
        ks.B = _mm512_setzero_ps();
    } else {
        ks.A = pk_halfs(wg, tc);
        ks.B = has_m ? pk_halfs(wg + 2 * tc, tc) : _mm512_setzero_ps();
    }
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        const __m512i asum = _mm512_loadu_si512(xv[k].s32 + g * QACT_LANES);
        const __m512 da = _mm512_loadu_ps(xv[k].d + g * QACT_LANES);
        __m512i I = _mm512_add_epi32(S0[k], S1[k]);
        if (t == DT_Q4_K || t == DT_Q5_K) {
            I = _mm512_mullo_epi32(ks.sc, I);
            const __m512i J = _mm512_mullo_epi32(ks.mn, asum);
            acc[k] = _mm512_add_ps(
                acc[k], _mm512_add_ps(_mm512_mul_ps(_mm512_mul_ps(ks.A, da), _mm512_cvtepi32_ps(I)),
                                      _mm512_mul_ps(_mm512_mul_ps(ks.B, da), _mm512_cvtepi32_ps(J))));
            continue;
        }
        if (t == DT_Q4_0)
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 3));
        else if (t == DT_Q5_0)
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 4));
        else if (t == DT_Q8_0)
            I = _mm512_sub_epi32(I, _mm512_slli_epi32(asum, 7));
        else if (t == DT_MXFP4)
            I = _mm512_sub_epi32(I, _mm512_mullo_epi32(asum, _mm512_set1_epi32(12)));
        else if (t == DT_Q6_K) {
            const __m512i s16 = _mm512_loadu_si512(xv[k].s16 + 2 * g * QACT_LANES);
            I = _mm512_sub_epi32(
                _mm512_add_epi32(_mm512_mullo_epi32(ks.sc0, S0[k]), _mm512_mullo_epi32(ks.sc1, S1[k])),
                _mm512_slli_epi32(_mm512_madd_epi16(s16, ks.e6), 5));
        }
        __m512 v = _mm512_mul_ps(_mm512_mul_ps(ks.A, da), _mm512_cvtepi32_ps(I));
        /* q4_0, q5_0, q8_0, q6_K, mxfp4: the reference's second term is +0, and
         * adding +0 to v and then to acc (never -0) changes nothing */
        if (has_m)
            v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_mul_ps(ks.B, da), _mm512_cvtepi32_ps(asum)));
        acc[k] = _mm512_add_ps(acc[k], v);
    }
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

/* acc[k] (zeroed by the caller) += every group's v of packed row w for the
 * nt tokens xv. */
AI void pk_row_acc(uint32_t t, int64_t n, const void *w, const qact_view *xv, int nt,
                   __m512 acc[NTM])
{
    const int64_t nc = n / QACT_CHUNK, full = nc / QACT_LANES;
    const size_t gb = group_wbytes(t, QACT_LANES);
    for (int64_t g = 0; g < full; g++) {
        for (size_t o = 0; o < gb; o += 64)
            _mm_prefetch((const char *)w + g * gb + QACT_PREFETCH + o, _MM_HINT_T0);
        pk_group(t, (const uint8_t *)w + g * gb, QACT_LANES, xv, g, nt, acc);
    }
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
    pk_row_acc(t, n, w, xv, nt, acc);
    acc_end(acc, nt, out);
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
    int64_t r = 0;
    for (; r + 4 <= n_rows; r += 4) {
        __m128 x4[4];
#pragma GCC unroll 1
        for (int j = 0; j < 4; j++) {
            __m512 acc[NTM];
            acc[0] = _mm512_setzero_ps();
            pk_row_acc(t, n, (const uint8_t *)w + (size_t)(r + j) * rs, xv, 1, acc);
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

QACT_NT_ENTRY(vq_q4_0, dot_type, DT_Q4_0)
QACT_NT_ENTRY(vq_q4_1, dot_type, DT_Q4_1)
QACT_NT_ENTRY(vq_q5_0, dot_type, DT_Q5_0)
QACT_NT_ENTRY(vq_q5_1, dot_type, DT_Q5_1)
QACT_NT_ENTRY(vq_q8_0, dot_type, DT_Q8_0)
QACT_NT_ENTRY(vq_q4_K, dot_type, DT_Q4_K)
QACT_NT_ENTRY(vq_q5_K, dot_type, DT_Q5_K)
QACT_NT_ENTRY(vq_q6_K, dot_type, DT_Q6_K)
QACT_NT_ENTRY(vq_mxfp4, dot_type, DT_MXFP4)
QACT_NT_ENTRY(p5_q4_0, pk_dot_type, DT_Q4_0)
QACT_NT_ENTRY(p5_q4_1, pk_dot_type, DT_Q4_1)
QACT_NT_ENTRY(p5_q8_0, pk_dot_type, DT_Q8_0)
QACT_NT_ENTRY(p5_q4_K, pk_dot_type, DT_Q4_K)
QACT_NT_ENTRY(p5_q5_0, pk_dot_type, DT_Q5_0)
QACT_NT_ENTRY(p5_q5_1, pk_dot_type, DT_Q5_1)
QACT_NT_ENTRY(p5_q5_K, pk_dot_type, DT_Q5_K)
QACT_NT_ENTRY(p5_q6_K, pk_dot_type, DT_Q6_K)
QACT_NT_ENTRY(p5_mxfp4, pk_dot_type, DT_MXFP4)

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
