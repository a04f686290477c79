/* ssm.h - the selective-state-space scan of a Mamba-2 layer (hybrid
 * models): one head's state updated by one token, and the head's output
 * read from it.  Called for every token, layer and head (e.g. 48 heads x
 * 36 layers a token at P = 64, N = 128), so it allocates nothing.
 *
 * The reference (ssm.c) is the specification; the AVX2 and AVX-512 scans
 * (ssm_avx2.c, ssm_avx512.c) equal it bitwise, states and outputs: the
 * same roundings in the same order (B[n] * xdt rounded, then one fused
 * multiply-add into the state, one into the lane's partial sum), and the
 * partial sums reduced by the same tree. */
#ifndef KVANT_SSM_H
#define KVANT_SSM_H

#include <math.h>
#include <stdint.h>

#include "kernels/dtype.h"

/* One head of a Mamba-2 layer for one token, in place on its state.
 * s: [P][N] the head's state (N = d_state, P = head_dim), x: [P] the head's
 * inputs, B, C: [N] its group's input and output projections, dA =
 * exp(dt * A_h) and dt (softplus of the raw dt plus bias) computed by the
 * caller; y: [P] the head's outputs (written).  For each p:
 *   xdt = x[p] * dt;  s[p][n] = fmaf(s[p][n], dA, B[n] * xdt)  (B[n] * xdt rounded first)
 *   y[p] = sum_n s[p][n] * C[n]  in the fixed order below
 * The sum's order (the specification the SIMD versions equal bitwise): 16
 * partial sums acc[j] (j = n % 16) each accumulated with fmaf(s, C, acc) in
 * increasing n, then r[j] = acc[j] + acc[j + 8] (j < 8), r[j] = r[j] +
 * r[j + 4] (j < 4), r[j] + r[j + 2] (j < 2), y = r[0] + r[1].  Any N >= 1
 * (N % 16 != 0 handled by a scalar tail that adds into the same lanes).
 * s must not overlap x, B, C or y; any alignment.  Thread-safe (no state). */
typedef void (*ssm_scan_fn)(float *s, const float *x, const float *B, const float *C,
                            float dA, float dt, int32_t P, int32_t N, float *y);
void ssm_scan_ref(float *s, const float *x, const float *B, const float *C, float dA, float dt,
                  int32_t P, int32_t N, float *y);
/* The scan for isa: the reference when isa has none, or off x86.  Choose
 * once (at init), call many times. */
ssm_scan_fn ssm_scan_for(kernel_isa isa);

/* softplus as llama.cpp: x > 20 ? x : log1pf(expf(x)) */
static inline float ssm_softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

#endif
