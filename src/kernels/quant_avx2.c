/* quant_avx2.c - AVX2 + FMA + F16C to_float and vec_dot kernels.
 *
 * Built with -mavx2 -mfma -mf16c; only reached through quant_avx2_table(),
 * which dtype.c calls after checking the CPU.  Scalar twins: quant_ref.c;
 * test_dtype checks to_float bitwise and vec_dot to 1e-5.
 *
 * Scheme: 32 elements at a time are unpacked to int8 codes in the byte
 * domain (nibbles, fifth/sixth bits OR'd in, offset subtracted), widened to
 * four 8-float vectors, scaled with the same f32 operations as the
 * reference (so to_float is bit-exact), and FMA'd against x into four
 * accumulators per token.
 *
 * Batch invariance: dot_<type>(.., nt, ..) runs the same operation sequence
 * for each token k < nt (nt <= 2 here: 16 ymm registers); vdm_<type> splits
 * up to QK_MULTI_MAX tokens into pairs, so out[k] is bitwise vd_<type>(x_k).
 */
#include <immintrin.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/quant_ref.h"

#define AI static inline __attribute__((always_inline))
#define NT2 2

AI float h2f(half_fp16 h)
{
    return _cvtsh_ss(h);
}

/* 16 int8 codes -> two 8-float vectors */
AI void i8x16_to_ps(__m128i q, __m256 *a, __m256 *b)
{
    *a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    *b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(q, q)));
}

/* 32 int8 codes -> w[0..3] */
AI void i8x32_to_ps(__m256i q, __m256 w[4])
{
    i8x16_to_ps(_mm256_castsi256_si128(q), &w[0], &w[1]);
    i8x16_to_ps(_mm256_extracti128_si256(q, 1), &w[2], &w[3]);
}

AI void scale4(__m256 w[4], float d)
{
    const __m256 v = _mm256_set1_ps(d);
    #pragma GCC unroll 8
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_mul_ps(w[j], v);
}

/* w = w * d + m, rounded twice like the reference (not fused). */
AI void scale_min4(__m256 w[4], float d, float m)
{
    const __m256 dv = _mm256_set1_ps(d), mv = _mm256_set1_ps(m);
    #pragma GCC unroll 8
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_add_ps(_mm256_mul_ps(w[j], dv), mv);
}

AI void acc_zero(int nt, __m256 acc[NT2][4])
{
#pragma GCC unroll 2
    for (int k = 0; k < nt; k++)
        acc[k][0] = acc[k][1] = acc[k][2] = acc[k][3] = _mm256_setzero_ps();
}

AI void fma32(int nt, __m256 acc[NT2][4], const __m256 w[4], const float *x, int64_t xs)
{
#pragma GCC unroll 2
    for (int k = 0; k < nt; k++)
        #pragma GCC unroll 8
        for (int j = 0; j < 4; j++)
            acc[k][j] = _mm256_fmadd_ps(w[j], _mm256_loadu_ps(x + k * xs + 8 * j), acc[k][j]);
}

AI float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

AI void acc_finish(int nt, __m256 acc[NT2][4], float *out)
{
#pragma GCC unroll 2
    for (int k = 0; k < nt; k++)
        out[k] = hsum(_mm256_add_ps(_mm256_add_ps(acc[k][0], acc[k][2]),
                                    _mm256_add_ps(acc[k][1], acc[k][3])));
}

/* ---------------- f32 / f16 / bf16 ---------------- */

typedef enum { PL_F32, PL_F16, PL_BF16 } plain_kind;

AI __m256 plain_load8(plain_kind kind, const void *w, int64_t i)
{
    switch (kind) {
    case PL_F32:
        return _mm256_loadu_ps((const float *)w + i);
    case PL_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i)));
    default:
        return _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)w + i))), 16));
    }
}

AI float plain_load1(plain_kind kind, const void *w, int64_t i)
{
    switch (kind) {
    case PL_F32: return ((const float *)w)[i];
    case PL_F16: return h2f(((const uint16_t *)w)[i]);
    default: return half_bf16_to_f32(((const uint16_t *)w)[i]);
    }
}

