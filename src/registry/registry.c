/* registry.c - the model registry: footprints from headers, one shared
 * memory manager, on-demand loads with LRU eviction, pins, keep-alive,
 * sleep and wake (see registry/registry.h for the states and invariants).
 *
 * Locking: r->mu guards every entry field.  A life-cycle change marks its
 * entries (LOADING / UNLOADING) and r->changing under the lock, does the
 * slow work (model_load, engine_create, engine_destroy) without it, then
 * publishes the result and broadcasts r->cv.  Readers that touch an
 * engine under r->mu only do so for LOADED entries, which no change can
 * destroy without first taking the lock.  Order: r->mu, then engine or
 * memory-manager locks (never the reverse: no engine callback calls here).
 */
#include "registry/registry.h"
#include "registry/registry_internal.h"
#include "registry/registry_plan.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend_select.h"
#include "text/tokenizer.h"


const double reg_hist_le[REG_HIST_N - 1] = {0.05, 0.1, 0.25, 0.5, 1, 2.5,
                                                         5,    10,  30};

const char *reg_state_name(reg_state s)
{
    static const char *const n[REG_STATE_COUNT] = {"unloaded", "loading", "loaded",
                                                         "sleeping", "unloading", "failed"};
    return (unsigned)s < REG_STATE_COUNT ? n[s] : "?";
}

double reg_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

reg_config reg_config_default(void)
{
    return (reg_config){.ec = engine_config_default(),
                               .queue_timeout_s = REG_QUEUE_TIMEOUT_S,
                               .kv_grow = 1,
                               .log = 1};
}

static void hist_add(reg_hist *h, double v)
{
    int b = 0;
    while (b < REG_HIST_N - 1 && v > reg_hist_le[b])
        b++;
    h->bucket[b]++;
    h->sum += v;
    h->count++;
}

/* ---- registration ----------------------------------------------------------- */

