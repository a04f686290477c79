/* prune.h - structured pruning: remove whole layers, FFN channels and
 * KV-head groups chosen from calibration statistics, and write the smaller
 * model as a standard GGUF.  Unlike unstructured sparsity, every removed
 * weight is gone from the file, the mapping and (for layers and KV heads)
 * the KV cache.
 *
 * Scores, all from one ordinary forward pass over calibration text (the
 * quant_calib hooks: mean x^2 per matmul input column, plus the rmsnorm
 * observer for the residual stream):
 *   layer il     Block Influence BI = 1 - mean over tokens of
 *                cos(x_in, x_out) (ShortGPT); the lowest BI go first.
 *   FFN channel  |W_down[:, j]|_2 * sqrt(var a_j), a = SwiGLU output:
 *                how much the channel's contribution to the residual
 *                fluctuates (Wanda's |W| * ||X|| over the channel's
 *                weights, with FLAP's centring).
 *   KV group g   sqrt(sum over the columns c of g's query heads of
 *                var att_c * |W_o[:, c]|^2): the same through the output
 *                projection.  Q heads go with their group, so GQA stays
 *                consistent.
 * Bias compensation (FLAP): a removed channel's or head's contribution is
 * replaced by its calibration mean, sum_j W[:, j] * mean(x_j), stored as
 * ffn_down.bias / attn_output.bias (optional tensors kvant and llama.cpp
 * read for llama).  With no_bias the scores use the second moment
 * (mean x^2) instead of the variance and no bias is written.
 * FFN widths are chosen by a global ranking over the kept layers of the
 * scores standardized within each layer (FLAP's adaptive widths: a layer
 * keeps the channels above one threshold; raw scores are not comparable
 * across layers, residual norms grow with depth) or uniformly
 * (ffn_uniform), rounded to multiples of ffn_align so the requantized
 * down projection keeps whole blocks.  KV groups are ranked over all
 * kept layers by their score relative to the mean of their layer's
 * groups (a layer whose attention output rests on few groups keeps them;
 * every layer keeps at least one), so layers end with different KV-head
 * counts (written as per-layer arrays, and the KV pool's rows follow), or
 * removed in equal numbers from every layer (heads_uniform).
 *
 * Refit (optional, prune_refit.h): instead of the mean alone, the kept
 * columns of ffn_down / attn_output and the bias are refit by least
 * squares to reproduce the unpruned output on the calibration activations
 * (the structured form of SparseGPT / OBS error compensation); the refit
 * rows are quantized to the input's type.
 *
 * Quantization is kept: gate/up rows and Q/K/V rows are copied byte for
 * byte (whole rows); a column selection (ffn_down, attn_output) copies
 * whole blocks when the kept columns form whole blocks (heads of 64 in
 * 32-blocks), otherwise dequantizes the row, keeps the columns and
 * requantizes to the same type with the calibration importance (or the
 * quant_fit_type fallback when the new width does not fit the blocks).
 *
 * Ownership: prune_stats_create/destroy and prune_plan_make/free pair;
 * the model and backend are borrowed.  Threading: the thread running the
 * forward pass (CPU backend: the hooks read host memory).
 */
#ifndef KVANT_PRUNE_H
#define KVANT_PRUNE_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "util/err.h"

typedef enum prune_method {
    PRUNE_DEPTH = 1, /* --target-params removes layers */
    PRUNE_WIDTH = 2, /* ... FFN channels */
    PRUNE_BOTH = 3,  /* half of the removal each (layers rounded down) */
} prune_method;

#define PRUNE_MIN_CALIB_TOKENS 256 /* fewer calibration tokens are refused */
#define PRUNE_MIN_FFN_KEEP 0.05    /* no layer keeps fewer FFN channels than this */

typedef struct prune_request {
    double target_params; /* fraction of all parameters kept, (0, 1); 0 = unset */
    int drop_layers;      /* layers to remove; 0 = unset */
    double ffn_keep;      /* fraction of the kept layers' FFN channels kept, (0, 1); 0 = unset */
    double heads_keep;    /* fraction of KV-head groups kept per layer, (0, 1); 0 = unset */
    prune_method method;  /* what target_params removes */
    int ffn_uniform;      /* the same fraction in every layer instead of a global ranking */
    int heads_uniform;    /* the same number of KV groups removed from every layer */
    int ffn_align;        /* FFN widths are multiples of this */
    int no_bias;          /* no bias compensation; score by second moment */
    int refit;            /* least-squares refit of the pruned ffn_down / attn_output
                           * (prune_refit.h); needs prune_stats_track_refit */
    double refit_damp;    /* its ridge, relative to the mean diagonal */
    double refit_shrink;  /* its covariance shrinkage towards the diagonal, [0, 1] */
    int depth_bias;       /* a removed layer's mean output change becomes a bias of the
                           * kept layer before it */
} prune_request;

