/* cuda_quant.cuh - device dequantization of one 32-element chunk of a
 * weight row, for every type the CUDA kernels read.  Internal to
 * src/backend/cuda (included by .cu files only).
 *
 * Chunk c of a row holds elements [32c, 32c + 32).  The values are bit for
 * bit those of the scalar reference (src/kernels/quant_ref.c, ggml's
 * semantics): every product and sum is rounded to f32 in the reference's
 * order with __fmul_rn/__fadd_rn/__fsub_rn, which nvcc never contracts
 * into an FMA.  Block layouts come from kernels/dtype.h (plain C, the same
 * static_asserts as the CPU side).
 */
#ifndef KVANT_CUDA_QUANT_CUH
#define KVANT_CUDA_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

extern "C" {
#include "kernels/dtype.h"
}

#define CQ_DEV static __device__ __forceinline__
#define CQ_SPEC __device__ __forceinline__ /* explicit specializations take no storage class */

CQ_DEV float cq_h2f(const uint8_t *p) /* p 2-byte aligned */
{
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}

CQ_DEV float cq_bf2f(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

CQ_DEV uint32_t cq_u32(const uint8_t *p) /* unaligned little-endian */
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* q4_K / q5_K: 6-bit scale and min of sub-block j (ggml get_scale_min_k4) */
CQ_DEV void cq_scale_min_k4(int j, const uint8_t *q, float *sc, float *m)
{
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

template <int T>
__device__ __forceinline__ void cq_chunk(const uint8_t *row, int64_t c, float v[32]);

template <> CQ_SPEC void cq_chunk<DT_F32>(const uint8_t *row, int64_t c, float v[32])
{
    const float4 *p = (const float4 *)((const float *)row + 32 * c);
    if (((uintptr_t)p & 15) == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float4 f = p[i];
            v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 32; i++)
            v[i] = ((const float *)row)[32 * c + i];
    }
}

template <> CQ_SPEC void cq_chunk<DT_F16>(const uint8_t *row, int64_t c, float v[32])
{
    const uint16_t *h = (const uint16_t *)row + 32 * c;
#pragma unroll
    for (int i = 0; i < 32; i++)
        v[i] = __half2float(__ushort_as_half(h[i]));
}

template <> CQ_SPEC void cq_chunk<DT_BF16>(const uint8_t *row, int64_t c, float v[32])
{
    const uint16_t *h = (const uint16_t *)row + 32 * c;
#pragma unroll
    for (int i = 0; i < 32; i++)
        v[i] = cq_bf2f(h[i]);
}

template <> CQ_SPEC void cq_chunk<DT_Q4_0>(const uint8_t *row, int64_t c, float v[32])
{
    const uint8_t *b = row + c * sizeof(block_q4_0);
    const float d = cq_h2f(b);
    const uint8_t *qs = b + 2;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        v[j] = __fmul_rn((float)((qs[j] & 0x0F) - 8), d);
        v[j + 16] = __fmul_rn((float)((qs[j] >> 4) - 8), d);
    }
}

template <> CQ_SPEC void cq_chunk<DT_Q4_1>(const uint8_t *row, int64_t c, float v[32])
{
    const uint8_t *b = row + c * sizeof(block_q4_1);
    const float d = cq_h2f(b), m = cq_h2f(b + 2);
    const uint8_t *qs = b + 4;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        v[j] = __fadd_rn(__fmul_rn((float)(qs[j] & 0x0F), d), m);
        v[j + 16] = __fadd_rn(__fmul_rn((float)(qs[j] >> 4), d), m);
    }
}

template <> CQ_SPEC void cq_chunk<DT_Q5_0>(const uint8_t *row, int64_t c, float v[32])
{
    const uint8_t *b = row + c * sizeof(block_q5_0);
    const float d = cq_h2f(b);
    const uint32_t qh = cq_u32(b + 2);
    const uint8_t *qs = b + 6;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        v[j] = __fmul_rn((float)(((qs[j] & 0x0F) | h0) - 16), d);
        v[j + 16] = __fmul_rn((float)(((qs[j] >> 4) | h1) - 16), d);
    }
}

template <> CQ_SPEC void cq_chunk<DT_Q5_1>(const uint8_t *row, int64_t c, float v[32])
{
    const uint8_t *b = row + c * sizeof(block_q5_1);
    const float d = cq_h2f(b), m = cq_h2f(b + 2);
    const uint32_t qh = cq_u32(b + 4);
    const uint8_t *qs = b + 8;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        const int h0 = (int)((qh >> j) & 1) << 4, h1 = (int)((qh >> (j + 16)) & 1) << 4;
        v[j] = __fadd_rn(__fmul_rn((float)((qs[j] & 0x0F) | h0), d), m);
        v[j + 16] = __fadd_rn(__fmul_rn((float)((qs[j] >> 4) | h1), d), m);
    }
}

