/* engine_types.h - the engine's data types: configuration, requests,
 * events, counters and snapshots.  Header only: engine.h (the API) and
 * engine_internal.h (the engine files' shared state) both include it, so
 * the files engine.c calls need not include engine.h.  engine.h documents
 * ownership and threading. */
#ifndef KVANT_ENGINE_TYPES_H
#define KVANT_ENGINE_TYPES_H

#include <stdint.h>
#include <string.h>

#include "kv/kvtier.h"
#include "mem/mem.h"
#include "model/model.h"
#include "text/sampler.h"
#include "util/err.h"

#define ENGINE_MAX_N 16          /* sequences per request (n) */
#define ENGINE_MAX_TOP_LOGPROBS 20
#define ENGINE_MAX_STOP_IDS 16
#define ENGINE_DEFAULT_DISK_SIZE (4ull << 30) /* kv_disk_size 0 with a disk dir */

typedef struct engine_config {
    const char *backend;           /* "cpu" (default) or "cuda" */
    int device;                    /* device index for the backend */
    int n_threads;                 /* 0 = all cores */
    uint64_t device_memory;        /* 0 = device total (CPU: available RAM) */
    double memory_utilization;     /* (0, 1], default 0.90 */
    int32_t max_num_seqs;          /* default 64 */
    int32_t max_num_batched_tokens;/* default 2048 */
    double max_itl_ms;             /* a step with decodes costs about this much at most
                                    * (engine_itl.h); default 200, 0 = off */
    int32_t block_size;            /* default 16 */
    int prefix_cache;              /* default 1 */
    int64_t max_model_len;         /* context per request; 0 = model's */
    int32_t max_waiting;           /* queue cap (0 = unlimited) */
    uint32_t kv_dtype;             /* default DT_F16 (f32, bf16, q8_0, q4_0) */
    int kv_rotate;                 /* 1: K/V stored Hadamard-rotated (kv_layout.rotate) */
    int32_t weights_dtype;         /* -1 = as stored; else quantize matrices at load */
    int exact;                     /* 1: f32 activations in every matmul (reference path);
                                    * 0 (default): int8 activations for quantized weights */
    int no_pack;                   /* 1: no load-time weight repacking (CPU) */
    int32_t kv_blocks_override;    /* >0: use exactly this many KV blocks (tests) */
    int print_plan;                /* print the start-up memory lines to stderr */
    int manual;                    /* tests: no engine thread; drive with engine_run_step */
    uint64_t test_fail_nth;        /* tests: the n-th device allocation fails (mem_fail_nth) */
    int32_t test_grammar_vocab_fail; /* tests: the first n builds of the token trie fail as
                                      * out of memory (engine_grammar_prepare) */
    /* KV offload tiers (engine_tier.c); both 0/NULL = none */
    uint64_t kv_host_memory;       /* host tier bytes (KVCOST_HOST_AUTO: auto, from free RAM) */
    const char *kv_disk_dir;       /* disk tier directory (borrowed until create returns) */
    uint64_t kv_disk_size;         /* disk tier bytes (0: ENGINE_DEFAULT_DISK_SIZE) */
    int kv_tier_policy;            /* ENGINE_TIER_COST (default); ALWAYS / NEVER for tests */
    int kv_disk_wait;              /* tests: disk writes wait for the writer, never dropped */
    int kv_disk_evict_only;        /* --kv-disk-write evict: blocks reach disk only when
                                      evicted from device and host (default 0: through,
                                      every hashed block written as it completes) */
    double kv_flush_timeout;       /* shutdown: seconds the disk writes may take (0: no limit) */
    /* Several engines, one budget: allocate from this manager (borrowed; it
     * must outlive the engine) instead of creating one.  The planner still
     * sizes this engine from device_memory * memory_utilization (its share);
     * the shared manager refuses what would exceed the common budget.
     * NULL (default) = the engine creates and owns its manager. */
    mem_mgr *shared_mem;
    /* Weight offload (model/wstream.h; CPU, and CUDA through a pinned ring
     * uploaded on the copy stream; auto only on the CPU): weights resident in
     * device memory (resident layers + the staging ring) are capped at
     * weights_memory bytes, or at weights_memory_frac of the budget; layers
     * that do not fit are streamed from the file.  Both 0: no cap. */
    uint64_t weights_memory;
    double weights_memory_frac;    /* (0, 1) */
    int weights_slots;             /* staging ring buffers (0: WSTREAM_MIN_SLOTS) */
    int weights_io;                /* how streamed layers are read: WSTREAM_IO_* (0: page cache) */
    int weights_place;             /* which layers stream: 0 auto (by predicted cost, from
                                    * cached rates), 1 + WSTREAM_ORDER_* as asked */
    /* Tensor parallelism (engine_tp.c, par/tp.h): the MPI group this engine
     * is one rank of (borrowed; NULL: one process).  Rank 0 schedules and
     * samples; other ranks are created with manual = 1 and run
     * engine_tp_worker. */
    struct par *tp_group;
    int tp_ranks;                  /* ranks per pipeline stage (0: all: no pipeline) */
    /* KV that follows the load (engine_kvresize.c): the pool may be grown
     * with engine_kv_resize up to this many blocks (0: its size is fixed),
     * and shrunk back down to its size at create. */
    int32_t kv_max_blocks;
    /* Sliding-window layer groups (engine_kvwin.c, docs/ARCHITECTURE.md): a
     * model with both window and global layers keeps the window layers' KV
     * in a second pool of bounded size and gives back each sequence's
     * blocks that fall wholly out of the window (CPU backend, one process,
     * no tiers, fixed pool size; otherwise one group as before).
     * kv_window_keep 1: the second pool is sized like the first and no
     * block is given back (the reference the outputs must equal). */
    int kv_window_keep;
    /* KV that fits itself (mem/plan.h PLAN_KV_FIT_*): on a backend whose
     * memory is the host's (CPU) and with an engine-owned manager, the pool
     * is sized from max_num_seqs requests of the context instead of the
     * whole budget, starts small and grows on demand (engine_kv_grow_for).
     * 0: the pool takes what the budget leaves (the earlier rule). */
    int kv_fit;
    uint64_t kv_start_bytes; /* with kv_fit: the pool's size at start (0: PLAN_KV_FIT_START) */
    /* Weights that fit themselves: with weights_memory and _frac 0, weights
     * that do not fit the budget are placed by the planner (resident first,
     * the rest streamed; mem/plan.h plan_fit_weights).  no_offload 1
     * refuses such a model instead. */
    int no_offload;
    int32_t kv_window_blocks_override; /* >0: exactly this many window-group blocks (tests;
                                        * default with kv_blocks_override: the same count) */
    /* Speculative decoding (engine_spec.h): ENGINE_SPEC_NGRAM drafts tokens
     * by prompt lookup and verifies them in one pass (requests with n 1;
     * others decode as before).  0 (default): off. */
    int spec;
    int32_t spec_draft_max;        /* drafted tokens per verification, [1, ENGINE_SPEC_MAX]
                                    * (0: ENGINE_SPEC_DEFAULT_DRAFT) */
    int32_t spec_ngram_min, spec_ngram_max; /* n-gram lengths looked up, longest first
                                             * (0: ENGINE_SPEC_DEFAULT_NGRAM_MIN, _MAX) */
    int32_t spec_max_batch;        /* no drafting while more sequences than this are
                                    * running (0: ENGINE_SPEC_DEFAULT_BATCH) */
    /* ENGINE_SPEC_DRAFT: the draft model's GGUF (borrowed until create
     * returns; the engine loads and owns the model, engine_draft.h) */
    const char *spec_draft_model;
    /* The KV budget of requests that name none (engine_request.kv_budget,
     * same units; 0: none) and their sink tokens (0: ENGINE_KV_DEFAULT_SINKS) */
    double kv_budget;
    int32_t kv_sinks;
    int32_t kv_policy; /* ENGINE_KV_SNAPKV or _H2O: their policy (requests with n 1;
                        * 0: sinks) */
    /* Hybrid models (recurrent layers, engine_state.c): the prefix cache keeps
     * the recurrent state at every state_snap_every-th block boundary (0:
     * ENGINE_STATE_DEFAULT_EVERY; -1: no snapshots at all) and at the last
     * boundary each pass of a sequence reaches, in state_snap_bytes (0: auto,
     * ENGINE_STATE_DEFAULT_SNAPS slots per max_num_seqs, at most a tenth of the
     * budget) */
    int32_t state_snap_every;
    uint64_t state_snap_bytes;
} engine_config;

