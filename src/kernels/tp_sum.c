/* tp_sum.c - the rank-order sum of tensor-parallel partials (see tp_sum.h). */
#include "kernels/tp_sum.h"

#include <stddef.h>

void tp_sum_ordered(float *dst, const float *src, int n, int64_t count, int64_t stride)
{
    for (int64_t i = 0; i < count; i++) {
        float v = src[i];
        for (int r = 1; r < n; r++)
            v += src[(size_t)r * (size_t)stride + (size_t)i];
        dst[i] = v;
    }
}

int64_t tp_chunk_of(int64_t count, int n)
{
    return (count + n - 1) / n;
}
