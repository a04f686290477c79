/* registry_plan.h - the registry's memory arithmetic as functions of
 * numbers alone: a model's footprint from its GGUF header, the budget, the
 * KV a fixed pool takes beyond its share at load, the growth of elastic
 * pools into free memory, the shrink of grown pools that makes room for a
 * load, and the start-up of `kvant serve -m a -m b --pin/--load ...`
 * played out from those.  registry.c allocates with them and `kvant plan`
 * prints them, so the plan and the allocation cannot drift.
 *
 * Everything here is pure (no registry state, no locks) except
 * reg_plan_footprint (reads a header) and reg_plan_scratch (asks a
 * backend), which touch no shared state either.
 * Threading: any thread.
 */
#ifndef KVANT_REGISTRY_PLAN_H
#define KVANT_REGISTRY_PLAN_H

#include <stdint.h>

#include "engine/engine.h"
#include "mem/mem.h"
#include "util/err.h"

#define REG_MAX 64                    /* known models */
#define REG_MAX_RESIDENT MEM_MAX_POOLS /* engines at once (one KV pool each) */
#define REG_DEFAULT_KV_REQS 2         /* default KV share: requests of max context */

/* A model's footprint in the shared budget, from its header (as one engine
 * plans it with the memory of exactly this footprint). */
typedef struct reg_footprint {
    int64_t ctx;            /* planned context (tokens) */
    int32_t head_dim;       /* for the backend's attention scratch */
    uint64_t weights;       /* weight bytes as stored */
    uint64_t activations;   /* the activation workspace (MEM_ACTIVATIONS) */
    uint64_t act_q8;        /* int8 activations (MEM_WORKSPACE), 0 off the CPU or --exact */
    uint64_t block_bytes;   /* one KV block, all layers */
    uint64_t kv_share;      /* the KV share: the least KV it loads with, whole blocks */
    uint64_t kv_max;        /* KV of max_num_seqs requests of the context: the most a
                             * grown pool gets */
    uint64_t state;         /* a hybrid model's recurrent-state slots (MEM_STATE), 0 else */
    uint64_t need;          /* weights + activations + act_q8 + state + kv_share */
} reg_footprint;

/* The footprint of the model at path under ec (block size, context,
 * sequences, batch, KV dtype, backend, exact) with kv_per_model bytes of
 * KV share (0: REG_DEFAULT_KV_REQS requests of the context).  Reads the
 * header only.  Errors: KV_EIO / KV_EFORMAT (file), KV_ENOMEM (a share
 * below one request of the context), as plan_compute. */
int reg_plan_footprint(const char *path, const engine_config *ec, uint64_t kv_per_model,
                       reg_footprint *out, kvant_err *err);

/* The budget of all models: budget if given, else device memory (the
 * option, else the device's dev_total) times the utilization. */
uint64_t reg_plan_budget(uint64_t budget, uint64_t device_memory, uint64_t dev_total,
                         double utilization);

/* Fixed pools: KV a load takes beyond its share, an equal part of what no
 * model could need (avail less reserve, the footprints of the k models not
 * loaded that could fit, this one included), whole blocks, up to kv_max. */
uint64_t reg_plan_spare(uint64_t avail, uint64_t reserve, uint64_t k, const reg_footprint *f);

/* One loaded elastic pool. */
typedef struct reg_plan_pool {
    int32_t blocks;         /* now */
    int32_t min_blocks;     /* at load (its share less the held blocks) */
    int32_t max_blocks;     /* the most it may grow to */
    uint64_t block_bytes;
    int busy;               /* requests in flight */
    double last_used;       /* LRU key: smaller = older */
    int skip;               /* not a candidate (reclaim: the model being loaded) */
} reg_plan_pool;

/* Growth into avail free bytes: every pool below its maximum gets an equal
 * part, whole blocks, up to its maximum; add[i] blocks for pool i. */
void reg_plan_grow(uint64_t avail, const reg_plan_pool *p, int n, int32_t *add);
/* Shrinks that give deficit bytes back: grown pools (blocks > min_blocks,
 * not skip), idle ones first, then least recently used, each by what is
 * still missing up to what it grew.  idx[k], cut[k] for k < the count
 * returned (each pool once). */
int reg_plan_reclaim(const reg_plan_pool *p, int n, uint64_t deficit, int *idx, int32_t *cut);

/* What the backend of ec allocates beside a KV pool of a model with this
 * head dimension: *extra, its bound (backend kv_extra_bytes), for which
 * the engine holds back whole blocks of the pool, and *alloc, the
 * MEM_WORKSPACE bytes its kv_init takes (the attention scratch) besides
 * the int8 activations.  A mixture-of-experts model's expert workspace is
 * not included (it is sized from the loaded weights).  Creates, asks and
 * destroys a backend. */
int reg_plan_scratch(const engine_config *ec, int32_t head_dim, uint64_t *extra, uint64_t *alloc,
                     kvant_err *err);

/* ---- the eviction policy (pure; unit-tested) ---- */
typedef struct reg_cand {
    uint64_t bytes;        /* resident bytes */
    double last_used;      /* LRU key: smaller = older */
    int loaded;            /* holds memory and an engine slot */
    int busy;              /* requests in flight: not a victim now */
    int pinned;            /* never a victim */
} reg_cand;

enum { SRV_FIT_OK = 0, SRV_FIT_WAIT = 1, SRV_FIT_NEVER = 2 };

/* Which loaded models to evict so that need bytes fit in budget (used =
 * the bytes in use now) and a resident slot is free: idle unpinned models
 * in least-recently-used order, only as many as needed.  SRV_FIT_OK with
 * victims[0..*n_victims) (maybe none); SRV_FIT_WAIT when it would fit once
 * busy models go idle; SRV_FIT_NEVER when pinned models and the budget
 * leave too little whatever happens. */
int reg_pick(const reg_cand *c, int n, uint64_t need, uint64_t budget, uint64_t used,
                    int max_resident, int *victims, int *n_victims);

/* ---- start-up played out: --pin and --load in serve's order ---- */

typedef struct reg_plan_model {
    reg_footprint f;
    int ok;                 /* the footprint was planned (else it never loads) */
    uint64_t scratch;       /* reg_plan_scratch for it: the bound (held blocks) */
    uint64_t scratch_alloc; /* ... and what kv_init allocates (MEM_WORKSPACE) */
} reg_plan_model;

typedef struct reg_plan_state {
    int loaded, pinned, evicted;
    int32_t kv_blocks, kv_min_blocks, kv_max_blocks;
    uint64_t kv_extra;                /* fixed pools: KV granted beyond the share */
    uint64_t resident[MEM_CAT_COUNT]; /* bytes by category while loaded */
} reg_plan_state;

typedef struct reg_plan_start_in {
    const reg_plan_model *m;
    int n;
    const int *order;       /* model indices in serve's order: pins, then loads */
    const int *pin;         /* pin[k]: order[k] is pinned */
    int n_order;
    uint64_t budget;
    int kv_grow;            /* pools may take free memory (no --no-kv-grow) */
    int elastic;            /* kv_grow and a backend that resizes pools (the CPU's) */
} reg_plan_start_in;

/* Plays the start-up out: each load as the registry admits it (evicting
 * idle unpinned models in LRU order, shrinking grown pools first), each
 * followed by the growth of every elastic pool.  out[0..n) the state at
 * the end, *used the bytes in use.  KV_OK, or KV_ENOMEM with the failing
 * model's index in *failed and a message (serve would exit). */
int reg_plan_start(const reg_plan_start_in *in, reg_plan_state *out, uint64_t *used, int *failed,
                   kvant_err *err);

#endif
