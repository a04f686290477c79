/* qact_avx2_common.h - kernels-internal: what the AVX2 int8 kernel files
 * (qact_avx2.c: stored rows; qpack_avx2.c: packed rows) share.  Include
 * only from those two files (built with -mavx2 -mfma -mf16c). */
#ifndef KVANT_QACT_AVX2_COMMON_H
#define KVANT_QACT_AVX2_COMMON_H

#include <immintrin.h>

#include "kernels/qact.h"

#define AI static inline __attribute__((always_inline))

/* One f16 to f32 with F16C (exact, as half_fp16_to_f32, without the call). */
AI float h2f(half_fp16 h)
{
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#define NTM QACT_MULTI_MAX
#define QACT2_PREFETCH 1024 /* bytes ahead of the weights being dotted */

/* mxfp4: 32 codes (bytes 0..15) -> their signed table values (blocks.h) */
AI __m256i mx_values(__m256i codes)
{
    const __m128i v = _mm_loadu_si128((const __m128i *)dt_mxfp4_values);
    return _mm256_shuffle_epi8(_mm256_set_m128i(v, v), codes);
}

/* mxfp4: eight E8M0 bytes (as int32 lanes) -> 2^(e-128) (dt_e8m0_half_bits) */
AI __m256 mx_scales(__m256i e)
{
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i big = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
    const __m256i small = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(small, big, _mm256_cmpgt_epi32(e, one)));
}

AI size_t chunk_wbytes(uint32_t t)
{
    switch (t) {
    case DT_Q4_0: return sizeof(block_q4_0);
    case DT_Q4_1: return sizeof(block_q4_1);
    case DT_Q5_0: return sizeof(block_q5_0);
    case DT_Q5_1: return sizeof(block_q5_1);
    case DT_Q8_0: return sizeof(block_q8_0);
    case DT_MXFP4: return sizeof(block_mxfp4);
    case DT_Q4_K: return sizeof(block_q4_K) / 8;
    case DT_Q5_K: return sizeof(block_q5_K) / 8;
    default: return sizeof(block_q6_K) / 8;
    }
}

/* nt tokens' views of the qact rows at xq (stride xs) and their 16-lane
 * accumulators at +0; acc_end reduces each token's lanes into out[k]. */
AI void acc_begin(const void *xq, size_t xs, int64_t n, int nt, qact_view xv[NTM],
                  __m256 acc[NTM][2])
{
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        xv[k] = qact_view_of((const uint8_t *)xq + (size_t)k * xs, n);
        acc[k][0] = acc[k][1] = _mm256_setzero_ps();
    }
}

AI void acc_end(__m256 acc[NTM][2], int nt, float *out)
{
#pragma GCC unroll 8
    for (int k = 0; k < nt; k++) {
        float l[QACT_LANES];
        _mm256_storeu_ps(l, acc[k][0]);
        _mm256_storeu_ps(l + 8, acc[k][1]);
        out[k] = qact_reduce16(l);
    }
}

#endif
