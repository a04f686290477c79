/* qact.h - kernels-internal: activation rows quantized to int8 ("qact"),
 * and dot products of quantized weight rows against them.
 *
 * Include only from src/kernels/ and tests; the backend goes through
 * matmul.h.  All functions are pure and thread-safe.
 *
 * qact row format (n values, n a multiple of QACT_CHUNK = 32; the row is
 * padded with zeros to np = qact_padded(n), a multiple of QACT_GROUP):
 *     int8_t  qs[np];        codes: q[i] = nearbyint(x[i] / d[c]), |q| <= 127
 *     float   d[np/32];      per 32-value chunk c: d = amax(|x|)/127 (0: all zero)
 *     int32_t s32[np/32];    sum of qs over chunk c
 *     int16_t s16[np/16];    sum of qs over each 16-value half chunk
 * in that order, qact_row_bytes(n) bytes (a multiple of 64).  x must be
 * finite.  Rounding is round-to-nearest-even in the current (default)
 * rounding mode, so the AVX-512 quantizer is bitwise equal to the ref.
 *
 * Dot specification (qact_dot_<type>_ref): the weight row is cut into
 * 32-value chunks c matching the activation chunks.  Per chunk, with
 * codes u (the weight's unsigned stored code) and activation codes a:
 *     raw = sum u*a (exact int32), asum = s32[c]
 *     I, J: exact int32 built from raw/asum/per-type scales (see qact_ref.c)
 *     A, B: f32 from the weight block's f16 scale/min (B = 0 if none;
 *           mxfp4: A = its E8M0 scale 2^(e-128), B = 0)
 *     v_c = ((A*d[c]) * (float)I) + ((B*d[c]) * (float)J)
 * each operation rounded to f32 in that order; then
 *     acc[c % 16] += v_c   (acc starts at +0, chunks in increasing c)
 *     result = qact_reduce16(acc).
 * The AVX2 and AVX-512 kernels follow exactly this order and are bitwise
 * equal (test_matmul_q8 checks it on random data), so a token's result
 * does not depend on the instruction set either.
 */
#ifndef KVANT_QACT_H
#define KVANT_QACT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/blocks.h"

#define QACT_CHUNK 32
#define QACT_LANES 16                       /* chunks per SIMD group */
#define QACT_GROUP (QACT_CHUNK * QACT_LANES) /* 512 values */
#define QACT_MULTI_MAX 4                    /* tokens per weight pass */

/* Software prefetch of the weight bytes [p, p + bytes) a SIMD kernel is
 * about to dot: near bytes ahead into L1 (as the ISA's kernels measured),
 * and where the rows come from DRAM in this pass (far: a one-token pass, a
 * tile call's first token block) also 8 KiB ahead into L2.  1.1B Q4_0 tg64
 * on Zen 4, alternating rounds: near only 44.9-47.1 tok/s, far into L2 at
 * 4 KiB 48.0-51.2, 8 KiB 49.4-55.7 (ahead of both in every round), 16 KiB
 * 45.1-49.4; AVX2 kernels on the same core 42.4-45.1 -> 47.4-49.5.  Far
 * alone per group (no near L1 prefetch) made AVX2's 576-wide rows (the
 * default model) 1.35x slower in perf samples; the rows kernels now
 * prefetch such rows (a group and a short tail) four at a time, whole, 8
 * KiB ahead into L2 and not into L1, which made them faster on both ISAs
 * (qpack_avx2.c, qpack_avx512.c: pk_rows_type).  A tile's later token
 * blocks find the rows in L2: near only.  Tile calls prefetched near only
 * whatever their block until the first block streamed too: 1.1B Q4_0
 * decode of 4 sequences 88-97 -> 145-166 tok/s, the output head of one
 * token (two terms, two "tokens") 2.1x faster in perf samples. */
#define QACT_PREFETCH_FAR 8192
/* What a kernel prefetches for the weights it is about to dot: nothing (its
 * caller has), near into L1, or near and far (rows from DRAM). */
enum { QACT_PF_NONE, QACT_PF_NEAR, QACT_PF_FAR };
/* The level of weights a pass reads from DRAM (a one-token pass, a tile
 * call's first token block: far) or from cache (near). */
static inline int qact_pf_level(int from_dram)
{
    return from_dram ? QACT_PF_FAR : QACT_PF_NEAR;
}
static inline void qact_prefetch_w(const void *p, size_t bytes, int level, size_t near)
{
    const char *c = (const char *)p;
    for (size_t o = 0; level != QACT_PF_NONE && o < bytes; o += 64) {
        if (level == QACT_PF_FAR)
            __builtin_prefetch(c + QACT_PREFETCH_FAR + o, 0, 2);
        __builtin_prefetch(c + near + o, 0, 3);
    }
}

