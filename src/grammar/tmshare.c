/* tmshare.c - the shared mask cache (tmshare.h).
 *
 * Entries live in a fixed array; an open hash of 2 * max_masks slots
 * (linear probing, deletion by backward shift) maps a key's hash to its
 * entry.  Keys are compared in full, so a hash collision never returns
 * another state's mask.
 */
#include "grammar/tmshare.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct ts_entry {
    uint64_t hash;
    uint64_t *key;       /* [key_cap] */
    int32_t n, key_cap;  /* n < 0: empty */
    int32_t count;
    int referenced;      /* hit since the clock hand passed */
    uint32_t *mask;      /* [n_words] */
} ts_entry;

struct tmshare {
    pthread_mutex_t mu;
    const gram *g;
    const void *vocab;   /* the claiming vocabulary, or NULL */
    int32_t n_words, cap, n_used, hand;
    uint32_t hcap;
    int32_t *slot;       /* [hcap] entry index or -1 */
    ts_entry *ent;       /* [cap] */
    uint32_t *masks;     /* [cap][n_words] */
    size_t key_bytes;
    int64_t hits, misses;
};

tmshare *tmshare_create(const gram *g, int32_t n_words, int32_t max_masks, kvant_err *err)
{
    if (n_words <= 0 || max_masks <= 0 || !gram_get_tables(g)) {
        kvant_err_set(err, KV_EINVAL, "shared masks: %d words, %d masks", n_words, max_masks);
        return NULL;
    }
    tmshare *s = calloc(1, sizeof *s);
    uint32_t hcap = 16;
    while (hcap < 2u * (uint32_t)max_masks)
        hcap *= 2;
    if (s) {
        s->g = g;
        s->n_words = n_words;
        s->cap = max_masks;
        s->hcap = hcap;
        s->slot = malloc(hcap * sizeof *s->slot);
        s->ent = calloc((size_t)max_masks, sizeof *s->ent);
        s->masks = malloc((size_t)max_masks * (size_t)n_words * sizeof *s->masks);
    }
    if (!s || !s->slot || !s->ent || !s->masks) {
        if (s) {
            free(s->slot);
            free(s->ent);
            free(s->masks);
        }
        free(s);
        kvant_err_set(err, KV_ENOMEM, "out of memory for the shared token masks");
        return NULL;
    }
    memset(s->slot, 0xff, hcap * sizeof *s->slot);
    for (int32_t i = 0; i < max_masks; i++) {
        s->ent[i].n = -1;
        s->ent[i].mask = s->masks + (size_t)i * (size_t)n_words;
    }
    pthread_mutex_init(&s->mu, NULL);
    return s;
}

void tmshare_destroy(tmshare *s)
{
    if (!s)
        return;
    for (int32_t i = 0; i < s->cap; i++)
        free(s->ent[i].key);
    pthread_mutex_destroy(&s->mu);
    free(s->slot);
    free(s->ent);
    free(s->masks);
    free(s);
}

const gram *tmshare_gram(const tmshare *s)
{
    return s->g;
}

int32_t tmshare_n_words(const tmshare *s)
{
    return s->n_words;
}

/* The hash slot holding key, or the empty slot where it would go. */
static uint32_t find_slot(const tmshare *s, const uint64_t *key, int32_t n, uint64_t h)
{
    uint32_t m = s->hcap - 1, k = (uint32_t)(h ^ (h >> 32)) & m;
    for (; s->slot[k] >= 0; k = (k + 1) & m) {
        const ts_entry *x = &s->ent[s->slot[k]];
        if (x->hash == h && x->n == n && !memcmp(x->key, key, (size_t)n * sizeof *key))
            break;
    }
    return k;
}

