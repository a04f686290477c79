/* engine_internal.h - engine state shared by the files of src/engine, and
 * the functions of the files at the bottom of the engine (the KV views, the
 * pool resize, the tiers, weight offload, tensor parallelism), which call
 * nothing above them.  Not a public header: only src/engine includes it.
 *
 * Floors (calls go down only):
 *   engine.c        lifecycle, engine thread, thread-safe API
 *   engine_step.c   the step's phases (engine_step.h)
 *   engine_req.c    request storage, lists, events (engine_req.h)
 *   engine_kvsnap.c engine_kvresize.c engine_tier.c engine_offload.c
 *   engine_kvbudget.c
 *   engine_tp.c     (declared here)
 */
#ifndef KVANT_ENGINE_INTERNAL_H
#define KVANT_ENGINE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "backend/backend.h"
#include "engine/engine_types.h"
#include "kv/kvpool.h"
#include "forward/forward.h"

typedef struct eng_req eng_req;
typedef struct eng_tier eng_tier; /* engine_tier.c */
typedef struct eng_tp eng_tp;     /* engine_tp.c */
typedef struct eng_resize eng_resize; /* engine_kvresize.c */
typedef struct eng_draft eng_draft;   /* engine_draft.c */
typedef struct eng_state eng_state;   /* engine_state.c */
struct wstream_plan;
struct wstream;
struct xcache;
struct earley;
struct tmask_work;
struct tmask_vocab;

/* A step-cost fit (engine_itl.h): decayed least-squares sums over steps of
 * (tokens n, seconds t): weight, n, t, n*n, n*t. */
typedef struct step_fit {
    double f[5];
} step_fit;

/* One sequence: the unit the scheduler batches.  tokens holds the prompt
 * followed by generated tokens; the KV cache holds n_computed of them.
 * It lives in its request's storage (engine_req.c), tokens and block table
 * included: nothing in it is allocated or freed on its own. */
typedef struct eng_seq {
    eng_req *req;
    int32_t index;          /* within the request */
    int32_t *tokens;        /* [cap], in the request's storage */
    int64_t n_tokens, cap;
    int64_t n_computed;
    int64_t n_generated;
    kv_seq kv;              /* fixed table in the request's storage */
    kv_seq kv_w;            /* the window group's (e->pool_w), likewise; else empty */
    kv_seq kv_d;            /* the draft model's (e->draft, engine_draft.h), likewise */
    sampler smp;            /* borrows e->smp_scratch */
    int finished;
    int reported;           /* FINISH event sent */
    engine_finish finish;
    int preempted;          /* waiting again after preemption */
    int32_t sched_tokens;   /* tokens scheduled in the current step */
    int32_t out_row;        /* logits row in the current step, -1 if none */
    int64_t plp_next;       /* prompt_logprobs: next prompt position due an
                             * ENGINE_EV_PROMPT event (1 at first; n_prompt: none due) */
    int64_t plp_pos;        /* this step: rows plp_row.. hold the logits after
                             * positions plp_pos.., plp_n of them */
    int32_t plp_row, plp_n;
    double gram_s;          /* grammar time spent on the token being sampled */
    /* speculative decoding (engine_spec.c): this step's drafted tokens (also
     * at tokens[n_tokens..], scheduled after the last sampled token), the
     * current draft length, and steps left with drafting paused */
    int32_t n_draft;
    int32_t draft[ENGINE_SPEC_MAX];
    int32_t spec_k, spec_pause;
    float spec_rate;        /* running acceptance rate (accepted / drafted) */
    /* KV tiers (engine_tier.c): the tier key of hashed block tier_key_i (-1:
     * none), the parent of the next one when a KV budget dropped its block */
    uint8_t tier_key[KVTIER_KEY_BYTES];
    int32_t tier_key_i;
    /* snapkv / h2o (engine_kvsel.c): past the prompt (the budget's mask
     * applies), its sink blocks its own fresh copies, and (h2o) the first
     * window block of its score rows' layout */
    int kvb_done, kvb_own;
    int32_t kvb_wb;
    /* hybrid models (engine_state.c): its live recurrent-state slot (-1: none)
     * and its trailing snapshots of the prompt and of the generated text (-1:
     * none; valid while their generation holds) */
    int32_t st_slot, st_trail[2];
    uint32_t st_trail_gen[2];
    struct eng_seq *next;   /* waiting / running list link */
} eng_seq;

