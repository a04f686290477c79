/* par.h - the process group kvant runs on for tensor parallelism: a thin
 * layer over MPI (Debian's OpenMPI), launched as `mpirun -np N kvant ...`.
 *
 * Every collective is issued non-blocking and then polled against a
 * deadline (timeout_s): a rank that dies or hangs turns into an error on
 * the ranks that wait for it, never a hang.  After one failure the group
 * is broken and every later call fails at once; the caller fails its work
 * and exits (par_abort takes the other ranks down with it).
 *
 * Builds without MPI (MPI=0: the arm64 cross build) have the same
 * interface; par_create then fails with KV_EUNSUP.
 *
 * Ownership: par_create/par_destroy pair (MPI_Init/MPI_Finalize: once per
 * process).  Threading: one thread at a time (MPI_THREAD_SERIALIZED): the
 * thread that runs the engine steps, after the main thread set it up.
 */
#ifndef KVANT_PAR_H
#define KVANT_PAR_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

typedef struct par par;

/* Communication counters of this rank (bytes it sent, time it waited). */
typedef struct par_stats {
    uint64_t calls;
    uint64_t bytes_sent;
    double seconds;      /* wall time inside collectives */
} par_stats;

/* Initialises MPI and checks the group has exactly `expect` ranks.
 * timeout_s bounds every later wait. */
par *par_create(int expect, double timeout_s, kvant_err *err);
void par_destroy(par *p);
/* Ends the whole job with code (MPI_Abort): the other ranks exit too. */
void par_abort(par *p, int code);
int par_rank(const par *p);
int par_size(const par *p);
void par_get_stats(const par *p, par_stats *out);
/* Seconds any wait on another rank may take (par_create's timeout_s). */
double par_timeout(const par *p);
/* This process's rank among the group's processes on its host (0 without
 * MPI): a GPU rank takes the device of that index (backend_rank_device). */
int par_local_rank(const par *p);
/* 1 once a call failed or timed out: the group is unusable. */
int par_failed(const par *p);

/* buf (bytes) from rank 0 to every rank.  idle: the caller has nothing
 * else to do (a worker waiting for its next command): no deadline, and the
 * wait sleeps between polls instead of spinning. */
int par_bcast(par *p, void *buf, size_t bytes, int idle, kvant_err *err);
/* recv[r * bytes ...] = rank r's send, on every rank. */
int par_allgather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err);
/* recv[r * bytes ...] = rank r's send[my_rank * bytes ...]: the i-th chunk
 * of every rank's buffer reaches rank i. */
int par_alltoall(par *p, const void *send, void *recv, size_t bytes, kvant_err *err);
/* recv[r * bytes ...] = rank r's send, on rank 0 only (recv may be NULL
 * elsewhere). */
int par_gather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err);

/* The ranks of p with the same color, in p's rank order, as their own
 * group (a tensor-parallel stage inside a pipeline); every rank of p calls
 * it.  par_destroy of the result frees the group only. */
par *par_split(par *p, int color, kvant_err *err);

/* Point to point (pipeline stages).  par_send returns once buf may be
 * reused.  A receive is posted into one of PAR_MAX_POSTED slots and
 * waited for later, so a sender never waits for the receiver to get there. */
#define PAR_MAX_POSTED 64
int par_send(par *p, int dest, int tag, const void *buf, size_t bytes, kvant_err *err);
int par_recv_post(par *p, int slot, int src, int tag, void *buf, size_t bytes, kvant_err *err);
int par_recv_wait(par *p, int slot, kvant_err *err);

#endif
