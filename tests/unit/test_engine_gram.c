/* test_engine_gram.c - constrained decoding in the engine (engine_gram.c) on
 * a tiny random model stepped by hand: every constrained output, greedy and
 * sampled, n = 1 and n = 3, matches its regular expression by POSIX regexec
 * (an independent recognizer) and ends with FINISH_STOP on the end-of-
 * sequence token (even with ignore_eos); unconstrained requests batched with
 * constrained ones produce exactly the tokens and log-probabilities they
 * produce alone; the grammar's release callback runs once per accepted
 * request (never for a refused submit); grammar state bytes are counted
 * while requests hold them and return to 0.
 *
 * The vocabulary's token trie is built lazily: an engine that ran only
 * free requests has none (0 bytes, mask words 0, host bytes without it);
 * the first constrained request builds it, its bytes then equal those of a
 * trie built here independently (and host_bytes grows by exactly that),
 * and the tokens and log-probabilities equal those of an engine whose trie
 * was built before any request (engine_grammar_prepare), every token lying
 * in the mask the independent trie computes for its step; eight threads
 * submitting the first constrained requests at once build it once; a build
 * that fails (out of memory, injected) fails that request only, and the
 * next one builds it. */
#include <pthread.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "grammar/earley.h"
#include "grammar/gram.h"
#include "grammar/regex.h"
#include "grammar/tokmask.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define MAX_GEN 40

typedef struct result {
    int32_t toks[ENGINE_MAX_N][MAX_GEN];
    float lps[ENGINE_MAX_N][MAX_GEN];
    int32_t n[ENGINE_MAX_N];
    engine_finish finish[ENGINE_MAX_N];
    int done, error;
    double gram_s;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index < ENGINE_MAX_N && r->n[ev->index] < MAX_GEN) {
        r->toks[ev->index][r->n[ev->index]] = ev->token;
        r->lps[ev->index][r->n[ev->index]++] = ev->logprob;
        r->gram_s += ev->grammar_seconds;
    } else if (ev->type == ENGINE_EV_FINISH) {
        r->finish[ev->index] = ev->finish;
    } else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = 1;
        r->error = ev->type == ENGINE_EV_ERROR;
    }
}

static int g_released;
static void release(void *ctx)
{
    (void)ctx;
    g_released++;
}

static engine *mk_fail(model *m, int32_t vocab_fail)
{
    engine_config c = engine_config_default();
    c.test_grammar_vocab_fail = vocab_fail;
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 256;
    c.max_num_seqs = 16;
    c.kv_blocks_override = 256;
    c.device_memory = 1ull << 30;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static engine *mk(model *m)
{
    return mk_fail(m, 0);
}

static const int32_t PROMPT_A[] = {72, 101, 108, 108, 111, 33, 10};
static const int32_t PROMPT_B[] = {87, 104, 97, 116, 63};

static engine_request req(const int32_t *p, int64_t n, float temp, uint64_t seed,
                          const gram *g, int32_t n_seq, int ignore_eos)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = MAX_GEN - 2, .n = n_seq,
                        .top_logprobs = -1, .ignore_eos = ignore_eos};
    r.sampling = sampler_params_default();
    r.sampling.temperature = temp;
    r.sampling.seed = seed;
    if (g) {
        r.grammar = g;
        r.grammar_release = release;
    }
    return r;
}

static void run(engine *e, result *res, int n)
{
    for (int step = 0; step < 5000; step++) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= res[i].done;
        if (all)
            return;
        engine_run_step(e);
    }
    CHECK(!"requests did not finish");
}

/* Sequence k's text (its tokens' bytes) matches the POSIX ERE re, whole. */
static int matches(const model *m, const result *r, int k, const regex_t *re)
{
    char text[MAX_GEN * 8 + 1];
    size_t len = 0;
    for (int32_t j = 0; j < r->n[k]; j++) {
        char piece[16];
        int pl = tok_piece(m->tok, r->toks[k][j], 0, piece, sizeof piece);
        if (pl < 0 || len + (size_t)pl >= sizeof text)
            return 0;
        memcpy(text + len, piece, (size_t)pl);
        len += (size_t)pl;
    }
    text[len] = 0;
    int ok = regexec(re, text, 0, NULL, 0) == 0;
    if (!ok)
        fprintf(stderr, "output '%s' does not match\n", text);
    return ok;
}

static int same(const result *a, const result *b)
{
    if (a->n[0] != b->n[0] || a->error || b->error)
        return 0;
    for (int j = 0; j < a->n[0]; j++)
        if (a->toks[0][j] != b->toks[0][j] || memcmp(&a->lps[0][j], &b->lps[0][j], 4))
            return 0;
    return 1;
}

