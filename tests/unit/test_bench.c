/* test_bench.c - roofline probes: the AVX-512 read kernel equals its
 * scalar twin exactly (integer sums) on random data, and a small
 * measurement returns positive, finite figures. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "roofline/roofline.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "util/arch.h"

int main(void)
{
    tu_rng r = {0xbe9c4ull};
    const size_t n = 64 * 1000;
    uint64_t *buf = malloc(n * sizeof *buf);
    CHECK(buf != NULL);
    for (size_t i = 0; i < n; i++)
        buf[i] = tu_rand_u64(&r);
#if KVANT_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        for (size_t len = 64; len <= n; len += 64 * 333)
            CHECK(roofline_read_sum_avx512(buf, len) == roofline_read_sum_ref(buf, len));
    }
    if (__builtin_cpu_supports("avx2")) {
        for (size_t len = 64; len <= n; len += 64 * 333)
            CHECK(roofline_read_sum_avx2(buf, len) == roofline_read_sum_ref(buf, len));
    }
#endif
    free(buf);
    roofline_result rl;
    CHECK(roofline_measure(2, (size_t)8 << 20, 1, &rl) == 0);
    CHECK(rl.read_gbps_1t > 0 && isfinite(rl.read_gbps_1t));
    CHECK(rl.read_gbps_nt > 0 && isfinite(rl.read_gbps_nt));
    CHECK(rl.threads == 2);
    /* the compute ceilings of the kernels' ISA (AVX2 and AVX-512 alike) */
    CHECKF(!strcmp(rl.isa, dtype_isa()), "roofline isa %s, kernels %s", rl.isa, dtype_isa());
    if (dtype_kernel_isa() != KERNEL_ISA_SCALAR) {
        CHECK(rl.fma_gflops_1t > 0 && rl.fma_gflops_nt > 0);
        CHECK(rl.vnni_gops_1t > 0 && rl.vnni_gops_nt > 0);
    } else {
        CHECK(rl.fma_gflops_1t == 0 && rl.vnni_gops_1t == 0);
    }
    return tu_finish("test_bench");
}
