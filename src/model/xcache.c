/* xcache.c - the expert cache (see xcache.h).
 *
 * A slot holds [gate rows | up rows | down rows] of one expert, each part at
 * a 64-byte offset; `where` maps (layer, expert) to its slot (-1: not
 * resident), `owner` the other way.  The victim is the unpinned slot whose
 * expert was used least so far (hits + misses: measured use, which keeps a
 * layer's hot experts when one token's experts over all layers outnumber the
 * slots and least-recently-used would evict each before its next use), the
 * one used longest ago (a tick per xcache_get) among equals.
 */
#include "model/xcache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct xcache {
    model *m;
    mem_mgr *mem;
    int fd;
    int32_t n_slots, n_layers, n_expert;
    uint64_t slot_bytes;
    uint8_t *base;          /* [n_slots][slot_bytes], MEM_WEIGHTS */
    int32_t *where;         /* [n_layers * n_expert] slot, or -1 */
    int32_t *owner;         /* [n_slots] layer * n_expert + expert, or -1 */
    uint64_t *last;         /* [n_slots] tick of its last use */
    uint8_t *pinned;        /* [n_slots] */
    uint64_t tick;
    uint64_t *hits, *misses; /* [n_layers * n_expert] */
    uint64_t bytes_read;
    int marked;             /* the expert tensors are marked streamed */
};

static uint64_t align64(uint64_t v)
{
    return (v + 63) / 64 * 64;
}

/* The three stacked tensors of layer L and one expert's rows of each. */
static void parts(const model_layer *L, const model_tensor *t[3], int64_t rows[3])
{
    t[0] = &L->gate_exps, t[1] = &L->up_exps, t[2] = &L->down_exps;
    for (int i = 0; i < 3; i++)
        rows[i] = t[i]->ne[1] / L->n_expert;
}

static uint64_t layer_slot_bytes(const model_layer *L)
{
    const model_tensor *t[3];
    int64_t rows[3];
    parts(L, t, rows);
    uint64_t b = 0;
    for (int i = 0; i < 3; i++)
        b += align64((uint64_t)rows[i] * t[i]->row_bytes);
    return b;
}

uint64_t xcache_slot_bytes(const model *m)
{
    uint64_t b = 0;
    for (int32_t il = 0; m->layers && il < m->hp.n_layers; il++)
        if (m->layers[il].n_expert && layer_slot_bytes(&m->layers[il]) > b)
            b = layer_slot_bytes(&m->layers[il]);
    return b;
}

uint64_t xcache_expert_bytes(const model *m)
{
    uint64_t b = 0;
    for (int32_t il = 0; m->layers && il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (L->n_expert)
            b += L->gate_exps.nbytes + L->up_exps.nbytes + L->down_exps.nbytes;
    }
    return b;
}

static int32_t most_used(const model *m)
{
    int32_t used = 0;
    for (int32_t il = 0; il < m->hp.n_layers; il++)
        used = m->layers[il].n_expert_used > used ? m->layers[il].n_expert_used : used;
    return used;
}

int xcache_plan(const model *m, uint64_t weights_memory, int32_t *n_slots,
                uint64_t *weights_bytes, kvant_err *err)
{
    *n_slots = 0;
    *weights_bytes = m->weights_bytes;
    if (weights_memory >= m->weights_bytes)
        return KV_OK;
    const uint64_t dense = m->weights_bytes - xcache_expert_bytes(m), slot = xcache_slot_bytes(m);
    const int32_t used = most_used(m);
    const uint64_t least = dense + (uint64_t)used * slot;
    if (!slot || weights_memory < least) {
        char a[32], b[32], c[32];
        return kvant_err_set(err, KV_ENOMEM, "--weights-memory %s: the dense weights and the "
                             "routers (%s) and one token's %d experts need at least %s",
                             mem_format_size(weights_memory, a, 32),
                             mem_format_size(dense, b, 32), used,
                             mem_format_size(least, c, 32));
    }
    uint64_t n = (weights_memory - dense) / slot;
    const uint64_t all = (uint64_t)m->hp.n_layers * m->hp.fam.n_expert;
    *n_slots = (int32_t)(n < all ? n : all);
    *weights_bytes = dense + (uint64_t)*n_slots * slot;
    return KV_OK;
}

