/* engine_state.c - hybrid models' recurrent state in the engine: a live
 * slot per sequence and the prefix cache's state snapshots.
 *
 * A recurrent layer's state sums up every token before it and cannot be cut
 * at an arbitrary position, so a prefix hit on the KV blocks alone would
 * leave the recurrent layers without their state.  The engine therefore
 * keeps, beside the KV blocks, snapshots of the whole recurrent state at
 * block boundaries, keyed by the chain hash of the block that ends there
 * (kvpool_block_hashed): a prefix hit is cut back to the last boundary that
 * has a snapshot, the snapshot is copied into the sequence's live slot and
 * the tokens after it are computed again.
 *
 * Which boundaries: every state_snap_every-th block boundary (the
 * "permanent" ones, shared by every request with that prefix), and the
 * last boundary each pass of a sequence reaches (its "trailing" snapshots:
 * one for its prompt, replaced by each later chunk of the prompt, and one
 * while it decodes, replaced at each later boundary): the end of a prompt
 * (a request sent again, or a next turn whose history was re-rendered
 * differently after it), and the latest boundary of the generated text, so
 * the next turn of a chat finds the whole previous conversation.  The forward pass writes a snapshot after
 * the token before its boundary (fwd_seq.state_snap), into a slot taken here
 * before the pass; after the pass the slot is registered under its block's
 * hash, or given back when the block was not hashed.  Slots are evicted
 * least recently used first.
 *
 * Slots: [0, n_live) live, one per running sequence (taken at its first
 * reserve, given back with its KV), [n_live, n_live + n_snap) snapshots;
 * all in the backend (state_init, MEM_STATE).  Preemption recomputes (its
 * state is not swapped): a preempted sequence's live slot goes with its KV
 * blocks and it restarts from a prefix hit (a snapshot) or from zero.
 *
 * Tiers (with --kv-host-memory / --kv-disk-dir): a second kvtier (kv/kvtier.h)
 * holds snapshots under the tier key of the block that ends at their
 * boundary (the KV tier's chain over the token ids, engine_tier_key), with
 * that block's token ids: a snapshot evicted from the device goes to its
 * host tier (then disk), each new one is written through to its disk tier
 * (<kv-disk-dir>/state) and the device's go down at shutdown, so a prefix
 * that the KV tiers extend finds its state there, after a restart too.
 *
 * Threading: the engine thread; the counters are copied into e->stats under
 * e->mu (engine_state_note).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kv/kvtier.h"

#include "engine/engine_state.h"
#include "engine/engine_internal.h"

enum { SNAP_FREE = 0, SNAP_PENDING = 1, SNAP_CACHED = 2 };

typedef struct eng_snap {
    uint64_t hash;          /* chain hash of the block ending at pos (SNAP_CACHED) */
    uint8_t key[KVTIER_KEY_BYTES]; /* its tier key (has_key) */
    int has_key;
    uint64_t used;          /* LRU clock of the last take or restore */
    int32_t pos;            /* tokens the state has consumed (a block boundary) */
    uint32_t gen;           /* bumped each time the slot is taken */
    uint8_t state;
} eng_snap;

/* One snapshot of this step: the sequence, its boundary and slot. */
typedef struct eng_pend {
    eng_seq *s;
    int32_t pos, slot;      /* slot: an index into snap (not the backend's) */
    int trail;              /* 1 + the sequence's trailing kind (0 prompt, 1 decode); 0 none */
} eng_pend;

struct eng_state {
    int32_t n_live, n_snap;
    int32_t every;          /* blocks between permanent snapshots (0: only trailing) */
    int32_t *live_free;     /* [n_live] free live slots */
    int32_t n_live_free;
    eng_snap *snap;         /* [n_snap] */
    eng_pend *pend;         /* [max_pend] this step's */
    int32_t *pairs;         /* [max_pend][2] the fwd_seq pairs (backend slot ids) */
    int32_t n_pend, max_pend;
    uint64_t clock;
    uint64_t bytes;         /* one slot's */
    uint64_t taken, restored, evicted, dropped;
    kvtier *tier;           /* the snapshots' tiers, or NULL */
    int32_t *toks;          /* [n_snap][block_size] the ending block's token ids */
    int through;            /* write-through to its disk tier */
    uint64_t tier_restored, tier_stored;
    char dir[1024];
};

typedef struct st_fill {
    engine *e;
    int32_t slot;           /* the backend's */
} st_fill;

static int state_fill(void *ctx, void *dst)
{
    const st_fill *f = ctx;
    return f->e->be->ops->state_export(f->e->be, f->slot, dst);
}

/* The snapshots' tiers beside the KV tiers (none without them): a host
 * share of a quarter of the KV host tier (at most the device snapshots'
 * bytes four times), a quarter of the disk budget in <dir>/state. */
