/* test_matmul_q8.c - the activation-quantized ("qact") matmul path:
 * quantizer and dot kernels against their scalar references, accuracy
 * against an exact double dot, and batch invariance of dtype_matmul_rows_q.
 *
 * Budgets:
 *   qact_quantize_{avx2,avx512} == qact_quantize_ref bitwise; |x - q*d| <= d/2.
 *   qact dot AVX2 / AVX-512 == ref bitwise (integer sums are exact and the f32
 *     part runs in the same order), for nt = 1..4 and odd sizes.
 *   ref vs exact (double dot of to_float_ref(w) with the f32 x), N(0,1)
 *     data: |err| / (||w|| * ||x||) < 5e-3 worst case.  Theory: the rounding
 *     error of a code is uniform in +-d/2, d = amax/127 per 32 values, so
 *     std(err)/(||w|| ||x||) = d/(sqrt(12) ||x||) ~ 9e-4 for one chunk of
 *     N(0,1) (amax/rms ~ 2.3), smaller for longer rows; 5e-3 is > 5 sigma.
 *     Measured worst 3.0e-3 (n = 32), median |err| / |exact| 0.4-0.55%:
 *     bound 1% per type (dots with |exact| < 0.1 sigma excluded).
 *   dtype_matmul_rows_q: batch 7 == 7 x batch 1 (split row ranges) bitwise,
 *     and == the qact reference dot bitwise.
 * Every ISA the CPU has is tested (AVX2 and AVX-512 kernels against the
 * reference; the matmul driver on scalar, AVX2 and AVX-512); an ISA the CPU
 * lacks is named on stderr and not run.  Random code bytes (every code
 * value, q8_0's -128 included) check the SIMD kernels' integer ranges.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/qact.h"
#include "kernels/quant_ref.h"
#include "testutil.h"
#include "util/arch.h"

static const int k_types[] = {DT_Q4_0, DT_Q4_1, DT_Q5_0, DT_Q5_1, DT_Q8_0,
                              DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_MXFP4};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))

static void fill_normal(tu_rng *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_rand_normal(r) * scale;
}

/* The SIMD kernels under test (NULL: reference only). */
typedef struct isa_kernels {
    kernel_isa isa;
    const char *name;
    qact_quantize_fn quant;
    qact_dot_fn (*dot)(uint32_t type);
} isa_kernels;

static void test_quantize(tu_rng *r, const isa_kernels *isa)
{
    static const int64_t sizes[] = {32, 96, 576, 608, 1536, 2080};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int64_t n = sizes[s];
        const size_t rb = qact_row_bytes(n);
        float *x = malloc(n * 4);
        uint8_t *a = malloc(rb), *b = malloc(rb);
        fill_normal(r, x, n, s % 2 ? 0.01f : 3.0f);
        x[n / 2] = 0.0f;
        memset(a, 0x5A, rb), memset(b, 0xA5, rb);
        qact_quantize_ref(x, n, a);
        const qact_view v = qact_view_of(a, n);
        int ok = 1;
        for (int64_t i = 0; i < n; i++) {
            const float d = v.d[i / 32];
            ok &= fabsf(x[i] - v.qs[i] * d) <= d * 0.5f * 1.0001f && abs(v.qs[i]) <= 127;
        }
        CHECKF(ok, "qact ref rounding n=%lld", (long long)n);
        if (isa) {
            isa->quant(x, n, b);
            CHECKF(memcmp(a, b, rb) == 0, "qact %s == ref n=%lld", isa->name, (long long)n);
        }
        free(x), free(a), free(b);
    }
}

