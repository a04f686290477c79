/* test_qwide.c - int16 activation rows for the output head of q8_0 weights
 * (kernels/qwide.h).  Checks:
 *   qwide_quantize_ref: |c| <= 32767, d = amax/32767 per chunk, every value
 *     within d/2 (+ f32 rounding) of d*c, zero chunks and padding zero;
 *   qwide_interleave puts the code of chunk 8h + j, position 4r + 2s + e of
 *     each group at 64r + 32h + 16e + 2j + s, and leaves the scales;
 *   qwide_dot_q8_0_ref against the same sum in float64 (the int32 raw sums
 *     are exact there), and against the f32 dot of the dequantized row with
 *     x within 2e-5 |w||x|;
 *   the packed tiles (AVX2, AVX-512: 3 rows, strided y, nothing else written) and
 *     AVX2's stored-row kernel == the reference, bitwise, for nt = 1..4, rows
 *     of 32 .. 5632 values (every short last group: 1..15 chunks, the
 *     128-bit tails of 1..4 and the paired one of 2 among them), quantized
 *     and random codes (-128 included);
 *   the matmul's head path on q8_0 (dtype_matmul_rows_split): packed ==
 *     stored bitwise, 1 and 7 tokens, with and without pre-quantized rows,
 *     each token == its one-token result (batch invariance).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/half.h"
#include "kernels/matmul.h"
#include "kernels/qpack.h"
#include "kernels/qwide.h"
#include "testutil.h"
#include "util/arch.h"

static const int64_t k_sizes[] = {32, 64, 96, 128, 160, 256, 288, 384, 448, 480, 512,
                                  544, 576, 640, 768, 896, 960, 1120, 2048, 5632};
#define N_SIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))

/* n_rows q8_0 rows of n values, stored (*w) and packed (*pk); wild: codes random. */
static void make_q8(tu_rng *r, int64_t n, int64_t n_rows, int wild, uint8_t **w, uint8_t **pk)
{
    const size_t rs = dtype_row_size(DT_Q8_0, n), bytes = rs * (size_t)n_rows;
    float *src = malloc((size_t)(n * n_rows) * sizeof *src);
    for (int64_t i = 0; i < n * n_rows; i++)
        src[i] = tu_rand_normal(r) * 0.05f;
    *w = malloc(bytes);
    *pk = malloc(bytes);
    dtype_get(DT_Q8_0)->from_float(src, *w, n * n_rows);
    if (wild)
        for (size_t b = 0; b < bytes; b += sizeof(block_q8_0))
            for (size_t i = 2; i < sizeof(block_q8_0); i++)
                (*w)[b + i] = (uint8_t)tu_rand_u64(r);
    qpack_rows(DT_Q8_0, *w, *pk, n, n_rows, rs);
    free(src);
}

static float *make_x(tu_rng *r, int64_t n, int64_t ntok)
{
    float *x = malloc((size_t)(n * ntok) * sizeof *x);
    for (int64_t i = 0; i < n * ntok; i++)
        x[i] = tu_rand_normal(r) * (i % 97 == 0 ? 8.0f : 1.0f);
    for (int64_t i = 0; i < 32 && i < n * ntok; i++) /* a zero chunk: scale 0 */
        x[i] = 0.0f;
    return x;
}

static void test_quantize(tu_rng *r)
{
    const int64_t n = 1120, np = qact_padded(n);
    float *x = make_x(r, n, 1);
    uint8_t *q = malloc(qwide_row_bytes(n)), *qi = malloc(qwide_row_bytes(n));
    memset(q, 0x5a, qwide_row_bytes(n));
    qwide_quantize_ref(x, n, q);
    const qwide_view v = qwide_view_of(q, n);
    int ok_d = 1, ok_c = 1, ok_err = 1, ok_pad = 1;
    for (int64_t c = 0; c < n / 32; c++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[32 * c + i]));
        ok_d &= v.d[c] == amax / 32767.0f;
        for (int i = 0; i < 32; i++) {
            const int16_t cc = v.cs[32 * c + i];
            ok_c &= cc >= -32767;
            ok_err &= fabs((double)x[32 * c + i] - (double)v.d[c] * cc) <= v.d[c] * (0.5 + 1e-3);
        }
    }
    for (int64_t i = n; i < np; i++)
        ok_pad &= v.cs[i] == 0;
    for (int64_t c = n / 32; c < np / 32; c++)
        ok_pad &= v.d[c] == 0.0f;
    CHECK(ok_d && ok_c && ok_err && ok_pad);
    CHECK(v.d[0] == 0.0f && v.cs[0] == 0); /* the zero chunk */

    memcpy(qi, q, qwide_row_bytes(n));
    qwide_interleave(qi, n);
    const int16_t *a = (const int16_t *)q, *b = (const int16_t *)qi;
    int ok = 1;
    for (int64_t i = 0; i < np; i++) {
        const int64_t g = i / QACT_GROUP, c = i % QACT_GROUP / 32, p = i % 32;
        const int64_t at = g * QACT_GROUP + 64 * (p / 4) + 32 * (c / 8) + 16 * (p % 2) +
                           2 * (c % 8) + (p % 4) / 2;
        ok &= b[at] == a[i];
    }
    CHECK(ok);
    CHECK(memcmp(q + 2 * np, qi + 2 * np, qwide_row_bytes(n) - (size_t)(2 * np)) == 0);
    free(x), free(q), free(qi);
}

