/* test_engine_spec.c - speculative decoding by prompt lookup (engine_spec.h)
 * on a tiny random model stepped by hand.  The reference is the same engine
 * configuration without --spec: every greedy request gives exactly its
 * tokens and log-probabilities (bitwise) alone, in a batch of six, under
 * preemption (a pool too small for the batch) and after prefix-cache hits;
 * a prompt made of an earlier request's prompt and output, served from the
 * blocks speculation wrote, continues exactly as the reference does (no
 * rejected draft reached a cached block).  Drafts are made and some are
 * rejected (so verification is exercised both ways); requests that opt out
 * draft nothing; sampled requests draft, accept some and repeat their
 * tokens for a seed (their distribution is test_sampler.c's); the counters
 * agree with the requests' own.  engine_spec_lookup is checked on hand-worked cases.
 * A draft model (engine_draft.h) gives the reference's tokens too: the
 * target itself as its draft (every draft accepted) and another random
 * model (most rejected), alone and in a batch under preemption; its
 * budget shows as draft_weights and draft_kv, its pool is empty once the
 * requests are done, and a draft of another vocabulary is refused. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/engine_draft.h"
#include "engine/engine_spec.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define MAX_GEN 48
#define N_REQ 6

typedef struct result {
    int32_t toks[MAX_GEN];
    float lps[MAX_GEN];
    int32_t n;
    int done, error;
    int64_t drafted, accepted, cached;
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
        r->drafted = ev->draft_tokens;
        r->accepted = ev->accepted_tokens;
        r->cached = ev->cached_tokens;
    }
}

static engine *mk_draft(model *m, int spec, int32_t kv_blocks, const char *draft)
{
    engine_config c = engine_config_default();
    c.spec_draft_model = draft;
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 256;
    c.max_num_seqs = 16;
    c.kv_blocks_override = kv_blocks;
    c.device_memory = 1ull << 30;
    c.spec = spec;
    c.spec_max_batch = 8;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static engine *mk(model *m, int spec, int32_t kv_blocks)
{
    return mk_draft(m, spec, kv_blocks, NULL);
}

/* Prompt i: a short phrase repeated with a varying tail, so that n-grams
 * recur (the random model's greedy outputs also fall into loops). */
static int64_t prompt(int i, int32_t *p)
{
    static const int32_t phrase[] = {72, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100};
    int64_t n = 0;
    for (int r = 0; r < 3 + i % 2; r++) {
        for (size_t k = 0; k < sizeof phrase / sizeof phrase[0]; k++)
            p[n++] = phrase[k] + (int32_t)(k == (size_t)(i % 5) ? i : 0);
        p[n++] = 33 + i + r;
    }
    return n;
}

static engine_request req(const int32_t *p, int64_t n, float temp)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = MAX_GEN - 8, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    r.sampling = sampler_params_default();
    r.sampling.temperature = temp;
    r.sampling.seed = 7;
    return r;
}

static void run(engine *e, result *res, int n)
{
    for (int step = 0; step < 20000; step++) {
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
    if (a->n != b->n || a->error || b->error)
        return 0;
    for (int j = 0; j < a->n; j++)
        if (a->toks[j] != b->toks[j] || memcmp(&a->lps[j], &b->lps[j], sizeof a->lps[j]))
            return 0;
    return 1;
}

static void test_lookup(void)
{
    int32_t out[8];
    const int32_t t[] = {1, 2, 3, 4, 5, 1, 2, 3, 9, 1, 2, 3};
    /* the latest earlier "1 2 3" is at 5, followed by 9 1 2 3 */
    CHECK(engine_spec_lookup(t, 12, 2, 3, out, 8) == 4);
    CHECK(out[0] == 9 && out[1] == 1 && out[2] == 2 && out[3] == 3);
    CHECK(engine_spec_lookup(t, 12, 2, 3, out, 2) == 2 && out[0] == 9 && out[1] == 1);
    /* "3 9" occurs once only (at its own place): no match of length 2; length 1 "9": none */
    const int32_t u[] = {7, 3, 9};
    CHECK(engine_spec_lookup(u, 3, 1, 2, out, 4) == 0);
    /* the longest n-gram wins: "5 6" last seen at 0 (-> 7), "6" alone later (-> 8) */
    const int32_t v[] = {5, 6, 7, 6, 8, 5, 6};
    CHECK(engine_spec_lookup(v, 7, 1, 2, out, 1) == 1 && out[0] == 7);
    CHECK(engine_spec_lookup(v, 7, 1, 1, out, 1) == 1 && out[0] == 8);
    CHECK(engine_spec_lookup(v, 7, 1, 2, out, 0) == 0);
    CHECK(engine_spec_lookup(v, 1, 1, 2, out, 4) == 0);
}

/* The requests of prompts [0, N_REQ) on e, all submitted at once. */
static void batch(engine *e, int32_t p[N_REQ][64], const int64_t *np, result *res, float temp,
                  int no_spec)
{
    memset(res, 0, sizeof(result) * N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], np[i], temp);
        r.no_spec = no_spec;
        CHECK(engine_submit(e, &r, on_event, &res[i], NULL) > 0);
    }
    run(e, res, N_REQ);
}

