/* matmul.h - batched weight-row x activation products for the CPU backend.
 *
 * Stateless and thread-safe: threads split [row_begin, row_end) between
 * them and share w, x and xq read-only; each writes its own rows of y.
 * No heap allocation.
 *
 * Two paths:
 *   activation-quantized ("qact", dtype_matmul_rows_q, the default for
 *     quantized weights): for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K,
 *     Q6_K, MXFP4 (dtype_matmul_uses_qact; other types take the exact path) x_t is
 *     first quantized to int8 blocks of 32 with one f32 scale each
 *     (kernels/qact.h), then dotted with integer products (VPDPBUSD on
 *     AVX-512 VNNI, VPMADDUBSW on AVX2, the scalar reference elsewhere;
 *     all three bitwise equal); relative error per dot from the activation
 *     rounding is ~0.3% typical (test_matmul_q8 measures it).
 *   exact (dtype_matmul_rows; `--exact` and the reference tests): y = the
 *     type's vec_dot(row, x_t) bitwise, f32 activations.
 *   split (dtype_matmul_rows_split, the output head by default): the qact
 *     path with each token's activations quantized twice, x ~ d1 q1 + d2 q2
 *     (q2: the residual, qact_quantize_residual), y = dot(w, q1) + dot(w,
 *     q2) from one pass over the weights: relative error per dot ~2.5e-6, at
 *     the int8 kernels' memory traffic.  Q8_0 weights instead take one int16
 *     term (kernels/qwide.h: x ~ d c, |c| <= 32767), as accurate at the
 *     integer work of one int8 term.
 *   packed (type | DT_PACKED, qact path only): rows repacked at load by
 *     qpack_rows; same results as the stored rows, bitwise.
 * Contract (both paths): y[t][r] is a deterministic function of (row r,
 * x_t) only: independent of n_tok, of the other tokens in the batch, of
 * row_begin/row_end and of the thread count (batch invariance).
 */
#ifndef KVANT_MATMUL_H
#define KVANT_MATMUL_H

#include <stddef.h>
#include <stdint.h>

/* 1 when `type` has an activation-quantized path (on every ISA); 0 for
 * types that always take the exact f32 path. */
int dtype_matmul_uses_qact(uint32_t type);

/* 1 when weights of `type` with rows of n values can be packed at load
 * (kernels/qpack.h) and the selected ISA has a kernel for packed rows;
 * the caller then passes type | DT_PACKED to the functions below. */
int dtype_matmul_packs(uint32_t type, int64_t n);

/* Bytes of quantized activations for n_tok rows of n values of a matmul
 * against `type` weights; 0 when the type takes the exact path. */
size_t dtype_matmul_scratch_bytes(uint32_t type, int64_t n, int64_t n_tok);

/* Quantizes x [n_tok][n] f32 into xq (dtype_matmul_scratch_bytes bytes,
 * caller-owned) for dtype_matmul_rows_q.  No-op for exact-path types.
 * Call once per matmul, before splitting rows over threads. */
void dtype_matmul_quantize(uint32_t type, const float *x, int64_t n, int64_t n_tok, void *xq);

/* y[t*y_stride + r] = dot(w row r, x_t) for r in [row_begin, row_end) and
 * t in [0, n_tok).
 *   w: borrowed, rows of n elements in `type` (dtype enum), row r at
 *      w + r*row_stride_bytes;  x: borrowed, [n_tok][n] f32;
 *   xq: NULL, or x already quantized by dtype_matmul_quantize (same type,
 *      n, n_tok); when NULL a qact type quantizes tiles of x into a bounded
 *      stack buffer (same results, but repeated by every caller thread);
 *   y: [n_tok][y_stride] f32, only the columns [row_begin, row_end) written.
 * Weights are tiled so a tile of rows stays in cache while the tokens are
 * dotted against it, a few at a time.
 * Programmer errors (unsupported type, n not a multiple of the block size)
 * fail KV_ASSERT: the caller validated the model at load time. */
void dtype_matmul_rows_q(uint32_t type, const void *w, size_t row_stride_bytes,
                         int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                         const void *xq, int64_t n_tok, float *y, int64_t y_stride);

/* The split path (qact types): xq NULL, or the rows dtype_matmul_quantize_split
 * writes ([2 n_tok] qact rows, token t's two terms at rows 2t, 2t + 1; for
 * Q8_0 n_tok qwide rows), caller-owned, dtype_matmul_scratch_bytes(type, n,
 * 2 n_tok) bytes (enough for either).
 * Otherwise as dtype_matmul_rows_q, and batch invariant likewise. */
void dtype_matmul_quantize_split(uint32_t type, const float *x, int64_t n, int64_t n_tok,
                                 void *xq);

/* Bytes between consecutive tokens' rows in what dtype_matmul_quantize
 * (split 0) or dtype_matmul_quantize_split (split 1) writes: token t's rows
 * start at t times this, so tokens [t0, t1) of a batch may be quantized
 * alone (x + t0 * n into xq + t0 * this), e.g. on several threads, with
 * the same bytes as the whole batch at once.  0 for exact-path types. */
size_t dtype_matmul_token_bytes(uint32_t type, int split, int64_t n);
void dtype_matmul_rows_split(uint32_t type, const void *w, size_t row_stride_bytes,
                             int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                             const void *xq, int64_t n_tok, float *y, int64_t y_stride);

/* The int8-activation kernels of the chosen ISA (kernels/qact.h), the
 * table the qact path calls through; for tests.  Thread-safe. */
struct qact_kernels;
const struct qact_kernels *dtype_matmul_qact(void);

/* The exact path for every type: each output bitwise equal to one
 * dtype_get(type)->vec_dot call. */
void dtype_matmul_rows(uint32_t type, const void *w, size_t row_stride_bytes,
                       int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                       int64_t n_tok, float *y, int64_t y_stride);

#endif