/* Exact double dot of the dequantized row and the f32 activations. */
static double exact_dot(const float *wf, const float *x, int64_t n, double *norm)
{
    double s = 0, ww = 0, xx = 0;
    for (int64_t i = 0; i < n; i++) {
        s += (double)wf[i] * x[i];
        ww += (double)wf[i] * wf[i];
        xx += (double)x[i] * x[i];
    }
    *norm = sqrt(ww * xx);
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One type at one size: SIMD vs ref bitwise, ref vs exact. */
/* Overwrites the code bytes of w with random bits (every code value,
 * q8_0's -128 included), keeping its f16 scales finite; mxfp4: every
 * byte, its E8M0 scale too (large ones overflow to inf and nan, which the
 * kernels must reproduce bitwise as well). */
static void randomize_codes(tu_rng *r, int t, uint8_t *w, size_t bytes)
{
    const dtype_traits *tr = dtype_get((uint32_t)t);
    const size_t bs = tr->type_size;
    /* scale bytes at the start of the block (q6_K: d at the end) */
    const size_t head = t == DT_Q4_1 || t == DT_Q5_1 || t == DT_Q4_K || t == DT_Q5_K ? 4
                        : t == DT_Q6_K || t == DT_MXFP4 ? 0 : 2;
    const size_t tail = t == DT_Q6_K ? 2 : 0;
    for (size_t b = 0; b < bytes; b += bs)
        for (size_t i = b + head; i < b + bs - tail; i++)
            w[i] = (uint8_t)tu_rand_u64(r);
}

static void test_dot_size(tu_rng *r, int t, int64_t n, const isa_kernels *isa, int wild,
                          double *worst, double *rels, int *nrel)
{
    const dtype_traits *tr = dtype_get((uint32_t)t);
    const int64_t rows = 3, ntok = 4;
    const size_t rs = dtype_row_size((uint32_t)t, n), rb = qact_row_bytes(n);
    float *src = malloc(rows * n * 4), *wf = malloc(rows * n * 4), *x = malloc(ntok * n * 4);
    uint8_t *w = malloc(rows * rs), *xq = malloc(ntok * rb);
    fill_normal(r, src, rows * n, 0.05f);
    fill_normal(r, x, ntok * n, 1.0f);
    x[3] = 0.0f;
    tr->from_float(src, w, rows * n);
    if (wild)
        randomize_codes(r, t, w, rows * rs);
    tr->to_float_ref(w, wf, rows * n);
    for (int64_t k = 0; k < ntok; k++)
        qact_quantize_ref(x + k * n, n, xq + k * rb);
    const qact_dot_fn ref = qact_dot_ref((uint32_t)t), fast = isa ? isa->dot((uint32_t)t) : NULL;
    int same = 1;
    for (int64_t j = 0; j < rows; j++) {
        const uint8_t *wr = w + j * rs;
        float yr[4], y1[4], ym[4];
        ref(n, wr, xq, rb, (int)ntok, yr);
        for (int k = 0; k < ntok && !wild; k++) {
            double norm, e = exact_dot(wf + j * n, x + k * n, n, &norm);
            *worst = fmax(*worst, fabs(yr[k] - e) / norm);
            if (fabs(e) > 0.1 * norm / sqrt((double)n) && *nrel < 4096)
                rels[(*nrel)++] = fabs(yr[k] - e) / fabs(e);
        }
        if (!fast)
            continue;
        for (int nt = 1; nt <= ntok; nt++) {
            fast(n, wr, xq, rb, nt, ym);
            for (int k = 0; k < nt; k++) {
                fast(n, wr, xq + k * rb, rb, 1, y1);
                same &= memcmp(&ym[k], &yr[k], 4) == 0 && memcmp(&y1[0], &yr[k], 4) == 0;
            }
        }
    }
    if (fast)
        CHECKF(same, "%s qact %s == ref bitwise, n=%lld%s", tr->name, isa->name, (long long)n,
               wild ? " (random codes)" : "");
    free(src), free(wf), free(x), free(w), free(xq);
}

static void test_dots(tu_rng *r, const isa_kernels *isa)
{
    static const int64_t legacy_n[] = {32, 96, 576, 1568, 2048};
    static const int64_t k_n[] = {256, 768, 1280, 2048};
    for (int i = 0; i < N_TYPES; i++) {
        const int t = k_types[i];
        const int is_k = dtype_get((uint32_t)t)->block_size == QK_K;
        const int64_t *ns = is_k ? k_n : legacy_n;
        const int nn = is_k ? 4 : 5;
        double worst = 0, rels[4096];
        int nrel = 0;
        for (int s = 0; s < nn; s++)
            for (int rep = 0; rep < 5; rep++)
                test_dot_size(r, t, ns[s], isa, rep == 4, &worst, rels, &nrel);
        qsort(rels, (size_t)nrel, sizeof rels[0], cmp_double);
        const double med = nrel ? rels[nrel / 2] : 0;
        fprintf(stderr, "  %-5s qact ref vs exact: worst |err|/(|w||x|) %.2e, median rel %.2e (%d dots)\n",
                dtype_get((uint32_t)t)->name, worst, med, nrel);
        CHECKF(worst < 5e-3, "%s worst normalised error %.3e", dtype_get((uint32_t)t)->name, worst);
        CHECKF(med < 1e-2, "%s median relative error %.3e", dtype_get((uint32_t)t)->name, med);
    }
}

/* mxfp4 rows of nb blocks at the end of exact-size buffers (ASan sees any
 * read past the last block), random codes: row 0 block b has E8M0 byte
 * b % 256 (nb = 257: every exponent; e >= 250 overflows f32, so inf and
 * nan must match bitwise too), row 1 has e in 96..159.  SIMD == ref
 * bitwise for nt = 1..4; and the reference == the double dot of the
 * dequantized weights with the dequantized activations (d[c] * q) to
 * 1e-5 of sum |w a| on row 1 (only f32 rounding of the per-chunk terms and
 * of the 16-lane sums separates them). */
static void test_mxfp4_edges(tu_rng *r, const isa_kernels *isa)
{
    static const int64_t nbs[] = {1, 2, 3, 15, 16, 17, 31, 33, 257};
    for (size_t s = 0; s < sizeof nbs / sizeof nbs[0]; s++) {
        const int64_t nb = nbs[s], n = nb * QK_MXFP4, ntok = 4;
        const size_t rs = dtype_row_size(DT_MXFP4, n), rb = qact_row_bytes(n);
        uint8_t *w = malloc(2 * rs), *xq = malloc(ntok * rb);
        float *x = malloc(ntok * n * 4), *wf = malloc(n * 4);
        for (size_t i = 0; i < 2 * rs; i++)
            w[i] = (uint8_t)tu_rand_u64(r);
        for (int64_t b = 0; b < nb; b++) {
            w[b * 17] = (uint8_t)(b % 256);
            w[rs + b * 17] = (uint8_t)(96 + tu_rand_u64(r) % 64);
        }
        fill_normal(r, x, ntok * n, 1.0f);
        for (int64_t k = 0; k < ntok; k++)
            qact_quantize_ref(x + k * n, n, xq + k * rb);
        const qact_dot_fn ref = qact_dot_ref(DT_MXFP4), fast = isa ? isa->dot(DT_MXFP4) : NULL;
        int same = 1;
        for (int j = 0; j < 2; j++) {
            float yr[4], ym[4];
            ref(n, w + j * rs, xq, rb, (int)ntok, yr);
            for (int nt = 1; fast && nt <= ntok; nt++) {
                fast(n, w + j * rs, xq, rb, nt, ym);
                same &= memcmp(ym, yr, (size_t)nt * 4) == 0;
            }
            if (j == 0 || isa)
                continue;
            dtype_get(DT_MXFP4)->to_float_ref(w + rs, wf, n);
            for (int64_t k = 0; k < ntok; k++) {
                const qact_view v = qact_view_of(xq + k * rb, n);
                double e = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    const double p = (double)wf[i] * ((double)v.d[i / 32] * v.qs[i]);
                    e += p, mag += fabs(p);
                }
                CHECKF(fabs(yr[k] - e) <= 1e-5 * mag, "mxfp4 qact ref vs dequantized dot, nb=%lld: "
                       "%g vs %g", (long long)nb, yr[k], e);
            }
        }
        if (fast)
            CHECKF(same, "mxfp4 qact %s == ref bitwise, every exponent, nb=%lld", isa->name,
                   (long long)nb);
        free(w), free(xq), free(x), free(wf);
    }
}