int32_t tmshare_get(tmshare *s, const uint64_t *key, int32_t n, uint64_t h, uint32_t *mask)
{
    int32_t count = -1;
    pthread_mutex_lock(&s->mu);
    int32_t i = s->slot[find_slot(s, key, n, h)];
    if (i >= 0) {
        ts_entry *x = &s->ent[i];
        x->referenced = 1;
        memcpy(mask, x->mask, (size_t)s->n_words * sizeof *mask);
        count = x->count;
        s->hits++;
    } else {
        s->misses++;
    }
    pthread_mutex_unlock(&s->mu);
    return count;
}

/* Removes entry i from the hash (backward-shift deletion). */
static void unlink_entry(tmshare *s, int32_t i)
{
    ts_entry *x = &s->ent[i];
    uint32_t m = s->hcap - 1, k = find_slot(s, x->key, x->n, x->hash);
    s->slot[k] = -1;
    for (uint32_t j = (k + 1) & m; s->slot[j] >= 0; j = (j + 1) & m) {
        const ts_entry *y = &s->ent[s->slot[j]];
        uint32_t home = (uint32_t)(y->hash ^ (y->hash >> 32)) & m;
        /* y may move to k iff k lies cyclically in [home, j) */
        if (((j - home) & m) >= ((j - k) & m)) {
            s->slot[k] = s->slot[j];
            s->slot[j] = -1;
            k = j;
        }
    }
    x->n = -1;
    s->n_used--;
}

/* The entry to fill: a free one, else the clock's victim (unlinked). */
static int32_t victim(tmshare *s)
{
    if (s->n_used < s->cap)
        for (int32_t i = 0; i < s->cap; i++)
            if (s->ent[i].n < 0)
                return i;
    for (;;) {
        int32_t i = s->hand;
        s->hand = (s->hand + 1) % s->cap;
        if (s->ent[i].referenced) {
            s->ent[i].referenced = 0;
            continue;
        }
        unlink_entry(s, i);
        return i;
    }
}

void tmshare_put(tmshare *s, const uint64_t *key, int32_t n, uint64_t h, const uint32_t *mask,
                 int32_t count)
{
    if (n < 0 || n > TMSHARE_MAX_KEY)
        return;
    pthread_mutex_lock(&s->mu);
    if (s->slot[find_slot(s, key, n, h)] >= 0) {
        pthread_mutex_unlock(&s->mu);
        return;
    }
    int32_t i = victim(s);
    ts_entry *x = &s->ent[i];
    if (x->key_cap < n) {
        uint64_t *nk = realloc(x->key, (size_t)n * sizeof *nk);
        if (!nk) {
            pthread_mutex_unlock(&s->mu);
            return;
        }
        s->key_bytes += (size_t)(n - x->key_cap) * sizeof *nk;
        x->key = nk;
        x->key_cap = n;
    }
    memcpy(x->key, key, (size_t)n * sizeof *key);
    memcpy(x->mask, mask, (size_t)s->n_words * sizeof *mask);
    x->n = n;
    x->hash = h;
    x->count = count;
    x->referenced = 0;
    s->slot[find_slot(s, key, n, h)] = i;
    s->n_used++;
    pthread_mutex_unlock(&s->mu);
}

int tmshare_claim(tmshare *s, const void *vocab)
{
    pthread_mutex_lock(&s->mu);
    if (!s->vocab)
        s->vocab = vocab;
    int ok = s->vocab == vocab;
    pthread_mutex_unlock(&s->mu);
    return ok ? 0 : -1;
}

void tmshare_stats(tmshare *s, int64_t *hits, int64_t *misses, int32_t *n_masks)
{
    pthread_mutex_lock(&s->mu);
    *hits = s->hits;
    *misses = s->misses;
    *n_masks = s->n_used;
    pthread_mutex_unlock(&s->mu);
}

size_t tmshare_mem_bytes(tmshare *s)
{
    pthread_mutex_lock(&s->mu);
    size_t b = sizeof *s + s->hcap * sizeof(int32_t) + (size_t)s->cap * sizeof(ts_entry) +
               (size_t)s->cap * (size_t)s->n_words * sizeof(uint32_t) + s->key_bytes;
    pthread_mutex_unlock(&s->mu);
    return b;
}
