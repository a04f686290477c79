/* kvdtype.c - the KV cache types (see kvdtype.h). */
#include "kernels/kvdtype.h"

#include <stdio.h>

#include "kernels/dtype.h"

static const uint32_t KV_TYPES[] = {DT_F32, DT_F16, DT_BF16, DT_Q8_0, DT_Q4_0};
#define N_KV_TYPES (sizeof KV_TYPES / sizeof KV_TYPES[0])

int kvdtype_ok(uint32_t t)
{
    for (size_t i = 0; i < N_KV_TYPES; i++)
        if (KV_TYPES[i] == t)
            return 1;
    return 0;
}

const char *kvdtype_list(char *buf, size_t cap)
{
    size_t at = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t i = 0; i < N_KV_TYPES && at < cap; i++) {
        int n = snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", dtype_get(KV_TYPES[i])->name);
        if (n < 0)
            break;
        at += (size_t)n;
    }
    return buf;
}
