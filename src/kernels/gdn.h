/* gdn.h - the Gated DeltaNet step of hybrid models (Qwen3.5): one value
 * head's state decayed, corrected towards v along k by the delta rule, and
 * read along q, for one token.  Called for every token, layer and value
 * head (e.g. 16 heads x 18 layers a token at dv = dk = 128), so it
 * allocates nothing.
 *
 * The reference (gdn.c) is the specification; the AVX2 and AVX-512 steps
 * (gdn_avx2.c, gdn_avx512.c) equal it bitwise, state, delta and outputs:
 * the same roundings in the same order (the decayed element rounded, one
 * fused multiply-add into the state, one into the lane's partial sum) and
 * the partial sums reduced by the same tree as kernels/ssm.h. */
#ifndef KVANT_GDN_H
#define KVANT_GDN_H

#include <stdint.h>

#include "kernels/dtype.h"

/* One token of one value head of a Gated DeltaNet layer, in place on its
 * state.  M: [dv][dk] row-major (row j = value dim j, over the key dims),
 * q, k: [dk] (already L2-normed), v: [dv], decay = exp(g), beta (already
 * sigmoid), scale (1/sqrt(dk)), delta: [dv] scratch (written), o: [dv]
 * out.  Two passes over M:
 *   pass 1, each row j: m_i = M[j][i] * decay (rounded and stored);
 *           s = sum_i m_i k_i;  delta[j] = (v[j] - s) * beta
 *   pass 2, each row j: m_i = fmaf(delta[j], k_i, m_i) (stored);
 *           s = sum_i m_i q_i;  o[j] = s * scale
 * Each sum in the fixed order of kernels/ssm.h: 16 partial sums acc[i % 16]
 * accumulated with fmaf(m_i, k_i or q_i, acc) in increasing i, then r[j] =
 * acc[j] + acc[j + 8] (j < 8), r[j] + r[j + 4] (j < 4), r[j] + r[j + 2]
 * (j < 2), r[0] + r[1].  Any dk >= 1 (a short last block adds into the
 * same lanes), any dv >= 0.  Row j's pass 2 reads only row j and delta[j],
 * so an implementation may run both passes of a few rows before the next
 * rows, and may round M[j][i] * decay again in pass 2 instead of storing
 * it in pass 1: the bits are the same.  M must not overlap q, k, v, delta
 * or o; any alignment (64-byte aligned rows are faster).  Thread-safe (no
 * state). */
typedef void (*gdn_step_fn)(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                            const float *v, float decay, float beta, float scale, float *delta,
                            float *o);
void gdn_step_ref(float *M, int32_t dv, int32_t dk, const float *q, const float *k,
                  const float *v, float decay, float beta, float scale, float *delta, float *o);
/* The step for isa: the reference when isa has none, or off x86.  Choose
 * once (at init), call many times. */
gdn_step_fn gdn_step_for(kernel_isa isa);

#endif
