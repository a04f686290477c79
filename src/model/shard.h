/* shard.h - one rank's share of a model under tensor parallelism.
 *
 * Megatron-style split over n ranks:
 *   - KV heads are split into contiguous groups, each with the query heads
 *     that read it (GQA stays consistent); with more ranks than KV heads
 *     each KV head is replicated on n / n_kv ranks, which split its query
 *     heads.  wq/wk/wv (and qwen2's biases) keep their rows of those heads.
 *   - FFN channels are split into contiguous ranges: w_gate/w_up keep their
 *     rows, w_down its columns.
 *   - wo keeps the columns of the rank's query heads.  wo and w_down yield
 *     partial sums that the forward pass adds over ranks (par/tp.h); the
 *     optional output biases stay on rank 0 only.
 *   - The vocabulary is split: token_embd and the output head keep their
 *     rows [vocab0, vocab0 + n).  The embedding lookup writes zeros for
 *     tokens outside the range (model_tensor.row0) and is summed over ranks
 *     like a partial sum; the head's logit slices are gathered on rank 0.
 * Row slices are views into the mapping (nothing copied); column slices
 * (wo, w_down) are copied into memory from the memory manager
 * (MEM_WEIGHTS, tagged with the layer), so each rank holds and accounts
 * only its own share.  For a backend whose memory is not host memory
 * (CUDA: shard_spec.host_copies) the column copies are made in host memory
 * (malloc) and named by model_tensor.dev like a load-time conversion: the
 * backend uploads them at load_weights and accounts the device copy.  Column cuts fall on the weight type's block
 * boundaries; a model whose heads or FFN width do not split on them is
 * refused with the reason.
 *
 * The model's hparams become the rank's (n_head, n_head_kv, n_ff per
 * layer) and weights_bytes the rank's bytes, so the planner, the KV pool
 * and the activation workspace size themselves per rank unchanged;
 * hp.n_vocab stays the full vocabulary (token ids, logits on rank 0).
 *
 * Ownership: model_shard_apply returns a handle owning the copies;
 * model_shard_free (after the backend's unload_weights, before
 * mem_destroy) frees them and restores the model.  Threading: loading
 * thread only.
 */
#ifndef KVANT_SHARD_H
#define KVANT_SHARD_H

#include <stdint.h>

#include "mem/mem.h"
#include "model/model.h"
#include "util/err.h"

typedef struct shard_range {
    int32_t head0, n_head;   /* query heads */
    int32_t kv0, n_kv;       /* KV heads */
    int32_t vocab0, n_vocab; /* vocabulary rows */
} shard_range;

/* The rank's heads and vocabulary rows; KV_EUNSUP with the reason when
 * the heads cannot be split over n ranks. */
int shard_range_of(const model_hparams *hp, int rank, int n, shard_range *out, kvant_err *err);
/* FFN channels [*ff0, *ff0 + *n_ff) of a layer n_ff wide, cut on multiples
 * of align. */
void shard_ff_range(int32_t n_ff, int32_t align, int rank, int n, int32_t *ff0, int32_t *n_ff_out);

/* Vocabulary rows [*v0, *v0 + *nv) of rank of n. */
void shard_vocab_range(int32_t n_vocab, int rank, int n, int32_t *v0, int32_t *nv);
/* Pipeline stages: stage s of n holds layers [*l0, *l0 + *n_layers). */
void shard_layer_range(int32_t n_layers, int stage, int n, int32_t *l0, int32_t *n_layers_out);

/* Where a process sits: tensor-parallel rank tp_rank of tp_n inside
 * pipeline stage pp_stage of pp_n.  A stage keeps only its layers (the
 * model's layer array and hp.n_layers become the stage's); the embedding
 * stays on the first stage, output_norm and the head on the last (tied:
 * the embedding's vocabulary rows there too); what a stage does not use
 * is absent (nbytes 0, data NULL). */
typedef struct shard_spec {
    int tp_rank, tp_n;
    int pp_stage, pp_n;
    int host_copies; /* 1: column copies in host memory, for a device backend that
                      * uploads them (see above); 0: from the memory manager */
} shard_spec;

typedef struct model_shard model_shard;

/* Restricts m to the share of sp (see above); on failure m is unchanged.
 * mem NULL: shapes, hparams and weights_bytes only, nothing copied (for
 * the planner): the model must not run until model_shard_free. */
model_shard *model_shard_apply(model *m, const shard_spec *sp, mem_mgr *mem, kvant_err *err);
void model_shard_free(model_shard *s);

#endif
