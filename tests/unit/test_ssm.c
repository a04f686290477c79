/* test_ssm.c - the Mamba-2 scan (kernels/ssm.h): the reference agrees with
 * a plain double-precision recurrence within 1e-5 of the terms' magnitude
 * over several tokens on one state; the scan of every ISA this CPU has is
 * bitwise equal to the reference (states and outputs) for N in {1, 7, 16,
 * 17, 64, 128, 129} x P in {1, 3, 64} (and 4, 5: a group of four rows with
 * and without one left over), unaligned, and writes nothing past its
 * state and outputs; a hand-computed case fixes the order of the sum (each
 * other order tried here gives another float); a short last block leaves
 * the other lanes alone, down to a zero's sign; softplus as llama.cpp.
 * Prints each ISA's time per head-token on P = 64, N = 128 (never
 * asserted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/ssm.h"
#include "testutil.h"

static const int32_t k_n[] = {1, 7, 16, 17, 64, 128, 129};
static const int32_t k_p[] = {1, 3, 4, 5, 64};
#define N_N ((int)(sizeof k_n / sizeof k_n[0]))
#define N_P ((int)(sizeof k_p / sizeof k_p[0]))
#define TOKENS 6
#define GUARD 16 /* floats after each output buffer that must stay untouched */
#define CANARY 12345.678f

static void fill_normal(tu_rng *r, float *v, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = tu_rand_normal(r) * scale;
}

/* One token's inputs for a head: x [P], B, C [N], dA in (0, 1), dt > 0. */
typedef struct token_in {
    float *x, *B, *C;
    float dA, dt;
} token_in;

static void token_draw(tu_rng *r, token_in *t, int32_t P, int32_t N)
{
    fill_normal(r, t->x, P, 1.0f);
    fill_normal(r, t->B, N, 1.0f);
    fill_normal(r, t->C, N, 1.0f);
    t->dt = ssm_softplus(tu_rand_uniform(r, -3.0f, 1.0f));
    t->dA = expf(t->dt * -tu_rand_uniform(r, 0.05f, 2.0f)); /* exp(dt * A), A < 0 */
}

/* The reference against the recurrence in double; m holds each state
 * element's magnitude (the same recurrence on absolute values), the scale
 * the error is measured against. */
static void test_reference(void)
{
    tu_rng r = {0x5353};
    for (int in = 0; in < N_N; in++) {
        for (int ip = 0; ip < N_P; ip++) {
            const int32_t N = k_n[in], P = k_p[ip];
            const size_t ns = (size_t)P * N;
            float *s = malloc(ns * sizeof *s), *y = malloc(P * sizeof *y);
            double *sd = malloc(ns * sizeof *sd), *m = malloc(ns * sizeof *m);
            token_in t = {malloc(P * sizeof(float)), malloc(N * sizeof(float)),
                          malloc(N * sizeof(float)), 0, 0};
            fill_normal(&r, s, (int64_t)ns, 1.0f);
            for (size_t i = 0; i < ns; i++)
                sd[i] = s[i], m[i] = fabs(s[i]);
            double worst_s = 0, worst_y = 0;
            for (int tok = 0; tok < TOKENS; tok++) {
                token_draw(&r, &t, P, N);
                ssm_scan_ref(s, t.x, t.B, t.C, t.dA, t.dt, P, N, y);
                for (int32_t p = 0; p < P; p++) {
                    double yd = 0, ym = 0;
                    for (int32_t n = 0; n < N; n++) {
                        const size_t i = (size_t)p * N + n;
                        const double bx = (double)t.B[n] * t.x[p] * t.dt;
                        sd[i] = sd[i] * t.dA + bx;
                        m[i] = m[i] * t.dA + fabs(bx);
                        worst_s = fmax(worst_s, fabs(s[i] - sd[i]) / m[i]);
                        yd += sd[i] * t.C[n];
                        ym += m[i] * fabs(t.C[n]);
                    }
                    worst_y = fmax(worst_y, fabs(y[p] - yd) / ym);
                }
            }
            CHECKF(worst_s <= 1e-5 && worst_y <= 1e-5,
                   "N %d P %d: state error %.3g, output error %.3g of the terms' magnitude", N, P,
                   worst_s, worst_y);
            free(s), free(y), free(sd), free(m), free(t.x), free(t.B), free(t.C);
        }
    }
}

/* One shape on one ISA: several tokens on the same state, each step
 * compared bitwise with the reference.  Every buffer starts one float past
 * an aligned allocation (unaligned loads), and the outputs are followed by
 * GUARD canaries. */
