/* test_cuda_tier.c - the KV host tier and weight streaming through a
 * backend's pinned host memory and copy stream (backend.h host_alloc,
 * kv_export_async, copy_done, stream_layer), on the CUDA backend where the
 * build has it (the host build, `make cuda-host`: the shim's streams are
 * lazy, so a copy that nothing waits for has not happened), else on the
 * CPU backend (no pinned memory: a malloc'd slab, synchronous copies).
 *
 *   - tier round trip: blocks of random KV bytes stored into a host tier
 *     whose slab is pinned (MEM_PINNED accounted, outside the budget), the
 *     exports queued on the copy stream; the device blocks are then
 *     overwritten, and every record fetched back must equal the block as it
 *     was (bitwise), and so must the block it is imported into;
 *   - weight streaming: logits of a tiny 3-layer model with every layer
 *     streamed through a 2-slot pinned ring equal the resident logits
 *     bitwise (same backend), prefill and decode;
 *   - the engine on that backend: prompts that churn a 5-block pool
 *     through a host tier (every eviction an async export), then the first
 *     prompt again, served from the host tier; and the same requests with
 *     --weights-memory streaming every layer: greedy tokens and
 *     log-probabilities bitwise equal to a plain engine's.
 * Small shapes: the host build runs it under ASan with every CUDA thread a
 * fiber.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend_select.h"
#include "engine/engine.h"
#include "forward/forward.h"
#include "kernels/dtype.h"
#include "kv/kvtier.h"
#include "model/wstream.h"
#include "testutil.h"
#include "tinymodel.h"

#define T_BLOCKS 8
#define T_BS 16
#define T_STORED 6 /* blocks stored into the tier (an 8-record host tier) */

typedef struct rig {
    const char *name;
    mem_mgr *mem;
    backend *be;
} rig;

static int rig_open(rig *r)
{
    kvant_err err = {0};
    backend_device_info dev;
    memset(r, 0, sizeof *r);
    r->name = "cpu";
#ifdef KVANT_CUDA
    if (backend_query("cuda", 0, &dev, &err) == KV_OK)
        r->name = "cuda";
#endif
    if (backend_query(r->name, 0, &dev, &err))
        return -1;
    r->mem = mem_create(1ull << 30, dev.alloc, &err);
    r->be = r->mem ? backend_create(r->name, 0, r->mem, 2, BACKEND_EXACT, &err) : NULL;
    CHECKF(r->be != NULL, "backend %s: %s", r->name, err.msg);
    return r->be ? 0 : -1;
}

static void rig_close(rig *r)
{
    if (r->be)
        r->be->ops->destroy(r->be);
    if (r->mem) {
        CHECKF(mem_live_count(r->mem) == 0, "%s: %zu allocations left", r->name,
               mem_live_count(r->mem));
        mem_destroy(r->mem);
    }
}

static uint64_t pinned_now(mem_mgr *m)
{
    mem_report *rep = calloc(1, sizeof *rep);
    mem_get_report(m, rep);
    uint64_t v = rep->cat[MEM_PINNED].current;
    free(rep);
    return v;
}

/* ---- the KV host tier through the backend ---- */

static void *t_alloc(void *ctx, size_t bytes)
{
    backend *be = ctx;
    return be->ops->host_alloc(be, bytes, NULL);
}

static void t_free(void *ctx, void *p)
{
    backend *be = ctx;
    be->ops->host_free(be, p);
}

static int t_done(void *ctx, int64_t ticket, int wait)
{
    backend *be = ctx;
    return be->ops->copy_done(be, ticket, wait);
}

typedef struct exp_ctx {
    backend *be;
    int32_t block;
} exp_ctx;

static int t_fill(void *ctx, void *dst)
{
    exp_ctx *x = ctx;
    return x->be->ops->kv_export_block(x->be, x->block, dst);
}

static int64_t t_fill_async(void *ctx, void *dst)
{
    exp_ctx *x = ctx;
    return x->be->ops->kv_export_async(x->be, x->block, dst);
}

static void key_of(int32_t b, uint8_t key[KVTIER_KEY_BYTES], int32_t tok[T_BS])
{
    uint8_t fp[KVTIER_KEY_BYTES];
    memset(fp, 3, sizeof fp);
    for (int i = 0; i < T_BS; i++)
        tok[i] = b * 100 + i;
    kvhash_chain_key(fp, 0, tok, T_BS, key);
}

