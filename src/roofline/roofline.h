/* roofline.h - machine ceilings measured in-process for `kvant bench`:
 * sustained read bandwidth (1 and N threads), peak fp32 FMA rate and peak
 * int8 VNNI (vpdpbusd) rate.  Each figure is the median of `reps` timed
 * runs after one warm-up run, so it shares the noise of the numbers it is
 * compared with.
 *
 * Ownership: stateless; buffers are allocated and freed inside each call.
 * Threading: each call spawns and joins its own threads; call from one
 * thread at a time (the measurements would otherwise disturb each other).
 */
#ifndef KVANT_ROOFLINE_H
#define KVANT_ROOFLINE_H

#include <stddef.h>
#include <stdint.h>

#define ROOFLINE_READ_BYTES_DEFAULT ((size_t)512 << 20) /* >> any LLC */

typedef struct roofline_result {
    const char *isa;          /* "avx512", "avx2" or "scalar": which kernels ran (the
                               * kernels' ISA, dtype_isa(), so KVANT_ISA applies) */
    int threads;
    double read_gbps_1t;      /* GB/s = 1e9 bytes/s */
    double read_gbps_nt;      /* all `threads` threads reading disjoint parts */
    double fma_gflops_1t;     /* fp32, 2 flops per FMA lane */
    double fma_gflops_nt;
    double vnni_gops_1t;      /* int8 u8*s8 products, 2 ops each: VPDPBUSD (AVX-512
                               * VNNI) or VPMADDUBSW+VPADDW (AVX2); 0 scalar */
    double vnni_gops_nt;
} roofline_result;

/* Measures everything; read_bytes 0 = ROOFLINE_READ_BYTES_DEFAULT.
 * Returns 0, or -1 when the buffer cannot be allocated (fields stay 0). */
int roofline_measure(int threads, size_t read_bytes, int reps, roofline_result *out);

#include "roofline/roofline_kernels.h" /* the probes' kernels (also for tests) */

#endif