/* Bytes [p, p + bytes) QACT_PREFETCH_FAR ahead into L2 only: the rows
 * kernels' blocks of rows with a short tail (see above). */
static inline void qact_prefetch_l2(const void *p, size_t bytes)
{
    const char *c = (const char *)p;
    for (size_t o = 0; o < bytes; o += 64)
        __builtin_prefetch(c + QACT_PREFETCH_FAR + o, 0, 2);
}

static inline int64_t qact_padded(int64_t n)
{
    return (n + QACT_GROUP - 1) / QACT_GROUP * QACT_GROUP;
}

static inline size_t qact_row_bytes(int64_t n)
{
    const int64_t np = qact_padded(n);
    return (size_t)(np + np / 32 * 4 + np / 32 * 4 + np / 16 * 2);
}

/* Views into one qact row (p: start of the row, n: unpadded length). */
typedef struct qact_view {
    const int8_t *qs;
    const float *d;
    const int32_t *s32;
    const int16_t *s16;
} qact_view;

static inline qact_view qact_view_of(const void *p, int64_t n)
{
    const int64_t np = qact_padded(n);
    const uint8_t *b = p;
    qact_view v = {(const int8_t *)b, (const float *)(b + np),
                   (const int32_t *)(b + np + np / 8),
                   (const int16_t *)(b + np + np / 4)};
    return v;
}

/* Fixed reduction of the 16 lane accumulators: halves added pairwise
 * (lane i + lane i+8, then i+4, i+2, i+1).  Shared by ref and SIMD. */
static inline float qact_reduce16(const float acc[QACT_LANES])
{
    float s[8];
    for (int i = 0; i < 8; i++)
        s[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++)
        s[i] = s[i] + s[i + 4];
    for (int i = 0; i < 2; i++)
        s[i] = s[i] + s[i + 2];
    return s[0] + s[1];
}

/* Zero codes, scales and sums for the padding chunks [n/32, qact_padded(n)/32)
 * of a row in dst (shared by the quantizers). */
void qact_pad_tail(void *dst, int64_t n);

/* The 12-byte q4_K/q5_K scales field as u[0..1] = sc[0..7] bytes and
 * u[2..3] = m[0..7] bytes: qref_scale_min_k4 on 32-bit words (ggml's). */
static inline void qact_k4_scales(const uint8_t *q, uint32_t u[4])
{
    uint32_t w[3];
    memcpy(w, q, 12);
    u[0] = w[0] & 0x3f3f3f3f;
    u[1] = (w[2] & 0x0f0f0f0f) | (((w[0] >> 6) & 0x03030303) << 4);
    u[2] = w[1] & 0x3f3f3f3f;
    u[3] = ((w[2] >> 4) & 0x0f0f0f0f) | (((w[1] >> 6) & 0x03030303) << 4);
}

/* Quantizes one row x[n] (n % 32 == 0) into dst (qact_row_bytes(n),
 * 64-byte aligned not required). */
typedef void (*qact_quantize_fn)(const float *x, int64_t n, void *dst);
/* out[k] = dot(weight row w, qact row xq + k*xq_stride) for k < nt
 * (1..QACT_MULTI_MAX); each out[k] is bitwise the nt = 1 result. */
typedef void (*qact_dot_fn)(int64_t n, const void *w, const void *xq, size_t xq_stride, int nt,
                            float *out);

/* y[r] = dot(packed weight row w + r * row_stride, qact row xq) for r <
 * n_rows: one token against many rows, each y[r] bitwise the nt = 1
 * qact_dot_fn result. */
typedef void (*qact_dot_rows_fn)(int64_t n, const void *w, size_t row_stride, int64_t n_rows,
                                 const void *xq, float *y);

/* y[k * y_stride + r] = dot(weight row w + r * row_stride, qact row xq +
 * k * xq_stride) for r < n_rows, k < nt (1..QACT_MULTI_MAX): a tile of rows
 * against a token block in one call, each result bitwise the qact_dot_fn
 * one.  stream: the rows come from DRAM in this call (a row tile's first
 * token block), so the kernel prefetches far ahead into L2 as a one-token
 * pass does; else they are in cache from the block before (near only). */
