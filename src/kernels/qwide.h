/* qwide.h - kernels-internal: activation rows quantized to int16 ("qwide")
 * for the output head of q8_0 weights, and their dot products.
 *
 * The head (a tensor marked exact, kernels/matmul.h) wants about f32
 * accuracy; for most types it takes two int8 terms per token (qact.h, the
 * second the residual of the first), which doubles the integer work.  For
 * q8_0 weights one int16 term does as well at the cost of one int8 term:
 * VPMADDWD multiplies the sign-extended weight codes by the int16 codes,
 * 16 products an instruction, where two int8 terms need four.
 *
 * qwide row format (n values, n % 32 == 0, zero-padded to np = qact_padded(n)):
 *     int16_t cs[np];     codes c[i] = nearbyint(x[i] / d[ch]), |c| <= 32767
 *     float   d[np/32];   per 32-value chunk: d = amax(|x|)/32767 (0: all zero)
 * qwide_row_bytes(n) bytes (a multiple of 64).  x must be finite.  Each
 * value's rounding error is at most d/2 = amax/65534 (two int8 terms:
 * amax(residual)/254 <= amax/64516).
 *
 * Dot specification (qwide_dot_q8_0_ref), weight block c = (f16 scale A,
 * int8 codes q[32]):
 *     raw = sum q[i]*cs[32c+i] (exact int32: |raw| <= 32*128*32767 < 2^31)
 *     v_c = (A*d[c]) * (float)raw     (f32, each operation rounded, in order;
 *                                      (float)raw rounds to nearest even)
 *     acc[c % 16] += v_c; result = qact_reduce16(acc), as qact.h.
 *
 * Packed rows (kernels/qpack.h) take the "interleaved" qwide row: within
 * each group of 512 values, int16 element 64r + 32h + 16e + 2j + s holds
 * the code of chunk 8h + j at position 4r + 2s + e (r < 8 slots of four
 * codes, h < 2 halves of 8 chunks, e: even or odd position, s < 2), so the
 * even and odd bytes of a packed code vector, sign-extended in place to
 * int16, meet their activations lane for lane and every 32-bit lane of a
 * VPMADDWD holds one chunk's products.
 */
#ifndef KVANT_QWIDE_H
#define KVANT_QWIDE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/qact.h"

static inline size_t qwide_row_bytes(int64_t n)
{
    const int64_t np = qact_padded(n);
    return (size_t)(2 * np + np / 32 * 4);
}

typedef struct qwide_view {
    const int16_t *cs;
    const float *d;
} qwide_view;

static inline qwide_view qwide_view_of(const void *p, int64_t n)
{
    const int64_t np = qact_padded(n);
    const uint8_t *b = p;
    qwide_view v = {(const int16_t *)b, (const float *)(b + 2 * np)};
    return v;
}

/* Quantizes one row x[n] (n % 32 == 0) into dst (qwide_row_bytes(n)). */
void qwide_quantize_ref(const float *x, int64_t n, void *dst);

/* Puts a qwide row's codes in the packed kernels' order (above), in place. */
void qwide_interleave(void *xq, int64_t n);

/* out[k] = dot(stored q8_0 row w, qwide row xq + k * xs), k < nt (1..4),
 * the specification above; a qact_dot_fn. */
void qwide_dot_q8_0_ref(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out);

/* dot(packed q8_0 row w + r * rs, interleaved qwide row xq + k * xs) into
 * y[k * ys + r] for r < n_rows, k < nt (1..4), a qact_dot_tile_fn; each
 * result bitwise qwide_dot_q8_0_ref of the stored and in-order rows.
 * x86-64 builds only: AVX2 (VPMADDWD) and AVX-512 VNNI (VPDPWSSD, the
 * same exact sums); call only on a CPU with the ISA. */
void qwide_tile_q8_0_packed_avx2(int64_t n, const void *w, size_t rs, int64_t n_rows,
                                 const void *xq, size_t xs, int nt, float *y, int64_t ys,
                                 int stream);
void qwide_tile_q8_0_packed_avx512(int64_t n, const void *w, size_t rs, int64_t n_rows,
                                   const void *xq, size_t xs, int nt, float *y, int64_t ys,
                                   int stream);
/* out[k] = dot(stored q8_0 row w, in-order qwide row xq + k * xs), k < nt,
 * a qact_dot_fn (AVX2, also chosen on AVX-512 CPUs; x86-64 builds only). */
void qwide_dot_q8_0_avx2(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out);

#endif
