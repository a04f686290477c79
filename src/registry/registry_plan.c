/* registry_plan.c - the registry's memory arithmetic (registry_plan.h):
 * footprints, the eviction policy (reg_pick), the spare KV of a fixed
 * pool, growth and reclaim of elastic pools, and the start-up played out
 * from them for `kvant plan`.  registry.c makes every such decision
 * through these functions; nothing here reads registry state. */
#include "registry/registry_plan.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend_select.h"
#include "engine/engine_state.h"
#include "format/gguf.h"
#include "kv/kvpool.h"
#include "mem/plan.h"

/* ---- footprints ---------------------------------------------------------- */

int reg_plan_footprint(const char *path, const engine_config *ec, uint64_t kv_per_model,
                       reg_footprint *out, kvant_err *err)
{
    gguf_ctx *g = gguf_open(path, err);
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
    plan_model pm;
    model_plan_shape(&hp, wb, &pm);
    plan_config pc = plan_config_default();
    pc.device_memory = PLAN_MAX_WEIGHTS; /* unbounded: only the shape matters here */
    pc.utilization = 1.0;
    pc.ctx = ec->max_model_len && ec->max_model_len < hp.n_ctx_train ? ec->max_model_len : 0;
    pc.block_size = ec->block_size;
    pc.max_num_seqs = ec->max_num_seqs;
    pc.max_num_batched_tokens = ec->max_num_batched_tokens;
    pc.kv_dtype = ec->kv_dtype;
    pc.act_q8 = (!ec->backend || strcmp(ec->backend, "cpu") == 0) && !ec->exact;
    int32_t n_live, n_snap; /* as the engine takes them (no budget cap: at most that) */
    pc.state_slots = engine_state_plan(ec, pm.state_bytes, 0, &n_live, &n_snap);
    plan_result p;
    int rc = plan_compute(&pm, &pc, &p, err);
    if (rc)
        return rc;
    const uint64_t bs = (uint64_t)ec->block_size;
    const uint64_t bb = p.kv_bytes_per_token * bs, ctx_blocks = ((uint64_t)p.ctx + bs - 1) / bs;
    uint64_t blocks = kv_per_model ? kv_per_model / bb : (uint64_t)REG_DEFAULT_KV_REQS * ctx_blocks;
    if (blocks * bs < (uint64_t)p.ctx)
        return kvant_err_set(err, KV_ENOMEM,
                             "--kv-per-model holds %llu tokens, less than one request of the "
                             "context (%lld tokens, %llu bytes)",
                             (unsigned long long)(blocks * bs), (long long)p.ctx,
                             (unsigned long long)(p.kv_bytes_per_token * (uint64_t)p.ctx));
    *out = (reg_footprint){
        .ctx = p.ctx,
        .head_dim = hp.head_dim,
        .weights = p.weights_bytes,
        .activations = p.activation_bytes,
        .act_q8 = p.act_q8_bytes,
        .block_bytes = bb,
        .kv_share = blocks * bb,
        .kv_max = (uint64_t)ec->max_num_seqs * ctx_blocks * bb,
        .state = p.state_bytes,
    };
    out->need = out->weights + out->activations + out->act_q8 + out->state + out->kv_share;
    return KV_OK;
}

uint64_t reg_plan_budget(uint64_t budget, uint64_t device_memory, uint64_t dev_total,
                         double utilization)
{
    const uint64_t dm = device_memory ? device_memory : dev_total;
    return budget ? budget : (uint64_t)((double)dm * utilization);
}

/* ---- the eviction policy ------------------------------------------------- */

