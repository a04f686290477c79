/* quant_avx512.c - AVX-512 (F, BW, VL, DQ) to_float and vec_dot kernels.
 *
 * Built with -mavx512*; only reached through quant_avx512_table(), which
 * dtype.c calls after checking the CPU.  Each kernel's scalar twin is in
 * quant_ref.c; test_dtype checks to_float bitwise and vec_dot to 1e-5.
 *
 * Scheme: a block (or 32-element piece of a K block) is dequantized in
 * registers into two 16-float vectors, then FMA'd against x into two
 * accumulators per token.  4-bit codes become floats with one vpermps from
 * a 16-entry table of (code * scale [+ min]) built once per (sub-)block;
 * 5-bit types pick the upper table with a mask taken straight from qh.
 * The tables are computed with the same f32 operations, in the same order,
 * as the reference, so to_float is bit-exact.
 *
 * Batch invariance: dot_<type>(.., nt, ..) runs the same operation sequence
 * for every token k < nt; vd_<type> is the nt = 1 instance, vdm_<type> the
 * multi-token ones, so out[k] is bitwise vd_<type>(x_k).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/quant_ref.h"

#define AI static inline __attribute__((always_inline))
#define NTM QK_MULTI_MAX

static const float k_iota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

AI float h2f(half_fp16 h)
{
    return _cvtsh_ss(h);
}

AI __m512i load_u8x16(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

/* Four accumulators per token (two independent FMA chains per 32
 * elements, slots 0-1 and 2-3) hide the FMA latency.  The k loops are
 * fully unrolled so acc[][] lives in registers. */
AI void acc_zero(int nt, __m512 acc[NTM][4])
{
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++)
        acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = _mm512_setzero_ps();
}

/* acc[k][slot..slot+1] += (w0, w1) * x_k[0..31] */
AI void fma32(int nt, __m512 acc[NTM][4], int slot, __m512 w0, __m512 w1, const float *x, int64_t xs)
{
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++) {
        acc[k][slot] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + k * xs), acc[k][slot]);
        acc[k][slot + 1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + k * xs + 16), acc[k][slot + 1]);
    }
}

AI void acc_finish(int nt, __m512 acc[NTM][4], float *out)
{
#pragma GCC unroll 4
    for (int k = 0; k < nt; k++) {
        const __m512 s = _mm512_add_ps(_mm512_add_ps(acc[k][0], acc[k][2]),
                                       _mm512_add_ps(acc[k][1], acc[k][3]));
        out[k] = _mm512_reduce_add_ps(s);
    }
}

/* ---------------- f32 / f16 / bf16 ---------------- */

/* Plain types: 32 elements per step, then a masked tail. */
typedef enum { PL_F32, PL_F16, PL_BF16 } plain_kind;

AI __m512 plain_load(plain_kind kind, const void *w, int64_t i, __mmask16 m)
{
    switch (kind) {
    case PL_F32:
        return _mm512_maskz_loadu_ps(m, (const float *)w + i);
    case PL_F16:
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i));
    default:
        return _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w + i)), 16));
    }
}

AI void dot_plain(plain_kind kind, int64_t n, const void *w, const float *x, int64_t xs, int nt,
                  float *out)
{
    __m512 acc[NTM][4];
    acc_zero(nt, acc);
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        fma32(nt, acc, 0, plain_load(kind, w, i, 0xFFFF), plain_load(kind, w, i + 16, 0xFFFF), x + i, xs);
        fma32(nt, acc, 2, plain_load(kind, w, i + 32, 0xFFFF), plain_load(kind, w, i + 48, 0xFFFF),
              x + i + 32, xs);
    }
    for (; i < n; i += 16) { /* tail: 16 (or fewer, masked) at a time into slot 0 */
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 w0 = plain_load(kind, w, i, m);
#pragma GCC unroll 4
        for (int k = 0; k < nt; k++)
            acc[k][0] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m, x + k * xs + i), acc[k][0]);
    }
    acc_finish(nt, acc, out);
}

AI void to_float_plain(plain_kind kind, const void *w, float *dst, int64_t n)
{
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        _mm512_mask_storeu_ps(dst + i, m, plain_load(kind, w, i, m));
    }
}

/* ---------------- block-32 types ---------------- */

/* Each deq_* writes elements 0..15 to *w0 and 16..31 to *w1. */
AI void deq_q8_0(const block_q8_0 *b, __m512 *w0, __m512 *w1)
{
    const __m512 d = _mm512_set1_ps(h2f(b->d));
    const __m128i *q = (const __m128i *)b->qs;
    *w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q))), d);
    *w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q + 1))), d);
}

