/* server_models.c - the model registry: footprints from headers, one shared
 * memory manager, on-demand loads with LRU eviction, pins, keep-alive,
 * sleep and wake (see server_models.h for the states and invariants).
 *
 * Locking: r->mu guards every entry field.  A life-cycle change marks its
 * entries (LOADING / UNLOADING) and r->changing under the lock, does the
 * slow work (model_load, engine_create, engine_destroy) without it, then
 * publishes the result and broadcasts r->cv.  Readers that touch an
 * engine under r->mu only do so for LOADED entries, which no change can
 * destroy without first taking the lock.  Order: r->mu, then engine or
 * memory-manager locks (never the reverse: no engine callback calls here).
 */
#include "server/server_models.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_select.h"
#include "format/gguf.h"
#include "mem/plan.h"

#define KEEPALIVE_TICK_S 0.25

const double srv_models_hist_le[SRV_MODELS_HIST_N - 1] = {0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                         5,    10,  30};

typedef struct mentry {
    char name[SRV_MODELS_NAME_MAX];
    char path[1024];
    srv_model_state state;
    int sleep_level;
    int pinned;
    int refs;
    double last_used;
    model *m;                  /* owned; kept while sleeping at level 1 */
    engine *e;                 /* owned while LOADED */
    srv_oai_ctx oai;           /* served_name -> name */
    int64_t ctx;               /* planned context */
    uint64_t need, kv_share;   /* planned bytes: the footprint and its KV part (minimum) */
    uint64_t block_bytes;      /* one KV block, all layers */
    uint64_t kv_max;           /* KV bytes for max_num_seqs requests of the context: the
                                * most a grown pool gets */
    uint64_t kv_extra;         /* fixed pools (no resize): KV granted beyond kv_share at this
                                * load (spare memory) */
    int32_t kv_blocks;         /* elastic pools: the engine's pool now (0 when not loaded) */
    int32_t kv_min_blocks, kv_max_blocks; /* ... its size at load, and the most it may grow to */
    int kv_draining;           /* a shrink stopped above its target: the pool drains */
    uint64_t kv_grows, kv_shrinks;        /* resizes of this model's pools */
    uint64_t resident[MEM_CAT_COUNT];
    engine_stats retired;      /* counters of this model's destroyed engines */
    uint64_t loads, load_failures, evictions, wakes, sleeps, unloads;
    srv_models_hist load_h, wake_h;
    char error[KV_ERR_MSG_MAX];
} mentry;

struct srv_models {
    srv_models_config cfg;
    mem_mgr *mem;
    uint64_t budget;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mentry *ent[SRV_MODELS_MAX];
    int n;
    int changing;              /* a life-cycle change (or KV resize) is running */
    int elastic;               /* KV pools follow the load (kv_grow and a backend that resizes) */
    int draining, stop;
    pthread_t ka_thread;
    int ka_started;
};

const char *srv_model_state_name(srv_model_state s)
{
    static const char *const n[SRV_MODEL_STATE_COUNT] = {"unloaded", "loading", "loaded",
                                                         "sleeping", "unloading", "failed"};
    return (unsigned)s < SRV_MODEL_STATE_COUNT ? n[s] : "?";
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

srv_models_config srv_models_config_default(void)
{
    return (srv_models_config){.ec = engine_config_default(),
                               .queue_timeout_s = SRV_MODELS_QUEUE_TIMEOUT_S,
                               .kv_grow = 1,
                               .log = 1};
}

static void hist_add(srv_models_hist *h, double v)
{
    int b = 0;
    while (b < SRV_MODELS_HIST_N - 1 && v > srv_models_hist_le[b])
        b++;
    h->bucket[b]++;
    h->sum += v;
    h->count++;
}

/* ---- the eviction policy ------------------------------------------------- */

int srv_models_pick(const srv_models_cand *c, int n, uint64_t need, uint64_t budget, uint64_t used,
                    int max_resident, int *victims, int *n_victims)
{
    *n_victims = 0;
    uint64_t pinned = 0;
    int n_loaded = 0, n_fixed = 0;
    for (int i = 0; i < n; i++) {
        if (!c[i].loaded)
            continue;
        n_loaded++;
        if (c[i].pinned) {
            pinned += c[i].bytes;
            n_fixed++;
        }
    }
    if (need > budget || pinned > budget - need || n_fixed >= max_resident)
        return SRV_FIT_NEVER;
    uint64_t avail = used < budget ? budget - used : 0;
    int slots = max_resident - n_loaded;
    /* oldest idle unpinned first, until the bytes and a slot are there */
    int taken[SRV_MODELS_MAX] = {0};
    while ((avail < need || slots < 1) && *n_victims < n && n <= SRV_MODELS_MAX) {
        int best = -1;
        for (int i = 0; i < n; i++)
            if (c[i].loaded && !c[i].busy && !c[i].pinned && !taken[i] &&
                (best < 0 || c[i].last_used < c[best].last_used))
                best = i;
        if (best < 0)
            break;
        taken[best] = 1;
        victims[(*n_victims)++] = best;
        avail += c[best].bytes;
        slots++;
    }
    if (avail >= need && slots >= 1)
        return SRV_FIT_OK;
    *n_victims = 0;
    return SRV_FIT_WAIT;
}

/* ---- registration ----------------------------------------------------------- */

srv_models *srv_models_create(const srv_models_config *cfg, kvant_err *err)
{
    backend_device_info dev;
    if (backend_query(cfg->ec.backend, cfg->ec.device, &dev, err))
        return NULL;
    srv_models *r = calloc(1, sizeof *r);
    if (!r) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    r->cfg.ec.kv_disk_dir = NULL; /* borrowed strings are not kept */
    uint64_t dm = cfg->ec.device_memory ? cfg->ec.device_memory : dev.total_memory;
    r->budget = cfg->budget ? cfg->budget : (uint64_t)((double)dm * cfg->ec.memory_utilization);
    r->elastic = cfg->kv_grow && (!cfg->ec.backend || !strcmp(cfg->ec.backend, "cpu"));
    r->mem = mem_create(r->budget, dev.alloc, err);
    if (!r->mem) {
        free(r);
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    return r;
}

static int find_locked(const srv_models *r, const char *name)
{
    if (!name || !name[0])
        return r->n ? 0 : -1;
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->ent[i]->name, name))
            return i;
    return -1;
}

