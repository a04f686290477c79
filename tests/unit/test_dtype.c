/* test_dtype.c - dtype traits, conversions, reference quantizers, SIMD
 * kernels against their scalar references, and the batched matmul.
 *
 * Error budgets (relative RMS of from_float -> to_float_ref on N(0,1) data;
 * theory: step/sqrt(12) with step = range/levels of a 32- or 16-element
 * block, plus f16 rounding of the scales):
 *   f16 0.05%, bf16 0.4%, q8_0 0.6%, q6_K 2.5%, q5_0/q5_1 5%, q5_K 6%,
 *   q4_0/q4_1 10%, q4_K 12%.
 * vec_dot: |got - exact| / sum|w_i x_i| < 1e-5, where exact is the double
 * dot of to_float_ref(w) and x (for every ISA the CPU has).
 * SIMD to_float: bitwise equal to to_float_ref.
 * gguf.quants vectors (tests/data/quant-vectors, scripts/make-quant-vectors.py):
 * to_float_ref bitwise equal; from_float equal for >= 97% of blocks of the
 * legacy types (gguf's q4_0/q5_0 rounding is done in f64, ggml's in f32).
 * Run from the repository root.  Set KVANT_BENCH=1 for a 4096x4096 timing
 * (default 1024x4096); timings are printed, never asserted.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/quant_ref.h"
#include "testutil.h"

static const int k_types[] = {DT_F32,  DT_F16,  DT_BF16, DT_Q8_0, DT_Q4_0, DT_Q4_1,
                              DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))

static double rt_bound(int t)
{
    switch (t) {
    case DT_F32: return 0.0;
    case DT_F16: return 5e-4;
    case DT_BF16: return 4e-3;
    case DT_Q8_0: return 0.006;
    case DT_Q6_K: return 0.025;
    case DT_Q5_0: case DT_Q5_1: return 0.05;
    case DT_Q5_K: return 0.06;
    case DT_Q4_0: case DT_Q4_1: return 0.10;
    case DT_Q4_K: return 0.12;
    default: return 0.0;
    }
}

static void fill_normal(tu_rng *r, float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = tu_rand_normal(r) * scale;
}

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* (4), plus enum/name agreement with GGUF. */
static void test_traits(void)
{
    CHECK(dtype_get(DT_COUNT) == NULL);
    CHECK(dtype_get(DT_Q8_1) == NULL && dtype_get(DT_Q2_K) == NULL && dtype_get(DT_Q8_K) == NULL);
    CHECK(dtype_get(4) == NULL && dtype_get(0xFFFFFFFFu) == NULL);
    CHECK(dtype_from_name("q4_0") == DT_Q4_0 && dtype_from_name("Q4_K") == DT_Q4_K);
    CHECK(dtype_from_name("bf16") == DT_BF16 && dtype_from_name("q2_K") == -1);
    CHECK(dtype_from_name("nope") == -1 && dtype_from_name(NULL) == -1);
    CHECK(dtype_row_size(DT_F32, 10) == 40 && dtype_row_size(DT_F16, 3) == 6);
    CHECK(dtype_row_size(DT_Q4_0, 4096) == 128 * 18);
    CHECK(dtype_row_size(DT_Q4_0, 33) == 0 && dtype_row_size(DT_Q4_0, -32) == 0);
    CHECK(dtype_row_size(DT_Q6_K, 512) == 420 && dtype_row_size(DT_Q4_K, 256) == 144);
    CHECK(dtype_row_size(DT_Q5_K, 768) == 528 && dtype_row_size(DT_Q8_0, 64) == 68);
    CHECK(dtype_row_size(DT_Q2_K, 256) == 0 && dtype_row_size(99, 32) == 0);
    CHECK(dtype_row_size(DT_F32, INT64_MAX) == 0); /* overflow */
    for (int i = 0; i < N_TYPES; i++) {
        const dtype_traits *tr = dtype_get((uint32_t)k_types[i]);
        CHECKF(tr && tr->name && dtype_from_name(tr->name) == k_types[i], "type %d", k_types[i]);
        CHECK(tr && tr->to_float && tr->from_float && tr->vec_dot && tr->to_float_ref &&
              tr->vec_dot_ref);
        CHECK(tr && tr->is_quantized == (k_types[i] != DT_F32 && k_types[i] != DT_F16 &&
                                         k_types[i] != DT_BF16));
    }
}

