/* test_engine_kvb.c - the per-request KV budget (engine_kvbudget.c) on a
 * tiny random model stepped by hand.  The mask depends on the position
 * alone, so a budgeted request must give bitwise the same tokens and
 * log-probabilities however it is chunked (steps of 16 or 256 tokens),
 * alone or in a batch of six under preemption (a pool too small for the
 * batch), and after a prefix-cache hit of its own mask; its footprint stays
 * within the budget, the blocks it gave back are counted, the pool is empty
 * when the requests are done (the pool's invariants checked by the engine
 * tests' kvpool_check elsewhere; here the counters), a budget the request
 * fits changes nothing, and the mask changes a long request's output (so
 * the comparisons above are not vacuous).  With a host KV tier the
 * evicted blocks come back as a hit, and a swapped batch gives the same
 * outputs (test_tiers).  The snapkv policy likewise (test_snapkv).  Bad
 * budgets are refused at
 * submit naming the field.  (The agreement with the float64 reference is
 * tests/py/test_kv_budget.py's.) */
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define MAX_GEN 120
#define N_REQ 6
#define BUDGET 128 /* bs 16: sinks 16, step 32, window 128 - 16 - 32 - 32 = 48 */

typedef struct result {
    int32_t toks[MAX_GEN];
    float lps[MAX_GEN];
    int32_t n;
    int done, error;
    int64_t kv_blocks, cached;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && r->n < MAX_GEN) {
        r->toks[r->n] = ev->token;
        r->lps[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = 1;
        r->error = ev->type == ENGINE_EV_ERROR;
        r->kv_blocks = ev->kv_blocks;
        r->cached = ev->cached_tokens;
    }
}

static engine *mk(model *m, int32_t kv_blocks, int32_t step_tokens)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = step_tokens;
    c.max_num_seqs = 16;
    c.kv_blocks_override = kv_blocks;
    c.device_memory = 1ull << 30;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static int64_t prompt(int i, int32_t *p)
{
    int64_t n = 90 + 13 * i;
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(i + 1);
    for (int64_t k = 0; k < n; k++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        p[k] = (int32_t)(x % 256);
    }
    return n;
}

static engine_request req(const int32_t *p, int64_t n, double budget)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = MAX_GEN, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1, .kv_budget = budget};
    r.sampling = sampler_params_default();
    r.sampling.temperature = 1.3f;
    r.sampling.seed = 11;
    return r;
}

static void run(engine *e, result *res, int n)
{
    for (int step = 0; step < 50000; step++) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= res[i].done;
        if (all)
            return;
        engine_run_step(e);
    }
    CHECK(!"requests did not finish");
}

static int same(const result *a, const result *b)
{
    return a->n == b->n && !a->error && !b->error &&
           !memcmp(a->toks, b->toks, (size_t)a->n * sizeof a->toks[0]) &&
           !memcmp(a->lps, b->lps, (size_t)a->n * sizeof a->lps[0]);
}

/* Request i alone on e (budget b, policy pol). */
static void alone_pol(engine *e, int i, double b, int32_t pol, result *out)
{
    int32_t p[256];
    const int64_t n = prompt(i, p);
    memset(out, 0, sizeof *out);
    engine_request r = req(p, n, b);
    r.kv_policy = pol;
    kvant_err err = {0};
    CHECKF(engine_submit(e, &r, on_event, out, &err) > 0, "submit: %s", err.msg);
    run(e, out, 1);
}

static void alone(engine *e, int i, double b, result *out)
{
    alone_pol(e, i, b, ENGINE_KV_DEFAULT, out);
}

static void test_invariance(model *m, result *ref)
{
    result big[N_REQ], batch[N_REQ], full;
    engine *e = mk(m, 0, 16), *eb = mk(m, 0, 256), *small = mk(m, 20, 64);
    for (int i = 0; i < N_REQ; i++) {
        alone(e, i, BUDGET, &ref[i]);
        alone(eb, i, BUDGET, &big[i]);
        CHECKF(same(&ref[i], &big[i]), "request %d: steps of 16 and 256 differ", i);
        CHECKF(ref[i].n == MAX_GEN && ref[i].kv_blocks * 16 <= BUDGET,
               "request %d: %d tokens, %lld blocks", i, (int)ref[i].n, (long long)ref[i].kv_blocks);
    }
    /* a batch of six on a pool of 20 blocks (each holds up to 8): preemption */
    int32_t p[N_REQ][256];
    kvant_err err = {0};
    memset(batch, 0, sizeof batch);
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], prompt(i, p[i]), BUDGET);
        CHECKF(engine_submit(small, &r, on_event, &batch[i], &err) > 0, "submit: %s", err.msg);
    }
    run(small, batch, N_REQ);
    engine_stats st;
    engine_get_stats(small, &st);
    CHECKF(st.preemptions > 0, "no preemption (%llu)", (unsigned long long)st.preemptions);
    CHECKF(st.kv_budget_dropped > 40, "%llu blocks given back",
           (unsigned long long)st.kv_budget_dropped);
    CHECKF(st.kv_blocks_used == 0, "%d blocks still used", (int)st.kv_blocks_used);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&ref[i], &batch[i]), "request %d: batch under preemption differs", i);
    /* the same prompt again: a prefix hit of the sinks and the window */
    result again;
    alone(e, 2, BUDGET, &again);
    CHECKF(again.cached >= 48 && same(&again, &ref[2]), "hit %lld", (long long)again.cached);
    /* without a budget the long request differs, and the pool holds it all */
    alone(e, 2, 0, &full);
    CHECK(!same(&full, &ref[2]));
    CHECK(full.cached == 0); /* the budget's blocks are not the full cache's */
    CHECK(full.kv_blocks * 16 >= 90 + 26 + MAX_GEN);
    engine_destroy(e);
    engine_destroy(eb);
    engine_destroy(small);
}