#define ENGINE_STATE_DEFAULT_EVERY 8
#define ENGINE_STATE_DEFAULT_SNAPS 2

enum { ENGINE_SPEC_OFF = 0, ENGINE_SPEC_NGRAM = 1, ENGINE_SPEC_DRAFT = 2 };
#define ENGINE_SPEC_MAX 16          /* drafted tokens per verification at most */
#define ENGINE_SPEC_DEFAULT_DRAFT 8
#define ENGINE_SPEC_DEFAULT_BATCH 4
#define ENGINE_SPEC_DEFAULT_NGRAM_MIN 2
#define ENGINE_SPEC_DEFAULT_NGRAM_MAX 4
#define ENGINE_SPEC_HIST 5          /* acceptance histogram buckets: accepted/drafted in
                                     * [0, .25], (.25, .5], (.5, .75], (.75, 1), 1 */

/* How the tiers choose between moving a block and recomputing it. */
enum {
    ENGINE_TIER_COST = 0,   /* measured bandwidth vs the measured prefill rate */
    ENGINE_TIER_ALWAYS = 1, /* load every hit, swap every preempted sequence */
    ENGINE_TIER_NEVER = 2,  /* never load from a tier, never swap (demotion still runs) */
};

typedef struct engine engine;
struct gram;

