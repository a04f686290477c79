/* server_models.h - several models in one memory budget: the model
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
 * Ownership: srv_models_create returns a heap handle freed by
 * srv_models_destroy (after the HTTP daemon stopped), which destroys every
 * engine and model and then the shared manager.  A srv_model_ref borrows
 * the model, engine and OpenAI context until srv_models_release.
 * Threading: every function is thread-safe (one mutex; loads and engine
 * teardown run outside it); a keep-alive thread unloads idle models.
 */
#ifndef KVANT_SERVER_MODELS_H
#define KVANT_SERVER_MODELS_H

#include <stdint.h>

#include "engine/engine.h"
#include "mem/mem.h"
#include "server/server_openai.h"
#include "util/err.h"

#define SRV_MODELS_MAX 64                    /* known models */
#define SRV_MODELS_MAX_RESIDENT MEM_MAX_POOLS /* engines at once (one KV pool each) */
#define SRV_MODELS_NAME_MAX 128
#define SRV_MODELS_DEFAULT_KV_REQS 2         /* default KV share: requests of max context */
#define SRV_MODELS_QUEUE_TIMEOUT_S 60.0      /* --queue-timeout default */
#define SRV_MODELS_HIST_N 10                 /* duration histogram buckets (+Inf last) */
#define SRV_MODELS_KV_RESIZE_TIMEOUT_S 2.0   /* wait for an engine's step boundary to resize */

typedef enum srv_model_state {
    SRV_MODEL_UNLOADED = 0,
    SRV_MODEL_LOADING,
    SRV_MODEL_LOADED,
    SRV_MODEL_SLEEPING,
    SRV_MODEL_UNLOADING,
    SRV_MODEL_FAILED,
    SRV_MODEL_STATE_COUNT
} srv_model_state;

const char *srv_model_state_name(srv_model_state s);

typedef struct srv_models_config {
    engine_config ec;       /* for every model (shared_mem and print_plan are set here) */
    uint64_t budget;        /* bytes for all models together; 0 = the device's, times
                             * ec.memory_utilization (as one engine would plan) */
    uint64_t kv_per_model;  /* KV share per model in bytes (whole blocks, rounded down);
                             * 0 = SRV_MODELS_DEFAULT_KV_REQS requests of the max context */
    int kv_grow;            /* 1 (default): pools grow into free memory, up to max_num_seqs
                             * requests of the context (see "KV follows the load" above);
                             * 0: every pool is exactly its share */
    double keep_alive_s;    /* unload a model idle this long; <= 0: never */
    double queue_timeout_s; /* how long a request waits for its model to load */
    int log;                /* event lines on stderr (load, evict, sleep, ...) */
} srv_models_config;

srv_models_config srv_models_config_default(void);

typedef struct srv_models srv_models;

/* Creates the shared memory manager.  NULL + err on a bad budget. */
srv_models *srv_models_create(const srv_models_config *cfg, kvant_err *err);
void srv_models_destroy(srv_models *r);

/* Registers a model (name NULL = the file name without .gguf).  Reads the
 * header and computes its footprint; a file that cannot be read or planned
 * is still registered, as failed with its error (returned in err, rc
 * KV_OK).  Errors: KV_EINVAL (duplicate or bad name), KV_ERANGE (too many). */
int srv_models_add(srv_models *r, const char *name, const char *path, kvant_err *err);
/* Registers every *.gguf in dir (sorted by name); KV_EIO if unreadable. */
int srv_models_add_dir(srv_models *r, const char *dir, kvant_err *err);
/* Marks a model pinned: loaded now, never evicted or unloaded by keep-alive. */
int srv_models_pin(srv_models *r, const char *name, kvant_err *err);
/* Starts the keep-alive thread. */
int srv_models_start(srv_models *r, kvant_err *err);
/* Draining: no more loads; engine_drain on every loaded engine. */
void srv_models_drain(srv_models *r);

typedef struct srv_model_ref {
    model *m;                 /* borrowed until release */
    engine *e;
    const srv_oai_ctx *oai;   /* served_name = the model's name */
    int idx;                  /* internal */
} srv_model_ref;

/* The model named name (NULL or "" = the first registered) with a
 * reference held: loads or wakes it if needed, evicting idle models in LRU
 * order; waits (up to queue_timeout_s) while busy models hold the memory
 * it needs or another life-cycle change runs.  Errors: KV_EINVAL (unknown
 * name: 404), KV_ENOMEM (can never fit; the message gives the bytes),
 * KV_EBUSY (timed out, or draining), KV_EFORMAT / KV_EIO (failed model). */
int srv_models_acquire(srv_models *r, const char *name, srv_model_ref *out, kvant_err *err);
/* Only when already loaded (never loads): KV_EBUSY when not loaded. */
int srv_models_peek(srv_models *r, const char *name, srv_model_ref *out, kvant_err *err);
void srv_models_release(srv_models *r, srv_model_ref *ref);

/* Explicit life cycle (POST /v1/models/{id}/...).  KV_EINVAL unknown name
 * or bad level, KV_EBUSY requests in flight (409), KV_ENOMEM cannot fit. */
int srv_models_load(srv_models *r, const char *name, kvant_err *err);
int srv_models_unload(srv_models *r, const char *name, kvant_err *err);
int srv_models_sleep(srv_models *r, const char *name, int level, kvant_err *err);
int srv_models_wake(srv_models *r, const char *name, kvant_err *err);

/* ---- views ---- */
typedef struct srv_models_hist {
    uint64_t bucket[SRV_MODELS_HIST_N]; /* cumulative counts are made at render */
    double sum;
    uint64_t count;
} srv_models_hist;

extern const double srv_models_hist_le[SRV_MODELS_HIST_N - 1];

typedef struct srv_model_info {
    char name[SRV_MODELS_NAME_MAX];
    char path[1024];
    srv_model_state state;
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
    srv_models_hist load_h, wake_h;
    char error[KV_ERR_MSG_MAX];
} srv_model_info;

int srv_models_count(srv_models *r);
/* Fills info for model i in [0, count); KV_ERANGE otherwise. */
int srv_models_info(srv_models *r, int i, srv_model_info *out);
/* Index of name (NULL/"" = 0), or -1. */
int srv_models_find(srv_models *r, const char *name);
mem_mgr *srv_models_mem(srv_models *r);
/* Counters summed over every engine ever loaded (finished ones kept) and
 * gauges over the loaded ones; health: the worst loaded engine. */
void srv_models_stats(srv_models *r, engine_stats *out);
void srv_models_health(srv_models *r, engine_health *out);

/* ---- the eviction policy (pure; unit-tested) ---- */
typedef struct srv_models_cand {
    uint64_t bytes;        /* resident bytes */
    double last_used;      /* LRU key: smaller = older */
    int loaded;            /* holds memory and an engine slot */
    int busy;              /* requests in flight: not a victim now */
    int pinned;            /* never a victim */
} srv_models_cand;

enum { SRV_FIT_OK = 0, SRV_FIT_WAIT = 1, SRV_FIT_NEVER = 2 };

/* Which loaded models to evict so that need bytes fit in budget (used =
 * the bytes in use now) and a resident slot is free: idle unpinned models
 * in least-recently-used order, only as many as needed.  SRV_FIT_OK with
 * victims[0..*n_victims) (maybe none); SRV_FIT_WAIT when it would fit once
 * busy models go idle; SRV_FIT_NEVER when pinned models and the budget
 * leave too little whatever happens. */
int srv_models_pick(const srv_models_cand *c, int n, uint64_t need, uint64_t budget, uint64_t used,
                    int max_resident, int *victims, int *n_victims);

#endif