/* KV tiers: a budgeted request's blocks go down to the host tier when
 * evicted (their key chain runs on across its dropped blocks) and come back
 * as a prefix hit with the same output; preempted sequences are swapped
 * (policy ALWAYS) and their outputs do not change. */
static engine *mk_tier(model *m, int32_t blocks)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 16;
    c.kv_blocks_override = blocks;
    c.device_memory = 1ull << 30;
    c.kv_host_memory = 64ull << 20;
    c.kv_tier_policy = ENGINE_TIER_ALWAYS;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static void test_tiers(model *m, const result *ref)
{
    kvant_err err = {0};
    engine *e = mk_tier(m, 20);
    if (!e)
        return;
    /* a batch under preemption, swapped to the host */
    int32_t p[N_REQ][256];
    result batch[N_REQ];
    memset(batch, 0, sizeof batch);
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], prompt(i, p[i]), BUDGET);
        CHECKF(engine_submit(e, &r, on_event, &batch[i], &err) > 0, "submit: %s", err.msg);
    }
    run(e, batch, N_REQ);
    engine_tier_stats ts1;
    engine_get_tier_stats(e, &ts1);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECKF(ts1.swaps > 0, "swaps %llu, preemptions %llu", (unsigned long long)ts1.swaps,
           (unsigned long long)st.preemptions);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&batch[i], &ref[i]), "request %d: swapped batch differs", i);
    result a, churn, again;
    alone(e, 3, BUDGET, &a);
    CHECK(same(&a, &ref[3]));
    for (int i = 0; i < 3; i++) /* other prompts evict request 3's cached blocks */
        alone(e, i, BUDGET, &churn);
    engine_tier_stats ts0;
    engine_get_tier_stats(e, &ts0);
    alone(e, 3, BUDGET, &again);
    engine_get_tier_stats(e, &ts1);
    const uint64_t host = ts1.hit_tokens[KVTIER_HOST] - ts0.hit_tokens[KVTIER_HOST];
    CHECKF(same(&again, &ref[3]) && again.cached >= 48 && host > 0,
           "tier hit: cached %lld, %llu tokens from host", (long long)again.cached,
           (unsigned long long)host);
    engine_destroy(e);
}

/* The N_REQ requests at once under budget 160 and policy pol. */
static void run_batch(engine *e, int32_t pol, result *batch)
{
    static int32_t p[N_REQ][256];
    kvant_err err = {0};
    memset(batch, 0, N_REQ * sizeof *batch);
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], prompt(i, p[i]), 160);
        r.kv_policy = pol;
        CHECKF(engine_submit(e, &r, on_event, &batch[i], &err) > 0, "submit: %s", err.msg);
    }
    run(e, batch, N_REQ);
}

/* snapkv or h2o (budget 160, bs 16: step 32, window 48, 3 kept blocks): prompts
 * 0 and 1 fit the kept blocks and the window (nothing chosen), 2-5 are
 * compacted.  Bitwise the same in steps of 16 and 256 and in a batch of six
 * under preemption (recomputed: the same selection); the compacted ones
 * differ from the full cache and from the sinks policy; blocks go back. */
static void test_snapkv(model *m, const result *sinks, result *a, int32_t pol)
{
    result b[N_REQ], batch[N_REQ], full;
    engine *e = mk(m, 0, 16), *eb = mk(m, 0, 256), *small = mk(m, 24, 64);
    for (int i = 0; i < N_REQ; i++) {
        alone_pol(e, i, 160, pol, &a[i]);
        alone_pol(eb, i, 160, pol, &b[i]);
        CHECKF(same(&a[i], &b[i]), "snapkv %d: steps of 16 and 256 differ", i);
    }
    run_batch(small, pol, batch);
    engine_stats st;
    engine_get_stats(small, &st);
    CHECKF(st.preemptions > 0, "snapkv: no preemption");
    CHECKF(st.kv_budget_dropped > 20 && st.kv_blocks_used == 0, "dropped %llu, used %d",
           (unsigned long long)st.kv_budget_dropped, (int)st.kv_blocks_used);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&a[i], &batch[i]), "snapkv %d: batch under preemption differs", i);
    for (int i = 2; i < N_REQ; i++) {
        alone(e, i, 0, &full);
        CHECKF(!same(&full, &a[i]) && !same(&sinks[i], &a[i]), "snapkv %d: no effect", i);
    }
    engine_destroy(e);
    engine_destroy(eb);
    engine_destroy(small);
}

