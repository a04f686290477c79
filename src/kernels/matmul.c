/* matmul.c - dtype_matmul_rows: weight rows x a batch of activations.
 *
 * Invariant: every output is produced by the dispatched vec_dot_multi (or
 * vec_dot), whose per-token arithmetic is identical to a single vec_dot
 * call, so results do not depend on n_tok or on the tiling below.
 * Tiling: a tile of rows (<= MM_ROW_TILE_BYTES) is kept in L2 while a tile
 * of tokens (<= MM_TOK_TILE_BYTES of x) streams past it, QK_MULTI_MAX
 * tokens per pass over a row.
 */
#include "kernels/matmul.h"

#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "util/err.h"

#define MM_ROW_TILE_BYTES (256 * 1024)
#define MM_TOK_TILE_BYTES (512 * 1024)

void dtype_matmul_rows(uint32_t type, const void *w, size_t row_stride_bytes,
                       int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                       int64_t n_tok, float *y, int64_t y_stride)
{
    const dtype_traits *tr = dtype_get(type);
    KV_ASSERT(tr != NULL);
    KV_ASSERT(n > 0 && n % tr->block_size == 0);
    const dtype_vec_dot_multi_fn multi = dtype_vec_dot_multi(type);
    const dtype_vec_dot_fn dot = tr->vec_dot;
    const size_t row_bytes = dtype_row_size(type, n);

    int64_t row_tile = (int64_t)(MM_ROW_TILE_BYTES / (row_bytes ? row_bytes : 1));
    if (row_tile < 1)
        row_tile = 1;
    int64_t tok_tile = (int64_t)(MM_TOK_TILE_BYTES / ((size_t)n * sizeof(float)));
    tok_tile = tok_tile < QK_MULTI_MAX ? QK_MULTI_MAX : tok_tile / QK_MULTI_MAX * QK_MULTI_MAX;

    for (int64_t r0 = row_begin; r0 < row_end; r0 += row_tile) {
        const int64_t r1 = r0 + row_tile < row_end ? r0 + row_tile : row_end;
        for (int64_t t0 = 0; t0 < n_tok; t0 += tok_tile) {
            const int64_t t1 = t0 + tok_tile < n_tok ? t0 + tok_tile : n_tok;
            for (int64_t r = r0; r < r1; r++) {
                const void *wr = (const uint8_t *)w + (size_t)r * row_stride_bytes;
                for (int64_t t = t0; t < t1; t += QK_MULTI_MAX) {
                    const int nt = (int)(t1 - t < QK_MULTI_MAX ? t1 - t : QK_MULTI_MAX);
                    float out[QK_MULTI_MAX];
                    if (multi) {
                        multi(n, wr, x + t * n, n, nt, out);
                    } else {
                        for (int k = 0; k < nt; k++)
                            out[k] = dot(n, wr, x + (t + k) * n);
                    }
                    for (int k = 0; k < nt; k++)
                        y[(t + k) * y_stride + r] = out[k];
                }
            }
        }
    }
}
