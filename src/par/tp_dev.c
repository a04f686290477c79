/* tp_dev.c - model parallelism on a device backend (CUDA): the exchange
 * buffers, the choice of a stage's transport and its reductions (see
 * tp_internal.h).
 *
 * MPI reads and writes host memory only (kvant assumes no CUDA-aware MPI),
 * so the logit gather and the pipeline hand-overs stage through host
 * buffers (malloc; the device copies go through the backend's download and
 * upload).  The reductions run on the device over NCCL (backend/cuda/
 * cuda_tp.h) when every rank of the stage has its own GPU; NCCL refuses
 * two ranks on one device, so ranks that share one reduce through host
 * memory and MPI (the CPU path's code: the same rank-order sum, bitwise).
 */
#include "par/tp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tp_sum.h"
#ifdef KVANT_CUDA
#include "backend/cuda/cuda_tp.h"
#endif

/* World rank of stage rank r. */
static int world_of(const tp_ctx *t, int r)
{
    return t->pp_stage * t->tp_n + r;
}

/* One collective on every rank of the stage: fails everywhere when rc
 * failed anywhere (this rank keeps its own message, the others name the
 * first failing rank). */
static int stage_all_ok(tp_ctx *t, int rc, const char *what, kvant_err *err)
{
    int32_t mine = rc, all[64];
    kvant_err ignored = {0};
    if (t->tp_n > 64)
        return kvant_err_set(err, KV_EINVAL, "--tp %d: at most 64", t->tp_n);
    int res = par_allgather(t->stage, &mine, all, sizeof mine, rc ? &ignored : err);
    if (rc)
        return rc;
    for (int r = 0; !res && r < t->tp_n; r++)
        if (all[r])
            res = kvant_err_set(err, all[r], "rank %d: %s failed", world_of(t, r), what);
    return res;
}

/* *use = 1 when NCCL can carry the stage's reductions: a CUDA build and
 * every rank of the stage on its own GPU (by UUID). */
static int want_nccl(tp_ctx *t, int *use, kvant_err *err)
{
    *use = 0;
    if (t->tp_n < 2 || strcmp(t->be->ops->name, "cuda") != 0)
        return KV_OK;
#ifdef KVANT_CUDA
    typedef struct who {
        int32_t rc;
        uint8_t uuid[CUDA_TP_UUID_BYTES];
    } who;
    who me = {0}, all[64];
    kvant_err mine = {0};
    if (t->tp_n > 64)
        return kvant_err_set(err, KV_EINVAL, "--tp %d: at most 64", t->tp_n);
    me.rc = cuda_tp_device_uuid(t->be, me.uuid, &mine);
    int rc = par_allgather(t->stage, &me, all, sizeof me, err);
    if (rc)
        return rc;
    if (me.rc)
        return kvant_err_set(err, me.rc, "%s", mine.msg);
    *use = 1;
    for (int r = 0; r < t->tp_n; r++) {
        if (all[r].rc)
            return kvant_err_set(err, all[r].rc, "rank %d: its CUDA device cannot be named",
                                 world_of(t, r));
        for (int q = 0; q < r; q++)
            if (!memcmp(all[q].uuid, all[r].uuid, CUDA_TP_UUID_BYTES))
                *use = 0;
    }
    return KV_OK;
#else
    (void)err;
    return KV_OK;
#endif
}

/* The exchange buffers: the reductions' on the device with NCCL (else on
 * the host, as MPI needs them), everything MPI touches on the host. */
static int dev_alloc(tp_ctx *t, int nccl, kvant_err *err)
{
    const uint64_t n = (uint64_t)t->tp_n, count = (uint64_t)t->max_count;
    const uint64_t chunk = (uint64_t)tp_chunk_of(t->max_count, t->tp_n);
    const int last = t->pp_stage == t->pp_n - 1, head = last && t->tp_rank == 0;
    const int recv = t->pp_stage > 0, stage_logits = head && t->rank != 0;
    const uint64_t red = t->tp_n > 1 ? n * count + (n + 1) * chunk : 0;
    const uint64_t n_l = head ? n * (uint64_t)t->max_out * (uint64_t)t->nv_max : 0;
    const uint64_t n_plog = stage_logits ? (uint64_t)t->max_out * (uint64_t)t->n_vocab : 0;
    const uint64_t n_hl = (uint64_t)t->max_out * (uint64_t)t->nv_max;
    const uint64_t host = (nccl ? 0 : red) + n_l + (recv ? count : 0) + n_plog + count + n_hl;
    float *h = t->h_base = calloc((size_t)host, sizeof(float));
    if (!h)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for the exchange buffers");
    float *g = NULL;
    if (nccl && red) {
        if (!(t->d_base = t->be->ops->alloc(t->be, red * sizeof(float), MEM_ACTIVATIONS,
                                            MEM_NO_LAYER, err)))
            return KV_ENOMEM;
        g = t->d_base;
    } else if (red) {
        g = h;
        h += red;
    }
    t->gbuf = g;
    t->sbuf = g ? g + n * count : NULL;
    t->ybuf = g ? t->sbuf + n * chunk : NULL;
    t->lbuf = h;
    h += n_l;
    t->rbuf = recv ? h : NULL;
    h += recv ? count : 0;
    t->plog = stage_logits ? h : NULL;
    h += n_plog;
    t->hx = h;
    t->hl = h + count;
    return KV_OK;
}

