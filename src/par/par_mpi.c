/* par_mpi.c - par.h over MPI (built with MPI=1; see the Makefile). */
#include "par/par.h"

#include <limits.h>
#include <mpi.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

struct par {
    MPI_Comm comm;
    int rank, size;
    int local_rank;      /* among the ranks on this host */
    double timeout_s;
    int broken;          /* a collective failed or timed out */
    int sub;             /* made by par_split: MPI stays initialised */
    par_stats st;
    MPI_Request posted[PAR_MAX_POSTED];
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

par *par_create(int expect, double timeout_s, kvant_err *err)
{
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited && MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS) {
        kvant_err_set(err, KV_EUNSUP, "MPI_Init failed");
        return NULL;
    }
    par *p = calloc(1, sizeof *p);
    if (!p) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &p->comm);
    MPI_Comm_set_errhandler(p->comm, MPI_ERRORS_RETURN);
    for (int i = 0; i < PAR_MAX_POSTED; i++)
        p->posted[i] = MPI_REQUEST_NULL;
    MPI_Comm_rank(p->comm, &p->rank);
    MPI_Comm_size(p->comm, &p->size);
    MPI_Comm host;
    p->local_rank = 0;
    if (MPI_Comm_split_type(p->comm, MPI_COMM_TYPE_SHARED, p->rank, MPI_INFO_NULL, &host) ==
        MPI_SUCCESS) {
        MPI_Comm_rank(host, &p->local_rank);
        MPI_Comm_free(&host);
    }
    p->timeout_s = timeout_s > 0 ? timeout_s : 30.0;
    if (!inited && provided < MPI_THREAD_SERIALIZED) {
        kvant_err_set(err, KV_EUNSUP, "this MPI gives thread level %d; kvant needs "
                      "MPI_THREAD_SERIALIZED", provided);
        par_destroy(p);
        return NULL;
    }
    if (p->size != expect) {
        kvant_err_set(err, KV_EINVAL, "--tp x --pp needs %d ranks, but the job has %d (launch "
                      "with mpirun -np %d)", expect, p->size, expect);
        par_destroy(p);
        return NULL;
    }
    return p;
}

void par_destroy(par *p)
{
    if (!p)
        return;
    int fin = 0, sub = p->sub;
    for (int i = 0; i < PAR_MAX_POSTED; i++)
        if (p->posted[i] != MPI_REQUEST_NULL) {
            MPI_Cancel(&p->posted[i]);
            MPI_Request_free(&p->posted[i]);
        }
    MPI_Comm_free(&p->comm);
    free(p);
    if (sub)
        return;
    MPI_Finalized(&fin);
    if (!fin)
        MPI_Finalize();
}

void par_abort(par *p, int code)
{
    MPI_Abort(p ? p->comm : MPI_COMM_WORLD, code);
}

int par_rank(const par *p)
{
    return p->rank;
}

int par_size(const par *p)
{
    return p->size;
}

void par_get_stats(const par *p, par_stats *out)
{
    *out = p->st;
}

int par_failed(const par *p)
{
    return p->broken;
}

double par_timeout(const par *p)
{
    return p->timeout_s;
}

int par_local_rank(const par *p)
{
    return p->local_rank;
}

/* Polls req until it completes or the deadline passes.  Spins first
 * (decode-step messages arrive within microseconds), then yields, then
 * sleeps between polls so an idle worker does not hold a core. */
static int wait_req(par *p, MPI_Request *req, const char *what, int idle, kvant_err *err)
{
    const double t0 = now_s();
    int done = 0;
    for (long it = 0;; it++) {
        if (MPI_Test(req, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
            p->broken = 1;
            return kvant_err_set(err, KV_EIO, "rank %d: %s failed (a rank left the group)",
                                 p->rank, what);
        }
        if (done)
            break;
        if (it < 2000)
            continue;
        /* then yield: a rank sharing a core (or a hyperthread) with another
         * gets it back at once; past 10 ms, sleep */
        double t = now_s();
        if (!idle && t - t0 > p->timeout_s) {
            p->broken = 1;
            return kvant_err_set(err, KV_EIO, "rank %d: %s: no answer from the other ranks in "
                                 "%.0f s (a rank hung or died)", p->rank, what, p->timeout_s);
        }
        if (t - t0 < 0.01) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, idle && t - t0 > 0.1 ? 1000000 : 20000};
        nanosleep(&ts, NULL);
    }
    p->st.calls++;
    p->st.seconds += now_s() - t0;
    return KV_OK;
}