/* The reference: each greedy request alone without speculation. */
static void reference(model *m, int32_t p[N_REQ][64], const int64_t *np, result *ref)
{
    engine *e = mk(m, ENGINE_SPEC_OFF, 256);
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], np[i], 0.0f);
        CHECK(engine_submit(e, &r, on_event, &ref[i], NULL) > 0);
        run(e, &ref[i], 1);
    }
    engine_destroy(e);
}

static void test_exact(model *m)
{
    static int32_t p[N_REQ][64];
    int64_t np[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        np[i] = prompt(i, p[i]);
    static result ref[N_REQ], got[N_REQ], again[N_REQ];

    reference(m, p, np, ref);
    engine *e;

    /* alone, with speculation */
    e = mk(m, ENGINE_SPEC_NGRAM, 256);
    int64_t drafted = 0, accepted = 0;
    for (int i = 0; i < N_REQ; i++) {
        engine_request r = req(p[i], np[i], 0.0f);
        CHECK(engine_submit(e, &r, on_event, &got[i], NULL) > 0);
        run(e, &got[i], 1);
        CHECKF(same(&ref[i], &got[i]), "request %d alone", i);
        drafted += got[i].drafted;
        accepted += got[i].accepted;
    }
    CHECKF(drafted > 0 && accepted > 0 && accepted < drafted,
           "drafted %lld accepted %lld: both outcomes of verification exercised",
           (long long)drafted, (long long)accepted);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.spec_draft_tokens == (uint64_t)drafted);
    CHECK(st.spec_accepted_tokens == (uint64_t)accepted);
    uint64_t passes = 0;
    for (int k = 0; k < ENGINE_SPEC_HIST; k++)
        passes += st.spec_verify_hist[k];
    CHECK(passes > 0 && st.spec_ratio_sum > 0 && st.spec_ratio_sum <= (double)passes);

    /* the same prompts again: prefix-cache hits, then the batch of six */
    batch(e, p, np, again, 0.0f, 0);
    for (int i = 0; i < N_REQ; i++) {
        CHECKF(same(&ref[i], &again[i]), "request %d in a batch after cache hits", i);
        CHECK(again[i].cached > 0);
    }

    /* a prompt of request 0's prompt and output, from the blocks speculation wrote */
    static int32_t cont[64 + MAX_GEN];
    memcpy(cont, p[0], (size_t)np[0] * sizeof *cont);
    memcpy(cont + np[0], ref[0].toks, (size_t)ref[0].n * sizeof *cont);
    int64_t nc = np[0] + ref[0].n;
    static result c_spec, c_ref;
    engine_request rc = req(cont, nc, 0.0f);
    rc.max_tokens = 8;
    rc.no_spec = 1;
    CHECK(engine_submit(e, &rc, on_event, &c_spec, NULL) > 0);
    run(e, &c_spec, 1);
    CHECKF(c_spec.cached >= 16, "cached %lld", (long long)c_spec.cached);
    CHECK(c_spec.drafted == 0);
    engine_destroy(e);
    e = mk(m, ENGINE_SPEC_OFF, 256);
    CHECK(engine_submit(e, &rc, on_event, &c_ref, NULL) > 0);
    run(e, &c_ref, 1);
    engine_destroy(e);
    CHECK(same(&c_ref, &c_spec));

    /* preemption: a pool too small for the batch */
    e = mk(m, ENGINE_SPEC_NGRAM, 12);
    batch(e, p, np, got, 0.0f, 0);
    engine_get_stats(e, &st);
    CHECKF(st.preemptions > 0, "preemptions %llu", (unsigned long long)st.preemptions);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&ref[i], &got[i]), "request %d under preemption", i);
    engine_destroy(e);

    /* opted out: no drafts, the reference's tokens */
    e = mk(m, ENGINE_SPEC_NGRAM, 256);
    batch(e, p, np, got, 0.0f, 1);
    engine_get_stats(e, &st);
    CHECK(st.spec_draft_tokens == 0);
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&ref[i], &got[i]) && got[i].drafted == 0, "opted-out request %d", i);
    engine_destroy(e);

    /* sampled (speculative sampling; its distribution: test_sampler.c): drafts
     * are made and accepted, and a seed gives the same tokens each time alone */
    static result s1[N_REQ], s2[N_REQ];
    int64_t s_drafted = 0, s_accepted = 0;
    for (int pass = 0; pass < 2; pass++) {
        e = mk(m, ENGINE_SPEC_NGRAM, 256);
        for (int i = 0; i < N_REQ; i++) {
            result *r = pass ? &s2[i] : &s1[i];
            engine_request q = req(p[i], np[i], 0.3f);
            CHECK(engine_submit(e, &q, on_event, r, NULL) > 0);
            run(e, r, 1);
            s_drafted += pass ? 0 : r->drafted;
            s_accepted += pass ? 0 : r->accepted;
        }
        engine_destroy(e);
    }
    for (int i = 0; i < N_REQ; i++)
        CHECKF(same(&s1[i], &s2[i]) && s1[i].n == MAX_GEN - 8, "sampled request %d", i);
    CHECKF(s_drafted > 0 && s_accepted > 0, "sampled: drafted %lld accepted %lld",
           (long long)s_drafted, (long long)s_accepted);
}