/* All unset, method PRUNE_DEPTH, global ranking, align 32, bias
 * compensation on, no refit (damping 0.3, no shrinkage when turned on). */
prune_request prune_request_default(void);

/* ---- calibration ---- */
typedef struct prune_stats prune_stats;

prune_stats *prune_stats_create(model *m, kvant_err *err);
void prune_stats_destroy(prune_stats *s);
/* Also records the full input second moments of ffn_down and
 * attn_output (n_ff^2 + n_embd^2 doubles per layer) for the refit; call
 * before the first attach. */
void prune_stats_track_refit(prune_stats *s);
/* While attached, forward passes over m on be record statistics.  Every
 * pass must request logits for all its tokens (the last layer's output is
 * read at output_norm). */
void prune_stats_attach(prune_stats *s, backend *be);
void prune_stats_detach(prune_stats *s, backend *be);
/* Tokens seen by the Block Influence accumulator. */
int64_t prune_stats_tokens(const prune_stats *s);
/* Mean x^2 / mean x per input column of the named matrix
 * (quant_calib_imp / quant_calib_mean). */
const float *prune_stats_imp(prune_stats *s, const char *name, int64_t ne0);
const float *prune_stats_mean(prune_stats *s, const char *name, int64_t ne0);
/* out [n_embd] = mean over tokens of layer il's output minus its input
 * (what the layer adds to the residual stream on average); -1 when
 * unknown. */
int prune_stats_layer_mean(const prune_stats *s, int il, float *out);
/* sum x x^T [ne0][ne0] and its row count (quant_calib_gram), or NULL. */
const double *prune_stats_gram(prune_stats *s, const char *name, int64_t ne0, int64_t *rows);

/* ---- the plan ---- */
typedef struct prune_plan {
    int n_layers;       /* input layers */
    int n_kept;         /* output layers */
    uint8_t *keep;      /* [n_layers] 1 = kept */
    double *bi;         /* [n_layers] Block Influence */
    int32_t n_ff_max;   /* input's widest FFN */
    int32_t *ffn_n;     /* [n_layers] channels kept (the input width when unpruned) */
    int32_t *ffn_idx;   /* [n_layers][n_ff_max] kept channels, ascending (first ffn_n) */
    int32_t n_head_kv;  /* input's most KV heads in a layer (the stride of kv_idx) */
    int32_t *kv_n;      /* [n_layers] KV-head groups kept (the input's when unpruned) */
    int32_t *kv_idx;    /* [n_layers][n_head_kv] kept groups, ascending (first kv_n) */
    uint64_t params_in; /* all tensor elements of the input */
    uint64_t params_out;
    int bias_comp;      /* removed channels / heads replaced by their mean (biases) */
    int refit;          /* kept columns refit by least squares (implies the biases) */
    double refit_damp, refit_shrink;
    int depth_bias;     /* removed layers' mean residual change in the ffn_down.bias of
                         * the kept layer before them */
} prune_plan;

/* Validates rq against m (KV_EINVAL naming the option: nothing to prune,
 * every layer removed, a target that cannot be reached, too little
 * calibration) and chooses what to remove. */
int prune_plan_make(model *m, prune_stats *st, const prune_request *rq, prune_plan *p,
                    kvant_err *err);
void prune_plan_free(prune_plan *p);

typedef struct prune_result {
    uint64_t params_out;
    uint64_t bytes_in, bytes_out; /* tensor bytes */
    int requantized;              /* tensors whose rows were requantized */
} prune_result;

/* Writes the pruned model of m to path atomically (gguf_writer): all
 * metadata copied, block_count / feed_forward_length (an int32 array when
 * widths differ) / head counts (with key_length) updated, layers
 * renumbered.  st gives the importance for requantized rows (may be NULL).
 * On error nothing is left at path. */
int prune_write(const model *m, const prune_plan *p, prune_stats *st, const char *path,
                prune_result *res, kvant_err *err);

#endif
