/* matmul.c - dtype_matmul_rows: weight rows x a batch of activations.
 *
 * Invariant: every output is produced by a per-token computation that
 * does not depend on n_tok or on the tiling below:
 *   exact path: the dispatched vec_dot_multi (or vec_dot), whose per-token
 *     arithmetic is identical to a single vec_dot call;
 *   qact path: the token's row is quantized alone (qact_quantize_* is a
 *     pure per-row function) and the qact dot gives out[k] bitwise equal
 *     to its nt = 1 result.
 * Tiling: a tile of rows (<= MM_ROW_TILE_BYTES) is kept in L2 while the
 * tokens pass over it a few at a time (QACT_MULTI_MAX / QK_MULTI_MAX): each
 * group of tokens, small enough for L1, meets every row of the tile before
 * the next group, so per dot only the weight row comes from L2 (streaming
 * the whole token tile past each row instead read the activations from L2
 * or L3 for every row).
 */
#include "kernels/matmul.h"

#include <pthread.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/qact.h"
#include "kernels/qpack.h"
#include "kernels/qwide.h"
#include "kernels/quant_ref.h"
#include "util/arch.h"
#include "util/err.h"

#define MM_ROW_TILE_BYTES (128 * 1024)
/* Stack buffer for dtype_matmul_rows without pre-quantized activations:
 * bounds n to about 47k columns (KV_ASSERT). */
#define MM_QACT_STACK_BYTES (64 * 1024)

/* ---- the int8-activation kernels of each ISA ----
 * g_qact[isa] is filled once (first use, under pthread_once) for every ISA
 * this CPU has, from the ISA files' getters; read-only afterwards.  A call
 * takes the chosen ISA's table (dtype_kernel_isa) once, so dtype_force_isa
 * switches tables without refilling them. */
static qact_kernels g_qact[KERNEL_ISA_COUNT];
static pthread_once_t g_qact_once = PTHREAD_ONCE_INIT;

/* isa's int8-activation kernels into *k (all ISAs' are bitwise equal;
 * packed rows need AVX2 or AVX-512).  Call only when the CPU has isa. */
static void qact_fill(qact_kernels *k, kernel_isa isa)
{
    memset(k, 0, sizeof *k);
    k->quantize = qact_quantize_ref;
    for (uint32_t t = 0; t < DT_COUNT; t++)
        k->dot[t] = qact_dot_ref(t);
    k->wide_dot = qwide_dot_q8_0_ref;
#if KVANT_X86
    if (isa == KERNEL_ISA_SCALAR)
        return;
    k->wide_dot = qwide_dot_q8_0_avx2; /* AVX-512 CPUs too */
    k->wide_packed_tile =
        isa == KERNEL_ISA_AVX512 ? qwide_tile_q8_0_packed_avx512 : qwide_tile_q8_0_packed_avx2;
    k->quantize = isa == KERNEL_ISA_AVX512 ? qact_quantize_avx512 : qact_quantize_avx2;
    for (uint32_t t = 0; t < DT_COUNT; t++) {
        k->dot[t] = isa == KERNEL_ISA_AVX512 ? qact_dot_avx512(t) : qact_dot_avx2(t);
        k->packed_dot[t] = isa == KERNEL_ISA_AVX512 ? qpack_dot_avx512(t) : qpack_dot_avx2(t);
        k->packed_dot_rows[t] =
            isa == KERNEL_ISA_AVX512 ? qpack_dot_rows_avx512(t) : qpack_dot_rows_avx2(t);
        k->packed_tile[t] =
            isa == KERNEL_ISA_AVX512 ? qpack_dot_tile_avx512(t) : qpack_dot_tile_avx2(t);
    }
#else
    (void)isa;
#endif
}

static void qact_fill_all(void)
{
    for (int i = 0; i < KERNEL_ISA_COUNT; i++)
        if (dtype_isa_supported((kernel_isa)i))
            qact_fill(&g_qact[i], (kernel_isa)i);
}

const qact_kernels *dtype_matmul_qact(void)
{
    pthread_once(&g_qact_once, qact_fill_all);
    return &g_qact[dtype_kernel_isa()];
}

/* The dot kernel for `type` (DT_PACKED: packed rows) in the table of the
 * chosen ISA; NULL when there is none.  Once per call, never per row. */
