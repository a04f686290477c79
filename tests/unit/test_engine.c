/* test_engine.c - the continuous-batching engine on a tiny random model,
 * stepped by hand (config.manual): batch invariance (alone vs batched vs
 * chunked prefill vs preempted vs prefix-cached, greedy and seeded),
 * scheduler decisions (token budget, decodes first, priority), cancellation,
 * rejection of oversized prompts, n > 1 forks, and no leaked KV blocks.
 *
 * Invariance is checked on the generated tokens and on the chosen tokens'
 * log-probabilities compared bitwise (they are a function of the logits). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "mem/plan.h"
#include "testutil.h"
#include "tinymodel.h"

#define N_REQ 32
#define MAX_GEN 48

typedef struct result {
    int32_t toks[ENGINE_MAX_N][MAX_GEN];
    float lps[ENGINE_MAX_N][MAX_GEN];
    int32_t n[ENGINE_MAX_N];
    int done, error;
    int64_t cached;
    int first_step; /* step at which the first token arrived */
    engine_finish finish[ENGINE_MAX_N];
} result;

static int g_step; /* test-only step counter read by the callback */

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index < ENGINE_MAX_N && r->n[ev->index] < MAX_GEN) {
        if (r->n[0] == 0 && ev->index == 0)
            r->first_step = g_step;
        r->toks[ev->index][r->n[ev->index]] = ev->token;
        r->lps[ev->index][r->n[ev->index]++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_FINISH) {
        r->finish[ev->index] = ev->finish;
    } else if (ev->type == ENGINE_EV_DONE) {
        r->done = 1;
        r->cached = ev->cached_tokens;
    } else if (ev->type == ENGINE_EV_ERROR) {
        r->error = 1;
        r->done = 1;
    }
}

static void make_prompt(int i, int32_t *p, int64_t *n)
{
    *n = 5 + (i * 7) % 29;
    for (int64_t j = 0; j < *n; j++)
        p[j] = (int32_t)((i * 31 + j * 17 + 3) % 250);
}

static engine_request req_for(const int32_t *p, int64_t n, int64_t max_tokens, float temp)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    r.sampling = sampler_params_default();
    r.sampling.temperature = temp;
    r.sampling.seed = 1234;
    return r;
}

static void run_until_done(engine *e, result *res, int n, int max_steps)
{
    for (g_step = 0; g_step < max_steps; g_step++) {
        int all = 1;
        for (int i = 0; i < n; i++)
            all &= res[i].done;
        if (all)
            return;
        engine_run_step(e);
    }
}

static engine *mk(model *m, int32_t tokens, int32_t seqs, int prefix, int32_t blocks)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = tokens;
    c.max_num_seqs = seqs;
    c.prefix_cache = prefix;
    c.kv_blocks_override = blocks;
    c.device_memory = 1ull << 30;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    if (!e)
        fprintf(stderr, "engine_create: %s\n", err.msg);
    return e;
}

/* Runs n requests together on e; all submitted before the first step. */
static void run_batch(engine *e, result *res, int n, int64_t max_tokens, float temp)
{
    int32_t prompts[N_REQ][64];
    memset(res, 0, sizeof *res * (size_t)n);
    for (int i = 0; i < n; i++) {
        int64_t np;
        make_prompt(i, prompts[i], &np);
        engine_request r = req_for(prompts[i], np, max_tokens, temp);
        CHECK(engine_submit(e, &r, on_event, &res[i], NULL) > 0);
    }
    run_until_done(e, res, n, 10000);
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

static void check_no_leak(engine *e)
{
    engine_stats st;
    engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0, "%d KV blocks still used", st.kv_blocks_used);
    CHECK(st.running == 0 && st.waiting == 0);
}

static result alone[N_REQ], alone_s[N_REQ], got[N_REQ];