typedef void (*qact_dot_tile_fn)(int64_t n, const void *w, size_t row_stride, int64_t n_rows,
                                 const void *xq, size_t xq_stride, int nt, float *y,
                                 int64_t y_stride, int stream);

/* Defines `name`, a qact_dot_fn that calls body(type, n, w, xq, xs, NT,
 * out) with the token count NT a compile-time constant (1, 2, 3 or
 * QACT_MULTI_MAX), so an always-inline body keeps its tiles in registers.
 * For the SIMD kernel files. */
#define QACT_NT_ENTRY(name, body, type)                                                        \
    static void name(int64_t n, const void *w, const void *xq, size_t xs, int nt, float *out) \
    {                                                                                          \
        switch (nt) {                                                                          \
        case 1: body(type, n, w, xq, xs, 1, out); break;                                       \
        case 2: body(type, n, w, xq, xs, 2, out); break;                                       \
        case 3: body(type, n, w, xq, xs, 3, out); break;                                       \
        default: body(type, n, w, xq, xs, QACT_MULTI_MAX, out); break;                         \
        }                                                                                      \
    }

/* Defines `name`, a qact_dot_tile_fn that calls body(type, n, w, rs,
 * n_rows, xq, xs, NT, y, ys, stream) with the token count NT a
 * compile-time constant, as QACT_NT_ENTRY. */
#define QACT_TILE_ENTRY(name, body, type)                                                      \
    static void name(int64_t n, const void *w, size_t rs, int64_t n_rows, const void *xq,     \
                     size_t xs, int nt, float *y, int64_t ys, int stream)                      \
    {                                                                                          \
        switch (nt) {                                                                          \
        case 1: body(type, n, w, rs, n_rows, xq, xs, 1, y, ys, stream); break;                 \
        case 2: body(type, n, w, rs, n_rows, xq, xs, 2, y, ys, stream); break;                 \
        case 3: body(type, n, w, rs, n_rows, xq, xs, 3, y, ys, stream); break;                 \
        default: body(type, n, w, rs, n_rows, xq, xs, QACT_MULTI_MAX, y, ys, stream); break;   \
        }                                                                                      \
    }

void qact_quantize_ref(const float *x, int64_t n, void *dst);
/* The second term of a split activation: dst = the qact row of the residual
 * x - d1 * q1, with (q1, d1) the row `first` (qact_quantize_* of x, in order,
 * not interleaved).  Scalar on every ISA (f32, no contraction), so the pair
 * is the same everywhere.  x ~ d1 q1 + d2 q2 to about 1/64000 of each
 * chunk's largest value. */
void qact_quantize_residual(const float *x, int64_t n, const void *first, void *dst);
void qact_quantize_avx2(const float *x, int64_t n, void *dst);
void qact_quantize_avx512(const float *x, int64_t n, void *dst);

/* Scalar references (the specification), one per supported weight type;
 * NULL for types without an activation-quantized path. */
qact_dot_fn qact_dot_ref(uint32_t type);
/* AVX2 kernels (VPMADDUBSW); call only on a CPU with AVX2 (dtype.c checks
 * it before it fills a table with them).  Bitwise equal to the reference. */
qact_dot_fn qact_dot_avx2(uint32_t type);
/* AVX-512 VNNI kernels; call only on a CPU with AVX-512 VNNI. */
qact_dot_fn qact_dot_avx512(uint32_t type);

/* One instruction set's int8-activation kernels, by weight type.  Filled
 * once per ISA by matmul.c from the getters above and qpack_dot_*
 * (qpack.h); read-only afterwards; the matmul calls through the chosen
 * ISA's (dtype_matmul_qact()).  All entries of one table are bitwise
 * equal to the reference's. */
typedef struct qact_kernels {
    qact_quantize_fn quantize;        /* f32 rows -> qact rows */
    qact_dot_fn dot[DT_COUNT];        /* stored rows; NULL: no qact path */
    qact_dot_fn packed_dot[DT_COUNT]; /* packed rows (qpack.h); NULL: none on this ISA */
    qact_dot_rows_fn packed_dot_rows[DT_COUNT]; /* one token, many packed rows; NULL:
                                                 * packed_dot a row at a time */
    qact_dot_tile_fn packed_tile[DT_COUNT]; /* many packed rows, 1..4 tokens; NULL:
                                             * packed_dot a row at a time */
    qact_dot_fn wide_dot;        /* q8_0 stored rows against the head's int16 rows (qwide.h) */
    qact_dot_tile_fn wide_packed_tile; /* packed q8_0 rows against them; NULL: none on this ISA */
} qact_kernels;

#endif
