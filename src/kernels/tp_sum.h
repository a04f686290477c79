/* tp_sum.h - the rank-order sum of tensor-parallel partials (par/tp.h),
 * the host reference of every path that adds them: the CPU reductions
 * use it directly, the CUDA kernel (backend/cuda/cuda_tp.h) must match
 * it bitwise (tests/unit/test_cuda.c).  A kernel, on the bottom floor, so
 * both par/ and backend/cuda/ can include it.
 *
 * The sum is ((p0 + p1) + p2) + ... in float, element by element, so the
 * result depends only on the partials and the rank order, never on the
 * transport, the message size or how the elements are cut into chunks.
 *
 * Threading: pure functions over caller memory; any thread.
 */
#ifndef KVANT_KERNELS_TP_SUM_H
#define KVANT_KERNELS_TP_SUM_H

#include <stdint.h>

/* dst[i] = ((src[i] + src[stride + i]) + src[2 stride + i]) + ... over n
 * ranks, i < count.  dst may alias src (the first rank's row). */
void tp_sum_ordered(float *dst, const float *src, int n, int64_t count, int64_t stride);
/* Elements per rank of a reduce-scatter of count elements over n ranks
 * (the last chunk padded with zeros): ceil(count / n). */
int64_t tp_chunk_of(int64_t count, int n);

#endif