/* A request's KV budget as resolved at submit (engine_kvbudget.c); recent
 * 0: none (no budget, or the whole request fits it). */
typedef struct eng_kvb {
    int64_t budget;         /* tokens */
    int32_t sink_blocks;    /* leading blocks every position reads (SnapKV, once
                             * compacted: the kept prompt rows) */
    int32_t recent;         /* R: the token at p reads from block (p - R + 1) / bs on */
    int32_t step_cap;       /* most tokens of the sequence in one step */
    int32_t policy;         /* ENGINE_KV_SINKS, _SNAPKV or _H2O */
    int32_t prompt;         /* snapkv/h2o: the prompt's tokens (compacted after them) */
    int32_t snap_from;      /* the first position whose attention is scored */
    int32_t snap_n;         /* candidate positions [0, snap_n) at the prompt's end (0:
                             * nothing to choose, the prompt fits the sinks and window) */
    int32_t snap_row;       /* floats per (layer, KV head) score row */
    int32_t pool;           /* max-pooling kernel of the selection (1: none) */
    int32_t bs;             /* the engine's block size */
} eng_kvb;

/* Why a request is being failed (eng_req.cancelled). */
enum { ENG_LIVE = 0, ENG_FAIL_FORK, ENG_FAIL_RUN, ENG_CANCELLED, ENG_FAIL_GRAMMAR };

/* One request and everything its sequences need, in one allocation made
 * at submit on the submitting thread (engine_req_create):
 *   [eng_req][eng_seq seq[p.n]][int32 tokens[p.n][seq_cap]][int32 blocks[p.n][seq_blocks]]
 *   (then the window group's blocks[p.n][seq_blocks] when e->pool_w, then
 *   the draft model's when e->draft)
 * Freed off the step (engine_req_reap). */
struct eng_req {
    int64_t id;
    engine_request p;       /* p.prompt points at prompt below */
    int32_t *prompt;        /* sequence 0's first n_prompt tokens (never rewritten) */
    engine_event_fn fn;
    void *ctx;
    double arrival;
    uint64_t order;         /* arrival order, ties broken by id */
    eng_seq *seqs[ENGINE_MAX_N];
    int32_t n_seqs;         /* set up so far (forks appear after prefill) */
    int32_t n_finished;
    int64_t cached_tokens;
    int64_t completion_tokens;
    int64_t draft_tokens, accepted_tokens; /* speculative decoding */
    int cancelled;          /* ENG_*: engine thread */
    int cancel_asked;       /* engine_cancel was called (guarded by e->mu) */
    int64_t kv_peak_tokens, kv_peak_blocks; /* footprint at its largest (kvsnap) */
    eng_kvb kvb;            /* its KV budget (engine_kvbudget.c) */
    /* snapkv / h2o (kvb.snap_row > 0), in this allocation: the scores
     * [n_layers][n_kv_heads][snap_row], the kept rows [n_layers][n_kv_heads]
     * [sink_blocks * bs], sort keys [snap_row], the new blocks
     * [2 sink_blocks + 1], the backend's logits [n_head][max(prompt, budget)] */
    float *snap_score, *snap_tmp;
    int32_t *snap_sel;
    uint64_t *snap_keys;
    int32_t *snap_blocks;
    uint64_t kv_block_bytes;
    uint64_t bytes;         /* of this allocation (engine_stats.host_bytes) */
    double *embed_sum;      /* p.embed: [n_embd] pooled rows so far (else NULL) */
    float *embed_vec;       /* p.embed: [n_embd] the result */
    int64_t seq_cap;        /* tokens per sequence: n_prompt + max_tokens + 1 */
    int32_t seq_blocks;     /* block table entries per sequence */
    int32_t *tok_store;     /* [p.n][seq_cap] */
    int32_t *blk_store;     /* [p.n][seq_blocks] */
    /* p.grammar: sequence i's recognizer and mask memo (engine_gram.c);
     * made at submit, freed at reap */
    struct earley *gstate[ENGINE_MAX_N];
    struct tmask_work *gwork[ENGINE_MAX_N];
    char gram_err[192];     /* why ENG_FAIL_GRAMMAR */
    struct eng_req *next;   /* incoming / admitted / dead list */
    struct eng_req *live_prev, *live_next; /* in flight, for engine_cancel (e->mu) */
    eng_seq seq[];          /* [p.n] */
};

