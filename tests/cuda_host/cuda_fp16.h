/* cuda_fp16.h (host shim) - __half as its bits, conversions through the
 * host compiler's _Float16 (round to nearest even, as __float2half_rn). */
#ifndef KVANT_CUDA_HOST_FP16_H
#define KVANT_CUDA_HOST_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t x;
};

static inline __half __ushort_as_half(unsigned short u)
{
    __half h;
    h.x = u;
    return h;
}
static inline unsigned short __half_as_ushort(__half h)
{
    return h.x;
}
static inline float __half2float(__half h)
{
    _Float16 f;
    memcpy(&f, &h.x, 2);
    return (float)f;
}
static inline __half __float2half_rn(float f)
{
    _Float16 v = (_Float16)f;
    __half h;
    memcpy(&h.x, &v, 2);
    return h;
}
static inline __half __float2half(float f)
{
    return __float2half_rn(f);
}

#endif