registry *reg_create(const reg_config *cfg, kvant_err *err)
{
    backend_device_info dev;
    if (backend_query(cfg->ec.backend, cfg->ec.device, &dev, err))
        return NULL;
    registry *r = calloc(1, sizeof *r);
    if (!r) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    r->cfg = *cfg;
    r->cfg.ec.kv_disk_dir = NULL; /* borrowed strings are not kept */
    r->budget = reg_plan_budget(cfg->budget, cfg->ec.device_memory, dev.total_memory,
                                cfg->ec.memory_utilization);
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

static int find_locked(const registry *r, const char *name)
{
    if (!name || !name[0])
        return r->n ? 0 : -1;
    for (int i = 0; i < r->n; i++)
        if (!strcmp(r->ent[i]->name, name))
            return i;
    return -1;
}

int reg_find(registry *r, const char *name)
{
    pthread_mutex_lock(&r->mu);
    int i = find_locked(r, name);
    pthread_mutex_unlock(&r->mu);
    return i;
}

/* Footprint from the header alone (registry_plan.h), as `kvant plan`
 * computes it. */
static int plan_entry(registry *r, mentry *x, kvant_err *err)
{
    reg_footprint f;
    int rc = reg_plan_footprint(x->path, &r->cfg.ec, r->cfg.kv_per_model, &f, err);
    if (rc)
        return rc;
    x->ctx = f.ctx;
    x->kv_share = f.kv_share;
    x->block_bytes = f.block_bytes;
    x->kv_max = f.kv_max;
    x->need = f.need;
    return KV_OK;
}

void reg_name_from_path(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf"))
        out[n - 5] = '\0';
}

int reg_add(registry *r, const char *name, const char *path, kvant_err *err)
{
    char nm[REG_NAME_MAX];
    if (name)
        snprintf(nm, sizeof nm, "%s", name);
    else
        reg_name_from_path(path, nm, sizeof nm);
    if (!nm[0] || strchr(nm, '/') || strlen(name ? name : nm) >= REG_NAME_MAX)
        return kvant_err_set(err, KV_EINVAL, "model name '%.200s' is empty, too long or has a '/'",
                             name ? name : path);
    pthread_mutex_lock(&r->mu);
    int dup = find_locked(r, nm) >= 0 && r->n > 0, full = r->n >= REG_MAX;
    pthread_mutex_unlock(&r->mu);
    if (dup)
        return kvant_err_set(err, KV_EINVAL, "two models are named '%s' (use -m NAME=PATH)", nm);
    if (full)
        return kvant_err_set(err, KV_ERANGE, "more than %d models", REG_MAX);
    mentry *x = calloc(1, sizeof *x);
    if (!x)
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    snprintf(x->name, sizeof x->name, "%s", nm);
    snprintf(x->path, sizeof x->path, "%s", path);
    x->created = (int64_t)time(NULL);
    kvant_err pe = {0};
    if (plan_entry(r, x, &pe)) {
        x->state = REG_FAILED;
        snprintf(x->error, sizeof x->error, "%s", pe.msg);
        if (err)
            *err = pe;
    }
    pthread_mutex_lock(&r->mu);
    r->ent[r->n++] = x;
    pthread_mutex_unlock(&r->mu);
    return KV_OK;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

int reg_add_dir(registry *r, const char *dir, kvant_err *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return kvant_err_set(err, KV_EIO, "--models-dir %s: %s", dir, strerror(errno));
    char *names[REG_MAX + 1];
    int n = 0, rc = KV_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t L = strlen(de->d_name);
        if (de->d_name[0] == '.' || L <= 5 || strcmp(de->d_name + L - 5, ".gguf"))
            continue;
        if (n == REG_MAX) {
            rc = kvant_err_set(err, KV_ERANGE, "--models-dir %s: more than %d models", dir,
                               REG_MAX);
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
            int rc2 = reg_add(r, NULL, path, &e2);
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

void reg_log(const registry *r, const char *fmt, ...)
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
void reg_add_stats(engine_stats *t, const engine_stats *s, int gauges)
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
    t->itl_limited_steps += s->itl_limited_steps;
    if (!gauges)
        return;
    t->itl_budget += s->itl_budget; /* the models' budgets together */
    if (!(t->step_token_s > 0)) { /* one model's cost model: the first that has one */
        t->step_base_s = s->step_base_s;
        t->step_token_s = s->step_token_s;
    }
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
void reg_drop_entry(mentry *x, int keep_model, engine_stats *fin)
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
    }
}

/* Loads (or wakes) x; without r->mu, x marked LOADING.  Fills resident[]
 * (under r->mu: /metrics reads it) from the shared manager's change (the
 * only change running). */
static int raise_entry(registry *r, mentry *x, kvant_err *err)
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
        x->max_piece_bytes = tok_max_piece_bytes(x->m->tok);
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
    pthread_mutex_lock(&r->mu);
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        x->resident[c] = after->cat[c].current - before->cat[c].current;
    pthread_mutex_unlock(&r->mu);
out:
    free(before);
    free(after);
    return rc;
}

uint64_t reg_resident_sum(const mentry *x)
{
    uint64_t t = 0;
    for (int c = 0; c < MEM_CAT_COUNT; c++) /* the budget's: pinned host memory is not */
        t += mem_cat_in_budget((mem_cat)c) ? x->resident[c] : 0;
    return t;
}

static void fmt_size(uint64_t b, char *buf)
{
    mem_format_size(b, buf, 32);
}

/* Waits on r->cv until deadline; 0 on timeout. */
int reg_wait_until(registry *r, double deadline)
{
    double left = deadline - reg_now();
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
uint64_t reg_kv_grown_bytes(const mentry *x)
{
    return x->kv_blocks > x->kv_min_blocks
               ? (uint64_t)(x->kv_blocks - x->kv_min_blocks) * x->block_bytes
               : 0;
}

/* Chooses victims for x under r->mu; SRV_FIT_* as reg_pick. */
static int choose_victims(registry *r, int xi, int *victims, int *nv)
{
    reg_cand c[REG_MAX];
    for (int i = 0; i < r->n; i++) {
        const mentry *y = r->ent[i];
        c[i] = (reg_cand){reg_resident_sum(y), y->last_used, y->state == REG_LOADED,
                                 y->refs > 0, y->pinned};
        if (y->pinned) /* a grown pool can shrink back: only its share is fixed */
            c[i].bytes -= reg_kv_grown_bytes(y);
        if (i == xi)
            c[i].loaded = 0;
    }
    return reg_pick(c, r->n, r->ent[xi]->need, r->budget, mem_used(r->mem),
                           REG_MAX_RESIDENT, victims, nv);
}

/* Publishes the end of a load or wake of x (under r->mu). */
static void finish_load_locked(registry *r, mentry *x, reg_state from, int from_level,
                               double dt)
{
    char a[32], b[32], c[32];
    x->state = REG_LOADED;
    x->error[0] = '\0';
    x->last_used = reg_now();
    fmt_size(reg_resident_sum(x), a);
    fmt_size(mem_used(r->mem), b);
    fmt_size(r->budget, c);
    if (from == REG_SLEEPING) {
        x->wakes++;
        hist_add(&x->wake_h, dt);
        reg_log(r, "woke %s from sleep level %d in %.3f s: %s resident, %s of %s used", x->name,
                 from_level, dt, a, b, c);
    } else {
        x->loads++;
        hist_add(&x->load_h, dt);
        reg_log(r, "loaded %s in %.3f s: %s resident (KV %s), %s of %s used", x->name, dt, a,
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
static uint64_t spare_kv_locked(registry *r, int xi)
{
    const mentry *x = r->ent[xi];
    uint64_t reserve = 0, k = 0;
    if (!r->cfg.kv_grow)
        return 0;
    for (int i = 0; i < r->n; i++) {
        const mentry *y = r->ent[i];
        if (y->state != REG_LOADED && y->state != REG_FAILED &&
            y->need <= r->budget) { /* one that can never fit needs nothing */
            reserve += y->need;
            k++;
        }
    }
    const reg_footprint f = {.block_bytes = x->block_bytes, .kv_share = x->kv_share,
                             .kv_max = x->kv_max};
    return reg_plan_spare(mem_available(r->mem), reserve, k, &f);
}

/* ---- KV memory that follows the load (elastic pools) ----------------------------
 * Called under r->mu with r->changing set by the caller (so no load runs
 * and the manager's free bytes only move with these resizes); the engine
 * round trips run with the lock dropped.  Entries touched stay LOADED:
 * every other life-cycle change waits for `changing`. */

/* x's pool as the arithmetic of registry_plan.h sees it. */
static reg_plan_pool pool_of(const mentry *x, int skip)
{
    return (reg_plan_pool){x->kv_blocks, x->kv_min_blocks, x->kv_max_blocks, x->block_bytes,
                           x->refs, x->last_used, skip};
}

typedef struct kv_move {
    int idx;
    int32_t want, from, got;
} kv_move;

/* Resizes the entries of mv[0..n) (lock dropped) and publishes the new
 * sizes and KV bytes; logs each change with why. */
static void kv_apply_locked(registry *r, kv_move *mv, int n, const char *why)
{
    engine *es[REG_MAX];
    for (int k = 0; k < n; k++)
        es[k] = r->ent[mv[k].idx]->e;
    pthread_mutex_unlock(&r->mu);
    for (int k = 0; k < n; k++) {
        kvant_err e2 = {0};
        if (engine_kv_resize(es[k], mv[k].want, REG_KV_RESIZE_TIMEOUT_S, &mv[k].got,
                             &e2) != KV_OK) {
            mv[k].got = mv[k].from; /* refused (over budget, a step too long): unchanged */
            reg_log(r, "kv: %s not resized: %s", r->ent[mv[k].idx]->name, e2.msg);
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
        reg_log(r, "kv: %s %s %d -> %d blocks (%c%s) %s; %s free", x->name,
                 d > 0 ? "grows" : "shrinks", mv[k].from, mv[k].got, d > 0 ? '+' : '-', a, why,
                 b);
    }
}

/* Grows every loaded elastic pool into the free budget: an equal part
 * each, in whole blocks, up to its maximum.  A draining pool with nothing
 * to gain is still resized to its own size, which ends the drain an
 * earlier reclaim left in it. */
void reg_kv_grow_locked(registry *r, const char *why)
{
    kv_move mv[REG_MAX];
    reg_plan_pool p[REG_MAX];
    int32_t add[REG_MAX];
    int map[REG_MAX], n = 0, np = 0;
    if (!r->elastic || r->stop)
        return;
    for (int i = 0; i < r->n; i++) {
        const mentry *x = r->ent[i];
        if (x->state == REG_LOADED && x->kv_blocks > 0) {
            p[np] = pool_of(x, 0);
            map[np++] = i;
        }
    }
    reg_plan_grow(mem_available(r->mem), p, np, add);
    for (int k = 0; k < np; k++) {
        const mentry *x = r->ent[map[k]];
        if (add[k] || x->kv_draining)
            mv[n++] = (kv_move){map[k], x->kv_blocks + add[k], x->kv_blocks, x->kv_blocks};
    }
    kv_apply_locked(r, mv, n, why);
}

/* Shrinks grown pools (idle models first, then least recently used)
 * until deficit bytes are free or none can give more; a pool whose tail
 * is held gives what it can now and drains the rest (its holders finish,
 * the next attempt takes it).  Returns the bytes given back. */
static uint64_t kv_reclaim_locked(registry *r, int xi, uint64_t deficit, const char *why)
{
    kv_move mv[REG_MAX];
    reg_plan_pool p[REG_MAX];
    int idx[REG_MAX];
    int32_t cut[REG_MAX];
    uint64_t freed = 0;
    for (int i = 0; i < r->n; i++)
        p[i] = pool_of(r->ent[i], i == xi || r->ent[i]->state != REG_LOADED);
    const int n = reg_plan_reclaim(p, r->n, deficit, idx, cut);
    for (int k = 0; k < n; k++) {
        const mentry *y = r->ent[idx[k]];
        mv[k] = (kv_move){idx[k], y->kv_blocks - cut[k], y->kv_blocks, y->kv_blocks};
    }
    kv_apply_locked(r, mv, n, why);
    for (int k = 0; k < n; k++)
        freed += (uint64_t)(mv[k].from - mv[k].got) * r->ent[mv[k].idx]->block_bytes;
    return freed;
}

/* Evicts the victims and loads x: called under r->mu with the victims
 * chosen; drops the lock for the slow part and retakes it. */
static int load_locked(registry *r, int xi, const int *victims, int nv, kvant_err *err)
{
    mentry *x = r->ent[xi];
    char a[32], b[32], c[32];
    r->changing = 1;
    reg_state from = x->state;
    int from_level = x->sleep_level;
    x->kv_extra = nv || r->elastic ? 0 : spare_kv_locked(r, xi);
    x->state = REG_LOADING;
    double t = reg_now();
    for (int k = 0; k < nv; k++) {
        mentry *v = r->ent[victims[k]];
        fmt_size(x->need, a);
        fmt_size(mem_available(r->mem), b);
        fmt_size(r->budget, c);
        reg_log(r, "evicting %s (LRU, idle %.0f s) to load %s: needs %s, %s free of %s", v->name,
                 t - v->last_used, x->name, a, b, c);
        v->state = REG_UNLOADING;
    }
    pthread_mutex_unlock(&r->mu);
    engine_stats fin[REG_MAX];
    for (int k = 0; k < nv; k++)
        reg_drop_entry(r->ent[victims[k]], 0, &fin[k]);
    /* the victims' bytes are back before x's are counted: the resident sum
     * that /metrics shows never holds both */
    pthread_mutex_lock(&r->mu);
    for (int k = 0; k < nv; k++)
        memset(r->ent[victims[k]]->resident, 0, sizeof r->ent[victims[k]]->resident);
    pthread_mutex_unlock(&r->mu);
    kvant_err le = {0};
    int rc = raise_entry(r, x, &le);
    double dt = reg_now() - t;
    pthread_mutex_lock(&r->mu);
    for (int k = 0; k < nv; k++) {
        mentry *v = r->ent[victims[k]];
        reg_add_stats(&v->retired, &fin[k], 0);
        memset(v->resident, 0, sizeof v->resident);
        v->state = REG_UNLOADED;
        v->evictions++;
    }
    if (rc == KV_OK) {
        finish_load_locked(r, x, from, from_level, dt);
        char why[REG_NAME_MAX + 48];
        snprintf(why, sizeof why, "into free memory after loading %s", x->name);
        reg_kv_grow_locked(r, why);
        r->changing = 0;
        pthread_cond_broadcast(&r->cv);
        return KV_OK;
    }
    reg_drop_entry(x, 0, &fin[0]); /* under the lock: x has no engine (the load failed) */
    memset(x->resident, 0, sizeof x->resident);
    x->load_failures++;
    int bad_file = rc == KV_EFORMAT || rc == KV_EIO || rc == KV_EUNSUP;
    x->state = bad_file || from == REG_FAILED ? REG_FAILED : REG_UNLOADED;
    x->sleep_level = 0;
    snprintf(x->error, sizeof x->error, "%s", le.msg);
    reg_log(r, "loading %s failed: %s", x->name, le.msg);
    reg_kv_grow_locked(r, "into free memory after a failed load");
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
static int bring_up_locked(registry *r, int xi, double deadline, kvant_err *err)
{
    mentry *x = r->ent[xi];
    char a[32], b[32];
    int reclaimed = 0, shrank = 0; /* a reclaim since the last wait; any in this call */
    for (;;) {
        if (x->state == REG_LOADED)
            return KV_OK;
        if (r->draining || r->stop)
            return kvant_err_set(err, KV_EBUSY, "the server is draining");
        int victims[REG_MAX], nv = 0;
        int fit = r->changing ? SRV_FIT_WAIT : choose_victims(r, xi, victims, &nv);
        const uint64_t avail = mem_available(r->mem);
        if (fit != SRV_FIT_NEVER && (fit == SRV_FIT_WAIT || nv > 0) && !r->changing &&
            !reclaimed && r->elastic && x->need > avail) {
            /* grown KV pools give memory back before any model is evicted */
            char why[REG_NAME_MAX + 24];
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
        if (!reg_wait_until(r, deadline)) {
            if (shrank && !r->changing) { /* give the reclaimed memory back */
                r->changing = 1;
                reg_kv_grow_locked(r, "into free memory after a load timed out");
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

int reg_check_name(registry *r, const char *name, kvant_err *err)
{
    int i = find_locked(r, name);
    if (i < 0)
        kvant_err_set(err, KV_EINVAL, "the model '%.200s' does not exist", name ? name : "");
    return i;
}

static void fill_ref(registry *r, int i, reg_ref *out)
{
    mentry *x = r->ent[i];
    x->refs++;
    x->last_used = reg_now();
    *out = (reg_ref){x->m, x->e, x->name, x->ctx, x->max_piece_bytes, i};
}

int reg_acquire(registry *r, const char *name, reg_ref *out, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = reg_check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0 && r->ent[i]->state == REG_FAILED) {
        rc = kvant_err_set(err, KV_EFORMAT, "the model '%s' failed to load: %s", r->ent[i]->name,
                           r->ent[i]->error);
    } else if (i >= 0) {
        rc = bring_up_locked(r, i, reg_now() + r->cfg.queue_timeout_s, err);
        if (rc == KV_OK)
            fill_ref(r, i, out);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int reg_peek(registry *r, const char *name, reg_ref *out, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = reg_check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0) {
        rc = r->ent[i]->state == REG_LOADED
                 ? KV_OK
                 : kvant_err_set(err, KV_EBUSY, "the model '%s' is %s", r->ent[i]->name,
                                 reg_state_name(r->ent[i]->state));
        if (rc == KV_OK)
            fill_ref(r, i, out);
    }
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void reg_release(registry *r, reg_ref *ref)
{
    if (!ref || !ref->e)
        return;
    pthread_mutex_lock(&r->mu);
    mentry *x = r->ent[ref->idx];
    KV_ASSERT(x->refs > 0);
    x->refs--;
    x->last_used = reg_now();
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    ref->e = NULL;
}

int reg_load(registry *r, const char *name, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = reg_check_name(r, name, err), rc = KV_EINVAL;
    if (i >= 0 && r->ent[i]->state == REG_FAILED) {
        /* a retry: the file may have been fixed */
        kvant_err pe = {0};
        mentry *x = r->ent[i];
        rc = plan_entry(r, x, &pe);
        if (rc) {
            snprintf(x->error, sizeof x->error, "%s", pe.msg);
            if (err)
                *err = pe;
        }
    }
    if (i >= 0 && (r->ent[i]->state != REG_FAILED || rc == KV_OK))
        rc = bring_up_locked(r, i, reg_now() + r->cfg.queue_timeout_s, err);
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int reg_wake(registry *r, const char *name, kvant_err *err)
{
    return reg_load(r, name, err);
}

int reg_pin(registry *r, const char *name, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = reg_check_name(r, name, err);
    if (i >= 0)
        r->ent[i]->pinned = 1;
    pthread_mutex_unlock(&r->mu);
    return i < 0 ? KV_EINVAL : reg_load(r, name, err);
}

void reg_drain(registry *r)
{
    pthread_mutex_lock(&r->mu);
    r->draining = 1;
    for (int i = 0; i < r->n; i++)
        if (r->ent[i]->state == REG_LOADED)
            engine_drain(r->ent[i]->e);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

void reg_destroy(registry *r)
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
        reg_drop_entry(r->ent[i], 0, &fin);
        free(r->ent[i]);
    }
    mem_destroy(r->mem);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    free(r);
}