AI void deq_q4_0(const block_q4_0 *b, __m512 *w0, __m512 *w1)
{
    /* table[c] = (c - 8) * d, as the reference rounds it */
    const __m512 tbl = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(k_iota), _mm512_set1_ps(8)),
                                     _mm512_set1_ps(h2f(b->d)));
    const __m512i v = load_u8x16(b->qs);
    *w0 = _mm512_permutexvar_ps(v, tbl); /* vpermps reads index bits 0..3 only */
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
}

AI void deq_q4_1(const block_q4_1 *b, __m512 *w0, __m512 *w1)
{
    const __m512 tbl = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(k_iota), _mm512_set1_ps(h2f(b->d))),
                                     _mm512_set1_ps(h2f(b->m)));
    const __m512i v = load_u8x16(b->qs);
    *w0 = _mm512_permutexvar_ps(v, tbl);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
}

/* 5-bit: lanes whose qh bit is set take the upper table. */
AI void deq_5bit(const uint8_t *qs, uint32_t qh, __m512 lo, __m512 hi, __m512 *w0, __m512 *w1)
{
    const __m512i v = load_u8x16(qs), s = _mm512_srli_epi32(v, 4);
    *w0 = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(v, lo), (__mmask16)qh, v, hi);
    *w1 = _mm512_mask_permutexvar_ps(_mm512_permutexvar_ps(s, lo), (__mmask16)(qh >> 16), s, hi);
}

AI void deq_q5_0(const block_q5_0 *b, __m512 *w0, __m512 *w1)
{
    const __m512 d = _mm512_set1_ps(h2f(b->d)), iota = _mm512_loadu_ps(k_iota);
    const __m512 lo = _mm512_mul_ps(_mm512_sub_ps(iota, _mm512_set1_ps(16)), d);
    const __m512 hi = _mm512_mul_ps(iota, d); /* (c + 16 - 16) * d */
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    deq_5bit(b->qs, qh, lo, hi, w0, w1);
}

AI void deq_q5_1(const block_q5_1 *b, __m512 *w0, __m512 *w1)
{
    const __m512 d = _mm512_set1_ps(h2f(b->d)), m = _mm512_set1_ps(h2f(b->m));
    const __m512 iota = _mm512_loadu_ps(k_iota);
    const __m512 lo = _mm512_add_ps(_mm512_mul_ps(iota, d), m);
    const __m512 hi = _mm512_add_ps(_mm512_mul_ps(_mm512_add_ps(iota, _mm512_set1_ps(16)), d), m);
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    deq_5bit(b->qs, qh, lo, hi, w0, w1);
}

/* Software prefetch distance for streaming weight rows from DRAM (bytes
 * ahead of the block being dotted): the dot does enough work per byte that
 * the hardware prefetcher alone leaves memory bandwidth unused. */
#ifndef KQ_PREFETCH
#define KQ_PREFETCH 2048
#endif

/* Prefetches the cache lines KQ_PREFETCH bytes past [p, p + bytes). */
AI void prefetch_ahead(const void *p, size_t bytes)
{
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch((const char *)p + KQ_PREFETCH + o, _MM_HINT_T0);
}

/* The block-32 drivers: the same loop for every type, written out per type
 * so each inlines its deq_* (no function pointers in the hot loop). */
/* mxfp4: table[c] = v[c] * 2^(e-128), as the reference rounds it (exactly,
 * or to +-inf) */
AI void deq_mxfp4(const block_mxfp4 *b, __m512 *w0, __m512 *w1)
{
    const __m512 v = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)dt_mxfp4_values)));
    const __m512 tbl = _mm512_mul_ps(v, _mm512_set1_ps(dt_e8m0_half(b->e)));
    const __m512i q = load_u8x16(b->qs);
    *w0 = _mm512_permutexvar_ps(q, tbl); /* vpermps reads index bits 0..3 only */
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), tbl);
}

#define B32_DOT_BODY(BT, DEQ)                                        \
    const BT *b = w;                                                 \
    const int64_t nb = n / 32;                                       \
    __m512 acc[NTM][4];                                              \
    __m512 w0, w1, w2, w3;                                           \
    acc_zero(nt, acc);                                               \
    int64_t i = 0;                                                   \
    for (; i + 2 <= nb; i += 2, x += 64) {                           \
        _mm_prefetch((const char *)&b[i] + KQ_PREFETCH, _MM_HINT_T0); \
        DEQ(&b[i], &w0, &w1);                                        \
        DEQ(&b[i + 1], &w2, &w3);                                    \
        fma32(nt, acc, 0, w0, w1, x, xs);                            \
        fma32(nt, acc, 2, w2, w3, x + 32, xs);                       \
    }                                                                \
    if (i < nb) {                                                    \
        DEQ(&b[i], &w0, &w1);                                        \
        fma32(nt, acc, 0, w0, w1, x, xs);                            \
    }                                                                \
    acc_finish(nt, acc, out);

