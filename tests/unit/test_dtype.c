/* test_dtype.c - dtype traits, conversions, reference quantizers, SIMD
 * kernels against their scalar references, and the batched matmul.
 *
 * Error budgets (relative RMS of from_float -> to_float_ref on N(0,1) data;
 * theory: step/sqrt(12) with step = range/levels of a 32- or 16-element
 * block, plus f16 rounding of the scales):
 *   f16 0.05%, bf16 0.4%, q8_0 0.6%, q6_K 2.5%, q5_0/q5_1 5%, q5_K 6%,
 *   q4_0/q4_1 10%, q4_K 12%, mxfp4 13% (MXFP4_RT_BOUND).
 * vec_dot: |got - exact| / sum|w_i x_i| < 1e-5, where exact is the double
 * dot of to_float_ref(w) and x (for every ISA the CPU has).
 * SIMD to_float: bitwise equal to to_float_ref.
 * gguf.quants vectors (tests/data/quant-vectors, scripts/make-quant-vectors.py):
 * to_float_ref bitwise equal; from_float equal for >= 97% of blocks of the
 * legacy types (gguf's q4_0/q5_0 rounding is done in f64, ggml's in f32).
 * mxfp4 (no gguf.quants vectors in gguf 0.17): every exponent and code
 * decoded against ldexp bitwise, hand-checked quantized blocks (ties,
 * clipping, zero / tiny / huge blocks); tests/py/test_mxfp4.py decodes it
 * independently in numpy.
 * Run from the repository root.  Set KVANT_BENCH=1 for a 4096x4096 timing
 * (default 1024x4096); timings are printed, never asserted.
 */
#include <float.h>
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
                              DT_Q5_0, DT_Q5_1, DT_Q4_K, DT_Q5_K, DT_Q6_K, DT_MXFP4};
#define N_TYPES ((int)(sizeof(k_types) / sizeof(k_types[0])))

/* mxfp4: 8 magnitudes per sign on a power-of-two grid (step d below 4 d,
 * 2 d up to 8 d, 4 d to 12 d), amax / d in [8, 16), values past 12 d
 * clipped (ggml's rule): measured 0.1155 on N(0,1). */
#define MXFP4_RT_BOUND 0.13

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
    case DT_MXFP4: return MXFP4_RT_BOUND;
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
    CHECK(dtype_from_name("mxfp4") == DT_MXFP4 && dtype_from_name("MXFP4") == DT_MXFP4);
    CHECK(DT_MXFP4 == 39 && dtype_row_size(DT_MXFP4, 64) == 34 && dtype_row_size(DT_MXFP4, 48) == 0);
    CHECK(dtype_get(DT_MXFP4) && dtype_get(DT_MXFP4)->block_size == 32 &&
          dtype_get(DT_MXFP4)->type_size == 17);
    CHECK(dtype_get(20) == NULL && dtype_get(38) == NULL && dtype_get(40) == NULL); /* iq4_nl, gap */
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

/* mxfp4 written independently of blocks.h: FP4 E2M1 (OCP MX v1.0: 0, 0.5,
 * 1, 1.5, 2, 3, 4, 6 and their negatives) doubled, by 4-bit code. */
static const int k_mx_vals[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* v * 2^(e-128) in double (exact), rounded to f32: +-inf past FLT_MAX. */
static float mx_value(int v, int e)
{
    const double x = ldexp((double)v, e - 128);
    return fabs(x) > FLT_MAX ? (x > 0 ? INFINITY : -INFINITY) : (float)x;
}

/* (7) mxfp4 dequantization: every E8M0 byte e = 0..255 (2^-128 and 2^-127
 * are subnormal; e = 255 is 2^127 as in ggml) with every code in both
 * nibbles, against mx_value, bitwise, for the reference and the dispatched
 * to_float; one-block rows at the end of exact-size buffers (ASan). */
static void test_mxfp4_decode(const char *isa)
{
    const int64_t nb = 256, n = nb * QK_MXFP4;
    block_mxfp4 *b = malloc((size_t)nb * sizeof *b);
    float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4), *ref = malloc((size_t)n * 4);
    int infs = 0;
    for (int e = 0; e < nb; e++) {
        b[e].e = (uint8_t)e;
        for (int j = 0; j < 16; j++) {
            const int lo = (j + e) % 16, hi = (15 - j + 3 * e) % 16;
            b[e].qs[j] = (uint8_t)(lo | hi << 4);
            want[e * 32 + j] = mx_value(k_mx_vals[lo], e);
            want[e * 32 + 16 + j] = mx_value(k_mx_vals[hi], e);
            infs += !!isinf(want[e * 32 + j]) + !!isinf(want[e * 32 + 16 + j]);
        }
    }
    const dtype_traits *tr = dtype_get(DT_MXFP4);
    tr->to_float_ref(b, ref, n);
    tr->to_float(b, got, n);
    CHECKF(memcmp(ref, want, (size_t)n * 4) == 0, "mxfp4 to_float_ref: every exponent and code");
    CHECKF(memcmp(got, want, (size_t)n * 4) == 0, "%s mxfp4 to_float: every exponent and code", isa);
    CHECK(infs > 0 && want[32 * 0 + 0] == 0.0f); /* e 253..255 overflow some codes */
    for (int e = 0; e < nb; e += 51) { /* one block alone, nothing after it */
        block_mxfp4 *one = malloc(sizeof *one);
        memcpy(one, &b[e], sizeof *one);
        tr->to_float(one, got, QK_MXFP4);
        CHECKF(memcmp(got, want + e * 32, QK_MXFP4 * 4) == 0, "%s mxfp4 one block e=%d", isa, e);
        free(one);
    }
    free(b), free(want), free(got), free(ref);
}

