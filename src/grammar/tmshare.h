/* tmshare.h - token masks shared across the sequences of one grammar and
 * one vocabulary: a bounded, thread-safe map from a grammar state's
 * description (earley_describe: no set indices, so it is the same in every
 * sequence and at every step that reaches the state) to the state's mask.
 *
 * Computing a mask walks the vocabulary trie (milliseconds where most
 * tokens are allowed, as inside a JSON string); a grammar has few distinct
 * described states on its usual paths (a property's string, its number, the
 * keys after it), so once a state was walked by any sequence, every later
 * sequence gets its mask for a lookup and a copy.  The work is thereby done
 * once per (grammar, vocabulary, state), lazily; tokmask.c consults it after
 * its per-sequence cache (tmask_work_share).
 *
 * Bounded: at most max_masks masks; when full, an entry is replaced in
 * clock order (second chance for entries hit since the hand last passed).
 * Memory: max_masks * (n_words * 4 bytes + the descriptions), counted by
 * tmshare_mem_bytes; the mask buffers are allocated at creation, a
 * description's buffer grows only when a longer one is stored.
 *
 * Ownership: tmshare_create returns a heap handle freed by tmshare_destroy
 * after every tmask_work bound to it is gone; the grammar is borrowed.
 * Threading: any number of threads (one mutex, held for a lookup and a copy
 * of one mask, never during a walk).
 */
#ifndef KVANT_TMSHARE_H
#define KVANT_TMSHARE_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/gram.h"
#include "util/err.h"

#define TMSHARE_MAX_KEY 8192       /* longer descriptions are not shared */
#define TMSHARE_DEFAULT_MASKS 512

typedef struct tmshare tmshare;

/* For grammar g and masks of n_words uint32 words. */
tmshare *tmshare_create(const gram *g, int32_t n_words, int32_t max_masks, kvant_err *err);
void tmshare_destroy(tmshare *s);
const gram *tmshare_gram(const tmshare *s);
int32_t tmshare_n_words(const tmshare *s);

/* The mask stored for key[0..n) (hash h) copied into mask: its count of
 * allowed tokens, or -1 (not stored). */
int32_t tmshare_get(tmshare *s, const uint64_t *key, int32_t n, uint64_t h, uint32_t *mask);
/* Stores a mask for key (nothing if present, or if n > TMSHARE_MAX_KEY or
 * out of memory: a cache may forget). */
void tmshare_put(tmshare *s, const uint64_t *key, int32_t n, uint64_t h, const uint32_t *mask,
                 int32_t count);

/* A cache serves one vocabulary: the first caller claims it with its
 * vocabulary's address (tmask_work_share does); 0 if s is now or already
 * that vocabulary's, -1 if another's. */
int tmshare_claim(tmshare *s, const void *vocab);

void tmshare_stats(tmshare *s, int64_t *hits, int64_t *misses, int32_t *n_masks);
size_t tmshare_mem_bytes(tmshare *s);

#endif
