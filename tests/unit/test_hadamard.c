/* test_hadamard.c - the Walsh-Hadamard rows (kernels/hadamard.h): the
 * reference equals the product with the Sylvester matrix H_d / sqrt(d)
 * computed in double from its definition (entry (i, j) = (-1)^popcount(i &
 * j)) within float rounding, applying it twice gives the row back, and the
 * rows of every ISA this CPU has are bitwise equal to the reference for
 * every power of two 2..512 and several row counts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/hadamard.h"
#include "testutil.h"

static void test_reference(void)
{
    tu_rng r = {7};
    for (int32_t d = 2; d <= 256; d *= 2) {
        float *x = malloc((size_t)d * sizeof *x), *x0 = malloc((size_t)d * sizeof *x);
        for (int32_t i = 0; i < d; i++)
            x0[i] = x[i] = tu_rand_normal(&r) * (i == 3 ? 40.0f : 1.0f); /* an outlier */
        hadamard_rows_ref(x, 1, d);
        double err = 0, scale = 0;
        for (int32_t i = 0; i < d; i++) {
            double y = 0;
            for (int32_t j = 0; j < d; j++)
                y += (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0 : 1.0) * x0[j];
            y /= sqrt((double)d);
            err = fmax(err, fabs(y - x[i]));
            scale = fmax(scale, fabs(y));
        }
        CHECKF(err <= 1e-5 * scale, "d %d: max error %.3g of %.3g", d, err, scale);
        hadamard_rows_ref(x, 1, d); /* its own inverse */
        double back = 0;
        for (int32_t i = 0; i < d; i++)
            back = fmax(back, fabs((double)x[i] - x0[i]));
        CHECKF(back <= 1e-5 * scale, "d %d: H(Hx) - x = %.3g", d, back);
        free(x);
        free(x0);
    }
    CHECK(hadamard_ok(64) && hadamard_ok(2) && !hadamard_ok(96) && !hadamard_ok(1) &&
          !hadamard_ok(0) && !hadamard_ok(8192));
}

static void test_isas(void)
{
    tu_rng r = {11};
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        hadamard_fn fn = hadamard_for((kernel_isa)isa);
        for (int32_t d = 2; d <= 512; d *= 2) {
            for (int64_t rows = 1; rows <= 5; rows += 2) {
                size_t n = (size_t)(rows * d);
                float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
                for (size_t i = 0; i < n; i++)
                    a[i] = b[i] = tu_rand_uniform(&r, -3.0f, 3.0f);
                hadamard_rows_ref(a, rows, d);
                fn(b, rows, d);
                CHECKF(!memcmp(a, b, n * sizeof *a), "%s d %d rows %lld: not bitwise equal",
                       dtype_isa_name((kernel_isa)isa), d, (long long)rows);
                free(a);
                free(b);
            }
        }
    }
}

int main(void)
{
    dtype_init();
    test_reference();
    test_isas();
    return tu_finish("test_hadamard");
}
