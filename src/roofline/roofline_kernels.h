/* roofline_kernels.h - the probes' kernels, one set per instruction set
 * (roofline_avx2.c, roofline_avx512.c; the scalar read kernel in
 * roofline.c).  Header only, so the per-ISA files include no header of the
 * module that calls them. */
#ifndef KVANT_ROOFLINE_KERNELS_H
#define KVANT_ROOFLINE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/* Kernels (exposed for tests).  Sum of n uint64 words (n % 64 == 0), in
 * any order: integer addition makes every order give the same value. */
uint64_t roofline_read_sum_ref(const uint64_t *p, size_t n);
uint64_t roofline_read_sum_avx512(const uint64_t *p, size_t n);
uint64_t roofline_read_sum_avx2(const uint64_t *p, size_t n);
/* `iters` rounds of independent FMA / VNNI chains; the returned value
 * depends on every chain so the work cannot be removed.  Flops (ops)
 * performed: iters * ROOFLINE_FMA_FLOPS_PER_ITER (VNNI likewise). */
#define ROOFLINE_FMA_FLOPS_PER_ITER (12 * 16 * 2)
#define ROOFLINE_VNNI_OPS_PER_ITER (12 * 64 * 2)
#define ROOFLINE_FMA2_FLOPS_PER_ITER (12 * 8 * 2)
#define ROOFLINE_INT8_AVX2_OPS_PER_ITER (6 * 32 * 2)
float roofline_fma_avx512(int64_t iters);
int32_t roofline_vnni_avx512(int64_t iters);
float roofline_fma_avx2(int64_t iters);
int32_t roofline_int8_avx2(int64_t iters);

#endif