static void test_constrained(model *m)
{
    const char *rx = "[a-c]{3}x(yz|q)[0-9]?";
    kvant_err err = {0};
    gram *g = rx_compile(rx, strlen(rx), gram_limits_default(), &err);
    CHECKF(g != NULL, "rx_compile: %s", err.msg);
    regex_t re;
    CHECK(regcomp(&re, "^[a-c]{3}x(yz|q)[0-9]?$", REG_EXTENDED | REG_NOSUB) == 0);
    if (!g)
        return;

    /* the free requests alone */
    static result alone[2], got[7];
    engine *e = mk(m);
    engine_request f0 = req(PROMPT_A, 7, 0.0f, 1, NULL, 1, 1);
    engine_request f1 = req(PROMPT_B, 5, 0.9f, 77, NULL, 1, 1);
    CHECK(engine_submit(e, &f0, on_event, &alone[0], NULL) > 0);
    CHECK(engine_submit(e, &f1, on_event, &alone[1], NULL) > 0);
    run(e, alone, 2);
    engine_destroy(e);

    /* the same free requests among constrained ones */
    g_released = 0;
    e = mk(m);
    engine_request rs[7] = {
        req(PROMPT_A, 7, 0.0f, 1, g, 1, 0),  req(PROMPT_B, 5, 1.0f, 5, g, 1, 0),
        req(PROMPT_A, 7, 1.5f, 9, g, 3, 0),  req(PROMPT_B, 5, 0.7f, 11, g, 1, 1),
        f0, f1, req(PROMPT_B, 5, 1.0f, 13, g, 1, 0),
    };
    rs[1].sampling.top_k = 5;
    rs[6].sampling.top_p = 0.5f;
    for (int i = 0; i < 7; i++)
        CHECK(engine_submit(e, &rs[i], on_event, &got[i], NULL) > 0);
    engine_run_step(e);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECKF(st.grammar_requests == 5 && st.grammar_bytes > 0, "%d requests, %llu bytes",
           st.grammar_requests, (unsigned long long)st.grammar_bytes);
    CHECK(st.grammar_vocab_bytes > 0);
    run(e, got, 7);
    for (int i = 0; i < 7; i++) {
        CHECK(!got[i].error);
        if (!rs[i].grammar)
            continue;
        CHECK(got[i].gram_s > 0);
        for (int k = 0; k < rs[i].n; k++) {
            CHECKF(got[i].finish[k] == ENGINE_FINISH_STOP, "request %d.%d finish %d", i, k,
                   got[i].finish[k]);
            CHECKF(matches(m, &got[i], k, &re), "request %d.%d", i, k);
        }
    }
    CHECK(same(&got[4], &alone[0]));
    CHECK(same(&got[5], &alone[1]));
    engine_get_stats(e, &st);
    CHECK(st.grammar_requests == 0 && st.grammar_bytes == 0);
    CHECK(st.kv_blocks_used == 0);
    /* a refused submit leaves the reference with the caller */
    engine_request bad = req(PROMPT_A, 7, 0.0f, 1, g, 1, 0);
    bad.max_tokens = 0;
    CHECK(engine_submit(e, &bad, on_event, &got[0], NULL) < 0);
    engine_request emb = req(PROMPT_A, 7, 0.0f, 1, g, 1, 0);
    emb.embed = ENGINE_EMBED_MEAN;
    CHECK(engine_submit(e, &emb, on_event, &got[0], NULL) == KV_EINVAL);
    engine_destroy(e);
    CHECKF(g_released == 5, "released %d times for 5 constrained requests", g_released);
    regfree(&re);
    gram_destroy(g);
}

/* Every token of r's sequence k lies in the mask a trie built here (v)
 * computes for its step, the last one an end id where the grammar accepts. */
static int in_masks(const tmask_vocab *v, const gram *g, const result *r, int k)
{
    kvant_err err = {0};
    earley *st = earley_create(g, &err);
    uint32_t *mask = calloc((size_t)tmask_n_words(v), sizeof *mask);
    int ok = st && mask;
    for (int32_t j = 0; ok && j < r->n[k]; j++) {
        int32_t t = r->toks[k][j];
        ok = tmask_compute(v, st, NULL, mask, &err) > 0 && t >= 0 && t < tmask_n_vocab(v) &&
             (mask[t >> 5] >> (t & 31) & 1) && tmask_advance(v, st, t) == 1;
        if (!ok)
            fprintf(stderr, "sequence %d token %d (%d) is outside its mask\n", k, j, t);
    }
    free(mask);
    earley_destroy(st);
    return ok;
}