void xcache_plan_describe(const model *m, uint64_t weights_memory, int32_t n_slots,
                          uint64_t weights_bytes, char *buf, size_t cap)
{
    char a[32], b[32];
    if (n_slots == 0)
        snprintf(buf, cap, "warning: --weights-memory %s holds every weight: the model fits, "
                 "no expert is cached", mem_format_size(weights_memory, a, 32));
    else
        snprintf(buf, cap, "experts placed by memory: %d of %u experts in cache slots, weights "
                 "%s of %s resident", n_slots, (unsigned)(m->hp.n_layers * m->hp.fam.n_expert),
                 mem_format_size(weights_bytes, a, 32), mem_format_size(m->weights_bytes, b, 32));
}

/* Expert tensors streamed (dev NULL: only slot views are read) or back on
 * the mapping. */
static void mark(model *m, int streamed)
{
    for (int32_t il = 0; il < m->hp.n_layers; il++) {
        model_layer *L = &m->layers[il];
        model_tensor *t[3] = {&L->gate_exps, &L->up_exps, &L->down_exps};
        for (int i = 0; L->n_expert && i < 3; i++) {
            t[i]->streamed = streamed;
            t[i]->dev = streamed ? NULL : (void *)t[i]->data;
        }
    }
}

void xcache_destroy(xcache *xc)
{
    if (!xc)
        return;
    if (xc->marked)
        mark(xc->m, 0);
    if (xc->fd >= 0)
        close(xc->fd);
    mem_free(xc->mem, xc->base);
    free(xc->where);
    free(xc->owner);
    free(xc->last);
    free(xc->pinned);
    free(xc->hits);
    free(xc->misses);
    free(xc);
}

xcache *xcache_create(model *m, mem_mgr *mem, int32_t n_slots, kvant_err *err)
{
    const int32_t used = most_used(m);
    if (!used || n_slots < used) {
        kvant_err_set(err, KV_EINVAL, "expert cache: %d slots, a token uses %d experts", n_slots,
                      used);
        return NULL;
    }
    xcache *xc = calloc(1, sizeof *xc);
    if (!xc) {
        kvant_err_set(err, KV_ENOMEM, "expert cache: out of memory");
        return NULL;
    }
    xc->m = m, xc->mem = mem, xc->n_slots = n_slots, xc->fd = -1;
    const size_t n_ids = (size_t)m->hp.n_layers * m->hp.fam.n_expert;
    if (!(xc->where = malloc(n_ids * sizeof *xc->where)) ||
        !(xc->owner = malloc((size_t)n_slots * sizeof *xc->owner)) ||
        !(xc->last = calloc((size_t)n_slots, sizeof *xc->last)) ||
        !(xc->pinned = calloc((size_t)n_slots, 1)) || !(xc->hits = calloc(n_ids, 8)) ||
        !(xc->misses = calloc(n_ids, 8))) {
        kvant_err_set(err, KV_ENOMEM, "expert cache: out of memory");
        xcache_destroy(xc);
        return NULL;
    }
    xc->n_layers = m->hp.n_layers, xc->n_expert = (int32_t)m->hp.fam.n_expert;
    xc->slot_bytes = xcache_slot_bytes(m);
    memset(xc->where, 0xff, n_ids * sizeof *xc->where);
    memset(xc->owner, 0xff, (size_t)n_slots * sizeof *xc->owner);
    xc->base = mem_alloc(mem, (size_t)(xc->slot_bytes * (uint64_t)n_slots), MEM_WEIGHTS,
                         MEM_NO_LAYER, err);
    xc->fd = xc->base ? open(m->path, O_RDONLY | O_CLOEXEC) : -1;
    if (!xc->base || xc->fd < 0) {
        if (xc->base)
            kvant_err_set(err, KV_EIO, "expert cache: %s: %s", m->path, strerror(errno));
        xcache_destroy(xc);
        return NULL;
    }
    mark(m, 1);
    xc->marked = 1;
    return xc;
}

/* Reads expert e of layer L into slot s. */
static int fill(xcache *xc, const model_layer *L, int32_t e, int32_t s, kvant_err *err)
{
    const model_tensor *t[3];
    int64_t rows[3];
    parts(L, t, rows);
    uint8_t *dst = xc->base + (uint64_t)s * xc->slot_bytes;
    for (int i = 0; i < 3; i++) {
        const size_t n = (size_t)rows[i] * t[i]->row_bytes;
        const off_t off = (off_t)(t[i]->file_off + (uint64_t)e * n);
        size_t got = 0;
        while (got < n) {
            const ssize_t r = pread(xc->fd, dst + got, n - got, off + (off_t)got);
            if (r <= 0)
                return kvant_err_set(err, KV_EIO, "expert cache: layer %d expert %d: %s read of "
                                     "%s", L->gate_exps.layer, e, r < 0 ? strerror(errno) : "short",
                                     xc->m->path);
            got += (size_t)r;
        }
        __atomic_add_fetch(&xc->bytes_read, n, __ATOMIC_RELAXED);
        dst += align64(n);
    }
    return KV_OK;
}