typedef struct engine_request {
    const int32_t *prompt;   /* copied at submit */
    int64_t n_prompt;
    sampler_params sampling;
    int64_t max_tokens;      /* >= 1 */
    int32_t n;               /* sequences sharing the prompt, [1, ENGINE_MAX_N] */
    int32_t priority;        /* lower value = served first (vLLM convention) */
    uint64_t cache_salt;     /* tenant isolation for the prefix cache */
    int32_t top_logprobs;    /* 0 = none; -1 = chosen token's logprob only */
    int ignore_eos;
    int prompt_logprobs;     /* 1: an ENGINE_EV_PROMPT event per prompt token after the
                              * first, in order, with its log-probability given the
                              * tokens before it (and top_logprobs alternatives); the
                              * request's prompt then skips the prefix cache */
    int32_t embed;           /* ENGINE_EMBED_*: no generation (sampling and max_tokens
                              * unused, n 1): one ENGINE_EV_EMBED event with the
                              * prompt's pooled final hidden state (after the output
                              * norm), L2-normalised, then DONE; skips the prefix
                              * cache; not under --tp/--pp */
    int32_t stop_ids[ENGINE_MAX_STOP_IDS];
    int32_t n_stop_ids;
    /* Constrained decoding (engine_gram.h): every sequence's output is a
     * sentence of this finished grammar (grammar/gram.h), NULL: none.  The
     * engine never compiles: the caller does, off the engine thread.
     * Borrowed: it stays valid until the engine calls
     * grammar_release(grammar_ctx), once, on any thread, after its last use;
     * a successful engine_submit takes that reference, a failed one leaves
     * it with the caller.  With a grammar an end-of-sequence token (allowed
     * only where the grammar accepts) ends the sequence even with
     * ignore_eos; not with embed. */
    const struct gram *grammar;
    void (*grammar_release)(void *ctx);
    void *grammar_ctx;
    /* Optional: token masks shared by every request of this grammar
     * (grammar/tmshare.h, e.g. gcache_masks with engine_mask_words words),
     * valid as long as grammar is; each sequence's memo is bound to it. A
     * cache another engine's vocabulary claimed first is not used. */
    struct tmshare *grammar_masks;
    int no_spec;             /* 1: no speculative decoding for this request */
    /* KV budget (engine_kvbudget.c): at most this much KV per sequence, by
     * evicting under kv_policy.  0: none; >= 1: tokens; in (0, 1): a
     * fraction of the context (engine_max_model_len).  A budget the whole
     * request fits changes nothing. */
    double kv_budget;        /* 0 with ENGINE_KV_DEFAULT: engine_config.kv_budget */
    int32_t kv_policy;       /* ENGINE_KV_*: DEFAULT (sinks when a budget applies), SINKS,
                              * FULL (no budget, the engine's default ignored; a
                              * kv_budget with it is refused) or SNAPKV (the whole
                              * prompt attended, then per KV head the positions its
                              * last tokens attend to most kept) or H2O (likewise by
                              * every token's attention, heavy hitters updated as
                              * the window moves): engine_kvsel.c */
    int32_t kv_sinks;        /* sink tokens kept (0: engine_config.kv_sinks, else
                              * ENGINE_KV_DEFAULT_SINKS), rounded up to whole blocks */
} engine_request;

