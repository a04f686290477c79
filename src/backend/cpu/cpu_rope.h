/* cpu_rope.h - the CPU backend's RoPE cos/sin tables for one step.
 *
 * Every layer's q and k rotate by the same angles when the layers share
 * their rope settings (base, scale, factors), so a step computes each
 * setting's table once (cpu_rope_table per token) instead of twice per
 * layer.  Tables exist for steps of up to CPU_ROPE_TOKENS tokens (decode,
 * where the pow/sincos of every call showed in profiles) and for up to
 * CPU_ROPE_SLOTS settings (gemma's local and global bases); past either,
 * the caller computes per call as before.  Same values either way.
 * Ownership: embedded in the backend (no allocation).  Threading: the
 * engine thread fills; jobs only read.
 */
#ifndef KVANT_CPU_ROPE_H
#define KVANT_CPU_ROPE_H

#include "backend/backend.h"
#include "model/model_arch.h"

#define CPU_ROPE_TOKENS 32
#define CPU_ROPE_SLOTS 2

typedef struct cpu_rope_cache {
    int n;                                   /* slots filled this step */
    rope_params key[CPU_ROPE_SLOTS];
    float cs[CPU_ROPE_SLOTS][CPU_ROPE_TOKENS][MODEL_MAX_HEAD_DIM];
} cpu_rope_cache;

/* A new step (begin_batch): every table is stale. */
void cpu_rope_cache_reset(cpu_rope_cache *rc);

/* The table of rp for batch bt's positions, [t][cs] as cpu_rope_table
 * writes it, filled on first use; NULL when bt is longer than
 * CPU_ROPE_TOKENS or every slot holds another setting. */
const float (*cpu_rope_cache_get(cpu_rope_cache *rc, const fwd_batch *bt,
                                 const rope_params *rp))[MODEL_MAX_HEAD_DIM];

#endif
