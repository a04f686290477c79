/* sampler.h - token sampling: greedy, temperature, top-k, top-p, min-p,
 * repetition / presence / frequency penalties; seeded and reproducible.
 *
 * Pipeline (llama.cpp / vLLM order): penalties -> logit bias -> (temperature
 * == 0: argmax) -> top-k -> temperature -> softmax -> top-p -> min-p ->
 * renormalise -> draw.
 *
 * A sampler is caller-owned (sampler_init/sampler_free) and used by one
 * thread at a time.  Its scratch space (16 bytes per vocabulary entry) is
 * either allocated at init (sampler_init) or borrowed from a
 * sampler_scratch that several samplers share (sampler_init_shared: no
 * allocation; the engine's sequences sample one at a time on its thread).
 * The scratch carries nothing from one call to the next, so sharing it
 * changes no result.  sampler_sample does not allocate.
 * Reproducibility: the same params, seed, logits and history give the same
 * token on every machine (the RNG is xoroshiro128++ seeded by splitmix64,
 * not rand()).
 */
#ifndef KVANT_SAMPLER_H
#define KVANT_SAMPLER_H

#include <stdint.h>

#include "util/err.h"

#define SAMPLER_MAX_LOGIT_BIAS 300  /* entries of logit_bias (OpenAI's limit) */
#define SAMPLER_BIAS_BAN (-100.0f)  /* this bias bans the token (its logit becomes -inf) */

typedef struct sampler_bias {
    int32_t token;            /* ids outside [0, n_vocab) are ignored (callers validate) */
    float bias;               /* added to the logit, [-100, 100]; -100 bans */
} sampler_bias;

typedef struct sampler_params {
    float temperature;        /* 0 = greedy; must be finite and >= 0 */
    int32_t top_k;            /* <= 0 (or >= n_vocab) = disabled */
    float top_p;              /* (0, 1]; 1 = disabled */
    float min_p;              /* [0, 1]; 0 = disabled */
    float repetition_penalty; /* > 0, finite; 1 = disabled (llama.cpp / HF convention) */
    float presence_penalty;   /* [-2, 2]; 0 = disabled (OpenAI convention) */
    float frequency_penalty;  /* [-2, 2]; 0 = disabled */
    int32_t penalty_last_n;   /* window of history for penalties; -1 = all, 0 = none */
    uint64_t seed;
    int32_t n_logit_bias;     /* [0, SAMPLER_MAX_LOGIT_BIAS]; 0 = none */
    sampler_bias logit_bias[SAMPLER_MAX_LOGIT_BIAS]; /* applied after the penalties */
} sampler_params;

sampler_params sampler_params_default(void); /* greedy, everything disabled */
/* Validates ranges; returns KV_OK or KV_EINVAL with the field named. */
int sampler_params_check(const sampler_params *p, kvant_err *err);

/* Scratch for one sampler_sample call at a time: [n_vocab] each,
 * meaningful only inside a call.  Caller-owned (sampler_scratch_init /
 * sampler_scratch_free); samplers that borrow it must not sample
 * concurrently and must not outlive it. */
typedef struct sampler_scratch {
    int32_t n_vocab;
    float *probs;             /* unnormalised probabilities, by token id */
    int32_t *idx;             /* candidate token ids (heap / sorted prefix) */
    int32_t *counts;          /* history counts by token id; all zero between calls */
    float *saved;             /* raw logits of penalised tokens (logprob only) */
} sampler_scratch;

/* Allocates the four arrays (16 * n_vocab bytes).  KV_EINVAL (n_vocab < 1)
 * or KV_ENOMEM; on failure w is left zeroed. */
int sampler_scratch_init(sampler_scratch *w, int32_t n_vocab, kvant_err *err);
void sampler_scratch_free(sampler_scratch *w); /* idempotent; safe on a zeroed struct */

typedef struct sampler {
    sampler_params p;         /* validated at init; do not change in place */
    uint64_t rng[2];          /* xoroshiro128++ state, never all zero */
    int32_t n_vocab;
    sampler_scratch w;        /* owned (sampler_init) or borrowed pointers (shared) */
    int owns_scratch;
} sampler;

/* Validates *p and n_vocab >= 1 and allocates the scratch; on failure s is
 * left zeroed (sampler_free is still safe).  KV_EINVAL / KV_ENOMEM. */
int sampler_init(sampler *s, const sampler_params *p, int32_t n_vocab, kvant_err *err);
/* As sampler_init, but s borrows w (initialised; n_vocab is w's) and
 * allocates nothing.  KV_EINVAL. */
int sampler_init_shared(sampler *s, const sampler_params *p, const sampler_scratch *w,
                        kvant_err *err);
void sampler_free(sampler *s); /* idempotent; safe on a zeroed struct; a borrowed
                                * scratch is left to its owner */
/* Re-seeds (e.g. after a request restarts from scratch on preemption). */
void sampler_reseed(sampler *s, uint64_t seed);

/* Picks the next token.  logits [n_vocab] (borrowed) is modified in place by
 * the penalties only.  history [n_history] (borrowed): prompt and previously
 * generated tokens, for the penalties; may be NULL when n_history is 0; ids
 * outside [0, n_vocab) are ignored (the engine validates token ids).  NaN
 * logits are never chosen unless every logit is NaN or -inf (then token 0). */
int32_t sampler_sample(sampler *s, float *logits, const int32_t *history, int64_t n_history);
/* As sampler_sample; if logprob is non-NULL it receives the log-softmax of
 * the chosen token under the logits as passed in (before penalties and
 * temperature, vLLM's default), at the cost of one more pass over them. */
int32_t sampler_sample_lp(sampler *s, float *logits, const int32_t *history, int64_t n_history,
                          float *logprob);
/* Speculative sampling against a drafted token (a point-mass draft, as
 * prompt lookup proposes): returns draft with the probability
 * sampler_sample would give it, else a token drawn from sampler_sample's
 * distribution without draft, renormalised; so the token returned follows
 * exactly sampler_sample's distribution, and it equals draft when the draft
 * is accepted.  One uniform more than sampler_sample when the draft can be
 * drawn.  Greedy: the argmax, as sampler_sample.  draft outside
 * [0, n_vocab): sampler_sample. */
int32_t sampler_sample_draft(sampler *s, float *logits, const int32_t *history,
                             int64_t n_history, int32_t draft);

/* argmax with lowest index on ties; NaN never wins; 0 if nothing beats -inf. */
int32_t sampler_argmax(const float *logits, int32_t n);
/* log-softmax value of logits[id] (numerically stable, double accumulation). */
float sampler_logprob(const float *logits, int32_t n, int32_t id);
/* The log-softmax of a whole row at once: lse = sampler_logsumexp(row, n),
 * then logits[id] - lse is sampler_logprob(logits, n, id) bit for bit. */
double sampler_logsumexp(const float *logits, int32_t n);
/* The k (<= n) largest logits' ids, largest first, lowest id first among
 * equals (repeated sampler_argmax); NaN never taken.  Allocates nothing. */
void sampler_top_k_ids(const float *logits, int32_t n, int32_t k, int32_t *ids);

#endif
