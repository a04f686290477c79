/* test_kvresize.c - an engine's KV pool grows and shrinks while requests
 * run (engine_kv_resize): the memory manager's MEM_KV bytes are exactly the
 * pool's blocks at every size, a grow the budget cannot hold is refused
 * with nothing changed, a shrink never takes a block a sequence holds, and
 * every request's greedy tokens and log-probabilities are bitwise those of
 * the request served alone (so no block moved or was cut under it).  Both
 * stepped by hand (config.manual) and with the engine thread, resizing from
 * another thread between its steps. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define N_REQ 12
#define MAX_GEN 40
#define MIN_BLOCKS 12
#define MAX_BLOCKS 96

typedef struct result {
    int32_t toks[MAX_GEN];
    float lps[MAX_GEN];
    int n;
    volatile int done, error;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && r->n < MAX_GEN) {
        r->toks[r->n] = ev->token;
        r->lps[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_ERROR) {
        r->error = 1;
        __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    } else if (ev->type == ENGINE_EV_DONE) {
        __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    }
}

static int32_t prompts[N_REQ][64];
static int64_t n_prompt[N_REQ];

static void make_prompts(void)
{
    for (int i = 0; i < N_REQ; i++) {
        n_prompt[i] = 20 + (i * 13) % 37;
        for (int64_t j = 0; j < n_prompt[i]; j++)
            prompts[i][j] = (int32_t)((i * 29 + j * 11 + 5) % 250);
    }
}

static void submit(engine *e, int i, result *r)
{
    engine_request q = {.prompt = prompts[i], .n_prompt = n_prompt[i], .max_tokens = MAX_GEN,
                        .n = 1, .top_logprobs = -1, .ignore_eos = 1};
    q.sampling = sampler_params_default();
    q.sampling.temperature = 0.0f;
    memset(r, 0, sizeof *r);
    CHECK(engine_submit(e, &q, on_event, r, NULL) > 0);
}

static engine *mk(model *m, mem_mgr *mem, int32_t blocks, int32_t max_blocks, int manual)
{
    engine_config c = engine_config_default();
    c.manual = manual;
    c.n_threads = 2;
    c.max_num_seqs = 16;
    c.max_num_batched_tokens = 256;
    c.kv_blocks_override = blocks;
    c.kv_max_blocks = max_blocks;
    c.device_memory = 1ull << 30;
    c.shared_mem = mem;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static uint64_t kv_bytes(mem_mgr *mem)
{
    mem_report *r = malloc(sizeof *r);
    mem_get_report(mem, r);
    uint64_t b = r->cat[MEM_KV].current;
    free(r);
    return b;
}

static int same(const result *a, const result *b)
{
    return !a->error && !b->error && a->n == MAX_GEN && b->n == MAX_GEN &&
           !memcmp(a->toks, b->toks, sizeof a->toks) && !memcmp(a->lps, b->lps, sizeof a->lps);
}

static result alone[N_REQ], got[N_REQ];

static void run_alone(model *m)
{
    mem_mgr *mem = mem_create(1ull << 30, mem_allocator_host(), NULL);
    engine *e = mk(m, mem, MAX_BLOCKS, 0, 1);
    for (int i = 0; i < N_REQ && e; i++) {
        submit(e, i, &alone[i]);
        for (int s = 0; s < 1000 && !alone[i].done; s++)
            engine_run_step(e);
        CHECK(alone[i].n == MAX_GEN && !alone[i].error);
    }
    engine_destroy(e);
    mem_destroy(mem);
}

static int all_done(void)
{
    for (int i = 0; i < N_REQ; i++)
        if (!__atomic_load_n(&got[i].done, __ATOMIC_ACQUIRE))
            return 0;
    return 1;
}

/* Stepped by hand: grow in the middle of a run under memory pressure,
 * shrink while blocks are held, refusals, accounting at every size. */
