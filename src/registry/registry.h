/* registry.h - several models in one memory budget: the model
 * registry of `kvant serve -m a.gguf -m b.gguf` / --models-dir.
 *
 * Every known model has a name, a file, and a footprint computed from its
 * GGUF header alone before it is admitted (the planner, as `kvant plan`:
 * weights + activation workspace + int8 activations + its KV share in
 * whole blocks).  All engines allocate from ONE memory manager whose budget
 * covers them all, so memory is never over the budget: a load is admitted
 * only when its footprint fits in what is free after evicting idle,
 * unpinned models in least-recently-used order, and the manager itself
 * refuses any byte beyond the budget.
 *
 * States: unloaded -> loading -> loaded -> (sleeping | unloading ->
 * unloaded); failed (bad file, or the load failed; /load retries).
 * Sleep level 1 drops the engine (KV, workspace, device weights) and keeps
 * the mapped model (page cache, tokenizer); level 2 drops the model too.
 *
 * KV follows the load: each model's pool is at least its share, and every
 * block goes back to the budget when the model sleeps or unloads.  With a
 * backend that resizes pools (the CPU's; kv_grow on), a load, unload or
 * sleep ends by growing every loaded pool into an equal part of the free
 * budget (up to max_num_seqs requests of the context), and a load that
 * does not fit first shrinks grown pools back (idle models first, only
 * blocks nobody holds; a held tail drains) before any model is evicted or
 * the request waits.  Otherwise (CUDA) a load takes an equal part of the
 * memory that no model not loaded could need, fixed until it unloads.
 *
 * Invariants: a model with requests in flight (refs > 0) is never evicted,
 * slept or unloaded (unload/sleep answer KV_EBUSY); one life-cycle change
 * (load, wake, sleep, unload, eviction) runs at a time, so each model's
 * resident bytes are measured exactly as the manager's change across its
 * load; a model that cannot fit even with every evictable model gone is
 * refused at once with the bytes it needs (no evict/reload loop).
 *
 * Ownership: reg_create returns a heap handle freed by
 * reg_destroy (after the HTTP daemon stopped), which destroys every
 * engine and model and then the shared manager.  A reg_ref borrows
 * the model, engine and name until reg_release.
 * Threading: every function is thread-safe (one mutex; loads and engine
 * teardown run outside it); a keep-alive thread unloads idle models.
 */
#ifndef KVANT_REGISTRY_H
#define KVANT_REGISTRY_H

#include <stdint.h>

#include "engine/engine.h"
#include "mem/mem.h"
#include "registry/registry_plan.h"
#include "util/err.h"

#define REG_NAME_MAX 128
#define REG_QUEUE_TIMEOUT_S 60.0      /* --queue-timeout default */
#define REG_HIST_N 10                 /* duration histogram buckets (+Inf last) */
#define REG_KV_RESIZE_TIMEOUT_S 2.0   /* wait for an engine's step boundary to resize */

typedef enum reg_state {
    REG_UNLOADED = 0,
    REG_LOADING,
    REG_LOADED,
    REG_SLEEPING,
    REG_UNLOADING,
    REG_FAILED,
    REG_STATE_COUNT
} reg_state;

const char *reg_state_name(reg_state s);

typedef struct reg_config {
    engine_config ec;       /* for every model (shared_mem and print_plan are set here) */
    uint64_t budget;        /* bytes for all models together; 0 = the device's, times
                             * ec.memory_utilization (as one engine would plan) */
    uint64_t kv_per_model;  /* KV share per model in bytes (whole blocks, rounded down);
                             * 0 = REG_DEFAULT_KV_REQS requests of the max context */
    int kv_grow;            /* 1 (default): pools grow into free memory, up to max_num_seqs
                             * requests of the context (see "KV follows the load" above);
                             * 0: every pool is exactly its share */
    double keep_alive_s;    /* unload a model idle this long; <= 0: never */
    double queue_timeout_s; /* how long a request waits for its model to load */
    int log;                /* event lines on stderr (load, evict, sleep, ...) */
} reg_config;

reg_config reg_config_default(void);

typedef struct registry registry;

/* Creates the shared memory manager.  NULL + err on a bad budget. */
registry *reg_create(const reg_config *cfg, kvant_err *err);
void reg_destroy(registry *r);

/* Registers a model (name NULL = the file name without .gguf).  Reads the
 * header and computes its footprint; a file that cannot be read or planned
 * is still registered, as failed with its error (returned in err, rc
 * KV_OK).  Errors: KV_EINVAL (duplicate or bad name), KV_ERANGE (too many). */
