/* test_engine_itl.c - the step-cost fit and the ITL budget (engine_itl.h):
 * the fit recovers a linear step cost; under max_itl_ms a long prompt
 * arriving beside a running decode is cut into chunks the budget allows,
 * the decode gets a token every step, and the outputs equal those of an
 * engine without the budget (greedy, batch-invariant passes). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "engine/engine_itl.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define MAX_GEN 64

typedef struct result {
    int32_t toks[MAX_GEN];
    int32_t n;
    int done, error;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index == 0 && r->n < MAX_GEN)
        r->toks[r->n++] = ev->token;
    else if (ev->type == ENGINE_EV_DONE)
        r->done = 1;
    else if (ev->type == ENGINE_EV_ERROR)
        r->error = r->done = 1;
}

static engine_request req_for(const int32_t *p, int64_t n, int64_t max_tokens)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    r.sampling = sampler_params_default();
    r.sampling.temperature = 0.0f;
    return r;
}

static engine *mk(model *m, double itl_ms, kvant_err *err)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 512;
    c.max_num_seqs = 8;
    c.device_memory = 1ull << 30;
    c.max_itl_ms = itl_ms;
    return engine_create(m, &c, err);
}

/* The fit of base + per_token x n, from steps of several sizes; from steps
 * of one size, all of it per token. */
static void test_fit(void)
{
    step_fit f = {{0}};
    double base = -1, per = -1;
    CHECK(step_fit_solve(&f, 0.05, &base, &per) == 0 && base == 0 && per == 0);
    step_fit two = {{0}}; /* two decayed steps are enough for a line */
    step_fit_add(&two, 8, 0.018, 0.995);
    CHECK(step_fit_solve(&two, 0.05, &base, &per) == STEP_FIT_NONE);
    step_fit_add(&two, 1, 0.004, 0.995);
    CHECK(step_fit_solve(&two, 0.05, &base, &per) == STEP_FIT_LINE);
    CHECKF(fabs(base - 0.002) < 1e-9 && fabs(per - 0.002) < 1e-9, "two steps: %g %g", base, per);
    for (int i = 0; i < 400; i++) {
        const double n = 1 + i % 37;
        step_fit_add(&f, n, 0.010 + 0.002 * n, 0.995);
    }
    CHECK(step_fit_solve(&f, 0.05, &base, &per) == STEP_FIT_LINE);
    CHECKF(fabs(base - 0.010) < 1e-9 && fabs(per - 0.002) < 1e-9, "base %g per token %g", base,
           per);
    step_fit g = {{0}};
    for (int i = 0; i < 10; i++)
        step_fit_add(&g, 16, 0.032, 0.995);
    CHECK(step_fit_solve(&g, 0.05, &base, &per) == STEP_FIT_PROP);
    CHECKF(base == 0 && fabs(per - 0.002) < 1e-12, "one size: base %g per token %g", base, per);
    step_fit h = {{0}}; /* noise: the 8-token steps took less than the 1-token ones */
    for (int i = 0; i < 10; i++) {
        step_fit_add(&h, 8, 0.008, 1.0);
        step_fit_add(&h, 1, 0.020, 1.0);
    }
    CHECK(step_fit_solve(&h, 0.05, &base, &per) == STEP_FIT_PROP);
    CHECKF(base == 0 && fabs(per - 0.028 / 9) < 1e-12, "no slope: base %g per token %g", base,
           per);
}

/* Teaches e a step cost of 10 ms + 1 ms per token (the tiny model's real
 * steps take microseconds: weight them out before every step). */
static void teach(engine *e)
{
    for (int i = 0; i < 400; i++)
        engine_itl_observe(e, 1 + i % 50, 0.010 + 0.001 * (1 + i % 50));
}

/* One decode running, then a 300-token prompt: with itl_ms, each step
 * holds at most the budget's tokens and the decode advances every step. */