int reg_pick(const reg_cand *c, int n, uint64_t need, uint64_t budget, uint64_t used,
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
    int taken[REG_MAX] = {0};
    while ((avail < need || slots < 1) && *n_victims < n && n <= REG_MAX) {
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

/* ---- KV beyond the share ------------------------------------------------- */

uint64_t reg_plan_spare(uint64_t avail, uint64_t reserve, uint64_t k, const reg_footprint *f)
{
    if (avail <= reserve || !k || !f->block_bytes)
        return 0;
    uint64_t extra = (avail - reserve) / k;
    const uint64_t room = f->kv_max > f->kv_share ? f->kv_max - f->kv_share : 0;
    extra = extra < room ? extra : room;
    return extra / f->block_bytes * f->block_bytes;
}

void reg_plan_grow(uint64_t avail, const reg_plan_pool *p, int n, int32_t *add)
{
    int k_room = 0;
    for (int i = 0; i < n; i++)
        k_room += p[i].blocks < p[i].max_blocks;
    const uint64_t part = k_room ? avail / (uint64_t)k_room : 0;
    for (int i = 0; i < n; i++) {
        const uint64_t room = p[i].max_blocks > p[i].blocks
                                  ? (uint64_t)(p[i].max_blocks - p[i].blocks) : 0;
        const uint64_t a = p[i].block_bytes ? part / p[i].block_bytes : 0;
        add[i] = (int32_t)(a < room ? a : room);
    }
}

int reg_plan_reclaim(const reg_plan_pool *p, int n, uint64_t deficit, int *idx, int32_t *cut)
{
    int nm = 0;
    uint64_t planned = 0;
    while (planned < deficit && nm < n) {
        int best = -1;
        for (int i = 0; i < n; i++) {
            int taken = 0;
            for (int k = 0; k < nm; k++)
                taken |= idx[k] == i;
            if (p[i].skip || taken || p[i].blocks <= p[i].min_blocks || !p[i].block_bytes)
                continue;
            const reg_plan_pool *b = best >= 0 ? &p[best] : NULL;
            if (!b || (p[i].busy > 0) < (b->busy > 0) ||
                ((p[i].busy > 0) == (b->busy > 0) && p[i].last_used < b->last_used))
                best = i;
        }
        if (best < 0)
            break;
        const uint64_t left = deficit - planned, bb = p[best].block_bytes;
        int64_t c = (int64_t)((left + bb - 1) / bb);
        const int64_t grown = p[best].blocks - p[best].min_blocks;
        c = c < grown ? c : grown;
        idx[nm] = best;
        cut[nm++] = (int32_t)c;
        planned += (uint64_t)c * bb;
    }
    return nm;
}

int reg_plan_scratch(const engine_config *ec, int32_t head_dim, uint64_t *extra, uint64_t *alloc,
                     kvant_err *err)
{
    backend_device_info dev;
    *extra = *alloc = 0;
    int rc = backend_query(ec->backend, ec->device, &dev, err);
    if (rc)
        return rc;
    mem_report *rep = malloc(sizeof *rep);
    mem_mgr *mem = rep ? mem_create(UINT64_MAX / 4, dev.alloc, err) : NULL;
    backend *be = mem ? backend_create(ec->backend, ec->device, mem, ec->n_threads,
                                       (ec->exact ? BACKEND_EXACT : 0) |
                                           (ec->no_pack ? BACKEND_NO_PACK : 0), err)
                      : NULL;
    if (!be) {
        rc = !rep ? kvant_err_set(err, KV_ENOMEM, "out of memory")
                  : err->code ? err->code : KV_EUNSUP;
        goto out;
    }
    /* the fields the backends' kv_extra_bytes read (engine.c setup_backend);
     * one layer, one block for kv_init (no weights: no int8 activations) */
    kv_layout lay = {.n_layers = 1, .n_blocks = 1, .block_size = ec->block_size, .n_kv_heads = 1,
                     .head_dim = head_dim, .dtype = ec->kv_dtype,
                     .max_tokens = ec->max_num_batched_tokens};
    *extra = be->ops->kv_extra_bytes ? be->ops->kv_extra_bytes(be, &lay) : 0;
    rc = be->ops->kv_init(be, &lay, err);
    if (rc == KV_OK) {
        mem_get_report(mem, rep);
        *alloc = rep->cat[MEM_WORKSPACE].current;
    }
out:
    if (be)
        be->ops->destroy(be);
    mem_destroy(mem);
    free(rep);
    return rc;
}

/* ---- start-up played out ------------------------------------------------- */

static uint64_t state_sum(const reg_plan_state *s)
{
    uint64_t t = 0;
    for (int c = 0; c < MEM_CAT_COUNT; c++) /* the budget's: pinned host memory is not */
        t += mem_cat_in_budget((mem_cat)c) ? s->resident[c] : 0;
    return t;
}

static uint64_t state_used(const reg_plan_start_in *in, const reg_plan_state *s)
{
    uint64_t t = 0;
    for (int i = 0; i < in->n; i++)
        t += s[i].loaded ? state_sum(&s[i]) : 0;
    return t;
}

/* The loaded pools as reg_plan_grow / reg_plan_reclaim see them; skip the
 * ones not loaded (and xi). */
static void state_pools(const reg_plan_start_in *in, const reg_plan_state *s, const double *lu,
                        int xi, reg_plan_pool *p)
{
    for (int i = 0; i < in->n; i++)
        p[i] = (reg_plan_pool){s[i].kv_blocks, s[i].kv_min_blocks, s[i].kv_max_blocks,
                               in->m[i].f.block_bytes, 0, lu[i],
                               i == xi || !s[i].loaded || s[i].kv_blocks <= 0};
}

static void state_resize(const reg_plan_start_in *in, reg_plan_state *s, int i, int32_t d)
{
    s[i].kv_blocks += d;
    s[i].resident[MEM_KV] += (uint64_t)(int64_t)d * in->m[i].f.block_bytes; /* wraps back */
}

/* The eviction policy's view of the loaded models for a load of xi (as
 * registry.c choose_victims: a pinned pool's growth can shrink back). */
static int state_pick(const reg_plan_start_in *in, const reg_plan_state *s, const double *lu,
                      int xi, int *victims, int *nv)
{
    reg_cand c[REG_MAX];
    for (int i = 0; i < in->n; i++) {
        const uint64_t grown = s[i].kv_blocks > s[i].kv_min_blocks
                                   ? (uint64_t)(s[i].kv_blocks - s[i].kv_min_blocks) *
                                         in->m[i].f.block_bytes
                                   : 0;
        c[i] = (reg_cand){state_sum(&s[i]) - (s[i].pinned ? grown : 0), lu[i],
                          s[i].loaded && i != xi, 0, s[i].pinned};
    }
    return reg_pick(c, in->n, in->m[xi].f.need, in->budget, state_used(in, s), REG_MAX_RESIDENT,
                    victims, nv);
}

/* Loads xi with kv_extra beyond its share, as engine_create sizes it from
 * the footprint: the pool less the blocks held for the backend's scratch. */
static int state_load(const reg_plan_start_in *in, reg_plan_state *s, int xi, uint64_t kv_extra,
                      kvant_err *err)
{
    const reg_plan_model *m = &in->m[xi];
    const uint64_t bb = m->f.block_bytes;
    const int64_t held = (int64_t)((m->scratch + bb - 1) / bb);
    const int64_t blocks = (int64_t)((m->f.kv_share + kv_extra) / bb) - held;
    if (blocks < 1)
        return kvant_err_set(err, KV_ENOMEM, "no memory left for the KV pool");
    int64_t max = in->elastic ? (int64_t)(m->f.kv_max / bb) : 0;
    max = max > blocks ? max : blocks;
    if (max > KVPOOL_MAX_BLOCKS)
        max = KVPOOL_MAX_BLOCKS > blocks ? KVPOOL_MAX_BLOCKS : blocks;
    reg_plan_state *x = &s[xi];
    x->loaded = 1;
    x->kv_extra = kv_extra;
    x->kv_blocks = x->kv_min_blocks = (int32_t)blocks;
    x->kv_max_blocks = (int32_t)max;
    memset(x->resident, 0, sizeof x->resident);
    x->resident[MEM_WEIGHTS] = m->f.weights;
    x->resident[MEM_ACTIVATIONS] = m->f.activations;
    x->resident[MEM_WORKSPACE] = m->f.act_q8 + m->scratch_alloc;
    x->resident[MEM_KV] = (uint64_t)blocks * bb;
    return KV_OK;
}

/* Every elastic pool grows into the free budget (reg_kv_grow_locked). */
static void state_grow(const reg_plan_start_in *in, reg_plan_state *s, const double *lu)
{
    reg_plan_pool p[REG_MAX];
    int32_t add[REG_MAX];
    int map[REG_MAX], n = 0;
    if (!in->elastic)
        return;
    state_pools(in, s, lu, -1, p);
    for (int i = 0; i < in->n; i++)
        if (!p[i].skip) {
            p[n] = p[i];
            map[n++] = i;
        }
    const uint64_t used = state_used(in, s);
    reg_plan_grow(used < in->budget ? in->budget - used : 0, p, n, add);
    for (int k = 0; k < n; k++)
        state_resize(in, s, map[k], add[k]);
}

/* Spare KV for a fixed pool's load of xi (registry.c spare_kv_locked). */
static uint64_t state_spare(const reg_plan_start_in *in, const reg_plan_state *s, int xi)
{
    uint64_t reserve = 0, k = 0;
    if (!in->kv_grow)
        return 0;
    for (int i = 0; i < in->n; i++)
        if (!s[i].loaded && in->m[i].ok && in->m[i].f.need <= in->budget) {
            reserve += in->m[i].f.need;
            k++;
        }
    const uint64_t used = state_used(in, s);
    return reg_plan_spare(used < in->budget ? in->budget - used : 0, reserve, k, &in->m[xi].f);
}

/* Admits xi (registry.c bring_up_locked at start: nothing busy, nothing
 * else changing): KV_OK with its victims chosen, or the refusal. */
static int state_admit(const reg_plan_start_in *in, reg_plan_state *s, const double *lu, int xi,
                       int *victims, int *nv, kvant_err *err)
{
    const reg_footprint *f = &in->m[xi].f;
    for (int reclaimed = 0;; reclaimed = 1) {
        const int fit = state_pick(in, s, lu, xi, victims, nv);
        const uint64_t used = state_used(in, s);
        const uint64_t avail = used < in->budget ? in->budget - used : 0;
        if (fit != SRV_FIT_NEVER && (fit == SRV_FIT_WAIT || *nv > 0) && !reclaimed &&
            in->elastic && f->need > avail) {
            reg_plan_pool p[REG_MAX];
            int idx[REG_MAX];
            int32_t cut[REG_MAX];
            state_pools(in, s, lu, xi, p);
            const int nm = reg_plan_reclaim(p, in->n, f->need - avail, idx, cut);
            for (int k = 0; k < nm; k++)
                state_resize(in, s, idx[k], -cut[k]);
            continue;
        }
        if (fit == SRV_FIT_OK)
            return KV_OK;
        if (fit == SRV_FIT_NEVER)
            return kvant_err_set(err, KV_ENOMEM,
                                 "needs %llu bytes: it cannot fit in the budget of %llu bytes%s",
                                 (unsigned long long)f->need,
                                 (unsigned long long)in->budget,
                                 f->need > in->budget ? "" : " next to the pinned models");
        return kvant_err_set(err, KV_ENOMEM,
                             "needs %llu bytes: it waits for memory that no model at start "
                             "frees (the start fails after --queue-timeout)",
                             (unsigned long long)f->need);
    }
}

int reg_plan_start(const reg_plan_start_in *in, reg_plan_state *out, uint64_t *used, int *failed,
                   kvant_err *err)
{
    double lu[REG_MAX] = {0};
    double clock = 0;
    *failed = -1;
    if (in->n < 0 || in->n > REG_MAX)
        return kvant_err_set(err, KV_ERANGE, "%d models: at most %d", in->n, REG_MAX);
    memset(out, 0, sizeof *out * (size_t)in->n);
    for (int k = 0; k < in->n_order; k++) {
        const int xi = in->order[k];
        int victims[REG_MAX], nv = 0, rc = KV_OK;
        if (xi < 0 || xi >= in->n)
            return kvant_err_set(err, KV_EINVAL, "start order: model %d of %d", xi, in->n);
        out[xi].pinned |= in->pin[k];
        if (out[xi].loaded)
            continue;
        if (!in->m[xi].ok)
            rc = kvant_err_set(err, KV_EFORMAT, "its footprint could not be planned");
        if (rc == KV_OK)
            rc = state_admit(in, out, lu, xi, victims, &nv, err);
        const uint64_t extra = nv || in->elastic || rc ? 0 : state_spare(in, out, xi);
        for (int v = 0; rc == KV_OK && v < nv; v++) {
            const int pinned = out[victims[v]].pinned;
            memset(&out[victims[v]], 0, sizeof out[0]);
            out[victims[v]].pinned = pinned;
            out[victims[v]].evicted = 1;
        }
        if (rc == KV_OK)
            rc = state_load(in, out, xi, extra, err);
        if (rc) {
            *failed = xi;
            *used = state_used(in, out);
            return rc;
        }
        lu[xi] = ++clock;
        state_grow(in, out, lu);
    }
    *used = state_used(in, out);
    return KV_OK;
}