int srv_models_find(srv_models *r, const char *name)
{
    pthread_mutex_lock(&r->mu);
    int i = find_locked(r, name);
    pthread_mutex_unlock(&r->mu);
    return i;
}

/* Footprint from the header alone: weights as stored + workspace + int8
 * activations + the KV share in whole blocks, as `kvant plan` computes. */
static int plan_entry(srv_models *r, mentry *x, kvant_err *err)
{
    gguf_ctx *g = gguf_open(x->path, err);
    model_hparams hp;
    if (!g)
        return err->code ? err->code : KV_EIO;
    if (model_hparams_from_gguf(g, &hp, err)) {
        gguf_close(g);
        return err->code ? err->code : KV_EFORMAT;
    }
    uint64_t wb = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++)
        wb += gguf_tensor(g, i)->nbytes;
    gguf_close(g);
    const engine_config *ec = &r->cfg.ec;
    plan_model pm = {hp.n_layers, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim,
                     hp.n_ff,     hp.n_vocab, hp.n_ctx_train, wb, hp.n_kv_total};
    plan_config pc = plan_config_default();
    pc.device_memory = PLAN_MAX_WEIGHTS; /* unbounded: only the shape matters here */
    pc.utilization = 1.0;
    pc.ctx = ec->max_model_len && ec->max_model_len < hp.n_ctx_train ? ec->max_model_len : 0;
    pc.block_size = ec->block_size;
    pc.max_num_seqs = ec->max_num_seqs;
    pc.max_num_batched_tokens = ec->max_num_batched_tokens;
    pc.kv_dtype = ec->kv_dtype;
    pc.act_q8 = (!ec->backend || strcmp(ec->backend, "cpu") == 0) && !ec->exact;
    plan_result p;
    int rc = plan_compute(&pm, &pc, &p, err);
    if (rc)
        return rc;
    uint64_t bb = p.kv_bytes_per_token * (uint64_t)ec->block_size;
    uint64_t blocks = r->cfg.kv_per_model
                          ? r->cfg.kv_per_model / bb
                          : (uint64_t)SRV_MODELS_DEFAULT_KV_REQS *
                                (((uint64_t)p.ctx + (uint64_t)ec->block_size - 1) /
                                 (uint64_t)ec->block_size);
    if (blocks * (uint64_t)ec->block_size < (uint64_t)p.ctx)
        return kvant_err_set(err, KV_ENOMEM,
                             "--kv-per-model holds %llu tokens, less than one request of the "
                             "context (%lld tokens, %llu bytes)",
                             (unsigned long long)(blocks * (uint64_t)ec->block_size),
                             (long long)p.ctx,
                             (unsigned long long)(p.kv_bytes_per_token * (uint64_t)p.ctx));
    x->ctx = p.ctx;
    x->kv_share = blocks * bb;
    x->block_bytes = bb;
    x->kv_max = (uint64_t)ec->max_num_seqs * (((uint64_t)p.ctx + (uint64_t)ec->block_size - 1) /
                                              (uint64_t)ec->block_size) * bb;
    x->need = p.weights_bytes + p.activation_bytes + p.act_q8_bytes + x->kv_share;
    return KV_OK;
}

static void name_from_path(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf"))
        out[n - 5] = '\0';
}

