/* quant_ref.c - scalar reference kernels: the specification for every dtype.
 *
 * to_float: ggml's dequantization, bit for bit (checked against gguf.quants
 *   by tests/data/quant-vectors).  Products and sums are rounded to f32 in
 *   the order written (the file is built with -std=c11, so no contraction).
 * vec_dot: sum_i (double)to_float(w)[i] * x[i], rounded once to f32 - the
 *   most accurate answer, against which the SIMD kernels are measured.
 * from_float (reference quantizers):
 *   f16/bf16: round to nearest even.
 *   q4_0/q4_1/q5_0/q5_1/q8_0: ggml's quantize_row_*_ref (max-abs with sign
 *     for the symmetric types, min/max for the affine ones).
 *   q4_K/q5_K: per 32-element sub-block min/max: min' = min(0, min x),
 *     scale = (max - min') / (2^bits - 1); the 8 scales and 8 mins are
 *     quantized to 6 bits against d = max scale / 63, dmin = max min / 63
 *     (both rounded to f16 first), then q = round((x + dmin*m) / (d*sc)).
 *     No iterative search (ggml's make_qkx2_quants is better by ~10% RMS).
 *   q6_K: per 16-element sub-block signed max-abs scale s = v / -32 (the
 *     largest |x| maps to q-32 = -32), the 16 scales quantized to int8
 *     against d = max|s| / 127, then q = round(x / (d*sc)) + 32 in [0,63].
 * n is always a multiple of the block size (dtype_row_size checks it).
 */
#include "kernels/quant_ref.h"

#include <math.h>
#include <string.h>

#include "kernels/half.h"

/* Dequantizes a block at a time into a small buffer and dots in double. */
static float dot_blocks(int64_t n, const void *w, const float *x, int bs, size_t ts,
                        dtype_to_float_fn to_float)
{
    float tmp[QK_K];
    const uint8_t *p = w;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i += bs, p += ts) {
        to_float(p, tmp, bs);
        for (int j = 0; j < bs; j++)
            sum += (double)tmp[j] * (double)x[i + j];
    }
    return (float)sum;
}

static float absmax_signed(const float *x, int n)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : (v > hi ? hi : v);
}

/* ---------------- f32 / f16 / bf16 ---------------- */

void qref_f32_to_float(const void *src, float *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

void qref_f32_from_float(const float *src, void *dst, int64_t n)
{
    memcpy(dst, src, (size_t)n * sizeof(float));
}

float qref_f32_vec_dot(int64_t n, const void *w, const float *x)
{
    const float *wf = w;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)wf[i] * (double)x[i];
    return (float)sum;
}

void qref_f16_to_float(const void *src, float *dst, int64_t n)
{
    const half_fp16 *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = half_fp16_to_f32(h[i]);
}

void qref_f16_from_float(const float *src, void *dst, int64_t n)
{
    half_fp16 *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = half_f32_to_fp16(src[i]);
}

float qref_f16_vec_dot(int64_t n, const void *w, const float *x)
{
    const half_fp16 *h = w;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)half_fp16_to_f32(h[i]) * (double)x[i];
    return (float)sum;
}

void qref_bf16_to_float(const void *src, float *dst, int64_t n)
{
    const half_bf16 *h = src;
    for (int64_t i = 0; i < n; i++)
        dst[i] = half_bf16_to_f32(h[i]);
}

void qref_bf16_from_float(const float *src, void *dst, int64_t n)
{
    half_bf16 *h = dst;
    for (int64_t i = 0; i < n; i++)
        h[i] = half_f32_to_bf16(src[i]);
}

float qref_bf16_vec_dot(int64_t n, const void *w, const float *x)
{
    const half_bf16 *h = w;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)half_bf16_to_f32(h[i]) * (double)x[i];
    return (float)sum;
}

/* ---------------- q4_0: x = (q - 8) * d ---------------- */

void qref_q4_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_0 *b = src;
    for (int64_t i = 0; i < n / QK4_0; i++, dst += QK4_0) {
        const float d = half_fp16_to_f32(b[i].d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            dst[j] = (float)((b[i].qs[j] & 0x0F) - 8) * d;
            dst[j + QK4_0 / 2] = (float)((b[i].qs[j] >> 4) - 8) * d;
        }
    }
}

void qref_q4_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_0 *b = dst;
    for (int64_t i = 0; i < n / QK4_0; i++, src += QK4_0) {
        const float d = absmax_signed(src, QK4_0) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        b[i].d = half_f32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const float x0 = src[j] * id;
            const float x1 = src[j + QK4_0 / 2] * id;
            const int q0 = clampi((int8_t)(x0 + 8.5f), 0, 15);
            const int q1 = clampi((int8_t)(x1 + 8.5f), 0, 15);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

float qref_q4_0_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK4_0, sizeof(block_q4_0), qref_q4_0_to_float);
}