static void views_of(const xcache *xc, const model_layer *L, int32_t s, model_tensor views[3])
{
    const model_tensor *t[3];
    int64_t rows[3];
    parts(L, t, rows);
    uint8_t *p = xc->base + (uint64_t)s * xc->slot_bytes;
    for (int i = 0; i < 3; i++) {
        views[i] = *t[i];
        views[i].ne[1] = rows[i];
        views[i].nbytes = (uint64_t)rows[i] * t[i]->row_bytes;
        views[i].data = NULL;
        views[i].dev = p;
        views[i].packed = 0;
        p += align64(views[i].nbytes);
    }
}

static uint64_t uses(const xcache *xc, int32_t s)
{
    return xc->hits[xc->owner[s]] + xc->misses[xc->owner[s]];
}

/* The unpinned slot of the least used expert, the least recently used among
 * equals (an empty slot first), or -1. */
static int32_t victim(const xcache *xc)
{
    int32_t best = -1;
    uint64_t best_uses = 0;
    for (int32_t s = 0; s < xc->n_slots; s++) {
        if (xc->pinned[s])
            continue;
        if (xc->owner[s] < 0)
            return s;
        const uint64_t u = uses(xc, s);
        if (best < 0 || u < best_uses || (u == best_uses && xc->last[s] < xc->last[best]))
            best = s, best_uses = u;
    }
    return best;
}

int xcache_get(xcache *xc, int32_t il, int32_t e, model_tensor views[3], kvant_err *err)
{
    const model_layer *L = &xc->m->layers[il];
    const int32_t id = il * xc->n_expert + e;
    int32_t s = xc->where[id];
    if (s >= 0) {
        __atomic_add_fetch(&xc->hits[id], 1, __ATOMIC_RELAXED);
    } else {
        if ((s = victim(xc)) < 0)
            return kvant_err_set(err, KV_ENOMEM, "expert cache: all %d slots pinned",
                                 xc->n_slots);
        if (xc->owner[s] >= 0)
            __atomic_store_n(&xc->where[xc->owner[s]], -1, __ATOMIC_RELAXED);
        xc->owner[s] = -1;
        int rc = fill(xc, L, e, s, err);
        if (rc)
            return rc;
        xc->owner[s] = id;
        __atomic_store_n(&xc->where[id], s, __ATOMIC_RELAXED);
        __atomic_add_fetch(&xc->misses[id], 1, __ATOMIC_RELAXED);
    }
    xc->last[s] = ++xc->tick;
    xc->pinned[s] = 1;
    views_of(xc, L, s, views);
    return KV_OK;
}

void xcache_unpin(xcache *xc)
{
    memset(xc->pinned, 0, (size_t)xc->n_slots);
}

int32_t xcache_slots(const xcache *xc)
{
    return xc->n_slots;
}

void xcache_get_stats(const xcache *xc, xcache_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_layers = xc->n_layers;
    out->n_expert = xc->n_expert;
    out->n_slots = xc->n_slots;
    out->slot_bytes = xc->slot_bytes;
    out->bytes_read = __atomic_load_n(&xc->bytes_read, __ATOMIC_RELAXED);
    const int64_t n_ids = (int64_t)xc->n_layers * xc->n_expert;
    for (int64_t i = 0; i < n_ids; i++) {
        out->hits += __atomic_load_n(&xc->hits[i], __ATOMIC_RELAXED);
        out->misses += __atomic_load_n(&xc->misses[i], __ATOMIC_RELAXED);
        out->n_used += __atomic_load_n(&xc->where[i], __ATOMIC_RELAXED) >= 0;
    }
}

void xcache_expert(const xcache *xc, int32_t il, int32_t e, uint64_t *hits, uint64_t *misses,
                   int *resident)
{
    const int32_t id = il * xc->n_expert + e;
    *hits = __atomic_load_n(&xc->hits[id], __ATOMIC_RELAXED);
    *misses = __atomic_load_n(&xc->misses[id], __ATOMIC_RELAXED);
    *resident = __atomic_load_n(&xc->where[id], __ATOMIC_RELAXED) >= 0;
}
