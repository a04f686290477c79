/* cpu_moe.h - the mixture-of-experts FFN on the CPU (backend.h moe_ffn).
 *
 * One call runs a layer's experts over a step's tokens: router logits,
 * softmax, top-k per token (ties: the lower expert index), then the
 * tokens grouped by expert so that each expert's rows are read once per
 * step (its gathered tokens go through the backend's matmul, int8
 * activations included), and each token's (slot) outputs combined in slot
 * order.  Every value a token gets depends only on its own row, never on
 * the other tokens of the step: batch invariance stays bitwise.
 *
 * Memory: all scratch is the caller's workspace (cpu_moe_ws_bytes for the
 * step's token count); nothing is allocated here.  Threading: called by
 * the engine thread; parallelism is inside the matmul callback.
 */
#ifndef KVANT_CPU_MOE_H
#define KVANT_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"
#include "model/xcache.h"

/* The widest layer's expert shape (the workspace's size). */
typedef struct cpu_moe_dims {
    int32_t n_embd, n_expert, n_used, n_ff_exp, n_ff_shexp;
} cpu_moe_dims;

/* The shape of m's widest expert layer (all zero for a dense model). */
cpu_moe_dims cpu_moe_dims_of(const model *m);
/* Workspace bytes for n_tok tokens (0 for a dense model). */
size_t cpu_moe_ws_bytes(const cpu_moe_dims *d, int32_t n_tok);

/* y[i] = W[i] x (+ bias[i] where bias and bias[i] are not NULL) for i < count
 * over n rows of x: the backend's matmul_n (same results as its matmul; ctx
 * is the backend). */
typedef void (*cpu_moe_mm_fn)(void *ctx, int count, const model_tensor *const *W,
                              const model_tensor *const *bias, const float *x, float *const *y,
                              int32_t n);

/* y[i] = W[i] x[i] (+ bias[i]) over n[i] rows of x[i] for i < count, as one
 * job (the backend's grouped matmul, same results as one matmul each). */
typedef void (*cpu_moe_mmg_fn)(void *ctx, int count, const model_tensor *const *W,
                               const model_tensor *const *bias, const float *const *x,
                               float *const *y, const int32_t *n);

/* Up to this many (token, expert) pairs a step runs its experts as grouped
 * jobs (one dispatch for all experts' gate/up, one for their down); larger
 * steps run each expert alone (its own rows are long enough to split). */
#define CPU_MOE_GROUP_ROWS 256
#define CPU_MOE_GROUP_EXPERTS 16 /* experts per grouped job */

typedef struct cpu_moe_env {
    cpu_moe_mm_fn mm;
    void *mm_ctx;
    void *ws;          /* cpu_moe_ws_bytes(dims, n) bytes at least, float-aligned */
    cpu_moe_mmg_fn mm_group; /* NULL: every expert alone */
    struct xcache *xc;       /* experts from the cache (model/xcache.h), or NULL: resident */
    xcache_par par;          /* the pool the cache's misses are read on side by side */
    void (*swiglu)(const float *gate, const float *up, float *out, int64_t n); /* FFN_SWIGLU's
                                                                                * (cpu_ops.h) */
} cpu_moe_env;

/* x[t] += MoE_L(h[t]) for t < n (backend.h moe_ffn).  KV_OK, or the expert
 * cache's error (KV_EIO: a short read) with x partly updated. */
int cpu_moe_ffn(const cpu_moe_env *env, const model_layer *L, const moe_params *mp,
                const float *h, float *x, int32_t n, kvant_err *err);

/* Row view [row0, row0 + rows) of a stacked tensor (experts, heads), at its
 * backend copy (packed or not: rows keep their row_bytes). */
model_tensor cpu_moe_rows(const model_tensor *t, int64_t row0, int64_t rows);

/* The top k of p[0..n_expert) into sel[0..k) (largest first, ties: lower
 * index first) and their values into w. */
void cpu_moe_topk(const float *p, int32_t n_expert, int32_t k, int32_t *sel, float *w);

#endif
