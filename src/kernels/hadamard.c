/* hadamard.c - the reference Walsh-Hadamard rows and the ISA choice
 * (hadamard.h); the SIMD rows are in hadamard_avx2.c / hadamard_avx512.c. */
#include "kernels/hadamard.h"

#include <math.h>

#include "util/arch.h"

int hadamard_ok(int32_t d)
{
    return d >= 2 && d <= 4096 && (d & (d - 1)) == 0;
}

void hadamard_rows_ref(float *x, int64_t n_rows, int32_t d)
{
    const float norm = 1.0f / sqrtf((float)d);
    for (int64_t r = 0; r < n_rows; r++, x += d) {
        for (int32_t h = 1; h < d; h *= 2)
            for (int32_t i = 0; i < d; i += 2 * h)
                for (int32_t j = i; j < i + h; j++) {
                    const float a = x[j], b = x[j + h];
                    x[j] = a + b;
                    x[j + h] = a - b;
                }
        for (int32_t j = 0; j < d; j++)
            x[j] *= norm;
    }
}

#if KVANT_X86
void hadamard_rows_avx2(float *x, int64_t n_rows, int32_t d);
void hadamard_rows_avx512(float *x, int64_t n_rows, int32_t d);
#endif

hadamard_fn hadamard_for(kernel_isa isa)
{
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512)
        return hadamard_rows_avx512;
    if (isa == KERNEL_ISA_AVX2)
        return hadamard_rows_avx2;
#endif
    (void)isa;
    return hadamard_rows_ref;
}