/* (5) fp16 / bf16 against known bit patterns. */
static void test_conversions(void)
{
    CHECK(half_f32_to_fp16(1.0f) == 0x3C00 && half_f32_to_fp16(-2.0f) == 0xC000);
    CHECK(half_f32_to_fp16(65504.0f) == 0x7BFF && half_f32_to_fp16(65520.0f) == 0x7C00);
    CHECK(half_f32_to_fp16(INFINITY) == 0x7C00 && half_f32_to_fp16(-INFINITY) == 0xFC00);
    CHECK((half_f32_to_fp16(NAN) & 0x7FFF) > 0x7C00);
    CHECK(half_f32_to_fp16(0x1p-24f) == 0x0001 && half_f32_to_fp16(0x1p-25f) == 0x0000);
    CHECK(half_f32_to_fp16(0x1.8p-25f) == 0x0001);           /* > half ulp rounds up */
    CHECK(half_f32_to_fp16(0x1p-14f) == 0x0400);              /* smallest normal */
    CHECK(half_f32_to_fp16(1.0f + 0x1p-11f) == 0x3C00);       /* tie -> even */
    CHECK(half_f32_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3C02);   /* tie -> even (up) */
    CHECK(half_f32_to_fp16(-0.0f) == 0x8000);
    CHECK(half_fp16_to_f32(0x3C00) == 1.0f && half_fp16_to_f32(0x0001) == 0x1p-24f);
    CHECK(half_fp16_to_f32(0x03FF) == 0x3FFp-24f && half_fp16_to_f32(0x7BFF) == 65504.0f);
    CHECK(isinf(half_fp16_to_f32(0xFC00)) && half_fp16_to_f32(0xFC00) < 0);
    CHECK(isnan(half_fp16_to_f32(0x7E00)) && f2u(half_fp16_to_f32(0x8000)) == 0x80000000u);
    int bad = 0; /* every finite half survives f16 -> f32 -> f16 */
    for (uint32_t h = 0; h < 0x10000; h++)
        if ((h & 0x7C00) != 0x7C00 && half_f32_to_fp16(half_fp16_to_f32((half_fp16)h)) != h)
            bad++;
    CHECKF(bad == 0, "%d halves do not round-trip", bad);

    CHECK(half_f32_to_bf16(1.0f) == 0x3F80 && half_bf16_to_f32(0x3F80) == 1.0f);
    CHECK(half_f32_to_bf16(u2f(0x3F808000u)) == 0x3F80);     /* tie -> even */
    CHECK(half_f32_to_bf16(u2f(0x3F818000u)) == 0x3F82);     /* tie -> even (up) */
    CHECK(half_f32_to_bf16(u2f(0x3F808001u)) == 0x3F81);
    CHECK(half_f32_to_bf16(INFINITY) == 0x7F80 && half_f32_to_bf16(u2f(0x7F7FFFFFu)) == 0x7F80);
    CHECK(half_f32_to_bf16(u2f(0x7F800001u)) == 0x7FC0);     /* snan -> quiet nan */
    CHECK(half_f32_to_bf16(u2f(0x00010000u)) == 0x0001);     /* subnormal kept */
    CHECK(half_bf16_to_f32(0x0001) == u2f(0x00010000u));
}

/* (1) round trip error of the reference quantizers. */
static void test_round_trip(tu_rng *r)
{
    const int64_t n = 4096 * 4;
    float *x = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    void *q = malloc(n * 4);
    fill_normal(r, x, n, 1.0f);
    for (int i = 0; i < N_TYPES; i++) {
        const dtype_traits *tr = dtype_get((uint32_t)k_types[i]);
        tr->from_float(x, q, n);
        tr->to_float_ref(q, y, n);
        double e2 = 0, s2 = 0;
        for (int64_t j = 0; j < n; j++) {
            e2 += (double)(x[j] - y[j]) * (x[j] - y[j]);
            s2 += (double)x[j] * x[j];
        }
        double rel = sqrt(e2 / s2);
        fprintf(stderr, "  round trip %-5s rel rms %.5f (bound %.4f)\n", tr->name, rel,
                rt_bound(k_types[i]));
        CHECKF(rel <= rt_bound(k_types[i]), "%s rel rms %g", tr->name, rel);
    }
    free(x);
    free(y);
    free(q);
}

/* Random blocks of type t for n elements: quantized from random normal
 * data with per-block random magnitude, so every field is exercised. */
static void *make_row(tu_rng *r, int t, int64_t n, float *scratch)
{
    const dtype_traits *tr = dtype_get((uint32_t)t);
    for (int64_t i = 0; i < n; i += 32) {
        float s = tu_rand_uniform(r, 0.05f, 3.0f), off = tu_rand_uniform(r, -0.5f, 0.5f);
        for (int64_t j = i; j < i + 32 && j < n; j++)
            scratch[j] = tu_rand_normal(r) * s + off;
    }
    void *w = malloc(dtype_row_size((uint32_t)t, n) + 64);
    tr->from_float(scratch, w, n);
    return w;
}

