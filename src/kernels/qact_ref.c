/* qact_ref.c - scalar specification of the activation quantizer and of the
 * weight x quantized-activation dot products (format and float order in
 * qact.h).
 *
 * Per weight type, chunk c (32 weights) contributes
 *     v_c = ((A*d[c]) * (float)I) + ((B*d[c]) * (float)J)
 * with u the unsigned code fed to the integer dot, raw = sum u*a,
 * asum = s32[c]:
 *   q4_0: u = q (0..15)        I = raw - 8*asum         A = d     B = 0
 *   q4_1: u = q                I = raw,  J = asum       A = d     B = m
 *   q5_0: u = q (0..31)        I = raw - 16*asum        A = d     B = 0
 *   q5_1: u = q                I = raw,  J = asum       A = d     B = m
 *   q8_0: u = q + 128          I = raw - 128*asum       A = d     B = 0
 *   mxfp4: u = v[q] + 12 (0..24, v = dt_mxfp4_values)
 *                              I = raw - 12*asum        A = 2^(e-128)  B = 0
 *   q4_K, q5_K (sub-block scale sc, min m, 6-bit):
 *         u = q                I = sc*raw, J = m*asum   A = d     B = -dmin
 *   q6_K (int8 scale per 16: sc0, sc1; half sums raw_h, s16):
 *         u = q (0..63)        I = sc0*(raw_h0 - 32*s16[2c]) + sc1*(raw_h1 - 32*s16[2c+1])
 *                                                       A = d     B = 0
 * All |I|, |J| < 2^24, so (float)I is exact.  Mathematically v_c equals
 * the dequantized weights dotted with d[c]*a; the only approximation is
 * the activation rounding (and f32 rounding of the scale products).
 */
#include "kernels/qact.h"

#include <math.h>
#include <string.h>

#include "kernels/half.h"
#include "kernels/quant_ref.h"

/* One 32-value chunk: codes q, scale *d, sums (the row format of qact.h). */
static void quantize_chunk(const float *xc, int8_t *q, float *d, int32_t *s32, int16_t *s16)
{
    float amax = 0.0f;
    for (int i = 0; i < QACT_CHUNK; i++)
        amax = fmaxf(amax, fabsf(xc[i]));
    const float dc = amax / 127.0f;
    const float id = dc != 0.0f ? 1.0f / dc : 0.0f;
    int sh[2] = {0, 0};
    for (int i = 0; i < QACT_CHUNK; i++) {
        q[i] = (int8_t)(int)nearbyintf(xc[i] * id);
        sh[i / 16] += q[i];
    }
    *d = dc;
    *s32 = sh[0] + sh[1];
    s16[0] = (int16_t)sh[0];
    s16[1] = (int16_t)sh[1];
}

void qact_quantize_ref(const float *x, int64_t n, void *dst)
{
    const int64_t np = qact_padded(n);
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + np);
    int32_t *s32 = (int32_t *)((uint8_t *)dst + np + np / 8);
    int16_t *s16 = (int16_t *)((uint8_t *)dst + np + np / 4);
    for (int64_t c = 0; c < n / QACT_CHUNK; c++)
        quantize_chunk(x + c * QACT_CHUNK, qs + c * QACT_CHUNK, &d[c], &s32[c], &s16[2 * c]);
    qact_pad_tail(dst, n);
}

void qact_quantize_residual(const float *x, int64_t n, const void *first, void *dst)
{
    const int64_t np = qact_padded(n);
    const qact_view f = qact_view_of(first, n);
    int8_t *qs = dst;
    float *d = (float *)((uint8_t *)dst + np);
    int32_t *s32 = (int32_t *)((uint8_t *)dst + np + np / 8);
    int16_t *s16 = (int16_t *)((uint8_t *)dst + np + np / 4);
    for (int64_t c = 0; c < n / QACT_CHUNK; c++) {
        float r[QACT_CHUNK];
        for (int i = 0; i < QACT_CHUNK; i++)
            r[i] = x[c * QACT_CHUNK + i] - f.d[c] * (float)f.qs[c * QACT_CHUNK + i];
        quantize_chunk(r, qs + c * QACT_CHUNK, &d[c], &s32[c], &s16[2 * c]);
    }
    qact_pad_tail(dst, n);
}

