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

#include "model/wstream.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The replacement policy's state: which expert each slot holds and the
 * counts the victim is chosen by.  The cache and its simulation
 * (xcache_predict) share it, so the prediction replays the same policy. */
typedef struct xpol {
    int32_t n_slots;
    int32_t *where;         /* [n_ids] slot, or -1 */
    int32_t *owner;         /* [n_slots] layer * n_expert + expert, or -1 */
    uint64_t *last;         /* [n_slots] tick of its last use */
    uint8_t *pinned;        /* [n_slots] */
    uint64_t tick;
    uint64_t *hits, *misses; /* [n_ids] */
} xpol;

struct xcache {
    model *m;
    mem_mgr *mem;
    int fd;
    int layout_direct;      /* xcache_create's direct: parts laid out for aligned reads */
    int dfd;                /* O_DIRECT reads (asked for and not refused), or -1 */
    char io_note[200];      /* why direct reads are off when asked for, or "" */
    void *alloc;            /* the slots' allocation (base rounded up in it) */
    int32_t n_layers, n_expert;
    uint64_t slot_bytes;
    uint8_t *base;          /* [n_slots][slot_bytes], MEM_WEIGHTS */
    xpol p;
    uint64_t bytes_read;
    int marked;             /* the expert tensors are marked streamed */
    int failed;             /* a read came back short or failed (sticky; release/acquire) */
    int failing;            /* claimed by the read that writes error */
    char error[KV_ERR_MSG_MAX]; /* its message, written before failed is set */
    int32_t *trace;         /* xcache_trace's buffer (borrowed), or NULL */
    int64_t trace_cap, trace_n;
};

static void trace_put(xcache *xc, int32_t v);

static void xpol_free(xpol *p)
{
    free(p->where);
    free(p->owner);
    free(p->last);
    free(p->pinned);
    free(p->hits);
    free(p->misses);
    memset(p, 0, sizeof *p);
}

/* Empty slots, zero counts; KV_ENOMEM (p freed) when out of memory. */
static int xpol_init(xpol *p, int64_t n_ids, int32_t n_slots)
{
    memset(p, 0, sizeof *p);
    p->n_slots = n_slots;
    if (!(p->where = malloc((size_t)n_ids * sizeof *p->where)) ||
        !(p->owner = malloc((size_t)n_slots * sizeof *p->owner)) ||
        !(p->last = calloc((size_t)n_slots, sizeof *p->last)) ||
        !(p->pinned = calloc((size_t)n_slots, 1)) || !(p->hits = calloc((size_t)n_ids, 8)) ||
        !(p->misses = calloc((size_t)n_ids, 8))) {
        xpol_free(p);
        return KV_ENOMEM;
    }
    memset(p->where, 0xff, (size_t)n_ids * sizeof *p->where);
    memset(p->owner, 0xff, (size_t)n_slots * sizeof *p->owner);
    return KV_OK;
}

static uint64_t align64(uint64_t v)
{
    return (v + 63) / 64 * 64;
}

#define XC_A WSTREAM_DIO_ALIGN

static uint64_t align_a(uint64_t v)
{
    return (v + XC_A - 1) / XC_A * XC_A;
}

/* Bytes of one part of n bytes in a slot: 64-aligned, or (direct) room for
 * the aligned region around it, wherever it starts. */
static uint64_t part_bytes(uint64_t n, int direct)
{
    return direct ? align_a(n) + XC_A : align64(n);
}

static uint64_t layer_slot_bytes(const model_layer *L, int direct)
{
    const model_tensor *t[3];
    int64_t row0[3], rows[3];
    model_expert_rows(L, 0, t, row0, rows);
    uint64_t b = 0;
    for (int i = 0; i < 3; i++)
        b += part_bytes((uint64_t)rows[i] * t[i]->row_bytes, direct);
    return b;
}

