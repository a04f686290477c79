/* batch.h - one forward pass's batch: tokens, their positions and
 * sequences, each sequence's block table into the paged KV pool, and the
 * rows whose logits are wanted.  Plain data, header only, below everything
 * that carries a batch: the engine builds one per step (phase_build), the
 * backend reads it (begin_batch), the forward pass runs it and, under
 * --tp/--pp, par/ sends it to the other ranks and rebuilds it there.
 *
 * Ownership: a batch borrows every array it points to; whoever builds it
 * keeps them alive for the pass.
 */
#ifndef KVANT_BATCH_H
#define KVANT_BATCH_H

#include <stdint.h>

typedef struct fwd_seq {
    const int32_t *block_table; /* [n_blocks] physical block ids (host) */
    int32_t n_blocks;
    /* the window layer group's table (kv_layout.n_blocks_w > 0), else NULL;
     * entries below the window of every position in the batch may be
     * KVSEQ_DROPPED (-1): the window layers never read them */
    const int32_t *block_table_w; /* [n_blocks_w] */
    int32_t n_blocks_w;
    /* A KV budget (sinks + a recent window; at most BACKEND_KV_BUDGET_BLOCKS
     * entries read, backend.h):
     * the token at position p reads its sequence's first kv_sink_blocks
     * blocks and the blocks from max(kv_sink_blocks, (p - kv_recent + 1) /
     * block_size) on; entries between may be KVSEQ_DROPPED.  Rope keeps the
     * original positions.  kv_recent 0: no budget, every block read. */
    int32_t kv_sink_blocks;
    int32_t kv_recent;
    /* A KV budget's scores (backend.h kv_score; snapkv, h2o): each token at
     * a position >= snap_from adds, per layer il and KV head h, its
     * attention probabilities (summed over the head's query heads) of the
     * rows it reads, index i < snap_n in reading order, to
     * snap_score[(il * n_kv_heads + h) * snap_n + i].  NULL: none.
     * snap_tmp: [n_heads][snap_tmp_n] floats the backend uses meanwhile
     * (query head j's row, snap_tmp_n >= the rows any of its tokens reads). */
    float *snap_score, *snap_tmp;
    int32_t snap_from, snap_n, snap_tmp_n;
    /* Hybrid models: the recurrent-state slot this sequence computes in, and
     * n_state_snap pairs (p, slot): after the token at position p - 1 its state
     * is also copied into that slot (a snapshot for the prefix cache). */
    int32_t state_slot;
    const int32_t *state_snap; /* [n_state_snap][2] */
    int32_t n_state_snap;
} fwd_seq;

typedef struct fwd_batch {
    int32_t n_tokens;
    const int32_t *tokens; /* [n_tokens] */
    const int32_t *pos;    /* [n_tokens] position of each token in its sequence */
    const int32_t *seq;    /* [n_tokens] index into seqs */
    int32_t n_seqs;
    const fwd_seq *seqs;   /* [n_seqs] */
    int32_t n_out;
    const int32_t *out;    /* [n_out] token indices whose logits are wanted */
    int32_t want_hidden;   /* 1: the out rows' final hidden states (after the output
                            * norm) too, into fwd_ctx.h_hidden (one process only) */
} fwd_batch;

#endif
