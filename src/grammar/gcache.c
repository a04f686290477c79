/* gcache.c - the compile dispatcher and the grammar cache (gcache.h).
 *
 * The cache is a small array of entries searched by hash (capacities are
 * tens to hundreds); eviction takes the least recently used entry.  Keys
 * keep a copy of the source, so a hash collision never returns another
 * grammar.
 */
#include "grammar/gcache.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gbnf.h"
#include "grammar/jschema.h"
#include "grammar/regex.h"

static const char *const kind_names[GRAM_KIND_COUNT] = {
    "gbnf", "json_schema", "json_object", "regex", "choice",
};

int gram_kind_parse(const char *name)
{
    for (int k = 0; k < GRAM_KIND_COUNT; k++)
        if (!strcmp(name, kind_names[k]))
            return k;
    return -1;
}

static gram *choice_compile(const char *src, size_t n, gram_limits lim, kvant_err *err)
{
    json_error_t je;
    json_t *a = json_loadb(src, n, 0, &je);
    if (!json_is_array(a) || json_array_size(a) == 0) {
        json_decref(a);
        kvant_err_set(err, KV_EINVAL, "choice: expecting a non-empty JSON array of strings");
        return NULL;
    }
    gram *g = gram_create(lim);
    int32_t *alts = calloc(json_array_size(a), sizeof *alts);
    if (!g || !alts) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        goto fail;
    }
    size_t i;
    json_t *v;
    json_array_foreach(a, i, v) {
        if (!json_is_string(v)) {
            kvant_err_set(err, KV_EINVAL, "choice: item %zu is not a string", i);
            goto fail;
        }
        alts[i] = gram_bytes(g, json_string_value(v), json_string_length(v));
    }
    int32_t e = gram_alt(g, alts, (int32_t)json_array_size(a));
    if (gram_finish(g, e, err))
        goto fail;
    free(alts);
    json_decref(a);
    return g;
fail:
    free(alts);
    gram_destroy(g);
    json_decref(a);
    return NULL;
}

gram *gcache_compile(gram_kind kind, const char *src, size_t n, gram_limits lim, kvant_err *err)
{
    switch (kind) {
    case GRAM_KIND_GBNF: return gbnf_compile(src, n, lim, err);
    case GRAM_KIND_JSON_SCHEMA: return jschema_compile(src, n, lim, err);
    case GRAM_KIND_JSON_OBJECT: return jschema_any_object(lim, err);
    case GRAM_KIND_REGEX: return rx_compile(src, n, lim, err);
    case GRAM_KIND_CHOICE: return choice_compile(src, n, lim, err);
    default: break;
    }
    kvant_err_set(err, KV_EINVAL, "unknown grammar kind %d", (int)kind);
    return NULL;
}

struct gcache_entry {
    uint64_t hash;
    gram_kind kind;
    char *src;
    size_t n;
    gram *g;
    tmshare *masks;      /* created by gcache_masks, or NULL */
    int32_t refs;
    int detached;        /* evicted while held: freed on the last release */
    uint64_t last_use;
};

struct gcache {
    pthread_mutex_t mu;
    gram_limits lim;
    gcache_entry **v;    /* [cap] */
    int32_t n, cap;
    uint64_t tick;
    int64_t hits, misses;
    int32_t share_masks;  /* capacity of each entry's shared masks */
};

static uint64_t key_hash(gram_kind kind, const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h;
}

gcache *gcache_create(int32_t capacity, gram_limits lim)
{
    if (capacity < 1)
        capacity = 1;
    gcache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->v = calloc((size_t)capacity, sizeof *c->v);
    if (!c->v) {
        free(c);
        return NULL;
    }
    pthread_mutex_init(&c->mu, NULL);
    c->cap = capacity;
    c->lim = lim;
    c->share_masks = TMSHARE_DEFAULT_MASKS;
    return c;
}

