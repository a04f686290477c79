/* cpu_rope.h - the CPU backend's RoPE cos/sin tables for one step.
 *
 * Every layer's q and k rotate by the same angles when the layers share
 * their rope settings (base, scale, factors), so a step computes each
 * setting's table once instead of twice per layer (pow and sincos showed
 * in decode and prefill profiles).  Steps of up to CPU_ROPE_TOKENS tokens
 * use tables embedded in the cache; longer steps (prefill) use `big`,
 * CPU_ROPE_SLOTS tables of big_tokens x big_rot floats the backend
 * allocates with the KV layout (cpu_rope_big_bytes).  Up to CPU_ROPE_SLOTS
 * settings (gemma's local and global bases); past a slot, a step longer
 * than big_tokens or an n_rot above big_rot, the caller computes per call
 * as before.  Same values either way: every table is cpu_rope_table's.
 * Ownership: embedded in the backend; `big` is borrowed (the backend's
 * manager memory).  Threading: the engine thread fills; jobs only read.
 */
#ifndef KVANT_CPU_ROPE_H
#define KVANT_CPU_ROPE_H

#include <stddef.h>

#include "backend/backend.h"
#include "model/model_arch.h"

#define CPU_ROPE_TOKENS 32
#define CPU_ROPE_SLOTS 2

typedef struct cpu_rope_cache {
    int n;                                   /* slots filled this step */
    rope_params key[CPU_ROPE_SLOTS];
    const float *tab[CPU_ROPE_SLOTS];        /* slot i's table, [t][n_rot] */
    float cs[CPU_ROPE_SLOTS][CPU_ROPE_TOKENS * MODEL_MAX_HEAD_DIM];
    float *big;                              /* NULL, or CPU_ROPE_SLOTS x big_tokens x big_rot */
    int32_t big_tokens, big_rot;
} cpu_rope_cache;

/* Bytes of `big` for steps of up to max_tokens tokens and n_rot up to
 * max_rot (0 when the embedded tables cover every step). */
size_t cpu_rope_big_bytes(int32_t max_tokens, int32_t max_rot);

/* A new step (begin_batch): every table is stale. */
void cpu_rope_cache_reset(cpu_rope_cache *rc);

/* The table of rp for batch bt's positions, token t's cos/sin pairs at
 * [t * rp->n_rot], as cpu_rope_table writes them, filled on first use;
 * NULL when no table can hold them (see above). */
const float *cpu_rope_cache_get(cpu_rope_cache *rc, const fwd_batch *bt, const rope_params *rp);

#endif
