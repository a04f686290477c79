/* qwide.c - scalar specification of the int16 activation rows and of
 * their dot with q8_0 rows (format and float order in qwide.h). */
#include "kernels/qwide.h"

#include <math.h>
#include <string.h>

#include "kernels/half.h"

#define QWIDE_MAX 32767

void qwide_quantize_ref(const float *x, int64_t n, void *dst)
{
    const int64_t np = qact_padded(n), nc = n / QACT_CHUNK;
    int16_t *cs = dst;
    float *d = (float *)((uint8_t *)dst + 2 * np);
    for (int64_t c = 0; c < nc; c++) {
        const float *xc = x + c * QACT_CHUNK;
        float amax = 0.0f;
        for (int i = 0; i < QACT_CHUNK; i++)
            amax = fmaxf(amax, fabsf(xc[i]));
        const float dc = amax / (float)QWIDE_MAX;
        const float id = dc != 0.0f ? 1.0f / dc : 0.0f;
        for (int i = 0; i < QACT_CHUNK; i++) {
            float q = nearbyintf(xc[i] * id);
            q = q > QWIDE_MAX ? QWIDE_MAX : q < -QWIDE_MAX ? -QWIDE_MAX : q;
            cs[c * QACT_CHUNK + i] = (int16_t)q;
        }
        d[c] = dc;
    }
    memset(cs + nc * QACT_CHUNK, 0, (size_t)(np - nc * QACT_CHUNK) * sizeof *cs);
    for (int64_t c = nc; c < np / QACT_CHUNK; c++)
        d[c] = 0.0f;
}

void qwide_interleave(void *xq, int64_t n)
{
    int16_t *cs = xq;
    int16_t tmp[QACT_GROUP];
    for (int64_t g = 0; g < qact_padded(n) / QACT_GROUP; g++) {
        int16_t *q = cs + g * QACT_GROUP;
        memcpy(tmp, q, sizeof tmp);
        for (int r = 0; r < 8; r++)
            for (int h = 0; h < 2; h++)
                for (int e = 0; e < 2; e++)
                    for (int j = 0; j < 8; j++)
                        for (int s = 0; s < 2; s++)
                            q[64 * r + 32 * h + 16 * e + 2 * j + s] =
                                tmp[QACT_CHUNK * (8 * h + j) + 4 * r + 2 * s + e];
    }
}

void qwide_dot_q8_0_ref(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out)
{
    const block_q8_0 *b = w;
    for (int k = 0; k < nt; k++) {
        const qwide_view v = qwide_view_of((const uint8_t *)xq + (size_t)k * xs, n);
        float acc[QACT_LANES] = {0};
        for (int64_t c = 0; c < n / QACT_CHUNK; c++) {
            int32_t raw = 0;
            for (int i = 0; i < QACT_CHUNK; i++)
                raw += (int32_t)b[c].qs[i] * v.cs[c * QACT_CHUNK + i];
            const float A = half_fp16_to_f32(b[c].d);
            acc[c % QACT_LANES] += (A * v.d[c]) * (float)raw;
        }
        out[k] = qact_reduce16(acc);
    }
}
