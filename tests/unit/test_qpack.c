/* test_qpack.c - weight rows packed at load (kernels/qpack.h).
 *
 * Types: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K, mxfp4.  Checks:
 *   qpack_unpack_rows(qpack_rows(w)) == w bytewise, copying and in place,
 *     and a packed tensor keeps its size and row stride;
 *   qpack_interleave_act moves byte 32c + p of each group to
 *     64(p/4) + 4c + p%4 (the padded last group too) and leaves the scales
 *     and sums;
 *   the packed dot kernels (AVX2, AVX-512) == qact_dot_ref of the stored
 *     row against the in-order activations, bitwise, for nt = 1..4, for
 *     rows with and without a short last group (1..15 chunks; 1, 2, 3 and 4 take the
 *     AVX2 kernels' 128-bit tail), with quantized and with
 *     random code bytes (every code value, q8_0's -128 included; mxfp4:
 *     every byte random, its E8M0 scales too, inf and nan results included);
 *   the AVX2 rows kernel (one token, many rows) == the one-token packed dot
 *     of each row, bitwise;
 *   dtype_matmul_rows_q on packed rows (type | DT_PACKED, 1 and 7 tokens,
 *     split row ranges) == the stored rows' results bitwise;
 *   the split path (two int8 terms per token, the output head's; q8_0 takes
 *     one int16 term there, test_qwide has its kernels): packed == stored bitwise, with and without pre-quantized rows, each token ==
 *     its one-token result (batch invariance), every ISA and the scalar
 *     reference, and within 2e-5 |w||x| of the exact f32 product (measured
 *     about 2.5e-6; the single-term path: about 3e-3, test_matmul_q8).
 * Every ISA the CPU has is run; one it lacks is named on stderr.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/qact.h"
#include "kernels/qpack.h"
#include "testutil.h"
#include "util/arch.h"

static const uint32_t k_types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,
                                   DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_MXFP4};
static const int64_t k_sizes[] = {32, 96, 128, 512, 576, 640, 768, 1120, 1280, 2048, 5632};
#define N_TYPES 9
#define N_SIZES ((int)(sizeof k_sizes / sizeof k_sizes[0]))

typedef struct rows {
    uint32_t type;
    int64_t n, n_rows;
    size_t rs;
    uint8_t *w;  /* stored layout */
    uint8_t *pk; /* packed */
} rows;

/* Quantized N(0, 0.05) rows; wild: code bytes replaced by random bits. */
static rows make_rows(tu_rng *r, uint32_t t, int64_t n, int64_t n_rows, int wild)
{
    const dtype_traits *tr = dtype_get(t);
    rows w = {t, n, n_rows, dtype_row_size(t, n), NULL, NULL};
    float *src = malloc((size_t)(n * n_rows) * sizeof *src);
    for (int64_t i = 0; i < n * n_rows; i++)
        src[i] = tu_rand_normal(r) * 0.05f;
    for (int i = 0; i < 32; i++) /* one all-zero block: scale 0 */
        src[32 + i] = 0.0f;
    w.w = malloc(w.rs * (size_t)n_rows);
    w.pk = malloc(w.rs * (size_t)n_rows);
    tr->from_float(src, w.w, n * n_rows);
    if (wild) { /* every byte but the f16 scales (which stay finite) */
        const size_t bs = tr->type_size;
        size_t f0 = 0, f1 = t == DT_Q4_1 || t == DT_Q5_1 || t == DT_Q4_K || t == DT_Q5_K ? 4 : 2;
        if (t == DT_Q6_K)
            f0 = bs - 2, f1 = bs;
        if (t == DT_MXFP4) /* the E8M0 byte too: every exponent */
            f1 = 0;
        for (size_t b = 0; b < w.rs * (size_t)n_rows; b += bs)
            for (size_t i = 0; i < bs; i++)
                if (i < f0 || i >= f1)
                    w.w[b + i] = (uint8_t)tu_rand_u64(r);
    }
    qpack_rows(t, w.w, w.pk, n, n_rows, w.rs);
    free(src);
    return w;
}

static void free_rows(rows *w)
{
    free(w->w);
    free(w->pk);
}

