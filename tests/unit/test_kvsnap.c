/* test_kvsnap.c - the engine's memory views on a tiny random model:
 * per-request KV footprints in events (n = 2 shares the prompt's full
 * blocks, counted once), snapshots of the block pool that agree with the
 * requests holding blocks (manual mode), and snapshots taken from several
 * threads while the engine thread runs requests (each one consistent; run
 * under ASan by `make asan`). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "kv/kvpool.h"
#include "server/server_memview.h"
#include "testutil.h"
#include "tinymodel.h"

#define BS 16

typedef struct res {
    int done, error, n_tok;
    int64_t kv_tokens, kv_blocks;
    uint64_t kv_bytes;
} res;

static void on_event(void *ctx, const engine_event *ev)
{
    res *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN)
        r->n_tok++;
    if (ev->type == ENGINE_EV_DONE || ev->type == ENGINE_EV_ERROR) {
        r->done = 1;
        r->error = ev->type == ENGINE_EV_ERROR;
        r->kv_tokens = ev->kv_tokens;
        r->kv_blocks = ev->kv_blocks;
        r->kv_bytes = ev->kv_bytes;
    }
}

static engine *mk(model *m, int manual, int32_t blocks)
{
    engine_config c = engine_config_default();
    c.manual = manual;
    c.n_threads = 1;
    c.max_num_batched_tokens = 256;
    c.max_num_seqs = 16;
    c.kv_blocks_override = blocks;
    c.device_memory = 1ull << 30;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create: %s", err.msg);
    return e;
}

static engine_request req(const int32_t *p, int64_t n, int64_t max_tokens, int32_t nseq)
{
    engine_request r = {.prompt = p, .n_prompt = n, .max_tokens = max_tokens, .n = nseq,
                        .ignore_eos = 1};
    r.sampling = sampler_params_default();
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 7;
    return r;
}

/* Every block's state agrees with its owner and refcount, and every
 * request's listed blocks are used and counted once.  Returns 0 if so. */
static int snap_consistent(const engine_kv_snapshot *s)
{
    int32_t used = 0;
    for (int32_t b = 0; b < s->n_blocks; b++) {
        int u = s->state[b] == KVPOOL_BLOCK_USED;
        used += u;
        if (u != (s->refcount[b] > 0) || u != (s->owner[b] != 0))
            return -1;
    }
    int32_t listed = 0;
    for (int32_t i = 0; i < s->n_reqs; i++) {
        const engine_kv_req *q = &s->reqs[i];
        if (q->n_blk != q->blocks_own + q->blocks_shared)
            return -2;
        for (int32_t k = 0; k < q->n_blk; k++) {
            int32_t b = s->blk_ids[q->blk_off + k];
            if (b < 0 || b >= s->n_blocks || s->state[b] != KVPOOL_BLOCK_USED)
                return -3;
        }
        listed += q->n_blk;
    }
    /* without sharing across requests, the listed blocks are all the used ones */
    return listed >= used ? 0 : -5;
}

static void test_manual(model *m)
{
    engine *e = mk(m, 1, 64);
    if (!e)
        return;
    int32_t p[40];
    for (int i = 0; i < 40; i++)
        p[i] = (i * 13 + 5) % 250;
    res r = {0};
    engine_request rq = req(p, 40, 10, 2);
    int64_t id = engine_submit(e, &rq, on_event, &r, NULL);
    CHECK(id > 0);
    for (int s = 0; s < 4; s++)
        engine_run_step(e);
    engine_kv_snapshot *sn = engine_kv_snapshot_new(e);
    CHECK(sn != NULL);
    kvant_err err = {0};
    CHECK(engine_kv_snapshot_take(e, sn, &err) == KV_OK);
    CHECKF(snap_consistent(sn) == 0, "snapshot inconsistent: %d", snap_consistent(sn));
    CHECK(sn->n_blocks == 64 && sn->block_size == BS && sn->block_bytes > 0);
    CHECKF(sn->n_reqs == 1, "%d requests", sn->n_reqs);
    if (sn->n_reqs == 1) {
        const engine_kv_req *q = &sn->reqs[0];
        CHECK(q->id == id && q->n_seqs == 2 && q->prompt_tokens == 40);
        /* the prompt's 2 full blocks are shared by both sequences; each has
         * its own copy of the third (written after the fork) */
        CHECKF(q->blocks_shared == 2 && q->blocks_own == 2, "own %d shared %d", q->blocks_own,
               q->blocks_shared);
        int64_t per_seq = 40 + q->generated_tokens / 2 - 1;
        CHECKF(q->kv_tokens == 2 * per_seq - 32, "kv_tokens %lld (per seq %lld)",
               (long long)q->kv_tokens, (long long)per_seq);
        for (int32_t k = 0; k < q->n_blk; k++)
            CHECK(sn->owner[sn->blk_ids[q->blk_off + k]] == id);
        CHECK(sn->stats.running == 2); /* counts sequences */
    }
    for (int s = 0; s < 100 && !r.done; s++)
        engine_run_step(e);
    CHECK(r.done && !r.error && r.n_tok == 20);
    int64_t per_seq = 40 + 10 - 1, blocks = (per_seq + BS - 1) / BS;
    CHECKF(r.kv_blocks == 2 * blocks - 2 && r.kv_tokens == 2 * per_seq - 32,
           "done: kv_blocks %lld kv_tokens %lld", (long long)r.kv_blocks, (long long)r.kv_tokens);
    CHECK(r.kv_bytes == (uint64_t)r.kv_blocks * sn->block_bytes);
    /* idle: nothing used, nobody listed */
    CHECK(engine_kv_snapshot_take(e, sn, &err) == KV_OK);
    CHECK(sn->n_reqs == 0 && snap_consistent(sn) == 0);
    for (int32_t b = 0; b < sn->n_blocks; b++)
        CHECK(sn->state[b] != KVPOOL_BLOCK_USED);
    engine_kv_snapshot_free(sn);
    engine_destroy(e);
}