/* The cost model's fit recovers a step time that is linear in the tokens,
 * decode-only steps only, and knows nothing from steps of one size. */
static void test_cost_fit(model *m)
{
    engine *e = mk(m, ENGINE_SPEC_NGRAM, 64);
    if (!e)
        return;
    double base = -1, per = -1;
    for (int i = 0; i < 50; i++)
        engine_spec_observe_step(e, 0, 1, 0.004);
    CHECK(engine_spec_cost(e, &base, &per) == 0 && base == 0 && per == 0);
    for (int i = 0; i < 300; i++) {
        int32_t n = 1 + i % 9;
        engine_spec_observe_step(e, 0, n, 0.010 + 0.002 * n);
        engine_spec_observe_step(e, 100, n + 100, 1.0); /* a prefill step: not fitted */
    }
    CHECK(engine_spec_cost(e, &base, &per) == 1);
    CHECKF(fabs(base - 0.010) < 1e-3 && fabs(per - 0.002) < 2e-4,
           "base %g per token %g (the step's 0.010 + 0.002 n, and the decayed one-size steps)",
           base, per);
    engine_destroy(e);
}

/* The draft's reservations and pool after a run. */
static void check_draft_memory(engine *e)
{
    const engine_draft_plan *dp = engine_draft_get_plan(e);
    CHECK(dp != NULL);
    if (!dp)
        return;
    mem_report *rep = calloc(1, sizeof *rep);
    mem_get_report(engine_mem(e), rep);
    CHECKF(rep->cat[MEM_DRAFT_WEIGHTS].current == dp->weights_bytes &&
           rep->cat[MEM_DRAFT_KV].current == dp->kv_bytes && dp->weights_bytes > 0 &&
           dp->kv_bytes > 0, "draft_weights %llu draft_kv %llu",
           (unsigned long long)rep->cat[MEM_DRAFT_WEIGHTS].current,
           (unsigned long long)rep->cat[MEM_DRAFT_KV].current);
    free(rep);
    int32_t total = 0, used = -1;
    engine_draft_blocks(e, &total, &used);
    CHECKF(total > 0 && used == 0, "draft pool: %d blocks, %d in use after the requests", total,
           used);
}

