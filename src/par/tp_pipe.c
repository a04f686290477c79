/* tp_pipe.c - pipeline stages: activations from stage to stage, the
 * logits from the last stage to rank 0 (see tp.h).  On a device backend
 * (CUDA) a hand-over goes device -> host -> MPI -> host -> device: the
 * posted receives and the staged logits are host buffers (tp_dev.c). */
#include <string.h>

#include "par/tp.h"
#include "par/tp_internal.h"

#define TP_TAG_LOGITS 1000000

int tp_pp_n(const tp_ctx *t)
{
    return t->pp_n;
}

int tp_pp_first(const tp_ctx *t)
{
    return t->pp_stage == 0;
}

int tp_pp_last(const tp_ctx *t)
{
    return t->pp_stage == t->pp_n - 1;
}

int32_t *tp_pp_out_scratch(tp_ctx *t)
{
    return t->mb_out;
}

int tp_pp_post(tp_ctx *t, int n_mb, const int32_t *off, const int32_t *cnt, kvant_err *err)
{
    if (n_mb > PAR_MAX_POSTED)
        return kvant_err_set(err, KV_EINVAL, "%d micro-batches (limit %d)", n_mb,
                             PAR_MAX_POSTED);
    const int src = t->rank - t->tp_n; /* the same tp rank one stage up */
    for (int k = 0; k < n_mb; k++) {
        int rc = par_recv_post(t->world, k, src, k, t->rbuf + (size_t)off[k] * t->n_embd,
                               (size_t)cnt[k] * (size_t)t->n_embd * sizeof(float), err);
        if (rc)
            return rc;
    }
    return KV_OK;
}

int tp_pp_take(tp_ctx *t, int k, float *d_x, int32_t off, int32_t cnt, kvant_err *err)
{
    int rc = par_recv_wait(t->world, k, err);
    if (rc)
        return rc;
    const float *src = t->rbuf + (size_t)off * t->n_embd;
    const size_t bytes = (size_t)cnt * t->n_embd * sizeof(float);
    if (t->host_mem) {
        memcpy(d_x, src, bytes);
        return KV_OK;
    }
    if ((rc = t->be->ops->upload(t->be, d_x, src, bytes)))
        return kvant_err_set(err, rc, "rank %d: copying a micro-batch to the device failed",
                             t->rank);
    return KV_OK;
}

int tp_pp_give(tp_ctx *t, int k, const float *d_x, int32_t cnt, kvant_err *err)
{
    int rc;
    const size_t bytes = (size_t)cnt * (size_t)t->n_embd * sizeof(float);
    if ((rc = t->be->ops->sync(t->be)))
        return kvant_err_set(err, rc, "backend failed before a stage hand-over");
    if (!t->host_mem) {
        if ((rc = t->be->ops->download(t->be, t->hx, d_x, bytes)))
            return kvant_err_set(err, rc, "rank %d: copying a micro-batch from the device "
                                 "failed", t->rank);
        d_x = t->hx;
    }
    return par_send(t->world, t->rank + t->tp_n, k, d_x, bytes, err);
}

float *tp_pp_rows(tp_ctx *t, float *logits, int32_t row0)
{
    if (t->tp_rank != 0)
        return NULL;
    float *base = t->rank == 0 ? logits : t->plog;
    return base ? base + (size_t)row0 * (size_t)t->n_vocab : NULL;
}

int tp_pp_finish(tp_ctx *t, float *logits, int32_t n_out, kvant_err *err)
{
    const int head = t->pp_n * t->tp_n - t->tp_n; /* the last stage's tp rank 0 */
    const size_t bytes = (size_t)n_out * (size_t)t->n_vocab * sizeof(float);
    if (n_out == 0 || head == 0)
        return KV_OK;
    if (t->rank == head)
        return par_send(t->world, 0, TP_TAG_LOGITS, t->plog, bytes, err);
    if (t->rank != 0)
        return KV_OK;
    int rc = par_recv_post(t->world, PAR_MAX_POSTED - 1, head, TP_TAG_LOGITS, logits, bytes, err);
    return rc ? rc : par_recv_wait(t->world, PAR_MAX_POSTED - 1, err);
}
