/* tpool.h - a fixed pool of worker threads for the CPU backend.
 *
 * Workers are created once (tpool_create) and park on a condition variable
 * between jobs; a job spins briefly before parking so back-to-back kernel
 * launches inside a decode step pay no syscall.  tpool_run does not
 * allocate.  The calling thread takes part as worker 0.
 * Ownership: heap handle, tpool_destroy joins the workers.
 * Threading: tpool_run must be called from one thread at a time (the
 * engine thread); jobs run on all n_threads threads.
 */
#ifndef KVANT_TPOOL_H
#define KVANT_TPOOL_H

#include "util/err.h"

typedef struct tpool tpool;

/* fn(ith, nth, arg) is called once on every thread, ith in [0, nth). */
typedef void (*tpool_fn)(int ith, int nth, void *arg);

tpool *tpool_create(int n_threads, kvant_err *err); /* n_threads >= 1 */
void tpool_destroy(tpool *p);
int tpool_n_threads(const tpool *p);
/* Runs fn on every thread and returns when all have finished. */
void tpool_run(tpool *p, tpool_fn fn, void *arg);

/* Splits [0, n) into nth near-equal contiguous ranges; range of thread ith. */
void tpool_range(long n, int ith, int nth, long *begin, long *end);

int tpool_default_threads(void); /* number of online CPUs, at least 1 */

#endif
