/* test_tp_sum.c - the rank-order sum of tensor-parallel partials
 * (kernels/tp_sum.h), the host reference the CPU reductions use and the CUDA
 * kernel must match (test_cuda): the order is the rank order (checked with
 * values where float addition is not associative), rows are read at the
 * given stride, and the reduce-scatter cut (chunks of tp_chunk_of, the last
 * padded with zeros, each chunk summed on its owner, then gathered) gives
 * bitwise the same values as one ordered sum of the gathered partials. */
#include <stdlib.h>
#include <string.h>

#include "kernels/tp_sum.h"
#include "testutil.h"

static void test_order(void)
{
    /* (1e8 + -1e8) + 1 = 1, but 1e8 + (-1e8 + 1) = 0 in float */
    const float src[3] = {1e8f, -1e8f, 1.0f};
    float dst = -5.0f;
    tp_sum_ordered(&dst, src, 3, 1, 1);
    CHECKF(dst == 1.0f, "rank order: got %g, want 1", dst);
    const float rev[3] = {1.0f, -1e8f, 1e8f}; /* the other order gives another value */
    tp_sum_ordered(&dst, rev, 3, 1, 1);
    CHECKF(dst == 0.0f, "reversed order: got %g, want 0", dst);
    /* one rank: a copy; dst may be the first row (in place) */
    float x[4] = {1.5f, -2.0f, 3.25f, 7.0f}, y[4];
    tp_sum_ordered(y, x, 1, 4, 4);
    CHECK(!memcmp(x, y, sizeof x));
    float two[6] = {1, 2, 3, 10, 20, 30};
    tp_sum_ordered(two, two, 2, 3, 3);
    CHECK(two[0] == 11 && two[1] == 22 && two[2] == 33);
}

static void test_stride(void)
{
    /* rows of 3 values at a stride of 5: the gaps are never read */
    const float src[15] = {1, 2, 3, 99, 99, 10, 20, 30, 99, 99, 100, 200, 300, 99, 99};
    float dst[3];
    tp_sum_ordered(dst, src, 3, 3, 5);
    CHECK(dst[0] == 111 && dst[1] == 222 && dst[2] == 333);
}

static void test_chunks(void)
{
    tu_rng r = {0x7e57};
    const int64_t counts[] = {1, 2, 7, 576, 1000, 4097};
    for (int n = 1; n <= 5; n++) {
        for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
            const int64_t count = counts[k], chunk = tp_chunk_of(count, n);
            CHECK(chunk * n >= count && chunk * n < count + n);
            /* every rank's partials, gathered: [n][count] */
            float *g = malloc((size_t)(n * count) * sizeof *g);
            float *a = malloc((size_t)count * sizeof *a);
            float *recv = malloc((size_t)(n * chunk) * sizeof *recv);
            float *b = malloc((size_t)(n * chunk) * sizeof *b);
            for (int64_t i = 0; i < n * count; i++)
                g[i] = tu_rand_normal(&r) * (i % 3 ? 1.0f : 1e4f);
            tp_sum_ordered(a, g, n, count, count); /* the all-gather path */
            /* the reduce-scatter path: owner o receives chunk o of every rank */
            for (int o = 0; o < n; o++) {
                for (int src = 0; src < n; src++) {
                    for (int64_t i = 0; i < chunk; i++) {
                        int64_t e = (int64_t)o * chunk + i;
                        recv[(int64_t)src * chunk + i] = e < count ? g[src * count + e] : 0.0f;
                    }
                }
                tp_sum_ordered(b + (int64_t)o * chunk, recv, n, chunk, chunk);
            }
            CHECKF(!memcmp(a, b, (size_t)count * sizeof *a),
                   "%d ranks, %lld values: the two paths differ", n, (long long)count);
            free(g), free(a), free(recv), free(b);
        }
    }
}

int main(void)
{
    test_order();
    test_stride();
    test_chunks();
    return tu_finish("test_tp_sum");
}