static int tier_open(engine *e, eng_state *st, kvant_err *err)
{
    const engine_config *c = &e->cfg;
    const uint8_t *fp = engine_tier_fingerprint(e);
    if (!fp || st->n_snap == 0)
        return KV_OK;
    kvtier_config tc = kvtier_config_default();
    memcpy(tc.fingerprint, fp, KVTIER_KEY_BYTES);
    tc.block_size = c->block_size;
    tc.kv_dtype = DT_F32;
    tc.payload_bytes = st->bytes;
    const uint64_t rec = KVTIER_RECORD_BYTES(c->block_size, st->bytes);
    uint64_t host = engine_tier_host_bytes(e) / 4, cap = 4 * (uint64_t)st->n_snap * rec;
    host = host > cap ? cap : host;
    tc.host_bytes = host >= rec ? host : 0;
    const uint64_t disk = (c->kv_disk_size ? c->kv_disk_size : ENGINE_DEFAULT_DISK_SIZE) / 4;
    if (c->kv_disk_dir && disk >= rec) {
        snprintf(st->dir, sizeof st->dir, "%s/state", c->kv_disk_dir);
        tc.disk_dir = st->dir;
        tc.disk_bytes = disk;
        st->through = !c->kv_disk_evict_only;
    }
    if (!tc.host_bytes && !tc.disk_dir)
        return KV_OK;
    tc.quiet = c->manual;
    tc.disk_wait = c->kv_disk_wait;
    st->toks = malloc((size_t)st->n_snap * (size_t)c->block_size * sizeof(int32_t));
    if (!st->toks)
        return kvant_err_set(err, KV_ENOMEM, "out of memory for the snapshots' token ids");
    st->tier = kvtier_create(&tc, err);
    return st->tier ? KV_OK : (err && err->code ? err->code : KV_ENOMEM);
}

/* Cached snapshot i down its tier (an eviction, or the shutdown). */
static void tier_store(engine *e, eng_state *st, int32_t i)
{
    if (!st->tier || !st->snap[i].has_key)
        return;
    st_fill f = {e, st->n_live + i};
    if (kvtier_store(st->tier, st->snap[i].key, st->toks + (size_t)i * e->cfg.block_size,
                     state_fill, &f) != KVTIER_NONE)
        st->tier_stored++;
}

int32_t engine_state_plan(const engine_config *c, uint64_t slot_bytes, uint64_t budget,
                          int32_t *n_live, int32_t *n_snap)
{
    *n_live = *n_snap = 0;
    if (!slot_bytes)
        return 0;
    /* a request's other sequences join it after its prompt (forks) */
    const int32_t ns = c->max_num_seqs;
    *n_live = ns + (ns < ENGINE_MAX_N - 1 ? ns : ENGINE_MAX_N - 1);
    if (c->state_snap_every >= 0 && c->prefix_cache) {
        uint64_t want = (uint64_t)ENGINE_STATE_DEFAULT_SNAPS * (uint64_t)ns;
        if (c->state_snap_bytes)
            want = c->state_snap_bytes / slot_bytes;
        else if (budget && want * slot_bytes > budget / 10)
            want = budget / 10 / slot_bytes;
        *n_snap = (int32_t)(want > 1u << 20 ? 1u << 20 : want);
    }
    return *n_live + *n_snap;
}

int32_t engine_state_slots(const engine *e, int32_t *n_live, int32_t *n_snap)
{
    return engine_state_plan(&e->cfg, model_recr_state_bytes(&e->m->hp.fam, e->m->hp.n_embd),
                             e->st_budget, n_live, n_snap);
}

int engine_state_create(engine *e, kvant_err *err)
{
    int32_t n_live, n_snap;
    if (!engine_state_slots(e, &n_live, &n_snap))
        return KV_OK;
    eng_state *st = calloc(1, sizeof *st);
    const int32_t max_pend = e->cfg.max_num_batched_tokens / e->cfg.block_size +
                             2 * e->cfg.max_num_seqs + 1;
    if (st) {
        st->live_free = malloc((size_t)n_live * sizeof(int32_t));
        st->snap = calloc((size_t)(n_snap > 0 ? n_snap : 1), sizeof(eng_snap));
        st->pend = malloc((size_t)max_pend * sizeof(eng_pend));
        st->pairs = malloc((size_t)max_pend * 2 * sizeof(int32_t));
    }
    if (!st || !st->live_free || !st->snap || !st->pend || !st->pairs) {
        e->st = st;
        engine_state_destroy(e);
        return kvant_err_set(err, KV_ENOMEM, "out of memory for the recurrent state's tables");
    }
    st->n_live = n_live;
    st->n_snap = n_snap;
    st->max_pend = max_pend;
    st->every = e->cfg.state_snap_every ? e->cfg.state_snap_every : ENGINE_STATE_DEFAULT_EVERY;
    st->bytes = model_recr_state_bytes(&e->m->hp.fam, e->m->hp.n_embd);
    for (int32_t i = 0; i < n_live; i++)
        st->live_free[i] = n_live - 1 - i; /* slot 0 first */
    st->n_live_free = n_live;
    e->st = st;
    e->stats.state_slot_bytes = st->bytes;
    e->stats.state_live_slots = n_live;
    e->stats.state_snap_slots = n_snap;
    return tier_open(e, st, err);
}

