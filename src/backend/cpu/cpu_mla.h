/* cpu_mla.h - multi-head latent attention's absorbed form on the CPU
 * (backend.h mla_qk / mla_v).
 *
 * The KV cache holds one row per token and layer: the RMS-normed latent
 * (C = n_lora_kv values) then the roped shared key part (R).  A query head
 * becomes a row of the same width, [wk_b[h] q_nope | rope(q_pe)], so the
 * ordinary attention op (one KV head, head_dim C + R, V read from the K row)
 * gives each head the attention-weighted latent; wv_b[h] then maps its first
 * C values to the head's output.  The per-head matmuls go through the
 * backend's matmul (int8 activations included) on row views of the stacked
 * wk_b / wv_b.  Every value depends only on its own token: batch invariant.
 *
 * Memory: scratch is the caller's workspace (cpu_mla_ws_bytes); nothing is
 * allocated here.  Threading: the engine thread; parallel inside the matmuls.
 */
#ifndef KVANT_CPU_MLA_H
#define KVANT_CPU_MLA_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_moe.h"
#include "model/model.h"

/* The shapes the workspace depends on (all zero without latent attention). */
typedef struct cpu_mla_dims {
    int32_t nope, lora_kv, v;
} cpu_mla_dims;

cpu_mla_dims cpu_mla_dims_of(const model *m);
/* Workspace bytes for n_tok tokens (0 without latent attention). */
size_t cpu_mla_ws_bytes(const cpu_mla_dims *d, int32_t n_tok);

typedef struct cpu_mla_env {
    cpu_moe_mm_fn mm;      /* the backend's matmul */
    void *mm_ctx;
    void *ws;              /* cpu_mla_ws_bytes(dims, n) bytes at least, float-aligned */
    const int32_t *pos;    /* [n] the batch positions */
} cpu_mla_env;

/* backend.h mla_qk over n tokens. */
void cpu_mla_qk(const cpu_mla_env *env, const model_layer *L, const rope_params *rp, float eps,
                const float *q, float *kv, float *qa, int32_t n);
/* backend.h mla_v over n tokens. */
void cpu_mla_v(const cpu_mla_env *env, const model_layer *L, const float *att, float *y,
               int32_t n);

#endif