static void test_layout(tu_rng *r)
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int si = 0; si < N_SIZES; si++) {
            if (!qpack_supported(k_types[ti], k_sizes[si]))
                continue; /* q4_K: whole super-blocks only */
            rows w = make_rows(r, k_types[ti], k_sizes[si], 3, si % 2);
            const size_t bytes = w.rs * 3;
            uint8_t *back = malloc(bytes), *inplace = malloc(bytes);
            qpack_unpack_rows(w.type, w.pk, back, w.n, 3, w.rs);
            CHECKF(memcmp(back, w.w, bytes) == 0, "%s n=%lld unpack(pack) == stored",
                   dtype_get(w.type)->name, (long long)w.n);
            CHECKF(w.n < QACT_GROUP || memcmp(back, w.pk, bytes) != 0,
                   "%s n=%lld packing moves bytes", dtype_get(w.type)->name, (long long)w.n);
            memcpy(inplace, w.w, bytes);
            qpack_rows(w.type, inplace, inplace, w.n, 3, w.rs);
            CHECKF(memcmp(inplace, w.pk, bytes) == 0, "%s n=%lld in-place pack",
                   dtype_get(w.type)->name, (long long)w.n);
            qpack_unpack_rows(w.type, inplace, inplace, w.n, 3, w.rs);
            CHECKF(memcmp(inplace, w.w, bytes) == 0, "%s n=%lld in-place unpack",
                   dtype_get(w.type)->name, (long long)w.n);
            free(back), free(inplace);
            free_rows(&w);
        }
    }
    CHECK(qpack_supported(DT_Q4_0, 32) && !qpack_supported(DT_Q4_0, 48));
    CHECK(qpack_supported(DT_Q6_K, 2048) && !qpack_supported(DT_F16, 2048));
    CHECK(qpack_supported(DT_Q4_K, 768) && !qpack_supported(DT_Q4_K, 576));
    CHECK(!qpack_supported(DT_Q6_K, 576) && !qpack_supported(DT_Q5_K, 576));
    CHECK(qpack_supported(DT_MXFP4, 32) && qpack_supported(DT_MXFP4, 1120) &&
          !qpack_supported(DT_MXFP4, 48));

    const int64_t n = 1120; /* two full groups and three chunks */
    const size_t rb = qact_row_bytes(n);
    float *x = malloc(n * sizeof *x);
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_rand_normal(r);
    uint8_t *a = malloc(rb), *b = malloc(rb);
    qact_quantize_ref(x, n, a);
    memcpy(b, a, rb);
    qpack_interleave_act(b, n);
    int ok = 1;
    const int64_t np = qact_padded(n);
    for (int64_t i = 0; i < np; i++) {
        const int64_t g = i / QACT_GROUP, c = i % QACT_GROUP / 32, p = i % 32;
        ok &= b[g * QACT_GROUP + 64 * (p / 4) + 4 * c + p % 4] == a[i];
    }
    CHECK(ok);
    CHECK(memcmp(a + np, b + np, rb - (size_t)np) == 0);
    free(x), free(a), free(b);
}

#if KVANT_X86 /* the packed kernels exist on x86-64 only */
static void test_dots(tu_rng *r, const char *isa, qact_dot_fn (*packed)(uint32_t))
{
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int si = 0; si < N_SIZES; si++) {
            for (int wild = 0; wild < 2; wild++) {
                const uint32_t t = k_types[ti];
                const int64_t n = k_sizes[si], ntok = 4;
                if (!qpack_supported(t, n))
                    continue;
                CHECKF(packed(t) != NULL, "%s has a packed %s kernel", dtype_get(t)->name, isa);
                if (!packed(t))
                    continue;
                rows w = make_rows(r, t, n, 2, wild);
                const size_t rb = qact_row_bytes(n);
                float *x = malloc((size_t)(n * ntok) * sizeof *x);
                for (int64_t i = 0; i < n * ntok; i++)
                    x[i] = tu_rand_normal(r);
                for (int64_t i = 0; i < (n < 64 ? n : 64); i++) /* zero chunks: scale 0 */
                    x[n + i] = 0.0f;
                uint8_t *xq = malloc(rb * ntok), *xi = malloc(rb * ntok);
                for (int64_t k = 0; k < ntok; k++) {
                    qact_quantize_ref(x + k * n, n, xq + k * rb);
                    memcpy(xi + k * rb, xq + k * rb, rb);
                    qpack_interleave_act(xi + k * rb, n);
                }
                int same = 1;
                for (int j = 0; j < 2; j++) {
                    float yr[4], ym[4];
                    qact_dot_ref(t)(n, w.w + j * w.rs, xq, rb, (int)ntok, yr);
                    for (int nt = 1; nt <= ntok; nt++) {
                        packed(t)(n, w.pk + j * w.rs, xi, rb, nt, ym);
                        same &= memcmp(ym, yr, (size_t)nt * sizeof *ym) == 0;
                    }
                }
                CHECKF(same, "%s packed %s == ref bitwise, n=%lld%s", dtype_get(t)->name, isa,
                       (long long)n, wild ? " (random codes)" : "");
                free(x), free(xq), free(xi);
                free_rows(&w);
            }
        }
    }
}

