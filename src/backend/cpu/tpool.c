/* tpool.c - fixed worker pool (see tpool.h for the contract).
 *
 * Protocol.  A job is published by storing fn/arg, setting `pending` to the
 * number of workers and incrementing the generation counter `gen`
 * (release).  A worker that sees a new generation (acquire) runs the job and
 * decrements `pending`; the caller runs ith 0 itself, then waits for
 * `pending` to reach 0.  fn/arg are plain fields: the next tpool_run only
 * rewrites them after every worker has decremented `pending`, i.e. after
 * every worker has finished reading them.
 *
 * Waiting.  Both sides spin TPOOL_SPIN_ITERS pause instructions (yielding
 * the core every TPOOL_YIELD_EVERY), then park on a condition variable, so
 * an idle pool burns no CPU.  Lost wake-ups are
 * ruled out Dekker-style with sequentially consistent atomics: a parking
 * worker increments `n_parked` (under `mu`) before re-reading `gen`, and the
 * caller bumps `gen` before reading `n_parked`, so at least one of them sees
 * the other; the caller then broadcasts under `mu`, which the worker holds
 * from the increment until pthread_cond_wait releases it.  The same scheme
 * (`caller_parked` vs the last decrement of `pending`) wakes a parked caller.
 *
 * Invariants: gen only grows (wrap-around is harmless, only != is used);
 * pending is 0 whenever no tpool_run is in progress; `busy` is 1 exactly
 * while a tpool_run is in progress (catches concurrent or nested calls).
 */
#include "backend/cpu/tpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Pause instructions before parking: a few to a few hundred microseconds
 * depending on the CPU's pause latency, enough to cover the gap between
 * kernel launches inside a decode step. */
#define TPOOL_SPIN_ITERS 4096
/* Spinners yield the core this often, so that on an oversubscribed machine
 * (more runnable threads than cores) the thread everyone waits for runs. */
#define TPOOL_YIELD_EVERY 128
#define TPOOL_MAX_THREADS 512
#define TPOOL_CACHE_LINE 64

/* One step of a spin-wait, i counting from 0. */
static inline void tpool_spin_step(int i)
{
    if (i % TPOOL_YIELD_EVERY == TPOOL_YIELD_EVERY - 1) {
        sched_yield();
        return;
    }
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

typedef struct tpool_worker {
    struct tpool *pool;
    int ith;
    pthread_t thread;
} tpool_worker;

struct tpool {
    /* read-mostly */
    int n_threads;
    tpool_worker *workers;  /* [n_threads - 1], worker i has ith = i + 1 */
    tpool_fn fn;         /* current job, written by the caller before gen++ */
    void *arg;
    pthread_mutex_t mu;
    pthread_cond_t cv_job;  /* workers park here */
    pthread_cond_t cv_done; /* the caller parks here */

    /* written by the caller, spun on by workers */
    alignas(TPOOL_CACHE_LINE) atomic_uint gen;
    atomic_int stop;
    atomic_int n_parked;
    atomic_int busy;
    /* written by workers, spun on by the caller */
    alignas(TPOOL_CACHE_LINE) atomic_int pending;
    atomic_int caller_parked;
};

/* Waits for gen != seen; returns the new generation. */
static unsigned tpool_wait_job(struct tpool *p, unsigned seen)
{
    unsigned g;
    for (int i = 0; i < TPOOL_SPIN_ITERS; i++) {
        g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen)
            return g;
        tpool_spin_step(i);
    }
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->n_parked, 1);
    while ((g = atomic_load(&p->gen)) == seen)
        pthread_cond_wait(&p->cv_job, &p->mu);
    atomic_fetch_sub(&p->n_parked, 1);
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *tpool_worker_main(void *varg)
{
    tpool_worker *w = varg;
    struct tpool *p = w->pool;
    unsigned seen = 0; /* tpool_create starts gen at 0 */
    for (;;) {
        seen = tpool_wait_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire))
            break;
        p->fn(w->ith, p->n_threads, p->arg);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->caller_parked)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

/* Bumps gen (publishing fn/arg/stop) and wakes parked workers. */
static void tpool_post(struct tpool *p)
{
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->n_parked) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_job);
        pthread_mutex_unlock(&p->mu);
    }
}

