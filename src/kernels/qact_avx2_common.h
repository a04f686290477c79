/* qact_avx2_common.h - kernels-internal: what the AVX2 int8 kernel files
 * (qact_avx2.c: stored rows; qpack_avx2.c: packed rows; qwide_avx2.c and
 * qwide_avx512.c: the head's int16 rows) share.  Include only from those
 * files (built with -mavx2 -mfma -mf16c, or the AVX-512 flags). */
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
#define QACT2_PREFETCH 1024 /* several tokens: bytes ahead into L1 (qact_prefetch_w) */

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

/* The packed row a kernel walks: loads of a short group's codes stay in it. */
typedef struct pk_row {
    const uint8_t *begin, *end;
} pk_row;

/* The nvl (1..8) code dwords at p of a group with nvl chunks in this half;
 * the other lanes hold whatever the load brings: they meet the zero codes
 * of the activations' padding chunks (qact.h), so their products are 0.
 * A short group is the row's last, and 32 bytes from p may run past the
 * row (and the buffer): then the 32 bytes ending at the row's end are
 * loaded and moved down (p's distance to the row's end is a multiple of 4:
 * every region after p in the group is tc times 4, 16 or 32 bytes).  A
 * masked load is the last resort (rows under 32 bytes): it is slow on
 * some cores (Zen 1). */
AI __m256i pk_load(const uint8_t *p, int nvl, pk_row row)
{
    if (nvl == 8 || p + 32 <= row.end)
        return _mm256_loadu_si256((const __m256i *)p);
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    if (row.end - row.begin >= 32) {
        const uint8_t *q = row.end - 32;
        return _mm256_permutevar8x32_epi32(_mm256_loadu_si256((const __m256i *)q),
                                           _mm256_add_epi32(idx, _mm256_set1_epi32((int)(p - q) / 4)));
    }
    return _mm256_maskload_epi32((const int *)p, _mm256_cmpgt_epi32(_mm256_set1_epi32(nvl), idx));
}

/* The 4 tc code bytes at p (a code vector of the short group) in the low
 * lanes; the other lanes meet the activations' zero padding chunks.  A load
 * that would run past the row's end takes the 16 bytes ending there and
 * moves them down (PSHUFB wraps the lanes past the end: they stay unused). */
AI __m128i pk_load_tail(const uint8_t *p, pk_row row)
{
    if (p + 16 <= row.end)
        return _mm_loadu_si128((const __m128i *)p);
    const uint8_t *q = row.end - 16;
    const __m128i idx = _mm_add_epi8(_mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                     _mm_set1_epi8((char)(p - q)));
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)q), idx);
}

/* Two 8-byte halves, p0's in the low lanes and p1's in the high. */
AI __m128i pk_load2x8(const int8_t *p0, const int8_t *p1)
{
    return _mm_castpd_si128(
        _mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)p0)), (const double *)p1));
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