static void test_invariance(model *m)
{
    for (int i = 0; i < N_REQ; i++) {
        engine *e = mk(m, 2048, 64, 0, 0);
        int32_t p[64];
        int64_t np;
        make_prompt(i, p, &np);
        memset(&alone[i], 0, sizeof alone[i]);
        memset(&alone_s[i], 0, sizeof alone_s[i]);
        engine_request r = req_for(p, np, MAX_GEN, 0.0f);
        engine_request rs = req_for(p, np, MAX_GEN, 0.9f);
        CHECK(engine_submit(e, &r, on_event, &alone[i], NULL) > 0);
        run_until_done(e, &alone[i], 1, 1000);
        CHECK(engine_submit(e, &rs, on_event, &alone_s[i], NULL) > 0);
        run_until_done(e, &alone_s[i], 1, 1000);
        CHECK(alone[i].n[0] == MAX_GEN && alone_s[i].n[0] == MAX_GEN);
        engine_destroy(e);
    }
    struct { const char *name; int32_t tokens, seqs, prefix, blocks; float temp; } cfg[] = {
        {"batched greedy", 2048, 64, 0, 0, 0.0f},
        {"batched seeded", 2048, 64, 0, 0, 0.9f},
        {"chunked prefill (8 tokens/step)", 8, 8, 0, 0, 0.0f},
        {"prefix cache on", 2048, 64, 1, 0, 0.0f},
        {"memory pressure (1/4 pool)", 2048, 64, 1, 40, 0.0f},
        {"memory pressure seeded", 64, 16, 0, 40, 0.9f},
    };
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        engine *e = mk(m, cfg[c].tokens, cfg[c].seqs, cfg[c].prefix, cfg[c].blocks);
        CHECK(e != NULL);
        if (!e)
            continue;
        run_batch(e, got, N_REQ, MAX_GEN, cfg[c].temp);
        int ok = 0;
        for (int i = 0; i < N_REQ; i++)
            ok += same(&got[i], cfg[c].temp > 0 ? &alone_s[i] : &alone[i]);
        CHECKF(ok == N_REQ, "%s: %d of %d requests identical to running alone", cfg[c].name, ok,
               N_REQ);
        engine_stats st;
        engine_get_stats(e, &st);
        if (cfg[c].blocks)
            CHECKF(st.preemptions > 0, "%s: expected preemptions", cfg[c].name);
        fprintf(stderr, "  %s: %d/%d identical, %llu preemptions, %llu steps\n", cfg[c].name, ok,
                N_REQ, (unsigned long long)st.preemptions, (unsigned long long)st.steps);
        check_no_leak(e);
        engine_destroy(e);
    }
}

static void test_prefix_reuse(model *m)
{
    engine *e = mk(m, 2048, 64, 1, 0);
    int32_t p[80];
    for (int j = 0; j < 80; j++)
        p[j] = (j * 13 + 5) % 250;
    result a = {0}, b = {0};
    engine_request r = req_for(p, 80, 8, 0.0f);
    engine_submit(e, &r, on_event, &a, NULL);
    run_until_done(e, &a, 1, 100);
    engine_stats s1, s2;
    engine_get_stats(e, &s1);
    engine_submit(e, &r, on_event, &b, NULL);
    run_until_done(e, &b, 1, 100);
    engine_get_stats(e, &s2);
    CHECKF(b.cached == 64, "cached tokens %lld (expected 64 of 80 with blocks of 16)",
           (long long)b.cached);
    CHECKF(s2.prompt_tokens_computed - s1.prompt_tokens_computed == 16,
           "second request computed %llu prompt tokens",
           (unsigned long long)(s2.prompt_tokens_computed - s1.prompt_tokens_computed));
    CHECK(s2.prompt_tokens - s1.prompt_tokens == 80);
    CHECK(same(&a, &b));
    /* a different salt shares nothing */
    result c = {0};
    r.cache_salt = 99;
    engine_submit(e, &r, on_event, &c, NULL);
    run_until_done(e, &c, 1, 100);
    CHECK(c.cached == 0 && same(&a, &c));
    check_no_leak(e);
    engine_destroy(e);
}