static qact_dot_fn qact_dot_for(const qact_kernels *k, uint32_t type)
{
    const uint32_t base = qpack_base(type);
    if (base >= DT_COUNT)
        return NULL;
    return type & DT_PACKED ? k->packed_dot[base] : k->dot[base];
}

int dtype_matmul_uses_qact(uint32_t type)
{
    return qact_dot_ref(qpack_base(type)) != NULL;
}

int dtype_matmul_packs(uint32_t type, int64_t n)
{
    return qpack_supported(type, n) && qact_dot_for(dtype_matmul_qact(), type | DT_PACKED) != NULL;
}

size_t dtype_matmul_scratch_bytes(uint32_t type, int64_t n, int64_t n_tok)
{
    if (!dtype_matmul_uses_qact(type) || n <= 0 || n_tok <= 0)
        return 0;
    return qact_row_bytes(n) * (size_t)n_tok;
}

void dtype_matmul_quantize(uint32_t type, const float *x, int64_t n, int64_t n_tok, void *xq)
{
    if (!dtype_matmul_uses_qact(type))
        return;
    KV_ASSERT(n % QACT_CHUNK == 0);
    const size_t rb = qact_row_bytes(n);
    const qact_quantize_fn quant = dtype_matmul_qact()->quantize;
    for (int64_t t = 0; t < n_tok; t++) {
        quant(x + t * n, n, (uint8_t *)xq + (size_t)t * rb);
        if (type & DT_PACKED)
            qpack_interleave_act((uint8_t *)xq + (size_t)t * rb, n);
    }
}

/* The head path (dtype_matmul_rows_split) takes one int16 term for q8_0
 * weights (qwide.h) and two int8 terms for the other qact types. */
static int head_wide(uint32_t type)
{
    return qpack_base(type) == DT_Q8_0;
}

/* Bytes of one token's head-path activations. */
static size_t head_row_bytes(uint32_t type, int64_t n)
{
    return head_wide(type) ? qwide_row_bytes(n) : 2 * qact_row_bytes(n);
}

void dtype_matmul_quantize_split(uint32_t type, const float *x, int64_t n, int64_t n_tok,
                                 void *xq)
{
    KV_ASSERT(dtype_matmul_uses_qact(type) && n % QACT_CHUNK == 0);
    const qact_kernels *kt = dtype_matmul_qact();
    if (head_wide(type)) {
        const size_t rb = qwide_row_bytes(n);
        for (int64_t t = 0; t < n_tok; t++) {
            qwide_quantize_ref(x + t * n, n, (uint8_t *)xq + (size_t)t * rb); /* every ISA */
            if (type & DT_PACKED)
                qwide_interleave((uint8_t *)xq + (size_t)t * rb, n);
        }
        return;
    }
    const size_t rb = qact_row_bytes(n);
    const qact_quantize_fn quant = kt->quantize;
    for (int64_t t = 0; t < n_tok; t++) {
        uint8_t *q1 = (uint8_t *)xq + (size_t)(2 * t) * rb, *q2 = q1 + rb;
        quant(x + t * n, n, q1);
        qact_quantize_residual(x + t * n, n, q1, q2);
        if (type & DT_PACKED) {
            qpack_interleave_act(q1, n);
            qpack_interleave_act(q2, n);
        }
    }
}

size_t dtype_matmul_token_bytes(uint32_t type, int split, int64_t n)
{
    if (!dtype_matmul_uses_qact(type))
        return 0;
    return split ? head_row_bytes(type, n) : qact_row_bytes(n);
}

static int64_t row_tile_for(uint32_t type, int64_t n)
{
    const size_t row_bytes = dtype_row_size(qpack_base(type), n);
    const int64_t row_tile = (int64_t)(MM_ROW_TILE_BYTES / (row_bytes ? row_bytes : 1));
    return row_tile < 1 ? 1 : row_tile;
}