struct engine {
    model *m;
    engine_config cfg;
    mem_mgr *mem;
    backend *be;
    int own_be;
    fwd_ctx fwd;
    kvpool *pool;
    kvpool *pool_w;             /* the window layer group's pool (engine_kvwin.c), or NULL */
    int32_t kv_window;          /* its widest window (0: one group) */
    uint64_t kv_block_bytes_w;  /* one window-group block */
    int kvwin_registered;       /* its memory report is registered */
    int64_t max_model_len;
    uint64_t kv_block_bytes;    /* bytes of one KV block, all layers */
    int32_t kv_min_blocks;      /* the pool's size at create: it never shrinks below */
    int32_t kv_grow_max;        /* > 0: the pool grows on demand up to this many blocks
                                 * (engine_kv_grow_for; engine_config.kv_fit) */
    eng_tier *tier;             /* KV offload tiers, or NULL */
    struct wstream *ws;         /* weight offload (engine_offload.c), or NULL; owned */
    struct xcache *xc;          /* experts placed by memory (engine_offload.c), or NULL; owned */
    int32_t xc_slots;           /* its slots, as planned (0: none) */
    int xc_direct;              /* its experts read with O_DIRECT (--stream-io direct) */
    eng_tp *tp;                 /* tensor parallelism (engine_tp.c), or NULL; owned */
    eng_draft *draft;           /* speculative decoding's draft model, or NULL; owned */
    eng_state *st;              /* hybrid models' recurrent state, or NULL; owned */
    uint64_t st_budget;         /* the plan's budget (the snapshots' automatic share) */

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;     /* guards everything below up to `stats` */
    pthread_cond_t cv;
    eng_req *incoming;      /* submitted, not yet admitted (FIFO) */
    eng_req *incoming_tail;
    eng_req *live;          /* every request in flight (engine_cancel's lookup) */
    eng_req *dead;          /* finished, to be freed off the step (engine_req_reap) */
    int32_t n_cancel;       /* cancel_asked marks the engine thread has not seen */
    int stop;
    int draining;
    int32_t n_in_flight;
    int64_t next_id;
    engine_stats stats;
    mem_pool_stats kv_pool_stats; /* refreshed each step for mem reports */
    mem_pool_stats kv_pool_stats_w; /* the window group's */
    engine_kv_snapshot *snap_req; /* a waiting snapshot request, or NULL */
    eng_resize *resize_req;       /* a waiting KV resize request, or NULL */
    pthread_cond_t snap_cv;       /* snapshot or resize served / engine thread gone */
    int thread_exited;
    double progress_t;            /* last progress (engine_get_health) */