void qact_pad_tail(void *dst, int64_t n)
{
    const int64_t np = qact_padded(n), nc = n / QACT_CHUNK;
    float *d = (float *)((uint8_t *)dst + np);
    int32_t *s32 = (int32_t *)((uint8_t *)dst + np + np / 8);
    int16_t *s16 = (int16_t *)((uint8_t *)dst + np + np / 4);
    memset((int8_t *)dst + nc * QACT_CHUNK, 0, (size_t)(np - nc * QACT_CHUNK));
    for (int64_t c = nc; c < np / QACT_CHUNK; c++) {
        d[c] = 0.0f;
        s32[c] = 0;
        s16[2 * c] = s16[2 * c + 1] = 0;
    }
}

/* One chunk's integer terms and float scales. */
typedef struct chunk_terms {
    int32_t I, J;
    float A, B;
} chunk_terms;

static int32_t dot_u8(const uint8_t *u, const int8_t *a, int len)
{
    int32_t s = 0;
    for (int i = 0; i < len; i++)
        s += (int32_t)u[i] * a[i];
    return s;
}

/* Codes of chunk c for the legacy 32-element block types. */
static chunk_terms terms_legacy(uint32_t type, const void *w, int64_t c, const qact_view *v)
{
    uint8_t u[32];
    chunk_terms t = {0, 0, 0.0f, 0.0f};
    const int8_t *a = v->qs + c * 32;
    const int32_t asum = v->s32[c];
    switch (type) {
    case DT_Q4_0: {
        const block_q4_0 *b = (const block_q4_0 *)w + c;
        for (int i = 0; i < 16; i++) {
            u[i] = b->qs[i] & 0xF;
            u[i + 16] = b->qs[i] >> 4;
        }
        t.I = dot_u8(u, a, 32) - 8 * asum;
        t.A = half_fp16_to_f32(b->d);
        break;
    }
    case DT_Q4_1: {
        const block_q4_1 *b = (const block_q4_1 *)w + c;
        for (int i = 0; i < 16; i++) {
            u[i] = b->qs[i] & 0xF;
            u[i + 16] = b->qs[i] >> 4;
        }
        t.I = dot_u8(u, a, 32);
        t.J = asum;
        t.A = half_fp16_to_f32(b->d);
        t.B = half_fp16_to_f32(b->m);
        break;
    }
    case DT_Q5_0:
    case DT_Q5_1: {
        const int one = type == DT_Q5_1;
        const uint8_t *qs = one ? ((const block_q5_1 *)w + c)->qs : ((const block_q5_0 *)w + c)->qs;
        const uint8_t *qhp = one ? ((const block_q5_1 *)w + c)->qh : ((const block_q5_0 *)w + c)->qh;
        uint32_t qh;
        memcpy(&qh, qhp, 4);
        for (int i = 0; i < 16; i++) {
            u[i] = (uint8_t)((qs[i] & 0xF) | (((qh >> i) & 1) << 4));
            u[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        const int32_t raw = dot_u8(u, a, 32);
        if (one) {
            const block_q5_1 *b = (const block_q5_1 *)w + c;
            t.I = raw;
            t.J = asum;
            t.A = half_fp16_to_f32(b->d);
            t.B = half_fp16_to_f32(b->m);
        } else {
            t.I = raw - 16 * asum;
            t.A = half_fp16_to_f32(((const block_q5_0 *)w + c)->d);
        }
        break;
    }
    case DT_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)w + c;
        for (int i = 0; i < 32; i++)
            u[i] = (uint8_t)(b->qs[i] + 128);
        t.I = dot_u8(u, a, 32) - 128 * asum;
        t.A = half_fp16_to_f32(b->d);
        break;
    }
    case DT_MXFP4: {
        const block_mxfp4 *b = (const block_mxfp4 *)w + c;
        for (int i = 0; i < 16; i++) {
            u[i] = (uint8_t)(dt_mxfp4_values[b->qs[i] & 0xF] + 12);
            u[i + 16] = (uint8_t)(dt_mxfp4_values[b->qs[i] >> 4] + 12);
        }
        t.I = dot_u8(u, a, 32) - 12 * asum;
        t.A = dt_e8m0_half(b->e);
        break;
    }
    default:
        break;
    }
    return t;
}

