/* qpack.h - weight rows repacked at load into the layout the integer
 * kernels want ("packed" rows), and the matching activation order.
 *
 * A packed row of a Q4_0, Q4_1, Q8_0 or Q4_K tensor holds the same bytes as the
 * stored row, permuted inside each group of up to QACT_LANES = 16 blocks
 * (512 values; the last group of a row holds tc = the remaining blocks,
 * 1..16).  A group, with code(c, p) the code of value p of block c as
 * stored and L = 4 tc the length of one code vector:
 *     kv_fp16 d[tc];                      every block's scale, in order
 *     kv_fp16 m[tc];                      (q4_1 only) every block's min
 *     q4_0, q4_1: uint8_t qs[4][L]:       qs[i][b] low nibble  = code(b/4, 8i + b%4)
 *                                                  high nibble = code(b/4, 8i + 4 + b%4)
 *     q8_0:       int8_t  qs[8][L]:       qs[r][b] = code(b/4, 4r + b%4)
 *   q4_K groups hold whole super-blocks (tc = 8 or 16): their 16-byte heads
 *   (d, dmin, scales[12], as stored) replace d[] and m[], the nibbles
 *   follow in the q4_0 order above (code = the chunk's stored nibble);
 * so one 64-byte load feeds 16 blocks at once (AVX2: 32 bytes, 8 blocks),
 * every SIMD lane of 4 bytes belongs to one block, and the integer dot
 * needs no horizontal reduction; a short last group is read with masked
 * loads.  A group is as long as its stored blocks: a packed tensor has
 * the stored tensor's size and row stride.
 *
 * Activations for a packed matmul are the qact rows of qact.h with the
 * codes of every group (the row is zero-padded to whole groups) in the
 * same order (the "interleaved" row): byte 64r + b of the group = code of
 * chunk b/4, position 4r + b%4; the scales and sums stay per chunk.
 *
 * Results: a packed dot is bitwise the qact reference (qact_dot_ref) of
 * the stored row against the in-order activations; the layout only moves
 * bytes.  Pure functions, thread-safe, no allocation.
 */
#ifndef KVANT_QPACK_H
#define KVANT_QPACK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/qact.h"

static inline uint32_t qpack_base(uint32_t type)
{
    return type & ~DT_PACKED;
}

/* 1 when `type` has a packed layout for rows of n values. */
int qpack_supported(uint32_t type, int64_t n);

/* Packs n_rows rows of n values (row stride row_bytes) from src into dst,
 * in place when dst == src. */
void qpack_rows(uint32_t type, const void *src, void *dst, int64_t n, int64_t n_rows,
                size_t row_bytes);

/* The inverse: packed rows back to the stored layout (in place allowed). */
void qpack_unpack_rows(uint32_t type, const void *src, void *dst, int64_t n, int64_t n_rows,
                       size_t row_bytes);

/* Puts the codes of every group of one qact row (qact.h, n values) into
 * the interleaved order, in place. */
void qpack_interleave_act(void *xq, int64_t n);

/* Dot kernels over packed rows and interleaved activations, with the
 * contract of qact_dot_fn; NULL for unsupported types.  Call only when
 * dtype_isa() supports the ISA. */
qact_dot_fn qpack_dot_avx2(uint32_t type);
qact_dot_fn qpack_dot_avx512(uint32_t type);

#endif