static void test_scheduler(model *m)
{
    /* token budget and decodes first: one running decode, then a long prompt */
    engine *e = mk(m, 16, 4, 0, 0);
    int32_t p[200];
    for (int j = 0; j < 200; j++)
        p[j] = (j * 7 + 1) % 250;
    result a = {0}, b = {0};
    engine_request ra = req_for(p, 4, 20, 0.0f);
    engine_submit(e, &ra, on_event, &a, NULL);
    engine_run_step(e); /* prefill of a: a is now decoding */
    engine_request rb = req_for(p + 10, 100, 4, 0.0f);
    engine_submit(e, &rb, on_event, &b, NULL);
    int budget_ok = 1, decode_first = 1;
    for (int s = 0; s < 6; s++) {
        int before = a.n[0];
        engine_run_step(e);
        engine_stats st;
        engine_get_stats(e, &st);
        budget_ok &= st.last_tokens <= 16;
        decode_first &= a.done || a.n[0] == before + 1;
    }
    CHECK(budget_ok);
    CHECKF(decode_first, "the running decode must get a token every step during a long prefill");

    for (int s = 0; s < 200 && !(a.done && b.done); s++)
        engine_run_step(e);
    CHECK(a.done && b.done);
    check_no_leak(e);
    engine_destroy(e);

    /* priority: with one slot, the lower priority value is served first */
    e = mk(m, 2048, 1, 0, 0);
    result lo = {0}, hi = {0};
    engine_request rl = req_for(p, 8, 3, 0.0f), rh = req_for(p + 20, 8, 3, 0.0f);
    rl.priority = 5;
    rh.priority = 0;
    engine_submit(e, &rl, on_event, &lo, NULL);
    engine_submit(e, &rh, on_event, &hi, NULL);
    for (g_step = 0; g_step < 50 && !(lo.done && hi.done); g_step++)
        engine_run_step(e);
    CHECKF(hi.first_step < lo.first_step, "priority: high first at %d, low at %d", hi.first_step,
           lo.first_step);
    engine_destroy(e);

    /* prefill first: new short prompts run before the running decodes, but
     * never more sequences than max_num_seqs, and both kinds advance */
    e = mk(m, 64, 2, 0, 0);
    result rs[5];
    memset(rs, 0, sizeof rs);
    engine_request rr[5];
    rr[0] = req_for(p, 6, 12, 0.0f);
    engine_submit(e, &rr[0], on_event, &rs[0], NULL);
    engine_run_step(e); /* request 0 is decoding */
    for (int i = 1; i < 5; i++) {
        rr[i] = req_for(p + 10 * i, 6, 12, 0.0f);
        engine_submit(e, &rr[i], on_event, &rs[i], NULL);
    }
    int within = 1, all_done = 0;
    for (int s = 0; s < 300 && !all_done; s++) {
        engine_run_step(e);
        engine_stats st;
        engine_get_stats(e, &st);
        within &= st.running <= 2;
        all_done = 1;
        for (int i = 0; i < 5; i++)
            all_done &= rs[i].done;
    }
    CHECKF(within, "prefill first: at most max_num_seqs (2) sequences running");
    CHECK(all_done);
    check_no_leak(e);
    engine_destroy(e);
}