static void rows_exact(uint32_t type, const void *w, size_t row_stride_bytes, int64_t row_begin,
                       int64_t row_end, int64_t n, const float *x, int64_t n_tok, float *y,
                       int64_t y_stride)
{
    const dtype_vec_dot_multi_fn multi = dtype_vec_dot_multi(type);
    const dtype_vec_dot_fn dot = dtype_get(type)->vec_dot;
    const int64_t row_tile = row_tile_for(type, n);

    for (int64_t r0 = row_begin; r0 < row_end; r0 += row_tile) {
        const int64_t r1 = r0 + row_tile < row_end ? r0 + row_tile : row_end;
        for (int64_t t = 0; t < n_tok; t += QK_MULTI_MAX) {
            const int nt = (int)(n_tok - t < QK_MULTI_MAX ? n_tok - t : QK_MULTI_MAX);
            for (int64_t r = r0; r < r1; r++) {
                const void *wr = (const uint8_t *)w + (size_t)r * row_stride_bytes;
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

/* Rows of a tile call whose terms are summed in a stack buffer. */
#define MM_TERMS_ROWS 256

/* The head's two int8 terms of nt tokens (xt: 2 nt rows of rb bytes) on
 * rows [0, n_rows) of wt through the tile call, as 2 nt tokens: each term's
 * value is dot's (the tile contract), and the pair sums are dot's path's. */
static void tile_terms(qact_dot_tile_fn tile, int64_t n, const uint8_t *wt, size_t rs,
                       int64_t n_rows, const uint8_t *xt, size_t rb, int nt, float *y,
                       int64_t y_stride, int stream)
{
    float s[QACT_MULTI_MAX][MM_TERMS_ROWS];
    for (int64_t q0 = 0; q0 < n_rows; q0 += MM_TERMS_ROWS) {
        const int64_t m = n_rows - q0 < MM_TERMS_ROWS ? n_rows - q0 : MM_TERMS_ROWS;
        tile(n, wt + (size_t)q0 * rs, rs, m, xt, rb, 2 * nt, s[0], MM_TERMS_ROWS, stream);
        for (int k = 0; k < nt; k++)
            for (int64_t r = 0; r < m; r++)
                y[k * y_stride + q0 + r] = s[2 * k][r] + s[2 * k + 1][r];
    }
}

/* Rows [row_begin, row_end) against n_tok tokens' pre-quantized rows
 * (rb bytes each; terms 2: token t's two int8 terms at rows 2t, 2t + 1,
 * summed), through dot (dot_rows for one token, terms 1 only; tile for a
 * row tile against a token block, where given). */
static void rows_tiles(qact_dot_fn dot, qact_dot_rows_fn dot_rows, qact_dot_tile_fn tile,
                       size_t rb, int terms, uint32_t type, const void *w,
                       size_t row_stride_bytes, int64_t row_begin, int64_t row_end, int64_t n,
                       const void *xq, int64_t n_tok, float *y, int64_t y_stride)
{
    const int64_t row_tile = row_tile_for(type, n), per = QACT_MULTI_MAX / terms;
    for (int64_t r0 = row_begin; r0 < row_end; r0 += row_tile) {
        const int64_t r1 = r0 + row_tile < row_end ? r0 + row_tile : row_end;
        const uint8_t *wt = (const uint8_t *)w + (size_t)r0 * row_stride_bytes;
        for (int64_t t = 0; t < n_tok; t += per) {
            const int nt = (int)(n_tok - t < per ? n_tok - t : per);
            const uint8_t *xt = (const uint8_t *)xq + (size_t)(terms * t) * rb;
            if (nt == 1 && dot_rows) {
                dot_rows(n, wt, row_stride_bytes, r1 - r0, xt, y + t * y_stride + r0);
                continue;
            }
            if (tile && terms == 2) {
                tile_terms(tile, n, wt, row_stride_bytes, r1 - r0, xt, rb, nt,
                           y + t * y_stride + r0, y_stride, t == 0);
                continue;
            }
            if (tile) {
                tile(n, wt, row_stride_bytes, r1 - r0, xt, rb, nt, y + t * y_stride + r0,
                     y_stride, t == 0); /* the first block reads the row tile from DRAM */
                continue;
            }
            for (int64_t r = r0; r < r1; r++) {
                float out[QACT_MULTI_MAX];
                dot(n, (const uint8_t *)w + (size_t)r * row_stride_bytes, xt, rb, terms * nt, out);
                for (int k = 0; k < nt; k++)
                    y[(t + k) * y_stride + r] = terms == 1 ? out[k] : out[2 * k] + out[2 * k + 1];
            }
        }
    }
}

/* qact path over pre-quantized rows xq: terms 1, or 2 for the head path
 * (dtype_matmul_quantize_split's rows: one int16 row a token for q8_0,
 * two int8 terms for the other types). */
static void rows_qact(uint32_t type, const void *w, size_t row_stride_bytes, int64_t row_begin,
                      int64_t row_end, int64_t n, const void *xq, int64_t n_tok, float *y,
                      int64_t y_stride, int terms)
{
    const qact_kernels *kt = dtype_matmul_qact();
    KV_ASSERT(terms == 1 || terms == 2);
    if (terms == 2 && head_wide(type)) {
        const qact_dot_tile_fn tile = type & DT_PACKED ? kt->wide_packed_tile : NULL;
        KV_ASSERT(tile != NULL || !(type & DT_PACKED)); /* packed rows exist only with SIMD */
        rows_tiles(kt->wide_dot, NULL, tile, qwide_row_bytes(n), 1, type, w, row_stride_bytes,
                   row_begin, row_end, n, xq, n_tok, y, y_stride);
        return;
    }
    const qact_dot_fn dot = qact_dot_for(kt, type);
    KV_ASSERT(dot != NULL);
    const qact_dot_rows_fn dot_rows =
        terms == 1 && (type & DT_PACKED) && qpack_base(type) < DT_COUNT
            ? kt->packed_dot_rows[qpack_base(type)]
            : NULL;
    const qact_dot_tile_fn tile = (type & DT_PACKED) && qpack_base(type) < DT_COUNT
                                      ? kt->packed_tile[qpack_base(type)]
                                      : NULL;
    rows_tiles(dot, dot_rows, tile, qact_row_bytes(n), terms, type, w, row_stride_bytes, row_begin,
               row_end, n, xq, n_tok, y, y_stride);
}

/* The qact path (terms 1) or the head path (terms 2): over xq, or without
 * pre-quantized x, over token tiles quantized into a bounded stack buffer. */
static void rows_q(uint32_t type, const void *w, size_t row_stride_bytes, int64_t row_begin,
                   int64_t row_end, int64_t n, const float *x, const void *xq, int64_t n_tok,
                   float *y, int64_t y_stride, int terms)
{
    if (xq) {
        rows_qact(type, w, row_stride_bytes, row_begin, row_end, n, xq, n_tok, y, y_stride,
                  terms);
        return;
    }
    _Alignas(64) uint8_t buf[MM_QACT_STACK_BYTES];
    const size_t rb = terms == 2 ? head_row_bytes(type, n) : qact_row_bytes(n);
    KV_ASSERT(rb <= sizeof buf);
    const int64_t tt = (int64_t)(sizeof buf / rb);
    for (int64_t t0 = 0; t0 < n_tok; t0 += tt) {
        const int64_t nt = n_tok - t0 < tt ? n_tok - t0 : tt;
        if (terms == 2)
            dtype_matmul_quantize_split(type, x + t0 * n, n, nt, buf);
        else
            dtype_matmul_quantize(type, x + t0 * n, n, nt, buf);
        rows_qact(type, w, row_stride_bytes, row_begin, row_end, n, buf, nt, y + t0 * y_stride,
                  y_stride, terms);
    }
}

void dtype_matmul_rows_split(uint32_t type, const void *w, size_t row_stride_bytes,
                             int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                             const void *xq, int64_t n_tok, float *y, int64_t y_stride)
{
    KV_ASSERT(dtype_matmul_uses_qact(type) && n % QACT_CHUNK == 0);
    rows_q(type, w, row_stride_bytes, row_begin, row_end, n, x, xq, n_tok, y, y_stride, 2);
}

void dtype_matmul_rows_q(uint32_t type, const void *w, size_t row_stride_bytes,
                         int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                         const void *xq, int64_t n_tok, float *y, int64_t y_stride)
{
    const dtype_traits *tr = dtype_get(qpack_base(type));
    KV_ASSERT(tr != NULL);
    KV_ASSERT(n > 0 && n % tr->block_size == 0);
    if (!dtype_matmul_uses_qact(type)) {
        rows_exact(type, w, row_stride_bytes, row_begin, row_end, n, x, n_tok, y, y_stride);
        return;
    }
    rows_q(type, w, row_stride_bytes, row_begin, row_end, n, x, xq, n_tok, y, y_stride, 1);
}

void dtype_matmul_rows(uint32_t type, const void *w, size_t row_stride_bytes,
                       int64_t row_begin, int64_t row_end, int64_t n, const float *x,
                       int64_t n_tok, float *y, int64_t y_stride)
{
    const dtype_traits *tr = dtype_get(type);
    KV_ASSERT(tr != NULL);
    KV_ASSERT(n > 0 && n % tr->block_size == 0);
    rows_exact(type, w, row_stride_bytes, row_begin, row_end, n, x, n_tok, y, y_stride);
}