typedef struct reader {
    engine *e;
    int n_ok, n_bad, saw_used;
} reader;

static void *read_loop(void *arg)
{
    reader *rd = arg;
    engine_kv_snapshot *sn = engine_kv_snapshot_new(rd->e);
    for (int i = 0; sn && i < 60; i++) {
        if (engine_kv_snapshot_take(rd->e, sn, NULL) != KV_OK || snap_consistent(sn)) {
            rd->n_bad++;
            continue;
        }
        rd->n_ok++;
        rd->saw_used |= sn->n_reqs > 0;
    }
    engine_kv_snapshot_free(sn);
    return NULL;
}

static void test_threads(model *m)
{
    engine *e = mk(m, 0, 128);
    if (!e)
        return;
    int32_t p[8][24];
    res r[8];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 8; i++) {
        for (int j = 0; j < 24; j++)
            p[i][j] = (i * 29 + j * 7 + 1) % 250;
        engine_request rq = req(p[i], 24, 40, 1);
        CHECK(engine_submit(e, &rq, on_event, &r[i], NULL) > 0);
    }
    pthread_t t[3];
    reader rd[3] = {{e, 0, 0, 0}, {e, 0, 0, 0}, {e, 0, 0, 0}};
    for (int i = 0; i < 3; i++)
        pthread_create(&t[i], NULL, read_loop, &rd[i]);
    for (int i = 0; i < 3; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 3; i++)
        CHECKF(rd[i].n_ok == 60 && rd[i].n_bad == 0, "reader %d: %d ok %d bad", i, rd[i].n_ok,
               rd[i].n_bad);
    engine_destroy(e); /* requests still running get an error event: fine */
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A 100k-block pool with 16 running requests: the snapshot (engine
 * thread's share of a poll) and the run-length encoding (HTTP thread).
 * Timings are printed for docs/SERVER.md, not checked. */
static void test_large_pool(model *m)
{
    engine *e = mk(m, 1, 100000);
    if (!e)
        return;
    int32_t p[16][40];
    res r[16];
    memset(r, 0, sizeof r);
    for (int i = 0; i < 16; i++) {
        for (int j = 0; j < 40; j++)
            p[i][j] = (i * 31 + j * 3 + 2) % 250;
        engine_request rq = req(p[i], 40, 200, 1);
        CHECK(engine_submit(e, &rq, on_event, &r[i], NULL) > 0);
    }
    for (int s = 0; s < 60; s++)
        engine_run_step(e);
    engine_kv_snapshot *sn = engine_kv_snapshot_new(e);
    CHECK(sn != NULL);
    if (!sn) {
        engine_destroy(e);
        return;
    }
    double t0 = now_s();
    int reps = 20;
    for (int i = 0; i < reps; i++)
        CHECK(engine_kv_snapshot_take(e, sn, NULL) == KV_OK);
    double t1 = now_s();
    size_t bytes = 0;
    for (int i = 0; i < reps; i++) {
        char *js = srv_blockmap_json(sn);
        CHECK(js != NULL);
        bytes = js ? strlen(js) : 0;
        free(js);
    }
    double t2 = now_s();
    CHECK(sn->n_reqs == 16 && snap_consistent(sn) == 0);
    printf("  100k-block pool, 16 requests: snapshot %.0f us, block map encode %.0f us, %zu bytes\n",
           (t1 - t0) / reps * 1e6, (t2 - t1) / reps * 1e6, bytes);
    engine_kv_snapshot_free(sn);
    engine_destroy(e);
}

int main(void)
{
    dtype_init();
    model *m = tiny_model_load(NULL, 7);
    if (!m)
        return tu_finish("test_kvsnap");
    test_manual(m);
    test_threads(m);
    test_large_pool(m);
    model_free(m);
    return tu_finish("test_kvsnap");
}