AI void dot_plain(plain_kind kind, int64_t n, const void *w, const float *x, int64_t xs, int nt,
                  float *out)
{
    __m256 acc[NT2][4];
    acc_zero(nt, acc);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256 v[4] = {plain_load8(kind, w, i), plain_load8(kind, w, i + 8),
                             plain_load8(kind, w, i + 16), plain_load8(kind, w, i + 24)};
        fma32(nt, acc, v, x + i, xs);
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 v = plain_load8(kind, w, i);
        #pragma GCC unroll 8
        for (int k = 0; k < nt; k++)
            acc[k][0] = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + k * xs + i), acc[k][0]);
    }
    acc_finish(nt, acc, out);
    #pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        float t = 0.0f; /* scalar tail, then added once */
        for (int64_t j = i; j < n; j++)
            t += plain_load1(kind, w, j) * x[k * xs + j];
        out[k] += t;
    }
}

AI void to_float_plain(plain_kind kind, const void *w, float *dst, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, plain_load8(kind, w, i));
    for (; i < n; i++)
        dst[i] = plain_load1(kind, w, i);
}

/* ---------------- block-32 types: deq_* -> w[0..3] = elements 0..31 ---------------- */

/* Low nibbles (elements 0..15) in the low lane, high nibbles in the high. */
AI __m256i nibbles32(const uint8_t *qs)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m128i m = _mm_set1_epi8(0x0F);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}

/* Byte i = 0x10 where bit i of qh is set (ggml's bytes_from_bits_32). */
AI __m256i bits32_to_0x10(uint32_t qh)
{
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    b = _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

AI void deq_q8_0(const block_q8_0 *b, __m256 w[4])
{
    i8x32_to_ps(_mm256_loadu_si256((const __m256i *)b->qs), w);
    scale4(w, h2f(b->d));
}

AI void deq_q4_0(const block_q4_0 *b, __m256 w[4])
{
    i8x32_to_ps(_mm256_sub_epi8(nibbles32(b->qs), _mm256_set1_epi8(8)), w);
    scale4(w, h2f(b->d));
}

AI void deq_q4_1(const block_q4_1 *b, __m256 w[4])
{
    i8x32_to_ps(nibbles32(b->qs), w);
    scale_min4(w, h2f(b->d), h2f(b->m));
}

AI void deq_q5_0(const block_q5_0 *b, __m256 w[4])
{
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    const __m256i q = _mm256_or_si256(nibbles32(b->qs), bits32_to_0x10(qh));
    i8x32_to_ps(_mm256_sub_epi8(q, _mm256_set1_epi8(16)), w);
    scale4(w, h2f(b->d));
}

AI void deq_q5_1(const block_q5_1 *b, __m256 w[4])
{
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    i8x32_to_ps(_mm256_or_si256(nibbles32(b->qs), bits32_to_0x10(qh)), w);
    scale_min4(w, h2f(b->d), h2f(b->m));
}

/* mxfp4: the table values by VPSHUFB, times 2^(e-128) (exact, or +-inf as
 * in the reference) */
AI void deq_mxfp4(const block_mxfp4 *b, __m256 w[4])
{
    const __m128i v = _mm_loadu_si128((const __m128i *)dt_mxfp4_values);
    i8x32_to_ps(_mm256_shuffle_epi8(_mm256_set_m128i(v, v), nibbles32(b->qs)), w);
    scale4(w, dt_e8m0_half(b->e));
}

#define B32_DOT_BODY(BT, DEQ)                                        \
    const BT *b = w;                                                 \
    __m256 acc[NT2][4];                                              \
    acc_zero(nt, acc);                                               \
    for (int64_t i = 0; i < n / 32; i++, x += 32) {                  \
        __m256 v[4];                                                 \
        DEQ(&b[i], v);                                               \
        fma32(nt, acc, v, x, xs);                                    \
    }                                                                \
    acc_finish(nt, acc, out);

#define B32_TO_FLOAT_BODY(BT, DEQ)                                   \
    const BT *b = src;                                               \
    for (int64_t i = 0; i < n / 32; i++, dst += 32) {                \
        __m256 v[4];                                                 \
        DEQ(&b[i], v);                                               \
        for (int j = 0; j < 4; j++)                                  \
            _mm256_storeu_ps(dst + 8 * j, v[j]);                     \
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
static void tf_q4_1(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q4_1, deq_q4_1) }
static void tf_q5_0(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q5_0, deq_q5_0) }
static void tf_q5_1(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_q5_1, deq_q5_1) }
AI void dot_mxfp4(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    B32_DOT_BODY(block_mxfp4, deq_mxfp4)
}
static void tf_mxfp4(const void *src, float *dst, int64_t n) { B32_TO_FLOAT_BODY(block_mxfp4, deq_mxfp4) }