#ifdef KVANT_CUDA
/* Joins the stage's communicator (the id from stage rank 0), runs both
 * reduction paths once (NCCL connects lazily) and reserves the device
 * memory NCCL took in the memory manager. */
static int nccl_join(tp_ctx *t, kvant_err *err)
{
    struct {
        int32_t rc;
        uint8_t id[CUDA_TP_ID_BYTES];
    } msg = {0};
    kvant_err mine = {0};
    if (t->tp_rank == 0)
        msg.rc = cuda_tp_make_id(msg.id, &mine);
    int rc = par_bcast(t->stage, &msg, sizeof msg, 0, err);
    if (rc)
        return rc;
    if (msg.rc)
        return t->tp_rank == 0 ? kvant_err_set(err, msg.rc, "%s", mine.msg)
                               : kvant_err_set(err, msg.rc, "rank %d could not make an NCCL id",
                                               world_of(t, 0));
    t->nccl = cuda_tp_create(t->be, msg.id, t->tp_rank, t->tp_n, par_timeout(t->stage), err);
    if ((rc = stage_all_ok(t, t->nccl ? KV_OK : err->code ? err->code : KV_EIO,
                           "joining the NCCL communicator", err)))
        return rc;
    /* warm-up: the smallest message, the largest all-gather one, the
     * smallest reduce-scatter one (zeros; the results are not used) */
    const int64_t big = TP_SMALL_BYTES / (sizeof(float) * (uint64_t)t->tp_n) + 1;
    const int64_t sizes[3] = {1, big - 1, big};
    float *d_w = t->be->ops->alloc(t->be, (size_t)big * sizeof(float), MEM_ACTIVATIONS,
                                   MEM_NO_LAYER, err);
    rc = d_w ? t->be->ops->upload(t->be, d_w, t->hx, (size_t)big * sizeof(float)) : KV_ENOMEM;
    if (rc && d_w)
        rc = kvant_err_set(err, rc, "rank %d: uploading to the device failed", t->rank);
    for (int i = 0; !rc && i < 3; i++)
        if (sizes[i] <= t->max_count)
            rc = cuda_tp_allreduce(t->nccl, d_w, sizes[i], t->gbuf, t->sbuf, t->ybuf,
                                   tp_is_large(t, sizes[i]), err);
    if (d_w)
        t->be->ops->free(t->be, d_w);
    if (!rc)
        rc = cuda_tp_reserve(t->nccl, err);
    return stage_all_ok(t, rc, "setting up NCCL", err);
}
#endif

int tp_dev_setup(tp_ctx *t, kvant_err *err)
{
    int use = 0, rc = want_nccl(t, &use, err);
    if (rc)
        return rc;
    if ((rc = stage_all_ok(t, dev_alloc(t, use, err), "allocating the exchange buffers", err)))
        return rc;
#ifdef KVANT_CUDA
    if (use && (rc = nccl_join(t, err)))
        return rc;
#endif
    if (t->tp_n > 1 && t->tp_rank == 0)
        fprintf(stderr, "kvant: stage %d: %s\n", t->pp_stage,
                use ? "tensor-parallel reductions on the GPUs over NCCL"
                : strcmp(t->be->ops->name, "cuda") == 0
                    ? "the ranks share a GPU (NCCL needs one per rank): reductions through host "
                      "memory and MPI"
                    : "reductions staged through host buffers and MPI (KVANT_TP_HOST_STAGING)");
    return KV_OK;
}

void tp_dev_free(tp_ctx *t)
{
#ifdef KVANT_CUDA
    cuda_tp_destroy(t->nccl);
#endif
    t->nccl = NULL;
    free(t->h_base);
    t->h_base = NULL;
}

int tp_dev_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err)
{
    int rc;
#ifdef KVANT_CUDA
    if (t->nccl)
        return cuda_tp_allreduce(t->nccl, d_x, count, t->gbuf, t->sbuf, t->ybuf,
                                 tp_is_large(t, count), err);
#endif
    const size_t bytes = (size_t)count * sizeof(float);
    if ((rc = t->be->ops->download(t->be, t->hx, d_x, bytes)))
        return kvant_err_set(err, rc, "rank %d: copying activations from the device failed",
                             t->rank);
    if ((rc = tp_host_allreduce(t, t->hx, count, err)))
        return rc;
    if ((rc = t->be->ops->upload(t->be, d_x, t->hx, bytes)))
        return kvant_err_set(err, rc, "rank %d: copying activations to the device failed",
                             t->rank);
    return KV_OK;
}

void tp_dev_stats(const tp_ctx *t, par_stats *out, int *failed)
{
    *failed = 0;
#ifdef KVANT_CUDA
    if (t->nccl) {
        uint64_t bytes, calls;
        double seconds;
        cuda_tp_stats(t->nccl, &bytes, &calls, &seconds);
        out->bytes_sent += bytes;
        out->calls += calls;
        out->seconds += seconds;
        *failed = cuda_tp_failed(t->nccl);
    }
#else
    (void)t, (void)out;
#endif
}
