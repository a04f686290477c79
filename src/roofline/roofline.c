/* roofline.c - timing harness for the roofline probes (see roofline.h).
 *
 * Each probe runs on `threads` pthreads that meet at a barrier, run their
 * share, and meet again; the calling thread is thread 0 and times the span
 * between the barriers.  The read buffer is touched (written) once before
 * timing so every page is resident; each thread reads a disjoint slice.
 * The probes follow the kernels' ISA (dtype_kernel_isa(): AVX-512 VNNI,
 * AVX2, or scalar, where the compute probes report 0), picked into an
 * rl_kernels table once per roofline_measure, so the ceilings printed
 * beside a benchmark are those of the instructions it ran.
 */
#include "roofline/roofline.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/dtype.h"
#include "util/arch.h"

#define RL_FMA_ITERS (20 * 1000 * 1000)
#define RL_VNNI_ITERS (20 * 1000 * 1000)
#define RL_MAX_THREADS 256
#define RL_MAX_REPS 64

typedef enum rl_kind { RL_READ, RL_FMA, RL_VNNI } rl_kind;

/* One ISA's probes; fma and int8 NULL on scalar (those ceilings stay 0). */
typedef struct rl_kernels {
    uint64_t (*read_sum)(const uint64_t *p, size_t n);
    float (*fma)(int64_t iters);
    int32_t (*int8)(int64_t iters);
    double fma_flops_per_iter;
    double int8_ops_per_iter;
} rl_kernels;

static rl_kernels rl_kernels_for(kernel_isa isa)
{
    rl_kernels k = {.read_sum = roofline_read_sum_ref};
#if KVANT_X86
    if (isa == KERNEL_ISA_AVX512)
        k = (rl_kernels){roofline_read_sum_avx512, roofline_fma_avx512, roofline_vnni_avx512,
                         ROOFLINE_FMA_FLOPS_PER_ITER, ROOFLINE_VNNI_OPS_PER_ITER};
    else if (isa == KERNEL_ISA_AVX2)
        k = (rl_kernels){roofline_read_sum_avx2, roofline_fma_avx2, roofline_int8_avx2,
                         ROOFLINE_FMA2_FLOPS_PER_ITER, ROOFLINE_INT8_AVX2_OPS_PER_ITER};
#endif
    (void)isa;
    return k;
}

typedef struct rl_job {
    rl_kind kind;
    int nth;
    const rl_kernels *k;   /* borrowed, the chosen ISA's probes */
    const uint64_t *buf;   /* borrowed, [words] */
    size_t words;
    pthread_barrier_t bar;
    volatile uint64_t sink; /* keeps results alive */
} rl_job;

typedef struct rl_arg {
    rl_job *job;
    int ith;
} rl_arg;

static double rl_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

uint64_t roofline_read_sum_ref(const uint64_t *p, size_t n)
{
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

static void rl_work(rl_job *j, int ith)
{
    if (j->kind == RL_READ) {
        size_t per = j->words / (size_t)j->nth / 64 * 64;
        const uint64_t *p = j->buf + per * (size_t)ith;
        j->sink += j->k->read_sum(p, per);
    } else if (j->kind == RL_FMA) {
        j->sink += (uint64_t)j->k->fma(RL_FMA_ITERS);
    } else {
        j->sink += (uint64_t)j->k->int8(RL_VNNI_ITERS);
    }
}

static void *rl_thread(void *p)
{
    rl_arg *a = p;
    pthread_barrier_wait(&a->job->bar);
    rl_work(a->job, a->ith);
    pthread_barrier_wait(&a->job->bar);
    return NULL;
}

/* Seconds for one run of the probe on j->nth threads. */
static double rl_run_once(rl_job *j)
{
    pthread_t tid[RL_MAX_THREADS];
    rl_arg args[RL_MAX_THREADS];
    int started = 1;
    pthread_barrier_init(&j->bar, NULL, (unsigned)j->nth);
    for (int i = 1; i < j->nth; i++) {
        args[i] = (rl_arg){j, i};
        if (pthread_create(&tid[i], NULL, rl_thread, &args[i]))
            break;
        started++;
    }
    if (started != j->nth) { /* could not start them all: measure what we can */
        pthread_barrier_destroy(&j->bar);
        return -1.0;
    }
    pthread_barrier_wait(&j->bar);
    double t0 = rl_now();
    rl_work(j, 0);
    pthread_barrier_wait(&j->bar);
    double t = rl_now() - t0;
    for (int i = 1; i < j->nth; i++)
        pthread_join(tid[i], NULL);
    pthread_barrier_destroy(&j->bar);
    return t;
}

static int rl_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median rate (work units / s) over reps after one warm-up. */
static double rl_rate(rl_job *j, int reps, double work)
{
    double t[RL_MAX_REPS];
    int n = 0;
    rl_run_once(j);
    for (int r = 0; r < reps; r++) {
        double s = rl_run_once(j);
        if (s > 0)
            t[n++] = s;
    }
    if (n == 0)
        return 0.0;
    qsort(t, (size_t)n, sizeof t[0], rl_cmp);
    return work / t[n / 2];
}

int roofline_measure(int threads, size_t read_bytes, int reps, roofline_result *out)
{
    memset(out, 0, sizeof *out);
    threads = threads < 1 ? 1 : threads > RL_MAX_THREADS ? RL_MAX_THREADS : threads;
    reps = reps < 1 ? 1 : reps > RL_MAX_REPS ? RL_MAX_REPS : reps;
    if (!read_bytes)
        read_bytes = ROOFLINE_READ_BYTES_DEFAULT;
    const kernel_isa isa = dtype_kernel_isa();
    const rl_kernels k = rl_kernels_for(isa);
    out->isa = dtype_isa_name(isa);
    out->threads = threads;

    size_t words = read_bytes / sizeof(uint64_t) / 64 * 64;
    uint64_t *buf = aligned_alloc(64, words * sizeof(uint64_t));
    if (!buf)
        return -1;
    for (size_t i = 0; i < words; i++)
        buf[i] = i * 0x9E3779B97F4A7C15ull;

    rl_job j = {.kind = RL_READ, .k = &k, .buf = buf, .words = words};
    for (int pass = 0; pass < 2; pass++) {
        j.nth = pass ? threads : 1;
        double bytes = (double)(words / (size_t)j.nth / 64 * 64) * j.nth * sizeof(uint64_t);
        double gbps = rl_rate(&j, reps, bytes) * 1e-9;
        *(pass ? &out->read_gbps_nt : &out->read_gbps_1t) = gbps;
    }
    free(buf);
    if (k.fma) {
        j.kind = RL_FMA;
        for (int pass = 0; pass < 2; pass++) {
            j.nth = pass ? threads : 1;
            double w = (double)RL_FMA_ITERS * k.fma_flops_per_iter * j.nth;
            *(pass ? &out->fma_gflops_nt : &out->fma_gflops_1t) = rl_rate(&j, reps, w) * 1e-9;
        }
    }
    if (k.int8) {
        j.kind = RL_VNNI;
        for (int pass = 0; pass < 2; pass++) {
            j.nth = pass ? threads : 1;
            double w = (double)RL_VNNI_ITERS * k.int8_ops_per_iter * j.nth;
            *(pass ? &out->vnni_gops_nt : &out->vnni_gops_1t) = rl_rate(&j, reps, w) * 1e-9;
        }
    }
    return 0;
}