static int same_all(const result *a, const result *b, int n)
{
    for (int k = 0; k < n; k++) {
        if (a->n[k] != b->n[k] || a->error || b->error || a->finish[k] != b->finish[k])
            return 0;
        for (int j = 0; j < a->n[k]; j++)
            if (a->toks[k][j] != b->toks[k][j] || memcmp(&a->lps[k][j], &b->lps[k][j], 4))
                return 0;
    }
    return 1;
}

/* The trie waits for the first constrained request, then costs what a trie
 * of this vocabulary costs, and decodes as one built before any request. */
static void test_lazy(model *m, const gram *g)
{
    kvant_err err = {0};
    tmask_vocab *v = tmask_vocab_from_tok(m->tok, &err);
    CHECKF(v != NULL, "tmask_vocab_from_tok: %s", err.msg);
    if (!v)
        return;
    const uint64_t want = tmask_vocab_mem_bytes(v) + (uint64_t)tmask_n_words(v) * 4;
    CHECK(tmask_n_words(v) == (tok_n_vocab(m->tok) + 31) / 32);

    static result eager[3], lazy[3], freer[1];
    engine_request rs[3] = {req(PROMPT_A, 7, 0.0f, 1, g, 1, 0), req(PROMPT_B, 5, 1.0f, 5, g, 3, 0),
                            req(PROMPT_A, 7, 0.8f, 21, g, 1, 1)};
    engine *e = mk(m); /* before: built ahead of every request */
    CHECK(engine_grammar_prepare(e, &err) == KV_OK);
    CHECK(engine_grammar_prepare(e, &err) == KV_OK); /* a second call builds nothing */
    engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.grammar_vocab_builds == 1 && st.grammar_vocab_bytes == want);
    for (int i = 0; i < 3; i++)
        CHECK(engine_submit(e, &rs[i], on_event, &eager[i], NULL) > 0);
    run(e, eager, 3);
    engine_destroy(e);

    e = mk(m); /* lazy: free requests first */
    engine_get_stats(e, &st);
    const uint64_t host0 = st.host_bytes;
    CHECKF(st.grammar_vocab_bytes == 0 && st.grammar_vocab_builds == 0 && host0 > 0,
           "a new engine holds %llu trie bytes", (unsigned long long)st.grammar_vocab_bytes);
    CHECK(engine_mask_words(e) == 0);
    engine_request f = req(PROMPT_B, 5, 0.9f, 77, NULL, 1, 1);
    CHECK(engine_submit(e, &f, on_event, &freer[0], NULL) > 0);
    run(e, freer, 1);
    engine_run_step(e); /* an idle step: the stats of an engine holding no request */
    engine_get_stats(e, &st);
    CHECKF(st.grammar_vocab_bytes == 0 && st.grammar_vocab_builds == 0 && st.steps > 0 &&
           st.host_bytes == host0, "after free requests: %llu trie bytes, host %llu of %llu",
           (unsigned long long)st.grammar_vocab_bytes, (unsigned long long)st.host_bytes,
           (unsigned long long)host0);
    CHECK(engine_mask_words(e) == 0);
    for (int i = 0; i < 3; i++) {
        CHECK(engine_submit(e, &rs[i], on_event, &lazy[i], NULL) > 0);
        engine_get_stats(e, &st); /* counted at the build, before any step */
        CHECKF(st.grammar_vocab_builds == 1 && st.grammar_vocab_bytes == want &&
               st.host_bytes == host0 + want, "after submit %d: builds %d, %llu bytes of %llu, "
               "host %llu", i, st.grammar_vocab_builds, (unsigned long long)st.grammar_vocab_bytes,
               (unsigned long long)want, (unsigned long long)st.host_bytes);
    }
    CHECK(st.grammar_vocab_build_seconds > 0);
    CHECK(engine_mask_words(e) == tmask_n_words(v));
    run(e, lazy, 3);
    engine_run_step(e);
    engine_get_stats(e, &st); /* the step's stats keep it */
    CHECKF(st.grammar_vocab_bytes == want && st.host_bytes == host0 + want &&
           st.grammar_bytes == 0, "after the constrained requests: %llu bytes, host %llu",
           (unsigned long long)st.grammar_vocab_bytes, (unsigned long long)st.host_bytes);
    engine_destroy(e);
    for (int i = 0; i < 3; i++) {
        CHECKF(same_all(&lazy[i], &eager[i], rs[i].n), "request %d differs from the eager "
               "engine's", i);
        for (int k = 0; k < rs[i].n; k++) {
            CHECK(lazy[i].finish[k] == ENGINE_FINISH_STOP && lazy[i].n[k] > 0);
            CHECKF(in_masks(v, g, &lazy[i], k), "request %d.%d", i, k);
        }
    }
    tmask_vocab_destroy(v);
}

