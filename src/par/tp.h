/* tp.h - tensor parallelism for one forward context: the reductions the
 * forward pass needs, the logit gather, and the commands rank 0 sends to
 * the other ranks.
 *
 * Rank 0 owns everything a user sees (HTTP, tokenizer, scheduler, KV pool
 * bookkeeping); before each step it broadcasts the batch (tokens,
 * positions, sequences, block tables, wanted logit rows) and every rank
 * runs the same step on its share of the weights (model/shard.h) and of
 * the KV cache (its KV heads, same block ids).  Workers (ranks > 0) run
 * tp_worker_run, which executes commands until rank 0 says quit.
 *
 * Reductions are deterministic: a rank's partial sums are exchanged and
 * every rank adds them in rank order, x = ((p0 + p1) + p2) + ..., so all
 * ranks hold bitwise identical activations and a token's result does not
 * depend on what else is batched.  Small messages (decode) use one
 * all-gather; large ones (prefill) an all-to-all of chunks (reduce-scatter),
 * the ordered sum of each chunk on its owner, then an all-gather: the
 * same values with (2/N of the traffic at N > 2).
 *
 * Memory: the exchange buffers come from the backend's memory manager
 * (MEM_ACTIVATIONS); tp_scratch_bytes says how much, for the planner.
 * CPU backend only (device memory is host memory there; a GPU group would
 * exchange through NCCL).
 *
 * Ownership: tp_create borrows the group and the forward context.
 * Threading: the thread that runs the forward pass.
 */
#ifndef KVANT_TP_H
#define KVANT_TP_H

#include <stdint.h>

#include "model/forward.h"
#include "par/par.h"

typedef struct tp_ctx tp_ctx;

typedef struct tp_stats {
    par_stats comm;          /* this rank's collectives */
    uint64_t steps;
    uint64_t tokens;         /* batch tokens of those steps */
    uint64_t reductions;
    double step_seconds;     /* wall time of forward passes on this rank */
} tp_stats;

uint64_t tp_scratch_bytes(int n_ranks, int32_t max_tokens, int32_t max_out, int32_t n_embd,
                          int32_t n_vocab);
/* Allocates the exchange buffers for batches up to max_tokens tokens and
 * max_out logit rows (from be's memory manager). */
tp_ctx *tp_create(par *p, backend *be, int32_t max_tokens, int32_t max_out, int32_t n_embd,
                  int32_t n_vocab, kvant_err *err);
/* Makes f's forward passes tensor-parallel (f->tp = t). */
int tp_attach(tp_ctx *t, fwd_ctx *f, kvant_err *err);
void tp_destroy(tp_ctx *t);
int tp_rank(const tp_ctx *t);
int tp_size(const tp_ctx *t);
void tp_get_stats(const tp_ctx *t, tp_stats *out);

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

/* ---- inside the forward pass (every rank) ---- */
/* d_x[0..count) = sum over ranks of each rank's d_x, in rank order. */
int tp_allreduce(tp_ctx *t, float *d_x, int64_t count, kvant_err *err);
/* d_logits: this rank's [n_out][its vocabulary rows]; on rank 0 logits
 * receives the full [n_out][n_vocab]. */
int tp_gather_logits(tp_ctx *t, const float *d_logits, int32_t n_out, float *logits,
                     kvant_err *err);
/* Counts one forward pass of n_tokens tokens that took `seconds`. */
void tp_note_step(tp_ctx *t, int32_t n_tokens, double seconds);

/* ---- rank 0: commands ---- */
int tp_send_batch(tp_ctx *t, const fwd_batch *b, kvant_err *err);
int tp_send_kv_copy(tp_ctx *t, int32_t dst, int32_t src, kvant_err *err);
/* Tells the workers to return from tp_worker_run. */
int tp_send_quit(tp_ctx *t, kvant_err *err);

/* ---- ranks > 0 ---- */
/* Runs rank 0's commands until quit (KV_OK) or a failure of the group
 * (its error). */
int tp_worker_run(tp_ctx *t, kvant_err *err);

#endif