/* Chunk c of a K-quant row: superblock c/8, sub-block (32 values) c%8. */
static chunk_terms terms_k(uint32_t type, const void *w, int64_t c, const qact_view *v)
{
    uint8_t u[32];
    chunk_terms t = {0, 0, 0.0f, 0.0f};
    const int8_t *a = v->qs + c * 32;
    const int j = (int)(c % 8);
    if (type == DT_Q6_K) {
        const block_q6_K *b = (const block_q6_K *)w + c / 8;
        /* sub-block j: 128-half h = j/4, quarter k = j%4 */
        const int h = j / 4, k = j % 4;
        const uint8_t *ql = b->ql + 64 * h + (k & 1) * 32;
        const uint8_t *qh = b->qh + 32 * h;
        for (int l = 0; l < 32; l++) {
            const int lo = k < 2 ? ql[l] & 0xF : ql[l] >> 4;
            u[l] = (uint8_t)(lo | (((qh[l] >> (2 * k)) & 3) << 4));
        }
        const int32_t r0 = dot_u8(u, a, 16), r1 = dot_u8(u + 16, a + 16, 16);
        t.I = b->scales[2 * j] * (r0 - 32 * v->s16[2 * c]) +
              b->scales[2 * j + 1] * (r1 - 32 * v->s16[2 * c + 1]);
        t.A = half_fp16_to_f32(b->d);
        return t;
    }
    /* q4_K and q5_K share scales and qs layout */
    const uint8_t *scales, *qs;
    half_fp16 d, dmin;
    if (type == DT_Q4_K) {
        const block_q4_K *b = (const block_q4_K *)w + c / 8;
        scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
    } else {
        const block_q5_K *b = (const block_q5_K *)w + c / 8;
        scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
    }
    for (int l = 0; l < 32; l++) {
        const uint8_t q = qs[32 * (j / 2) + l];
        u[l] = (j & 1) ? q >> 4 : q & 0xF;
    }
    if (type == DT_Q5_K) {
        const uint8_t *qh = ((const block_q5_K *)w + c / 8)->qh;
        for (int l = 0; l < 32; l++)
            u[l] |= (uint8_t)(((qh[l] >> j) & 1) << 4);
    }
    uint8_t sc, m;
    qref_scale_min_k4(j, scales, &sc, &m);
    t.I = (int32_t)sc * dot_u8(u, a, 32);
    t.J = (int32_t)m * v->s32[c];
    t.A = half_fp16_to_f32(d);
    t.B = -half_fp16_to_f32(dmin);
    return t;
}

static float dot_ref(uint32_t type, int64_t n, const void *w, const void *xq)
{
    const qact_view v = qact_view_of(xq, n);
    const int is_k = type == DT_Q4_K || type == DT_Q5_K || type == DT_Q6_K;
    float acc[QACT_LANES] = {0};
    for (int64_t c = 0; c < n / QACT_CHUNK; c++) {
        const chunk_terms t = is_k ? terms_k(type, w, c, &v) : terms_legacy(type, w, c, &v);
        const float da = v.d[c];
        const float p = (t.A * da) * (float)t.I;
        const float q = (t.B * da) * (float)t.J;
        acc[c % QACT_LANES] += p + q;
    }
    return qact_reduce16(acc);
}

#define REF_DOT(name, type)                                                                    \
    static void name(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out) \
    {                                                                                          \
        for (int k = 0; k < nt; k++)                                                           \
            out[k] = dot_ref(type, n, w, (const uint8_t *)xq + k * xs);                        \
    }
REF_DOT(ref_q4_0, DT_Q4_0)
REF_DOT(ref_q4_1, DT_Q4_1)
REF_DOT(ref_q5_0, DT_Q5_0)
REF_DOT(ref_q5_1, DT_Q5_1)
REF_DOT(ref_q8_0, DT_Q8_0)
REF_DOT(ref_q4_K, DT_Q4_K)
REF_DOT(ref_q5_K, DT_Q5_K)
REF_DOT(ref_q6_K, DT_Q6_K)
REF_DOT(ref_mxfp4, DT_MXFP4)
#undef REF_DOT

qact_dot_fn qact_dot_ref(uint32_t type)
{
    switch (type) {
    case DT_Q4_0: return ref_q4_0;
    case DT_Q4_1: return ref_q4_1;
    case DT_Q5_0: return ref_q5_0;
    case DT_Q5_1: return ref_q5_1;
    case DT_Q8_0: return ref_q8_0;
    case DT_Q4_K: return ref_q4_K;
    case DT_Q5_K: return ref_q5_K;
    case DT_Q6_K: return ref_q6_K;
    case DT_MXFP4: return ref_mxfp4;
    default: return NULL;
    }
}
