/* par_none.c - par.h in a build without MPI (MPI=0): one process only. */
#include "par/par.h"

#include <string.h>

struct par {
    int unused;
};

par *par_create(int expect, double timeout_s, kvant_err *err)
{
    (void)timeout_s;
    kvant_err_set(err, KV_EUNSUP, "--tp %d: this kvant is built without MPI (install "
                  "OpenMPI, libopenmpi-dev, and rebuild)", expect);
    return NULL;
}

void par_destroy(par *p)
{
    (void)p;
}

void par_abort(par *p, int code)
{
    (void)p, (void)code;
}

int par_rank(const par *p)
{
    (void)p;
    return 0;
}

int par_size(const par *p)
{
    (void)p;
    return 1;
}

void par_get_stats(const par *p, par_stats *out)
{
    (void)p;
    memset(out, 0, sizeof *out);
}

int par_failed(const par *p)
{
    (void)p;
    return 0;
}

double par_timeout(const par *p)
{
    (void)p;
    return 0.0;
}

int par_local_rank(const par *p)
{
    (void)p;
    return 0;
}

static int no_mpi(kvant_err *err)
{
    return kvant_err_set(err, KV_EUNSUP, "built without MPI");
}

int par_bcast(par *p, void *buf, size_t bytes, int idle, kvant_err *err)
{
    (void)p, (void)buf, (void)bytes, (void)idle;
    return no_mpi(err);
}

int par_allgather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    (void)p, (void)send, (void)recv, (void)bytes;
    return no_mpi(err);
}

int par_alltoall(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    (void)p, (void)send, (void)recv, (void)bytes;
    return no_mpi(err);
}

int par_gather(par *p, const void *send, void *recv, size_t bytes, kvant_err *err)
{
    (void)p, (void)send, (void)recv, (void)bytes;
    return no_mpi(err);
}

par *par_split(par *p, int color, kvant_err *err)
{
    (void)p, (void)color;
    no_mpi(err);
    return NULL;
}

int par_send(par *p, int dest, int tag, const void *buf, size_t bytes, kvant_err *err)
{
    (void)p, (void)dest, (void)tag, (void)buf, (void)bytes;
    return no_mpi(err);
}

int par_recv_post(par *p, int slot, int src, int tag, void *buf, size_t bytes, kvant_err *err)
{
    (void)p, (void)slot, (void)src, (void)tag, (void)buf, (void)bytes;
    return no_mpi(err);
}

int par_recv_wait(par *p, int slot, kvant_err *err)
{
    (void)p, (void)slot;
    return no_mpi(err);
}