static void test_draft(model *m)
{
    char own[256], other[256], vocab[256];
    tu_tmp_path(own, sizeof own, "draft_same.gguf");
    tu_tmp_path(other, sizeof other, "draft_other.gguf");
    tu_tmp_path(vocab, sizeof vocab, "draft_vocab.gguf");
    CHECK(tiny_model_write(own, 42) == 0);  /* the target's own weights */
    CHECK(tiny_model_write_layers(other, 43, 1) == 0);
    static int32_t p[N_REQ][64];
    int64_t np[N_REQ];
    for (int i = 0; i < N_REQ; i++)
        np[i] = prompt(i, p[i]);
    static result ref[N_REQ], got[N_REQ];
    reference(m, p, np, ref);
    engine *e;
    const char *drafts[2] = {own, other};
    for (int d = 0; d < 2; d++) {
        int64_t drafted = 0, accepted = 0;
        e = mk_draft(m, ENGINE_SPEC_DRAFT, 256, drafts[d]);
        if (!e)
            continue;
        for (int i = 0; i < N_REQ; i++) {
            engine_request r = req(p[i], np[i], 0.0f);
            memset(&got[i], 0, sizeof got[i]);
            CHECK(engine_submit(e, &r, on_event, &got[i], NULL) > 0);
            run(e, &got[i], 1);
            CHECKF(same(&ref[i], &got[i]), "draft %d: request %d alone", d, i);
            drafted += got[i].drafted;
            accepted += got[i].accepted;
        }
        CHECKF(drafted > 0 && (d == 0 ? accepted == drafted : accepted < drafted / 2),
               "draft %d: drafted %lld accepted %lld", d, (long long)drafted, (long long)accepted);
        check_draft_memory(e);
        engine_destroy(e);
        /* a batch in a pool too small for it: preemption releases the draft's blocks */
        e = mk_draft(m, ENGINE_SPEC_DRAFT, 12, drafts[d]);
        if (!e)
            continue;
        batch(e, p, np, got, 0.0f, 0);
        engine_stats st;
        engine_get_stats(e, &st);
        CHECKF(st.preemptions > 0, "draft %d: preemptions %llu", d,
               (unsigned long long)st.preemptions);
        for (int i = 0; i < N_REQ; i++) {
            CHECKF(same(&ref[i], &got[i]), "draft %d: request %d under preemption", d, i);
            /* the target's own weights: a stale draft position would show here */
            CHECKF(d != 0 || got[i].accepted == got[i].drafted, "own draft, request %d: "
                   "drafted %lld accepted %lld", i, (long long)got[i].drafted,
                   (long long)got[i].accepted);
        }
        check_draft_memory(e);
        engine_destroy(e);
    }
    /* a draft of another vocabulary is refused, naming it */
    unlink(own);
    unlink(other);
    CHECK(tiny_model_write_vocab(vocab, 42, 299) == 0);
    engine_config c = engine_config_default();
    c.manual = 1;
    c.device_memory = 1ull << 30;
    c.spec = ENGINE_SPEC_DRAFT;
    c.spec_draft_model = vocab;
    kvant_err err = {0};
    e = engine_create(m, &c, &err);
    CHECKF(e == NULL && err.code == KV_EINVAL && strstr(err.msg, "vocabulary"),
           "another vocabulary: %s", err.msg);
    engine_destroy(e);
    unlink(vocab);
}

int main(void)
{
    dtype_init();
    test_lookup();
    model *m = tiny_model_load(NULL, 42);
    if (m) {
        test_exact(m);
        test_cost_fit(m);
        test_draft(m);
        model_free(m);
    }
    return tu_finish("test_engine_spec");
}