/* ---------------- q4_K / q5_K ---------------- */

AI void kscales(const uint8_t *scales, float d, float dmin, float *d1, float *m1)
{
    #pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        qref_scale_min_k4(j, scales, &sc, &m);
        d1[j] = d * sc;
        m1[j] = dmin * m;
    }
}

/* w = d1 * q - m1, rounded twice like the reference. */
AI void kscale4(__m256 w[4], float d1, float m1)
{
    const __m256 dv = _mm256_set1_ps(d1), mv = _mm256_set1_ps(m1);
    #pragma GCC unroll 8
    for (int j = 0; j < 4; j++)
        w[j] = _mm256_sub_ps(_mm256_mul_ps(dv, w[j]), mv);
}

/* Sub-blocks 2j and 2j+1 (64 elements) -> lo[4], hi[4]; qh NULL for q4_K. */
AI void deq_k_pair(const uint8_t *qs, const uint8_t *qh, int j, const float *d1, const float *m1,
                   __m256 lo[4], __m256 hi[4])
{
    const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m256i a = _mm256_and_si256(v, m), b = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
    if (qh) {
        const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
        const __m256i ba = _mm256_set1_epi8((char)(1 << (2 * j)));
        const __m256i bb = _mm256_set1_epi8((char)(2 << (2 * j)));
        const __m256i x10 = _mm256_set1_epi8(0x10);
        a = _mm256_or_si256(a, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, ba), ba), x10));
        b = _mm256_or_si256(b, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, bb), bb), x10));
    }
    i8x32_to_ps(a, lo);
    i8x32_to_ps(b, hi);
    kscale4(lo, d1[2 * j], m1[2 * j]);
    kscale4(hi, d1[2 * j + 1], m1[2 * j + 1]);
}

AI void dot_kq(int is5, int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    const size_t ts = is5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    __m256 acc[NT2][4];
    acc_zero(nt, acc);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *blk = (const uint8_t *)w + i * ts;
        const block_q4_K *b4 = (const block_q4_K *)blk;
        const block_q5_K *b5 = (const block_q5_K *)blk;
        float d1[8], m1[8];
        kscales(b4->scales, h2f(b4->d), h2f(b4->dmin), d1, m1); /* same offsets in both */
        for (int j = 0; j < 4; j++, x += 64) {
            __m256 lo[4], hi[4];
            deq_k_pair(is5 ? b5->qs : b4->qs, is5 ? b5->qh : NULL, j, d1, m1, lo, hi);
            fma32(nt, acc, lo, x, xs);
            fma32(nt, acc, hi, x + 32, xs);
        }
    }
    acc_finish(nt, acc, out);
}

AI void to_float_kq(int is5, const void *src, float *dst, int64_t n)
{
    const size_t ts = is5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    for (int64_t i = 0; i < n / QK_K; i++) {
        const uint8_t *blk = (const uint8_t *)src + i * ts;
        const block_q4_K *b4 = (const block_q4_K *)blk;
        const block_q5_K *b5 = (const block_q5_K *)blk;
        float d1[8], m1[8];
        kscales(b4->scales, h2f(b4->d), h2f(b4->dmin), d1, m1);
        for (int j = 0; j < 4; j++, dst += 64) {
            __m256 lo[4], hi[4];
            deq_k_pair(is5 ? b5->qs : b4->qs, is5 ? b5->qh : NULL, j, d1, m1, lo, hi);
            #pragma GCC unroll 8
            for (int k = 0; k < 4; k++) {
                _mm256_storeu_ps(dst + 8 * k, lo[k]);
                _mm256_storeu_ps(dst + 32 + 8 * k, hi[k]);
            }
        }
    }
}

static_assert(offsetof(block_q4_K, scales) == offsetof(block_q5_K, scales), "K headers");

