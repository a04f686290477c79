/* cuda_tp.cu - tensor-parallel reductions over NCCL (see cuda_tp.h). */
extern "C" {
#include "backend/cuda/cuda_tp.h"
#include "kernels/tp_sum.h"
}

#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/cuda/cuda_internal.h"

struct cuda_tp {
    backend *be;          /* borrowed */
    ncclComm_t comm;      /* NULL once aborted */
    cudaStream_t stream;  /* the backend's */
    cudaEvent_t done;
    int device, rank, n;
    double timeout_s;
    size_t free0;         /* device bytes free before NCCL's set-up */
    int64_t reserve_id;   /* mem_reserve of NCCL's own buffers */
    int broken;
    uint64_t bytes_sent, calls;
    double seconds;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Marks the communicator unusable (aborting it frees the GPU of kernels
 * that wait for a rank that will not come). */
static int fail(cuda_tp *c, kvant_err *err, const char *what, const char *why)
{
    if (c->comm)
        ncclCommAbort(c->comm);
    c->comm = NULL;
    c->broken = 1;
    return kvant_err_set(err, KV_EIO, "NCCL rank %d: %s: %s", c->rank, what, why);
}

/* Spins a little, then yields, then sleeps: a wait of microseconds stays
 * cheap, a long one does not hold a core. */
static void pause_poll(long it, double waited)
{
    if (it < 2000)
        return;
    if (waited < 0.01) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}

/* A non-blocking NCCL call returned r: waits until it is enqueued. */
static int settle(cuda_tp *c, ncclResult_t r, const char *what, kvant_err *err)
{
    const double t0 = now_s();
    for (long it = 0; r == ncclInProgress; it++) {
        const double t = now_s() - t0;
        if (t > c->timeout_s)
            return fail(c, err, what, "no answer from the other ranks (a rank hung or died)");
        pause_poll(it, t);
        if (ncclCommGetAsyncError(c->comm, &r) != ncclSuccess)
            r = ncclSystemError;
    }
    return r == ncclSuccess ? KV_OK : fail(c, err, what, ncclGetErrorString(r));
}

/* Waits for everything enqueued on the stream so far. */
static int wait_done(cuda_tp *c, const char *what, kvant_err *err)
{
    const double t0 = now_s();
    cudaError_t e = cudaEventRecord(c->done, c->stream);
    for (long it = 0; e == cudaSuccess; it++) {
        e = cudaEventQuery(c->done);
        if (e != cudaErrorNotReady)
            break;
        e = cudaSuccess;
        ncclResult_t ae = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &ae) != ncclSuccess ||
            (ae != ncclSuccess && ae != ncclInProgress))
            return fail(c, err, what, ncclGetErrorString(ae));
        const double t = now_s() - t0;
        if (t > c->timeout_s) {
            char why[96];
            snprintf(why, sizeof why, "no answer from the other ranks in %.0f s (a rank hung or "
                     "died)", c->timeout_s);
            return fail(c, err, what, why);
        }
        pause_poll(it, t);
    }
    c->calls++;
    c->seconds += now_s() - t0;
    return e == cudaSuccess ? KV_OK : fail(c, err, what, cudaGetErrorString(e));
}

/* ---- the ordered sum ---- */

__global__ void sum_ordered_kernel(float *__restrict__ dst, const float *__restrict__ src, int n,
                                   int64_t count, int64_t stride)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        float v = src[i];
        for (int r = 1; r < n; r++)
            v = __fadd_rn(v, src[(int64_t)r * stride + i]); /* never contracted or reordered */
        dst[i] = v;
    }
}

static cudaError_t sum_ordered(cudaStream_t s, float *dst, const float *src, int n,
                               int64_t count, int64_t stride)
{
    if (count < 1)
        return cudaSuccess;
    int64_t blocks = (count + 255) / 256;
    if (blocks > 4096)
        blocks = 4096;
    KV_LAUNCH((unsigned)blocks, 256, 0, s, sum_ordered_kernel)(dst, src, n, count, stride);
    return cudaGetLastError();
}

extern "C" int cuda_tp_sum_ordered(backend *be, float *d_dst, const float *d_src, int n,
                                   int64_t count, int64_t stride)
{
    if (n < 1 || count < 0 || stride < count)
        return KV_EINVAL;
    return sum_ordered(cuda_backend_stream(be), d_dst, d_src, n, count, stride) == cudaSuccess
               ? KV_OK
               : KV_EIO;
}