static void run_pair(model *m, double itl_ms, result *a, result *b, int *max_tokens,
                     int *decode_every_step, uint64_t *limited, uint64_t *limited_alone)
{
    kvant_err err = {0};
    engine *e = mk(m, itl_ms, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    if (!e)
        return;
    static int32_t p[400];
    for (int j = 0; j < 400; j++)
        p[j] = (j * 7 + 1) % 250;
    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    engine_request ra = req_for(p, 8, 40), rb = req_for(p + 50, 300, 8);
    engine_submit(e, &ra, on_event, a, NULL);
    teach(e);
    engine_run_step(e); /* a's prompt: a decodes from now on */
    engine_submit(e, &rb, on_event, b, NULL);
    *max_tokens = 0;
    *decode_every_step = 1;
    for (int s = 0; s < 400 && !(a->done && b->done); s++) {
        const int before = a->n, b_started = b->n > 0;
        teach(e);
        engine_run_step(e);
        engine_stats st;
        engine_get_stats(e, &st);
        if (!b_started && !a->done) {
            *max_tokens = st.last_tokens > *max_tokens ? st.last_tokens : *max_tokens;
            *decode_every_step &= a->n == before + 1;
        }
        if (b->done && !a->done) /* a decodes alone: nothing is held back */
            *limited_alone = st.itl_limited_steps - *limited;
        else
            *limited = st.itl_limited_steps;
    }
    CHECK(a->done && b->done && !a->error && !b->error);
    engine_destroy(e);
}

static void test_budget(model *m)
{
    result a0, b0, a1, b1;
    int max0, max1, every0, every1;
    uint64_t lim0 = 0, lim1 = 0, alone0 = 0, alone1 = 0;
    run_pair(m, 0, &a0, &b0, &max0, &every0, &lim0, &alone0);
    run_pair(m, 50, &a1, &b1, &max1, &every1, &lim1, &alone1);
    /* off: the prompt's 300 tokens in one step (prefill first) */
    CHECKF(max0 >= 300 && lim0 == 0, "no budget: largest step %d tokens, limited steps %llu",
           max0, (unsigned long long)lim0);
    /* 50 ms at 10 ms + 1 ms per token: 40 tokens (the decode and 39 of the prompt) */
    CHECKF(max1 >= 38 && max1 <= 42, "budget: largest step %d tokens (want ~40)", max1);
    CHECKF(every1, "budget: the decode gets a token every step while the prompt runs");
    CHECKF(lim1 >= 7, "budget: %llu limited steps (300 tokens in chunks of ~39)",
           (unsigned long long)lim1);
    CHECKF(alone1 == 0 && a1.n == 40 && b1.done,
           "a lone decode under the budget is not a limited step (%llu counted)",
           (unsigned long long)alone1);
    CHECK(a0.n == a1.n && b0.n == b1.n && !memcmp(a0.toks, a1.toks, sizeof a0.toks) &&
          !memcmp(b0.toks, b1.toks, sizeof b0.toks));
}

static void test_config(model *m)
{
    kvant_err err = {0};
    engine *e = mk(m, -1, &err);
    CHECKF(e == NULL && strstr(err.msg, "max_itl_ms"), "max_itl_ms -1 refused: %s", err.msg);
    engine_destroy(e);
    err = (kvant_err){0};
    e = mk(m, NAN, &err);
    CHECKF(e == NULL && strstr(err.msg, "max_itl_ms"), "max_itl_ms NaN refused: %s", err.msg);
    engine_destroy(e);
}

int main(void)
{
    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvant_test_itl_XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    CHECKF(fd >= 0, "mkstemp %s", path);
    if (fd < 0)
        return tu_finish("test_engine_itl");
    close(fd);
    dtype_init();
    test_fit();
    CHECK(tiny_model_write(path, 42) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (m) {
        test_budget(m);
        test_config(m);
        model_free(m);
    }
    unlink(path);
    return tu_finish("test_engine_itl");
}
