/* qwide_avx512.c - the packed q8_0 x qwide dot (qwide.h) on AVX-512 VNNI:
 * qwide_body.h with VPDPWSSD on 256- and 128-bit vectors (AVX512_VL),
 * one instruction where AVX2 takes VPMADDWD and an add.  The sums are the
 * same exact integers, so the results are bitwise the AVX2 kernel's and
 * qwide_dot_q8_0_ref's.  Built with the AVX-512 flags, under -std=c11. */
#include <immintrin.h>

#include "kernels/qact_avx2_common.h"
#include "kernels/qwide.h"

#define QW_MADD_256(S, w, a) _mm256_dpwssd_epi32((S), (w), (a))
#define QW_MADD2_128(S, we, ae, wo, ao) _mm_dpwssd_epi32(_mm_dpwssd_epi32((S), (we), (ae)), (wo), (ao))
#include "kernels/qwide_body.h"

QW_ENTRIES(avx512)
