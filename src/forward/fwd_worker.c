/* fwd_worker.c - the worker loop of ranks > 0 (see fwd_worker.h). */
#include "forward/fwd_worker.h"

int fwd_worker_run(fwd_ctx *f, tp_ctx *t, kvant_err *err)
{
    KV_ASSERT(f->tp == t);
    for (;;) {
        tp_cmd cmd;
        fwd_batch b;
        int rc = tp_recv_cmd(t, &cmd, &b, err);
        if (rc)
            return rc;
        switch (cmd.op) {
        case TP_CMD_RUN:
            if ((rc = fwd_run_shard(f, &b, NULL, err)))
                return rc;
            break;
        case TP_CMD_KV_COPY:
            if (cmd.dst < 0 || cmd.dst >= f->kv.n_blocks || cmd.src < 0 ||
                cmd.src >= f->kv.n_blocks)
                return kvant_err_set(err, KV_EINVAL, "rank %d: block copy %d <- %d out of range",
                                     tp_rank(t), cmd.dst, cmd.src);
            f->be->ops->kv_copy_block(f->be, cmd.dst, cmd.src);
            break;
        case TP_CMD_QUIT:
            return KV_OK;
        }
    }
}