enum { ENGINE_KV_DEFAULT = 0, ENGINE_KV_SINKS = 1, ENGINE_KV_FULL = 2, ENGINE_KV_SNAPKV = 3,
       ENGINE_KV_H2O = 4 };
#define ENGINE_KV_SNAP_WINDOW 32 /* SnapKV's observation window (prompt tokens) */
#define ENGINE_KV_SNAP_POOL 7    /* its max-pooling kernel (positions) */
#define ENGINE_KV_DEFAULT_SINKS 4

/* A KV policy's name as requests and options spell it, and back (-1: none). */
static inline const char *engine_kv_policy_name(int32_t p)
{
    return p == ENGINE_KV_SNAPKV ? "snapkv" : p == ENGINE_KV_H2O ? "h2o"
           : p == ENGINE_KV_FULL ? "full" : "sinks";
}
static inline int32_t engine_kv_policy_parse(const char *s)
{
    for (int32_t p = ENGINE_KV_SINKS; p <= ENGINE_KV_H2O; p++)
        if (!strcmp(s, engine_kv_policy_name(p)))
            return p;
    return -1;
}

/* A KV budget (engine_request.kv_budget: tokens, or a fraction of ctx in
 * (0, 1)) in tokens; 0 for none.  The most a budgeted request holds. */
static inline int64_t engine_kv_budget_tokens(double kv_budget, int64_t ctx)
{
    if (!(kv_budget > 0.0) || kv_budget > 1e18) /* also NaN and infinity */
        return 0;
    return kv_budget >= 1.0 ? (int64_t)kv_budget : (int64_t)(kv_budget * (double)ctx);
}

enum { ENGINE_EMBED_NONE = 0, ENGINE_EMBED_MEAN = 1, ENGINE_EMBED_LAST = 2 };

typedef enum engine_event_type {
    ENGINE_EV_TOKEN = 0,   /* a generated token for sequence `index` */
    ENGINE_EV_FINISH = 1,  /* sequence `index` finished (reason set) */
    ENGINE_EV_ERROR = 2,   /* request failed or cancelled; final event */
    ENGINE_EV_DONE = 3,    /* all sequences finished; final event */
    ENGINE_EV_PROMPT = 4,  /* prompt_logprobs: prompt token `token` (index 0), before
                            * any TOKEN event */
    ENGINE_EV_EMBED = 5,   /* embed: `embedding` [n_embd] */
} engine_event_type;

typedef enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,    /* EOS / stop token */
    ENGINE_FINISH_LENGTH,  /* max_tokens or context */
    ENGINE_FINISH_ABORT,   /* cancelled or failed */
} engine_finish;