/* One token against many rows (qact_dot_rows_fn): each row == the
 * one-token packed dot of the same ISA, bitwise; 9 rows (two runs of four
 * and one). */
static void test_dot_rows(tu_rng *r, const char *isa, qact_dot_fn (*packed)(uint32_t),
                          qact_dot_rows_fn (*rows_fn)(uint32_t))
{
    const int64_t n_rows = 9;
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int si = 0; si < N_SIZES; si++) {
            const uint32_t t = k_types[ti];
            const int64_t n = k_sizes[si];
            if (!qpack_supported(t, n))
                continue;
            CHECKF(rows_fn(t) != NULL, "%s has an %s rows kernel", dtype_get(t)->name, isa);
            if (!rows_fn(t))
                continue;
            rows w = make_rows(r, t, n, n_rows, si % 2);
            float *x = malloc((size_t)n * sizeof *x);
            for (int64_t i = 0; i < n; i++)
                x[i] = tu_rand_normal(r);
            uint8_t *xi = malloc(qact_row_bytes(n));
            qact_quantize_ref(x, n, xi);
            qpack_interleave_act(xi, n);
            float y0[9], y1[9];
            for (int64_t j = 0; j < n_rows; j++)
                packed(t)(n, w.pk + j * w.rs, xi, 0, 1, y0 + j);
            rows_fn(t)(n, w.pk, w.rs, n_rows, xi, y1);
            CHECKF(memcmp(y0, y1, sizeof y0) == 0, "%s %s rows == one-row dots bitwise, n=%lld",
                   dtype_get(t)->name, isa, (long long)n);
            free(x), free(xi);
            free_rows(&w);
        }
    }
}

/* A tile of rows against a token block (qact_dot_tile_fn), where the ISA
 * has it: every result == the reference bitwise, for 1..4 tokens, 5 rows
 * (two pairs and an odd one), outputs strided as in a matmul, at every size
 * (tails of 1-4 chunks, longer tails, whole groups); nothing else in y
 * written. */
static void test_tile(tu_rng *r, const char *isa, qact_dot_tile_fn (*tile)(uint32_t))
{
    const int64_t ntok = 4, n_rows = 5, ys = 7;
    for (int ti = 0; ti < N_TYPES; ti++) {
        for (int si = 0; si < N_SIZES; si++) {
            const uint32_t t = k_types[ti];
            const int64_t n = k_sizes[si];
            if (!qpack_supported(t, n) || !tile(t))
                continue;
            rows w = make_rows(r, t, n, n_rows, si % 2);
            const size_t rb = qact_row_bytes(n);
            float *x = malloc((size_t)(n * ntok) * sizeof *x);
            for (int64_t i = 0; i < n * ntok; i++)
                x[i] = tu_rand_normal(r);
            uint8_t *xq = malloc(rb * ntok), *xi = malloc(rb * ntok);
            for (int64_t k = 0; k < ntok; k++) {
                qact_quantize_ref(x + k * n, n, xq + k * rb);
                memcpy(xi + k * rb, xq + k * rb, rb);
                qpack_interleave_act(xi + k * rb, n);
            }
            float yr[5][4], ym[4 * 7];
            for (int j = 0; j < n_rows; j++)
                qact_dot_ref(t)(n, w.w + j * w.rs, xq, rb, (int)ntok, yr[j]);
            int same = 1;
            for (int nt = 1; nt <= ntok; nt++) {
                for (int i = 0; i < 4 * 7; i++)
                    ym[i] = -1.0f;
                tile(t)(n, w.pk, w.rs, n_rows, xi, rb, nt, ym, ys, nt & 1); /* stream: prefetch only */
                for (int k = 0; k < 4; k++)
                    for (int j = 0; j < ys; j++) {
                        const float want = k < nt && j < n_rows ? yr[j][k] : -1.0f;
                        same &= memcmp(&ym[k * ys + j], &want, sizeof want) == 0;
                    }
            }
            CHECKF(same, "%s %s tile == ref bitwise, n=%lld", dtype_get(t)->name, isa,
                   (long long)n);
            free(x), free(xq), free(xi);
            free_rows(&w);
        }
    }
}

/* The matmul driver: packed rows give the stored rows' results, for one
 * token (the rows kernel where the ISA has one) and for seven. */
