/* test_engine_alloc.c - an engine step allocates nothing (ARCHITECTURE.md,
 * "No allocation in a step").
 *
 * The test binary is linked with -Wl,--wrap for malloc, calloc, realloc,
 * free, posix_memalign, aligned_alloc, memalign, valloc, reallocarray,
 * strdup and strndup (Makefile), so every call to them from kvant's code
 * (the whole of libkvant.a is linked into this binary) goes through the
 * counters below.  Calls libc makes internally (inside qsort, opendir,
 * stdio) are not seen; nothing on the step's path uses those.
 *
 * Two counters, both armed only inside engine_run_step (manual mode: the
 * test thread is the engine thread, and the requests are submitted and
 * cancelled between steps, on the same thread, with the counters off):
 *  - engine thread: a thread-local flag set around each step;
 *  - any thread while a step runs (the CPU backend's workers): a global
 *    flag; no other thread of this process allocates meanwhile.
 * After a warm-up round (first-use work happens once), rounds of requests
 * that admit, prefill in chunks, decode, fork n > 1, sample with every
 * sampler stage and logprobs, prompt logprobs (logit rows in chunks
 * of what the step has left), get preempted, hit the prefix cache and the
 * host tier, get cancelled and retire must count 0 calls. */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

/* ---- the allocation hook ---- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void *__real_memalign(size_t a, size_t n);
void *__real_valloc(size_t n);
void *__real_reallocarray(void *p, size_t k, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t k, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);
void *__wrap_memalign(size_t a, size_t n);
void *__wrap_valloc(size_t n);
void *__wrap_reallocarray(void *p, size_t k, size_t n);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);

enum { AC_MALLOC, AC_CALLOC, AC_REALLOC, AC_FREE, AC_ALIGNED, AC_STRDUP, AC_KINDS };
static const char *const ac_names[AC_KINDS] = {"malloc", "calloc", "realloc", "free",
                                               "aligned (posix_memalign, ...)", "strdup"};

static _Thread_local volatile int tl_armed;  /* this thread is the engine thread, inside a step */
static atomic_int g_armed;           /* a step is running (any thread counts) */
static atomic_long g_engine[AC_KINDS], g_any[AC_KINDS];
#define AC_SITES 8
static void *g_site[AC_SITES];       /* callers of the first counted calls */
static atomic_int g_n_site;

static void ac_count(int kind, void *caller)
{
    if (atomic_load_explicit(&g_armed, memory_order_relaxed) == 0)
        return;
    atomic_fetch_add(&g_any[kind], 1);
    if (tl_armed)
        atomic_fetch_add(&g_engine[kind], 1);
    int i = atomic_fetch_add(&g_n_site, 1);
    if (i < AC_SITES)
        g_site[i] = caller;
}

#define AC_CALLER __builtin_extract_return_addr(__builtin_return_address(0))

