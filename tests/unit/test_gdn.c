/* test_gdn.c - the Gated DeltaNet step (kernels/gdn.h): the reference
 * agrees with the same maths in double within 1e-5 of the terms' magnitude
 * (state, delta and outputs) over several tokens on one state; the step of
 * every ISA this CPU has is bitwise equal to the reference (state, delta
 * and outputs) for dk = dv in {1, 7, 16, 17, 64, 128, 129} and dv != dk
 * (2 x 16, 3 x 64, 4 x 33, 5 x 128, 8 x 129, 9 x 7, 64 x 17: pairs and
 * groups of four rows with and without some left over), several tokens in
 * a row on one state, unaligned, and writes nothing before or past its
 * state, delta and outputs; a hand-computed case fixes the order of both
 * sums (each other order tried here gives another float); a short last
 * block leaves the other lanes alone, down to a zero's sign.  Prints each
 * ISA's time per head-token on dv = dk = 128 (never asserted). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/gdn.h"
#include "testutil.h"

/* {dv, dk} */
static const int32_t k_shapes[][2] = {{1, 1},   {7, 7},  {16, 16}, {17, 17},  {64, 64},
                                      {128, 128}, {129, 129}, {3, 64}, {4, 33}, {5, 128},
                                      {9, 7},   {64, 17}, {2, 16}, {8, 129}};
#define N_SHAPES ((int)(sizeof k_shapes / sizeof k_shapes[0]))
#define TOKENS 6
#define GUARD 16 /* floats after each output buffer that must stay untouched */
#define CANARY 12345.678f

static void fill_normal(tu_rng *r, float *v, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = tu_rand_normal(r) * scale;
}

/* A random unit vector (q and k come L2-normed). */
static void fill_unit(tu_rng *r, float *v, int32_t n)
{
    fill_normal(r, v, n, 1.0f);
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++)
        ss += v[i] * v[i];
    const float s = 1.0f / sqrtf(ss);
    for (int32_t i = 0; i < n; i++)
        v[i] *= s;
}

/* One token's inputs for a head: q, k [dk] unit, v [dv], decay in (0, 1),
 * beta in (0, 1). */
typedef struct token_in {
    float *q, *k, *v;
    float decay, beta, scale;
} token_in;

static void token_draw(tu_rng *r, token_in *t, int32_t dv, int32_t dk)
{
    fill_unit(r, t->q, dk);
    fill_unit(r, t->k, dk);
    fill_normal(r, t->v, dv, 1.0f);
    t->decay = tu_rand_uniform(r, 0.05f, 0.999f);
    t->beta = tu_rand_uniform(r, 0.05f, 0.95f);
    t->scale = 1.0f / sqrtf((float)dk);
}

/* The same maths in double for one token; md holds each state element's
 * magnitude (the same recurrence on absolute values), the scale the error
 * is measured against; worst[0..2] the state's, delta's and outputs'
 * largest error so far as a fraction of their terms' magnitude. */
static void step_double(double *Md, double *md, const float *M, const float *delta,
                        const float *o, int32_t dv, int32_t dk, const token_in *t, double worst[3])
{
    for (int32_t j = 0; j < dv; j++) {
        double *row = Md + (int64_t)j * dk, *mag = md + (int64_t)j * dk;
        double s = 0, sm = 0;
        for (int32_t i = 0; i < dk; i++) {
            row[i] *= t->decay, mag[i] *= t->decay;
            s += row[i] * t->k[i], sm += mag[i] * fabs(t->k[i]);
        }
        const double d = (t->v[j] - s) * t->beta, dm = (fabs(t->v[j]) + sm) * t->beta;
        worst[1] = fmax(worst[1], fabs(delta[j] - d) / dm);
        double y = 0, ym = 0;
        for (int32_t i = 0; i < dk; i++) {
            row[i] += d * t->k[i], mag[i] += dm * fabs(t->k[i]);
            worst[0] = fmax(worst[0], fabs(M[(int64_t)j * dk + i] - row[i]) / mag[i]);
            y += row[i] * t->q[i], ym += mag[i] * fabs(t->q[i]);
        }
        worst[2] = fmax(worst[2], fabs(o[j] - y * t->scale) / (ym * t->scale));
    }
}

static void token_alloc(token_in *t, int32_t dv, int32_t dk, int pad)
{
    t->q = (float *)malloc((size_t)(dk + pad) * sizeof(float)) + pad;
    t->k = (float *)malloc((size_t)(dk + pad) * sizeof(float)) + pad;
    t->v = (float *)malloc((size_t)(dv + pad) * sizeof(float)) + pad;
}

