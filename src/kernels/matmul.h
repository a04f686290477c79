/* matmul.h - batched weight-row x activation products for the CPU backend.
 *
 * Stateless and thread-safe: threads split [row_begin, row_end) between
 * them and share w and x read-only; each writes its own rows of y.
 * No allocation.
 */
#ifndef KVANT_MATMUL_H
#define KVANT_MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* y[t*y_stride + r] = vec_dot(n, w + r*row_stride_bytes, x + t*n) for
 * r in [row_begin, row_end) and t in [0, n_tok).
 *   w: borrowed, rows of n elements in `type` (dtype enum), row r at
 *      w + r*row_stride_bytes;  x: borrowed, [n_tok][n] f32;
 *   y: [n_tok][y_stride] f32, only the columns [row_begin, row_end) written.
 * Each y value is bitwise equal to the dispatched dtype_get(type)->vec_dot
 * on the same row and token, whatever n_tok is (batch invariance).
 * Weights are tiled so a tile of rows stays in cache while up to
 * QK_MULTI_MAX tokens at a time are dotted against it.
 * Programmer errors (unsupported type, n not a multiple of the block size)
 * fail KV_ASSERT: the caller validated the model at load time. */
void dtype_matmul_rows(uint32_t type, const void *w, size_t row_stride_bytes,
                       int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                       int64_t n_tok, float *y, int64_t y_stride);

#endif