/* (2) and (3) for the ISA currently forced. */
static void test_kernels(tu_rng *r, const char *isa)
{
    static const int64_t sizes[] = {1, 3, 7, 16, 37, 4096 / 256 * 3, 4096};
    for (int i = 0; i < N_TYPES; i++) {
        const int t = k_types[i];
        const dtype_traits *tr = dtype_get((uint32_t)t);
        double worst = 0;
        for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
            const int64_t n = tr->block_size == 1 ? sizes[s] * 5 + 1 : sizes[s] * tr->block_size;
            float *src = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4), *x = malloc(n * 4);
            void *w = make_row(r, t, n, src);
            fill_normal(r, x, n, 1.0f);
            tr->to_float(w, a, n);
            tr->to_float_ref(w, b, n);
            CHECKF(memcmp(a, b, n * 4) == 0, "%s %s to_float n=%lld", isa, tr->name, (long long)n);
            double exact = 0, mag = 0;
            for (int64_t j = 0; j < n; j++) {
                exact += (double)b[j] * x[j];
                mag += fabs((double)b[j] * x[j]);
            }
            const float got = tr->vec_dot(n, w, x), ref = tr->vec_dot_ref(n, w, x);
            const double eg = fabs(got - exact) / mag, er = fabs(ref - exact) / mag;
            CHECKF(eg < 1e-5 && er < 1e-5, "%s %s vec_dot n=%lld err %g ref err %g", isa,
                   tr->name, (long long)n, eg, er);
            worst = fmax(worst, eg);
            free(src); free(a); free(b); free(x); free(w);
        }
        fprintf(stderr, "  %-6s %-5s vec_dot worst rel err %.2e\n", isa, tr->name, worst);
    }
}

/* Batch invariance: y for a token is bitwise the same in batch 1 and 7,
 * and equal to a single vec_dot call. */
static void test_matmul(tu_rng *r, const char *isa)
{
    const int64_t rows = 13, n_tok = 7;
    for (int i = 0; i < N_TYPES; i++) {
        const int t = k_types[i];
        const dtype_traits *tr = dtype_get((uint32_t)t);
        const int64_t n = tr->block_size == 1 ? 333 : 3 * QK_K;
        const size_t rs = dtype_row_size((uint32_t)t, n);
        float *src = malloc(rows * n * 4), *x = malloc(n_tok * n * 4);
        float *y7 = malloc(n_tok * rows * 4), *y1 = malloc(n_tok * rows * 4);
        void *w = make_row(r, t, rows * n, src);
        fill_normal(r, x, n_tok * n, 1.0f);
        dtype_matmul_rows((uint32_t)t, w, rs, 0, rows, n, x, n_tok, y7, rows);
        for (int64_t k = 0; k < n_tok; k++) {
            dtype_matmul_rows((uint32_t)t, w, rs, 0, 5, n, x + k * n, 1, y1 + k * rows, rows);
            dtype_matmul_rows((uint32_t)t, w, rs, 5, rows, n, x + k * n, 1, y1 + k * rows, rows);
        }
        CHECKF(memcmp(y1, y7, n_tok * rows * 4) == 0, "%s %s matmul batch 1 vs 7", isa, tr->name);
        int same = 1;
        for (int64_t k = 0; k < n_tok; k++)
            for (int64_t j = 0; j < rows; j++) {
                float v = tr->vec_dot(n, (const uint8_t *)w + j * rs, x + k * n);
                same &= f2u(v) == f2u(y7[k * rows + j]);
            }
        CHECKF(same, "%s %s matmul vs vec_dot", isa, tr->name);
        free(src); free(x); free(y7); free(y1); free(w);
    }
}

static void *read_file(const char *name, const char *ext, size_t *len)
{
    char path[256];
    snprintf(path, sizeof(path), "tests/data/quant-vectors/%s.%s", name, ext);
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = malloc(sz > 0 ? (size_t)sz : 1);
    *len = fread(p, 1, (size_t)sz, f);
    fclose(f);
    return p;
}

