/* engine_spec.c - prompt-lookup drafting and its adaptation (engine_spec.h). */
#include "engine/engine_spec.h"

#include <string.h>

#include "engine/engine_draft.h"
#include "engine/engine_internal.h"
#include "engine/engine_itl.h"

#define SPEC_PAUSE_STEPS 16
#define SPEC_MIN_RATE 0.25f
#define SPEC_FIT_DECAY 0.99   /* per decode step: the fit follows ~100 recent steps */
#define SPEC_FIT_MIN_VAR 0.05 /* tokens^2: steps of one size give no slope */

static int32_t or_default(int32_t v, int32_t def)
{
    return v > 0 ? v : def;
}

engine_spec_limits engine_spec_resolve(const engine_config *c)
{
    int32_t k = or_default(c->spec_draft_max, ENGINE_SPEC_DEFAULT_DRAFT);
    return (engine_spec_limits){
        .draft_max = k < ENGINE_SPEC_MAX ? k : ENGINE_SPEC_MAX,
        .ngram_min = or_default(c->spec_ngram_min, ENGINE_SPEC_DEFAULT_NGRAM_MIN),
        .ngram_max = or_default(c->spec_ngram_max, ENGINE_SPEC_DEFAULT_NGRAM_MAX),
        .max_batch = or_default(c->spec_max_batch, ENGINE_SPEC_DEFAULT_BATCH),
    };
}

int32_t engine_spec_lookup(const int32_t *toks, int64_t n, int32_t nmin, int32_t nmax,
                           int32_t *out, int32_t kmax)
{
    if (kmax < 1 || nmin < 1 || nmax < nmin)
        return 0;
    for (int32_t g = nmax; g >= nmin; g--) {
        if (n <= g)
            continue;
        const int32_t *tail = toks + n - g;
        /* latest start i < n - g with toks[i..i+g) == tail and a follower */
        for (int64_t i = n - g - 1; i >= 0; i--) {
            if (toks[i] != tail[0] || memcmp(toks + i, tail, (size_t)g * sizeof *toks))
                continue;
            int64_t from = i + g, avail = n - from;
            int32_t k = avail < kmax ? (int32_t)avail : kmax;
            memcpy(out, toks + from, (size_t)k * sizeof *out);
            return k;
        }
    }
    return 0;
}

static int spec_eligible(const engine *e, const eng_seq *s)
{
    const eng_req *r = s->req;
    return e->cfg.spec != ENGINE_SPEC_OFF && !r->p.no_spec && r->p.n == 1 && !r->p.embed &&
           s->n_generated > 0 &&
           s->n_computed == s->n_tokens - 1;
}

void engine_spec_observe_step(engine *e, int32_t prefill_tokens, int32_t tokens, double seconds)
{
    if (e->cfg.spec == ENGINE_SPEC_OFF || prefill_tokens > 0 || tokens < 1 || !(seconds > 0))
        return;
    step_fit_add(&e->spec_fit, tokens, seconds, SPEC_FIT_DECAY);
}

int engine_spec_cost(const engine *e, double *base, double *per_token)
{
    if (step_fit_solve(&e->spec_fit, SPEC_FIT_MIN_VAR, base, per_token) == STEP_FIT_LINE)
        return 1;
    *base = *per_token = 0; /* no slope yet: drafting is not judged */
    return 0;
}

/* Whether drafting for s pays with n_running sequences decoding. */
static int spec_worth(const engine *e, const eng_seq *s, int32_t n_running)
{
    double base, per_token;
    if (e->spec_unjudged || !engine_spec_cost(e, &base, &per_token))
        return 1;
    const double b = n_running > 0 ? n_running : 1;
    const double token_s = (base + per_token * b) / b;
    return (double)s->spec_rate * token_s > per_token + e->spec_draft_pass_s;
}

int32_t engine_spec_draft(engine *e, eng_seq *s, int32_t room, int32_t n_running)
{
    s->n_draft = 0;
    if (!spec_eligible(e, s))
        return 0;
    const engine_spec_limits lim = engine_spec_resolve(&e->cfg);
    if (s->spec_k == 0) { /* first decode step of this sequence */
        s->spec_k = lim.draft_max;
        s->spec_rate = 1.0f;
    }
    int skip = n_running > lim.max_batch || s->spec_pause > 0;
    if (s->spec_pause > 0)
        s->spec_pause--;
    if (!skip && (n_running > 1 || e->draft) && !spec_worth(e, s, n_running)) {
        skip = 1;
        e->spec_cost_off++;
    }
    /* the drafts and the token after them must fit max_tokens, the
     * sequence's storage and the context */
    int64_t left = s->req->p.max_tokens - s->n_generated - 1;
    int64_t ctx_left = e->max_model_len - s->n_tokens - 1;
    int64_t k = s->spec_k < room ? s->spec_k : room;
    k = k < left ? k : left;
    k = k < ctx_left ? k : ctx_left;
    int32_t got = 0;
    if (!skip && k > 0)
        got = e->draft ? engine_draft_reserve(e, s, (int32_t)k) /* drafts: engine_draft_fill */
                       : engine_spec_lookup(s->tokens, s->n_tokens, lim.ngram_min,
                                            lim.ngram_max, s->draft, (int32_t)k);
    if (got == 0) {
        e->spec_skipped++;
        return 0;
    }
    if (!e->draft)
        memcpy(s->tokens + s->n_tokens, s->draft, (size_t)got * sizeof *s->tokens);
    s->n_draft = got;
    return got;
}

void engine_spec_observe(engine *e, eng_seq *s, int32_t drafted, int32_t accepted)
{
    if (drafted < 1)
        return;
    engine_draft_rollback(e, s); /* the draft keeps the positions the target kept */
    const int32_t kmax = engine_spec_resolve(&e->cfg).draft_max;
    int32_t k = accepted == drafted ? 2 * s->spec_k : accepted + 1;
    s->spec_k = k < 1 ? 1 : k > kmax ? kmax : k;
    float rate = (float)accepted / (float)drafted;
    s->spec_rate = 0.75f * s->spec_rate + 0.25f * rate;
    if (s->spec_rate < SPEC_MIN_RATE) {
        s->spec_pause = SPEC_PAUSE_STEPS;
        s->spec_rate = 0.5f; /* a fresh chance after the pause */
    }
    s->req->draft_tokens += drafted;
    s->req->accepted_tokens += accepted;
    /* buckets by upper bound, inclusive as Prometheus's le: .25 .5 .75 < 1, 1 */
    int b = accepted == drafted ? 4 : rate <= 0.25f ? 0 : rate <= 0.5f ? 1 : rate <= 0.75f ? 2 : 3;
    e->spec_rsum += (double)accepted / (double)drafted;
    e->spec_draft += (uint64_t)drafted;
    e->spec_accepted += (uint64_t)accepted;
    e->spec_hist[b]++;
}
