/* engine_kvresize.c - KV memory that follows the load: the engine's block
 * pool grows and shrinks between two steps (engine_kv_resize).
 *
 * The pool (kv/kvpool.h) and the backend's storage (backend_ops.kv_resize)
 * change together: a grow makes the storage first (the memory manager may
 * refuse it: nothing changes) and then the ids; a shrink gives back the ids
 * of the longest tail no sequence holds first (cached prefix blocks there
 * are evicted through the tiers' hook) and then their storage.  Ids below
 * the new size never move, so block tables stay valid; a sequence's blocks
 * are never taken.  A shrink stopped by a held block leaves the ids down to
 * its target draining (not handed out again), so the next shrink, once
 * their holders finish, reaches the target; any grow ends the drain.
 *
 * Threading: the pool and backend belong to the engine thread.  A caller
 * posts an eng_resize in e->resize_req (under e->mu) and waits on
 * e->snap_cv (shared with snapshots: every waiter re-checks its own done
 * flag); the engine thread serves it between two steps
 * (engine_serve_resize, from its loop).  In manual mode the caller is the
 * engine thread and the resize runs at once.
 */
#include "engine/engine_kvresize.h"
#include "engine/engine_internal.h"

#include <errno.h>
#include <string.h>
#include <time.h>

struct eng_resize {
    int32_t want;   /* blocks asked for */
    int32_t got;    /* size after the resize */
    int rc;
    kvant_err err;
    int taken;      /* the engine thread is resizing (it finishes: the caller waits) */
    int done;       /* set by the engine thread */
};

/* Publishes the pool's new shape to the stats readers (under e->mu). */
static void publish(engine *e, int grew, int shrank)
{
    kvpool_stats ks;
    kvpool_get_stats(e->pool, &ks);
    pthread_mutex_lock(&e->mu);
    e->stats.kv_blocks_total = ks.n_blocks;
    e->stats.kv_blocks_free = ks.n_free;
    e->stats.kv_blocks_cached = ks.n_cached;
    e->stats.kv_blocks_used = ks.n_used;
    e->stats.kv_grows += (uint64_t)grew;
    e->stats.kv_shrinks += (uint64_t)shrank;
    e->kv_pool_stats.total_bytes = (uint64_t)ks.n_blocks * e->kv_block_bytes;
    e->kv_pool_stats.free_bytes = (uint64_t)(ks.n_free + ks.n_cached) * e->kv_block_bytes;
    if (e->kv_pool_stats.largest_free_extent > e->kv_pool_stats.free_bytes)
        e->kv_pool_stats.largest_free_extent = e->kv_pool_stats.free_bytes;
    pthread_mutex_unlock(&e->mu);
}

/* On the engine thread: resizes to want (see engine_kv_resize). */
static int resize_now(engine *e, int32_t want, int32_t *got, kvant_err *err)
{
    kvpool_stats ks;
    kvpool_get_stats(e->pool, &ks);
    const int32_t cur = ks.n_blocks;
    int (*kv_resize)(backend *, int32_t, kvant_err *) = e->be->ops->kv_resize;
    *got = cur;
    if (want != cur && !kv_resize)
        return kvant_err_set(err, KV_EUNSUP, "the %s backend cannot resize its KV pool",
                             e->be->ops->name);
    if (want != cur && e->tp) /* every rank's pool would have to follow */
        return kvant_err_set(err, KV_EUNSUP, "the KV pool is not resized under --tp/--pp");
    if (want >= cur) { /* equal: only ends a drain left by an earlier shrink */
        if (want > kvpool_max_blocks(e->pool))
            return kvant_err_set(err, KV_ERANGE, "KV pool: %d blocks asked, at most %d", want,
                                 kvpool_max_blocks(e->pool));
        int rc = want > cur ? kv_resize(e->be, want, err) : KV_OK;
        if (rc)
            return rc;
        rc = kvpool_grow(e->pool, want);
        KV_ASSERT(rc == KV_OK); /* checked against max_blocks above */
    } else {
        int32_t n = kvpool_shrink(e->pool, want > e->kv_min_blocks ? want : e->kv_min_blocks);
        if (n < cur) {
            int rc = kv_resize(e->be, n, err);
            KV_ASSERT(rc == KV_OK); /* a smaller size in range cannot be refused */
            (void)rc;
        }
    }
    kvpool_get_stats(e->pool, &ks);
    e->fwd.kv.n_blocks = ks.n_blocks;
    *got = ks.n_blocks;
    publish(e, *got > cur, *got < cur);
    return KV_OK;
}