    /* engine-thread state */
    eng_req *reqs;          /* admitted, unfinished requests */
    eng_seq *waiting;       /* priority order */
    eng_seq *running;       /* priority order */
    uint64_t next_order;
    int last_prefill_first;  /* the last step ran only new requests' prompts */
    /* the ITL budget (engine_itl.c): a fit over every step's pass, the last
     * step's budget, steps it held under max_num_batched_tokens */
    step_fit itl_fit;
    int32_t itl_budget;
    uint64_t itl_limited_steps;
    /* speculative decoding counters (engine_spec.c), copied to stats each step */
    uint64_t spec_draft, spec_accepted, spec_hist[ENGINE_SPEC_HIST], spec_skipped;
    double spec_rsum;
    /* its cost model (engine_spec.c): a step fit over decode-only steps;
     * the draft model's seconds per one-token pass (moving average; 0
     * without a draft model); decode steps the model declined to draft */
    step_fit spec_fit;
    double spec_draft_pass_s;
    uint64_t spec_cost_off;
    int spec_unjudged;      /* test builds only: drafts are never declined by cost */
    /* step buffers, sized at create: no allocation in a step */
    int32_t *b_tokens, *b_pos, *b_seq, *b_out; /* [max_num_batched_tokens] x 3, [max_num_seqs] */
    fwd_seq *b_seqs;        /* [max_num_seqs] */
    eng_seq **b_seqp;       /* [max_num_seqs] */
    float *logits;          /* [max_num_seqs + 1][n_vocab]: logit rows + a sampling copy */
    float *hidden;          /* [max_num_seqs][n_embd]: the rows' hidden states (embed) */
    sampler_scratch smp_scratch; /* [n_vocab] x 4: every sequence's sampler, one at a time */
    uint64_t step_buf_bytes; /* the step buffers' bytes (host memory, malloc) */
    /* constrained decoding (engine_gram.c): the vocabulary index, built on
     * the first constrained request (engine_gram_vocab), not at create */
    pthread_mutex_t gvocab_mu;  /* serialises the build; guards the three below */
    int gvocab_refused;         /* a failure no retry mends (gvocab_err says why) */
    int32_t gvocab_fail_left;   /* tests: builds still to fail (cfg.test_grammar_vocab_fail) */
    char gvocab_err[192];
    /* NULL until built; stored once (release), after gmask, and read with
     * acquire: a request that passed engine_gram_req_init sees it set */
    _Atomic(struct tmask_vocab *) gvocab;
    uint32_t *gmask;        /* [tmask_n_words] one sequence's mask at a time (engine thread) */
    uint64_t gvocab_bytes;  /* under mu: the two above (0 until built; in stats.host_bytes) */
};

/* Monotonic seconds.  Any thread. */
static inline double engine_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The stats as of the last step (engine_get_stats).  Any thread. */
static inline void engine_stats_read(engine *e, engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
}

/* engine_kvwin.c: a sequence's KV through both layer groups (one group
 * when e->pool_w is NULL: then each is the plain kvseq_ call).
 * use: whether this engine's model and configuration get a window group
 * (before the plan); create: the window pool of n_blocks (after fwd_init). */
int engine_kvwin_use(const engine *e);
int engine_kvwin_create(engine *e, int32_t n_blocks, kvant_err *err);
void engine_kvwin_destroy(engine *e);
/* Refreshes the window pool's numbers in e->stats and the memory report
 * (engine thread, after each step; takes e->mu). */
void engine_kvwin_note(engine *e);
int engine_kv_reserve(engine *e, eng_seq *s, int64_t from, int64_t n_tokens);
void engine_kv_release(engine *e, eng_seq *s);
/* Prefix match in both groups, cut to what both hold (never serves a hit
 * whose window the window group no longer has: those tokens are
 * recomputed); returns the tokens s now holds. */
int64_t engine_kv_match(engine *e, eng_seq *s);
/* Commits s->n_computed tokens in both groups, then gives back the window
 * blocks no later position reads (unless kv_window_keep). */
void engine_kv_commit(engine *e, eng_seq *s);
int engine_kv_fork(engine *e, const eng_seq *parent, eng_seq *child);
fwd_seq engine_kv_fwd_seq(const eng_seq *s);

/* engine_kvbudget.c: resolve checks r's budget fields against e and fills
 * out (KV_EINVAL naming the field); salt: the prefix-cache salt of a
 * sequence under k; drop: after a commit, gives back s's blocks no later
 * position reads; match: its prefix match (s empty), sinks and window. */