#define N_RACE 8
typedef struct racer {
    engine *e;
    const gram *g;
    pthread_barrier_t *bar;
    int prepare;      /* odd racers call engine_grammar_prepare first */
    int64_t id;
    result res;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    engine_request q = req(PROMPT_A, 7, 0.0f, 1, r->g, 1, 0);
    pthread_barrier_wait(r->bar);
    if (r->prepare && engine_grammar_prepare(r->e, NULL) != KV_OK)
        r->id = -1;
    else
        r->id = engine_submit(r->e, &q, on_event, &r->res, NULL);
    return NULL;
}

/* Concurrent first constrained requests: one build, every request served. */
static void test_race(model *m, const gram *g)
{
    for (int round = 0; round < 64; round++) {
        engine *e = mk(m);
        static racer rc[N_RACE];
        pthread_t th[N_RACE];
        pthread_barrier_t bar;
        pthread_barrier_init(&bar, NULL, N_RACE);
        int started = 0;
        for (int i = 0; i < N_RACE; i++) {
            rc[i] = (racer){.e = e, .g = g, .bar = &bar, .prepare = i & 1};
            started += pthread_create(&th[i], NULL, race, &rc[i]) == 0;
        }
        CHECK(started == N_RACE);
        for (int i = 0; i < started; i++)
            pthread_join(th[i], NULL);
        pthread_barrier_destroy(&bar);
        engine_stats st;
        engine_get_stats(e, &st);
        CHECKF(st.grammar_vocab_builds == 1, "round %d: %d builds", round,
               st.grammar_vocab_builds);
        result res[N_RACE];
        for (int i = 0; i < N_RACE; i++) {
            CHECKF(rc[i].id > 0, "racer %d: %lld", i, (long long)rc[i].id);
            if (rc[i].id <= 0)
                rc[i].res.done = 1;
        }
        for (;;) { /* the results live in rc[]: run until all are done */
            int all = 1;
            for (int i = 0; i < N_RACE; i++)
                all &= rc[i].res.done;
            if (all || !engine_run_step(e))
                break;
        }
        for (int i = 0; i < N_RACE; i++) {
            res[i] = rc[i].res;
            CHECK(res[i].done && !res[i].error && res[i].n[0] > 0);
            CHECK(i == 0 || same_all(&res[i], &res[0], 1)); /* one greedy output */
        }
        engine_destroy(e);
    }
}

/* An out-of-memory build fails that request only; the next one builds it. */
static void test_build_failure(model *m, const gram *g)
{
    engine *e = mk_fail(m, 1);
    static result res[3];
    int released = g_released;
    engine_request q = req(PROMPT_A, 7, 0.0f, 1, g, 1, 0);
    kvant_err err = {0};
    CHECK(engine_submit(e, &q, on_event, &res[0], &err) == KV_ENOMEM);
    CHECKF(strstr(err.msg, "out of memory") && strstr(err.msg, "tries again"), "%s", err.msg);
    CHECK(g_released == released); /* a refused submit: the reference stays with the caller */
    engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.grammar_vocab_builds == 0 && st.grammar_vocab_bytes == 0);
    engine_request f = req(PROMPT_B, 5, 0.0f, 1, NULL, 1, 1); /* free requests still run */
    CHECK(engine_submit(e, &f, on_event, &res[1], NULL) > 0);
    CHECK(engine_submit(e, &q, on_event, &res[2], &err) > 0); /* the retry builds it */
    res[0].done = 1;
    run(e, res, 3);
    CHECK(!res[1].error && !res[2].error && res[2].finish[0] == ENGINE_FINISH_STOP);
    engine_get_stats(e, &st);
    CHECK(st.grammar_vocab_builds == 1 && st.grammar_vocab_bytes > 0);
    engine_destroy(e);
    CHECK(g_released == released + 1);
}

static void test_trie(model *m)
{
    const char *rx = "[a-c]{3}x(yz|q)[0-9]?";
    kvant_err err = {0};
    gram *g = rx_compile(rx, strlen(rx), gram_limits_default(), &err);
    CHECKF(g != NULL, "rx_compile: %s", err.msg);
    if (!g)
        return;
    test_lazy(m, g);
    test_race(m, g);
    test_build_failure(m, g);
    gram_destroy(g);
}

int main(void)
{
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvant_test_engine_gram_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    CHECKF(fd >= 0, "mkstemp %s", path);
    if (fd < 0)
        return tu_finish("test_engine_gram");
    close(fd);
    dtype_init();
    CHECK(tiny_model_write(path, 42) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (m) {
        test_constrained(m);
        test_trie(m);
        model_free(m);
    }
    unlink(path);
    return tu_finish("test_engine_gram");
}
