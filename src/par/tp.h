/* tp.h - model parallelism for one forward context: tensor parallelism
 * (--tp: the reductions the forward pass needs, the logit gather) and
 * pipeline parallelism (--pp: each stage runs its layers and hands the
 * activations to the next), and the commands rank 0 sends to the others.
 *
 * Ranks: world rank r = stage * tp_n + tp rank (tp_spec_of).  Rank 0 owns
 * everything a user sees (HTTP, tokenizer, scheduler, KV pool
 * bookkeeping); before each step it broadcasts the batch (tokens,
 * positions, sequences, block tables, wanted logit rows) to every rank,
 * and every rank runs the step on its share of the weights
 * (model/shard.h) and of the KV cache (its KV heads of its stage's layers,
 * same block ids everywhere).  Workers (ranks > 0) take rank 0's commands
 * one at a time with tp_recv_cmd and carry them out themselves (the loop
 * is forward/fwd_worker.c): par/ moves batches and reduces activations,
 * it never calls the forward pass.
 *
 * Reductions are deterministic: a rank's partial sums are exchanged
 * inside its stage and every rank adds them in rank order,
 * x = ((p0 + p1) + p2) + ..., so all ranks of a stage hold bitwise
 * identical activations and a token's result does not depend on what else
 * is batched.  Small messages (decode) use one all-gather; large ones
 * (prefill) an all-to-all of chunks (reduce-scatter), the ordered sum of
 * each chunk on its owner, then an all-gather: the same values.
 *
 * Pipeline: a step's tokens are cut into up to pp_n micro-batches
 * (contiguous ranges, so a sequence's tokens stay in position order); a
 * stage hands each one on as soon as it is done, so stage s computes
 * micro-batch k while stage s+1 computes k-1.  Receives are posted at the
 * start of the step.  The last stage's tp rank 0 sends the logits to rank 0.
 *
 * Memory: the exchange buffers come from the backend's memory manager
 * (MEM_ACTIVATIONS); tp_scratch_bytes bounds them, for the planner.
 * Device backends (CUDA, tp_dev.c): one GPU per rank; the reductions run
 * on the device over NCCL (the same rank-order sum, in a kernel), or
 * through host memory and MPI when ranks share a GPU; the logit gather and
 * the stage hand-overs always stage through host buffers and MPI.  With
 * KVANT_TP_HOST_STAGING=1 in the environment the CPU backend takes that
 * path too (the reductions through host buffers and MPI), which the tests
 * compare bitwise with the direct one.
 *
 * Ownership: tp_create borrows the group and the backend.  Threading: the
 * thread that runs the forward pass.
 */
#ifndef KVANT_TP_H
#define KVANT_TP_H

#include <stdint.h>

#include "backend/backend.h"
#include "batch/batch.h"
#include "model/shard.h"
#include "par/par.h"
#include "par/tp_types.h"


/* Where world rank `rank` of `size` sits with tp_n ranks per stage. */
void tp_spec_of(int rank, int tp_n, int size, shard_spec *out);
/* Device memory a GPU rank holds back for NCCL's own buffers when it plans
 * (an estimate, not measured; what NCCL takes is measured and reserved in
 * the memory manager at tp_create, and a rank over budget fails then). */
#define TP_NCCL_ALLOWANCE ((uint64_t)1 << 30)
/* An upper bound of the exchange buffers of any rank. */
uint64_t tp_scratch_bytes(int tp_n, int pp_n, int32_t max_tokens, int32_t max_out,
                          int32_t n_embd, int32_t n_vocab);
/* Splits world into stages of tp_n ranks and allocates this rank's
 * buffers for batches up to max_tokens tokens and max_out logit rows (a
 * device backend's at tp_attach). */
tp_ctx *tp_create(par *world, int tp_n, backend *be, int32_t max_tokens, int32_t max_out,
                  int32_t n_embd, int32_t n_vocab, kvant_err *err);
/* Readies t for a forward pass of batches up to max_tokens tokens and
 * max_out logit rows (within tp_create's; a worker refuses larger batch
 * commands); the forward pass then takes t (forward.h fwd_set_tp).  On a
 * device backend this is where the exchange is set up (buffers, the
 * choice of transport, the NCCL communicator): a collective of every rank,
 * called after tp_agree succeeded. */
int tp_attach(tp_ctx *t, int32_t max_tokens, int32_t max_out, kvant_err *err);
void tp_destroy(tp_ctx *t);
int tp_rank(const tp_ctx *t);  /* in the world */
void tp_get_stats(const tp_ctx *t, tp_stats *out);
/* 1 once the group failed (a rank died, hung or left): nothing more can run. */
int tp_failed(const tp_ctx *t);