static void token_free(token_in *t, int pad)
{
    free(t->q - pad), free(t->k - pad), free(t->v - pad);
}

static void test_reference(void)
{
    tu_rng r = {0x6D17};
    for (int is = 0; is < N_SHAPES; is++) {
        const int32_t dv = k_shapes[is][0], dk = k_shapes[is][1];
        const size_t ns = (size_t)dv * dk;
        float *M = malloc(ns * sizeof *M), *delta = malloc(dv * sizeof *delta);
        float *o = malloc(dv * sizeof *o);
        double *Md = malloc(ns * sizeof *Md), *md = malloc(ns * sizeof *md);
        token_in t;
        token_alloc(&t, dv, dk, 0);
        fill_normal(&r, M, (int64_t)ns, 0.5f);
        for (size_t i = 0; i < ns; i++)
            Md[i] = M[i], md[i] = fabs(M[i]);
        double worst[3] = {0, 0, 0};
        for (int tok = 0; tok < TOKENS; tok++) {
            token_draw(&r, &t, dv, dk);
            gdn_step_ref(M, dv, dk, t.q, t.k, t.v, t.decay, t.beta, t.scale, delta, o);
            step_double(Md, md, M, delta, o, dv, dk, &t, worst);
        }
        CHECKF(worst[0] <= 1e-5 && worst[1] <= 1e-5 && worst[2] <= 1e-5,
               "dv %d dk %d: state error %.3g, delta %.3g, output %.3g of the terms' magnitude",
               dv, dk, worst[0], worst[1], worst[2]);
        free(M), free(delta), free(o), free(Md), free(md);
        token_free(&t, 0);
    }
}

/* A buffer of n floats starting one float past an aligned allocation,
 * with a canary before it and GUARD after. */
static float *guarded(size_t n)
{
    float *b = malloc((n + 1 + GUARD) * sizeof(float));
    b[0] = CANARY;
    for (int g = 0; g < GUARD; g++)
        b[1 + n + g] = CANARY;
    return b + 1;
}

static int intact(const float *p, size_t n)
{
    int ok = p[-1] == CANARY;
    for (int g = 0; g < GUARD; g++)
        ok &= p[n + g] == CANARY;
    return ok;
}

/* One shape on one ISA: several tokens on the same state, each step
 * compared bitwise with the reference.  Every buffer unaligned (one float
 * past an aligned allocation), the written ones between canaries. */
static int compare_shape(tu_rng *r, gdn_step_fn fn, int32_t dv, int32_t dk)
{
    const size_t ns = (size_t)dv * dk;
    float *Ma = guarded(ns), *Mb = guarded(ns), *da = guarded(dv), *db = guarded(dv);
    float *oa = guarded(dv), *ob = guarded(dv);
    token_in t;
    token_alloc(&t, dv, dk, 1);
    fill_normal(r, Ma, (int64_t)ns, 0.5f);
    memcpy(Mb, Ma, ns * sizeof(float));
    int same = 1;
    for (int tok = 0; tok < TOKENS; tok++) {
        token_draw(r, &t, dv, dk);
        gdn_step_ref(Ma, dv, dk, t.q, t.k, t.v, t.decay, t.beta, t.scale, da, oa);
        fn(Mb, dv, dk, t.q, t.k, t.v, t.decay, t.beta, t.scale, db, ob);
        same &= !memcmp(Ma, Mb, ns * sizeof(float)) && !memcmp(da, db, dv * sizeof(float)) &&
                !memcmp(oa, ob, dv * sizeof(float));
    }
    const int guards = intact(Mb, ns) && intact(db, dv) && intact(ob, dv);
    free(Ma - 1), free(Mb - 1), free(da - 1), free(db - 1), free(oa - 1), free(ob - 1);
    token_free(&t, 1);
    return same ? (guards ? 0 : 2) : 1;
}

static void test_isas(void)
{
    tu_rng r = {0x6D15};
    CHECK(gdn_step_for(KERNEL_ISA_SCALAR) == gdn_step_ref);
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa)) {
            fprintf(stderr, "test_gdn: CPU lacks %s: its step not compared\n",
                    dtype_isa_name((kernel_isa)isa));
            continue;
        }
        const gdn_step_fn fn = gdn_step_for((kernel_isa)isa);
        for (int is = 0; is < N_SHAPES; is++) {
            const int32_t dv = k_shapes[is][0], dk = k_shapes[is][1];
            const int rc = compare_shape(&r, fn, dv, dk);
            CHECKF(rc == 0, "%s dv %d dk %d: %s", dtype_isa_name((kernel_isa)isa), dv, dk,
                   rc == 1 ? "not bitwise equal to the reference" : "wrote outside its buffers");
        }
    }
}