static int compare_shape(tu_rng *r, ssm_scan_fn fn, int32_t P, int32_t N)
{
    const size_t ns = (size_t)P * N;
    const size_t sbytes = (ns + 1 + GUARD) * sizeof(float);
    const size_t ybytes = (P + 1 + GUARD) * sizeof(float);
    float *sa = malloc(sbytes), *sb = malloc(sbytes), *ya = malloc(ybytes), *yb = malloc(ybytes);
    float *xin = malloc((P + 1) * sizeof(float)), *bin = malloc((N + 1) * sizeof(float));
    float *cin = malloc((N + 1) * sizeof(float));
    token_in t = {xin + 1, bin + 1, cin + 1, 0, 0};
    fill_normal(r, sa + 1, (int64_t)ns, 1.0f);
    memcpy(sb + 1, sa + 1, ns * sizeof(float));
    for (int g = 0; g < GUARD; g++)
        sb[1 + ns + g] = yb[1 + P + g] = CANARY;
    int same = 1, guards = 1;
    for (int tok = 0; tok < TOKENS; tok++) {
        token_draw(r, &t, P, N);
        ssm_scan_ref(sa + 1, t.x, t.B, t.C, t.dA, t.dt, P, N, ya + 1);
        fn(sb + 1, t.x, t.B, t.C, t.dA, t.dt, P, N, yb + 1);
        same &= !memcmp(sa + 1, sb + 1, ns * sizeof(float)) &&
                !memcmp(ya + 1, yb + 1, P * sizeof(float));
    }
    for (int g = 0; g < GUARD; g++)
        guards &= sb[1 + ns + g] == CANARY && yb[1 + P + g] == CANARY;
    free(sa), free(sb), free(ya), free(yb), free(xin), free(bin), free(cin);
    return same ? (guards ? 0 : 2) : 1;
}

static void test_isas(void)
{
    tu_rng r = {0x1551};
    CHECK(ssm_scan_for(KERNEL_ISA_SCALAR) == ssm_scan_ref);
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa)) {
            fprintf(stderr, "test_ssm: CPU lacks %s: its scan not compared\n",
                    dtype_isa_name((kernel_isa)isa));
            continue;
        }
        const ssm_scan_fn fn = ssm_scan_for((kernel_isa)isa);
        for (int in = 0; in < N_N; in++)
            for (int ip = 0; ip < N_P; ip++) {
                const int rc = compare_shape(&r, fn, k_p[ip], k_n[in]);
                CHECKF(rc == 0, "%s N %d P %d: %s", dtype_isa_name((kernel_isa)isa), k_n[in],
                       k_p[ip],
                       rc == 1 ? "not bitwise equal to the reference" : "wrote past its buffers");
            }
    }
}

/* ---- the order of the sum ---- */

/* 16 lane sums reduced by halving strides in the order given (the
 * specification is 8, 4, 2, 1). */
static float tree(const float acc[16], const int order[4])
{
    float v[16];
    memcpy(v, acc, sizeof v);
    for (int k = 0; k < 4; k++)
        for (int j = 0; j < 16; j++)
            if (!(j & order[k]))
                v[j] = v[j] + v[j + order[k]];
    return v[0];
}

/* The stride orders other than the specification's (all 23 permutations). */
static int next_perm(int a[4])
{
    int i = 2;
    while (i >= 0 && a[i] >= a[i + 1])
        i--;
    if (i < 0)
        return 0;
    int j = 3;
    while (a[j] <= a[i])
        j--;
    int t = a[i];
    a[i] = a[j], a[j] = t;
    for (int lo = i + 1, hi = 3; lo < hi; lo++, hi--)
        t = a[lo], a[lo] = a[hi], a[hi] = t;
    return 1;
}

/* N = 33, state 0, x = dt = 1, C = 1: the new state is B and y the sum of
 * B in the specified order, all but the roundings exact.  Non-zero B: B12 =
 * 2, B17 = 1, B18 = 1, B20 = 1, B28 = 2^25, B30 = -2^25, B32 = 2 (the
 * tail, lane 0).  Lane sums: acc0 = 2, acc1 = acc2 = acc4 = 1, acc12 = 2 +
 * 2^25 = 2^25 (a tie, to even), acc14 = -2^25.  j + j+8: r0 = 2, r1 = r2 =
 * 1, r4 = 1 + 2^25 = 2^25, r6 = -2^25.  j + j+4: r0 = 2 + 2^25 = 2^25, r1 =
 * 1, r2 = 1 - 2^25 = -2^25 (a tie, to even).  j + j+2: r0 = 0, r1 = 1.
 * y = 1.  A sequential sum gives 6, the tail added after the tree 3, 8
 * lanes 9, every other order of the strides something else again. */
