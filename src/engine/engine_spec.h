/* engine_spec.h - speculative decoding by prompt lookup (engine_spec.c).
 *
 * A decoding sequence (n 1) drafts up to k tokens: the longest
 * n-gram (spec_ngram_max down to spec_ngram_min tokens) ending its history
 * that occurred earlier in it (prompt or output, the latest occurrence)
 * proposes the tokens that followed that occurrence.  The step schedules
 * the last sampled token and the drafts as one chunk, asks for a logit row
 * at each, and the sample phase (engine_step.c) accepts drafts while the
 * target's own token equals them.  Greedy: the output is the tokens
 * non-speculative decoding gives (the same rows, the same kernels: each
 * row's logits do not depend on the chunk they were computed in).
 * Sampled: each drafted position is sampled by sampler_sample_draft, which
 * accepts the draft with the target's probability of it and otherwise
 * draws from the rest, so the tokens follow the target's distribution
 * exactly (not the same tokens as without speculation for a given seed: the
 * random stream is consumed differently).  Constrained: each position is
 * masked by the grammar state after the tokens accepted before it, so a
 * draft the grammar refuses is rejected and the state only ever advances
 * over emitted tokens.  Rejected
 * positions' K/V stay in blocks past n_computed, which are never committed,
 * hashed or moved to a tier, and are overwritten by the next step.
 *
 * Adaptation: k doubles after a verification that accepted everything and
 * becomes accepted + 1 otherwise; a sequence whose running acceptance rate
 * falls below 1/4 pauses drafting for 16 steps.  No drafting while more than
 * spec_max_batch sequences run.
 *
 * Cost model, with a draft model always (its passes cost real time), by
 * prompt lookup under a batch load (B > 1 sequences running; a sequence
 * alone is then governed by its acceptance rate only, so that a seeded
 * request alone always drafts the same way): decode-only steps' times are
 * fitted as base + per_token x tokens (decayed least squares, so it
 * follows the machine and the load).  With B sequences decoding, a token
 * costs T(B) / B; a drafted token costs per_token in the verification pass
 * plus, with a draft model, one draft pass (per sequence: the passes are
 * batched); it is worth it when the sequence's running acceptance rate times
 * T(B) / B exceeds that cost.  A sequence it declines decodes plainly that
 * step (counted in spec_skipped and spec_cost_off); until the fit has seen
 * steps of different sizes, every eligible sequence drafts. */
#ifndef KVANT_ENGINE_SPEC_H
#define KVANT_ENGINE_SPEC_H

#include <stdint.h>

#include "engine/engine_types.h"

struct eng_seq;

/* The speculation settings of c with its defaults filled in (0 fields
 * take ENGINE_SPEC_DEFAULT_*; the draft length at most ENGINE_SPEC_MAX). */
typedef struct engine_spec_limits {
    int32_t draft_max, ngram_min, ngram_max, max_batch;
} engine_spec_limits;
engine_spec_limits engine_spec_resolve(const engine_config *c);

/* Prompt lookup over toks[0..n): writes at most kmax tokens that followed
 * the latest earlier occurrence of the longest n-gram (nmax down to nmin)
 * ending toks, to out; returns how many (0: no match).  Pure. */
int32_t engine_spec_lookup(const int32_t *toks, int64_t n, int32_t nmin, int32_t nmax,
                           int32_t *out, int32_t kmax);

/* Scheduling: drafts for s (a decode: n_computed == n_tokens - 1) at most
 * room tokens, into s->draft and s->tokens[n_tokens..]; sets and returns
 * s->n_draft (0: a plain decode step).  n_running: sequences running. */
int32_t engine_spec_draft(engine *e, struct eng_seq *s, int32_t room, int32_t n_running);

/* After the sample phase verified s's drafts: accepted of drafted; adapts
 * s's draft length and the counters. */
void engine_spec_observe(engine *e, struct eng_seq *s, int32_t drafted, int32_t accepted);

/* After a step's forward pass of tokens tokens (prefill_tokens of them
 * prompt) that took seconds: a decode-only step feeds the cost model. */
void engine_spec_observe_step(engine *e, int32_t prefill_tokens, int32_t tokens, double seconds);
/* The cost model's fit of a decode step's seconds: *base + *per_token x
 * tokens; 0 (both set to 0) until steps of two sizes were seen. */
int engine_spec_cost(const engine *e, double *base, double *per_token);

#endif