/* ---- the order of the sums ---- */

/* 16 lane sums reduced by halving strides in the order given (the
 * specification is 8, 4, 2, 1). */
static float tree(const float acc[16], const int order[4])
{
    float v[16];
    memcpy(v, acc, sizeof v);
    for (int s = 0; s < 4; s++)
        for (int j = 0; j < 16; j++)
            if (!(j & order[s]))
                v[j] = v[j] + v[j + order[s]];
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

/* The row pattern P (dk = 33) whose sum in the specified order is 1, all
 * but the roundings exact (test_ssm.c works it through): P12 = 2, P17 =
 * P18 = P20 = 1, P28 = 2^25, P30 = -2^25, P32 = 2 (the tail, lane 0).  A
 * sequential sum gives 6, the tail added after the tree 3, 8 lanes 9,
 * every other order of the strides something else again. */
enum { ORDER_DK = 33 };

static void order_pattern(float p[ORDER_DK])
{
    const float two25 = 33554432.0f;
    memset(p, 0, ORDER_DK * sizeof *p);
    p[12] = 2, p[17] = 1, p[18] = 1, p[20] = 1, p[28] = two25, p[30] = -two25, p[32] = 2;
}

static void check_pattern_discriminates(const float p[ORDER_DK])
{
    float acc[16] = {0}, lanes8[8] = {0}, lanes32[16] = {0}, seq = 0;
    for (int i = 0; i < ORDER_DK; i++)
        acc[i % 16] += p[i], seq += p[i], lanes8[i % 8] += p[i];
    for (int i = 0; i < 32; i++)
        lanes32[i % 16] += p[i];
    int order[4] = {1, 2, 4, 8}, others = 0, differ = 0;
    do {
        if (order[0] == 8 && order[1] == 4 && order[2] == 2)
            continue;
        others++;
        differ += tree(acc, order) != 1.0f;
    } while (next_perm(order));
    CHECKF(others == 23 && differ == 23, "%d of %d other trees give another float", differ,
           others);
    const int spec[4] = {8, 4, 2, 1};
    for (int h = 4; h >= 1; h /= 2)
        for (int j = 0; j < h; j++)
            lanes8[j] = lanes8[j] + lanes8[j + h];
    CHECKF(seq != 1.0f && tree(lanes32, spec) + p[32] != 1.0f && lanes8[0] != 1.0f,
           "sequential %g, tail last %g, 8 lanes %g", seq, tree(lanes32, spec) + p[32],
           lanes8[0]);
    CHECK(tree(acc, spec) == 1.0f);
}

/* Every row of M is 2 P, decay 1/2, k = q = 1, v = 1, beta 1, scale 1/4:
 * pass 1 makes each row P exactly and its sum 1 in the specified order,
 * so delta = (1 - 1) * 1 = +0, pass 2 leaves P as it is (P + 0 * 1) and
 * its sum is 1 again: o = 1/4.  Another order of pass 1's sum makes delta
 * non-zero (and the state other than P), another order of pass 2's makes
 * o other than 1/4.  dv = 5: a group of four rows and one left over. */
static void test_order(void)
{
    enum { DV = 5, DK = ORDER_DK };
    float p[DK], M[DV * DK], q[DK], k[DK], v[DV], delta[DV], o[DV];
    order_pattern(p);
    check_pattern_discriminates(p);
    for (int i = 0; i < DK; i++)
        q[i] = k[i] = 1.0f;
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        for (int j = 0; j < DV; j++) {
            v[j] = 1.0f;
            for (int i = 0; i < DK; i++)
                M[j * DK + i] = 2.0f * p[i];
        }
        gdn_step_for((kernel_isa)isa)(M, DV, DK, q, k, v, 0.5f, 1.0f, 0.25f, delta, o);
        for (int j = 0; j < DV; j++)
            CHECKF(delta[j] == 0.0f && !signbit(delta[j]) && o[j] == 0.25f &&
                       !memcmp(M + j * DK, p, sizeof p),
                   "%s row %d: delta %.9g, o %.9g", dtype_isa_name((kernel_isa)isa), j,
                   delta[j], o[j]);
    }
}