void engine_state_destroy(engine *e)
{
    eng_state *st = e->st;
    if (!st)
        return;
    for (int32_t i = 0; e->be && st->tier && i < st->n_snap; i++)
        if (st->snap[i].state == SNAP_CACHED) /* the device's snapshots go down */
            tier_store(e, st, i);
    kvtier_destroy(st->tier); /* writes its host records to disk */
    free(st->toks);
    free(st->live_free);
    free(st->snap);
    free(st->pend);
    free(st->pairs);
    free(st);
    e->st = NULL;
}

int engine_state_acquire(engine *e, eng_seq *s)
{
    eng_state *st = e->st;
    if (!st || s->st_slot >= 0)
        return KV_OK;
    if (st->n_live_free == 0)
        return KV_ENOMEM;
    s->st_slot = st->live_free[--st->n_live_free];
    return KV_OK;
}

void engine_state_release(engine *e, eng_seq *s)
{
    eng_state *st = e->st;
    if (!st || s->st_slot < 0)
        return;
    st->live_free[st->n_live_free++] = s->st_slot;
    s->st_slot = -1;
}

int engine_state_fork(engine *e, const eng_seq *parent, eng_seq *child)
{
    if (!e->st)
        return KV_OK;
    int rc = engine_state_acquire(e, child);
    if (rc)
        return rc;
    e->be->ops->state_copy(e->be, child->st_slot, parent->st_slot);
    child->st_trail[0] = child->st_trail[1] = -1;
    return KV_OK;
}

/* The cached snapshot of the block ending at pos whose chain hash is h, or -1. */
static int32_t find(const eng_state *st, uint64_t h, int32_t pos)
{
    for (int32_t i = 0; i < st->n_snap; i++)
        if (st->snap[i].state == SNAP_CACHED && st->snap[i].hash == h && st->snap[i].pos == pos)
            return i;
    return -1;
}

/* The snapshot at block boundary k from the tiers into s's live slot:
 * 1 when restored. */
static int tier_restore(engine *e, eng_state *st, eng_seq *s, int64_t k)
{
    const int32_t bs = e->cfg.block_size;
    const uint8_t *key = st->tier ? engine_tier_key(e, s->kv.blocks[k - 1]) : NULL;
    if (!key || kvtier_where(st->tier, key) == KVTIER_NONE)
        return 0;
    const void *pl = kvtier_fetch(st->tier, key, s->tokens + (k - 1) * bs);
    if (!pl || e->be->ops->state_import(e->be, s->st_slot, pl, (int32_t)(k * bs)))
        return 0;
    st->tier_restored++;
    return 1;
}

int64_t engine_state_match(engine *e, eng_seq *s, int64_t hit)
{
    eng_state *st = e->st;
    const int32_t bs = e->cfg.block_size;
    if (!st || hit <= 0)
        return hit;
    if (engine_state_acquire(e, s)) { /* no live slot: recompute when one is free */
        kvseq_unmatch(e->pool, &s->kv, 0);
        return 0;
    }
    int64_t k = hit / bs;
    for (; k > 0; k--) {
        uint64_t h;
        if (k > s->kv.n_blocks || !kvpool_block_hashed(e->pool, s->kv.blocks[k - 1], &h))
            continue;
        const int32_t found = find(st, h, (int32_t)(k * bs));
        if (found >= 0) {
            e->be->ops->state_copy(e->be, s->st_slot, st->n_live + found);
            st->snap[found].used = ++st->clock;
            st->restored++;
            break;
        }
        if (tier_restore(e, st, s, k))
            break;
    }
    if (k * bs < hit)
        kvseq_unmatch(e->pool, &s->kv, k * bs);
    return k * bs;
}

/* A free snapshot slot, else the least recently used cached one (evicted);
 * -1 when every slot is pending this step. */
static int32_t take(engine *e, eng_state *st)
{
    int32_t best = -1;
    for (int32_t i = 0; i < st->n_snap; i++) {
        if (st->snap[i].state == SNAP_FREE) {
            best = i;
            break;
        }
        if (st->snap[i].state == SNAP_CACHED &&
            (best < 0 || st->snap[i].used < st->snap[best].used))
            best = i;
    }
    if (best < 0)
        return -1;
    if (st->snap[best].state == SNAP_CACHED) {
        st->evicted++;
        tier_store(e, st, best);
    }
    st->snap[best].has_key = 0;
    st->snap[best].state = SNAP_PENDING;
    st->snap[best].gen++;
    st->snap[best].used = ++st->clock;
    return best;
}