static void test_cancel_reject_fork(model *m)
{
    engine *e = mk(m, 2048, 8, 1, 8); /* 8 blocks of 16 = 128 tokens */
    int32_t p[200];
    for (int j = 0; j < 200; j++)
        p[j] = (j * 11 + 2) % 250;
    kvant_err err = {0};
    engine_request big = req_for(p, 130, 1, 0.0f);
    CHECK(engine_submit(e, &big, on_event, NULL, &err) < 0);
    CHECKF(strstr(err.msg, "context") || strstr(err.msg, "KV pool"), "message: %s", err.msg);
    engine_request bad = req_for(p, 10, 1, 0.0f);
    bad.sampling.temperature = NAN;
    CHECK(engine_submit(e, &bad, on_event, NULL, &err) < 0);
    int32_t oob = 5000;
    engine_request bad2 = req_for(&oob, 1, 1, 0.0f);
    CHECK(engine_submit(e, &bad2, on_event, NULL, &err) < 0);

    result r = {0};
    engine_request lr = req_for(p, 20, 80, 0.0f);
    int64_t id = engine_submit(e, &lr, on_event, &r, NULL);
    for (int s = 0; s < 5; s++)
        engine_run_step(e);
    engine_cancel(e, id);
    engine_run_step(e);
    CHECK(r.error && r.done && r.n[0] < 80);
    check_no_leak(e);

    /* cancelling one of several running requests leaves the others intact */
    result many[4];
    int64_t ids[4];
    memset(many, 0, sizeof many);
    for (int i = 0; i < 4; i++) {
        engine_request ri = req_for(p + i, 12, 20, 0.0f);
        ids[i] = engine_submit(e, &ri, on_event, &many[i], NULL);
    }
    for (int s = 0; s < 3; s++)
        engine_run_step(e);
    engine_cancel(e, ids[1]);
    for (int s = 0; s < 100 && !(many[0].done && many[2].done && many[3].done); s++)
        engine_run_step(e);
    CHECK(many[1].error);
    CHECKF(many[0].n[0] == 20 && many[2].n[0] == 20 && many[3].n[0] == 20 && !many[0].error &&
               !many[2].error && !many[3].error,
           "others after a cancel: %d %d %d tokens", many[0].n[0], many[2].n[0], many[3].n[0]);
    check_no_leak(e);

    /* n = 2 greedy: both sequences equal the single-sequence output */
    result one = {0}, two = {0};
    engine_request r1 = req_for(p, 20, 10, 0.0f), r2 = req_for(p, 20, 10, 0.0f);
    r2.n = 2;
    engine_submit(e, &r1, on_event, &one, NULL);
    run_until_done(e, &one, 1, 100);
    engine_submit(e, &r2, on_event, &two, NULL);
    run_until_done(e, &two, 1, 100);
    CHECK(two.done && !two.error && two.n[0] == 10 && two.n[1] == 10);
    CHECK(memcmp(one.toks[0], two.toks[0], 10 * 4) == 0 &&
          memcmp(one.toks[0], two.toks[1], 10 * 4) == 0);
    CHECK(two.finish[0] == ENGINE_FINISH_LENGTH && two.finish[1] == ENGINE_FINISH_LENGTH);
    check_no_leak(e);
    engine_destroy(e);
}

/* The start-up plan and the memory the engine really allocates agree:
 * activations exactly, KV short of the plan by the fewest whole blocks that
 * hold the backend's attention scratch (accounted as workspace), the int8 matmul activations
 * planned and allocated. */