/* The reference against float64 sums and against the f32 product. */
static void test_ref(tu_rng *r)
{
    for (int si = 0; si < N_SIZES; si++) {
        const int64_t n = k_sizes[si];
        uint8_t *w, *pk;
        make_q8(r, n, 1, si % 2, &w, &pk);
        float *x = make_x(r, n, 1), *row = malloc((size_t)n * sizeof *row);
        uint8_t *q = malloc(qwide_row_bytes(n));
        qwide_quantize_ref(x, n, q);
        const qwide_view v = qwide_view_of(q, n);
        const block_q8_0 *b = (const block_q8_0 *)w;
        double want = 0.0, mag = 0.0, exact = 0.0, wn = 0.0, xn = 0.0;
        for (int64_t c = 0; c < n / 32; c++) {
            double raw = 0.0;
            for (int i = 0; i < 32; i++)
                raw += (double)b[c].qs[i] * v.cs[32 * c + i];
            const double t = (double)half_fp16_to_f32(b[c].d) * v.d[c] * raw;
            want += t;
            mag += fabs(t);
        }
        dtype_get(DT_Q8_0)->to_float(w, row, n);
        for (int64_t i = 0; i < n; i++) {
            exact += (double)row[i] * x[i];
            wn += (double)row[i] * row[i];
            xn += (double)x[i] * x[i];
        }
        float got;
        qwide_dot_q8_0_ref(n, w, q, 0, 1, &got);
        CHECKF(fabs(got - want) <= 1e-6 * mag + 1e-30, "ref n=%lld: %.9g vs float64 %.9g",
               (long long)n, got, want);
        if (!(si % 2)) /* quantized weights: the head's accuracy */
            CHECKF(fabs(got - exact) <= 2e-5 * sqrt(wn * xn), "ref n=%lld vs exact: %.3e of |w||x|",
                   (long long)n, fabs(got - exact) / sqrt(wn * xn));
        free(w), free(pk), free(x), free(row), free(q);
    }
}

#if KVANT_X86
typedef void (*qw_tile_fn)(int64_t n, const void *w, size_t rs, int64_t n_rows, const void *xq,
                           size_t xs, int nt, float *y, int64_t ys, int stream);

/* One ISA's packed tile (AVX2 also the stored-row dot) == the reference,
 * bitwise, for 1..4 tokens and 3 rows; the tile's outputs strided, and
 * nothing else in y written. */
static void test_packed(tu_rng *r, const char *isa, qw_tile_fn tile, int stored_too)
{
    for (int si = 0; si < N_SIZES; si++) {
        for (int wild = 0; wild < 2; wild++) {
            const int64_t n = k_sizes[si], ntok = 4, n_rows = 3, ys = 5;
            const size_t rs = dtype_row_size(DT_Q8_0, n), rb = qwide_row_bytes(n);
            uint8_t *w, *pk;
            make_q8(r, n, n_rows, wild, &w, &pk);
            float *x = make_x(r, n, ntok);
            uint8_t *xq = malloc(rb * ntok), *xi = malloc(rb * ntok);
            for (int64_t k = 0; k < ntok; k++) {
                qwide_quantize_ref(x + k * n, n, xq + k * rb);
                memcpy(xi + k * rb, xq + k * rb, rb);
                qwide_interleave(xi + k * rb, n);
            }
            int stored = 1, tiled = 1;
            float yr[3][4];
            for (int64_t j = 0; j < n_rows; j++) {
                float ym[4];
                qwide_dot_q8_0_ref(n, w + j * rs, xq, rb, (int)ntok, yr[j]);
                for (int nt = 1; stored_too && nt <= ntok; nt++) {
                    qwide_dot_q8_0_avx2(n, w + j * rs, xq, rb, nt, ym);
                    stored &= memcmp(ym, yr[j], (size_t)nt * sizeof *ym) == 0;
                }
            }
            for (int nt = 1; nt <= ntok; nt++) {
                float yt[4 * 5];
                for (int i = 0; i < 4 * 5; i++)
                    yt[i] = -1.0f;
                tile(n, pk, rs, n_rows, xi, rb, nt, yt, ys, nt & 1); /* stream: prefetch only */
                for (int k = 0; k < 4; k++)
                    for (int j = 0; j < ys; j++) {
                        const float want = k < nt && j < n_rows ? yr[j][k] : -1.0f;
                        tiled &= memcmp(&yt[k * ys + j], &want, sizeof want) == 0;
                    }
            }
            CHECKF(tiled, "q8_0 head packed %s tile == ref bitwise, n=%lld%s", isa, (long long)n,
                   wild ? " (random codes)" : "");
            if (stored_too)
                CHECKF(stored, "q8_0 head stored avx2 == ref bitwise, n=%lld%s", (long long)n,
                       wild ? " (random codes)" : "");
            free(w), free(pk), free(x), free(xq), free(xi);
        }
    }
}
#endif

