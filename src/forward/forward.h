/* forward.h - the Llama-family forward pass, written once against the
 * backend ops (backend/backend.h), over a batch (batch/batch.h).
 *
 * A fwd_ctx owns the activation workspace, sized at init for the largest
 * batch (max_tokens tokens, max_out logit rows) and allocated through the
 * backend's memory manager (MEM_ACTIVATIONS); fwd_run allocates nothing.
 * Under --tp/--pp (fwd_set_tp) the pass calls down into par/tp.h for the
 * reductions, the logit gather and the stage hand-overs; the other ranks
 * run fwd_worker.h's loop.
 * Ownership: fwd_init/fwd_free pair; model, backend and tp_ctx are
 * borrowed.  Threading: one thread (the engine thread) per fwd_ctx.
 */
#ifndef KVANT_FORWARD_H
#define KVANT_FORWARD_H

#include "backend/backend.h"
#include "batch/batch.h"
#include "model/model.h"

typedef struct fwd_ctx {
    model *m;
    backend *be;
    int32_t max_tokens;
    int32_t max_out;
    void *d_base;     /* the whole workspace, carved by plan_activation_layout */
    float *d_x, *d_h, *d_q, *d_k, *d_v, *d_att, *d_gate, *d_up; /* [max_tokens][...] */
    float *d_logits;  /* [max_out][n_vocab] */
    rope_params rope;
    kv_layout kv;     /* the paged KV storage this context writes */
    int32_t max_window; /* the widest layer window (0: none) */
    struct tp_ctx *tp; /* tensor parallelism (par/tp.h) or NULL; borrowed, set by
                        * fwd_set_tp */
    float *h_hidden;  /* host [max_out][n_embd], borrowed, set by the caller: where a
                       * batch with want_hidden gets its out rows' normed hidden states */
} fwd_ctx;

/* Activation workspace bytes for a batch shape: the planner's
 * plan_activation_bytes, whose layout fwd_init carves, so plan and
 * allocation agree by construction. */
uint64_t fwd_workspace_bytes(const model_hparams *hp, int64_t max_tokens, int64_t max_out);

/* Allocates the workspace and the backend's KV storage for layout kv
 * (n_layers, n_kv_heads and head_dim are taken from the model). */
int fwd_init(fwd_ctx *f, model *m, backend *be, int32_t max_tokens, int32_t max_out,
             const kv_layout *kv, kvant_err *err);
/* A kv_layout for this model with n_blocks blocks of block_size tokens
 * (layer_window marks its window layers; n_blocks_w is 0: one group, the
 * caller sets it to give the window layers their own group). */
kv_layout fwd_kv_layout(const model *m, int32_t n_blocks, int32_t block_size, uint32_t kv_dtype);
void fwd_free(fwd_ctx *f);
/* Makes f's passes parallel over t (tp_attach'ed with f's max_tokens and
 * max_out), or serial again with NULL; call with NULL before tp_destroy. */
void fwd_set_tp(fwd_ctx *f, struct tp_ctx *t);

/* Validates the batch (token ids, positions, table coverage), runs it, and
 * copies logits [n_out][n_vocab] to host memory.  On error nothing in the
 * KV cache outside the batch's own slots has changed. */
int fwd_run(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err);
/* The same on this rank only: under tensor parallelism fwd_run (rank 0)
 * first sends the batch to the other ranks, whose workers call this;
 * logits is written on rank 0 only (NULL elsewhere). */
int fwd_run_shard(fwd_ctx *f, const fwd_batch *b, float *logits, kvant_err *err);

#endif