/* dtype_matmul_rows_q: batch 7 vs 7 batches of 1 (rows split 0..5, 5..13),
 * pre-quantized vs not, and equal to the reference dot. */
static void test_matmul(tu_rng *r)
{
    const int64_t rows = 13, n_tok = 7;
    for (int i = 0; i < N_TYPES; i++) {
        const uint32_t t = (uint32_t)k_types[i];
        const dtype_traits *tr = dtype_get(t);
        const int64_t n = tr->block_size == QK_K ? 3 * QK_K : 23 * 32;
        const size_t rs = dtype_row_size(t, n), rb = qact_row_bytes(n);
        float *src = malloc(rows * n * 4), *x = malloc(n_tok * n * 4);
        float *y7 = malloc(n_tok * rows * 4), *y1 = malloc(n_tok * rows * 4), *yq = malloc(n_tok * rows * 4);
        uint8_t *w = malloc(rows * rs), *xq = malloc(dtype_matmul_scratch_bytes(t, n, n_tok) + 1);
        fill_normal(r, src, rows * n, 0.05f);
        fill_normal(r, x, n_tok * n, 1.0f);
        tr->from_float(src, w, rows * n);
        CHECK(dtype_matmul_uses_qact(t));
        CHECK(dtype_matmul_scratch_bytes(t, n, n_tok) == rb * n_tok);
        dtype_matmul_rows_q(t, w, rs, 0, rows, n, x, NULL, n_tok, y7, rows);
        dtype_matmul_quantize(t, x, n, n_tok, xq);
        dtype_matmul_rows_q(t, w, rs, 0, 6, n, x, xq, n_tok, yq, rows);
        dtype_matmul_rows_q(t, w, rs, 6, rows, n, x, xq, n_tok, yq, rows);
        for (int64_t k = 0; k < n_tok; k++) {
            dtype_matmul_rows_q(t, w, rs, 0, 5, n, x + k * n, NULL, 1, y1 + k * rows, rows);
            dtype_matmul_rows_q(t, w, rs, 5, rows, n, x + k * n, NULL, 1, y1 + k * rows, rows);
        }
        CHECKF(memcmp(y1, y7, n_tok * rows * 4) == 0, "%s matmul batch 1 vs 7", tr->name);
        CHECKF(memcmp(yq, y7, n_tok * rows * 4) == 0, "%s matmul xq vs internal", tr->name);
        int same = 1;
        for (int64_t k = 0; k < n_tok; k++)
            for (int64_t j = 0; j < rows; j++) {
                float v;
                qact_dot_ref(t)(n, w + j * rs, xq + k * rb, rb, 1, &v);
                same &= memcmp(&v, &y7[k * rows + j], 4) == 0;
            }
        CHECKF(same, "%s matmul == qact ref", tr->name);
        free(src), free(x), free(y7), free(y1), free(yq), free(w), free(xq);
    }
    /* exact-path types declare it */
    CHECK(!dtype_matmul_uses_qact(DT_F32) && !dtype_matmul_uses_qact(DT_F16) &&
          !dtype_matmul_uses_qact(DT_BF16));
    CHECK(dtype_matmul_scratch_bytes(DT_F16, 4096, 4) == 0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Timing print (never asserted): 1024 x 4096 rows, one thread, 1 token. */
static void bench(tu_rng *r)
{
    const int64_t n = 4096, rows = 1024;
    float *src = malloc(rows * n * 4), *x = malloc(n * 4), *y = malloc(rows * 4);
    fill_normal(r, src, rows * n, 0.05f);
    fill_normal(r, x, n, 1.0f);
    for (int i = 0; i < N_TYPES; i++) {
        const uint32_t t = (uint32_t)k_types[i];
        const dtype_traits *tr = dtype_get(t);
        const size_t rs = dtype_row_size(t, n);
        uint8_t *w = malloc(rs * rows);
        tr->from_float(src, w, rows * n);
        volatile float sink = 0;
        double best_f = 1e9, best_q = 1e9;
        for (int rep = 0; rep < 5; rep++) {
            double t0 = now_s();
            for (int64_t j = 0; j < rows; j++)
                sink += tr->vec_dot(n, w + j * rs, x);
            best_f = fmin(best_f, now_s() - t0);
            t0 = now_s();
            dtype_matmul_rows_q(t, w, rs, 0, rows, n, x, NULL, 1, y, rows);
            best_q = fmin(best_q, now_s() - t0);
        }
        (void)sink;
        fprintf(stderr, "    %-5s f32 vec_dot %6.1f GB/s   qact matmul 1 tok %6.1f GB/s\n", tr->name,
                rs * rows / best_f / 1e9, rs * rows / best_q / 1e9);
        free(w);
    }
    free(src), free(x), free(y);
}

/* dtype_matmul_qact() holds the forced ISA's kernels (isa NULL: the references). */
static void test_table(const isa_kernels *isa)
{
    const qact_kernels *k = dtype_matmul_qact();
    const char *name = isa ? isa->name : "scalar";
    CHECKF(k->quantize == (isa ? isa->quant : qact_quantize_ref), "qact table %s: quantizer",
           name);
    for (uint32_t t = 0; t < DT_COUNT; t++)
        CHECKF(k->dot[t] == (isa ? isa->dot(t) : qact_dot_ref(t)), "qact table %s: dot of type %u",
               name, t);
}

int main(void)
{
    tu_rng r = {0x9E3779B97F4A7C15ull};
    dtype_init();
#if KVANT_X86
    static const isa_kernels simd[] = {
        {KERNEL_ISA_AVX2, "avx2", qact_quantize_avx2, qact_dot_avx2},
        {KERNEL_ISA_AVX512, "avx512", qact_quantize_avx512, qact_dot_avx512},
    };
#else
    static const isa_kernels simd[] = {{KERNEL_ISA_AVX2, "avx2", NULL, NULL}}; /* never forced */
#endif
    /* the reference's own accuracy, then each SIMD ISA the CPU has */
    test_quantize(&r, NULL);
    test_dots(&r, NULL);
    test_mxfp4_edges(&r, NULL);
    for (size_t i = 0; i < sizeof simd / sizeof simd[0]; i++) {
        if (dtype_force_isa(simd[i].isa) != 0) {
            fprintf(stderr, "test_matmul_q8: CPU lacks %s: its kernels not run here\n", simd[i].name);
            continue;
        }
        test_table(&simd[i]);
        test_quantize(&r, &simd[i]);
        test_dots(&r, &simd[i]);
        test_mxfp4_edges(&r, &simd[i]);
    }
    /* the matmul driver on every ISA the CPU has, scalar included */
    for (int i = 0; i < KERNEL_ISA_COUNT; i++) {
        if (dtype_force_isa((kernel_isa)i) != 0)
            continue;
        if (i == KERNEL_ISA_SCALAR)
            test_table(NULL);
        fprintf(stderr, "  matmul on %s\n", dtype_isa_name((kernel_isa)i));
        test_matmul(&r);
        if (i > 0)
            bench(&r);
    }
    return tu_finish("test_matmul_q8");
}