uint64_t xcache_slot_bytes(const model *m, int direct)
{
    uint64_t b = 0;
    for (int32_t il = 0; m->layers && il < m->hp.n_layers; il++)
        if (m->layers[il].n_expert && layer_slot_bytes(&m->layers[il], direct) > b)
            b = layer_slot_bytes(&m->layers[il], direct);
    return b;
}

uint64_t xcache_expert_bytes(const model *m)
{
    uint64_t b = 0;
    for (int32_t il = 0; m->layers && il < m->hp.n_layers; il++) {
        const model_layer *L = &m->layers[il];
        if (L->n_expert)
            b += L->gate_exps.nbytes + L->up_exps.nbytes + L->gate_up_exps.nbytes +
                 L->down_exps.nbytes;
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

int xcache_plan(const model *m, uint64_t weights_memory, int direct, int32_t *n_slots,
                uint64_t *weights_bytes, kvant_err *err)
{
    *n_slots = 0;
    *weights_bytes = m->weights_bytes;
    if (weights_memory >= m->weights_bytes)
        return KV_OK;
    const uint64_t dense = m->weights_bytes - xcache_expert_bytes(m),
                   slot = xcache_slot_bytes(m, direct);
    const int32_t used = most_used(m);
    const uint64_t slack = direct ? XC_A : 0; /* the base aligned within the allocation */
    const uint64_t least = dense + (uint64_t)used * slot + slack;
    if (!slot || weights_memory < least) {
        char a[32], b[32], c[32];
        return kvant_err_set(err, KV_ENOMEM, "--weights-memory %s: the dense weights and the "
                             "routers (%s) and one token's %d experts need at least %s",
                             mem_format_size(weights_memory, a, 32),
                             mem_format_size(dense, b, 32), used,
                             mem_format_size(least, c, 32));
    }
    const uint64_t n = (weights_memory - dense - slack) / slot;
    const uint64_t all = (uint64_t)m->hp.n_layers * m->hp.fam.n_expert;
    *n_slots = (int32_t)(n < all ? n : all);
    *weights_bytes = dense + (uint64_t)*n_slots * slot + slack;
    return KV_OK;
}

int xcache_options(int stream_io, int weights_place, int stream_buffers, int *direct,
                   kvant_err *err)
{
    *direct = stream_io == WSTREAM_IO_DIRECT;
    if (stream_io == WSTREAM_IO_BOTH)
        return kvant_err_set(err, KV_EUNSUP, "--stream-io both: a mixture of experts reads one "
                             "expert at a time into its cache (buffered or direct)");
    if (weights_place)
        return kvant_err_set(err, KV_EUNSUP, "--weights-place: a mixture of experts is placed by "
                             "expert (its dense weights resident), not by layer");
    if (stream_buffers)
        return kvant_err_set(err, KV_EUNSUP, "--stream-buffers: a mixture of experts keeps its "
                             "experts in cache slots that --weights-memory sizes, not in staging "
                             "buffers");
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
        model_tensor *t[4] = {&L->gate_exps, &L->up_exps, &L->gate_up_exps, &L->down_exps};
        for (int i = 0; L->n_expert && i < 4; i++) {
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
    if (xc->dfd >= 0)
        close(xc->dfd);
    mem_free(xc->mem, xc->alloc);
    xpol_free(&xc->p);
    free(xc);
}

/* O_DIRECT: opened, and an aligned block read into slot 0; where either is
 * refused, reads go through the page cache and io_note says why. */
static void direct_probe(xcache *xc)
{
    const model_tensor *t[3];
    int64_t row0[3], rows[3];
    const model_layer *L = xc->m->layers;
    while (!L->n_expert)
        L++;
    model_expert_rows(L, 0, t, row0, rows);
    xc->dfd = wstream_direct_open(xc->m->path, NULL, t[0]->file_off, xc->base, xc->io_note,
                                  sizeof xc->io_note);
}

xcache *xcache_create(model *m, mem_mgr *mem, int32_t n_slots, int direct, kvant_err *err)
{
    const int32_t used = most_used(m);
    if (!used || n_slots < used) {
        kvant_err_set(err, KV_EINVAL, "expert cache: %d slots, a token uses %d experts", n_slots,
                      used);
        return NULL;
    }
    xcache *xc = calloc(1, sizeof *xc);
    if (!xc || xpol_init(&xc->p, (int64_t)m->hp.n_layers * m->hp.fam.n_expert, n_slots)) {
        free(xc);
        kvant_err_set(err, KV_ENOMEM, "expert cache: out of memory");
        return NULL;
    }
    xc->m = m, xc->mem = mem, xc->fd = xc->dfd = -1, xc->layout_direct = direct != 0;
    xc->n_layers = m->hp.n_layers, xc->n_expert = (int32_t)m->hp.fam.n_expert;
    xc->slot_bytes = xcache_slot_bytes(m, direct);
    const uint64_t slack = direct ? XC_A : 0;
    xc->alloc = mem_alloc(mem, (size_t)(xc->slot_bytes * (uint64_t)n_slots + slack), MEM_WEIGHTS,
                          MEM_NO_LAYER, err);
    xc->base = xc->alloc && direct ? (uint8_t *)(uintptr_t)align_a((uintptr_t)xc->alloc)
                                   : xc->alloc;
    xc->fd = xc->base ? open(m->path, O_RDONLY | O_CLOEXEC) : -1;
    if (!xc->base || xc->fd < 0) {
        if (xc->base)
            kvant_err_set(err, KV_EIO, "expert cache: %s: %s", m->path, strerror(errno));
        xcache_destroy(xc);
        return NULL;
    }
    if (direct)
        direct_probe(xc);
    mark(m, 1);
    xc->marked = 1;
    return xc;
}

/* Where part i of expert e lands in slot s: its first byte (views point
 * there) and, with O_DIRECT, the aligned file region read around it. */
typedef struct xc_part {
    uint8_t *at;
    size_t n;          /* the part's bytes */
    off_t off;         /* its file offset */
    off_t a0;          /* direct: the aligned region [a0, a0 + an) */
    size_t an;
    uint8_t *dst;      /* direct: where that region is read */
} xc_part;

static void part_of(const xcache *xc, const model_layer *L, int32_t e, int32_t s, xc_part p[3])
{
    const model_tensor *t[3];
    int64_t row0[3], rows[3];
    model_expert_rows(L, e, t, row0, rows);
    uint8_t *q = xc->base + (uint64_t)s * xc->slot_bytes;
    for (int i = 0; i < 3; i++) {
        p[i].n = (size_t)rows[i] * t[i]->row_bytes;
        p[i].off = (off_t)(t[i]->file_off + (uint64_t)row0[i] * t[i]->row_bytes);
        p[i].a0 = p[i].off - p[i].off % XC_A;
        p[i].an = (size_t)(align_a((uint64_t)(p[i].off + (off_t)p[i].n)) - (uint64_t)p[i].a0);
        p[i].dst = q;
        p[i].at = q + (xc->layout_direct ? p[i].off % XC_A : 0);
        q += part_bytes(p[i].n, xc->layout_direct);
    }
}

/* Reads len bytes at off into dst; the bytes read (short at the end of the file), or -1. */
static ssize_t read_all(int fd, uint8_t *dst, size_t len, off_t off)
{
    size_t got = 0;
    while (got < len) {
        const ssize_t r = pread(fd, dst + got, len - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 && got == 0 ? -1 : (ssize_t)got;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Reads expert e of layer L into slot s. */
static int fill(xcache *xc, const model_layer *L, int32_t e, int32_t s, kvant_err *err)
{
    xc_part p[3];
    part_of(xc, L, e, s, p);
    for (int i = 0; i < 3; i++) {
        ssize_t r;
        int ok;
        if (xc->dfd >= 0) { /* the aligned region; past the end of the file it comes back short */
            r = read_all(xc->dfd, p[i].dst, p[i].an, p[i].a0);
            ok = r >= (ssize_t)(p[i].off - p[i].a0) + (ssize_t)p[i].n;
        } else {
            r = read_all(xc->fd, p[i].at, p[i].n, p[i].off);
            ok = r == (ssize_t)p[i].n;
        }
        if (!ok) {
            kvant_err_set(err, KV_EIO, "expert cache: layer %d expert %d: %s read of %s (the "
                          "file was truncated or replaced)", L->down_exps.layer, e,
                          r < 0 ? strerror(errno) : "short", xc->m->path);
            int none = 0; /* the first failure's message, once (reads may run side by side) */
            if (__atomic_compare_exchange_n(&xc->failing, &none, 1, 0, __ATOMIC_ACQ_REL,
                                            __ATOMIC_RELAXED)) {
                snprintf(xc->error, sizeof xc->error, "%s", err->msg);
                __atomic_store_n(&xc->failed, 1, __ATOMIC_RELEASE);
            }
            return KV_EIO;
        }
        __atomic_add_fetch(&xc->bytes_read, p[i].n, __ATOMIC_RELAXED);
    }
    return KV_OK;
}

static void views_of(const xcache *xc, const model_layer *L, int32_t e, int32_t s,
                     model_tensor views[3])
{
    const model_tensor *t[3];
    int64_t row0[3], rows[3];
    model_expert_rows(L, e, t, row0, rows);
    xc_part p[3];
    part_of(xc, L, e, s, p);
    for (int i = 0; i < 3; i++) {
        views[i] = *t[i];
        views[i].ne[1] = rows[i];
        views[i].nbytes = p[i].n;
        views[i].data = NULL;
        views[i].dev = p[i].at;
        views[i].packed = 0;
    }
}

static uint64_t uses(const xpol *p, int32_t s)
{
    return p->hits[p->owner[s]] + p->misses[p->owner[s]];
}

/* The unpinned slot of the least used expert, the least recently used among
 * equals (an empty slot first), or -1. */
static int32_t victim(const xpol *p)
{
    int32_t best = -1;
    uint64_t best_uses = 0;
    for (int32_t s = 0; s < p->n_slots; s++) {
        if (p->pinned[s])
            continue;
        if (p->owner[s] < 0)
            return s;
        const uint64_t u = uses(p, s);
        if (best < 0 || u < best_uses || (u == best_uses && p->last[s] < p->last[best]))
            best = s, best_uses = u;
    }
    return best;
}

/* Looks up expert id: its slot (a hit, counted), else the victim's slot,
 * emptied, for the caller to fill (-1: every slot pinned). *hit says which. */
static int32_t xpol_find(xpol *p, int32_t id, int *hit)
{
    int32_t s = p->where[id];
    if ((*hit = s >= 0)) {
        __atomic_add_fetch(&p->hits[id], 1, __ATOMIC_RELAXED);
        return s;
    }
    if ((s = victim(p)) >= 0 && p->owner[s] >= 0) {
        __atomic_store_n(&p->where[p->owner[s]], -1, __ATOMIC_RELAXED);
        p->owner[s] = -1;
    }
    return s;
}

/* Slot s now holds expert id (filled after a miss, counted). */
static void xpol_filled(xpol *p, int32_t s, int32_t id)
{
    p->owner[s] = id;
    __atomic_store_n(&p->where[id], s, __ATOMIC_RELAXED);
    __atomic_add_fetch(&p->misses[id], 1, __ATOMIC_RELAXED);
}

/* Slot s used now, pinned until the next unpin. */
static void xpol_use(xpol *p, int32_t s)
{
    p->last[s] = ++p->tick;
    p->pinned[s] = 1;
}

int xcache_get(xcache *xc, int32_t il, int32_t e, model_tensor views[3], kvant_err *err)
{
    const model_layer *L = &xc->m->layers[il];
    const int32_t id = il * xc->n_expert + e;
    trace_put(xc, id);
    int hit;
    const int32_t s = xpol_find(&xc->p, id, &hit);
    if (s < 0)
        return kvant_err_set(err, KV_ENOMEM, "expert cache: all %d slots pinned", xc->p.n_slots);
    if (!hit) {
        int rc = fill(xc, L, e, s, err);
        if (rc)
            return rc;
        xpol_filled(&xc->p, s, id);
    }
    xpol_use(&xc->p, s);
    views_of(xc, L, e, s, views);
    return KV_OK;
}

typedef struct xc_group {
    xcache *xc;
    const model_layer *L;
    const int32_t *es, *slot;
    int32_t miss[XCACHE_GROUP_MAX]; /* the misses' indices in es */
    int rc[XCACHE_GROUP_MAX];       /* per index in es */
    kvant_err err[XCACHE_GROUP_MAX];
} xc_group;

static void group_fill(void *arg, int32_t j)
{
    xc_group *g = arg;
    const int32_t i = g->miss[j];
    g->rc[i] = fill(g->xc, g->L, g->es[i], g->slot[i], &g->err[i]);
}

int xcache_get_group(xcache *xc, int32_t il, const int32_t *es, int32_t n, model_tensor (*views)[3],
                     const xcache_par *par, kvant_err *err)
{
    if (n < 0 || n > XCACHE_GROUP_MAX)
        return kvant_err_set(err, KV_EINVAL, "expert cache: %d experts in one group", n);
    const model_layer *L = &xc->m->layers[il];
    int32_t slot[XCACHE_GROUP_MAX], n_miss = 0;
    xc_group g = {.xc = xc, .L = L, .es = es, .slot = slot};
    for (int32_t i = 0; i < n; i++) { /* the policy as xcache_get, the reads left for below */
        const int32_t id = il * xc->n_expert + es[i];
        trace_put(xc, id);
        int hit;
        if ((slot[i] = xpol_find(&xc->p, id, &hit)) < 0)
            return kvant_err_set(err, KV_ENOMEM, "expert cache: all %d slots pinned",
                                 xc->p.n_slots);
        if (!hit) {
            xpol_filled(&xc->p, slot[i], id);
            g.miss[n_miss++] = i;
        }
        xpol_use(&xc->p, slot[i]);
    }
    if (par && n_miss > 1)
        par->run(par->ctx, n_miss, group_fill, &g);
    else
        for (int32_t j = 0; j < n_miss; j++)
            group_fill(&g, j);
    int rc = KV_OK;
    for (int32_t i = 0; i < n; i++) {
        if (g.rc[i]) { /* not arrived: out of the cache (its slot empty) */
            __atomic_store_n(&xc->p.where[il * xc->n_expert + es[i]], -1, __ATOMIC_RELAXED);
            xc->p.owner[slot[i]] = -1;
            if (!rc)
                *err = g.err[i], rc = g.rc[i];
            continue;
        }
        views_of(xc, L, es[i], slot[i], views[i]);
    }
    return rc;
}

void xcache_unpin(xcache *xc)
{
    trace_put(xc, -1);
    memset(xc->p.pinned, 0, (size_t)xc->p.n_slots);
}

void xcache_io_describe(const xcache *xc, char *buf, size_t cap)
{
    if (!xc->layout_direct)
        snprintf(buf, cap, "%s", "");
    else if (xc->dfd >= 0)
        snprintf(buf, cap, "expert reads: direct (O_DIRECT, past the page cache)");
    else
        snprintf(buf, cap, "expert reads: %s", xc->io_note);
}

int32_t xcache_slots(const xcache *xc)
{
    return xc->p.n_slots;
}

void xcache_get_stats(const xcache *xc, xcache_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_layers = xc->n_layers;
    out->n_expert = xc->n_expert;
    out->n_slots = xc->p.n_slots;
    out->slot_bytes = xc->slot_bytes;
    out->bytes_read = __atomic_load_n(&xc->bytes_read, __ATOMIC_RELAXED);
    out->direct = xc->dfd >= 0;
    snprintf(out->io_note, sizeof out->io_note, "%s", xc->io_note);
    if ((out->failed = __atomic_load_n(&xc->failed, __ATOMIC_ACQUIRE)))
        snprintf(out->error, sizeof out->error, "%s", xc->error);
    const int64_t n_ids = (int64_t)xc->n_layers * xc->n_expert;
    for (int64_t i = 0; i < n_ids; i++) {
        out->hits += __atomic_load_n(&xc->p.hits[i], __ATOMIC_RELAXED);
        out->misses += __atomic_load_n(&xc->p.misses[i], __ATOMIC_RELAXED);
        out->n_used += __atomic_load_n(&xc->p.where[i], __ATOMIC_RELAXED) >= 0;
    }
}

void xcache_expert(const xcache *xc, int32_t il, int32_t e, uint64_t *hits, uint64_t *misses,
                   int *resident)
{
    const int32_t id = il * xc->n_expert + e;
    *hits = __atomic_load_n(&xc->p.hits[id], __ATOMIC_RELAXED);
    *misses = __atomic_load_n(&xc->p.misses[id], __ATOMIC_RELAXED);
    *resident = __atomic_load_n(&xc->p.where[id], __ATOMIC_RELAXED) >= 0;
}

/* ---- trace and replay ---- */

static void trace_put(xcache *xc, int32_t v)
{
    if (xc->trace && xc->trace_n < xc->trace_cap)
        xc->trace[xc->trace_n] = v;
    xc->trace_n += xc->trace != NULL;
}

void xcache_trace(xcache *xc, int32_t *buf, int64_t cap)
{
    xc->trace = buf, xc->trace_cap = buf ? cap : 0, xc->trace_n = 0;
}

int64_t xcache_trace_len(const xcache *xc)
{
    return xc->trace_n;
}

int xcache_replay(const int32_t *trace, int64_t n, int64_t count_from, int64_t n_ids,
                  int32_t n_slots, uint8_t *resident, xcache_pred *out, kvant_err *err)
{
    memset(out, 0, sizeof *out);
    if (n_slots < 1 || n_ids < 1 || count_from < 0 || count_from > n)
        return kvant_err_set(err, KV_EINVAL, "expert cache replay: %d slots, %lld experts",
                             n_slots, (long long)n_ids);
    xpol p;
    if (xpol_init(&p, n_ids, n_slots))
        return kvant_err_set(err, KV_ENOMEM, "expert cache replay: out of memory");
    int rc = KV_OK;
    uint64_t group_misses = 0; /* counted misses since the last unpin */
    for (int64_t i = 0; !rc && i <= n; i++) {
        const int32_t id = i < n ? trace[i] : -1;
        if (id < 0) { /* a group ends: its misses were read side by side when several */
            out->shared_misses += group_misses > 1 ? group_misses : 0;
            group_misses = 0;
            memset(p.pinned, 0, (size_t)n_slots);
            continue;
        }
        if (id >= n_ids) {
            rc = kvant_err_set(err, KV_EINVAL, "expert cache replay: expert %d of %lld", id,
                               (long long)n_ids);
            break;
        }
        int hit;
        int32_t s = xpol_find(&p, id, &hit);
        if (s < 0) { /* fewer slots than the run pinned together: as if unpinned */
            memset(p.pinned, 0, (size_t)n_slots);
            s = xpol_find(&p, id, &hit);
        }
        if (!hit)
            xpol_filled(&p, s, id);
        xpol_use(&p, s);
        if (i >= count_from) {
            hit ? out->hits++ : out->misses++;
            group_misses += !hit;
        }
    }
    for (int64_t i = 0; i < n_ids; i++) {
        out->n_resident += p.where[i] >= 0;
        if (resident)
            resident[i] = p.where[i] >= 0;
    }
    xpol_free(&p);
    return rc;
}
