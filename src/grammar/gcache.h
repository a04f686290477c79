/* gcache.h - compiling a grammar from (kind, source), and a cache of
 * compiled grammars keyed by a hash of (kind, source).
 *
 * gcache_compile is pure (no shared mutable state): the server may call
 * it on an HTTP thread, never the engine thread.  A gcache is thread-safe
 * (one mutex, never held while compiling: two threads compiling the same
 * source race, the first to finish is kept).  Entries are reference
 * counted: gcache_get returns a handle the caller releases with
 * gcache_release; an entry evicted while held is freed on its last release.
 *
 * Ownership: gcache_create returns a heap handle freed by gcache_destroy,
 * after every handle was released.
 */
#ifndef KVANT_GCACHE_H
#define KVANT_GCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/gram.h"
#include "grammar/tmshare.h"
#include "util/err.h"

typedef enum gram_kind {
    GRAM_KIND_GBNF = 0,
    GRAM_KIND_JSON_SCHEMA,
    GRAM_KIND_JSON_OBJECT,   /* source ignored */
    GRAM_KIND_REGEX,
    GRAM_KIND_CHOICE,        /* source: a JSON array of strings */
    GRAM_KIND_COUNT,
} gram_kind;

/* The kind for a name ("gbnf", "json_schema", "json_object", "regex",
 * "choice"), or -1. */
int gram_kind_parse(const char *name);

/* A finished grammar (caller destroys) or NULL with err set. */
gram *gcache_compile(gram_kind kind, const char *src, size_t n, gram_limits lim, kvant_err *err);

typedef struct gcache gcache;
typedef struct gcache_entry gcache_entry;

gcache *gcache_create(int32_t capacity, gram_limits lim);
void gcache_destroy(gcache *c);
/* The compiled grammar for (kind, src), compiled on a miss; NULL with err
 * set on a compile error (errors are not cached). */
gcache_entry *gcache_get(gcache *c, gram_kind kind, const char *src, size_t n, kvant_err *err);
const gram *gcache_gram(const gcache_entry *e);
void gcache_release(gcache *c, gcache_entry *e);
/* The token masks shared by the sequences of entry e (tmshare.h, created
 * on the first call, with TMSHARE_DEFAULT_MASKS masks of n_words words;
 * freed with the entry): bind each sequence's tmask_work to it with
 * tmask_work_share while the caller holds e.  NULL with err set out of
 * memory, or if asked for another n_words than the first call (one
 * vocabulary per cache: tmask_work_share refuses a second one). */
tmshare *gcache_masks(gcache *c, gcache_entry *e, int32_t n_words, kvant_err *err);
/* Hits and misses so far. */
void gcache_stats(gcache *c, int64_t *hits, int64_t *misses);

#endif