static void test_tier(rig *r)
{
    kvant_err err = {0};
    backend *be = r->be;
    const int async = be->ops->kv_export_async && be->ops->copy_done && be->ops->host_alloc;
    CHECKF(strcmp(r->name, "cuda") || async, "the CUDA backend has no pinned async exports");
    kv_layout lay = {.n_layers = 2, .n_blocks = T_BLOCKS, .block_size = T_BS, .n_kv_heads = 2,
                     .head_dim = 64, .dtype = DT_F16};
    if (be->ops->kv_init(be, &lay, &err)) {
        CHECKF(0, "kv_init: %s", err.msg);
        return;
    }
    const size_t bytes = (size_t)lay.n_layers * 2 * T_BS * dtype_row_size(DT_F16, 128);
    uint8_t *want = malloc(bytes * T_BLOCKS), *got = malloc(bytes);
    tu_rng rng = {0x71e5};
    for (size_t i = 0; i < bytes * T_BLOCKS; i++)
        want[i] = (uint8_t)tu_rand_u64(&rng);
    for (int32_t b = 0; b < T_BLOCKS; b++)
        CHECK(be->ops->kv_import_block(be, b, want + b * bytes) == 0);
    kvtier_config c = kvtier_config_default();
    memset(c.fingerprint, 3, sizeof c.fingerprint);
    c.block_size = T_BS;
    c.kv_dtype = DT_F16;
    c.payload_bytes = bytes;
    c.host_bytes = 8 * KVTIER_RECORD_BYTES(T_BS, bytes);
    c.quiet = 1;
    if (async)
        c.dma = (kvtier_dma){be, t_alloc, t_free, t_done};
    kvtier *t = kvtier_create(&c, &err);
    CHECKF(t != NULL, "kvtier_create: %s", err.msg);
    if (!t) {
        be->ops->kv_free(be);
        free(want);
        free(got);
        return;
    }
    CHECKF(!async || pinned_now(r->mem) >= c.host_bytes - KVTIER_RECORD_BYTES(T_BS, bytes),
           "the pinned slab is not accounted (%llu bytes pinned)",
           (unsigned long long)pinned_now(r->mem));
    CHECK(mem_used(r->mem) < mem_budget(r->mem));
    uint8_t key[KVTIER_KEY_BYTES];
    int32_t tok[T_BS];
    for (int32_t b = 0; b < T_STORED; b++) {
        exp_ctx x = {be, b};
        key_of(b, key, tok);
        CHECK(kvtier_store_async(t, key, tok, t_fill, t_fill_async, &x) == KVTIER_HOST);
    }
    kvtier_stats st;
    kvtier_get_stats(t, &st);
    CHECK(st.host_blocks == T_STORED && (!async || st.host_pending > 0));
    /* the blocks are reused on the device (rewritten by the compute stream
     * right after the exports were queued: it must wait for them) */
    for (int32_t b = 0; b < T_STORED; b++)
        CHECK(be->ops->kv_import_block(be, b, want + (T_BLOCKS - 1 - b) * bytes) == 0);
    kvtier_poll(t);
    for (int32_t b = 0; b < T_STORED; b++) {
        key_of(b, key, tok);
        const void *pl = kvtier_fetch(t, key, tok);
        CHECKF(pl && !memcmp(pl, want + b * bytes, bytes),
               "%s: tier record of block %d differs from the block it was stored from",
               r->name, (int)b);
        if (!pl)
            continue;
        const int32_t dst = T_BLOCKS - 1 - b % 2; /* imported, then exported again */
        CHECK(be->ops->kv_import_block(be, dst, pl) == 0);
        CHECK(be->ops->kv_export_block(be, dst, got) == 0);
        CHECKF(!memcmp(got, want + b * bytes, bytes), "%s: block %d restored differs", r->name,
               (int)b);
    }
    kvtier_get_stats(t, &st);
    CHECK(st.host_pending == 0 && st.loads[KVTIER_HOST] == T_STORED);
    kvtier_destroy(t);
    CHECK(pinned_now(r->mem) == 0);
    be->ops->kv_free(be);
    free(want);
    free(got);
}

/* ---- weight streaming through the backend ---- */

#define W_TOK 11 /* a prefill of 8, then 3 decode steps */