static void tpool_wait_done(struct tpool *p)
{
    for (int i = 0; i < TPOOL_SPIN_ITERS; i++) {
        if (atomic_load_explicit(&p->pending, memory_order_acquire) == 0)
            return;
        tpool_spin_step(i);
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->caller_parked, 1);
    while (atomic_load(&p->pending) != 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    atomic_store(&p->caller_parked, 0);
    pthread_mutex_unlock(&p->mu);
}

/* Stops and joins the first n_started workers, then frees everything. */
static void tpool_teardown(struct tpool *p, int n_started)
{
    atomic_store(&p->stop, 1);
    tpool_post(p);
    for (int i = 0; i < n_started; i++)
        pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->cv_done);
    pthread_cond_destroy(&p->cv_job);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

tpool *tpool_create(int n_threads, kvant_err *err)
{
    if (n_threads < 1 || n_threads > TPOOL_MAX_THREADS) {
        kvant_err_set(err, KV_EINVAL, "n_threads: %d is outside [1, %d]", n_threads,
                      TPOOL_MAX_THREADS);
        return NULL;
    }
    size_t size = (sizeof(struct tpool) + TPOOL_CACHE_LINE - 1) / TPOOL_CACHE_LINE *
                  TPOOL_CACHE_LINE;
    struct tpool *p = aligned_alloc(TPOOL_CACHE_LINE, size);
    tpool_worker *ws = n_threads > 1 ? calloc((size_t)n_threads - 1, sizeof *ws) : NULL;
    if (!p || (n_threads > 1 && !ws)) {
        free(p);
        free(ws);
        kvant_err_set(err, KV_ENOMEM, "thread pool: out of memory for %d threads", n_threads);
        return NULL;
    }
    memset(p, 0, size);
    p->n_threads = n_threads;
    p->workers = ws;
    atomic_init(&p->gen, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->n_parked, 0);
    atomic_init(&p->busy, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->caller_parked, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_job, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    for (int i = 0; i < n_threads - 1; i++) {
        ws[i].pool = p;
        ws[i].ith = i + 1;
        int rc = pthread_create(&ws[i].thread, NULL, tpool_worker_main, &ws[i]);
        if (rc != 0) {
            tpool_teardown(p, i);
            kvant_err_set(err, KV_ENOMEM, "thread pool: pthread_create failed for thread %d of %d: %s",
                          i + 1, n_threads, strerror(rc));
            return NULL;
        }
    }
    return p;
}

void tpool_destroy(tpool *p)
{
    if (!p)
        return;
    KV_ASSERT(atomic_load(&p->busy) == 0);
    tpool_teardown(p, p->n_threads - 1);
}

int tpool_n_threads(const tpool *p)
{
    KV_ASSERT(p);
    return p->n_threads;
}

void tpool_run(tpool *p, tpool_fn fn, void *arg)
{
    KV_ASSERT(p && fn);
    int was_busy = atomic_exchange_explicit(&p->busy, 1, memory_order_acquire);
    KV_ASSERT(!was_busy); /* concurrent tpool_run, or tpool_run inside a job */
    if (p->n_threads > 1) {
        p->fn = fn;
        p->arg = arg;
        atomic_store_explicit(&p->pending, p->n_threads - 1, memory_order_relaxed);
        tpool_post(p);
    }
    fn(0, p->n_threads, arg);
    if (p->n_threads > 1)
        tpool_wait_done(p);
    atomic_store_explicit(&p->busy, 0, memory_order_release);
}

void tpool_range(long n, int ith, int nth, long *begin, long *end)
{
    KV_ASSERT(n >= 0 && nth >= 1 && ith >= 0 && ith < nth && begin && end);
    long base = n / nth, rem = n % nth;
    *begin = ith * base + (ith < rem ? ith : rem);
    *end = *begin + base + (ith < rem ? 1 : 0);
}

int tpool_default_threads(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n >= 1)
            return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n >= 1 ? (int)(n < TPOOL_MAX_THREADS ? n : TPOOL_MAX_THREADS) : 1;
}