/* The matmul's head path on q8_0 rows, stored and packed. */
static void test_matmul(tu_rng *r, int64_t n, int64_t ntok)
{
    const int64_t n_rows = 21;
    const size_t rs = dtype_row_size(DT_Q8_0, n);
    uint8_t *w, *pk;
    make_q8(r, n, n_rows, 0, &w, &pk);
    float *x = make_x(r, n, ntok);
    float *y0 = malloc((size_t)(n_rows * ntok) * sizeof *y0);
    float *y1 = malloc((size_t)(n_rows * ntok) * sizeof *y1), *y2 = malloc((size_t)n_rows * sizeof *y2);
    dtype_matmul_rows_split(DT_Q8_0, w, rs, 0, n_rows, n, x, NULL, ntok, y0, n_rows);
    int inv = 1;
    for (int64_t k = 0; k < ntok; k++) {
        dtype_matmul_rows_split(DT_Q8_0, w, rs, 0, n_rows, n, x + k * n, NULL, 1, y2, n_rows);
        inv &= memcmp(y2, y0 + k * n_rows, (size_t)n_rows * sizeof *y2) == 0;
    }
    CHECKF(inv, "q8_0 head n=%lld: each of %lld tokens == its one-token result (isa %s)",
           (long long)n, (long long)ntok, dtype_isa());
    if (dtype_matmul_packs(DT_Q8_0, n)) {
        const uint32_t tp = DT_Q8_0 | DT_PACKED;
        void *xq = malloc(dtype_matmul_scratch_bytes(tp, n, 2 * ntok));
        dtype_matmul_quantize_split(tp, x, n, ntok, xq);
        dtype_matmul_rows_split(tp, pk, rs, 0, 8, n, x, xq, ntok, y1, n_rows);
        dtype_matmul_rows_split(tp, pk, rs, 8, n_rows, n, x, NULL, ntok, y1, n_rows);
        CHECKF(memcmp(y0, y1, (size_t)(n_rows * ntok) * sizeof *y0) == 0,
               "q8_0 head n=%lld packed == stored, %lld tokens (isa %s)", (long long)n,
               (long long)ntok, dtype_isa());
        free(xq);
    }
    free(w), free(pk), free(x), free(y0), free(y1), free(y2);
}

int main(void)
{
    tu_rng r = {0x9d1e5ull};
    dtype_init();
    CHECK(qwide_row_bytes(576) % 64 == 0 && qwide_row_bytes(576) <= 2 * qact_row_bytes(576));
    test_quantize(&r);
    test_ref(&r);
#if KVANT_X86
    if (dtype_force_isa(KERNEL_ISA_AVX2) == 0)
        test_packed(&r, "avx2", qwide_tile_q8_0_packed_avx2, 1);
    else
        fprintf(stderr, "test_qwide: CPU lacks avx2: the packed kernel not run here\n");
    if (dtype_force_isa(KERNEL_ISA_AVX512) == 0) {
        test_packed(&r, "avx512", qwide_tile_q8_0_packed_avx512, 0);
        CHECK(dtype_matmul_qact()->wide_packed_tile == qwide_tile_q8_0_packed_avx512);
    } else {
        fprintf(stderr, "test_qwide: CPU lacks avx512: its packed kernel not run here\n");
    }
#endif
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (dtype_force_isa((kernel_isa)isa) != 0)
            continue;
        test_matmul(&r, 576, 7);
        test_matmul(&r, 576, 1);
        test_matmul(&r, 2048 + 96, 5);
    }
    return tu_finish("test_qwide");
}