static void entry_free(gcache_entry *e)
{
    tmshare_destroy(e->masks);
    gram_destroy(e->g);
    free(e->src);
    free(e);
}

void gcache_destroy(gcache *c)
{
    if (!c)
        return;
    for (int32_t i = 0; i < c->n; i++)
        entry_free(c->v[i]);
    pthread_mutex_destroy(&c->mu);
    free(c->v);
    free(c);
}

static gcache_entry *find(gcache *c, uint64_t h, gram_kind kind, const char *src, size_t n)
{
    for (int32_t i = 0; i < c->n; i++) {
        gcache_entry *e = c->v[i];
        if (e->hash == h && e->kind == kind && e->n == n && !memcmp(e->src, src, n))
            return e;
    }
    return NULL;
}

/* Makes room for one entry (under the lock). */
static void evict_one(gcache *c)
{
    int32_t lru = 0;
    for (int32_t i = 1; i < c->n; i++)
        if (c->v[i]->last_use < c->v[lru]->last_use)
            lru = i;
    gcache_entry *e = c->v[lru];
    c->v[lru] = c->v[--c->n];
    if (e->refs)
        e->detached = 1;
    else
        entry_free(e);
}

gcache_entry *gcache_get(gcache *c, gram_kind kind, const char *src, size_t n, kvant_err *err)
{
    uint64_t h = key_hash(kind, src, n);
    pthread_mutex_lock(&c->mu);
    gcache_entry *e = find(c, h, kind, src, n);
    if (e) {
        e->refs++;
        e->last_use = ++c->tick;
        c->hits++;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->mu);
    if (e)
        return e;
    gram *g = gcache_compile(kind, src, n, c->lim, err);   /* outside the lock */
    if (!g)
        return NULL;
    e = calloc(1, sizeof *e);
    char *copy = malloc(n ? n : 1);
    if (!e || !copy) {
        free(e);
        free(copy);
        gram_destroy(g);
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    if (n)
        memcpy(copy, src, n);
    *e = (gcache_entry){.hash = h, .kind = kind, .src = copy, .n = n, .g = g, .refs = 1};
    pthread_mutex_lock(&c->mu);
    gcache_entry *raced = find(c, h, kind, src, n);
    if (raced) {   /* another thread compiled it first: keep theirs */
        raced->refs++;
        raced->last_use = ++c->tick;
        pthread_mutex_unlock(&c->mu);
        entry_free(e);
        return raced;
    }
    if (c->n == c->cap)
        evict_one(c);
    e->last_use = ++c->tick;
    c->v[c->n++] = e;
    pthread_mutex_unlock(&c->mu);
    return e;
}

const gram *gcache_gram(const gcache_entry *e)
{
    return e->g;
}

void gcache_release(gcache *c, gcache_entry *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&c->mu);
    int free_it = --e->refs == 0 && e->detached;
    pthread_mutex_unlock(&c->mu);
    if (free_it)
        entry_free(e);
}

void gcache_stats(gcache *c, int64_t *hits, int64_t *misses)
{
    pthread_mutex_lock(&c->mu);
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}

tmshare *gcache_masks(gcache *c, gcache_entry *e, int32_t n_words, kvant_err *err)
{
    pthread_mutex_lock(&c->mu);
    tmshare *s = e->masks;
    pthread_mutex_unlock(&c->mu);
    if (!s) {   /* created outside the lock; a thread that raced keeps the first */
        tmshare *n = tmshare_create(e->g, n_words, c->share_masks, err);
        if (!n)
            return NULL;
        pthread_mutex_lock(&c->mu);
        if (!e->masks)
            e->masks = n, n = NULL;
        s = e->masks;
        pthread_mutex_unlock(&c->mu);
        tmshare_destroy(n);
    }
    if (tmshare_n_words(s) != n_words) {
        kvant_err_set(err, KV_EINVAL, "shared masks: made for %d words, asked for %d",
                      tmshare_n_words(s), n_words);
        return NULL;
    }
    return s;
}
