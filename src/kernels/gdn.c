/* gdn.c - the reference Gated DeltaNet step and the ISA choice (gdn.h);
 * the SIMD steps are in gdn_avx2.c / gdn_avx512.c.
 *
 * Every rounding is spelled out so that the reference means the same on
 * every compiler and target: the decayed element M * decay is its own
 * statement (rounded to float), and the multiply-adds are explicit fmaf.
 * No multiply feeds an addition here, so there is nothing for
 * floating-point contraction (-ffp-contract, FMA on arm64) to fuse: the
 * reference gives the same bits whether fmaf is an instruction or libm's
 * call. */
#include "kernels/gdn.h"

#include <math.h>

#include "util/arch.h"

/* The partial sums per row, one per lane of a 16-wide vector. */
#define GDN_LANES 16

/* The sum from the 16 partial sums, by the tree of gdn.h. */
static float lanes_reduce(float acc[GDN_LANES])
{
    for (int32_t h = GDN_LANES / 2; h >= 1; h /= 2)
        for (int32_t j = 0; j < h; j++)
            acc[j] = acc[j] + acc[j + h];
    return acc[0];
}

/* Pass 1 on one row: decayed in place, returns sum_i m_i k_i. */
static float row_decay_dot(float *row, int32_t dk, const float *k, float decay)
{
    float acc[GDN_LANES] = {0};
    /* blocks of 16, i = i0 + j; the last one short when dk % 16 != 0 */
    for (int32_t i0 = 0; i0 < dk; i0 += GDN_LANES) {
        const int32_t w = dk - i0 < GDN_LANES ? dk - i0 : GDN_LANES;
        for (int32_t j = 0; j < w; j++) {
            const float m = row[i0 + j] * decay;
            row[i0 + j] = m;
            acc[j] = fmaf(m, k[i0 + j], acc[j]);
        }
    }
    return lanes_reduce(acc);
}

/* Pass 2 on one row: row += d k in place, returns sum_i m_i q_i. */
static float row_update_dot(float *row, int32_t dk, const float *k, const float *q, float d)
{
    float acc[GDN_LANES] = {0};
    for (int32_t i0 = 0; i0 < dk; i0 += GDN_LANES) {
        const int32_t w = dk - i0 < GDN_LANES ? dk - i0 : GDN_LANES;
        for (int32_t j = 0; j < w; j++) {
            const float m = fmaf(d, k[i0 + j], row[i0 + j]);
            row[i0 + j] = m;
            acc[j] = fmaf(m, q[i0 + j], acc[j]);
        }
    }
    return lanes_reduce(acc);
}

void gdn_step_ref(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                  const float *v, float decay, float beta, float scale, float *delta, float *o)
{
    for (int32_t j = 0; j < dv; j++) {
        const float s = row_decay_dot(M + (int64_t)j * dk, dk, k, decay);
        delta[j] = (v[j] - s) * beta;
    }
    for (int32_t j = 0; j < dv; j++) {
        const float s = row_update_dot(M + (int64_t)j * dk, dk, k, q, delta[j]);
        o[j] = s * scale;
    }
}

#if KVANT_X86
void gdn_step_avx2(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                   const float *v, float decay, float beta, float scale, float *delta, float *o);
void gdn_step_avx512(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                     const float *v, float decay, float beta, float scale, float *delta,
                     float *o);
#endif

gdn_step_fn gdn_step_for(kernel_isa isa)
{
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512)
        return gdn_step_avx512;
    if (isa == KERNEL_ISA_AVX2)
        return gdn_step_avx2;
#endif
    (void)isa;
    return gdn_step_ref;
}
