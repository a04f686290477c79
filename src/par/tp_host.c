/* tp_host.c - the tensor-parallel reduction in host memory over MPI: the
 * CPU backend's path, and a device backend's when its stage has no NCCL
 * (tp_dev.c stages the activations on the host and calls it).  Every rank
 * adds the stage's partials in rank order (kernels/tp_sum.h), so all hold
 * bitwise identical sums (see tp.h). */
#include "par/tp_internal.h"

#include <string.h>

#include "kernels/tp_sum.h"

int tp_is_large(const tp_ctx *t, int64_t count)
{
    return (uint64_t)count * sizeof(float) * (uint64_t)t->tp_n > TP_SMALL_BYTES;
}

int tp_host_allreduce(tp_ctx *t, float *x, int64_t count, kvant_err *err)
{
    int rc;
    const int n = t->tp_n;
    if (!tp_is_large(t, count)) {
        if ((rc = par_allgather(t->stage, x, t->gbuf, (size_t)count * sizeof(float), err)))
            return rc;
        tp_sum_ordered(x, t->gbuf, n, count, count);
        return KV_OK;
    }
    /* reduce-scatter (all-to-all of chunks, ordered sum on the owner), then
     * all-gather of the summed chunks */
    const int64_t chunk = tp_chunk_of(count, n), padded = chunk * n;
    memcpy(t->sbuf, x, (size_t)count * sizeof(float));
    memset(t->sbuf + count, 0, (size_t)(padded - count) * sizeof(float));
    if ((rc = par_alltoall(t->stage, t->sbuf, t->gbuf, (size_t)chunk * sizeof(float), err)))
        return rc;
    tp_sum_ordered(t->ybuf, t->gbuf, n, chunk, chunk);
    if ((rc = par_allgather(t->stage, t->ybuf, t->gbuf, (size_t)chunk * sizeof(float), err)))
        return rc;
    memcpy(x, t->gbuf, (size_t)count * sizeof(float));
    return KV_OK;
}