/* Start-up agreement, one collective on every rank: each rank brings its
 * set-up status (rc, with the message in local), a fingerprint of the
 * model and options (tp_fingerprint) and the KV blocks it can hold.  Fails
 * on every rank when any rank failed (naming it and its reason) or any
 * fingerprint differs from rank 0's; otherwise *n_blocks becomes the
 * smallest over ranks. */
#define TP_FP_BYTES 32
int tp_agree(par *p, int rc, const kvant_err *local, const uint8_t fp[TP_FP_BYTES],
             int32_t *n_blocks, kvant_err *err);
/* SHA-256 over the unsplit model (model_hash.h) and opts[0..n_opts). */
void tp_fingerprint(model *m, const int64_t *opts, int n_opts, uint8_t out[TP_FP_BYTES]);
/* Every rank: gathers `bytes` of each rank's report on rank 0 into
 * out[r * bytes ...] (out may be NULL elsewhere). */
int tp_gather_report(tp_ctx *t, const void *mine, void *out, size_t bytes, kvant_err *err);

/* ---- inside the forward pass ---- */
/* d_x[0..count) = sum over the stage's ranks of each one's d_x, in rank
 * order (nothing to do with one rank per stage). */
int tp_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err);
/* d_logits: this rank's [n_out][its vocabulary rows]; the stage's tp rank 0
 * receives the full [n_out][n_vocab] in logits. */
int tp_gather_logits(tp_ctx *t, const float *d_logits, int32_t n_out, float *logits,
                     kvant_err *err);
/* Counts one forward pass of n_tokens tokens that took `seconds`. */
void tp_note_step(tp_ctx *t, int32_t n_tokens, double seconds);

/* ---- pipeline stages (tp_pipe.c; pp_n > 1) ---- */
int tp_pp_n(const tp_ctx *t);
int tp_pp_first(const tp_ctx *t);
int tp_pp_last(const tp_ctx *t);
/* Stages > 0: posts the receives of a step's n_mb micro-batches
 * (off[k], cnt[k] tokens). */
int tp_pp_post(tp_ctx *t, int n_mb, const int32_t *off, const int32_t *cnt, kvant_err *err);
/* Stages > 0: micro-batch k's activations from the previous stage into d_x. */
int tp_pp_take(tp_ctx *t, int k, float *d_x, int32_t off, int32_t cnt, kvant_err *err);
/* Not the last stage: micro-batch k's activations to the next stage. */
int tp_pp_give(tp_ctx *t, int k, const float *d_x, int32_t cnt, kvant_err *err);
/* The last stage: where rows [row0, ...) of the step's logits go (the
 * caller's logits on rank 0, else a staging buffer; NULL on tp ranks > 0). */
float *tp_pp_rows(tp_ctx *t, float *logits, int32_t row0);
/* After the step: the last stage's tp rank 0 sends n_out logit rows to
 * rank 0, which receives them into logits. */
int tp_pp_finish(tp_ctx *t, float *logits, int32_t n_out, kvant_err *err);
/* A micro-batch's output row indices ([max_out] scratch). */
int32_t *tp_pp_out_scratch(tp_ctx *t);

/* ---- rank 0: commands (tp_cmd.c) ---- */
int tp_send_batch(tp_ctx *t, const fwd_batch *b, kvant_err *err);
int tp_send_kv_copy(tp_ctx *t, int32_t dst, int32_t src, kvant_err *err);
/* Tells the workers to stop taking commands. */
int tp_send_quit(tp_ctx *t, kvant_err *err);

/* ---- ranks > 0 (tp_cmd.c) ---- */
typedef enum tp_cmd_op {
    TP_CMD_RUN = 1,     /* run the batch on this rank's share */
    TP_CMD_KV_COPY = 2, /* copy KV block src into block dst */
    TP_CMD_QUIT = 3,    /* rank 0 is done: return */
} tp_cmd_op;

typedef struct tp_cmd {
    tp_cmd_op op;
    int32_t dst, src;   /* TP_CMD_KV_COPY: block ids, not checked against a pool */
} tp_cmd;

/* Waits for rank 0's next command.  TP_CMD_RUN fills b, which points into
 * t's buffers until the next tp_recv_cmd (sizes checked against
 * tp_attach's limits, the layout of the block tables too; token ids and
 * positions are left to the forward pass).  A failure of the group, or a
 * malformed or unknown command, returns its error. */
int tp_recv_cmd(tp_ctx *t, tp_cmd *cmd, fwd_batch *b, kvant_err *err);

#endif