static void test_order(void)
{
    enum { N = 33, P = 5 };
    const float two25 = 33554432.0f;
    float B[N] = {0}, C[N], s[P * N], x[P], y[P], acc[16] = {0};
    B[12] = 2, B[17] = 1, B[18] = 1, B[20] = 1, B[28] = two25, B[30] = -two25, B[32] = 2;
    for (int n = 0; n < N; n++)
        C[n] = 1.0f, acc[n % 16] += B[n];
    for (int p = 0; p < P; p++)
        x[p] = 1.0f;
    /* the case discriminates: each other order gives another float */
    int order[4] = {1, 2, 4, 8}, others = 0, differ = 0;
    do {
        if (order[0] == 8 && order[1] == 4 && order[2] == 2)
            continue;
        others++;
        differ += tree(acc, order) != 1.0f;
    } while (next_perm(order));
    CHECKF(others == 23 && differ == 23, "%d of %d other trees give another float", differ,
           others);
    float seq = 0, lanes8[16] = {0}, lanes32[16] = {0};
    for (int n = 0; n < N; n++)
        seq += B[n], lanes8[n % 8] += B[n];
    for (int n = 0; n < 32; n++)
        lanes32[n % 16] += B[n];
    const int spec[4] = {8, 4, 2, 1};
    float v8[8];
    memcpy(v8, lanes8, sizeof v8);
    for (int h = 4; h >= 1; h /= 2)
        for (int j = 0; j < h; j++)
            v8[j] = v8[j] + v8[j + h];
    CHECKF(seq != 1.0f && tree(lanes32, spec) + B[32] != 1.0f && v8[0] != 1.0f,
           "sequential %g, tail last %g, 8 lanes %g", seq, tree(lanes32, spec) + B[32], v8[0]);
    CHECK(tree(acc, spec) == 1.0f);
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        memset(s, 0, sizeof s);
        ssm_scan_for((kernel_isa)isa)(s, x, B, C, 0.5f, 1.0f, P, N, y);
        for (int p = 0; p < P; p++)
            CHECKF(y[p] == 1.0f && !memcmp(s + p * N, B, sizeof B), "%s row %d: y %.9g",
                   dtype_isa_name((kernel_isa)isa), p, y[p]);
    }
}

/* A block short of 16 leaves the other lanes' sums as they are, down to
 * the sign of a zero: B = 0 and each product s * C a negative number too
 * small for a float, so after a whole block every lane's sum is -0, and
 * with N > 16 y = -0 (adding 0 * 0 to a lane the short block does not
 * reach would make it +0, and y +0). */
static void test_signed_zero(void)
{
    enum { P = 5, NMAX = 47 };
    static const int32_t ns[] = {17, 23, 31, 33, 47};
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
            const int32_t N = ns[k];
            float s[P * NMAX], x[P], B[NMAX] = {0}, C[NMAX], y[P];
            for (int32_t i = 0; i < P * N; i++)
                s[i] = 1e-30f * (float)(1 + i % 5);
            for (int32_t n = 0; n < N; n++)
                C[n] = -1e-30f;
            for (int p = 0; p < P; p++)
                x[p] = 1.0f + (float)p, y[p] = 1.0f;
            ssm_scan_for((kernel_isa)isa)(s, x, B, C, 0.5f, 1.0f, P, N, y);
            int neg0 = 1;
            for (int p = 0; p < P; p++)
                neg0 &= y[p] == 0.0f && signbit(y[p]);
            CHECKF(neg0, "%s N %d: y %g, not -0", dtype_isa_name((kernel_isa)isa), N, y[0]);
        }
    }
}

static void test_softplus(void)
{
    CHECK(ssm_softplus(25.0f) == 25.0f && ssm_softplus(20.5f) == 20.5f);
    CHECK(ssm_softplus(20.0f) == log1pf(expf(20.0f)));
    CHECK(fabsf(ssm_softplus(0.0f) - 0.69314718f) < 1e-7f);
    CHECK(ssm_softplus(-30.0f) > 0.0f && ssm_softplus(-30.0f) < 1e-12f);
}

/* ---- timing (printed, never asserted) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 48 heads of P = 64, N = 128 (one group's B, C) x 1000 tokens. */
static void bench(void)
{
    enum { HEADS = 48, P = 64, N = 128, TOK = 1000 };
    tu_rng r = {0xBE7C};
    float *s = malloc((size_t)HEADS * P * N * sizeof *s), *x = malloc(HEADS * P * sizeof *x);
    float *y = malloc(HEADS * P * sizeof *y), B[N], C[N], dA[HEADS];
    fill_normal(&r, s, (int64_t)HEADS * P * N, 1.0f);
    fill_normal(&r, x, HEADS * P, 1.0f);
    fill_normal(&r, B, N, 1.0f);
    fill_normal(&r, C, N, 1.0f);
    for (int h = 0; h < HEADS; h++)
        dA[h] = tu_rand_uniform(&r, 0.5f, 0.99f);
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        const ssm_scan_fn fn = ssm_scan_for((kernel_isa)isa);
        volatile float sink = 0;
        double t0 = 0;
        for (int tok = -20; tok < TOK; tok++) { /* 20 tokens' warm-up */
            if (tok == 0)
                t0 = now_s();
            for (int h = 0; h < HEADS; h++)
                fn(s + (size_t)h * P * N, x + h * P, B, C, dA[h], 0.1f, P, N, y + h * P);
            sink += y[0];
        }
        const double ns = (now_s() - t0) * 1e9 / ((double)HEADS * TOK);
        (void)sink;
        fprintf(stderr,
                "    ssm scan %-6s %8.1f ns per head-token (P %d, N %d, %d heads x %d tokens;"
                " state %.1f GB/s read + written)\n",
                dtype_isa_name((kernel_isa)isa), ns, P, N, HEADS, TOK,
                2.0 * P * N * sizeof(float) / ns);
    }
    free(s), free(x), free(y);
}

int main(void)
{
    dtype_init();
    test_softplus();
    test_reference();
    test_isas();
    test_order();
    test_signed_zero();
    bench();
    return tu_finish("test_ssm");
}