/* snapkv or h2o with a host tier (swap on preemption): a batch gives the
 * outputs of test_snapkv (compacted blocks are not in the tiers:
 * recomputed); snapkv's prompt blocks come back from the host as a prefix
 * hit, up to the observation window (h2o scores every prompt token: none). */
static void test_snapkv_tiers(model *m, const result *a, int32_t pol)
{
    engine *e = mk_tier(m, 24);
    if (!e)
        return;
    result batch[N_REQ], x, again;
    run_batch(e, pol, batch);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECKF(st.preemptions > 0, "snapkv tiers: no preemption");
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&batch[i], &a[i]), "snapkv %d: swapped batch differs", i);
    for (int i = 0; i < 3; i++) /* evict request 5's cached prompt blocks */
        alone_pol(e, i, 160, pol, &x);
    engine_tier_stats t0, t1;
    engine_get_tier_stats(e, &t0);
    alone_pol(e, 5, 160, pol, &again);
    engine_get_tier_stats(e, &t1);
    const uint64_t host = t1.hit_tokens[KVTIER_HOST] - t0.hit_tokens[KVTIER_HOST];
    if (pol == ENGINE_KV_H2O) /* every prompt token is scored: no prefix hit */
        CHECKF(same(&again, &a[5]) && again.cached == 0, "h2o: cached %lld",
               (long long)again.cached);
    else
        CHECKF(same(&again, &a[5]) && again.cached >= 96 && again.cached <= 155 - 32 &&
                   host > 0, "snapkv tier hit: cached %lld, %llu from host",
               (long long)again.cached, (unsigned long long)host);
    engine_destroy(e);
}

static void test_fits_and_refusals(model *m)
{
    engine *e = mk(m, 0, 64);
    result a, b;
    alone(e, 0, 0, &a);
    alone(e, 0, 0.9, &b); /* 0.9 of 1024: the request fits */
    CHECK(same(&a, &b) && b.cached > 0);
    int32_t p[256];
    const int64_t n = prompt(0, p);
    struct {
        double budget;
        int32_t policy, sinks;
        const char *field;
    } bad[] = {
        {90, ENGINE_KV_DEFAULT, 0, "kv_budget:"}, /* below 16 + 32 + 48 */
        {-1, ENGINE_KV_DEFAULT, 0, "kv_budget:"},
        {128, ENGINE_KV_FULL, 0, "kv_budget:"},
        {0, ENGINE_KV_SINKS, 0, "kv_budget:"},
        {128, 7, 0, "kv_policy:"},
        {128, ENGINE_KV_DEFAULT, -2, "kv_sinks:"},
        {120, ENGINE_KV_SNAPKV, 0, "kv_budget:"}, /* no block left to keep */
        {160, ENGINE_KV_SNAPKV, 4, "kv_sinks:"},
        {0, ENGINE_KV_SNAPKV, 0, "kv_budget:"},
        {160, ENGINE_KV_H2O, 4, "kv_sinks:"},
        {128, 5, 0, "kv_policy:"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        engine_request r = req(p, n, bad[k].budget);
        r.kv_policy = bad[k].policy;
        r.kv_sinks = bad[k].sinks;
        kvant_err err = {0};
        result x = {0};
        CHECKF(engine_submit(e, &r, on_event, &x, &err) == KV_EINVAL &&
                   !strncmp(err.msg, bad[k].field, strlen(bad[k].field)),
               "case %zu: %s", k, err.msg);
    }
    engine_destroy(e);
}

int main(void)
{
    dtype_init();
    model *m = tiny_model_load(NULL, 42);
    if (m) {
        static result ref[N_REQ];
        test_invariance(m, ref);
        test_tiers(m, ref);
        static result snap[N_REQ], h2o[N_REQ];
        test_snapkv(m, ref, snap, ENGINE_KV_SNAPKV);
        test_snapkv_tiers(m, snap, ENGINE_KV_SNAPKV);
        test_snapkv(m, ref, h2o, ENGINE_KV_H2O);
        test_snapkv_tiers(m, h2o, ENGINE_KV_H2O);
        for (int i = 2; i < N_REQ; i++)
            CHECKF(!same(&snap[i], &h2o[i]), "request %d: snapkv and h2o alike", i);
        test_fits_and_refusals(m);
        model_free(m);
    }
    return tu_finish("test_engine_kvb");
}