static void test_matmul(tu_rng *r, int64_t ntok)
{
    const int64_t n = 2048 + 256, n_rows = 37; /* a short last group */
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        CHECK(dtype_matmul_packs(t, n));
        rows w = make_rows(r, t, n, n_rows, 0);
        float *x = malloc((size_t)(n * ntok) * sizeof *x);
        float *y0 = malloc((size_t)(n_rows * ntok) * sizeof *y0);
        float *y1 = malloc((size_t)(n_rows * ntok) * sizeof *y1);
        for (int64_t i = 0; i < n * ntok; i++)
            x[i] = tu_rand_normal(r);
        dtype_matmul_rows_q(t, w.w, w.rs, 0, n_rows, n, x, NULL, ntok, y0, n_rows);
        void *xq = malloc(dtype_matmul_scratch_bytes(t | DT_PACKED, n, ntok));
        dtype_matmul_quantize(t | DT_PACKED, x, n, ntok, xq);
        if (ntok > 1) { /* tokens quantized in two ranges: the same bytes */
            const size_t tb = dtype_matmul_token_bytes(t, 0, n), all = tb * (size_t)ntok;
            char *xr = malloc(all);
            dtype_matmul_quantize(t | DT_PACKED, x, n, 2, xr);
            dtype_matmul_quantize(t | DT_PACKED, x + 2 * n, n, ntok - 2, xr + 2 * tb);
            CHECKF(all == dtype_matmul_scratch_bytes(t | DT_PACKED, n, ntok) &&
                       memcmp(xr, xq, all) == 0,
                   "%s: tokens quantized in ranges == all at once", dtype_get(t)->name);
            free(xr);
        }
        dtype_matmul_rows_q(t | DT_PACKED, w.pk, w.rs, 0, 20, n, x, xq, ntok, y1, n_rows);
        dtype_matmul_rows_q(t | DT_PACKED, w.pk, w.rs, 20, n_rows, n, x, NULL, ntok, y1, n_rows);
        CHECKF(memcmp(y0, y1, (size_t)(n_rows * ntok) * sizeof *y0) == 0,
               "%s packed matmul == stored, %lld tokens", dtype_get(t)->name, (long long)ntok);
        free(x), free(y0), free(y1), free(xq);
        free_rows(&w);
    }
}

#endif

/* The split path against the exact f32 product and against itself: rows
 * n wide, n_rows of them (300 rows of 512: more than the 256 a tile call
 * of the head's terms takes at a time, within one row tile). */
static void test_split_n(tu_rng *r, int packed, int64_t n, int64_t n_rows)
{
    const int64_t ntok = 5;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const uint32_t t = k_types[ti];
        if (packed && !dtype_matmul_packs(t, n))
            continue;
        rows w = make_rows(r, t, n, n_rows, 0);
        const uint32_t tq = packed ? t | DT_PACKED : t;
        const void *wq = packed ? w.pk : w.w;
        float *x = malloc((size_t)(n * ntok) * sizeof *x);
        float *ye = malloc((size_t)(n_rows * ntok) * sizeof *ye);
        float *ys = malloc((size_t)(n_rows * ntok) * sizeof *ys);
        float *y1 = malloc((size_t)n_rows * sizeof *y1);
        for (int64_t i = 0; i < n * ntok; i++)
            x[i] = tu_rand_normal(r) * (i % 97 == 0 ? 8.0f : 1.0f); /* a few outliers */
        dtype_matmul_rows(t, w.w, w.rs, 0, n_rows, n, x, ntok, ye, n_rows);
        void *xq = malloc(dtype_matmul_scratch_bytes(tq, n, 2 * ntok));
        dtype_matmul_quantize_split(tq, x, n, ntok, xq);
        { /* tokens quantized in two ranges: the same bytes */
            const size_t tb = dtype_matmul_token_bytes(t, 1, n), all = tb * (size_t)ntok;
            char *xr = malloc(all);
            dtype_matmul_quantize_split(tq, x, n, 3, xr);
            dtype_matmul_quantize_split(tq, x + 3 * n, n, ntok - 3, xr + 3 * tb);
            CHECKF(all <= dtype_matmul_scratch_bytes(tq, n, 2 * ntok) && memcmp(xr, xq, all) == 0,
                   "%s split%s: tokens quantized in ranges == all at once", dtype_get(t)->name,
                   packed ? " packed" : "");
            free(xr);
        }
        dtype_matmul_rows_split(tq, wq, w.rs, 0, 11, n, x, xq, ntok, ys, n_rows);
        dtype_matmul_rows_split(tq, wq, w.rs, 11, n_rows, n, x, NULL, ntok, ys, n_rows);
        double worst = 0.0;
        int same = 1;
        for (int64_t k = 0; k < ntok; k++) {
            dtype_matmul_rows_split(tq, wq, w.rs, 0, n_rows, n, x + k * n, NULL, 1, y1, n_rows);
            same &= memcmp(y1, ys + k * n_rows, (size_t)n_rows * sizeof *y1) == 0;
            double xn = 0.0;
            for (int64_t i = 0; i < n; i++)
                xn += (double)x[k * n + i] * x[k * n + i];
            float *row = malloc((size_t)n * sizeof *row);
            for (int64_t rr = 0; rr < n_rows; rr++) {
                dtype_get(t)->to_float(w.w + rr * w.rs, row, n);
                double wn = 0.0;
                for (int64_t i = 0; i < n; i++)
                    wn += (double)row[i] * row[i];
                const double e = fabs((double)ys[k * n_rows + rr] - ye[k * n_rows + rr]) /
                                 sqrt(wn * xn);
                worst = e > worst ? e : worst;
            }
            free(row);
        }
        CHECKF(same, "%s split%s: each token == its one-token result (isa %s)",
               dtype_get(t)->name, packed ? " packed" : "", dtype_isa());
        CHECKF(worst < 2e-5, "%s split%s vs exact: worst |err|/(|w||x|) %.2e (isa %s)",
               dtype_get(t)->name, packed ? " packed" : "", worst, dtype_isa());
        if (packed) { /* packed == stored rows, bitwise */
            dtype_matmul_rows_split(t, w.w, w.rs, 0, n_rows, n, x, NULL, ntok, ye, n_rows);
            CHECKF(memcmp(ye, ys, (size_t)(n_rows * ntok) * sizeof *ye) == 0,
                   "%s split packed == stored", dtype_get(t)->name);
        }
        free(x), free(ye), free(ys), free(y1), free(xq);
        free_rows(&w);
    }
}