#define B32_TO_FLOAT_BODY(BT, DEQ)                                   \
    const BT *b = src;                                               \
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {                \
        __m512 w0, w1;                                               \
        DEQ(&b[i], &w0, &w1);                                        \
        _mm512_storeu_ps(dst, w0);                                   \
        _mm512_storeu_ps(dst + 16, w1);                              \
    }

AI void dot_q8_0(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_q8_0, deq_q8_0)
}
AI void dot_q4_0(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_q4_0, deq_q4_0)
}
AI void dot_q4_1(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_q4_1, deq_q4_1)
}
AI void dot_q5_0(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_q5_0, deq_q5_0)
}
AI void dot_q5_1(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_q5_1, deq_q5_1)
}

static void tf_q8_0(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q8_0, deq_q8_0) }
static void tf_q4_0(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q4_0, deq_q4_0) }
AI void dot_mxfp4(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_mxfp4, deq_mxfp4)
}
static void tf_mxfp4(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_mxfp4, deq_mxfp4) }
static void tf_q4_1(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q4_1, deq_q4_1) }
static void tf_q5_0(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q5_0, deq_q5_0) }
static void tf_q5_1(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q5_1, deq_q5_1) }

/* ---------------- q4_K / q5_K ---------------- */

/* d*sc and dmin*m for the 8 sub-blocks, rounded as the reference does. */
AI void kscales(const uint8_t *scales, float d, float dmin, float *d1, float *m1)
{
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        qref_scale_min_k4(j, scales, &sc, &m);
        d1[j] = d * sc;
        m1[j] = dmin * m;
    }
}

/* table[c] = d1 * (c + off) - m1 */
AI __m512 ktable(float d1, float m1, float off)
{
    const __m512 c = _mm512_add_ps(_mm512_loadu_ps(k_iota), _mm512_set1_ps(off));
    return _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d1), c), _mm512_set1_ps(m1));
}

/* Sub-blocks 2j (low nibbles) and 2j+1 (high nibbles) of a q4_K/q5_K block:
 * 64 elements into w[4].  qh is NULL for q4_K. */
AI void deq_k_pair(const uint8_t *qs, const uint8_t *qh, int j, const float *d1, const float *m1,
                   __m512 w[4])
{
    const __m512i va = load_u8x16(qs + 32 * j), vb = load_u8x16(qs + 32 * j + 16);
    const __m512i sa = _mm512_srli_epi32(va, 4), sb = _mm512_srli_epi32(vb, 4);
    const __m512 ta = ktable(d1[2 * j], m1[2 * j], 0), tb = ktable(d1[2 * j + 1], m1[2 * j + 1], 0);
    w[0] = _mm512_permutexvar_ps(va, ta);
    w[1] = _mm512_permutexvar_ps(vb, ta);
    w[2] = _mm512_permutexvar_ps(sa, tb);
    w[3] = _mm512_permutexvar_ps(sb, tb);
    if (qh) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        const __mmask32 ka = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(1 << (2 * j))));
        const __mmask32 kb = _mm256_test_epi8_mask(h, _mm256_set1_epi8((char)(2 << (2 * j))));
        const __m512 ha = ktable(d1[2 * j], m1[2 * j], 16), hb = ktable(d1[2 * j + 1], m1[2 * j + 1], 16);
        w[0] = _mm512_mask_permutexvar_ps(w[0], (__mmask16)ka, va, ha);
        w[1] = _mm512_mask_permutexvar_ps(w[1], (__mmask16)(ka >> 16), vb, ha);
        w[2] = _mm512_mask_permutexvar_ps(w[2], (__mmask16)kb, sa, hb);
        w[3] = _mm512_mask_permutexvar_ps(w[3], (__mmask16)(kb >> 16), sb, hb);
    }
}

