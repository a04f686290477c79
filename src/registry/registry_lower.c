/* registry_lower.c - a model's way down: sleep (level 1 keeps the mapped
 * weights, level 2 drops them), unload, and the keep-alive thread that
 * unloads models idle longer than --keep-alive.  Calls down into
 * registry.c (registry_internal.h), never the other way. */
#include "registry/registry_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#define KEEPALIVE_TICK_S 0.25

/* Sleep (level 1 or 2) or unload (level 0) of an idle model. */
static int lower(registry *r, const char *name, int level, kvant_err *err)
{
    pthread_mutex_lock(&r->mu);
    int i = reg_check_name(r, name, err), rc = KV_EINVAL;
    double deadline = reg_now() + r->cfg.queue_timeout_s;
    while (i >= 0 && r->changing && reg_wait_until(r, deadline))
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
    int loaded = x->state == REG_LOADED, asleep = x->state == REG_SLEEPING;
    if (level > 0 && !loaded && !(asleep && level > x->sleep_level)) {
        rc = asleep ? KV_OK
                    : kvant_err_set(err, KV_EBUSY, "the model '%s' is %s, not loaded", x->name,
                                    reg_state_name(x->state));
        goto out;
    }
    if (level == 0 && !loaded && !asleep) {
        rc = KV_OK; /* already unloaded (or failed): nothing to do */
        goto out;
    }
    r->changing = 1;
    x->state = REG_UNLOADING;
    pthread_mutex_unlock(&r->mu);
    engine_stats fin;
    reg_drop_entry(x, level == 1, &fin);
    pthread_mutex_lock(&r->mu);
    reg_add_stats(&x->retired, &fin, 0);
    memset(x->resident, 0, sizeof x->resident);
    if (level > 0) {
        x->state = REG_SLEEPING;
        x->sleep_level = level;
        x->sleeps++;
        reg_log(r, "%s is asleep (level %d: %s)", x->name, level,
                 level == 1 ? "KV and engine dropped, weights mapped"
                            : "weights, KV and engine dropped");
    } else {
        x->state = REG_UNLOADED;
        x->sleep_level = 0;
        x->unloads++;
        reg_log(r, "unloaded %s", x->name);
    }
    char why[REG_NAME_MAX + 48];
    snprintf(why, sizeof why, "into free memory after %s %s", level ? "sleeping" : "unloading",
             x->name);
    reg_kv_grow_locked(r, why);
    r->changing = 0;
    pthread_cond_broadcast(&r->cv);
    rc = KV_OK;
out:
    pthread_mutex_unlock(&r->mu);
    return rc;
}

int reg_unload(registry *r, const char *name, kvant_err *err)
{
    return lower(r, name, 0, err);
}

int reg_sleep(registry *r, const char *name, int level, kvant_err *err)
{
    if (level != 1 && level != 2)
        return kvant_err_set(err, KV_EINVAL, "level must be 1 or 2, not %d", level);
    return lower(r, name, level, err);
}

/* ---- keep-alive ---------------------------------------------------------------- */

static void *keepalive_main(void *arg)
{
    registry *r = arg;
    pthread_mutex_lock(&r->mu);
    while (!r->stop) {
        double t = reg_now();
        char victim[REG_NAME_MAX] = "";
        double idle = 0;
        for (int i = 0; i < r->n && !r->changing && !r->draining; i++) {
            mentry *x = r->ent[i];
            if ((x->state == REG_LOADED || x->state == REG_SLEEPING) && !x->refs &&
                !x->pinned && t - x->last_used > r->cfg.keep_alive_s) {
                snprintf(victim, sizeof victim, "%s", x->name);
                idle = t - x->last_used;
                break;
            }
        }
        if (victim[0]) {
            reg_log(r, "keep-alive: %s idle %.1f s (limit %.1f s)", victim, idle,
                     r->cfg.keep_alive_s);
            pthread_mutex_unlock(&r->mu);
            reg_unload(r, victim, NULL);
            pthread_mutex_lock(&r->mu);
            continue;
        }
        reg_wait_until(r, reg_now() + KEEPALIVE_TICK_S);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

int reg_start(registry *r, kvant_err *err)
{
    if (r->cfg.keep_alive_s <= 0)
        return KV_OK;
    if (pthread_create(&r->ka_thread, NULL, keepalive_main, r))
        return kvant_err_set(err, KV_ENOMEM, "cannot start the keep-alive thread");
    r->ka_started = 1;
    return KV_OK;
}