int reg_add(registry *r, const char *name, const char *path, kvant_err *err);
/* The name reg_add gives a model registered without one: the file name
 * without its directory and .gguf. */
void reg_name_from_path(const char *path, char *out, size_t cap);
/* Registers every *.gguf in dir (sorted by name); KV_EIO if unreadable. */
int reg_add_dir(registry *r, const char *dir, kvant_err *err);
/* Marks a model pinned: loaded now, never evicted or unloaded by keep-alive. */
int reg_pin(registry *r, const char *name, kvant_err *err);
/* Starts the keep-alive thread. */
int reg_start(registry *r, kvant_err *err);
/* Draining: no more loads; engine_drain on every loaded engine. */
void reg_drain(registry *r);

typedef struct reg_ref {
    model *m;                 /* borrowed until release */
    engine *e;
    const char *name;         /* the model's name in the API */
    int64_t max_model_len;    /* its planned context */
    int32_t max_piece_bytes;  /* its longest token piece (tok_max_piece_bytes) */
    int idx;                  /* internal */
} reg_ref;

/* The model named name (NULL or "" = the first registered) with a
 * reference held: loads or wakes it if needed, evicting idle models in LRU
 * order; waits (up to queue_timeout_s) while busy models hold the memory
 * it needs or another life-cycle change runs.  Errors: KV_EINVAL (unknown
 * name: 404), KV_ENOMEM (can never fit; the message gives the bytes),
 * KV_EBUSY (timed out, or draining), KV_EFORMAT / KV_EIO (failed model). */
int reg_acquire(registry *r, const char *name, reg_ref *out, kvant_err *err);
/* Only when already loaded (never loads): KV_EBUSY when not loaded. */
int reg_peek(registry *r, const char *name, reg_ref *out, kvant_err *err);
void reg_release(registry *r, reg_ref *ref);

/* Explicit life cycle (POST /v1/models/{id}/...).  KV_EINVAL unknown name
 * or bad level, KV_EBUSY requests in flight (409), KV_ENOMEM cannot fit. */
int reg_load(registry *r, const char *name, kvant_err *err);
int reg_unload(registry *r, const char *name, kvant_err *err);
int reg_sleep(registry *r, const char *name, int level, kvant_err *err);
int reg_wake(registry *r, const char *name, kvant_err *err);

/* ---- views ---- */
typedef struct reg_hist {
    uint64_t bucket[REG_HIST_N]; /* cumulative counts are made at render */
    double sum;
    uint64_t count;
} reg_hist;

extern const double reg_hist_le[REG_HIST_N - 1];

typedef struct reg_info {
    char name[REG_NAME_MAX];
    char path[1024];
    int64_t created;          /* unix time the model was registered */
    reg_state state;
    int sleep_level;          /* when sleeping */
    int pinned;
    int refs;                 /* requests in flight */
    double idle_s;            /* since last use (0 when busy) */
    int64_t max_model_len;
    uint64_t need_bytes;      /* planned footprint (header) */
    uint64_t kv_share_bytes;  /* planned KV share (the minimum) */
    uint64_t kv_extra_bytes;  /* KV beyond the share now (elastic pools), or granted at
                               * this load (fixed pools) */
    uint64_t resident[MEM_CAT_COUNT]; /* measured while loaded, else 0 */
    uint64_t resident_bytes;
    uint64_t kv_pool_bytes;   /* the engine's pool while loaded, else 0 */
    int32_t kv_blocks_total, kv_blocks_used;
    int32_t kv_blocks_min, kv_blocks_max; /* elastic pools: its size at load, and the most */
    uint64_t kv_grows, kv_shrinks;        /* pool resizes (elastic pools) */
    uint64_t loads, load_failures, evictions, wakes, sleeps, unloads;
    reg_hist load_h, wake_h;
    char error[KV_ERR_MSG_MAX];
} reg_info;

int reg_count(registry *r);
/* Fills info for model i in [0, count); KV_ERANGE otherwise. */
int reg_describe(registry *r, int i, reg_info *out);
/* Index of name (NULL/"" = 0), or -1. */
int reg_find(registry *r, const char *name);
mem_mgr *reg_mem(registry *r);
/* Counters summed over every engine ever loaded (finished ones kept) and
 * gauges over the loaded ones; health: the worst loaded engine. */
void reg_stats(registry *r, engine_stats *out);
void reg_health(registry *r, engine_health *out);

/* The eviction policy (reg_pick) and the memory arithmetic: registry_plan.h. */

#endif
