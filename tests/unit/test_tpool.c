/* test_tpool.c - every ith runs exactly once per job, parallel sums
 * equal serial sums, tpool_range partitions exactly, create/destroy churn,
 * and the overhead of an empty tpool_run (printed, not asserted).
 * Nothing here depends on timing; run it under ASan and TSan. */
#include "backend/cpu/tpool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"

enum { MAX_T = 4 };

typedef struct count_job {
    atomic_int hits[MAX_T];
    atomic_int bad_nth;
} count_job;

static void count_fn(int ith, int nth, void *arg)
{
    count_job *j = arg;
    if (ith < 0 || ith >= MAX_T) {
        atomic_fetch_add(&j->bad_nth, 1);
        return;
    }
    atomic_fetch_add_explicit(&j->hits[ith], 1, memory_order_relaxed);
    (void)nth;
}

/* Every ith runs exactly once per job: after each run, each counter moved
 * by exactly one (the caller reads them after tpool_run returns). */
static void test_each_ith_once(void)
{
    for (int nt = 1; nt <= MAX_T; nt++) {
        kvant_err e = {0};
        tpool *p = tpool_create(nt, &e);
        CHECKF(p != NULL, "create(%d): %s", nt, e.msg);
        if (!p)
            continue;
        CHECK(tpool_n_threads(p) == nt);
        count_job j;
        memset(&j, 0, sizeof j);
        int exact = 1;
        for (int job = 1; job <= 10000; job++) {
            tpool_run(p, count_fn, &j);
            for (int i = 0; i < MAX_T; i++)
                exact &= atomic_load(&j.hits[i]) == (i < nt ? job : 0);
        }
        CHECKF(exact, "n_threads %d: some ith ran not exactly once per job", nt);
        CHECK(atomic_load(&j.bad_nth) == 0);
        tpool_destroy(p);
    }
}

typedef struct sum_job {
    const double *x;
    long n;
    double partial[MAX_T];
    long covered[MAX_T];
} sum_job;

static void sum_fn(int ith, int nth, void *arg)
{
    sum_job *j = arg;
    long b, e;
    tpool_range(j->n, ith, nth, &b, &e);
    double s = 0.0;
    for (long i = b; i < e; i++)
        s += j->x[i];
    j->partial[ith] = s; /* plain writes: published by tpool_run's join */
    j->covered[ith] = e - b;
}

static void test_parallel_sum(void)
{
    enum { N = 100003 };
    double *x = malloc(N * sizeof *x);
    tu_rng r = {17};
    for (long i = 0; i < N; i++)
        x[i] = tu_rand_uniform(&r, -1.0f, 1.0f);
    for (int nt = 1; nt <= MAX_T; nt++) {
        tpool *p = tpool_create(nt, NULL);
        CHECK(p != NULL);
        if (!p)
            continue;
        const long sizes[] = {0, 1, 3, 1000, N};
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
            sum_job j = {.x = x, .n = sizes[si]};
            tpool_run(p, sum_fn, &j);
            /* serial reference summed in the same chunks, in ith order */
            double par = 0.0, ser = 0.0;
            long cov = 0;
            for (int t = 0; t < nt; t++) {
                par += j.partial[t];
                cov += j.covered[t];
                long b, e;
                tpool_range(j.n, t, nt, &b, &e);
                double s = 0.0;
                for (long i = b; i < e; i++)
                    s += x[i];
                ser += s;
            }
            CHECKF(par == ser && cov == j.n, "nt %d n %ld: %.17g vs %.17g", nt, j.n, par, ser);
        }
        tpool_destroy(p);
    }
    free(x);
}

static void test_range(void)
{
    int ok = 1;
    for (long n = 0; n <= 70; n++) {
        for (int nth = 1; nth <= 17; nth++) {
            long expect = 0;
            long base = n / nth;
            for (int ith = 0; ith < nth; ith++) {
                long b, e;
                tpool_range(n, ith, nth, &b, &e);
                /* contiguous, in order, no overlap, sizes differ by <= 1 */
                ok &= b == expect && e >= b && (e - b == base || e - b == base + 1);
                expect = e;
            }
            ok &= expect == n;
        }
    }
    long b, e; /* large n, no overflow */
    tpool_range(1L << 40, 3, 7, &b, &e);
    ok &= b == 3 * ((1L << 40) / 7) + 2 && e - b == (1L << 40) / 7; /* 2^40 % 7 == 2 */
    CHECK(ok);
}

static void nop_fn(int ith, int nth, void *arg)
{
    (void)ith;
    (void)nth;
    (void)arg;
}

static void test_churn(void)
{
    for (int i = 0; i < 200; i++) {
        tpool *p = tpool_create(1 + i % MAX_T, NULL);
        CHECK(p != NULL);
        if (!p)
            continue;
        for (int k = 0; k < i % 3; k++)
            tpool_run(p, nop_fn, NULL);
        tpool_destroy(p);
    }
    tpool_destroy(NULL);
    kvant_err e = {0};
    CHECK(tpool_create(0, &e) == NULL && e.code == KV_EINVAL && strstr(e.msg, "n_threads"));
    CHECK(tpool_create(-3, NULL) == NULL);
    CHECK(tpool_default_threads() >= 1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median cost of an empty tpool_run with 2 threads, and the cost after the
 * workers parked (a job every few milliseconds).  Printed only. */
static void bench_empty_run(void)
{
    enum { N = 100000 };
    tpool *p = tpool_create(2, NULL);
    CHECK(p != NULL);
    if (!p)
        return;
    double *ns = malloc(N * sizeof *ns);
    for (int i = 0; i < 1000; i++)
        tpool_run(p, nop_fn, NULL);
    for (int i = 0; i < N; i++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tpool_run(p, nop_fn, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns[i] = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    }
    qsort(ns, N, sizeof *ns, cmp_double);
    fprintf(stderr, "tpool_run empty, 2 threads, hot: median %.0f ns, p90 %.0f ns, p99 %.0f ns\n",
            ns[N / 2], ns[N * 9 / 10], ns[N * 99 / 100]);
    enum { NP = 50 };
    for (int i = 0; i < NP; i++) {
        struct timespec nap = {0, 5 * 1000 * 1000}, t0, t1;
        nanosleep(&nap, NULL); /* let the worker park */
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tpool_run(p, nop_fn, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        ns[i] = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    }
    qsort(ns, NP, sizeof *ns, cmp_double);
    fprintf(stderr, "tpool_run empty, 2 threads, parked worker: median %.0f ns\n", ns[NP / 2]);
    free(ns);
    tpool_destroy(p);
}

int main(int argc, char **argv)
{
    test_range();
    test_each_ith_once();
    test_parallel_sum();
    test_churn();
    if (!(argc > 1 && strcmp(argv[1], "--no-bench") == 0))
        bench_empty_run();
    return tu_finish("test_tpool");
}