/* (6) independent vectors from gguf.quants. */
static void test_gguf_vectors(void)
{
    for (int i = 1; i < N_TYPES; i++) { /* f32 has no vectors */
        const dtype_traits *tr = dtype_get((uint32_t)k_types[i]);
        size_t nb = 0, nf = 0, ns = 0, nq = 0;
        uint8_t *blk = read_file(tr->name, "blk", &nb);
        float *ref = read_file(tr->name, "f32", &nf);
        CHECKF(blk && ref, "missing tests/data/quant-vectors/%s.* (run from repo root)", tr->name);
        if (!blk || !ref) {
            free(blk); free(ref);
            continue;
        }
        const int64_t n = (int64_t)(nf / 4);
        CHECK(dtype_row_size((uint32_t)k_types[i], n) == nb);
        float *y = malloc(nf);
        tr->to_float_ref(blk, y, n);
        CHECKF(memcmp(y, ref, nf) == 0, "%s to_float_ref differs from gguf.quants", tr->name);
        float *src = read_file(tr->name, "src", &ns);
        uint8_t *qnt = read_file(tr->name, "qnt", &nq);
        if (src && qnt && nq == nb) {
            uint8_t *mine = malloc(nq);
            tr->from_float(src, mine, n);
            int bad = 0, blocks = (int)(nq / tr->type_size);
            for (int b = 0; b < blocks; b++)
                bad += memcmp(mine + b * tr->type_size, qnt + b * tr->type_size, tr->type_size) != 0;
            fprintf(stderr, "  gguf %-5s from_float: %d/%d blocks differ\n", tr->name, bad, blocks);
            CHECKF(bad * 100 <= blocks * 3, "%s from_float differs in %d/%d blocks", tr->name, bad, blocks);
            free(mine);
        }
        free(blk); free(ref); free(y); free(src); free(qnt);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Timing print of vec_dot over a rows x 4096 matrix (never asserted). */
static void bench(tu_rng *r)
{
    const int64_t n = 4096, rows = getenv("KVANT_BENCH") ? 4096 : 1024;
    float *src = malloc(rows * n * 4), *x = malloc(n * 4 * 4), *y = malloc(rows * 4 * 4);
    fill_normal(r, src, rows * n, 1.0f);
    fill_normal(r, x, n * 4, 1.0f);
    fprintf(stderr, "  bench %s, %lldx%lld, one thread:\n", dtype_isa(), (long long)rows, (long long)n);
    for (int i = 0; i < N_TYPES; i++) {
        const dtype_traits *tr = dtype_get((uint32_t)k_types[i]);
        const size_t rs = dtype_row_size((uint32_t)k_types[i], n);
        uint8_t *w = malloc(rs * rows);
        tr->from_float(src, w, rows * n);
        volatile float sink = 0;
        double best = 1e9, best4 = 1e9;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_s();
            for (int64_t j = 0; j < rows; j++)
                sink += tr->vec_dot(n, w + j * rs, x);
            best = fmin(best, now_s() - t0);
            t0 = now_s();
            dtype_matmul_rows((uint32_t)k_types[i], w, rs, 0, rows, n, x, 4, y, rows);
            best4 = fmin(best4, now_s() - t0);
        }
        (void)sink;
        fprintf(stderr, "    %-5s vec_dot %6.1f GB/s (%5.2f Gelem/s)   matmul 4 tok %6.1f GB/s\n",
                tr->name, rs * rows / best / 1e9, n * rows / best / 1e9, rs * rows / best4 / 1e9);
        free(w);
    }
    free(src); free(x); free(y);
}

int main(void)
{
    tu_rng r = {0x1234567u};
    dtype_init();
    fprintf(stderr, "test_dtype: selected isa %s\n", dtype_isa());
    test_traits();
    test_conversions();
    test_round_trip(&r);
    test_gguf_vectors();
    const kernel_isa best = dtype_kernel_isa();
    CHECK(!strcmp(dtype_isa(), dtype_isa_name(best)));
    for (int k = 0; k < KERNEL_ISA_COUNT; k++) {
        const char *name = dtype_isa_name((kernel_isa)k);
        CHECK(dtype_isa_supported((kernel_isa)k) == (dtype_force_isa((kernel_isa)k) == 0));
        if (!dtype_isa_supported((kernel_isa)k)) {
            fprintf(stderr, "  isa %s not available on this CPU, skipped\n", name);
            continue;
        }
        CHECK(dtype_kernel_isa() == (kernel_isa)k && !strcmp(dtype_isa(), name));
        test_kernels(&r, name);
        test_matmul(&r, name);
    }
    CHECK(dtype_isa_supported(KERNEL_ISA_SCALAR) && !dtype_isa_supported(KERNEL_ISA_COUNT));
    CHECK(dtype_force_isa(KERNEL_ISA_COUNT) == -1);
    CHECK(dtype_force_isa(best) == 0);
    bench(&r);
    return tu_finish("test_dtype");
}