int engine_kvb_resolve(const engine *e, const engine_request *r, eng_kvb *out, kvant_err *err);
uint64_t engine_kvb_salt(const eng_kvb *k, uint64_t salt);
void engine_kvb_drop(engine *e, eng_seq *s);
void engine_kvb_drop_at(engine *e, eng_seq *s, int64_t n); /* as if n tokens were computed */
int64_t engine_kvb_stored(const engine *e, const eng_seq *s); /* tokens its blocks hold */
int64_t engine_kvb_match(engine *e, eng_seq *s);
/* The most tokens a prefix match of s may cover (SnapKV: its observation
 * window is computed, to score it); its step's chunk of `chunk` tokens cut
 * to what the budget allows; the blocks a step of `chunk` tokens will take
 * beyond its reserve (SnapKV's compaction after the prompt); its fwd_seq
 * fields; SnapKV's per-request storage (bytes, then placed in r at p). */
int64_t engine_kvb_match_limit(const eng_seq *s);
int32_t engine_kvb_chunk(const eng_seq *s, int32_t chunk);
int32_t engine_kvb_extra(const eng_seq *s, int32_t chunk);
void engine_kvb_fwd(const eng_seq *s, fwd_seq *f);
size_t engine_kvb_bytes(const engine *e, const eng_kvb *k);
void engine_kvb_place(const engine *e, eng_req *r, void *p);
/* 1 while s is a snapkv/h2o sequence before its prompt's end (the whole
 * cache attended). */
static inline int engine_kvb_pending(const eng_seq *s)
{
    return s->req->kvb.recent > 0 && s->req->kvb.policy != ENGINE_KV_SINKS && !s->kvb_done;
}
/* Blocks [sinks, first) no position >= n reads under k. */
static inline int32_t engine_kvb_first(const eng_kvb *k, int64_t n, int32_t bs)
{
    const int64_t lo = n - k->recent + 1;
    const int64_t wb = lo > 0 ? lo / bs : 0;
    return wb > k->sink_blocks ? (int32_t)wb : k->sink_blocks;
}

/* engine_kvsel.c: after a commit of s under snapkv or h2o: the prompt's
 * compaction when the prompt is in, h2o's merges of the blocks leaving
 * the window into its heavy hitters. */
void engine_kvsel_commit(engine *e, eng_seq *s);
/* Forgets a sequence's snapkv/h2o state (its KV released: preemption). */
void engine_kvsel_reset(const engine *e, eng_seq *s);

/* engine_state.c (no-ops without recurrent layers): slots: how many the
 * backend holds (live, snapshots; 0: none); create after fwd_init; acquire a
 * live slot (KV_ENOMEM: none free), release it; fork: the child's copy of its
 * parent's state; match: cuts a prefix hit of s to the last boundary with a
 * snapshot and restores it into s's slot (returns the tokens s keeps);
 * build: s's slot and this step's snapshots into its fwd_seq; after_pass:
 * registers them (ok) or gives them back; note: counters into e->stats. */
int32_t engine_state_slots(const engine *e, int32_t *n_live, int32_t *n_snap);
int engine_state_create(engine *e, kvant_err *err);
void engine_state_destroy(engine *e);
int engine_state_acquire(engine *e, eng_seq *s);
void engine_state_release(engine *e, eng_seq *s);
int engine_state_fork(engine *e, const eng_seq *parent, eng_seq *child);
int64_t engine_state_match(engine *e, eng_seq *s, int64_t hit);
void engine_state_build(engine *e, eng_seq *s, fwd_seq *f);
void engine_state_after_pass(engine *e, int ok);
void engine_state_note(engine *e);

/* engine_kvsnap.c: records r's current KV footprint into its peak (call
 * before any of its blocks are released); serves a pending snapshot. */