static int run_model(rig *r, const char *path, int stream, float *logits)
{
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m)
        return -1;
    wstream *ws = NULL;
    int rc = KV_OK;
    if (stream) {
        wstream_plan p;
        wstream_plan_resident(m, 2, &p);
        for (int32_t il = 0; il < p.n_layers; il++)
            p.place[il] = WPLACE_STREAMED;
        wstream_plan_update(&p);
        wstream_dev dev;
        const int on_dev = backend_wstream_dev(r->be, &dev);
        CHECK(on_dev == (strcmp(r->name, "cuda") == 0));
        ws = wstream_create_dev(m, r->mem, &p, NULL, on_dev ? &dev : NULL, &err);
        CHECKF(ws != NULL, "wstream_create: %s", err.msg);
        rc = ws ? KV_OK : KV_EIO;
        m->wstream = ws;
        CHECKF(!ws || !on_dev || pinned_now(r->mem) >= p.ring_bytes,
               "the ring is not pinned host memory (%llu bytes pinned)",
               (unsigned long long)pinned_now(r->mem));
    }
    fwd_ctx f;
    kv_layout lay = fwd_kv_layout(m, 4, T_BS, DT_F32);
    if (!rc)
        rc = r->be->ops->load_weights(r->be, m, &err);
    int inited = 0;
    if (!rc)
        inited = (rc = fwd_init(&f, m, r->be, 16, 8, &lay, &err)) == KV_OK;
    CHECKF(rc == KV_OK, "%s set-up (stream %d): %s", r->name, stream, err.msg);
    int32_t tok[W_TOK], pos[8], seq[8] = {0}, out[8], table[4] = {0, 1, 2, 3};
    fwd_seq s = {.block_table = table, .n_blocks = 4};
    for (int i = 0; i < W_TOK; i++)
        tok[i] = (i * 37 + 11) % 290;
    for (int done = 0; !rc && done < W_TOK;) {
        const int n = done ? 1 : 8;
        for (int i = 0; i < n; i++)
            pos[i] = done + i, out[i] = i;
        fwd_batch b = {.n_tokens = n, .tokens = tok + done, .pos = pos, .seq = seq, .n_seqs = 1,
                       .seqs = &s, .n_out = n, .out = out};
        rc = fwd_run(&f, &b, logits + (size_t)done * m->hp.n_vocab, &err);
        CHECKF(rc == KV_OK, "%s fwd_run (stream %d) at %d: %s", r->name, stream, done, err.msg);
        done += n;
    }
    if (inited)
        fwd_free(&f);
    r->be->ops->unload_weights(r->be, m);
    m->wstream = NULL;
    wstream_destroy(ws); /* before the backend (its pinned ring) */
    CHECK(pinned_now(r->mem) == 0);
    model_free(m);
    return rc;
}

static void test_stream(rig *r)
{
    char path[] = "/tmp/kvant_test_cuda_tier_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || tiny_model_write_layers(path, 91, 3) != 0) {
        CHECKF(0, "cannot write the tiny model");
        return;
    }
    close(fd);
    const size_t n = (size_t)W_TOK * 300;
    float *a = calloc(n, sizeof *a), *b = calloc(n, sizeof *b);
    if (run_model(r, path, 0, a) == KV_OK && run_model(r, path, 1, b) == KV_OK) {
        size_t bad = 0;
        for (size_t i = 0; i < n; i++)
            bad += memcmp(&a[i], &b[i], sizeof a[i]) != 0;
        CHECKF(bad == 0, "%s: streamed logits differ from resident in %zu of %zu", r->name, bad,
               n);
    }
    free(a);
    free(b);
    unlink(path);
}

/* ---- the engine: host tier and --weights-memory on the backend ---- */

#define E_P 3      /* prompts */
#define E_LEN 48   /* 3 blocks of 16: 2 can come from a cache */
#define E_GEN 4

typedef struct eres {
    int32_t toks[E_GEN];
    float lps[E_GEN];
    int n, done, error;
    int64_t cached;
} eres;

static void on_event(void *ctx, const engine_event *ev)
{
    eres *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && r->n < E_GEN) {
        r->toks[r->n] = ev->token;
        r->lps[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_DONE) {
        r->done = 1;
        r->cached = ev->cached_tokens;
    } else if (ev->type == ENGINE_EV_ERROR) {
        r->error = r->done = 1;
    }
}

