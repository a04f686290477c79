/* test_engine_tier.c - the engine with KV offload tiers on a tiny random
 * model, stepped by hand: a request served from the host tier, from the
 * disk tier, from the disk after a restart (a new engine on the same
 * directory), and sequences swapped to the host at preemption give
 * bitwise the same tokens and log-probabilities as computed from scratch.
 * Corrupt and foreign records are skipped with the answer unchanged; the
 * NEVER policy declines every load; nothing leaks. */
#include <dirent.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/engine.h"
#include "kernels/dtype.h"
#include "testutil.h"
#include "tinymodel.h"

#define N_P 6       /* distinct long prompts */
#define P_LEN 80    /* 5 blocks of 16: 4 can come from a cache */
#define GEN 8
#define N_B 32      /* batch for the preemption test */
#define B_GEN 40

typedef struct result {
    int32_t toks[64];
    float lps[64];
    int n, done, error;
    int64_t cached;
} result;

static void on_event(void *ctx, const engine_event *ev)
{
    result *r = ctx;
    if (ev->type == ENGINE_EV_TOKEN && ev->index == 0 && r->n < 64) {
        r->toks[r->n] = ev->token;
        r->lps[r->n++] = ev->logprob;
    } else if (ev->type == ENGINE_EV_DONE) {
        r->done = 1;
        r->cached = ev->cached_tokens;
    } else if (ev->type == ENGINE_EV_ERROR) {
        r->error = r->done = 1;
    }
}

static int same(const result *a, const result *b)
{
    if (a->n != b->n || a->n == 0 || a->error || b->error)
        return 0;
    return !memcmp(a->toks, b->toks, sizeof(int32_t) * (size_t)a->n) &&
           !memcmp(a->lps, b->lps, sizeof(float) * (size_t)a->n);
}

static int32_t prompts[N_P][P_LEN];
static result ref[N_P];

static void make_prompts(void)
{
    for (int i = 0; i < N_P; i++)
        for (int j = 0; j < P_LEN; j++)
            prompts[i][j] = (i * 41 + j * 13 + 5) % 250;
}

typedef struct tier_opts {
    int32_t blocks;      /* device pool */
    int host_records;
    const char *dir;
    int disk_records;
    int policy;
    uint32_t kv_dtype;
    int evict_only;      /* kv_disk_evict_only */
} tier_opts;

static uint64_t record_bytes(const model *m, uint32_t kv_dtype)
{
    const model_hparams *hp = &m->hp;
    uint64_t payload = (uint64_t)hp->n_layers * 2 * 16 *
                       dtype_row_size(kv_dtype, (int64_t)hp->n_head_kv * hp->head_dim);
    return KVTIER_PAYLOAD_OFF(16) + payload;
}

static engine *mk(model *m, tier_opts o, int32_t tokens, int32_t seqs)
{
    engine_config c = engine_config_default();
    c.manual = 1;
    c.n_threads = 2;
    c.max_num_batched_tokens = tokens;
    c.max_num_seqs = seqs;
    c.kv_blocks_override = o.blocks;
    c.device_memory = 1ull << 30;
    c.kv_dtype = o.kv_dtype;
    c.kv_host_memory = (uint64_t)o.host_records * record_bytes(m, o.kv_dtype);
    c.kv_disk_dir = o.dir;
    c.kv_disk_size = (uint64_t)o.disk_records * record_bytes(m, o.kv_dtype);
    c.kv_tier_policy = o.policy;
    c.kv_disk_wait = 1; /* deterministic: no write is dropped for a busy disk */
    c.kv_disk_evict_only = o.evict_only;
    kvant_err err = {0};
    engine *e = engine_create(m, &c, &err);
    if (!e)
        fprintf(stderr, "engine_create: %s\n", err.msg);
    return e;
}

static void run_one(engine *e, int i, result *r)
{
    memset(r, 0, sizeof *r);
    engine_request q = {.prompt = prompts[i], .n_prompt = P_LEN, .max_tokens = GEN, .n = 1,
                        .top_logprobs = -1, .ignore_eos = 1};
    q.sampling = sampler_params_default();
    q.sampling.temperature = 0.0f;
    CHECK(engine_submit(e, &q, on_event, r, NULL) > 0);
    for (int s = 0; s < 200 && !r->done; s++)
        engine_run_step(e);
    CHECK(r->done && !r->error);
}

