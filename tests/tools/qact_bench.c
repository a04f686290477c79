/* qact_bench.c - the int8 matmul's speed on one thread, alone (not a unit
 * test: scripts/run-unit.sh runs only test_*).
 *
 *   qact_bench [--type T] [--n N] [--rows R] [--tokens K] [--seconds S] [--head]
 *       R random rows of N values quantized to T (default q4_0, 2048 x 64:
 *       one MoE expert's slice that stays in L2) times K tokens (default 4,
 *       the packed kernels' widest tile), through dtype_matmul_rows_q on the
 *       selected ISA (KVANT_ISA applies), packed at load as the CPU backend
 *       does when the type packs.  Prints the multiply-accumulates per second
 *       (best of 5 runs of about S/5 seconds each, default 2 s in all) and
 *       checks the outputs bitwise against the stored rows' path, which the
 *       matmul's contract makes equal.  On x86-64 with AVX2 it also times
 *       the AVX2 q4_0 four-token kernel's integer loop alone (nibbles
 *       unpacked, VPMADDUBSW and int16 sums for four tokens, no scaling, no
 *       stores; L1-resident): the most multiply-accumulates a second the
 *       kernels' instruction mix reaches on this core, the bound the matmul
 *       is compared with ("ceiling").
 * --head times the output head's path instead (dtype_matmul_rows_split:
 * one int16 term a token for q8_0, two int8 terms for the other types).
 * Exit 0 when the outputs agreed.  `--json` prints one JSON object.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/blocks.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "kernels/qpack.h"
#include "testutil.h"

static double qb_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

#if defined(__x86_64__)
#include <immintrin.h>
#define QB_HAVE_CEILING 1

/* The four-token q4_0 integer loop (qpack_avx2.c's pk_q4_0_x4 without its
 * scaling): reps passes over a 512-value group pair, 16 code vectors of 64
 * values, each against four tokens.  Returns a value the caller prints so
 * the loop is not removed. */
__attribute__((target("avx2"), noinline)) static int qb_ceiling_loop(const uint8_t *wq,
                                                                     const int8_t *act,
                                                                     long reps)
{
    const __m256i m = _mm256_set1_epi8(0x0F);
    __m256i tot = _mm256_setzero_si256();
    for (long r = 0; r < reps; r++) {
        __m256i s[4] = {tot, tot, tot, tot};
#pragma GCC unroll 1
        for (int i = 0; i < 16; i++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(wq + 32 * i));
            const __m256i lo = _mm256_and_si256(v, m);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m);
#pragma GCC unroll 4
            for (int k = 0; k < 4; k++) {
                const int8_t *a = act + 1024 * k + 64 * i;
                s[k] = _mm256_add_epi16(
                    s[k], _mm256_add_epi16(
                              _mm256_maddubs_epi16(lo, _mm256_loadu_si256((const __m256i *)a)),
                              _mm256_maddubs_epi16(hi, _mm256_loadu_si256((const __m256i *)(a + 32)))));
            }
        }
        tot = _mm256_xor_si256(_mm256_xor_si256(s[0], s[1]), _mm256_xor_si256(s[2], s[3]));
    }
    return _mm256_extract_epi32(tot, 0);
}

/* GMAC/s of qb_ceiling_loop on one thread (best of 5), 0 without AVX2. */
static double qb_ceiling(double seconds, volatile int *sink)
{
    if (!__builtin_cpu_supports("avx2"))
        return 0;
    _Alignas(64) static const uint8_t wq[512] = {0x5a, 0x3c};
    _Alignas(64) static int8_t act[4096];
    for (int i = 0; i < 4096; i++)
        act[i] = (int8_t)(i * 37 % 255 - 127);
    double best = 1e30;
    for (int run = 0; run < 5; run++) {
        const double t0 = qb_now();
        long reps = 0;
        do {
            *sink ^= qb_ceiling_loop(wq, act, 10000);
            reps += 10000;
        } while (qb_now() - t0 < seconds / 5);
        const double per = (qb_now() - t0) / (double)reps;
        if (per < best)
            best = per;
    }
    return 16.0 * 64 * 4 / best * 1e-9; /* 16 vectors x 64 codes x 4 tokens a pass */
}
#else
#define QB_HAVE_CEILING 0
#endif

typedef struct qb_opts {
    const char *type;
    int64_t n, rows, tokens;
    double seconds;
    int json, head;
} qb_opts;