typedef struct engine_event {
    engine_event_type type;
    int64_t request_id;
    int32_t index;          /* sequence within the request */
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top_ids[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprobs[ENGINE_MAX_TOP_LOGPROBS];
    engine_finish finish;
    int64_t prompt_tokens;
    int64_t cached_tokens;  /* prompt tokens served from the prefix cache */
    int64_t completion_tokens; /* on DONE: total over sequences */
    /* The request's KV footprint at its largest so far (distinct blocks
     * across its sequences, the tokens stored in them, and their bytes);
     * updated when a sequence finishes or is preempted, so final on DONE. */
    int64_t kv_tokens, kv_blocks;
    uint64_t kv_bytes;
    const char *error;      /* on ERROR (valid during the callback) */
    const float *embedding; /* on EMBED: [n_embd] (valid during the callback) */
    int32_t n_embd;
    /* speculative decoding, on DONE: tokens drafted for the request and
     * drafted tokens the target accepted (both 0 without speculation) */
    int64_t draft_tokens, accepted_tokens;
    double grammar_seconds; /* constrained requests, on TOKEN: engine-thread time spent on
                             * this token's mask and state advance; on FINISH: on the
                             * mask of the end token that finished it (0 otherwise) */
} engine_event;

typedef void (*engine_event_fn)(void *ctx, const engine_event *ev);

typedef struct engine_stats {
    int32_t running, waiting, preempted_waiting;
    uint64_t finished_stop, finished_length, finished_abort;
    uint64_t prompt_tokens;          /* prompt tokens of admitted requests */
    uint64_t prompt_tokens_computed; /* prompt tokens run through the model (not
                                      * from the prefix cache; recomputation counts) */
    uint64_t generation_tokens, preemptions;
    int32_t kv_blocks_total, kv_blocks_used, kv_blocks_free, kv_blocks_cached;
    int32_t block_size;
    uint64_t kv_tokens_stored, kv_token_capacity;
    uint64_t prefix_queries, prefix_hits;
    /* hybrid models' recurrent state (engine_state.c; all 0 without) */
    uint64_t state_slot_bytes;       /* one sequence's state */
    int32_t state_live_slots, state_live_used; /* a slot per running sequence */
    int32_t state_snap_slots, state_snapshots; /* the prefix cache's: slots, held */
    uint64_t state_snap_taken, state_snap_restored, state_snap_evicted, state_snap_dropped;
    uint64_t state_tier_restored, state_tier_stored; /* snapshots from / to the tiers */
    uint64_t steps;
    uint64_t host_bytes;             /* engine host memory outside the memory
                                      * manager: step buffers (logit rows, the
                                      * sampler's scratch) and the admitted
                                      * requests' storage (token arrays, block
                                      * tables, grammar states) and the token
                                      * trie for constrained decoding (once
                                      * built) */
    /* the last step's batch (scheduler tests, bench) */
    int32_t last_tokens, last_seqs, last_decodes;
    /* the step-cost model (engine_itl.h): a step's seconds as base +
     * per_token x tokens (both 0 until two steps ran), the last step's token
     * budget, and the steps that filled a budget max_itl_ms held under
     * max_num_batched_tokens */
    double step_base_s, step_token_s;
    int32_t itl_budget;
    uint64_t itl_limited_steps;
    /* KV pool resizes (engine_kv_resize): size bounds and events that changed it */
    int32_t kv_blocks_min, kv_blocks_max;
    uint64_t kv_grows, kv_shrinks;
    /* the window layer group (kv_window 0: none; the kv_blocks_* above are then
     * every layer's, else the global layers') */
    int32_t kv_window;
    int32_t kv_w_blocks_total, kv_w_blocks_used, kv_w_blocks_free, kv_w_blocks_cached;
    uint64_t kv_w_dropped;           /* window blocks given back as sequences advanced */
    uint64_t kv_budget_dropped;      /* blocks given back under requests' KV budgets */
    /* constrained decoding (engine_gram.h): host bytes of the admitted
     * requests' grammar states (recognizer charts and mask memos; also in
     * host_bytes), how many requests hold one, and the vocabulary's trie
     * (also in host_bytes; 0 until the first constrained request built it,
     * which also sets grammar_vocab_builds to 1 and the build's seconds) */
    uint64_t grammar_bytes, grammar_vocab_bytes;
    int32_t grammar_requests;
    int32_t grammar_vocab_builds;
    double grammar_vocab_build_seconds;
    /* speculative decoding: drafted and accepted tokens, verification
     * passes by acceptance (ENGINE_SPEC_HIST buckets), and decode steps of
     * a speculating sequence that drafted nothing (no match, paused, batch) */
    uint64_t spec_draft_tokens, spec_accepted_tokens;
    uint64_t spec_verify_hist[ENGINE_SPEC_HIST];
    double spec_ratio_sum;           /* the passes' accepted / drafted, summed */
    uint64_t spec_skipped;
    /* the cost model that switches drafting off (engine_spec.h): a decode
     * step's seconds as base + per_token x tokens (both 0 until measured),
     * the draft model's seconds per pass, and the decode steps of
     * speculating sequences it declined (also in spec_skipped) */
    double spec_step_base_s, spec_step_token_s, spec_draft_pass_s;
    uint64_t spec_cost_off;
} engine_stats;

/* KV offload tiers, as of the end of the last step (enabled 0: none). */
typedef struct engine_tier_stats {
    int enabled;
    kvtier_stats t;                  /* blocks, bytes moved, hits/misses per tier */
    uint64_t host_capacity_bytes, disk_capacity_bytes;
    uint64_t hit_tokens[KVTIER_N];   /* prompt tokens loaded from each tier */
    uint64_t loads_declined;         /* tier hits the cost model chose to recompute */
    uint64_t swaps, swap_blocks;     /* preemptions that wrote to the host tier */
    uint64_t recomputes;             /* preemptions left to recomputation */
    kvcost cost;                     /* measured bandwidths and prefill rate */
    double busy_seconds;             /* engine-thread time in tier work */
    int write_through;               /* 1: hashed blocks are written through to disk */
    int32_t wt_waiting;              /* hashed blocks not yet offered to the disk writer */
    uint64_t wt_missed;              /* hashed blocks reused before they could be offered */
    double writer_cpu_seconds;       /* the disk writer thread's CPU time */
} engine_tier_stats;

/* Liveness of the engine thread, for /health.  Progress is a step that ran
 * the model, or the engine having nothing to do; `stalled_s` counts from
 * the last progress (or from the moment work arrived at an idle engine),
 * so a wedged step or a scheduler that stops scheduling shows up as
 * busy with a growing stalled_s.  Thread-safe. */
typedef struct engine_health {
    int thread_alive;        /* the engine thread runs (1 in manual mode) */
    int busy;                /* requests in flight */
    int32_t in_flight;
    double stalled_s;        /* seconds since progress; 0 when not busy */
    uint64_t steps;
    int weights_failed;      /* offload: the weight stream failed (file truncated, I/O) */
    char weights_error[256];
    int group_failed;        /* --tp: a rank failed or stopped answering (group_error) */
    char group_error[256];
} engine_health;

/* One rank's memory as it started (gathered on rank 0 at start-up). */
typedef struct engine_tp_rank {
    uint64_t budget, weights, kv, activations, used;
    int64_t kv_blocks;
    int32_t n_head, n_head_kv, n_ff;
    int32_t stage, n_layers;      /* pipeline stage and the layers it holds */
} engine_tp_rank;
/* Rank 0's communication: bytes it sent and time in collectives, steps
 * and their time, as of the last step.  0 when not tensor-parallel. */
typedef struct engine_tp_stats {
    uint64_t bytes_sent, calls, steps, reductions;
    double comm_seconds, step_seconds;
    int failed;
} engine_tp_stats;

/* Memory views (engine_kvsnap.h): a consistent copy of the KV pool's block states and of the requests
 * holding blocks, made by the engine thread between two steps (or by the
 * caller in manual mode), so HTTP threads never read the pool. */
typedef struct engine_kv_req {
    int64_t id;
    int32_t priority;
    int32_t n_seqs;          /* sequences holding KV blocks */
    int64_t prompt_tokens, generated_tokens;
    int64_t kv_tokens;       /* tokens stored in its distinct blocks */
    int32_t blocks_own;      /* distinct blocks with refcount 1 */
    int32_t blocks_shared;   /* distinct blocks with refcount > 1 (forks, prefix cache) */
    int32_t blocks_w;        /* distinct window-group blocks it holds (dropped ones not) */
    uint64_t grammar_bytes;  /* its grammar states (0: unconstrained) */
    int64_t blk_off;         /* its distinct block ids: blk_ids[blk_off, +n_blk) */
    int32_t n_blk;
    double age_s;            /* since submission */
} engine_kv_req;
typedef struct engine_kv_snapshot {
    int32_t n_blocks, block_size;
    uint64_t block_bytes;    /* one block, all layers (of the global group) */
    int32_t window;          /* the window group (0: none) */
    int32_t n_blocks_w, w_used, w_free, w_cached;
    uint64_t block_bytes_w;  /* one window-group block */
    uint8_t *state;          /* [n_blocks] KVPOOL_BLOCK_* */
    int32_t *refcount;       /* [n_blocks] */
    int64_t *owner;          /* [n_blocks] first request found holding it, 0 = none */
    engine_kv_req *reqs;     /* [reqs_cap] */
    int32_t n_reqs, reqs_cap;
    int32_t *blk_ids;        /* [blk_cap] */
    int64_t n_blk_ids, blk_cap;
    int truncated;           /* reqs or blk_ids ran out of room */
    engine_stats stats;      /* taken at the same moment */
    int done;                /* internal: set by the engine thread */
} engine_kv_snapshot;

struct wstream_stats;
typedef struct plan_result plan_result;

#endif