int srv_models_add(srv_models *r, const char *name, const char *path, kvant_err *err)
{
    char nm[SRV_MODELS_NAME_MAX];
    if (name)
        snprintf(nm, sizeof nm, "%s", name);
    else
        name_from_path(path, nm, sizeof nm);
    if (!nm[0] || strchr(nm, '/') || strlen(name ? name : nm) >= SRV_MODELS_NAME_MAX)
        return kvant_err_set(err, KV_EINVAL, "model name '%.200s' is empty, too long or has a '/'",
                             name ? name : path);
    pthread_mutex_lock(&r->mu);
    int dup = find_locked(r, nm) >= 0 && r->n > 0, full = r->n >= SRV_MODELS_MAX;
    pthread_mutex_unlock(&r->mu);
    if (dup)
        return kvant_err_set(err, KV_EINVAL, "two models are named '%s' (use -m NAME=PATH)", nm);
    if (full)
        return kvant_err_set(err, KV_ERANGE, "more than %d models", SRV_MODELS_MAX);
    mentry *x = calloc(1, sizeof *x);
    if (!x)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    snprintf(x->name, sizeof x->name, "%s", nm);
    snprintf(x->path, sizeof x->path, "%s", path);
    kvant_err pe = {0};
    if (plan_entry(r, x, &pe)) {
        x->state = SRV_MODEL_FAILED;
        snprintf(x->error, sizeof x->error, "%s", pe.msg);
        if (err)
            *err = pe;
    }
    x->oai.served_name = x->name;
    x->oai.max_model_len = x->ctx;
    pthread_mutex_lock(&r->mu);
    r->ent[r->n++] = x;
    pthread_mutex_unlock(&r->mu);
    return KV_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int srv_models_add_dir(srv_models *r, const char *dir, kvant_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return kvant_err_set(err, KV_EIO, "--models-dir %s: %s", dir, strerror(errno));
    char *names[SRV_MODELS_MAX + 1];
    int n = 0, rc = KV_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (de->d_name[0] == '.' || L <= 5 || strcmp(de->d_name + L - 5, ".gguf"))
            continue;
        if (n == SRV_MODELS_MAX) {
            rc = kvant_err_set(err, KV_ERANGE, "--models-dir %s: more than %d models", dir,
                               SRV_MODELS_MAX);
            break;
        }
        if (!(names[n] = strdup(de->d_name))) {
            rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    for (int i = 0; i < n; i++) {
        char path[1024];
        kvant_err e2 = {0};
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (rc == KV_OK) {
            int rc2 = srv_models_add(r, NULL, path, &e2);
            if (rc2) {
                rc = rc2;
                if (err)
                    *err = e2;
            } else if (e2.code && r->cfg.log) {
                fprintf(stderr, "kvant serve: model %s is failed: %s\n", path, e2.msg);
            }
        }
        free(names[i]);
    }
    return rc;
}

/* ---- life cycle (the slow parts run without r->mu) ------------------------- */

static void log_line(const srv_models *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void log_line(const srv_models *r, const char *fmt, ...)
{
    if (!r->cfg.log)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("kvant serve: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* Adds s's counters (and, with gauges, its gauges) to t. */
static void add_stats(engine_stats *t, const engine_stats *s, int gauges)
{
    t->finished_stop += s->finished_stop;
    t->finished_length += s->finished_length;
    t->finished_abort += s->finished_abort;
    t->prompt_tokens += s->prompt_tokens;
    t->prompt_tokens_computed += s->prompt_tokens_computed;
    t->generation_tokens += s->generation_tokens;
    t->preemptions += s->preemptions;
    t->prefix_queries += s->prefix_queries;
    t->prefix_hits += s->prefix_hits;
    t->steps += s->steps;
    if (!gauges)
        return;
    t->running += s->running;
    t->waiting += s->waiting;
    t->preempted_waiting += s->preempted_waiting;
    t->kv_blocks_total += s->kv_blocks_total;
    t->kv_blocks_used += s->kv_blocks_used;
    t->kv_blocks_free += s->kv_blocks_free;
    t->kv_blocks_cached += s->kv_blocks_cached;
    t->kv_tokens_stored += s->kv_tokens_stored;
    t->kv_token_capacity += s->kv_token_capacity;
    t->last_tokens += s->last_tokens;
    t->last_seqs += s->last_seqs;
    t->last_decodes += s->last_decodes;
    if (!t->block_size)
        t->block_size = s->block_size;
}

/* Drops x's engine (and its model unless keep_model), leaving the
 * engine's final counters in *fin (zeroed when there was none) for the
 * caller to add to x->retired under r->mu.  Called without r->mu for an
 * entry marked UNLOADING or LOADING (nobody else touches it), or under it
 * when x has no engine. */
static void drop_entry(mentry *x, int keep_model, engine_stats *fin)
{
    memset(fin, 0, sizeof *fin);
    if (x->e) {
        engine_get_stats(x->e, fin);
        engine_destroy(x->e);
        x->e = NULL;
    }
    x->kv_blocks = 0;
    x->kv_draining = 0;
    if (!keep_model) {
        model_free(x->m);
        x->m = NULL;
        x->oai.m = NULL;
    }
}

/* Loads (or wakes) x; without r->mu, x marked LOADING.  Fills resident[]
 * from the shared manager's change (the only change running). */
static int raise_entry(srv_models *r, mentry *x, kvant_err *err)
{
    mem_report *before = malloc(sizeof *before), *after = malloc(sizeof *after);
    int rc = KV_OK;
    if (!before || !after) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory");
        goto out;
    }
    mem_get_report(r->mem, before);
    if (!x->m) {
        x->m = model_load(x->path, err);
        if (!x->m) {
            rc = err->code ? err->code : KV_EIO;
            goto out;
        }
        x->oai.m = x->m;
        x->oai.max_piece_bytes = srv_oai_max_piece_bytes(x->m);
    }
    engine_config ec = r->cfg.ec;
    ec.shared_mem = r->mem;
    ec.print_plan = 0;
    ec.device_memory = x->need + x->kv_extra; /* the planner gives this engine exactly that */
    ec.memory_utilization = 1.0;
    ec.max_model_len = x->ctx;
    ec.kv_max_blocks = r->elastic ? (int32_t)(x->kv_max / x->block_bytes) : 0;
    x->e = engine_create(x->m, &ec, err);
    if (!x->e) {
        rc = err->code ? err->code : KV_ENOMEM;
        goto out;
    }
    engine_stats st;
    engine_get_stats(x->e, &st);
    x->kv_blocks = x->kv_min_blocks = st.kv_blocks_min;
    x->kv_max_blocks = st.kv_blocks_max;
    mem_get_report(r->mem, after);
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        x->resident[c] = after->cat[c].current - before->cat[c].current;
out:
    free(before);
    free(after);
    return rc;
}

static uint64_t resident_sum(const mentry *x)
{
    uint64_t t = 0;
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        t += x->resident[c];
    return t;
}

static void fmt_size(uint64_t b, char *buf)
{
    mem_format_size(b, buf, 32);
}

/* Waits on r->cv until deadline; 0 on timeout. */
static int wait_until(srv_models *r, double deadline)
{
    double left = deadline - now_s();
    if (left <= 0)
        return 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    double t = ts.tv_sec + ts.tv_nsec * 1e-9 + (left < 0.5 ? left : 0.5);
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    return 1;
}

/* KV bytes an elastic pool holds beyond its size at load. */
static uint64_t kv_grown_bytes(const mentry *x)
{
    return x->kv_blocks > x->kv_min_blocks
               ? (uint64_t)(x->kv_blocks - x->kv_min_blocks) * x->block_bytes
               : 0;
}

/* Chooses victims for x under r->mu; SRV_FIT_* as srv_models_pick. */
static int choose_victims(srv_models *r, int xi, int *victims, int *nv)
{
    srv_models_cand c[SRV_MODELS_MAX];
    for (int i = 0; i < r->n; i++) {
        const mentry *y = r->ent[i];
        c[i] = (srv_models_cand){resident_sum(y), y->last_used, y->state == SRV_MODEL_LOADED,
                                 y->refs > 0, y->pinned};
        if (y->pinned) /* a grown pool can shrink back: only its share is fixed */
            c[i].bytes -= kv_grown_bytes(y);
        if (i == xi)
            c[i].loaded = 0;
    }
    return srv_models_pick(c, r->n, r->ent[xi]->need, r->budget, mem_used(r->mem),
                           SRV_MODELS_MAX_RESIDENT, victims, nv);
}

/* Publishes the end of a load or wake of x (under r->mu). */
static void finish_load_locked(srv_models *r, mentry *x, srv_model_state from, int from_level,
                               double dt)
{
    char a[32], b[32], c[32];
    x->state = SRV_MODEL_LOADED;
    x->error[0] = '\0';
    x->last_used = now_s();
    fmt_size(resident_sum(x), a);
    fmt_size(mem_used(r->mem), b);
    fmt_size(r->budget, c);
    if (from == SRV_MODEL_SLEEPING) {
        x->wakes++;
        hist_add(&x->wake_h, dt);
        log_line(r, "woke %s from sleep level %d in %.3f s: %s resident, %s of %s used", x->name,
                 from_level, dt, a, b, c);
    } else {
        x->loads++;
        hist_add(&x->load_h, dt);
        log_line(r, "loaded %s in %.3f s: %s resident (KV %s), %s of %s used", x->name, dt, a,
                 x->kv_extra ? "grown into spare memory" : "its share", b, c);
    }
    x->sleep_level = 0;
}

/* KV that entry xi may take beyond its share at this load: an equal part
 * of the memory no model could need (free bytes less the footprints of
 * every model not loaded that could fit, xi included), in whole blocks, up
 * to kv_max.
 * Memory a model may still need is never granted, so a grown pool never
 * has to be taken back: when the budget is tight this is 0. */
static uint64_t spare_kv_locked(srv_models *r, int xi)
{
    const mentry *x = r->ent[xi];
    uint64_t avail = mem_available(r->mem), reserve = 0;
    uint64_t k = 0;
    if (!r->cfg.kv_grow || !x->block_bytes)
        return 0;
    for (int i = 0; i < r->n; i++) {
        const mentry *y = r->ent[i];
        if (y->state != SRV_MODEL_LOADED && y->state != SRV_MODEL_FAILED &&
            y->need <= r->budget) { /* one that can never fit needs nothing */
            reserve += y->need;
            k++;
        }
    }
    if (avail <= reserve || !k)
        return 0;
    uint64_t extra = (avail - reserve) / k;
    uint64_t room = x->kv_max > x->kv_share ? x->kv_max - x->kv_share : 0;
    extra = extra < room ? extra : room;
    return extra / x->block_bytes * x->block_bytes;
}

/* ---- KV memory that follows the load (elastic pools) ----------------------------
 * Called under r->mu with r->changing set by the caller (so no load runs
 * and the manager's free bytes only move with these resizes); the engine
 * round trips run with the lock dropped.  Entries touched stay LOADED:
 * every other life-cycle change waits for `changing`. */

typedef struct kv_move {
    int idx;
    int32_t want, from, got;
} kv_move;

/* Resizes the entries of mv[0..n) (lock dropped) and publishes the new
 * sizes and KV bytes; logs each change with why. */
static void kv_apply_locked(srv_models *r, kv_move *mv, int n, const char *why)
{
    engine *es[SRV_MODELS_MAX];
    for (int k = 0; k < n; k++)
        es[k] = r->ent[mv[k].idx]->e;
    pthread_mutex_unlock(&r->mu);
    for (int k = 0; k < n; k++) {
        kvant_err e2 = {0};
        if (engine_kv_resize(es[k], mv[k].want, SRV_MODELS_KV_RESIZE_TIMEOUT_S, &mv[k].got,
                             &e2) != KV_OK) {
            mv[k].got = mv[k].from; /* refused (over budget, a step too long): unchanged */
            log_line(r, "kv: %s not resized: %s", r->ent[mv[k].idx]->name, e2.msg);
        }
    }
    pthread_mutex_lock(&r->mu);
    for (int k = 0; k < n; k++) {
        mentry *x = r->ent[mv[k].idx];
        const int32_t d = mv[k].got - mv[k].from;
        if (mv[k].want >= mv[k].from && mv[k].got == mv[k].want)
            x->kv_draining = 0; /* a resize to at least its size ended any drain */
        else if (mv[k].want < mv[k].from && mv[k].got > mv[k].want)
            x->kv_draining = 1;
        if (!d)
            continue;
        x->kv_blocks = mv[k].got;
        x->resident[MEM_KV] += (uint64_t)(int64_t)d * x->block_bytes; /* wraps back on shrink */
        if (d > 0)
            x->kv_grows++;
        else
            x->kv_shrinks++;
        char a[32], b[32];
        fmt_size((uint64_t)(d > 0 ? d : -d) * x->block_bytes, a);
        fmt_size(mem_available(r->mem), b);
        log_line(r, "kv: %s %s %d -> %d blocks (%c%s) %s; %s free", x->name,
                 d > 0 ? "grows" : "shrinks", mv[k].from, mv[k].got, d > 0 ? '+' : '-', a, why,
                 b);
    }
}

/* Grows every loaded elastic pool into the free budget: an equal part
 * each, in whole blocks, up to its maximum.  A draining pool with nothing
 * to gain is still resized to its own size, which ends the drain an
 * earlier reclaim left in it. */
static void kv_grow_locked(srv_models *r, const char *why)
{
    kv_move mv[SRV_MODELS_MAX];
    int n = 0, k_room = 0;
    if (!r->elastic || r->stop)
        return;
    for (int i = 0; i < r->n; i++) {
        const mentry *x = r->ent[i];
        if (x->state == SRV_MODEL_LOADED && x->kv_blocks > 0)
            k_room += x->kv_blocks < x->kv_max_blocks;
    }
    const uint64_t part = k_room ? mem_available(r->mem) / (uint64_t)k_room : 0;
    for (int i = 0; i < r->n; i++) {
        const mentry *x = r->ent[i];
        if (x->state != SRV_MODEL_LOADED || x->kv_blocks <= 0)
            continue;
        uint64_t add = part / x->block_bytes, room = (uint64_t)(x->kv_max_blocks - x->kv_blocks);
        add = add < room ? add : room;
        if (add || x->kv_draining)
            mv[n++] = (kv_move){i, x->kv_blocks + (int32_t)add, x->kv_blocks, x->kv_blocks};
    }
    kv_apply_locked(r, mv, n, why);
}

/* Shrinks grown pools (idle models first, then least recently used)
 * until deficit bytes are free or none can give more; a pool whose tail
 * is held gives what it can now and drains the rest (its holders finish,
 * the next attempt takes it).  Returns the bytes given back. */
static uint64_t kv_reclaim_locked(srv_models *r, int xi, uint64_t deficit, const char *why)
{
    kv_move mv[SRV_MODELS_MAX];
    int n = 0;
    uint64_t planned = 0, freed = 0;
    while (planned < deficit) {
        int best = -1;
        for (int i = 0; i < r->n; i++) {
            const mentry *y = r->ent[i];
            int taken = 0;
            for (int k = 0; k < n; k++)
                taken |= mv[k].idx == i;
            if (i == xi || taken || y->state != SRV_MODEL_LOADED || !kv_grown_bytes(y))
                continue;
            const mentry *b = best >= 0 ? r->ent[best] : NULL;
            if (!b || (y->refs > 0) < (b->refs > 0) ||
                ((y->refs > 0) == (b->refs > 0) && y->last_used < b->last_used))
                best = i;
        }
        if (best < 0)
            break;
        const mentry *y = r->ent[best];
        const uint64_t left = deficit - planned;
        int64_t cut = (int64_t)((left + y->block_bytes - 1) / y->block_bytes);
        const int64_t grown = y->kv_blocks - y->kv_min_blocks;
        cut = cut < grown ? cut : grown;
        mv[n++] = (kv_move){best, y->kv_blocks - (int32_t)cut, y->kv_blocks, y->kv_blocks};
        planned += (uint64_t)cut * y->block_bytes;
    }
    kv_apply_locked(r, mv, n, why);
    for (int k = 0; k < n; k++)
        freed += (uint64_t)(mv[k].from - mv[k].got) * r->ent[mv[k].idx]->block_bytes;
    return freed;
}

/* Evicts the victims and loads x: called under r->mu with the victims
 * chosen; drops the lock for the slow part and retakes it. */
static int load_locked(srv_models *r, int xi, const int *victims, int nv, kvant_err *err)
{
    mentry *x = r->ent[xi];
    char a[32], b[32], c[32];
    r->changing = 1;
    srv_model_state from = x->state;
    int from_level = x->sleep_level;
    x->kv_extra = nv || r->elastic ? 0 : spare_kv_locked(r, xi);
    x->state = SRV_MODEL_LOADING;
    double t = now_s();
    for (int k = 0; k < nv; k++) {
        mentry *v = r->ent[victims[k]];
        fmt_size(x->need, a);
        fmt_size(mem_available(r->mem), b);
        fmt_size(r->budget, c);
        log_line(r, "evicting %s (LRU, idle %.0f s) to load %s: needs %s, %s free of %s", v->name,
                 t - v->last_used, x->name, a, b, c);
        v->state = SRV_MODEL_UNLOADING;
    }
    pthread_mutex_unlock(&r->mu);
    engine_stats fin[SRV_MODELS_MAX];
    for (int k = 0; k < nv; k++)
        drop_entry(r->ent[victims[k]], 0, &fin[k]);
    kvant_err le = {0};
    int rc = raise_entry(r, x, &le);
    double dt = now_s() - t;
    pthread_mutex_lock(&r->mu);
    for (int k = 0; k < nv; k++) {
        mentry *v = r->ent[victims[k]];
        add_stats(&v->retired, &fin[k], 0);
        memset(v->resident, 0, sizeof v->resident);
        v->state = SRV_MODEL_UNLOADED;
        v->evictions++;
    }
    if (rc == KV_OK) {
        finish_load_locked(r, x, from, from_level, dt);
        char why[SRV_MODELS_NAME_MAX + 48];
        snprintf(why, sizeof why, "into free memory after loading %s", x->name);
        kv_grow_locked(r, why);
        r->changing = 0;
        pthread_cond_broadcast(&r->cv);
        return KV_OK;
    }
    drop_entry(x, 0, &fin[0]); /* under the lock: x has no engine (the load failed) */
    memset(x->resident, 0, sizeof x->resident);
    x->load_failures++;
    int bad_file = rc == KV_EFORMAT || rc == KV_EIO || rc == KV_EUNSUP;
    x->state = bad_file || from == SRV_MODEL_FAILED ? SRV_MODEL_FAILED : SRV_MODEL_UNLOADED;
    x->sleep_level = 0;
    snprintf(x->error, sizeof x->error, "%s", le.msg);
    log_line(r, "loading %s failed: %s", x->name, le.msg);
    kv_grow_locked(r, "into free memory after a failed load");
    r->changing = 0;
    pthread_cond_broadcast(&r->cv);
    if (err)
        *err = le;
    return rc;
}

/* Brings entry xi to LOADED under r->mu: waits (until deadline) while
 * another change runs or busy models hold the memory it needs, refuses at
 * once what can never fit.  KV_OK with x LOADED, or an error (x back to
 * unloaded, or FAILED when its file is bad). */
static int bring_up_locked(srv_models *r, int xi, double deadline, kvant_err *err)
{
    mentry *x = r->ent[xi];
    char a[32], b[32];
    int reclaimed = 0, shrank = 0; /* a reclaim since the last wait; any in this call */
    for (;;) {
        if (x->state == SRV_MODEL_LOADED)
            return KV_OK;
        if (r->draining || r->stop)
            return kvant_err_set(err, KV_EBUSY, "the server is draining");
        int victims[SRV_MODELS_MAX], nv = 0;
        int fit = r->changing ? SRV_FIT_WAIT : choose_victims(r, xi, victims, &nv);
        const uint64_t avail = mem_available(r->mem);
        if (fit != SRV_FIT_NEVER && (fit == SRV_FIT_WAIT || nv > 0) && !r->changing &&
            !reclaimed && r->elastic && x->need > avail) {
            /* grown KV pools give memory back before any model is evicted */
            char why[SRV_MODELS_NAME_MAX + 24];
            snprintf(why, sizeof why, "to load %s", x->name);
            reclaimed = 1;
            r->changing = 1;
            shrank |= kv_reclaim_locked(r, xi, x->need - avail, why) > 0;
            r->changing = 0;
            pthread_cond_broadcast(&r->cv);
            continue;
        }
        if (fit == SRV_FIT_OK)
            return load_locked(r, xi, victims, nv, err);
        if (fit == SRV_FIT_NEVER) {
            fmt_size(x->need, a);
            fmt_size(r->budget, b);
            return kvant_err_set(err, KV_ENOMEM,
                                 "model '%s' needs %llu bytes (%s): it cannot fit in the budget "
                                 "of %llu bytes (%s)%s", x->name, (unsigned long long)x->need, a,
                                 (unsigned long long)r->budget, b,
                                 x->need > r->budget ? "" : " next to the pinned models");
        }
        if (!wait_until(r, deadline)) {
            if (shrank && !r->changing) { /* give the reclaimed memory back */
                r->changing = 1;
                kv_grow_locked(r, "into free memory after a load timed out");
                r->changing = 0;
                pthread_cond_broadcast(&r->cv);
            }
            return kvant_err_set(err, KV_EBUSY,
                                 "timed out after %.1f s waiting for %s to free memory for model "
                                 "'%s'", r->cfg.queue_timeout_s,
                                 r->changing ? "another load" : "busy models", x->name);
        }
        reclaimed = 0;
    }
}

static int check_name(srv_models *r, const char *name, kvant_err *err)
{
    int i = find_locked(r, name);
    if (i < 0)
        kvant_err_set(err, KV_EINVAL, "the model '%.200s' does not exist", name ? name : "");
    return i;
}

static void fill_ref(srv_models *r, int i, srv_model_ref *out)
{
    mentry *x = r->ent[i];
    x->refs++;
    x->last_used = now_s();
    *out = (srv_model_ref){x->m, x->e, &x->oai, i};
}

int srv_models_acquire(srv_models *r, const char *name, srv_model_ref *out, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0 && r->ent[i]->state == SRV_MODEL_FAILED) {
        rc = kvant_err_set(err, KV_EFORMAT, "the model '%s' failed to load: %s", r->ent[i]->name,
                           r->ent[i]->error);
    } else if (i >= 0) {
        rc = bring_up_locked(r, i, now_s() + r->cfg.queue_timeout_s, err);
        if (rc == KV_OK)
            fill_ref(r, i, out);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int srv_models_peek(srv_models *r, const char *name, srv_model_ref *out, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0) {
        rc = r->ent[i]->state == SRV_MODEL_LOADED
                 ? KV_OK
                 : kvant_err_set(err, KV_EBUSY, "the model '%s' is %s", r->ent[i]->name,
                                 srv_model_state_name(r->ent[i]->state));
        if (rc == KV_OK)
            fill_ref(r, i, out);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void srv_models_release(srv_models *r, srv_model_ref *ref)
{
    if (!ref || !ref->e)
        return;
    pthread_mutex_lock(&r->mu);
    mentry *x = r->ent[ref->idx];
    KV_ASSERT(x->refs > 0);
    x->refs--;
    x->last_used = now_s();
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    ref->e = NULL;
}

int srv_models_load(srv_models *r, const char *name, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0 && r->ent[i]->state == SRV_MODEL_FAILED) {
        /* a retry: the file may have been fixed */
        kvant_err pe = {0};
        mentry *x = r->ent[i];
        rc = plan_entry(r, x, &pe);
        if (rc) {
            snprintf(x->error, sizeof x->error, "%s", pe.msg);
            if (err)
                *err = pe;
        } else {
            x->oai.max_model_len = x->ctx;
        }
    }
    if (i >= 0 && (r->ent[i]->state != SRV_MODEL_FAILED || rc == KV_OK))
        rc = bring_up_locked(r, i, now_s() + r->cfg.queue_timeout_s, err);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int srv_models_wake(srv_models *r, const char *name, kvant_err *err)
{
    return srv_models_load(r, name, err);
}

/* Sleep (level 1 or 2) or unload (level 0) of an idle model. */
static int lower(srv_models *r, const char *name, int level, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = check_name(r, name, err), rc = KV_EINVAL;
    double deadline = now_s() + r->cfg.queue_timeout_s;
    while (i >= 0 && r->changing && wait_until(r, deadline))
        ;
    mentry *x = i >= 0 ? r->ent[i] : NULL;
    if (!x)
        goto out;
    if (r->changing) {
        rc = kvant_err_set(err, KV_EBUSY, "timed out waiting for another load or unload");
        goto out;
    }
    if (x->refs > 0) {
        rc = kvant_err_set(err, KV_EBUSY, "the model '%s' has %d request(s) in flight", x->name,
                           x->refs);
        goto out;
    }
    int loaded = x->state == SRV_MODEL_LOADED, asleep = x->state == SRV_MODEL_SLEEPING;
    if (level > 0 && !loaded && !(asleep && level > x->sleep_level)) {
        rc = asleep ? KV_OK
                    : kvant_err_set(err, KV_EBUSY, "the model '%s' is %s, not loaded", x->name,
                                    srv_model_state_name(x->state));
        goto out;
    }
    if (level == 0 && !loaded && !asleep) {
        rc = KV_OK; /* already unloaded (or failed): nothing to do */
        goto out;
    }
    r->changing = 1;
    x->state = SRV_MODEL_UNLOADING;
    pthread_mutex_unlock(&r->mu);
    engine_stats fin;
    drop_entry(x, level == 1, &fin);
    pthread_mutex_lock(&r->mu);
    add_stats(&x->retired, &fin, 0);
    memset(x->resident, 0, sizeof x->resident);
    if (level > 0) {
        x->state = SRV_MODEL_SLEEPING;
        x->sleep_level = level;
        x->sleeps++;
        log_line(r, "%s is asleep (level %d: %s)", x->name, level,
                 level == 1 ? "KV and engine dropped, weights mapped"
                            : "weights, KV and engine dropped");
    } else {
        x->state = SRV_MODEL_UNLOADED;
        x->sleep_level = 0;
        x->unloads++;
        log_line(r, "unloaded %s", x->name);
    }
    char why[SRV_MODELS_NAME_MAX + 48];
    snprintf(why, sizeof why, "into free memory after %s %s", level ? "sleeping" : "unloading",
             x->name);
    kv_grow_locked(r, why);
    r->changing = 0;
    pthread_cond_broadcast(&r->cv);
    rc = KV_OK;
out:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int srv_models_unload(srv_models *r, const char *name, kvant_err *err)
{
    return lower(r, name, 0, err);
}

int srv_models_sleep(srv_models *r, const char *name, int level, kvant_err *err)
{
    if (level != 1 && level != 2)
        return kvant_err_set(err, KV_EINVAL, "level must be 1 or 2, not %d", level);
    return lower(r, name, level, err);
}

int srv_models_pin(srv_models *r, const char *name, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = check_name(r, name, err);
    if (i >= 0)
        r->ent[i]->pinned = 1;
    pthread_mutex_unlock(&r->mu);
    return i < 0 ? KV_EINVAL : srv_models_load(r, name, err);
}

/* ---- keep-alive ---------------------------------------------------------------- */

static void *keepalive_main(void *arg)
{
    srv_models *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        double t = now_s();
        char victim[SRV_MODELS_NAME_MAX] = "";
        double idle = 0;
        for (int i = 0; i < r->n && !r->changing && !r->draining; i++) {
            mentry *x = r->ent[i];
            if ((x->state == SRV_MODEL_LOADED || x->state == SRV_MODEL_SLEEPING) && !x->refs &&
                !x->pinned && t - x->last_used > r->cfg.keep_alive_s) {
                snprintf(victim, sizeof victim, "%s", x->name);
                idle = t - x->last_used;
                break;
            }
        }
        if (victim[0]) {
            log_line(r, "keep-alive: %s idle %.1f s (limit %.1f s)", victim, idle,
                     r->cfg.keep_alive_s);
            pthread_mutex_unlock(&r->mu);
            srv_models_unload(r, victim, NULL);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        wait_until(r, now_s() + KEEPALIVE_TICK_S);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int srv_models_start(srv_models *r, kvant_err *err)
{
    if (r->cfg.keep_alive_s <= 0)
        return KV_OK;
    if (pthread_create(&r->ka_thread, NULL, keepalive_main, r))
        return kvant_err_set(err, KV_ENOMEM, "cannot start the keep-alive thread");
    r->ka_started = 1;
    return KV_OK;
}

void srv_models_drain(srv_models *r)
{
    pthread_mutex_lock(&r->mu);
    r->draining = 1;
    for (int i = 0; i < r->n; i++)
        if (r->ent[i]->state == SRV_MODEL_LOADED)
            engine_drain(r->ent[i]->e);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void srv_models_destroy(srv_models *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = 1;
    pthread_cond_broadcast(&r->cv);
    while (r->changing)
        pthread_cond_wait(&r->cv, &r->mu);
    pthread_mutex_unlock(&r->mu);
    if (r->ka_started)
        pthread_join(r->ka_thread, NULL);
    for (int i = 0; i < r->n; i++) {
        engine_stats fin;
        drop_entry(r->ent[i], 0, &fin);
        free(r->ent[i]);
    }
    mem_destroy(r->mem);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

/* ---- views ------------------------------------------------------------------------ */

int srv_models_count(srv_models *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

mem_mgr *srv_models_mem(srv_models *r)
{
    return r->mem;
}

int srv_models_info(srv_models *r, int i, srv_model_info *o)
{
    pthread_mutex_lock(&r->mu);
    if (i < 0 || i >= r->n) {
        pthread_mutex_unlock(&r->mu);
        return KV_ERANGE;
    }
    const mentry *x = r->ent[i];
    memset(o, 0, sizeof *o);
    snprintf(o->name, sizeof o->name, "%s", x->name);
    snprintf(o->path, sizeof o->path, "%s", x->path);
    snprintf(o->error, sizeof o->error, "%s", x->error);
    o->state = x->state;
    o->sleep_level = x->state == SRV_MODEL_SLEEPING ? x->sleep_level : 0;
    o->pinned = x->pinned;
    o->refs = x->refs;
    o->idle_s = x->refs || !x->last_used ? 0 : now_s() - x->last_used;
    o->max_model_len = x->ctx;
    o->need_bytes = x->need;
    o->kv_share_bytes = x->kv_share;
    o->kv_extra_bytes = x->state != SRV_MODEL_LOADED ? 0 : r->elastic ? kv_grown_bytes(x) : x->kv_extra;
    o->kv_blocks_min = x->state == SRV_MODEL_LOADED ? x->kv_min_blocks : 0;
    o->kv_blocks_max = x->state == SRV_MODEL_LOADED ? x->kv_max_blocks : 0;
    o->kv_grows = x->kv_grows;
    o->kv_shrinks = x->kv_shrinks;
    memcpy(o->resident, x->resident, sizeof o->resident);
    o->resident_bytes = resident_sum(x);
    if (x->state == SRV_MODEL_LOADED) {
        engine_stats s;
        engine_get_stats(x->e, &s);
        o->kv_blocks_total = s.kv_blocks_total;
        o->kv_blocks_used = s.kv_blocks_used;
        o->kv_pool_bytes = (uint64_t)s.kv_blocks_total * engine_kv_block_bytes(x->e);
    }
    o->loads = x->loads;
    o->load_failures = x->load_failures;
    o->evictions = x->evictions;
    o->wakes = x->wakes;
    o->sleeps = x->sleeps;
    o->unloads = x->unloads;
    o->load_h = x->load_h;
    o->wake_h = x->wake_h;
    pthread_mutex_unlock(&r->mu);
    return KV_OK;
}

void srv_models_stats(srv_models *r, engine_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const mentry *x = r->ent[i];
        add_stats(out, &x->retired, 0);
        if (x->state == SRV_MODEL_LOADED) {
            engine_stats s;
            engine_get_stats(x->e, &s);
            add_stats(out, &s, 1);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

void srv_models_health(srv_models *r, engine_health *out)
{
    memset(out, 0, sizeof *out);
    out->thread_alive = 1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        if (r->ent[i]->state != SRV_MODEL_LOADED)
            continue;
        engine_health h;
        engine_get_health(r->ent[i]->e, &h);
        out->thread_alive &= h.thread_alive;
        out->busy |= h.busy;
        out->in_flight += h.in_flight;
        out->steps += h.steps;
        if (h.stalled_s > out->stalled_s)
            out->stalled_s = h.stalled_s;
    }
    pthread_mutex_unlock(&r->mu);
}
