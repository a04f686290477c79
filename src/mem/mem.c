/* mem.c - the device memory manager: budget, per-allocation records,
 * per-category / per-layer accounting, peaks, pool fragmentation reports.
 *
 * Invariants (hold whenever the mutex is released):
 *   used == sum of cat[c].current over the budget's categories
 *        == sum of the sizes of the live records of those categories
 *   (MEM_PINNED is tracked in cat[] and layer_bytes but not in used);
 *   used <= budget;  peak >= used;  cat[c].peak >= cat[c].current;
 *   layer_bytes[l][c] == sum of live records tagged (c, l).
 * A refused request (bad argument, over budget, injected failure, allocator
 * failure, record table growth failure) leaves every counter and record
 * unchanged, except that the fail-nth countdown advances.
 *
 * Records live in an open-addressing hash table (linear probing, backward-
 * shift deletion, so no tombstones) keyed by (kind, key): the pointer for
 * allocations, the id for reservations.  The table grows only inside
 * mem_alloc / mem_reserve, before the allocator is called; mem_free and
 * mem_unreserve never allocate.
 */
#include "mem/mem.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEM_ALIGN 64
#define MEM_TABLE_MIN 64 /* initial record slots (power of two) */

enum { REC_EMPTY = 0, REC_ALLOC = 1, REC_RESERVE = 2 };

typedef struct mem_rec {
    uint64_t key;  /* pointer value (REC_ALLOC) or reservation id */
    uint64_t size;
    uint64_t addr; /* REC_RESERVE: the caller's mapping (mem_reserve_at), or 0 */
    int32_t layer; /* MEM_NO_LAYER or [0, MEM_MAX_LAYERS) */
    uint8_t cat;
    uint8_t kind;  /* REC_* */
} mem_rec;

typedef struct mem_pool_reg {
    mem_pool_stats_fn fn;
    void *ctx;
} mem_pool_reg;

struct mem_mgr {
    pthread_mutex_t mu; /* guards everything below; locked in const readers */
    uint64_t budget;
    mem_allocator a;
    uint64_t used, peak;
    mem_cat_stats cat[MEM_CAT_COUNT];
    int n_layers;                                    /* highest layer seen + 1 */
    uint64_t layer_bytes[MEM_MAX_LAYERS][MEM_CAT_COUNT];
    mem_rec *recs;      /* [cap] */
    size_t cap, count;  /* cap is a power of two */
    int64_t next_id;    /* next reservation id (> 0) */
    uint64_t fail_countdown; /* 0 = off; request that brings it to 0 fails */
    int n_pools;
    mem_pool_reg pools[MEM_MAX_POOLS];
};

/* ---- host allocator ---- */

static void *host_alloc(void *ctx, size_t size)
{
    (void)ctx;
    void *p = NULL;
    if (posix_memalign(&p, MEM_ALIGN, size ? size : 1) != 0)
        return NULL;
    return p;
}

static void host_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    (void)size;
    free(ptr);
}

mem_allocator mem_allocator_host(void)
{
    mem_allocator a = { host_alloc, host_free, NULL };
    return a;
}

/* ---- lifecycle ---- */

static mem_mgr *lock_mut(const mem_mgr *m)
{
    /* The mutex is the one mutable part of a logically-const reader. */
    mem_mgr *mm = (mem_mgr *)m;
    pthread_mutex_lock(&mm->mu);
    return mm;
}