template <> CQ_SPEC void cq_chunk<DT_Q8_0>(const uint8_t *row, int64_t c, float v[32])
{
    const uint8_t *b = row + c * sizeof(block_q8_0);
    const float d = cq_h2f(b);
    const int8_t *qs = (const int8_t *)(b + 2);
#pragma unroll
    for (int j = 0; j < 32; j++)
        v[j] = __fmul_rn((float)qs[j], d);
}

/* q4_K: sub-block s (0..7) of block c/8; pairs of sub-blocks share 32
 * bytes of qs (low nibbles = even s, high nibbles = odd s). */
template <> CQ_SPEC void cq_chunk<DT_Q4_K>(const uint8_t *row, int64_t c, float v[32])
{
    const block_q4_K *b = (const block_q4_K *)(row + (c >> 3) * sizeof(block_q4_K));
    const int s = (int)(c & 7);
    const float d = __half2float(__ushort_as_half(b->d));
    const float dmin = __half2float(__ushort_as_half(b->dmin));
    float sc, m;
    cq_scale_min_k4(s, b->scales, &sc, &m);
    const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
    const uint8_t *q = b->qs + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++)
        v[l] = __fsub_rn(__fmul_rn(d1, (float)((q[l] >> shift) & 0xF)), m1);
}

template <> CQ_SPEC void cq_chunk<DT_Q5_K>(const uint8_t *row, int64_t c, float v[32])
{
    const block_q5_K *b = (const block_q5_K *)(row + (c >> 3) * sizeof(block_q5_K));
    const int s = (int)(c & 7);
    const float d = __half2float(__ushort_as_half(b->d));
    const float dmin = __half2float(__ushort_as_half(b->dmin));
    float sc, m;
    cq_scale_min_k4(s, b->scales, &sc, &m);
    const float d1 = __fmul_rn(d, sc), m1 = __fmul_rn(dmin, m);
    const uint8_t *ql = b->qs + 32 * (s >> 1);
    const int shift = (s & 1) * 4;
    const uint8_t hbit = (uint8_t)(1u << s);
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = ((ql[l] >> shift) & 0xF) + ((b->qh[l] & hbit) ? 16 : 0);
        v[l] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

/* q6_K: chunk s of block c/8 is quarter k = s % 4 of 128-element half
 * h = s / 4 (the reference's q1..q4 streams); scale index l/16 + 2k. */
template <> CQ_SPEC void cq_chunk<DT_Q6_K>(const uint8_t *row, int64_t c, float v[32])
{
    const block_q6_K *b = (const block_q6_K *)(row + (c >> 3) * sizeof(block_q6_K));
    const int s = (int)(c & 7), h = s >> 2, k = s & 3;
    const float d = __half2float(__ushort_as_half(b->d));
    const uint8_t *ql = b->ql + 64 * h + 32 * (k & 1);
    const uint8_t *qh = b->qh + 32 * h;
    const int8_t *sc = b->scales + 8 * h + 2 * k;
    const int lshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        const int q = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        v[l] = __fmul_rn(__fmul_rn(d, (float)sc[l >> 4]), (float)q);
    }
}

/* Calls f.template operator()<T>() for the runtime type t; false when t
 * has no kernel (cuda_stage_weight_supported is the same list). */
template <typename F> static inline bool cq_dispatch(uint32_t t, F &&f)
{
    switch (t) {
    case DT_F32: f.template operator()<DT_F32>(); return true;
    case DT_F16: f.template operator()<DT_F16>(); return true;
    case DT_BF16: f.template operator()<DT_BF16>(); return true;
    case DT_Q4_0: f.template operator()<DT_Q4_0>(); return true;
    case DT_Q4_1: f.template operator()<DT_Q4_1>(); return true;
    case DT_Q5_0: f.template operator()<DT_Q5_0>(); return true;
    case DT_Q5_1: f.template operator()<DT_Q5_1>(); return true;
    case DT_Q8_0: f.template operator()<DT_Q8_0>(); return true;
    case DT_Q4_K: f.template operator()<DT_Q4_K>(); return true;
    case DT_Q5_K: f.template operator()<DT_Q5_K>(); return true;
    case DT_Q6_K: f.template operator()<DT_Q6_K>(); return true;
    default: return false;
    }
}

#endif