/* ---------------- q4_1: x = q * d + m ---------------- */

void qref_q4_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_1 *b = src;
    for (int64_t i = 0; i < n / QK4_1; i++, dst += QK4_1) {
        const float d = half_fp16_to_f32(b[i].d);
        const float m = half_fp16_to_f32(b[i].m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            dst[j] = (float)(b[i].qs[j] & 0x0F) * d + m;
            dst[j + QK4_1 / 2] = (float)(b[i].qs[j] >> 4) * d + m;
        }
    }
}

static void minmax(const float *x, int n, float *mn, float *mx)
{
    *mn = x[0];
    *mx = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *mn)
            *mn = x[j];
        if (x[j] > *mx)
            *mx = x[j];
    }
}

void qref_q4_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_1 *b = dst;
    for (int64_t i = 0; i < n / QK4_1; i++, src += QK4_1) {
        float mn, mx;
        minmax(src, QK4_1, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        b[i].d = half_f32_to_fp16(d);
        b[i].m = half_f32_to_fp16(mn);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const float x0 = (src[j] - mn) * id;
            const float x1 = (src[j + QK4_1 / 2] - mn) * id;
            const int q0 = clampi((int8_t)(x0 + 0.5f), 0, 15);
            const int q1 = clampi((int8_t)(x1 + 0.5f), 0, 15);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

float qref_q4_1_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK4_1, sizeof(block_q4_1), qref_q4_1_to_float);
}

/* ---------------- q5_0: x = (q - 16) * d, bit 4 from qh ---------------- */

static uint32_t load_u32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4); /* little-endian, as GGUF stores it */
    return v;
}

void qref_q5_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_0 *b = src;
    for (int64_t i = 0; i < n / QK5_0; i++, dst += QK5_0) {
        const float d = half_fp16_to_f32(b[i].d);
        const uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = (float)(((b[i].qs[j] & 0x0F) | h0) - 16) * d;
            dst[j + QK5_0 / 2] = (float)(((b[i].qs[j] >> 4) | h1) - 16) * d;
        }
    }
}

void qref_q5_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_0 *b = dst;
    for (int64_t i = 0; i < n / QK5_0; i++, src += QK5_0) {
        const float d = absmax_signed(src, QK5_0) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        b[i].d = half_f32_to_fp16(d);
        for (int j = 0; j < QK5_0 / 2; j++) {
            const float x0 = src[j] * id;
            const float x1 = src[j + QK5_0 / 2] * id;
            const int q0 = clampi((int8_t)(x0 + 16.5f), 0, 31);
            const int q1 = clampi((int8_t)(x1 + 16.5f), 0, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((uint32_t)(q0 >> 4) << j) | ((uint32_t)(q1 >> 4) << (j + 16));
        }
        memcpy(b[i].qh, &qh, 4);
    }
}

float qref_q5_0_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK5_0, sizeof(block_q5_0), qref_q5_0_to_float);
}

/* ---------------- q5_1: x = q * d + m, bit 4 from qh ---------------- */

void qref_q5_1_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_1 *b = src;
    for (int64_t i = 0; i < n / QK5_1; i++, dst += QK5_1) {
        const float d = half_fp16_to_f32(b[i].d);
        const float m = half_fp16_to_f32(b[i].m);
        const uint32_t qh = load_u32(b[i].qh);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) & 1) << 4;
            const int h1 = (int)((qh >> (j + 16)) & 1) << 4;
            dst[j] = (float)((b[i].qs[j] & 0x0F) | h0) * d + m;
            dst[j + QK5_1 / 2] = (float)((b[i].qs[j] >> 4) | h1) * d + m;
        }
    }
}

void qref_q5_1_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_1 *b = dst;
    for (int64_t i = 0; i < n / QK5_1; i++, src += QK5_1) {
        float mn, mx;
        minmax(src, QK5_1, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        b[i].d = half_f32_to_fp16(d);
        b[i].m = half_f32_to_fp16(mn);
        for (int j = 0; j < QK5_1 / 2; j++) {
            const float x0 = (src[j] - mn) * id;
            const float x1 = (src[j + QK5_1 / 2] - mn) * id;
            const int q0 = clampi((int8_t)(x0 + 0.5f), 0, 31);
            const int q1 = clampi((int8_t)(x1 + 0.5f), 0, 31);
            b[i].qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= ((uint32_t)(q0 >> 4) << j) | ((uint32_t)(q1 >> 4) << (j + 16));
        }
        memcpy(b[i].qh, &qh, 4);
    }
}

float qref_q5_1_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK5_1, sizeof(block_q5_1), qref_q5_1_to_float);
}