static void test_manual(model *m)
{
    mem_mgr *mem = mem_create(1ull << 30, mem_allocator_host(), NULL);
    engine *e = mk(m, mem, MIN_BLOCKS, MAX_BLOCKS, 1);
    if (!e)
        return;
    const uint64_t bb = engine_kv_block_bytes(e);
    engine_stats st;
    CHECK(kv_bytes(mem) == MIN_BLOCKS * bb);
    for (int i = 0; i < N_REQ; i++)
        submit(e, i, &got[i]);
    for (int s = 0; s < 20; s++)
        engine_run_step(e);
    engine_get_stats(e, &st);
    CHECK(st.kv_blocks_total == MIN_BLOCKS && st.running > 0 && st.waiting > 0);
    kvant_err err = {0};
    int32_t n = 0;
    /* refusals change nothing */
    CHECK(engine_kv_resize(e, MAX_BLOCKS + 1, 0, &n, &err) == KV_ERANGE && n == MIN_BLOCKS);
    CHECK(engine_kv_resize(e, 0, 0, &n, &err) == KV_EINVAL);
    mem_fail_nth(mem, 1);
    CHECK(engine_kv_resize(e, 48, 0, &n, &err) == KV_ENOMEM && n == MIN_BLOCKS);
    CHECK(kv_bytes(mem) == MIN_BLOCKS * bb);
    /* grow: every waiting request now fits */
    CHECK(engine_kv_resize(e, 48, 0, &n, &err) == KV_OK && n == 48);
    CHECK(kv_bytes(mem) == 48 * bb);
    for (int s = 0; s < 3; s++)
        engine_run_step(e);
    engine_get_stats(e, &st);
    CHECK(st.kv_blocks_total == 48 && st.kv_blocks_used > MIN_BLOCKS && st.kv_grows == 1);
    /* shrink while sequences hold blocks: only a tail nobody holds goes */
    const int32_t used = st.kv_blocks_used;
    CHECK(engine_kv_resize(e, MIN_BLOCKS, 0, &n, &err) == KV_OK);
    CHECK(n >= used && n <= 48 && kv_bytes(mem) == (uint64_t)n * bb);
    for (int s = 0; s < 4000 && !all_done(); s++) {
        engine_run_step(e);
        if (s % 7 == 3) /* keep moving while the requests run */
            CHECK(engine_kv_resize(e, s % 2 ? MAX_BLOCKS : MIN_BLOCKS, 0, &n, &err) == KV_OK);
        if (kv_bytes(mem) != (uint64_t)n * bb)
            CHECKF(0, "step %d: %llu KV bytes for %d blocks", s,
                   (unsigned long long)kv_bytes(mem), n);
    }
    int ok = 0;
    for (int i = 0; i < N_REQ; i++)
        ok += same(&got[i], &alone[i]);
    CHECKF(ok == N_REQ, "manual: %d of %d requests identical to running alone", ok, N_REQ);
    /* all finished: everything above the size at create goes back */
    CHECK(engine_kv_resize(e, 1, 0, &n, &err) == KV_OK && n == MIN_BLOCKS);
    CHECK(kv_bytes(mem) == MIN_BLOCKS * bb);
    engine_get_stats(e, &st);
    CHECK(st.kv_blocks_total == MIN_BLOCKS && st.kv_blocks_used == 0);
    CHECK(st.kv_blocks_min == MIN_BLOCKS && st.kv_blocks_max == MAX_BLOCKS);
    CHECK(st.kv_grows >= 2 && st.kv_shrinks >= 2);
    fprintf(stderr, "  manual: %d/%d identical, %llu grows, %llu shrinks, %llu preemptions\n", ok,
            N_REQ, (unsigned long long)st.kv_grows, (unsigned long long)st.kv_shrinks,
            (unsigned long long)st.preemptions);
    engine_destroy(e);
    CHECK(mem_used(mem) == 0);
    mem_destroy(mem);
}

/* A budget that holds the engine and a few blocks more: a grow past it is
 * refused (KV_ENOMEM), the manager never goes over. */
static void test_budget(model *m)
{
    mem_mgr *probe = mem_create(1ull << 30, mem_allocator_host(), NULL);
    engine *e = mk(m, probe, MIN_BLOCKS, MAX_BLOCKS, 1);
    const uint64_t need = mem_used(probe), bb = e ? engine_kv_block_bytes(e) : 0;
    engine_destroy(e);
    mem_destroy(probe);
    mem_mgr *mem = mem_create(need + 5 * bb + bb / 2, mem_allocator_host(), NULL);
    e = mk(m, mem, MIN_BLOCKS, MAX_BLOCKS, 1);
    if (!e)
        return;
    kvant_err err = {0};
    int32_t n = 0;
    CHECK(engine_kv_resize(e, MIN_BLOCKS + 6, 0, &n, &err) == KV_ENOMEM && n == MIN_BLOCKS);
    CHECKF(strstr(err.msg, "over budget") != NULL, "%s", err.msg);
    CHECK(engine_kv_resize(e, MIN_BLOCKS + 5, 0, &n, &err) == KV_OK && n == MIN_BLOCKS + 5);
    CHECK(mem_used(mem) <= mem_budget(mem) && mem_available(mem) < bb);
    engine_destroy(e);
    mem_destroy(mem);
}

