/* registry_internal.h - registry/ internal: the registry's state, shared
 * by registry.c (footprints, loads, eviction, KV sharing),
 * registry_lower.c (sleep, unload, keep-alive) and registry_view.c (the
 * read-only views).  registry.c calls neither of the other two.  Every
 * function here is called with r->mu held unless its comment says not. */
#ifndef KVANT_REGISTRY_INTERNAL_H
#define KVANT_REGISTRY_INTERNAL_H

#include <pthread.h>

#include "registry/registry.h"

typedef struct mentry {
    char name[REG_NAME_MAX];
    char path[1024];
    int64_t created;           /* unix time of reg_add (the API's "created") */
    reg_state state;
    int sleep_level;
    int pinned;
    int refs;
    double last_used;
    model *m;                  /* owned; kept while sleeping at level 1 */
    engine *e;                 /* owned while LOADED */
    int32_t max_piece_bytes;   /* tok_max_piece_bytes of the loaded model */
    int64_t ctx;               /* planned context */
    uint64_t need, kv_share;   /* planned bytes: the footprint and its KV part (minimum) */
    uint64_t block_bytes;      /* one KV block, all layers */
    uint64_t kv_max;           /* KV bytes for max_num_seqs requests of the context: the
                                * most a grown pool gets */
    uint64_t kv_extra;         /* fixed pools (no resize): KV granted beyond kv_share at this
                                * load (spare memory) */
    int32_t kv_blocks;         /* elastic pools: the engine's pool now (0 when not loaded) */
    int32_t kv_min_blocks, kv_max_blocks; /* ... its size at load, and the most it may grow to */
    int kv_draining;           /* a shrink stopped above its target: the pool drains */
    uint64_t kv_grows, kv_shrinks;        /* resizes of this model's pools */
    uint64_t resident[MEM_CAT_COUNT];
    engine_stats retired;      /* counters of this model's destroyed engines */
    uint64_t loads, load_failures, evictions, wakes, sleeps, unloads;
    reg_hist load_h, wake_h;
    char error[KV_ERR_MSG_MAX];
} mentry;

struct registry {
    reg_config cfg;
    mem_mgr *mem;
    uint64_t budget;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mentry *ent[REG_MAX];
    int n;
    int changing;              /* a life-cycle change (or KV resize) is running */
    int elastic;               /* KV pools follow the load (kv_grow and a backend that resizes) */
    int draining, stop;
    pthread_t ka_thread;
    int ka_started;
};

/* Seconds on the monotonic clock. */
double reg_now(void);
/* The index of name (NULL or "" = the first), or -1 with err (KV_EINVAL). */
int reg_check_name(registry *r, const char *name, kvant_err *err);
/* Waits on r->cv until signalled or the deadline; 0 once it has passed. */
int reg_wait_until(registry *r, double deadline);
/* Without r->mu: destroys x's engine (and its model unless keep_model),
 * its final counters into fin. */
void reg_drop_entry(mentry *x, int keep_model, engine_stats *fin);
/* t += s (counters; gauges too when gauges). */
void reg_add_stats(engine_stats *t, const engine_stats *s, int gauges);
/* A start-up-style line on stderr unless the registry is quiet. */
void reg_log(const registry *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Grows every loaded pool into an equal part of the free budget. */
void reg_kv_grow_locked(registry *r, const char *why);
/* Bytes x holds now: its resident categories summed. */
uint64_t reg_resident_sum(const mentry *x);
/* KV bytes x's pool holds beyond its share (elastic pools). */
uint64_t reg_kv_grown_bytes(const mentry *x);

#endif