/* ---------------- q8_0: x = q * d ---------------- */

void qref_q8_0_to_float(const void *src, float *dst, int64_t n)
{
    const block_q8_0 *b = src;
    for (int64_t i = 0; i < n / QK8_0; i++, dst += QK8_0) {
        const float d = half_fp16_to_f32(b[i].d);
        for (int j = 0; j < QK8_0; j++)
            dst[j] = (float)b[i].qs[j] * d;
    }
}

void qref_q8_0_from_float(const float *src, void *dst, int64_t n)
{
    block_q8_0 *b = dst;
    for (int64_t i = 0; i < n / QK8_0; i++, src += QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++)
            amax = fmaxf(amax, fabsf(src[j]));
        const float d = amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        b[i].d = half_f32_to_fp16(d);
        for (int j = 0; j < QK8_0; j++)
            b[i].qs[j] = (int8_t)roundf(src[j] * id);
    }
}

float qref_q8_0_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK8_0, sizeof(block_q8_0), qref_q8_0_to_float);
}

/* ---------------- q4_K / q5_K: x = (d*sc)*q - (dmin*m) ---------------- */

void qref_q4_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q4_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_fp16_to_f32(b[i].d);
        const float dmin = half_fp16_to_f32(b[i].dmin);
        const uint8_t *q = b[i].qs;
        for (int j = 0; j < QK_K / 64; j++, q += 32) {
            uint8_t sc, m;
            qref_scale_min_k4(2 * j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            qref_scale_min_k4(2 * j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *dst++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void qref_q5_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q5_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_fp16_to_f32(b[i].d);
        const float dmin = half_fp16_to_f32(b[i].dmin);
        const uint8_t *ql = b[i].qs;
        const uint8_t *qh = b[i].qh;
        for (int j = 0; j < QK_K / 64; j++, ql += 32) {
            const uint8_t u1 = (uint8_t)(1u << (2 * j)), u2 = (uint8_t)(2u << (2 * j));
            uint8_t sc, m;
            qref_scale_min_k4(2 * j, b[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            qref_scale_min_k4(2 * j + 1, b[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *dst++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *dst++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
        }
    }
}

/* Chooses the 8 sub-block scales/mins of one 256-element K block (see the
 * file comment), packs them into scales[12], and writes per-element
 * levels L[256] in [0, nmax]. */
static void kquant_scales(const float *x, int nmax, half_fp16 *dh, half_fp16 *dminh,
                          uint8_t scales[K_SCALE_SIZE], uint8_t L[QK_K])
{
    float scale[8], mins[8], max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < 8; j++) {
        float mn, mx;
        minmax(x + 32 * j, 32, &mn, &mx);
        if (mn > 0)
            mn = 0;
        scale[j] = (mx - mn) / nmax;
        mins[j] = -mn;
        max_scale = fmaxf(max_scale, scale[j]);
        max_min = fmaxf(max_min, mins[j]);
    }
    *dh = half_f32_to_fp16(max_scale / 63);
    *dminh = half_f32_to_fp16(max_min / 63);
    const float d = half_fp16_to_f32(*dh), dmin = half_fp16_to_f32(*dminh);
    uint8_t sc[8], m[8];
    for (int j = 0; j < 8; j++) {
        sc[j] = (uint8_t)(d > 0 ? clampi((int)lrintf(scale[j] / d), 0, 63) : 0);
        m[j] = (uint8_t)(dmin > 0 ? clampi((int)lrintf(mins[j] / dmin), 0, 63) : 0);
    }
    memset(scales, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            scales[j] |= sc[j];
            scales[j + 4] |= m[j];
        } else {
            scales[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            scales[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
    for (int j = 0; j < 8; j++) {
        const float d1 = d * sc[j], m1 = dmin * m[j];
        for (int l = 0; l < 32; l++) {
            const int q = d1 > 0 ? (int)lrintf((x[32 * j + l] + m1) / d1) : 0;
            L[32 * j + l] = (uint8_t)clampi(q, 0, nmax);
        }
    }
}

void qref_q4_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q4_K *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        kquant_scales(src, 15, &b[i].d, &b[i].dmin, b[i].scales, L);
        for (int j = 0; j < QK_K / 64; j++)
            for (int l = 0; l < 32; l++)
                b[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | (L[64 * j + 32 + l] << 4));
    }
}

void qref_q5_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q5_K *b = dst;
    uint8_t L[QK_K];
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        kquant_scales(src, 31, &b[i].d, &b[i].dmin, b[i].scales, L);
        memset(b[i].qh, 0, sizeof(b[i].qh));
        for (int j = 0; j < QK_K / 64; j++) {
            for (int l = 0; l < 32; l++) {
                const int q1 = L[64 * j + l], q2 = L[64 * j + 32 + l];
                b[i].qs[32 * j + l] = (uint8_t)((q1 & 0xF) | ((q2 & 0xF) << 4));
                b[i].qh[l] |= (uint8_t)(((q1 >> 4) << (2 * j)) | ((q2 >> 4) << (2 * j + 1)));
            }
        }
    }
}

float qref_q4_K_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK_K, sizeof(block_q4_K), qref_q4_K_to_float);
}

float qref_q5_K_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK_K, sizeof(block_q5_K), qref_q5_K_to_float);
}