static int same(const eres *a, const eres *b)
{
    return a->n == E_GEN && b->n == E_GEN && !a->error && !b->error &&
           !memcmp(a->toks, b->toks, sizeof a->toks) && !memcmp(a->lps, b->lps, sizeof a->lps);
}

/* host: records of the host tier (0: none); wmem: --weights-memory (0: none). */
static engine *e_make(const rig *r, model *m, int host, uint64_t wmem)
{
    engine_config c = engine_config_default();
    c.backend = r->name;
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = 64;
    c.max_num_seqs = 2;
    c.kv_blocks_override = 5;
    c.device_memory = 1ull << 30;
    c.kv_dtype = DT_F32;
    c.kv_host_memory = (uint64_t)host * KVTIER_RECORD_BYTES(16, (uint64_t)m->hp.n_layers * 2 *
                                                           16 * m->hp.n_head_kv *
                                                           m->hp.head_dim * 4);
    c.kv_tier_policy = ENGINE_TIER_ALWAYS;
    c.weights_memory = wmem;
    c.weights_place = 1 + WSTREAM_ORDER_TAIL;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    CHECKF(e != NULL, "engine_create(%s, host %d, weights %llu): %s", r->name, host,
           (unsigned long long)wmem, err.msg);
    return e;
}

static void e_run(engine *e, int i, eres *out)
{
    int32_t prompt[E_LEN];
    for (int j = 0; j < E_LEN; j++)
        prompt[j] = (i * 41 + j * 13 + 5) % 250;
    memset(out, 0, sizeof *out);
    engine_request q = {.prompt = prompt, .n_prompt = E_LEN, .max_tokens = E_GEN, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    q.sampling = sampler_params_default();
    q.sampling.temperature = 0.0f;
    CHECK(engine_submit(e, &q, on_event, out, NULL) > 0);
    for (int s = 0; s < 100 && !out->done; s++)
        engine_run_step(e);
    CHECK(out->done && !out->error);
}

static void test_engine(const rig *r)
{
    char path[] = "/tmp/kvant_test_cuda_tier_e_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0 || tiny_model_write_layers(path, 93, 4) != 0) {
        CHECKF(0, "cannot write the tiny model");
        return;
    }
    close(fd);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    CHECKF(m != NULL, "model_load: %s", err.msg);
    eres ref[E_P], got, again;
    engine *e = m ? e_make(r, m, 0, 0) : NULL;
    for (int i = 0; e && i < E_P; i++)
        e_run(e, i, &ref[i]);
    if (e)
        engine_destroy(e);
    /* the host tier: each prompt evicts the one before it to the host */
    e = m ? e_make(r, m, 16, 0) : NULL;
    for (int i = 0; e && i < E_P; i++) {
        e_run(e, i, &got);
        CHECKF(same(&got, &ref[i]), "%s host tier: prompt %d differs", r->name, i);
    }
    if (e) {
        e_run(e, 0, &again);
        engine_tier_stats ts;
        engine_get_tier_stats(e, &ts);
        CHECKF(same(&again, &ref[0]) && again.cached == 32 && ts.hit_tokens[KVTIER_HOST] == 32,
               "%s host tier hit: cached %lld, host hit tokens %llu", r->name,
               (long long)again.cached, (unsigned long long)ts.hit_tokens[KVTIER_HOST]);
        engine_destroy(e);
    }
    /* every layer streamed (the smallest weights budget that works) */
    wstream_plan p;
    if (m)
        wstream_plan_resident(m, 2, &p);
    e = m ? e_make(r, m, 0, p.min_bytes) : NULL;
    for (int i = 0; e && i < E_P; i++) {
        e_run(e, i, &got);
        CHECKF(same(&got, &ref[i]), "%s --weights-memory: prompt %d differs", r->name, i);
    }
    if (e) {
        wstream_stats ws;
        CHECK(engine_get_offload(e, &ws) && ws.n_streamed == m->hp.n_layers && !ws.failed);
        engine_destroy(e);
    }
    model_free(m);
    unlink(path);
}

int main(void)
{
    dtype_init();
    rig r;
    if (rig_open(&r) == 0) {
        fprintf(stderr, "test_cuda_tier: backend %s\n", r.name);
        test_tier(&r);
        test_stream(&r);
    }
    if (r.be)
        test_engine(&r); /* its own engines (and managers) on the same backend kind */
    rig_close(&r);
    return tu_finish("test_cuda_tier");
}
