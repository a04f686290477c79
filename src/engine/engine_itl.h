/* engine_itl.h - the step-cost model and the inter-token-latency budget.
 *
 * Step cost: every step's forward pass is fitted as base + per_token x
 * tokens seconds (least squares over exponentially decayed sums, so the fit
 * follows the recent steps; the speculative-decoding cost model uses the
 * same fit over its decode steps).
 *
 * ITL budget (engine_config.max_itl_ms > 0): a step that advances decoding
 * sequences takes at most the tokens the fit says cost max_itl_ms, never
 * fewer than the decodes plus one, never more than max_num_batched_tokens;
 * prefill chunks fill what the decodes leave (running prefills leave room
 * for the decodes after them), and a waiting prompt runs ahead of the
 * decodes only when it fits that budget.  Steps without decodes, and every
 * step until the fit has two steps of different sizes, keep
 * max_num_batched_tokens.  Engine thread only, no allocation.
 */
#ifndef KVANT_ENGINE_ITL_H
#define KVANT_ENGINE_ITL_H

#include <stdint.h>

#include "engine/engine_internal.h"

/* Adds one step of `tokens` tokens that took `seconds`, after multiplying
 * the older sums by decay (0 < decay <= 1). */
void step_fit_add(step_fit *f, double tokens, double seconds, double decay);

/* The fit's base and per-token seconds (both >= 0): STEP_FIT_LINE, or
 * STEP_FIT_PROP when the steps' sizes vary by less than min_var tokens^2
 * or the line's slope is not positive (timing noise on a loaded machine)
 * (no slope: the cost taken as proportional to the tokens, base 0), or
 * STEP_FIT_NONE (both 0) while it has fewer than two steps. */
enum { STEP_FIT_NONE = 0, STEP_FIT_PROP = 1, STEP_FIT_LINE = 2 };
int step_fit_solve(const step_fit *f, double min_var, double *base, double *per_token);

/* Records a step's forward pass (every step that ran one). */
void engine_itl_observe(engine *e, int32_t tokens, double seconds);

/* The fit of every step's pass (step_fit_solve). */
int engine_itl_cost(const engine *e, double *base, double *per_token);

/* This step's token budget (max_num_batched_tokens, or the ITL budget when
 * running sequences decode); *decoding = how many do. */
int32_t engine_itl_budget(engine *e, int32_t *decoding);

/* Counts the step (of n_tokens scheduled) as held by the budget when it
 * filled a budget under max_num_batched_tokens. */
void engine_itl_note(engine *e, int32_t n_tokens);

/* Whether s decodes in this step (its prompt done, one token to compute). */
int engine_itl_decoding(const eng_seq *s);

#endif