static void check_no_leak(engine *e)
{
    engine_stats st;
    engine_get_stats(e, &st);
    CHECKF(st.kv_blocks_used == 0, "%d KV blocks still used", st.kv_blocks_used);
}

static void rm_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    char path[1024];
    while ((de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

/* Flips one payload byte in every record of dir; returns how many. */
static int flip_all(const char *dir, uint64_t off)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    char path[1024];
    while (d && (de = readdir(d))) {
        if (!strstr(de->d_name, ".kvb") || de->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        int fd = open(path, O_RDWR);
        uint8_t b;
        if (fd >= 0 && pread(fd, &b, 1, (off_t)off) == 1) {
            b ^= 0x01;
            n += pwrite(fd, &b, 1, (off_t)off) == 1;
        }
        if (fd >= 0)
            close(fd);
    }
    if (d)
        closedir(d);
    return n;
}

/* Runs prompts 0..N_P-1 once each on e (each evicts the earlier ones from
 * a small device pool), then prompt `again`; returns its result. */
static void churn_then(engine *e, int again, result *out)
{
    result r;
    for (int i = 0; i < N_P; i++) {
        run_one(e, i, &r);
        CHECKF(same(&r, &ref[i]), "prompt %d differs on first run", i);
    }
    run_one(e, again, out);
}

static void test_host_and_disk(model *m)
{
    tier_opts none = {0};
    engine *e = mk(m, none, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    for (int i = 0; i < N_P; i++)
        run_one(e, i, &ref[i]);
    engine_destroy(e);

    /* host tier: 8 device blocks hold one request; the rest goes to host */
    tier_opts host = {.blocks = 8, .host_records = 64, .policy = ENGINE_TIER_ALWAYS};
    e = mk(m, host, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    result r;
    churn_then(e, 0, &r);
    engine_tier_stats ts;
    engine_get_tier_stats(e, &ts);
    CHECKF(same(&r, &ref[0]) && r.cached == 64, "host hit: cached %lld", (long long)r.cached);
    CHECKF(ts.enabled && ts.hit_tokens[KVTIER_HOST] == 64 && ts.t.host_blocks > 0,
           "host hit tokens %llu", (unsigned long long)ts.hit_tokens[KVTIER_HOST]);
    check_no_leak(e);
    engine_destroy(e);

    /* device hit: a request right after itself is served by the pool */
    e = mk(m, host, 2048, 8);
    result r2;
    run_one(e, 3, &r);
    run_one(e, 3, &r2);
    engine_get_tier_stats(e, &ts);
    CHECK(same(&r2, &ref[3]) && r2.cached == 64 && ts.hit_tokens[KVTIER_HOST] == 0);
    engine_destroy(e);

    /* never load: the same churn computes everything */
    tier_opts never = host;
    never.policy = ENGINE_TIER_NEVER;
    e = mk(m, never, 2048, 8);
    churn_then(e, 0, &r);
    engine_get_tier_stats(e, &ts);
    CHECK(same(&r, &ref[0]) && r.cached == 0 && ts.loads_declined > 0 &&
          ts.hit_tokens[KVTIER_HOST] == 0);
    engine_destroy(e);

    /* host + disk: a 2-record host tier pushes blocks on to disk */
    char dir[256];
    CHECK(tu_tmp_dir(dir, sizeof dir, "engine-tier") == 0);
    tier_opts disk = {.blocks = 8, .host_records = 2, .dir = dir, .disk_records = 256,
                      .policy = ENGINE_TIER_ALWAYS};
    e = mk(m, disk, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    churn_then(e, 0, &r);
    engine_get_tier_stats(e, &ts);
    CHECKF(same(&r, &ref[0]) && r.cached == 64 && ts.hit_tokens[KVTIER_DISK] > 0,
           "disk hit: cached %lld, disk tokens %llu", (long long)r.cached,
           (unsigned long long)ts.hit_tokens[KVTIER_DISK]);
    /* written, or still queued: each record is fsynced, and on a loaded machine the
     * writer can be behind (the hits above then came from the queue); engine_destroy
     * waits for the queue */
    CHECKF(ts.t.disk_enabled && ts.t.stores[KVTIER_DISK] + (uint64_t)ts.t.disk_pending > 0,
           "disk stores %llu, pending %d", (unsigned long long)ts.t.stores[KVTIER_DISK],
           (int)ts.t.disk_pending);
    engine_destroy(e); /* device cache and host tier go to disk */

    /* restart: a new engine on the same directory serves every prompt
     * from disk, bitwise equal */
    e = mk(m, disk, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    int ok = 0;
    for (int i = 0; i < N_P; i++) {
        run_one(e, i, &r);
        ok += same(&r, &ref[i]) && r.cached == 64;
    }
    engine_get_tier_stats(e, &ts);
    CHECKF(ok == N_P && ts.hit_tokens[KVTIER_DISK] >= 64,
           "after restart: %d of %d identical with 64 cached, disk tokens %llu", ok, N_P,
           (unsigned long long)ts.hit_tokens[KVTIER_DISK]);
    CHECK(ts.t.skipped_corrupt == 0 && ts.t.skipped_foreign == 0);
    engine_destroy(e);

    /* every record's payload flipped: nothing served, answers unchanged */
    CHECK(flip_all(dir, record_bytes(m, DT_F32) - 7) > 0);
    e = mk(m, disk, 2048, 8);
    run_one(e, 1, &r);
    engine_get_tier_stats(e, &ts);
    CHECKF(same(&r, &ref[1]) && r.cached == 0 && ts.t.skipped_corrupt > 0,
           "corrupt: cached %lld, skipped %llu", (long long)r.cached,
           (unsigned long long)ts.t.skipped_corrupt);
    engine_destroy(e);

    /* another KV dtype is another fingerprint: the records are foreign */
    tier_opts other = disk;
    other.kv_dtype = DT_F16;
    e = mk(m, other, 2048, 8);
    CHECK(e != NULL);
    if (e) {
        run_one(e, 2, &r);
        engine_get_tier_stats(e, &ts);
        CHECKF(r.cached == 0 && ts.t.skipped_foreign > 0 && ts.hit_tokens[KVTIER_DISK] == 0,
               "foreign: cached %lld, skipped %llu", (long long)r.cached,
               (unsigned long long)ts.t.skipped_foreign);
        engine_destroy(e);
    }
    rm_dir(dir);

    /* configuration errors */
    engine_config c = engine_config_default();
    c.manual = 1;
    c.device_memory = 1ull << 30;
    c.kv_host_memory = 1ull << 20;
    c.prefix_cache = 0;
    kvant_err err = {0};
    CHECK(engine_create(m, &c, &err) == NULL && err.code == KV_EINVAL);
    c.prefix_cache = 1;
    c.kv_host_memory = 100; /* less than one record */
    CHECK(engine_create(m, &c, &err) == NULL && err.code == KV_EINVAL);
}

/* Memory pressure (a quarter of the pool the batch needs): sequences
 * preempted with their blocks swapped to host come back bitwise equal. */
static int count_records(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        n += de->d_name[0] != '.' && strstr(de->d_name, ".kvb") != NULL;
    if (d)
        closedir(d);
    return n;
}

/* Write-through: with a pool large enough that nothing is evicted, the
 * prompt's full blocks reach the disk while the engine runs (what a kill
 * would keep); a second engine on the directory serves them; with
 * kv_disk_evict_only nothing reaches the disk before the shutdown. */
static void test_write_through(model *m)
{
    char dir[] = "build/tests/engine-wt.XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    tier_opts o = {.blocks = 64, .dir = dir, .disk_records = 256, .policy = ENGINE_TIER_ALWAYS};
    engine *e = mk(m, o, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    result r;
    run_one(e, 2, &r);
    int n = 0;
    for (int i = 0; i < 200 && (n = count_records(dir)) < (P_LEN + GEN - 1) / 16; i++)
        usleep(10000); /* the writer thread renames in its own time */
    CHECKF(n == (P_LEN + GEN - 1) / 16, "%d records written through", n);
    engine_tier_stats ts;
    engine_get_tier_stats(e, &ts);
    CHECK(ts.write_through && ts.t.evictions[KVTIER_DISK] == 0 && ts.wt_missed == 0);
    engine_destroy(e);
    CHECK(count_records(dir) == n); /* the shutdown wrote no second copy */
    e = mk(m, o, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    run_one(e, 2, &r);
    engine_get_tier_stats(e, &ts);
    CHECKF(same(&r, &ref[2]) && r.cached == 64 && ts.hit_tokens[KVTIER_DISK] == 64,
           "cached %lld", (long long)r.cached);
    CHECK(ts.t.wt_dedup >= 4 && ts.t.wt_written == 0);
    engine_destroy(e);
    rm_dir(dir);
    CHECK(mkdtemp(strcpy(dir, "build/tests/engine-wt.XXXXXX")) != NULL);
    o.evict_only = 1;
    e = mk(m, o, 2048, 8);
    CHECK(e != NULL);
    if (!e)
        return;
    run_one(e, 2, &r);
    usleep(100000);
    engine_get_tier_stats(e, &ts);
    CHECK(count_records(dir) == 0 && !ts.write_through && ts.t.wt_queued == 0);
    engine_destroy(e); /* the shutdown takes the device cache down */
    CHECK(count_records(dir) >= 4);
    rm_dir(dir);
}

static void test_swap(model *m)
{
    static int32_t p[N_B][48];
    static result alone[N_B], got[N_B];
    int64_t np[N_B];
    tier_opts none = {0};
    engine *e = mk(m, none, 2048, 64);
    for (int i = 0; i < N_B; i++) {
        np[i] = 20 + (i * 7) % 28;
        for (int j = 0; j < np[i]; j++)
            p[i][j] = (i * 31 + j * 17 + 3) % 250;
    }
    engine_request q = {.n = 1, .top_logprobs = -1, .ignore_eos = 1, .max_tokens = B_GEN};
    q.sampling = sampler_params_default();
    q.sampling.temperature = 0.0f;
    for (int i = 0; i < N_B; i++) {
        memset(&alone[i], 0, sizeof alone[i]);
        q.prompt = p[i];
        q.n_prompt = np[i];
        CHECK(engine_submit(e, &q, on_event, &alone[i], NULL) > 0);
        for (int s = 0; s < 500 && !alone[i].done; s++)
            engine_run_step(e);
    }
    engine_destroy(e);
    tier_opts sw = {.blocks = 40, .host_records = 512, .policy = ENGINE_TIER_ALWAYS};
    e = mk(m, sw, 2048, 64);
    CHECK(e != NULL);
    if (!e)
        return;
    for (int i = 0; i < N_B; i++) {
        memset(&got[i], 0, sizeof got[i]);
        q.prompt = p[i];
        q.n_prompt = np[i];
        CHECK(engine_submit(e, &q, on_event, &got[i], NULL) > 0);
    }
    for (int s = 0; s < 20000; s++) {
        int all = 1;
        for (int i = 0; i < N_B; i++)
            all &= got[i].done;
        if (all)
            break;
        engine_run_step(e);
    }
    int ok = 0;
    for (int i = 0; i < N_B; i++)
        ok += same(&got[i], &alone[i]);
    engine_stats st;
    engine_tier_stats ts;
    engine_get_stats(e, &st);
    engine_get_tier_stats(e, &ts);
    fprintf(stderr, "  swap: %d/%d identical, %llu preemptions, %llu swaps, %llu recomputes, "
            "%llu tokens from host\n", ok, N_B, (unsigned long long)st.preemptions,
            (unsigned long long)ts.swaps, (unsigned long long)ts.recomputes,
            (unsigned long long)ts.hit_tokens[KVTIER_HOST]);
    CHECKF(ok == N_B, "%d of %d identical under swap preemption", ok, N_B);
    CHECK(st.preemptions > 0 && ts.swaps > 0 && ts.hit_tokens[KVTIER_HOST] > 0);
    check_no_leak(e);
    engine_destroy(e);
}

int main(void)
{
    char path[256];
    dtype_init();
    CHECK(tu_tmp_path(path, sizeof path, "engine-tier") == 0);
    CHECK(tiny_model_write(path, 42) == 0);
    kvant_err err = {0};
    model *m = model_load(path, &err);
    unlink(path); /* mapped */
    CHECKF(m != NULL, "model_load: %s", err.msg);
    if (!m)
        return tu_finish("test_engine_tier");
    make_prompts();
    test_host_and_disk(m);
    test_swap(m);
    test_write_through(m);
    model_free(m);
    return tu_finish("test_engine_tier");
}