static int qb_parse(int argc, char **argv, qb_opts *o)
{
    *o = (qb_opts){"q4_0", 2048, 64, 4, 2.0, 0, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json") || !strcmp(a, "--head")) {
            *(a[2] == 'j' ? &o->json : &o->head) = 1;
            continue;
        }
        if (!v) {
            fprintf(stderr, "qact_bench: %s needs a value\n", a);
            return -1;
        }
        i++;
        if (!strcmp(a, "--type"))
            o->type = v;
        else if (!strcmp(a, "--n"))
            o->n = atoll(v);
        else if (!strcmp(a, "--rows"))
            o->rows = atoll(v);
        else if (!strcmp(a, "--tokens"))
            o->tokens = atoll(v);
        else if (!strcmp(a, "--seconds"))
            o->seconds = atof(v);
        else {
            fprintf(stderr, "qact_bench: unknown option %s\n", a);
            return -1;
        }
    }
    if (o->n < 32 || o->n % 32 || o->rows < 1 || o->tokens < 1 || o->tokens > 1024 ||
        o->seconds <= 0) {
        fprintf(stderr, "qact_bench: need --n a multiple of 32, --rows >= 1, "
                        "--tokens 1..1024, --seconds > 0\n");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    qb_opts o;
    if (qb_parse(argc, argv, &o))
        return 2;
    dtype_init();
    const int t = dtype_from_name(o.type);
    if (t < 0 || !dtype_matmul_uses_qact((uint32_t)t)) {
        fprintf(stderr, "qact_bench: %s has no int8 path\n", o.type);
        return 2;
    }
    const size_t rb = dtype_row_size((uint32_t)t, o.n);
    if (!rb) {
        fprintf(stderr, "qact_bench: --n %lld is not a whole number of %s blocks\n", (long long)o.n,
                o.type);
        return 2;
    }
    const int packs = dtype_matmul_packs((uint32_t)t, o.n);
    const uint32_t tp = (uint32_t)t | (packs ? DT_PACKED : 0u);
    float *x = malloc(sizeof(float) * (size_t)(o.n * o.tokens));
    float *row = malloc(sizeof(float) * (size_t)o.n);
    uint8_t *w = malloc(rb * (size_t)o.rows), *wp = malloc(rb * (size_t)o.rows);
    const int64_t terms = o.head ? 2 : 1;
    void *xq = malloc(dtype_matmul_scratch_bytes(tp, o.n, terms * o.tokens));
    void *xq0 = malloc(dtype_matmul_scratch_bytes((uint32_t)t, o.n, terms * o.tokens));
    float *y = malloc(sizeof(float) * (size_t)(o.rows * o.tokens));
    float *y0 = malloc(sizeof(float) * (size_t)(o.rows * o.tokens));
    if (!x || !row || !w || !wp || !xq || !xq0 || !y || !y0) {
        fprintf(stderr, "qact_bench: out of memory\n");
        return 2;
    }
    tu_rng rng = {0x5eed1234ULL};
    for (int64_t r = 0; r < o.rows; r++) {
        for (int64_t i = 0; i < o.n; i++)
            row[i] = tu_rand_normal(&rng);
        dtype_get((uint32_t)t)->from_float(row, w + (size_t)r * rb, o.n);
    }
    for (int64_t i = 0; i < o.n * o.tokens; i++)
        x[i] = tu_rand_normal(&rng);
    memcpy(wp, w, rb * (size_t)o.rows);
    if (packs)
        qpack_rows((uint32_t)t, wp, wp, o.n, o.rows, rb);

    /* the stored rows' path, once: the packed path must equal it bitwise */
    void (*quant)(uint32_t, const float *, int64_t, int64_t, void *) =
        o.head ? dtype_matmul_quantize_split : dtype_matmul_quantize;
    void (*mm)(uint32_t, const void *, size_t, int64_t, int64_t, int64_t, const float *,
               const void *, int64_t, float *, int64_t) =
        o.head ? dtype_matmul_rows_split : dtype_matmul_rows_q;
    quant((uint32_t)t, x, o.n, o.tokens, xq0);
    mm((uint32_t)t, w, rb, 0, o.rows, o.n, x, xq0, o.tokens, y0, o.rows);

    quant(tp, x, o.n, o.tokens, xq);
    double best = 1e30;
    long calls = 0;
    for (int run = 0; run < 5; run++) {
        const double t0 = qb_now();
        long c = 0;
        do {
            mm(tp, wp, rb, 0, o.rows, o.n, x, xq, o.tokens, y, o.rows);
            c++;
        } while (qb_now() - t0 < o.seconds / 5);
        const double per = (qb_now() - t0) / (double)c;
        if (per < best)
            best = per;
        calls += c;
    }
    volatile int sink = 0;
    const double ceil = QB_HAVE_CEILING ? qb_ceiling(o.seconds, &sink) : 0;
    const int same = !memcmp(y, y0, sizeof(float) * (size_t)(o.rows * o.tokens));
    const double gmacs = (double)o.n * (double)o.rows * (double)o.tokens / best * 1e-9;
    if (o.json)
        printf("{\"isa\": \"%s\", \"type\": \"%s\", \"packed\": %d, \"n\": %lld, \"rows\": %lld, "
               "\"tokens\": %lld, \"us_per_call\": %.3f, \"gmac_per_s\": %.3f, \"calls\": %ld, "
               "\"bitwise_equal\": %d, \"ceiling_gmac_per_s\": %.3f, \"head\": %d}\n",
               dtype_isa(), o.type, packs, (long long)o.n, (long long)o.rows, (long long)o.tokens,
               best * 1e6, gmacs, calls, same, ceil, o.head);
    else {
        printf("qact_bench: %s %s%s%s %lld x %lld, %lld tokens: %.2f us a call, %.2f GMAC/s "
               "(1 thread), outputs %s\n",
               dtype_isa(), o.type, packs ? " packed" : "", o.head ? " head" : "", (long long)o.rows, (long long)o.n,
               (long long)o.tokens, best * 1e6, gmacs,
               same ? "bitwise equal to the stored rows' path" : "DIFFER from the stored rows' path");
        if (ceil > 0)
            printf("qact_bench: ceiling (AVX2 q4_0 four-token integer loop alone): %.2f GMAC/s; "
                   "the matmul is %.0f%% of it\n", ceil, 100 * gmacs / ceil);
    }
    free(x), free(row), free(w), free(wp), free(xq), free(xq0), free(y), free(y0);
    return same ? 0 : 1;
}