/* ---- set-up ---- */

extern "C" int cuda_tp_device_uuid(backend *be, uint8_t out[CUDA_TP_UUID_BYTES], kvant_err *err)
{
    cudaDeviceProp p;
    cudaError_t e = cudaGetDeviceProperties(&p, cuda_backend_device(be));
    if (e != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "CUDA device %d: %s", cuda_backend_device(be),
                             cudaGetErrorString(e));
    memcpy(out, p.uuid.bytes, CUDA_TP_UUID_BYTES);
    return KV_OK;
}

extern "C" int cuda_tp_make_id(uint8_t id[CUDA_TP_ID_BYTES], kvant_err *err)
{
    ncclUniqueId u;
    static_assert(sizeof u == CUDA_TP_ID_BYTES, "NCCL_UNIQUE_ID_BYTES changed");
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return kvant_err_set(err, KV_EIO, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return KV_OK;
}

extern "C" cuda_tp *cuda_tp_create(backend *be, const uint8_t id[CUDA_TP_ID_BYTES], int rank,
                                   int n, double timeout_s, kvant_err *err)
{
    cuda_tp *c = (cuda_tp *)calloc(1, sizeof *c);
    if (!c) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    c->be = be;
    c->stream = cuda_backend_stream(be);
    c->device = cuda_backend_device(be);
    c->rank = rank;
    c->n = n;
    c->timeout_s = timeout_s > 0 ? timeout_s : 30.0;
    size_t total = 0;
    cudaError_t e;
    if ((e = cudaSetDevice(c->device)) != cudaSuccess ||
        (e = cudaEventCreateWithFlags(&c->done, cudaEventDisableTiming)) != cudaSuccess ||
        (e = cudaMemGetInfo(&c->free0, &total)) != cudaSuccess) {
        kvant_err_set(err, KV_EIO, "NCCL rank %d: CUDA device %d: %s", rank, c->device,
                      cudaGetErrorString(e));
        cuda_tp_destroy(c);
        return NULL;
    }
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* every wait is ours, against the deadline */
    ncclResult_t r = ncclCommInitRankConfig(&c->comm, n, u, rank, &cfg);
    if ((r != ncclSuccess && r != ncclInProgress) || !c->comm) {
        kvant_err_set(err, KV_EIO, "NCCL rank %d: ncclCommInitRank: %s", rank,
                      ncclGetErrorString(r));
        c->comm = NULL;
        cuda_tp_destroy(c);
        return NULL;
    }
    if (settle(c, r, "communicator set-up", err)) {
        cuda_tp_destroy(c);
        return NULL;
    }
    return c;
}

extern "C" int cuda_tp_reserve(cuda_tp *c, kvant_err *err)
{
    size_t free1 = 0, total = 0;
    if (cudaMemGetInfo(&free1, &total) != cudaSuccess)
        return kvant_err_set(err, KV_EIO, "NCCL rank %d: cudaMemGetInfo failed", c->rank);
    if (free1 >= c->free0 || c->reserve_id > 0)
        return KV_OK;
    kvant_err why = {};
    int64_t id = mem_reserve(c->be->ops->mem(c->be), c->free0 - free1, MEM_WORKSPACE,
                             MEM_NO_LAYER, &why);
    if (id < 0)
        return kvant_err_set(err, KV_ENOMEM, "NCCL rank %d: NCCL's buffers (%zu bytes) do not "
                             "fit the budget: %s", c->rank, c->free0 - free1, why.msg);
    c->reserve_id = id;
    return KV_OK;
}

extern "C" void cuda_tp_destroy(cuda_tp *c)
{
    if (!c)
        return;
    if (c->comm) {
        /* a clean finalize waits for the other ranks: bounded like any call */
        kvant_err e = {};
        if (!settle(c, ncclCommFinalize(c->comm), "finalize", &e))
            ncclCommDestroy(c->comm);
    }
    if (c->reserve_id > 0)
        mem_unreserve(c->be->ops->mem(c->be), c->reserve_id);
    if (c->done)
        cudaEventDestroy(c->done);
    free(c);
}

extern "C" int cuda_tp_failed(const cuda_tp *c)
{
    return c->broken;
}

extern "C" void cuda_tp_stats(const cuda_tp *c, uint64_t *bytes_sent, uint64_t *calls,
                              double *seconds)
{
    *bytes_sent = c->bytes_sent;
    *calls = c->calls;
    *seconds = c->seconds;
}

/* ---- the reduction ---- */

static int check_cuda(cuda_tp *c, cudaError_t e, const char *what, kvant_err *err)
{
    return e == cudaSuccess ? KV_OK : fail(c, err, what, cudaGetErrorString(e));
}

/* Chunk r of every rank's d_s to rank r, into d_g[r' * chunk] from rank r'
 * (an all-to-all as one group of sends and receives; one's own chunk is a
 * device copy). */
static int all_to_all(cuda_tp *c, const float *d_s, float *d_g, int64_t chunk, kvant_err *err)
{
    const size_t bytes = (size_t)chunk * sizeof(float);
    int rc = check_cuda(c, cudaMemcpyAsync(d_g + (size_t)c->rank * chunk,
                                           d_s + (size_t)c->rank * chunk, bytes,
                                           cudaMemcpyDeviceToDevice, c->stream),
                        "all-to-all", err);
    if (rc)
        return rc;
    ncclResult_t r = ncclGroupStart();
    for (int p = 0; r == ncclSuccess && p < c->n; p++) {
        if (p == c->rank)
            continue;
        r = ncclSend(d_s + (size_t)p * chunk, (size_t)chunk, ncclFloat, p, c->comm, c->stream);
        if (r == ncclSuccess)
            r = ncclRecv(d_g + (size_t)p * chunk, (size_t)chunk, ncclFloat, p, c->comm,
                         c->stream);
    }
    ncclResult_t r2 = ncclGroupEnd();
    c->bytes_sent += bytes * (uint64_t)(c->n - 1);
    return settle(c, r != ncclSuccess ? r : r2, "all-to-all", err);
}

static int all_gather(cuda_tp *c, const float *d_send, float *d_recv, int64_t count,
                      kvant_err *err)
{
    c->bytes_sent += (uint64_t)count * sizeof(float) * (uint64_t)(c->n - 1);
    return settle(c, ncclAllGather(d_send, d_recv, (size_t)count, ncclFloat, c->comm, c->stream),
                  "all-gather", err);
}

extern "C" int cuda_tp_allreduce(cuda_tp *c, float *d_x, int64_t count, float *d_g, float *d_s,
                                 float *d_y, int large, kvant_err *err)
{
    int rc;
    if (c->broken || !c->comm)
        return kvant_err_set(err, KV_EIO, "NCCL rank %d: the process group failed earlier",
                             c->rank);
    if (count < 1)
        return KV_OK;
    if (!large) {
        if ((rc = all_gather(c, d_x, d_g, count, err)) ||
            (rc = check_cuda(c, sum_ordered(c->stream, d_x, d_g, c->n, count, count),
                             "ordered sum", err)))
            return rc;
        return wait_done(c, "all-gather", err);
    }
    const int64_t chunk = tp_chunk_of(count, c->n), padded = chunk * c->n;
    if ((rc = check_cuda(c, cudaMemcpyAsync(d_s, d_x, (size_t)count * sizeof(float),
                                            cudaMemcpyDeviceToDevice, c->stream),
                         "reduce-scatter", err)) ||
        (padded > count &&
         (rc = check_cuda(c, cudaMemsetAsync(d_s + count, 0,
                                             (size_t)(padded - count) * sizeof(float), c->stream),
                          "reduce-scatter", err))) ||
        (rc = all_to_all(c, d_s, d_g, chunk, err)) ||
        (rc = check_cuda(c, sum_ordered(c->stream, d_y, d_g, c->n, chunk, chunk), "ordered sum",
                         err)) ||
        (rc = all_gather(c, d_y, d_g, chunk, err)) ||
        (rc = check_cuda(c, cudaMemcpyAsync(d_x, d_g, (size_t)count * sizeof(float),
                                            cudaMemcpyDeviceToDevice, c->stream),
                         "reduce-scatter", err)))
        return rc;
    return wait_done(c, "reduce-scatter", err);
}
