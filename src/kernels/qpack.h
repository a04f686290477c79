/* qpack.h - weight rows repacked at load into the layout the integer
 * kernels want ("packed" rows), and the matching activation order.
 *
 * A packed row of a Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K or MXFP4 tensor
 * holds the same bytes as the stored row, permuted inside each group of up
 * to QACT_LANES = 16 blocks (512 values; the last group of a row holds tc =
 * the remaining blocks, 1..16).  A group, with code(c, p) the code of value
 * p of block c as stored and L = 4 tc the length of one code vector:
 *     half_fp16 d[tc];                      every block's scale, in order
 *                                         (mxfp4: uint8_t e[tc], its E8M0 bytes)
 *     half_fp16 m[tc];                      (q4_1, q5_1) every block's min
 *     uint32_t qh'[tc];                   (q5_0, q5_1) bit 4 of the codes:
 *                                         byte j, bit i / 4+i = that of the
 *                                         low / high nibble of qs[i][4c+j]
 *     q4_*, q5_*, mxfp4: uint8_t qs[4][L]: qs[i][b] low nibble = code(b/4, 8i + b%4)
 *                                                  high nibble = code(b/4, 8i + 4 + b%4)
 *                                         (the low 4 bits of the code)
 *     q8_0:       int8_t  qs[8][L]:       qs[r][b] = code(b/4, 4r + b%4)
 *   K-quant groups hold whole super-blocks (tc = 8 or 16):
 *     q4_K, q5_K: the super-blocks' 16-byte heads (d, dmin, scales[12], as
 *       stored) replace d[] and m[]; q5_K's qh'[tc] follows; then qs[4][L];
 *     q6_K: d[tc/8], int8 scales[tc/8][16], qs[4][L], then q2[2][L] with
 *       bits 4-5 of the codes: q2[v][b] bits 4-5 / 6-7 for the low / high
 *       nibble of qs[2v][b], bits 0-1 / 2-3 for those of qs[2v+1][b];
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

/* Offsets in a packed group of tc chunks of the code nibbles (qs) and of
 * the codes' extra bits (q5_*: qh', q6_K: the 2-bit planes; see qpack.c). */
static inline size_t qpack_qs_off(uint32_t type, int tc)
{
    switch (type) {
    case DT_Q4_1: return 4 * (size_t)tc;
    case DT_Q5_0: return 6 * (size_t)tc;
    case DT_Q5_1: return 8 * (size_t)tc;
    case DT_Q5_K: return 6 * (size_t)tc;  /* 16-byte heads per 8 chunks, qh' */
    case DT_Q6_K: return (size_t)(tc / 8) * 18; /* d, 16 scales per 8 chunks */
    case DT_MXFP4: return (size_t)tc;         /* e[tc] */
    default: return 2 * (size_t)tc;       /* q4_0, q8_0: d[tc]; q4_K: heads */
    }
}

static inline size_t qpack_qx_off(uint32_t type, int tc)
{
    if (type == DT_MXFP4) /* no extra bits: the codes themselves */
        return qpack_qs_off(type, tc);
    return type == DT_Q6_K ? qpack_qs_off(type, tc) + 16 * (size_t)tc
                           : qpack_qs_off(type, tc) - 4 * (size_t)tc;
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
 * contract of qact_dot_fn; NULL for unsupported types.  Call only on a CPU
 * with the ISA; callers reach them through dtype_matmul_qact()->packed_dot. */
qact_dot_fn qpack_dot_avx2(uint32_t type);
qact_dot_fn qpack_dot_avx512(uint32_t type);
/* One token against many packed rows (qact_dot_rows_fn), each row bitwise
 * the one-token packed dot of the same ISA. */
qact_dot_rows_fn qpack_dot_rows_avx2(uint32_t type);
qact_dot_rows_fn qpack_dot_rows_avx512(uint32_t type);
/* A tile of packed rows against 1..4 tokens (qact_dot_tile_fn), each
 * result bitwise the one-row packed dot of the same ISA. */
qact_dot_tile_fn qpack_dot_tile_avx2(uint32_t type);
qact_dot_tile_fn qpack_dot_tile_avx512(uint32_t type);

#endif