AI void dot_q4_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    const block_q4_K *b = w;
    __m512 acc[NTM][4];
    acc_zero(nt, acc);
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float d1[8], m1[8];
        kscales(b[i].scales, h2f(b[i].d), h2f(b[i].dmin), d1, m1);
        for (int j = 0; j < 4; j++, x += 64) {
            __m512 v[4];
            deq_k_pair(b[i].qs, NULL, j, d1, m1, v);
            fma32(nt, acc, 0, v[0], v[1], x, xs);
            fma32(nt, acc, 2, v[2], v[3], x + 32, xs);
        }
    }
    acc_finish(nt, acc, out);
}

AI void dot_q5_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    const block_q5_K *b = w;
    __m512 acc[NTM][4];
    acc_zero(nt, acc);
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float d1[8], m1[8];
        kscales(b[i].scales, h2f(b[i].d), h2f(b[i].dmin), d1, m1);
        for (int j = 0; j < 4; j++, x += 64) {
            __m512 v[4];
            deq_k_pair(b[i].qs, b[i].qh, j, d1, m1, v);
            fma32(nt, acc, 0, v[0], v[1], x, xs);
            fma32(nt, acc, 2, v[2], v[3], x + 32, xs);
        }
    }
    acc_finish(nt, acc, out);
}

static void tf_q4_K(const void *src, float *dst, int64_t n)
{
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float d1[8], m1[8];
        kscales(b[i].scales, h2f(b[i].d), h2f(b[i].dmin), d1, m1);
        for (int j = 0; j < 4; j++, dst += 64) {
            __m512 v[4];
            deq_k_pair(b[i].qs, NULL, j, d1, m1, v);
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(dst + 16 * k, v[k]);
        }
    }
}

static void tf_q5_K(const void *src, float *dst, int64_t n)
{
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float d1[8], m1[8];
        kscales(b[i].scales, h2f(b[i].d), h2f(b[i].dmin), d1, m1);
        for (int j = 0; j < 4; j++, dst += 64) {
            __m512 v[4];
            deq_k_pair(b[i].qs, b[i].qh, j, d1, m1, v);
            for (int k = 0; k < 4; k++)
                _mm512_storeu_ps(dst + 16 * k, v[k]);
        }
    }
}

/* ---------------- q6_K ---------------- */

/* One 128-element half: q - 32 as int8 in two 64-byte vectors (elements
 * 0..63 and 64..127), built in the byte domain (see quant_ref.c layout). */
AI void q6_half_codes(const uint8_t *ql, const uint8_t *qh, __m512i *q_lo, __m512i *q_hi)
{
    const __m512i a = _mm512_loadu_si512(ql);
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    /* bytes 0..31: qh, bytes 32..63: qh >> 2 (bits 4,5 of each byte kept below) */
    const __m512i h2 = _mm512_inserti64x4(_mm512_castsi256_si512(h), _mm256_srli_epi16(h, 2), 1);
    const __m512i m30 = _mm512_set1_epi8(0x30), m0f = _mm512_set1_epi8(0x0F);
    const __m512i top_lo = _mm512_and_si512(_mm512_slli_epi16(h2, 4), m30);
    const __m512i top_hi = _mm512_and_si512(h2, m30);
    /* 0xEC: (a & c) | b */
    const __m512i c_lo = _mm512_ternarylogic_epi32(a, top_lo, m0f, 0xEC);
    const __m512i c_hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(a, 4), top_hi, m0f, 0xEC);
    *q_lo = _mm512_sub_epi8(c_lo, _mm512_set1_epi8(32));
    *q_hi = _mm512_sub_epi8(c_hi, _mm512_set1_epi8(32));
}

/* A 64-code vector as four 16-float vectors, group g times scale s[g]
 * (literal lane indices: extracti32x4 needs an immediate at any -O). */
AI void q6_widen(__m512i q, const float *s, __m512 w[4])
{
    w[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(q, 0)));
    w[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(q, 1)));
    w[2] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(q, 2)));
    w[3] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm512_extracti32x4_epi32(q, 3)));
    for (int g = 0; g < 4; g++)
        w[g] = _mm512_mul_ps(w[g], _mm512_set1_ps(s[g]));
}

/* The 16 d*sc of a block, rounded as the reference. */
AI void q6_scales(const block_q6_K *b, float *s16)
{
    const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->scales)));
    _mm512_storeu_ps(s16, _mm512_mul_ps(_mm512_set1_ps(h2f(b->d)), sc));
}

