/* ssm.c - the reference Mamba-2 scan and the ISA choice (ssm.h); the SIMD
 * scans are in ssm_avx2.c / ssm_avx512.c.
 *
 * Every rounding is spelled out so that the reference means the same on
 * every compiler and target: the product B[n] * xdt is its own statement
 * (rounded to float), and both multiply-adds are explicit fmaf.  No
 * multiply feeds an addition here, so there is nothing for floating-point
 * contraction (-ffp-contract, FMA on arm64) to fuse: the reference gives
 * the same bits whether fmaf is an instruction or libm's call. */
#include "kernels/ssm.h"

#include <math.h>

#include "util/arch.h"

/* The partial sums per row, one per lane of a 16-wide vector. */
#define SSM_LANES 16

/* y from the 16 partial sums, by the tree of ssm.h. */
static float lanes_reduce(float acc[SSM_LANES])
{
    for (int32_t h = SSM_LANES / 2; h >= 1; h /= 2)
        for (int32_t j = 0; j < h; j++)
            acc[j] = acc[j] + acc[j + h];
    return acc[0];
}

void ssm_scan_ref(float *s, const float *x, const float *B, const float *C, float dA, float dt,
                  int32_t P, int32_t N, float *y)
{
    for (int32_t p = 0; p < P; p++) {
        float *row = s + (int64_t)p * N;
        const float xdt = x[p] * dt;
        float acc[SSM_LANES] = {0};
        /* blocks of 16, n = n0 + j; the last one short when N % 16 != 0 */
        for (int32_t n0 = 0; n0 < N; n0 += SSM_LANES) {
            const int32_t w = N - n0 < SSM_LANES ? N - n0 : SSM_LANES;
            for (int32_t j = 0; j < w; j++) {
                const float bx = B[n0 + j] * xdt;
                const float v = fmaf(row[n0 + j], dA, bx);
                row[n0 + j] = v;
                acc[j] = fmaf(v, C[n0 + j], acc[j]);
            }
        }
        y[p] = lanes_reduce(acc);
    }
}

#if KVANT_X86
void ssm_scan_avx2(float *s, const float *x, const float *B, const float *C, float dA, float dt,
                   int32_t P, int32_t N, float *y);
void ssm_scan_avx512(float *s, const float *x, const float *B, const float *C, float dA,
                     float dt, int32_t P, int32_t N, float *y);
#endif

ssm_scan_fn ssm_scan_for(kernel_isa isa)
{
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512)
        return ssm_scan_avx512;
    if (isa == KERNEL_ISA_AVX2)
        return ssm_scan_avx2;
#endif
    (void)isa;
    return ssm_scan_ref;
}