/* (8) the mxfp4 reference quantizer on hand-checked blocks (ggml's rule,
 * quant_ref.c): e = floor(log2 amax) - 2 + 127, nearest code, the lower
 * code (the smaller magnitude) on ties, clipping at 12 d, e = 0 for zero
 * and tiny blocks. */
static void test_mxfp4_encode(void)
{
    float x[7 * 32] = {0};
    /* block 0: amax 6 -> e 127, d 0.5; x and the expected code */
    static const float x0[] = {6.0f, 5.0f, -5.0f, 0.25f, -0.25f, 0.75f, 2.5f, 3.9f,
                               -6.0f, -0.0f, 0.26f, 1.25f, -1.3f, 2.75f};
    static const int c0[] = {7, 6, 14, 0, 0, 1, 4, 6, 15, 0, 1, 2, 11, 5};
    memcpy(x, x0, sizeof x0);
    x[16] = 1.0f;   /* high nibble of qs[0]: code 2 */
    x[31] = -3.0f;  /* high nibble of qs[15]: code 13 */
    x[32] = 7.9f, x[33] = 0.1f;                    /* block 1: e 127, 7.9 clipped to 6 */
    x[64] = 8.0f, x[65] = -7.0f;                   /* block 2: e 128, d 1; -7: tie -> -6 */
    /* block 3: all zero */
    x[128] = 1e-40f;                               /* block 4: subnormal amax -> e 0 */
    x[160] = 3e38f, x[161] = -3e38f;               /* block 5: e 252, |x|/d 14.1 -> 12 */
    x[192] = 0x1p-124f, x[193] = -0x1p-127f;       /* block 6: e 1, d 2^-127 */
    static const uint8_t want_e[7] = {127, 127, 128, 0, 0, 252, 1};
    block_mxfp4 b[7];
    dtype_get(DT_MXFP4)->from_float(x, b, 7 * 32);
    for (int i = 0; i < 7; i++)
        CHECKF(b[i].e == want_e[i], "mxfp4 block %d: e %u, want %u", i, b[i].e, want_e[i]);
    int ok = 1;
    for (int j = 0; j < 14; j++)
        ok &= (b[0].qs[j] & 0xF) == c0[j];
    CHECK(ok && (b[0].qs[0] >> 4) == 2 && (b[0].qs[15] >> 4) == 13 && (b[0].qs[14] & 0xF) == 0);
    CHECK(b[1].qs[0] == 7 && b[1].qs[1] == 0);
    CHECK(b[2].qs[0] == (6 | 0 << 4) && b[2].qs[1] == 13);
    uint8_t zero[16] = {0};
    CHECK(!memcmp(b[3].qs, zero, 16) && !memcmp(b[4].qs, zero, 16));
    CHECK(b[5].qs[0] == 7 && b[5].qs[1] == 15);
    CHECK(b[6].qs[0] == 6 && b[6].qs[1] == 9);
    /* and back: block 0's values are exactly representable, block 5 clips */
    float y[7 * 32];
    dtype_get(DT_MXFP4)->to_float_ref(b, y, 7 * 32);
    CHECK(y[0] == 6.0f && y[1] == 4.0f && y[2] == -4.0f && y[16] == 1.0f && y[31] == -3.0f);
    CHECK(y[32] == 6.0f && y[65] == -6.0f && y[160] == 0x1.8p127f && y[193] == -0x1p-127f);
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
        if (k_types[i] == DT_MXFP4)
            continue; /* not in gguf 0.17's quants: test_mxfp4_* and tests/py instead */
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
    test_mxfp4_encode();
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
        test_mxfp4_decode(name);
    }
    CHECK(dtype_isa_supported(KERNEL_ISA_SCALAR) && !dtype_isa_supported(KERNEL_ISA_COUNT));
    CHECK(dtype_force_isa(KERNEL_ISA_COUNT) == -1);
    CHECK(dtype_force_isa(best) == 0);
    bench(&r);
    return tu_finish("test_dtype");
}
