/* fwd_worker.h - a rank > 0 of a --tp/--pp group: runs rank 0's commands
 * (par/tp.h tp_recv_cmd) on this rank's share until rank 0 says quit.
 *
 * Rank 0's fwd_run sends each batch before running it; here every other
 * rank receives it and runs the same pass (fwd_run_shard) on its weights
 * and its KV heads, and mirrors rank 0's KV block copies.
 * Ownership: f and t are borrowed.  Threading: the thread that runs f.
 */
#ifndef KVANT_FWD_WORKER_H
#define KVANT_FWD_WORKER_H

#include "forward/forward.h"
#include "par/tp.h"

/* f runs over t (fwd_set_tp(f, t) done, tp_attach'ed with f's limits).
 * Returns KV_OK on rank 0's quit, else the first error: a failure of the
 * group, a malformed command, a block copy outside f's KV pool, a failed
 * pass (the group cannot go on after any of them). */
int fwd_worker_run(fwd_ctx *f, tp_ctx *t, kvant_err *err);

#endif
