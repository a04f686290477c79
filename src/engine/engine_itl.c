/* engine_itl.c - the step-cost model and the inter-token-latency budget
 * (engine_itl.h). */
#include "engine/engine_itl.h"

#define ITL_FIT_DECAY 0.995  /* per step: the fit follows ~200 recent steps */
#define ITL_FIT_MIN_VAR 0.05 /* tokens^2: steps of one size give no slope */

void step_fit_add(step_fit *fit, double tokens, double seconds, double decay)
{
    double *f = fit->f;
    for (int i = 0; i < 5; i++)
        f[i] *= decay;
    f[0] += 1.0;
    f[1] += tokens;
    f[2] += seconds;
    f[3] += tokens * tokens;
    f[4] += tokens * seconds;
}

int step_fit_solve(const step_fit *fit, double min_var, double *base, double *per_token)
{
    const double *f = fit->f;
    *base = *per_token = 0;
    if (f[0] < 1.5 || !(f[1] > 0)) /* two steps weigh 1 + decay */
        return STEP_FIT_NONE;
    const double mn = f[1] / f[0], mt = f[2] / f[0], var = f[3] / f[0] - mn * mn;
    const double b = var < min_var ? 0 : (f[4] / f[0] - mn * mt) / var;
    if (!(b > 0)) { /* one step size, or noise that makes big steps look cheap */
        *per_token = mt / mn; /* all of it per token: the budget errs short */
        return STEP_FIT_PROP;
    }
    const double a = mt - b * mn;
    *base = a > 0 ? a : 0;
    *per_token = b;
    return STEP_FIT_LINE;
}

void engine_itl_observe(engine *e, int32_t tokens, double seconds)
{
    if (tokens > 0 && seconds > 0)
        step_fit_add(&e->itl_fit, tokens, seconds, ITL_FIT_DECAY);
}

int engine_itl_cost(const engine *e, double *base, double *per_token)
{
    return step_fit_solve(&e->itl_fit, ITL_FIT_MIN_VAR, base, per_token);
}

void engine_itl_note(engine *e, int32_t n_tokens)
{
    e->itl_limited_steps +=
        e->itl_budget < e->cfg.max_num_batched_tokens && n_tokens >= e->itl_budget;
}

int engine_itl_decoding(const eng_seq *s)
{
    return s->n_generated > 0 && s->n_computed == s->n_tokens - 1;
}

int32_t engine_itl_budget(engine *e, int32_t *decoding)
{
    const int32_t cap = e->cfg.max_num_batched_tokens;
    int32_t dec = 0;
    for (const eng_seq *s = e->running; s; s = s->next)
        dec += engine_itl_decoding(s);
    *decoding = dec;
    double base, per_token;
    e->itl_budget = cap;
    if (e->cfg.max_itl_ms <= 0 || dec == 0 ||
        !engine_itl_cost(e, &base, &per_token) || !(per_token > 0))
        return cap;
    const double n = (e->cfg.max_itl_ms * 1e-3 - base) / per_token;
    const int32_t floor_tokens = dec + 1 < cap ? dec + 1 : cap;
    int32_t b = n >= (double)cap ? cap : n < (double)floor_tokens ? floor_tokens : (int32_t)n;
    e->itl_budget = b;
    return b;
}