/* With the engine thread: resizes posted from this thread land between
 * steps while the requests run. */
static void test_threaded(model *m)
{
    mem_mgr *mem = mem_create(1ull << 30, mem_allocator_host(), NULL);
    engine *e = mk(m, mem, MIN_BLOCKS, MAX_BLOCKS, 0);
    if (!e)
        return;
    const uint64_t bb = engine_kv_block_bytes(e);
    for (int i = 0; i < N_REQ; i++)
        submit(e, i, &got[i]);
    kvant_err err = {0};
    int32_t n = 0;
    int k = 0, bad = 0;
    for (; k < 200000 && !all_done(); k++) {
        int rc = engine_kv_resize(e, k % 2 ? MIN_BLOCKS : 16 + k % 80, 0, &n, &err);
        bad += rc != KV_OK || kv_bytes(mem) != (uint64_t)n * bb;
        usleep(200);
    }
    CHECKF(all_done() && bad == 0, "threaded: done %d, %d bad resizes of %d", all_done(), bad, k);
    int ok = 0;
    for (int i = 0; i < N_REQ; i++)
        ok += same(&got[i], &alone[i]);
    CHECKF(ok == N_REQ, "threaded: %d of %d requests identical to running alone", ok, N_REQ);
    engine_stats st;
    engine_get_stats(e, &st);
    CHECK(st.kv_grows > 0 && st.kv_shrinks > 0);
    fprintf(stderr, "  threaded: %d/%d identical, %d resizes (%llu grows, %llu shrinks)\n", ok,
            N_REQ, k, (unsigned long long)st.kv_grows, (unsigned long long)st.kv_shrinks);
    engine_destroy(e);
    CHECK(mem_used(mem) == 0);
    mem_destroy(mem);
}

/* An event callback that holds the engine thread until released: a step
 * that does not end, as a wedged kernel would. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int entered, open;
} gate;

static void on_event_gate(void *ctx, const engine_event *ev)
{
    gate *g = ctx;
    (void)ev;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* A resize the engine thread cannot take in time is withdrawn (KV_EBUSY,
 * nothing changed); once the step ends, resizes work again. */
static void test_timeout(model *m)
{
    mem_mgr *mem = mem_create(1ull << 30, mem_allocator_host(), NULL);
    engine *e = mk(m, mem, MIN_BLOCKS, MAX_BLOCKS, 0);
    if (!e)
        return;
    const uint64_t bb = engine_kv_block_bytes(e);
    gate g = {.entered = 0, .open = 0};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    engine_request q = {.prompt = prompts[0], .n_prompt = n_prompt[0], .max_tokens = 2, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    q.sampling = sampler_params_default();
    CHECK(engine_submit(e, &q, on_event_gate, &g, NULL) > 0);
    pthread_mutex_lock(&g.mu);
    while (!g.entered)
        pthread_cond_wait(&g.cv, &g.mu);
    pthread_mutex_unlock(&g.mu);
    kvant_err err = {0};
    int32_t n = -1;
    CHECK(engine_kv_resize(e, 40, 0.2, &n, &err) == KV_EBUSY && strstr(err.msg, "0.2 s"));
    CHECK(kv_bytes(mem) == MIN_BLOCKS * bb);
    pthread_mutex_lock(&g.mu);
    g.open = 1;
    pthread_cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    CHECK(engine_kv_resize(e, 40, 0, &n, &err) == KV_OK && n == 40);
    CHECK(kv_bytes(mem) == 40 * bb);
    engine_destroy(e);
    pthread_mutex_destroy(&g.mu);
    pthread_cond_destroy(&g.cv);
    mem_destroy(mem);
}

int main(void)
{
    dtype_init();
    model *m = tiny_model_load(NULL, 7);
    if (!m)
        return tu_finish("test_kvresize");
    make_prompts();
    run_alone(m);
    test_manual(m);
    test_budget(m);
    test_threaded(m);
    test_timeout(m);
    model_free(m);
    return tu_finish("test_kvresize");
}