AI void dot_q6_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    const block_q6_K *b = w;
    __m512 acc[NTM][4];
    acc_zero(nt, acc);
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float s16[16];
        q6_scales(&b[i], s16);
        for (int h = 0; h < 2; h++) {
            __m512i q[2];
            q6_half_codes(b[i].ql + 64 * h, b[i].qh + 32 * h, &q[0], &q[1]);
            for (int c = 0; c < 2; c++, x += 64) {
                __m512 v[4];
                q6_widen(q[c], s16 + 8 * h + 4 * c, v);
                fma32(nt, acc, 0, v[0], v[1], x, xs);
                fma32(nt, acc, 2, v[2], v[3], x + 32, xs);
            }
        }
    }
    acc_finish(nt, acc, out);
}

static void tf_q6_K(const void *src, float *dst, int64_t n)
{
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        prefetch_ahead(&b[i], sizeof b[i]);
        float s16[16];
        q6_scales(&b[i], s16);
        for (int h = 0; h < 2; h++) {
            __m512i q[2];
            q6_half_codes(b[i].ql + 64 * h, b[i].qh + 32 * h, &q[0], &q[1]);
            for (int c = 0; c < 2; c++, dst += 64) {
                __m512 v[4];
                q6_widen(q[c], s16 + 8 * h + 4 * c, v);
                for (int k = 0; k < 4; k++)
                    _mm512_storeu_ps(dst + 16 * k, v[k]);
            }
        }
    }
}

/* ---------------- entry points ---------------- */

AI void dot_f32(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    dot_plain(PL_F32, n, w, x, xs, nt, out);
}
AI void dot_f16(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    dot_plain(PL_F16, n, w, x, xs, nt, out);
}
AI void dot_bf16(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    dot_plain(PL_BF16, n, w, x, xs, nt, out);
}
static void tf_f16(const void *src, float *dst, int64_t n) { to_float_plain(PL_F16, src, dst, n); }
static void tf_bf16(const void *src, float *dst, int64_t n) { to_float_plain(PL_BF16, src, dst, n); }

/* vd_T: single-token vec_dot; vdm_T: nt tokens, each bitwise equal to vd_T.
 * The switch instantiates dot_T with a constant nt so accumulators stay in
 * registers. */
#define ENTRY_POINTS(T)                                                              \
    static float vd_##T(int64_t n, const void *w, const float *x)                    \
    {                                                                                \
        float o;                                                                     \
        dot_##T(n, w, x, 0, 1, &o);                                                  \
        return o;                                                                    \
    }                                                                                \
    static void vdm_##T(int64_t n, const void *w, const float *x, int64_t xs, int nt, \
                        float *out)                                                  \
    {                                                                                \
        switch (nt) {                                                                \
        case 1: dot_##T(n, w, x, xs, 1, out); break;                                 \
        case 2: dot_##T(n, w, x, xs, 2, out); break;                                 \
        case 3: dot_##T(n, w, x, xs, 3, out); break;                                 \
        default: dot_##T(n, w, x, xs, 4, out); break;                                \
        }                                                                            \
    }

ENTRY_POINTS(f32)
ENTRY_POINTS(f16)
ENTRY_POINTS(bf16)
ENTRY_POINTS(q8_0)
ENTRY_POINTS(q4_0)
ENTRY_POINTS(q4_1)
ENTRY_POINTS(q5_0)
ENTRY_POINTS(q5_1)
ENTRY_POINTS(q4_K)
ENTRY_POINTS(q5_K)
ENTRY_POINTS(q6_K)
ENTRY_POINTS(mxfp4)

static const quant_simd_kernels k_table[DT_COUNT] = {
    [DT_F32] = {NULL, vd_f32, vdm_f32}, /* to_float is a memcpy: reference */
    [DT_F16] = {tf_f16, vd_f16, vdm_f16},
    [DT_BF16] = {tf_bf16, vd_bf16, vdm_bf16},
    [DT_Q8_0] = {tf_q8_0, vd_q8_0, vdm_q8_0},
    [DT_Q4_0] = {tf_q4_0, vd_q4_0, vdm_q4_0},
    [DT_Q4_1] = {tf_q4_1, vd_q4_1, vdm_q4_1},
    [DT_Q5_0] = {tf_q5_0, vd_q5_0, vdm_q5_0},
    [DT_Q5_1] = {tf_q5_1, vd_q5_1, vdm_q5_1},
    [DT_Q4_K] = {tf_q4_K, vd_q4_K, vdm_q4_K},
    [DT_Q5_K] = {tf_q5_K, vd_q5_K, vdm_q5_K},
    [DT_Q6_K] = {tf_q6_K, vd_q6_K, vdm_q6_K},
    [DT_MXFP4] = {tf_mxfp4, vd_mxfp4, vdm_mxfp4},
};

const quant_simd_kernels *quant_avx512_table(void)
{
    return k_table;
}