static void add_pend(engine *e, eng_seq *s, int32_t pos, int trail)
{
    eng_state *st = e->st;
    if (st->n_pend >= st->max_pend)
        return;
    const int32_t slot = take(e, st);
    if (slot < 0)
        return;
    eng_pend *p = &st->pend[st->n_pend];
    *p = (eng_pend){s, pos, slot, trail};
    st->pairs[2 * st->n_pend] = pos;
    st->pairs[2 * st->n_pend + 1] = st->n_live + slot;
    st->n_pend++;
}

void engine_state_build(engine *e, eng_seq *s, fwd_seq *f)
{
    eng_state *st = e->st;
    if (!st)
        return;
    f->state_slot = s->st_slot;
    if (st->n_snap == 0 || s->kv.no_hash)
        return;
    const int64_t bs = e->cfg.block_size, a = s->n_computed, b = a + s->sched_tokens;
    const int32_t first = st->n_pend;
    const int64_t last = b / bs; /* boundaries q = k bs with a < q <= b */
    const int kind = 1 + (a >= s->req->p.n_prompt); /* trailing: prompt or decode */
    for (int64_t k = a / bs + 1; k <= last; k++) {
        const int perm = st->every > 0 && k % st->every == 0;
        if (perm || k == last)
            add_pend(e, s, (int32_t)(k * bs), perm ? 0 : kind);
    }
    f->state_snap = st->n_pend > first ? st->pairs + 2 * first : NULL;
    f->n_state_snap = st->n_pend - first;
}

/* The sequence's previous trailing snapshot of kind k goes when a newer one
 * comes. */
static void drop_trail(eng_state *st, eng_seq *s, int k)
{
    const int32_t i = s->st_trail[k];
    if (i >= 0 && st->snap[i].gen == s->st_trail_gen[k] && st->snap[i].state == SNAP_CACHED) {
        st->snap[i].state = SNAP_FREE;
        st->dropped++;
    }
    s->st_trail[k] = -1;
}

void engine_state_after_pass(engine *e, int ok)
{
    eng_state *st = e->st;
    if (!st)
        return;
    const int32_t bs = e->cfg.block_size;
    for (int32_t i = 0; i < st->n_pend; i++) {
        eng_pend *p = &st->pend[i];
        eng_snap *sn = &st->snap[p->slot];
        uint64_t h = 0;
        const int32_t bi = p->pos / bs - 1;
        const int hashed = ok && bi < p->s->kv.n_blocks && p->s->n_computed >= p->pos &&
                           kvpool_block_hashed(e->pool, p->s->kv.blocks[bi], &h);
        if (!hashed || find(st, h, p->pos) >= 0) { /* unhashed, or already there */
            sn->state = SNAP_FREE;
            continue;
        }
        sn->state = SNAP_CACHED;
        sn->hash = h;
        sn->pos = p->pos;
        st->taken++;
        const uint8_t *key = st->tier ? engine_tier_key(e, p->s->kv.blocks[bi]) : NULL;
        if (key) { /* its tier key and block, for the tiers */
            memcpy(sn->key, key, KVTIER_KEY_BYTES);
            memcpy(st->toks + (size_t)p->slot * bs, p->s->tokens + (int64_t)bi * bs,
                   (size_t)bs * sizeof(int32_t));
            sn->has_key = 1;
            st_fill f = {e, st->n_live + p->slot};
            if (st->through)
                kvtier_write_through(st->tier, sn->key, st->toks + (size_t)p->slot * bs,
                                     state_fill, &f);
        }
        if (p->trail) {
            drop_trail(st, p->s, p->trail - 1);
            p->s->st_trail[p->trail - 1] = p->slot;
            p->s->st_trail_gen[p->trail - 1] = sn->gen;
        }
    }
    st->n_pend = 0;
}

void engine_state_note(engine *e)
{
    eng_state *st = e->st;
    if (!st)
        return;
    int32_t cached = 0;
    for (int32_t i = 0; i < st->n_snap; i++)
        cached += st->snap[i].state == SNAP_CACHED;
    pthread_mutex_lock(&e->mu);
    e->stats.state_live_used = st->n_live - st->n_live_free;
    e->stats.state_snapshots = cached;
    e->stats.state_snap_taken = st->taken;
    e->stats.state_snap_restored = st->restored;
    e->stats.state_snap_evicted = st->evicted;
    e->stats.state_snap_dropped = st->dropped;
    e->stats.state_tier_restored = st->tier_restored;
    e->stats.state_tier_stored = st->tier_stored;
    pthread_mutex_unlock(&e->mu);
}
