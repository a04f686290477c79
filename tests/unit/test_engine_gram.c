/* test_engine_gram.c - constrained decoding in the engine (engine_gram.c) on
 * a tiny random model stepped by hand: every constrained output, greedy and
 * sampled, n = 1 and n = 3, matches its regular expression by POSIX regexec
 * (an independent recognizer) and ends with FINISH_STOP on the end-of-
 * sequence token (even with ignore_eos); unconstrained requests batched with
 * constrained ones produce exactly the tokens and log-probabilities they
 * produce alone; the grammar's release callback runs once per accepted
 * request (never for a refused submit); grammar state bytes are counted
 * while requests hold them and return to 0. */
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "grammar/gram.h"
#include "grammar/regex.h"
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

static engine *mk(model *m)
{
    engine_config c = engine_config_default();
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
        model_free(m);
    }
    unlink(path);
    return tu_finish("test_engine_gram");
}