void *__wrap_malloc(size_t n)
{
    ac_count(AC_MALLOC, AC_CALLER);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t k, size_t n)
{
    ac_count(AC_CALLOC, AC_CALLER);
    return __real_calloc(k, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    ac_count(AC_REALLOC, AC_CALLER);
    return __real_realloc(p, n);
}

void __wrap_free(void *p)
{
    ac_count(AC_FREE, AC_CALLER);
    __real_free(p);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    ac_count(AC_ALIGNED, AC_CALLER);
    return __real_posix_memalign(p, a, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    ac_count(AC_ALIGNED, AC_CALLER);
    return __real_aligned_alloc(a, n);
}

void *__wrap_memalign(size_t a, size_t n)
{
    ac_count(AC_ALIGNED, AC_CALLER);
    return __real_memalign(a, n);
}

void *__wrap_valloc(size_t n)
{
    ac_count(AC_ALIGNED, AC_CALLER);
    return __real_valloc(n);
}

void *__wrap_reallocarray(void *p, size_t k, size_t n)
{
    ac_count(AC_REALLOC, AC_CALLER);
    return __real_reallocarray(p, k, n);
}

char *__wrap_strdup(const char *s)
{
    ac_count(AC_STRDUP, AC_CALLER);
    return __real_strdup(s);
}

char *__wrap_strndup(const char *s, size_t n)
{
    ac_count(AC_STRDUP, AC_CALLER);
    return __real_strndup(s, n);
}

/* 1 when the wrappers are linked in (a plain link would bypass them). */
static int hook_works(void)
{
    atomic_store(&g_armed, 1);
    tl_armed = 1;
    void *volatile p = malloc(16);
    free(p);
    tl_armed = 0;
    atomic_store(&g_armed, 0);
    int ok = atomic_load(&g_engine[AC_MALLOC]) == 1 && atomic_load(&g_engine[AC_FREE]) == 1;
    for (int k = 0; k < AC_KINDS; k++) {
        atomic_store(&g_engine[k], 0);
        atomic_store(&g_any[k], 0);
    }
    atomic_store(&g_n_site, 0);
    return ok;
}

static long counted(atomic_long *c)
{
    long n = 0;
    for (int k = 0; k < AC_KINDS; k++)
        n += atomic_load(&c[k]);
    return n;
}

/* One counted step. */
static int step(engine *e)
{
    atomic_store(&g_armed, 1);
    tl_armed = 1;
    int rc = engine_run_step(e);
    tl_armed = 0;
    atomic_store(&g_armed, 0);
    return rc;
}

/* Names the callers of the first counted calls (offsets into the binary:
 * addr2line -f -e build/tests/test_engine_alloc OFFSET). */
static void print_sites(void)
{
    int n = atomic_load(&g_n_site);
    for (int k = 0; k < AC_KINDS; k++)
        if (atomic_load(&g_any[k]))
            fprintf(stderr, "  %s: %ld on the engine thread, %ld on any thread\n", ac_names[k],
                    atomic_load(&g_engine[k]), atomic_load(&g_any[k]));
    for (int i = 0; i < n && i < AC_SITES; i++) {
        Dl_info di;
        if (dladdr(g_site[i], &di) && di.dli_fbase)
            fprintf(stderr, "  called from %s+0x%lx\n", di.dli_fname,
                    (unsigned long)((char *)g_site[i] - (char *)di.dli_fbase));
        else
            fprintf(stderr, "  called from %p\n", g_site[i]);
    }
    if (n > 0)
        fprintf(stderr, "  (addr2line -f -i -e BINARY OFFSET names the function and line)\n");
}

/* ---- the workload ---- */

#define N_REQ 12

typedef struct res {
    int done, error, n_tok[ENGINE_MAX_N];
    int n_prompt_lp;        /* ENGINE_EV_PROMPT events */
} res;

static void on_event(void *ctx, const engine_event *ev)
{
    res *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index >= 0 && ev->index < ENGINE_MAX_N)
        r->n_tok[ev->index]++;
    else if (ev->type == ENGINE_EV_PROMPT)
        r->n_prompt_lp++;
    else if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = 1;
        r->error = ev->type == ENGINE_EV_ERROR;
    }
}

/* Request i of a round: prompts sharing a prefix (prefix cache), a mix of
 * n = 1..3, greedy and seeded sampling with every stage, logprobs. */
static engine_request req_for(int round, int i, int32_t *p)
{
    int64_t n = 20 + (i * 13) % 40;
    for (int64_t j = 0; j < n; j++)
        p[j] = (int32_t)(j < 16 ? (j * 7 + 3) % 250 : (round * 31 + i * 17 + j * 11) % 250);
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = 8 + (i * 5) % 17,
                        .n = 1 + i % 3, .priority = i % 2, .top_logprobs = (i % 4) - 1,
                        .ignore_eos = 1, .prompt_logprobs = i % 4 == 2};
    r.sampling = sampler_params_default();
    if (i % 2) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_k = i % 4 == 1 ? 20 : 0;
        r.sampling.top_p = 0.9f;
        r.sampling.min_p = 0.05f;
        r.sampling.repetition_penalty = 1.1f;
        r.sampling.presence_penalty = 0.2f;
        r.sampling.frequency_penalty = 0.1f;
        r.sampling.seed = (uint64_t)(round * 100 + i);
    }
    if (i == 5) { /* stops at a token id */
        r.ignore_eos = 0;
        r.stop_ids[0] = 7;
        r.n_stop_ids = 1;
    }
    return r;
}

/* Submits a round (half of it, then the rest while the first half runs),
 * cancels two requests, and steps until every request finished.  Returns
 * the steps taken; counts on when count is 1. */
static int run_round(engine *e, int round, int count, res *out)
{
    static int32_t prompts[N_REQ][64];
    int64_t ids[N_REQ];
    memset(out, 0, sizeof *out * N_REQ);
    int steps = 0, all = 0;
    for (int i = 0; i < N_REQ / 2; i++) {
        engine_request r = req_for(round, i, prompts[i]);
        ids[i] = engine_submit(e, &r, on_event, &out[i], NULL);
        CHECK(ids[i] > 0);
    }
    for (; steps < 2000 && !all; steps++) {
        if (steps == 3)
            for (int i = N_REQ / 2; i < N_REQ; i++) {
                engine_request r = req_for(round, i, prompts[i]);
                ids[i] = engine_submit(e, &r, on_event, &out[i], NULL);
                CHECK(ids[i] > 0);
            }
        if (steps == 5)
            engine_cancel(e, ids[1]); /* running */
        if (steps == 6)
            engine_cancel(e, ids[N_REQ - 1]); /* probably still waiting */
        if (count)
            step(e);
        else
            engine_run_step(e);
        all = steps >= 6;
        for (int i = 0; i < N_REQ; i++)
            all &= out[i].done;
    }
    CHECKF(all, "round %d: every request finished (%d steps)", round, steps);
    return steps;
}

