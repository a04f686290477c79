/* engine_draft.h - speculative decoding with a draft model (engine_draft.c).
 *
 * A second, smaller model of the same vocabulary proposes tokens greedily
 * for a decoding sequence; the target verifies them in one batched pass
 * (engine_spec.h, engine_step.c's verify_drafts).  Greedy proposals are a
 * point-mass draft distribution, so speculative sampling against them
 * (sampler_sample_draft) keeps sampled output on the target's distribution.
 *
 * Memory: the draft's footprint is planned from its header
 * (engine_draft_plan: its weights, an activation workspace for
 * ENGINE_DRAFT_CHUNK tokens and a KV pool for spec_max_batch sequences of
 * the context).  The engine takes it out of its budget before its own plan
 * (plan_config.reserved_bytes) and reserves it in its memory manager as
 * draft_weights, draft_kv and activations; the draft allocates from a
 * manager of its own whose budget is exactly that footprint, so it can
 * never take more than the plan showed.
 *
 * KV: a pool of its own, without prefix caching, and one fixed table per
 * sequence in the request's storage (eng_seq.kv_d).  kv_d.n_tokens are the
 * leading positions whose draft K/V were computed from the sequence's own
 * tokens.  Scheduling reserves a sequence's draft positions
 * (engine_draft_reserve); once the step is scheduled, engine_draft_fill
 * catches each sequence up over the tokens the draft has not seen (the
 * prompt, serially, at its first proposal) and then proposes for all of
 * them at once: round j is one batched pass with a token of each sequence
 * still short of its drafts.  After verification the table rolls back to
 * the positions the target kept (engine_draft_rollback: a commit of fewer
 * tokens, no copy).
 * A sequence for which the draft pool has no blocks drafts nothing: drafts
 * never preempt anyone.
 *
 * Ownership: the engine owns its eng_draft (engine_draft_open creates it,
 * engine_draft_destroy frees it, model included).  Threading: the engine
 * thread, except open/start/destroy (engine_create / engine_destroy). */
#ifndef KVANT_ENGINE_DRAFT_H
#define KVANT_ENGINE_DRAFT_H

#include <stdint.h>

#include "engine/engine_types.h"

#define ENGINE_DRAFT_CHUNK 256   /* tokens per catch-up pass of the draft */
#define ENGINE_DRAFT_MAX_SEQS 16 /* sequences proposed for in one step (and whose
                                  * KV the draft's pool holds) at most */

typedef struct eng_draft eng_draft;
struct eng_seq;
struct engine;

/* The draft's share of the budget, from its header and the target's
 * configuration (ctx: the target's context, 0 = the smaller of the two
 * models' trained contexts). */
typedef struct engine_draft_plan {
    uint64_t weights_bytes;
    uint64_t activation_bytes;  /* workspace for ENGINE_DRAFT_CHUNK tokens, one row */
    uint64_t kv_bytes;          /* kv_blocks of kv_block_bytes */
    uint64_t kv_block_bytes;    /* one block, all layers, K and V */
    int32_t kv_blocks;
    int64_t kv_tokens;          /* kv_blocks * block_size */
    int64_t ctx;                /* the context it was sized for */
    int32_t max_seqs;           /* sequences of ctx the pool holds (spec_max_batch) */
} engine_draft_plan;

/* Plans dm as a draft for a target served with c, its KV pool for
 * max_seqs sequences (engine_spec_resolve's max_batch).  KV_EINVAL when
 * its shape is outside the planner's limits or the KV dtype cannot store
 * it; KV_ERANGE for a pool too large. */
int engine_draft_plan_of(const model *dm, const model *target, const engine_config *c,
                         int32_t max_seqs, engine_draft_plan *out, kvant_err *err);
static inline uint64_t engine_draft_plan_bytes(const engine_draft_plan *p)
{
    return p->weights_bytes + p->activation_bytes + p->kv_bytes;
}

/* Refuses a draft whose vocabulary differs from the target's (size, or the
 * text of any token, named), KV_EINVAL with err filled. */
int engine_draft_check_vocab(const model *dm, const model *target, kvant_err *err);

/* Loads c->spec_draft_model, checks it against e's model and plans it
 * for max_seqs sequences (e->draft; nothing allocated in any budget yet).
 * KV_OK also when spec is not ENGINE_SPEC_DRAFT (then e->draft stays NULL). */
int engine_draft_open(struct engine *e, int32_t max_seqs, kvant_err *err);
/* The planned bytes of e's draft (0 without one). */
uint64_t engine_draft_reserved(const struct engine *e);
/* After e->mem exists: reserves the plan in it, creates the draft's
 * manager, backend, weights, workspace and KV pool. */
int engine_draft_start(struct engine *e, kvant_err *err);
void engine_draft_destroy(struct engine *e);
/* The plan e's draft was started with (NULL without one). */
const engine_draft_plan *engine_draft_get_plan(const struct engine *e);

/* Scheduling: reserves the draft positions for k drafts after s's tokens
 * (k <= ENGINE_SPEC_MAX) and queues s for this step's proposals; returns k,
 * or 0 (no room in the pool, or plan.max_seqs sequences queued already). */
int32_t engine_draft_reserve(struct engine *e, struct eng_seq *s, int32_t k);
/* After scheduling: proposes for every queued sequence (batched passes),
 * writing its drafts to s->draft and s->tokens[n_tokens..] and setting
 * s->n_draft to how many it got (fewer than reserved only when a pass
 * failed); empties the queue. */
void engine_draft_fill(struct engine *e);
/* After verification, or when s's drafts are not scheduled after all: the
 * draft keeps the positions below s->n_computed (s leaves the queue). */
void engine_draft_rollback(struct engine *e, struct eng_seq *s);
/* Gives back s's draft blocks (finish, preemption; s leaves the queue). */
void engine_draft_release(struct engine *e, struct eng_seq *s);
/* The draft pool's blocks: total and in use (for stats). */
void engine_draft_blocks(const struct engine *e, int32_t *total, int32_t *used);

#endif