static void test_plan_agreement(model *m)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.device_memory = 64ull << 20;
    c.max_num_batched_tokens = 256;
    c.max_num_seqs = 16;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    if (!e)
        return;
    const plan_result *p = engine_plan(e);
    mem_report *r = calloc(1, sizeof *r);
    mem_get_report(engine_mem(e), r);
    uint64_t block_bytes = p->kv_bytes_per_token * (uint64_t)p->block_size;
    CHECKF(r->cat[MEM_ACTIVATIONS].current == p->activation_bytes, "activations %llu vs plan %llu",
           (unsigned long long)r->cat[MEM_ACTIVATIONS].current,
           (unsigned long long)p->activation_bytes);
    /* the blocks held back are the fewest that hold the workspace beyond the
     * planned int8 activations (attention scratch, allocator rounding) */
    const uint64_t kv_now = r->cat[MEM_KV].current, ws = r->cat[MEM_WORKSPACE].current;
    const uint64_t held = kv_now < p->kv_pool_bytes ? p->kv_pool_bytes - kv_now : 0;
    const uint64_t beyond = ws > p->act_q8_bytes ? ws - p->act_q8_bytes : 0;
    CHECKF(held > 0 && held % block_bytes == 0 && beyond <= held &&
               beyond > held - block_bytes,
           "kv %llu vs plan %llu: %llu bytes held back (blocks of %llu) for %llu of workspace "
           "beyond the int8 activations", (unsigned long long)kv_now,
           (unsigned long long)p->kv_pool_bytes, (unsigned long long)held,
           (unsigned long long)block_bytes, (unsigned long long)beyond);
    /* the int8 matmul activations the plan counted are what the backend holds */
    CHECKF(p->act_q8_bytes > 0 && r->cat[MEM_WORKSPACE].current >= p->act_q8_bytes,
           "workspace %llu vs planned int8 activations %llu",
           (unsigned long long)r->cat[MEM_WORKSPACE].current,
           (unsigned long long)p->act_q8_bytes);
    CHECK(r->cat[MEM_WEIGHTS].current == p->weights_bytes);
    CHECK(r->used <= r->budget);
    fprintf(stderr, "  plan vs allocation: weights %llu/%llu act %llu/%llu kv %llu/%llu\n",
            (unsigned long long)r->cat[MEM_WEIGHTS].current, (unsigned long long)p->weights_bytes,
            (unsigned long long)r->cat[MEM_ACTIVATIONS].current,
            (unsigned long long)p->activation_bytes, (unsigned long long)r->cat[MEM_KV].current,
            (unsigned long long)p->kv_pool_bytes);
    free(r);
    engine_destroy(e);
    /* a budget below the weights is refused with a message */
    c.device_memory = 100000;
    e = engine_create(m, &c, &err);
    CHECK(e == NULL && err.msg[0]);
}

/* Every allocation on the engine's start-up and serving path can fail:
 * the n-th one fails for n = 1, 2, ... until creation succeeds; each
 * failure is a clean NULL with a message, never a crash or a leak (ASan). */
static void test_alloc_failures(model *m)
{
    int created = 0;
    for (uint64_t n = 1; n <= 64 && !created; n++) {
        engine_config c = engine_config_default();
        c.manual = 1;
        c.n_threads = 2;
        c.device_memory = 64ull << 20;
        c.max_num_batched_tokens = 64;
        c.max_num_seqs = 4;
        c.test_fail_nth = n;
        kvant_err err = {0};
        engine *e = engine_create(m, &c, &err);
        if (!e) {
            CHECKF(err.code == KV_ENOMEM && err.msg[0], "fail-nth %llu: code %d '%s'",
                   (unsigned long long)n, err.code, err.msg);
            continue;
        }
        created = 1;
        fprintf(stderr, "  engine start-up survives %llu injected allocation failures\n",
                (unsigned long long)(n - 1));
        int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        result r = {0};
        engine_request rq = req_for(p, 8, 4, 0.0f);
        CHECK(engine_submit(e, &rq, on_event, &r, NULL) > 0);
        run_until_done(e, &r, 1, 50);
        CHECK(r.done && !r.error && r.n[0] == 4);
        mem_report *rep = calloc(1, sizeof *rep);
        mem_get_report(engine_mem(e), rep);
        CHECK(rep->n_pools == 1 && !strcmp(rep->pools[0].name, "kv"));
        CHECK(rep->pools[0].total_bytes == rep->cat[MEM_KV].current);
        CHECK(rep->fragmentation[0] >= 0.0 && rep->fragmentation[0] < 1.0);
        free(rep);
        engine_destroy(e);
    }
    CHECK(created);
}

int main(void)
{
    /* a private temporary file (TMPDIR, else /tmp): the test runs from any
     * directory, with or without a build/ tree */
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvant_test_engine_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    CHECKF(fd >= 0, "mkstemp %s", path);
    if (fd < 0)
        return tu_finish("test_engine");
    close(fd);
    dtype_init();
    CHECK(tiny_model_write(path, 42) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m) {
        unlink(path);
        return tu_finish("test_engine");
    }
    test_invariance(m);
    test_prefix_reuse(m);
    test_scheduler(m);
    test_cancel_reject_fork(m);
    test_plan_agreement(m);
    test_alloc_failures(m);
    model_free(m);
    unlink(path);
    return tu_finish("test_engine");
}