/* n_blocks: a pool small enough for preemption; host: a host tier. */
static void test_no_alloc(model *m, const char *name, int32_t n_blocks, uint64_t host)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 48;
    c.max_num_seqs = 8;
    c.kv_blocks_override = n_blocks;
    c.kv_host_memory = host;
    c.kv_tier_policy = host ? ENGINE_TIER_ALWAYS : ENGINE_TIER_COST;
    c.device_memory = 1ull << 30;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "%s: engine_create: %s", name, err.msg);
    if (!e)
        return;
    res out[N_REQ];
    run_round(e, 0, 0, out); /* warm-up, not counted */
    engine_stats s0, s1;
    engine_get_stats(e, &s0);
    int steps = 0;
    for (int round = 1; round <= 3; round++)
        steps += run_round(e, round, 1, out);
    engine_get_stats(e, &s1);
    int forks = 0, cancelled = 0, plp = 0;
    for (int i = 0; i < N_REQ; i++) {
        forks += !out[i].error && out[i].n_tok[1] > 0;
        cancelled += out[i].error;
        if (out[i].error)
            continue;
        int32_t p[64];
        engine_request r = req_for(3, i, p);
        CHECKF(out[i].n_prompt_lp == (r.prompt_logprobs ? r.n_prompt - 1 : 0),
               "%s: request %d: %d prompt logprobs for a %lld-token prompt", name, i,
               out[i].n_prompt_lp, (long long)r.n_prompt);
        plp += out[i].n_prompt_lp;
    }
    CHECKF(plp > 0, "%s: no prompt logprobs", name);
    long ne = counted(g_engine), na = counted(g_any);
    CHECKF(ne == 0 && na == 0, "%s: %ld allocator calls on the engine thread, %ld on any thread, "
           "in %d steps", name, ne, na, steps);
    if (ne || na)
        print_sites();
    /* the counted steps did what they were meant to */
    CHECKF(forks > 0 && cancelled > 0, "%s: forks %d, cancelled %d", name, forks, cancelled);
    CHECKF(s1.preemptions > s0.preemptions, "%s: no preemption in the counted rounds", name);
    CHECK(s1.finished_stop + s1.finished_length > s0.finished_stop + s0.finished_length);
    CHECK(s1.prefix_hits > s0.prefix_hits);
    if (host) {
        engine_tier_stats ts;
        engine_get_tier_stats(e, &ts);
        CHECKF(ts.t.stores[KVTIER_HOST] > 0, "%s: nothing went to the host tier", name);
    }
    CHECK(s1.kv_blocks_used == 0 && s1.running == 0 && s1.waiting == 0);
    if (m->layers[0].window > 0)
        CHECKF(s1.kv_window == 8 && s1.kv_w_dropped > s0.kv_w_dropped &&
                   s1.kv_w_blocks_used == 0 && s1.kv_w_blocks_total == n_blocks,
               "%s: window group %d, %llu blocks given back, %d used of %d", name, s1.kv_window,
               (unsigned long long)(s1.kv_w_dropped - s0.kv_w_dropped), s1.kv_w_blocks_used,
               s1.kv_w_blocks_total);
    fprintf(stderr, "  %s: %d counted steps, %llu preemptions, %d forked, %d cancelled: %ld "
            "allocator calls\n", name, steps, (unsigned long long)(s1.preemptions - s0.preemptions),
            forks, cancelled, na);
    for (int k = 0; k < AC_KINDS; k++) {
        atomic_store(&g_engine[k], 0);
        atomic_store(&g_any[k], 0);
    }
    atomic_store(&g_n_site, 0);
    engine_destroy(e);
}

int main(void)
{
    if (!hook_works()) {
        fprintf(stderr, "test_engine_alloc: FAIL (the allocator wrappers are not linked in: "
                        "build it with the Makefile's -Wl,--wrap flags)\n");
        return 1;
    }
    char path[256];
    dtype_init();
    CHECK(tu_tmp_path(path, sizeof path, "engine-alloc") == 0);
    CHECK(tiny_model_write(path, 7) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    unlink(path); /* mapped */
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m)
        return tu_finish("test_engine_alloc");
    test_no_alloc(m, "device pool", 12, 0);
    test_no_alloc(m, "device pool + host tier", 12, 4ull << 20);
    /* layer 0 slides (window 8; the engine reads the layer's window at
     * create): a second KV group whose blocks are given back as sequences
     * advance, and prefix hits matched in both groups */
    m->layers[0].window = 8;
    test_no_alloc(m, "device pool, window group", 12, 0);
    model_free(m);
    return tu_finish("test_engine_alloc");
}