static int check(par *p, size_t bytes, const char *what, kvant_err *err)
{
    if (p->broken)
        return kvant_err_set(err, KV_EIO, "rank %d: %s: the process group failed earlier",
                             p->rank, what);
    if (bytes > INT_MAX)
        return kvant_err_set(err, KV_EINVAL, "%s of %zu bytes: over MPI's count limit", what,
                             bytes);
    return KV_OK;
}

int par_bcast(par *p, void *buf, size_t bytes, int idle, kvant_err *err)
{
    MPI_Request req;
    if (check(p, bytes, "broadcast", err))
        return err ? err->code : KV_EIO;
    if (MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, p->comm, &req) != MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: broadcast failed", p->rank);
    }
    if (p->rank == 0)
        p->st.bytes_sent += bytes * (size_t)(p->size - 1);
    return wait_req(p, &req, "broadcast", idle, err);
}

int par_allgather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    MPI_Request req;
    if (check(p, bytes, "all-gather", err))
        return err ? err->code : KV_EIO;
    if (MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, p->comm, &req) !=
        MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: all-gather failed", p->rank);
    }
    p->st.bytes_sent += bytes * (size_t)(p->size - 1);
    return wait_req(p, &req, "all-gather", 0, err);
}

int par_alltoall(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    MPI_Request req;
    if (check(p, bytes, "all-to-all", err))
        return err ? err->code : KV_EIO;
    if (MPI_Ialltoall(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, p->comm, &req) !=
        MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: all-to-all failed", p->rank);
    }
    p->st.bytes_sent += bytes * (size_t)(p->size - 1);
    return wait_req(p, &req, "all-to-all", 0, err);
}

int par_gather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    MPI_Request req;
    if (check(p, bytes, "gather", err))
        return err ? err->code : KV_EIO;
    if (MPI_Igather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, 0, p->comm, &req) !=
        MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: gather failed", p->rank);
    }
    if (p->rank != 0)
        p->st.bytes_sent += bytes;
    return wait_req(p, &req, "gather", 0, err);
}

par *par_split(par *p, int color, kvant_err *err)
{
    par *q = calloc(1, sizeof *q);
    if (!q) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    if (MPI_Comm_split(p->comm, color, p->rank, &q->comm) != MPI_SUCCESS) {
        free(q);
        kvant_err_set(err, KV_EIO, "rank %d: cannot split the process group", p->rank);
        return NULL;
    }
    MPI_Comm_set_errhandler(q->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(q->comm, &q->rank);
    MPI_Comm_size(q->comm, &q->size);
    q->timeout_s = p->timeout_s;
    q->local_rank = p->local_rank;
    q->sub = 1;
    for (int i = 0; i < PAR_MAX_POSTED; i++)
        q->posted[i] = MPI_REQUEST_NULL;
    return q;
}

int par_send(par *p, int dest, int tag, const void *buf, size_t bytes, kvant_err *err)
{
    MPI_Request req;
    if (check(p, bytes, "send", err))
        return err ? err->code : KV_EIO;
    if (MPI_Isend(buf, (int)bytes, MPI_BYTE, dest, tag, p->comm, &req) != MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: send to rank %d failed", p->rank, dest);
    }
    p->st.bytes_sent += bytes;
    return wait_req(p, &req, "send", 0, err);
}

int par_recv_post(par *p, int slot, int src, int tag, void *buf, size_t bytes, kvant_err *err)
{
    if (check(p, bytes, "receive", err))
        return err ? err->code : KV_EIO;
    if (slot < 0 || slot >= PAR_MAX_POSTED || p->posted[slot] != MPI_REQUEST_NULL)
        return kvant_err_set(err, KV_EINVAL, "receive slot %d busy or out of range", slot);
    if (MPI_Irecv(buf, (int)bytes, MPI_BYTE, src, tag, p->comm, &p->posted[slot]) !=
        MPI_SUCCESS) {
        p->broken = 1;
        return kvant_err_set(err, KV_EIO, "rank %d: receive from rank %d failed", p->rank, src);
    }
    return KV_OK;
}

int par_recv_wait(par *p, int slot, kvant_err *err)
{
    if (slot < 0 || slot >= PAR_MAX_POSTED || p->posted[slot] == MPI_REQUEST_NULL)
        return kvant_err_set(err, KV_EINVAL, "no receive posted in slot %d", slot);
    if (p->broken)
        return kvant_err_set(err, KV_EIO, "rank %d: receive: the process group failed earlier",
                             p->rank);
    return wait_req(p, &p->posted[slot], "receive", 0, err);
}
