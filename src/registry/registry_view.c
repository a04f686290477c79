/* registry_view.c - read-only views of the registry: the models and
 * their states and bytes, the summed engine counters, health. */
#include "registry/registry_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>


int reg_count(registry *r)
{
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

mem_mgr *reg_mem(registry *r)
{
    return r->mem;
}

int reg_describe(registry *r, int i, reg_info *o)
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
    o->created = x->created;
    o->sleep_level = x->state == REG_SLEEPING ? x->sleep_level : 0;
    o->pinned = x->pinned;
    o->refs = x->refs;
    o->idle_s = x->refs || !x->last_used ? 0 : reg_now() - x->last_used;
    o->max_model_len = x->ctx;
    o->need_bytes = x->need;
    o->kv_share_bytes = x->kv_share;
    o->kv_extra_bytes = x->state != REG_LOADED ? 0 : r->elastic ? reg_kv_grown_bytes(x) : x->kv_extra;
    o->kv_blocks_min = x->state == REG_LOADED ? x->kv_min_blocks : 0;
    o->kv_blocks_max = x->state == REG_LOADED ? x->kv_max_blocks : 0;
    o->kv_grows = x->kv_grows;
    o->kv_shrinks = x->kv_shrinks;
    memcpy(o->resident, x->resident, sizeof o->resident);
    o->resident_bytes = reg_resident_sum(x);
    if (x->state == REG_LOADED) {
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

void reg_stats(registry *r, engine_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        const mentry *x = r->ent[i];
        reg_add_stats(out, &x->retired, 0);
        if (x->state == REG_LOADED) {
            engine_stats s;
            engine_get_stats(x->e, &s);
            reg_add_stats(out, &s, 1);
        }
    }
    pthread_mutex_unlock(&r->mu);
}

void reg_health(registry *r, engine_health *out)
{
    memset(out, 0, sizeof *out);
    out->thread_alive = 1;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++) {
        if (r->ent[i]->state != REG_LOADED)
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