void engine_note_kv(engine *e, eng_req *r);
void engine_serve_snapshot(engine *e);
/* engine_kvresize.c: serves a pending KV resize (between steps). */
void engine_serve_resize(engine *e);
/* engine_kvresize.c, engine thread: when the pool grows on demand
 * (kv_grow_max) and its free blocks are fewer than need, grows it (by at
 * least a quarter, at most to kv_grow_max) before cached prefix blocks
 * would be evicted; a refusal (budget) leaves it as it is. */
void engine_kv_grow_for(engine *e, int32_t need);

/* engine_tier.c (all no-ops without tiers) */
int engine_tier_create(engine *e, int32_t n_blocks, kvant_err *err);
void engine_tier_destroy(engine *e);
void engine_tier_shutdown(engine *e); /* device cache down a tier, before the pool goes */
void engine_tier_hook(engine *e, kvpool_config *pc);  /* sets the eviction hook */
/* Computes the tier keys of s's blocks hashed from index nh0 on. */
void engine_tier_after_commit(engine *e, eng_seq *s, int32_t nh0);
/* After a device prefix match: loads the following blocks from the tiers
 * (and device blocks after them); returns the tokens added to s->kv. */
int64_t engine_tier_extend(engine *e, eng_seq *s);
void engine_tier_preempt(engine *e, eng_seq *v);      /* before its blocks go */
/* The tier key of device block b while it is hashed (NULL: none, no tiers);
 * the model fingerprint the keys chain from; the host tier's bytes. */
const uint8_t *engine_tier_key(const engine *e, int32_t block);
const uint8_t *engine_tier_fingerprint(const engine *e);
uint64_t engine_tier_host_bytes(const engine *e);
void engine_tier_observe(engine *e, int32_t prefill_tokens, int32_t tokens, double seconds);
void engine_tier_snapshot(engine *e);
/* 1 while the tiers have idle-time work: the disk tier's start-up scan,
 * blocks waiting for write-through, disk writes to take in (engine thread). */
int engine_tier_busy(engine *e);
/* Idle-time tier work (write-through offers, the scan's next slice;
 * engine thread). */
void engine_tier_idle(engine *e);

/* engine_offload.c (no-ops without --weights-memory).  plan: the placement
 * for budget; *weights_bytes becomes the device bytes of weights when a
 * layer is streamed (unchanged otherwise); auto_cap > 0 (weights that do
 * not fit, no --weights-memory: plan_fit_weights) is the cap the planner
 * chose.  start: after the memory manager exists, before load_weights.
 * stop: after unload_weights. */
int engine_offload_plan(engine *e, uint64_t budget, uint64_t auto_cap, struct wstream_plan *p,
                        uint64_t *weights_bytes, kvant_err *err);
int engine_offload_start(engine *e, const struct wstream_plan *p, kvant_err *err);
void engine_offload_stop(engine *e);
void engine_offload_print(struct wstream *ws);

/* Tensor parallelism (engine_tp.c); each is a no-op without cfg.tp_group.
 * begin: before the plan (creates e->mem with the budget, cuts the model to
 * this rank's share); agree: every rank once, failed or not (rc, local:
 * this rank's status), *n_blocks becomes the smallest over ranks; attach:
 * after fwd_init; stop: before fwd_free (rank 0 releases the workers);
 * free: after the backend unloaded the weights. */
int engine_tp_begin(engine *e, mem_allocator alloc, uint64_t budget, kvant_err *err);
uint64_t engine_tp_extra_bytes(const engine *e);
int engine_tp_agree(engine *e, int rc, const kvant_err *local, int32_t *n_blocks,
                    kvant_err *err);
int engine_tp_attach(engine *e, kvant_err *err);
void engine_tp_kv_copy(engine *e, int32_t dst, int32_t src);
void engine_tp_after_step(engine *e, int rc, const char *msg);
void engine_tp_health(engine *e, engine_health *out);
void engine_tp_stop(engine *e);
void engine_tp_free(engine *e);

#endif