static void test_split(tu_rng *r, int packed)
{
    test_split_n(r, packed, 2048 + 256, 29);
    test_split_n(r, packed, 512, 300);
}

int main(void)
{
    tu_rng r = {0x51ED2701ull};
    dtype_init();
    test_layout(&r);
#if KVANT_X86
    static const struct {
        kernel_isa isa;
        const char *name;
        qact_dot_fn (*packed)(uint32_t);
        qact_dot_rows_fn (*rows)(uint32_t);
        qact_dot_tile_fn (*tile)(uint32_t);
    } isas[] = {{KERNEL_ISA_AVX2, "avx2", qpack_dot_avx2, qpack_dot_rows_avx2, qpack_dot_tile_avx2},
                {KERNEL_ISA_AVX512, "avx512", qpack_dot_avx512, qpack_dot_rows_avx512,
                 qpack_dot_tile_avx512}};
    for (size_t i = 0; i < sizeof isas / sizeof isas[0]; i++) {
        if (dtype_force_isa(isas[i].isa) != 0) {
            fprintf(stderr, "test_qpack: CPU lacks %s: its packed kernels not run here\n",
                    isas[i].name);
            continue;
        }
        for (uint32_t t = 0; t < DT_COUNT; t++) /* the table holds this ISA's kernels */
            CHECKF(dtype_matmul_qact()->packed_dot[t] == isas[i].packed(t),
                   "%s table: packed dot %u", isas[i].name, t);
        test_dots(&r, isas[i].name, isas[i].packed);
        test_dot_rows(&r, isas[i].name, isas[i].packed, isas[i].rows);
        for (uint32_t t = 0; t < DT_COUNT; t++)
            CHECKF(dtype_matmul_qact()->packed_dot_rows[t] == isas[i].rows(t),
                   "%s table: packed rows %u", isas[i].name, t);
        test_tile(&r, isas[i].name, isas[i].tile);
        for (uint32_t t = 0; t < DT_COUNT; t++)
            CHECKF(dtype_matmul_qact()->packed_tile[t] == isas[i].tile(t),
                   "%s table: tile %u", isas[i].name, t);
        test_matmul(&r, 1);
        test_matmul(&r, 7);
        test_split(&r, 1);
    }
#endif
    CHECK(dtype_force_isa(KERNEL_ISA_SCALAR) == 0);
    CHECK(!dtype_matmul_packs(DT_Q4_0, 2048)); /* no packed kernel without SIMD */
    test_split(&r, 0);
    return tu_finish("test_qpack");
}