/* A block short of 16 leaves the other lanes' sums as they are, down to
 * the sign of a zero: M > 0 tiny, k = q = -1e-30, so every product m k
 * and m q is a negative number too small for a float and, after a whole
 * block, every lane's sum is -0 (adding 0 * 0 to a lane the short block
 * does not reach would make it +0).  Pass 1: s = -0 and v = -0, so delta =
 * (-0 - -0) beta = +0 (a +0 sum would give -0); pass 2 leaves M as it is
 * and o = -0 * scale = -0 (+0 from a +0 sum). */
static void test_signed_zero(void)
{
    enum { DV = 5, DKMAX = 47 };
    static const int32_t dks[] = {17, 23, 31, 33, 47};
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        for (size_t s = 0; s < sizeof dks / sizeof dks[0]; s++) {
            const int32_t dk = dks[s];
            float M[DV * DKMAX], q[DKMAX], k[DKMAX], v[DV], delta[DV], o[DV];
            for (int32_t i = 0; i < DV * dk; i++)
                M[i] = 1e-30f * (float)(1 + i % 5);
            for (int32_t i = 0; i < dk; i++)
                q[i] = k[i] = -1e-30f;
            for (int j = 0; j < DV; j++)
                v[j] = -0.0f, delta[j] = o[j] = 1.0f;
            gdn_step_for((kernel_isa)isa)(M, DV, dk, q, k, v, 0.5f, 0.5f, 0.125f, delta, o);
            int ok = 1;
            for (int j = 0; j < DV; j++)
                ok &= delta[j] == 0.0f && !signbit(delta[j]) && o[j] == 0.0f && signbit(o[j]);
            CHECKF(ok, "%s dk %d: delta %g, o %g (want +0, -0)", dtype_isa_name((kernel_isa)isa),
                   dk, delta[0], o[0]);
        }
    }
}

/* ---- timing (printed, never asserted) ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* 16 value heads of dv = dk = 128 (one layer's state, 1 MiB, 64-byte
 * aligned as the backend's state blocks; every head its own q, k, v) x
 * 1000 tokens. */
static void bench(void)
{
    enum { HEADS = 16, D = 128, TOK = 1000 };
    tu_rng r = {0xBE7D};
    float *M = aligned_alloc(64, (size_t)HEADS * D * D * sizeof *M);
    float *q = aligned_alloc(64, HEADS * D * sizeof *q);
    float *k = aligned_alloc(64, HEADS * D * sizeof *k);
    float *v = malloc(HEADS * D * sizeof *v), *o = malloc(HEADS * D * sizeof *o);
    float delta[D], decay[HEADS];
    fill_normal(&r, M, (int64_t)HEADS * D * D, 0.5f);
    for (int h = 0; h < HEADS; h++) {
        fill_unit(&r, q + h * D, D);
        fill_unit(&r, k + h * D, D);
        decay[h] = tu_rand_uniform(&r, 0.9f, 0.999f);
    }
    fill_normal(&r, v, HEADS * D, 1.0f);
    for (int isa = 0; isa < KERNEL_ISA_COUNT; isa++) {
        if (!dtype_isa_supported((kernel_isa)isa))
            continue;
        const gdn_step_fn fn = gdn_step_for((kernel_isa)isa);
        volatile float sink = 0;
        double t0 = 0;
        for (int tok = -20; tok < TOK; tok++) { /* 20 tokens' warm-up */
            if (tok == 0)
                t0 = now_s();
            for (int h = 0; h < HEADS; h++)
                fn(M + (size_t)h * D * D, D, D, q + h * D, k + h * D, v + h * D, decay[h], 0.5f,
                   0.08838835f, delta, o + h * D);
            sink += o[0];
        }
        const double ns = (now_s() - t0) * 1e9 / ((double)HEADS * TOK);
        (void)sink;
        fprintf(stderr,
                "    gdn step %-6s %8.1f ns per head-token (dv = dk = %d, %d heads x %d tokens;"
                " state %.1f GB/s read + written)\n",
                dtype_isa_name((kernel_isa)isa), ns, D, HEADS, TOK,
                2.0 * D * D * sizeof(float) / ns);
    }
    free(M), free(q), free(k), free(v), free(o);
}

int main(void)
{
    dtype_init();
    test_reference();
    test_isas();
    test_order();
    test_signed_zero();
    bench();
    return tu_finish("test_gdn");
}