/* ---------------- q6_K: x = (d*sc) * (q - 32) ---------------- */

void qref_q6_K_to_float(const void *src, float *dst, int64_t n)
{
    const block_q6_K *b = src;
    for (int64_t i = 0; i < n / QK_K; i++) {
        const float d = half_fp16_to_f32(b[i].d);
        const uint8_t *ql = b[i].ql, *qh = b[i].qh;
        const int8_t *sc = b[i].scales;
        for (int h = 0; h < QK_K / 128; h++, ql += 64, qh += 32, sc += 8, dst += 128) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                dst[l] = d * (float)sc[is] * (float)q1;
                dst[l + 32] = d * (float)sc[is + 2] * (float)q2;
                dst[l + 64] = d * (float)sc[is + 4] * (float)q3;
                dst[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void qref_q6_K_from_float(const float *src, void *dst, int64_t n)
{
    block_q6_K *b = dst;
    for (int64_t i = 0; i < n / QK_K; i++, src += QK_K) {
        float scale[16], amax = 0.0f;
        for (int j = 0; j < 16; j++) {
            scale[j] = absmax_signed(src + 16 * j, 16) / -32;
            amax = fmaxf(amax, fabsf(scale[j]));
        }
        b[i].d = half_f32_to_fp16(amax / 127);
        const float d = half_fp16_to_f32(b[i].d);
        uint8_t L[QK_K];
        for (int j = 0; j < 16; j++) {
            const int sc = d > 0 ? clampi((int)lrintf(scale[j] / d), -128, 127) : 0;
            b[i].scales[j] = (int8_t)sc;
            const float d1 = d * (float)sc;
            for (int l = 0; l < 16; l++) {
                const int q = d1 != 0 ? (int)lrintf(src[16 * j + l] / d1) : 0;
                L[16 * j + l] = (uint8_t)(clampi(q, -32, 31) + 32);
            }
        }
        for (int h = 0; h < QK_K / 128; h++) {
            uint8_t *ql = b[i].ql + 64 * h, *qh = b[i].qh + 32 * h;
            const uint8_t *Lh = L + 128 * h;
            for (int l = 0; l < 32; l++) {
                const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = (uint8_t)((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = (uint8_t)((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

float qref_q6_K_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK_K, sizeof(block_q6_K), qref_q6_K_to_float);
}

/* ---------------- mxfp4: x = v[q] * 2^(e-128) (blocks.h) ---------------- */

void qref_mxfp4_to_float(const void *src, float *dst, int64_t n)
{
    const block_mxfp4 *b = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, dst += QK_MXFP4) {
        const float d = dt_e8m0_half(b[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            dst[j] = (float)dt_mxfp4_values[b[i].qs[j] & 0x0F] * d;
            dst[j + QK_MXFP4 / 2] = (float)dt_mxfp4_values[b[i].qs[j] >> 4] * d;
        }
    }
}

/* The code nearest x / d (ggml's best_index_mxfp4: first minimum). */
static int mxfp4_code(float x, float d)
{
    int best = 0;
    float best_err = fabsf((float)dt_mxfp4_values[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float err = fabsf((float)dt_mxfp4_values[i] * d - x);
        if (err < best_err) {
            best = i;
            best_err = err;
        }
    }
    return best;
}

void qref_mxfp4_from_float(const float *src, void *dst, int64_t n)
{
    block_mxfp4 *b = dst;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, src += QK_MXFP4) {
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(src[j]))
                amax = fabsf(src[j]);
        const float l = amax > 0.0f ? floorf(log2f(amax)) - 2 + 127 : 0.0f;
        b[i].e = (uint8_t)(l < 0.0f ? 0 : l > 254.0f ? 254 : (int)l);
        const float d = dt_e8m0_half(b[i].e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            const int q0 = mxfp4_code(src[j], d), q1 = mxfp4_code(src[j + QK_MXFP4 / 2], d);
            b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
    }
}

float qref_mxfp4_vec_dot(int64_t n, const void *w, const float *x)
{
    return dot_blocks(n, w, x, QK_MXFP4, sizeof(block_mxfp4), qref_mxfp4_to_float);
}