void engine_serve_resize(engine *e)
{
    pthread_mutex_lock(&e->mu);
    eng_resize *q = e->resize_req;
    if (q)
        q->taken = 1;
    pthread_mutex_unlock(&e->mu);
    if (!q)
        return;
    q->rc = resize_now(e, q->want, &q->got, &q->err); /* the caller waits: q is ours */
    pthread_mutex_lock(&e->mu);
    q->done = 1;
    e->resize_req = NULL;
    pthread_cond_broadcast(&e->snap_cv);
    pthread_mutex_unlock(&e->mu);
}

/* Waits on snap_cv until the deadline (0: none); 0 when it passed. */
static int wait_deadline(engine *e, const struct timespec *dl)
{
    if (!dl)
        return pthread_cond_wait(&e->snap_cv, &e->mu), 1;
    return pthread_cond_timedwait(&e->snap_cv, &e->mu, dl) != ETIMEDOUT;
}

static int busy(kvant_err *err, int late, double timeout_s)
{
    if (late)
        return kvant_err_set(err, KV_EBUSY, "the engine did not reach a step boundary in %.1f s",
                             timeout_s);
    return kvant_err_set(err, KV_EBUSY, "the engine is stopping");
}

int engine_kv_resize(engine *e, int32_t n_blocks, double timeout_s, int32_t *out_blocks,
                     kvant_err *err)
{
    int32_t got = 0;
    int rc;
    if (n_blocks < 1) {
        rc = kvant_err_set(err, KV_EINVAL, "KV pool: %d blocks asked", n_blocks);
    } else if (e->cfg.manual) {
        rc = resize_now(e, n_blocks, &got, err);
    } else {
        struct timespec ts, *dl = NULL;
        if (timeout_s > 0) {
            clock_gettime(CLOCK_REALTIME, &ts);
            double t = (double)ts.tv_sec + ts.tv_nsec * 1e-9 + timeout_s;
            ts.tv_sec = (time_t)t;
            ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
            dl = &ts;
        }
        eng_resize q = {.want = n_blocks};
        int late = 0;
        pthread_mutex_lock(&e->mu);
        while (e->resize_req && !e->stop && !e->thread_exited && !late)
            late = !wait_deadline(e, dl);
        if (e->stop || e->thread_exited || late) {
            pthread_mutex_unlock(&e->mu);
            return busy(err, late, timeout_s);
        }
        e->resize_req = &q;
        pthread_cond_signal(&e->cv);
        while (!q.done && !e->thread_exited && !(late && !q.taken))
            late = !wait_deadline(e, q.taken ? NULL : dl);
        if (!q.done && e->resize_req == &q)
            e->resize_req = NULL; /* never taken: withdrawn */
        pthread_mutex_unlock(&e->mu);
        if (!q.done)
            return busy(err, late, timeout_s);
        rc = q.rc;
        got = q.got;
        if (rc && err)
            *err = q.err;
    }
    if (out_blocks)
        *out_blocks = got;
    return rc;
}

void engine_kv_grow_for(engine *e, int32_t need)
{
    if (e->kv_grow_max <= 0)
        return;
    kvpool_stats ks;
    kvpool_get_stats(e->pool, &ks);
    if (need <= ks.n_free || ks.n_blocks >= e->kv_grow_max)
        return;
    int64_t want = (int64_t)ks.n_blocks + (need - ks.n_free);
    const int64_t step = (int64_t)ks.n_blocks + ks.n_blocks / 4;
    want = want < step ? step : want;
    want = want > e->kv_grow_max ? e->kv_grow_max : want;
    int32_t got = 0;
    kvant_err err = {0};
    (void)resize_now(e, (int32_t)want, &got, &err); /* refused: the cached blocks go first */
}
