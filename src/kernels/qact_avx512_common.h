/* qact_avx512_common.h - kernels-internal: what the AVX-512 int8 kernel
 * files (qact_avx512.c: stored rows; qpack_avx512.c: packed rows) share.
 * Include only from those two files (built with the AVX-512 flags). */
#ifndef KVANT_QACT_AVX512_COMMON_H
#define KVANT_QACT_AVX512_COMMON_H

#include <immintrin.h>
#include <string.h>

#include "kernels/qact.h"
#include "kernels/quant_ref.h"

#define AI static inline __attribute__((always_inline))

/* One f16 to f32 with F16C (exact, as half_fp16_to_f32, without the call). */
AI float h2f(half_fp16 h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#define NTM QACT_MULTI_MAX

AI size_t block_bytes(uint32_t t)
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

/* Bytes of weights per 16-chunk group, and for the last partial group. */
AI size_t group_wbytes(uint32_t t, int64_t chunks)
{
    return is_k(t) ? (size_t)(chunks / 8) * block_bytes(t) : (size_t)chunks * block_bytes(t);
}

#define QACT_PREFETCH 2048 /* several tokens: bytes ahead into L1 (qact_prefetch_w) */

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

#endif