mem_mgr *mem_create(uint64_t budget, mem_allocator a, kvant_err *err)
{
    if (budget == 0) {
        kvant_err_set(err, KV_EINVAL, "mem: budget must be > 0 bytes");
        return NULL;
    }
    if (!a.alloc || !a.free) {
        kvant_err_set(err, KV_EINVAL, "mem: allocator needs both alloc and free");
        return NULL;
    }
    mem_mgr *m = calloc(1, sizeof *m);
    mem_rec *recs = calloc(MEM_TABLE_MIN, sizeof *recs);
    if (!m || !recs) {
        free(m);
        free(recs);
        kvant_err_set(err, KV_ENOMEM, "mem: cannot allocate the memory manager");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    m->budget = budget;
    m->a = a;
    m->recs = recs;
    m->cap = MEM_TABLE_MIN;
    m->next_id = 1;
    return m;
}

void mem_destroy(mem_mgr *m)
{
    if (!m)
        return;
    if (m->count)
        fprintf(stderr, "kvant: mem: %zu allocation(s)/reservation(s) still live "
                "at destroy (%llu bytes)\n", m->count, (unsigned long long)m->used);
    pthread_mutex_destroy(&m->mu);
    free(m->recs);
    free(m);
}

/* ---- record table ---- */

static size_t rec_hash(uint64_t key, int kind, size_t cap)
{
    uint64_t h = (key ^ ((uint64_t)kind << 61)) * 0x9E3779B97F4A7C15ULL;
    h ^= h >> 29;
    return (size_t)h & (cap - 1);
}

/* Slot holding (kind, key), or SIZE_MAX. */
static size_t rec_find(const mem_mgr *m, int kind, uint64_t key)
{
    size_t mask = m->cap - 1;
    for (size_t i = rec_hash(key, kind, m->cap);; i = (i + 1) & mask) {
        const mem_rec *r = &m->recs[i];
        if (r->kind == REC_EMPTY)
            return SIZE_MAX;
        if (r->kind == kind && r->key == key)
            return i;
    }
}

static void rec_put(mem_rec *recs, size_t cap, const mem_rec *r)
{
    size_t i = rec_hash(r->key, r->kind, cap);
    while (recs[i].kind != REC_EMPTY)
        i = (i + 1) & (cap - 1);
    recs[i] = *r;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void rec_delete(mem_mgr *m, size_t i)
{
    size_t mask = m->cap - 1;
    size_t j = i;
    for (;;) {
        m->recs[i].kind = REC_EMPTY;
        for (;;) {
            j = (j + 1) & mask;
            if (m->recs[j].kind == REC_EMPTY) {
                m->count--;
                return;
            }
            size_t home = rec_hash(m->recs[j].key, m->recs[j].kind, m->cap);
            /* move j back to i unless its home lies cyclically in (i, j] */
            int stays = (i <= j) ? (i < home && home <= j) : (i < home || home <= j);
            if (!stays)
                break;
        }
        m->recs[i] = m->recs[j];
        i = j;
    }
}

/* Makes room for one more record (load factor <= 0.7). */
static int rec_reserve_slot(mem_mgr *m)
{
    if ((m->count + 1) * 10 <= m->cap * 7)
        return KV_OK;
    if (m->cap > SIZE_MAX / 2 / sizeof(mem_rec))
        return KV_ENOMEM;
    size_t ncap = m->cap * 2;
    mem_rec *n = calloc(ncap, sizeof *n);
    if (!n)
        return KV_ENOMEM;
    for (size_t i = 0; i < m->cap; i++)
        if (m->recs[i].kind != REC_EMPTY)
            rec_put(n, ncap, &m->recs[i]);
    free(m->recs);
    m->recs = n;
    m->cap = ncap;
    return KV_OK;
}

/* ---- accounting ---- */

static void account_add(mem_mgr *m, uint64_t size, int cat, int layer)
{
    if (mem_cat_in_budget((mem_cat)cat)) {
        m->used += size;
        if (m->used > m->peak)
            m->peak = m->used;
    }
    mem_cat_stats *c = &m->cat[cat];
    c->current += size;
    if (c->current > c->peak)
        c->peak = c->current;
    if (layer >= 0) {
        m->layer_bytes[layer][cat] += size;
        if (layer + 1 > m->n_layers)
            m->n_layers = layer + 1;
    }
}

static void account_sub(mem_mgr *m, const mem_rec *r)
{
    const int in = mem_cat_in_budget((mem_cat)r->cat);
    KV_ASSERT((!in || m->used >= r->size) && m->cat[r->cat].current >= r->size);
    if (in)
        m->used -= r->size;
    m->cat[r->cat].current -= r->size;
    if (r->layer >= 0)
        m->layer_bytes[r->layer][r->cat] -= r->size;
}

static int refuse(const mem_mgr *m, kvant_err *err, int code, const char *why,
                  const char *verb, uint64_t size, int cat, int layer)
{
    char want[32], left[32], bud[32], lay[32] = "";
    if (layer >= 0)
        snprintf(lay, sizeof lay, " for layer %d", layer);
    return kvant_err_set(err, code,
        "mem: %s: cannot %s %s (%llu bytes) of %s%s: %s (%llu bytes) left of a %s budget",
        why, verb, mem_format_size(size, want, sizeof want), (unsigned long long)size,
        mem_cat_name((mem_cat)cat), lay, mem_format_size(m->budget - m->used, left, sizeof left),
        (unsigned long long)(m->budget - m->used), mem_format_size(m->budget, bud, sizeof bud));
}

/* Common admission for alloc and reserve; called with the mutex held.
 * Returns KV_OK when the request may proceed (a record slot is ready). */
static int admit(mem_mgr *m, const char *verb, uint64_t size, int cat, int layer,
                 kvant_err *err)
{
    if ((unsigned)cat >= MEM_CAT_COUNT)
        return kvant_err_set(err, KV_EINVAL, "mem: bad category %d", cat);
    if (layer != MEM_NO_LAYER && (layer < 0 || layer >= MEM_MAX_LAYERS))
        return kvant_err_set(err, KV_EINVAL, "mem: layer %d out of range [0, %d)",
                             layer, MEM_MAX_LAYERS);
    if (size == 0)
        return kvant_err_set(err, KV_EINVAL, "mem: cannot %s 0 bytes of %s", verb,
                             mem_cat_name((mem_cat)cat));
    if (m->fail_countdown > 0 && --m->fail_countdown == 0)
        return refuse(m, err, KV_ENOMEM, "injected failure (fail_nth)", verb, size, cat, layer);
    if (mem_cat_in_budget((mem_cat)cat) && size > m->budget - m->used)
        return refuse(m, err, KV_ENOMEM, "over budget", verb, size, cat, layer);
    if (rec_reserve_slot(m) != KV_OK)
        return refuse(m, err, KV_ENOMEM, "record table full", verb, size, cat, layer);
    return KV_OK;
}

void *mem_alloc(mem_mgr *m, size_t size, mem_cat cat, int layer, kvant_err *err)
{
    KV_ASSERT(m);
    pthread_mutex_lock(&m->mu);
    void *p = NULL;
    if (admit(m, "allocate", size, (int)cat, layer, err) == KV_OK) {
        p = m->a.alloc(m->a.ctx, size);
        if (!p) {
            refuse(m, err, KV_ENOMEM, "allocator failed", "allocate", size, (int)cat, layer);
        } else {
            KV_ASSERT(rec_find(m, REC_ALLOC, (uint64_t)(uintptr_t)p) == SIZE_MAX);
            mem_rec r = { (uint64_t)(uintptr_t)p, size, 0, layer, (uint8_t)cat, REC_ALLOC };
            rec_put(m->recs, m->cap, &r);
            m->count++;
            account_add(m, size, (int)cat, layer);
        }
    }
    pthread_mutex_unlock(&m->mu);
    return p;
}

void mem_free(mem_mgr *m, void *ptr)
{
    if (!ptr)
        return;
    KV_ASSERT(m);
    pthread_mutex_lock(&m->mu);
    size_t i = rec_find(m, REC_ALLOC, (uint64_t)(uintptr_t)ptr);
    KV_ASSERT(i != SIZE_MAX); /* not from this manager, or freed twice */
    mem_rec r = m->recs[i];
    account_sub(m, &r);
    rec_delete(m, i);
    m->a.free(m->a.ctx, ptr, (size_t)r.size);
    pthread_mutex_unlock(&m->mu);
}

/* Resident bytes of [p, p + size) by mincore; size when it cannot tell. */
static uint64_t resident_of(uint64_t p, uint64_t size, unsigned char *vec, size_t vec_cap,
                            uint64_t pg)
{
    const uint64_t a = p / pg * pg, z = (p + size + pg - 1) / pg * pg;
    uint64_t res = 0;
    for (uint64_t o = a; o < z; o += (uint64_t)vec_cap * pg) {
        const uint64_t len = z - o < (uint64_t)vec_cap * pg ? z - o : (uint64_t)vec_cap * pg;
        if (mincore((void *)(uintptr_t)o, (size_t)len, vec))
            return size;
        for (uint64_t i = 0; i < len / pg; i++)
            res += vec[i] & 1 ? pg : 0;
    }
    return res < size ? res : size; /* the edge pages hold other data too */
}

void mem_resident_by_cat(const mem_mgr *m, uint64_t out[MEM_CAT_COUNT])
{
    KV_ASSERT(m);
    const long pgl = sysconf(_SC_PAGESIZE);
    const uint64_t pg = pgl > 0 ? (uint64_t)pgl : 4096;
    unsigned char vec[4096];
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        out[c] = 0;
    mem_mgr *mm = lock_mut(m);
    const int host = mm->a.alloc == host_alloc;
    for (size_t i = 0; i < mm->cap; i++) {
        const mem_rec *r = &mm->recs[i];
        uint64_t b = 0;
        if (r->kind == REC_ALLOC && host)
            b = resident_of(r->key, r->size, vec, sizeof vec, pg);
        else if (r->kind == REC_RESERVE && r->addr)
            b = resident_of(r->addr, r->size, vec, sizeof vec, pg);
        else if (r->kind != REC_EMPTY)
            b = r->size;
        if (r->kind != REC_EMPTY && r->cat < MEM_CAT_COUNT)
            out[r->cat] += b;
    }
    pthread_mutex_unlock(&mm->mu);
}

uint64_t mem_resident_bytes(const mem_mgr *m)
{
    uint64_t by[MEM_CAT_COUNT], total = 0;
    mem_resident_by_cat(m, by);
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        total += mem_cat_in_budget((mem_cat)c) ? by[c] : 0; /* of mem_used */
    return total;
}

int64_t mem_reserve(mem_mgr *m, uint64_t size, mem_cat cat, int layer, kvant_err *err)
{
    return mem_reserve_at(m, NULL, size, cat, layer, err);
}

int64_t mem_reserve_at(mem_mgr *m, const void *addr, uint64_t size, mem_cat cat, int layer,
                       kvant_err *err)
{
    KV_ASSERT(m);
    pthread_mutex_lock(&m->mu);
    int64_t id = admit(m, "reserve", size, (int)cat, layer, err);
    if (id == KV_OK) {
        id = m->next_id++;
        mem_rec r = { (uint64_t)id, size, (uint64_t)(uintptr_t)addr, layer, (uint8_t)cat,
                      REC_RESERVE };
        rec_put(m->recs, m->cap, &r);
        m->count++;
        account_add(m, size, (int)cat, layer);
    }
    pthread_mutex_unlock(&m->mu);
    return id;
}

int mem_reserve_resize(mem_mgr *m, int64_t id, uint64_t size, kvant_err *err)
{
    KV_ASSERT(m && id > 0);
    pthread_mutex_lock(&m->mu);
    size_t i = rec_find(m, REC_RESERVE, (uint64_t)id);
    KV_ASSERT(i != SIZE_MAX); /* unknown id, or unreserved */
    mem_rec *r = &m->recs[i];
    int rc = KV_OK;
    if (size == 0) {
        rc = kvant_err_set(err, KV_EINVAL, "mem: cannot resize a reservation of %s to 0 bytes",
                           mem_cat_name((mem_cat)r->cat));
    } else if (size > r->size) {
        const uint64_t more = size - r->size;
        if (m->fail_countdown > 0 && --m->fail_countdown == 0)
            rc = refuse(m, err, KV_ENOMEM, "injected failure (fail_nth)", "grow by", more,
                        r->cat, r->layer);
        else if (mem_cat_in_budget((mem_cat)r->cat) && more > m->budget - m->used)
            rc = refuse(m, err, KV_ENOMEM, "over budget", "grow by", more, r->cat, r->layer);
        else
            account_add(m, more, r->cat, r->layer);
    } else if (size < r->size) {
        const mem_rec cut = { r->key, r->size - size, r->addr, r->layer, r->cat, r->kind };
        account_sub(m, &cut);
    }
    if (rc == KV_OK)
        r->size = size;
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void mem_unreserve(mem_mgr *m, int64_t id)
{
    if (id <= 0)
        return; /* a failed reservation's status: nothing to undo */
    KV_ASSERT(m);
    pthread_mutex_lock(&m->mu);
    size_t i = rec_find(m, REC_RESERVE, (uint64_t)id);
    KV_ASSERT(i != SIZE_MAX); /* unknown id, or unreserved twice */
    account_sub(m, &m->recs[i]);
    rec_delete(m, i);
    pthread_mutex_unlock(&m->mu);
}

void mem_reset_peak(mem_mgr *m)
{
    pthread_mutex_lock(&m->mu);
    m->peak = m->used;
    for (int c = 0; c < MEM_CAT_COUNT; c++)
        m->cat[c].peak = m->cat[c].current;
    pthread_mutex_unlock(&m->mu);
}

void mem_fail_nth(mem_mgr *m, uint64_t n)
{
    pthread_mutex_lock(&m->mu);
    m->fail_countdown = n;
    pthread_mutex_unlock(&m->mu);
}

uint64_t mem_budget(const mem_mgr *m)
{
    return m->budget; /* immutable after create */
}

uint64_t mem_used(const mem_mgr *m)
{
    mem_mgr *mm = lock_mut(m);
    uint64_t v = mm->used;
    pthread_mutex_unlock(&mm->mu);
    return v;
}

uint64_t mem_available(const mem_mgr *m)
{
    mem_mgr *mm = lock_mut(m);
    uint64_t v = mm->budget - mm->used;
    pthread_mutex_unlock(&mm->mu);
    return v;
}

size_t mem_live_count(const mem_mgr *m)
{
    mem_mgr *mm = lock_mut(m);
    size_t v = mm->count;
    pthread_mutex_unlock(&mm->mu);
    return v;
}

/* ---- pools ---- */

int mem_register_pool(mem_mgr *m, mem_pool_stats_fn fn, void *ctx)
{
    if (!fn)
        return KV_EINVAL;
    pthread_mutex_lock(&m->mu);
    int rc = KV_ERANGE;
    if (m->n_pools < MEM_MAX_POOLS) {
        m->pools[m->n_pools].fn = fn;
        m->pools[m->n_pools].ctx = ctx;
        m->n_pools++;
        rc = KV_OK;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

void mem_unregister_pool(mem_mgr *m, mem_pool_stats_fn fn, void *ctx)
{
    pthread_mutex_lock(&m->mu);
    for (int i = 0; i < m->n_pools; i++) {
        if (m->pools[i].fn == fn && m->pools[i].ctx == ctx) {
            memmove(&m->pools[i], &m->pools[i + 1],
                    (size_t)(m->n_pools - i - 1) * sizeof m->pools[0]);
            m->n_pools--;
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
}

static double pool_fragmentation(const mem_pool_stats *s)
{
    if (s->free_bytes == 0)
        return 0.0;
    uint64_t largest = s->largest_free_extent < s->free_bytes ? s->largest_free_extent
                                                              : s->free_bytes;
    return 1.0 - (double)largest / (double)s->free_bytes;
}

/* ---- reports ---- */

void mem_get_report(const mem_mgr *m, mem_report *out)
{
    mem_mgr *mm = lock_mut(m);
    memset(out, 0, sizeof *out);
    out->budget = mm->budget;
    out->used = mm->used;
    out->peak = mm->peak;
    memcpy(out->cat, mm->cat, sizeof out->cat);
    out->n_layers = mm->n_layers;
    memcpy(out->layer_bytes, mm->layer_bytes, (size_t)mm->n_layers * sizeof out->layer_bytes[0]);
    out->n_pools = mm->n_pools;
    for (int i = 0; i < mm->n_pools; i++) {
        mem_pool_stats *s = &out->pools[i];
        mm->pools[i].fn(mm->pools[i].ctx, s);
        if (!s->name)
            s->name = "pool";
        out->fragmentation[i] = pool_fragmentation(s);
    }
    pthread_mutex_unlock(&mm->mu);
}

static json_t *u64j(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

char *mem_report_json(const mem_report *r)
{
    json_t *root = json_object();
    json_object_set_new(root, "budget", u64j(r->budget));
    json_object_set_new(root, "used", u64j(r->used));
    json_object_set_new(root, "peak", u64j(r->peak));
    json_t *cats = json_object();
    for (int c = 0; c < MEM_CAT_COUNT; c++) {
        json_t *o = json_object();
        json_object_set_new(o, "current", u64j(r->cat[c].current));
        json_object_set_new(o, "peak", u64j(r->cat[c].peak));
        json_object_set_new(cats, mem_cat_name((mem_cat)c), o);
    }
    json_object_set_new(root, "categories", cats);
    json_t *layers = json_array();
    for (int l = 0; l < r->n_layers && l < MEM_MAX_LAYERS; l++) {
        json_t *o = json_object();
        json_object_set_new(o, "layer", json_integer(l));
        for (int c = 0; c < MEM_CAT_COUNT; c++)
            json_object_set_new(o, mem_cat_name((mem_cat)c), u64j(r->layer_bytes[l][c]));
        json_array_append_new(layers, o);
    }
    json_object_set_new(root, "layers", layers);
    json_t *pools = json_array();
    for (int i = 0; i < r->n_pools && i < MEM_MAX_POOLS; i++) {
        const mem_pool_stats *s = &r->pools[i];
        json_t *o = json_object();
        json_object_set_new(o, "name", json_string(s->name ? s->name : "pool"));
        json_object_set_new(o, "total_bytes", u64j(s->total_bytes));
        json_object_set_new(o, "free_bytes", u64j(s->free_bytes));
        json_object_set_new(o, "largest_free_extent", u64j(s->largest_free_extent));
        json_object_set_new(o, "fragmentation", json_real(r->fragmentation[i]));
        json_array_append_new(pools, o);
    }
    json_object_set_new(root, "pools", pools);
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    return s; /* json_dumps uses malloc by default: caller free()s */
}

const char *mem_cat_name(mem_cat c)
{
    static const char *const names[MEM_CAT_COUNT] = {
        [MEM_WEIGHTS] = "weights", [MEM_KV] = "kv", [MEM_ACTIVATIONS] = "activations",
        [MEM_WORKSPACE] = "workspace", [MEM_OTHER] = "other", [MEM_PINNED] = "pinned_host",
        [MEM_DRAFT_WEIGHTS] = "draft_weights", [MEM_DRAFT_KV] = "draft_kv",
        [MEM_STATE] = "state",
    };
    return (unsigned)c < MEM_CAT_COUNT ? names[c] : "unknown";
}

/* ---- sizes ---- */

/* Unit multiplier for the suffix at s (whole remaining string), or 0. */
static uint64_t size_unit(const char *s)
{
    static const char letters[] = "kmgt";
    if (*s == '\0')
        return 1;
    if ((s[0] == 'B' || s[0] == 'b') && s[1] == '\0')
        return 1;
    const char *p = strchr(letters, tolower((unsigned char)s[0]));
    if (!p || s[0] == '\0')
        return 0;
    int e = (int)(p - letters) + 1;
    const char *rest = s + 1;
    uint64_t base = 1000;
    if (*rest == 'i' || *rest == 'I') {
        base = 1024;
        rest++;
    }
    if (*rest == 'B' || *rest == 'b')
        rest++;
    if (*rest != '\0')
        return 0;
    uint64_t mult = 1;
    for (int i = 0; i < e; i++)
        mult *= base;
    return mult;
}

int mem_parse_size(const char *s, uint64_t *out, kvant_err *err)
{
    if (!s || !isdigit((unsigned char)s[0]))
        return kvant_err_set(err, KV_EINVAL, "size '%s': expected a non-negative number "
                             "with an optional unit (K, M, G, T, Ki, Mi, Gi, Ti, B)",
                             s ? s : "(null)");
    const char *p = s;
    uint64_t whole = 0;
    for (; isdigit((unsigned char)*p); p++) {
        unsigned d = (unsigned)(*p - '0');
        if (whole > (UINT64_MAX - d) / 10)
            return kvant_err_set(err, KV_EINVAL, "size '%s': overflows 64 bits", s);
        whole = whole * 10 + d;
    }
    long double frac = 0.0L, scale = 1.0L;
    if (*p == '.') {
        p++;
        if (!isdigit((unsigned char)*p))
            return kvant_err_set(err, KV_EINVAL, "size '%s': expected digits after '.'", s);
        for (; isdigit((unsigned char)*p); p++) {
            scale /= 10.0L;
            frac += (long double)(*p - '0') * scale;
        }
    }
    uint64_t mult = size_unit(p);
    if (mult == 0)
        return kvant_err_set(err, KV_EINVAL, "size '%s': unknown unit '%s' (use K, M, G, T, "
                             "Ki, Mi, Gi, Ti, optionally followed by B)", s, p);
    if (whole > UINT64_MAX / mult)
        return kvant_err_set(err, KV_EINVAL, "size '%s': overflows 64 bits", s);
    uint64_t v = whole * mult;
    uint64_t fb = (uint64_t)(frac * (long double)mult); /* < mult: rounds down */
    if (fb > UINT64_MAX - v)
        return kvant_err_set(err, KV_EINVAL, "size '%s': overflows 64 bits", s);
    *out = v + fb;
    return KV_OK;
}

const char *mem_format_size(uint64_t bytes, char *buf, size_t cap)
{
    static const char *const units[] = { "KiB", "MiB", "GiB", "TiB", "PiB", "EiB" };
    if (bytes < 1024) {
        snprintf(buf, cap, "%llu B", (unsigned long long)bytes);
        return buf;
    }
    double v = (double)bytes / 1024.0;
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        u++;
    }
    snprintf(buf, cap, "%.2f %s", v, units[u]);
    return buf;
}

uint64_t mem_host_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb = 0;
        int found = 0;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                found = 1;
                break;
            }
        }
        fclose(f);
        if (found)
            return (uint64_t)kb * 1024u;
    }
    long pages = sysconf(_SC_AVPHYS_PAGES);
    long psz = sysconf(_SC_PAGESIZE);
    if (pages <= 0 || psz <= 0)
        return 0;
    return (uint64_t)pages * (uint64_t)psz;
}