AI void dot_q4_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    dot_kq(0, n, w, x, xs, nt, out);
}
AI void dot_q5_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    dot_kq(1, n, w, x, xs, nt, out);
}
static void tf_q4_K(const void *src, float *dst, int64_t n) { to_float_kq(0, src, dst, n); }
static void tf_q5_K(const void *src, float *dst, int64_t n) { to_float_kq(1, src, dst, n); }

/* ---------------- q6_K ---------------- */

/* One 128-element half: codes - 32 as int8, c[g] = elements 32g..32g+31. */
AI void q6_half_codes(const uint8_t *ql, const uint8_t *qh, __m256i c[4])
{
    const __m256i a0 = _mm256_loadu_si256((const __m256i *)ql);
    const __m256i a1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
    const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
    const __m256i m0f = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
    const __m256i k32 = _mm256_set1_epi8(32);
    c[0] = _mm256_or_si256(_mm256_and_si256(a0, m0f), _mm256_and_si256(_mm256_slli_epi16(h, 4), m30));
    c[1] = _mm256_or_si256(_mm256_and_si256(a1, m0f), _mm256_and_si256(_mm256_slli_epi16(h, 2), m30));
    c[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a0, 4), m0f), _mm256_and_si256(h, m30));
    c[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(a1, 4), m0f),
                           _mm256_and_si256(_mm256_srli_epi16(h, 2), m30));
    for (int g = 0; g < 4; g++)
        c[g] = _mm256_sub_epi8(c[g], k32);
}

/* 32 codes with scales s[0] (first 16) and s[1] (last 16) -> w[4] */
AI void q6_widen(__m256i c, const float *s, __m256 w[4])
{
    i8x32_to_ps(c, w);
    const __m256 s0 = _mm256_set1_ps(s[0]), s1 = _mm256_set1_ps(s[1]);
    w[0] = _mm256_mul_ps(w[0], s0);
    w[1] = _mm256_mul_ps(w[1], s0);
    w[2] = _mm256_mul_ps(w[2], s1);
    w[3] = _mm256_mul_ps(w[3], s1);
}

AI void q6_scales(const block_q6_K *b, float *s16)
{
    const float d = h2f(b->d);
    for (int j = 0; j < 16; j++)
        s16[j] = d * (float)b->scales[j];
}

AI void dot_q6_K(int64_t n, const void *w, const float *x, int64_t xs, int nt, float *out)
{
    const block_q6_K *b = w;
    __m256 acc[NT2][4];
    acc_zero(nt, acc);
    for (int64_t i = 0; i < n / QK_K; i++) {
        float s16[16];
        q6_scales(&b[i], s16);
        for (int h = 0; h < 2; h++) {
            __m256i c[4];
            q6_half_codes(b[i].ql + 64 * h, b[i].qh + 32 * h, c);
            for (int g = 0; g < 4; g++, x += 32) {
                __m256 v[4];
                q6_widen(c[g], s16 + 8 * h + 2 * g, v);
                fma32(nt, acc, v, x, xs);
            }
        }
    }
    acc_finish(nt, acc, out);
}

static void tf_q6_K(const void *src, float *dst, int64_t n)
{
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        float s16[16];
        q6_scales(&b[i], s16);
        for (int h = 0; h < 2; h++) {
            __m256i c[4];
            q6_half_codes(b[i].ql + 64 * h, b[i].qh + 32 * h, c);
            for (int g = 0; g < 4; g++, dst += 32) {
                __m256 v[4];
                q6_widen(c[g], s16 + 8 * h + 2 * g, v);
                #pragma GCC unroll 8
                for (int k = 0; k < 4; k++)
                    _mm256_storeu_ps(dst + 8 * k, v[k]);
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

/* vd_T: single-token vec_dot; vdm_T: up to QK_MULTI_MAX tokens in pairs,
 * each bitwise equal to vd_T (same instruction sequence per token). */
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
        for (; nt >= 2; nt -= 2, x += 2 * xs, out += 2)                              \
            dot_##T(n, w, x, xs, 2, out);                                            \
        if (nt == 1)                                                                 \
            dot_##T(n, w, x, xs, 1, out);                                            \
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

const quant_simd_kernels *quant_avx2_table(void)
{
    return k_table;
}
