/* tokmask.h - token masks: which vocabulary tokens a grammar state can
 * consume next.
 *
 * A tmask_vocab (tmvocab.h) is built once per vocabulary: a byte trie of
 * every token's bytes and the end-of-sequence ids.  tmask_compute walks the
 * trie depth-first with the recognizer, pushing a byte on the way down and
 * popping it on the way up, so the shared prefixes of tokens are parsed
 * once; a child is entered only if its byte is among the bytes the state
 * can consume (earley_allowed_bytes).  The end-of-sequence ids are allowed
 * iff the state is accepting.
 *
 * What does not depend on the state is computed once, or once per state:
 * - per vocabulary: the trie, with per node the set of bytes that follow it
 *   in the tokens below and their most further bytes; run masks (the
 *   tokens whose first byte is in one set and at most n further bytes in
 *   another), kept by the vocabulary;
 * - per walk: a transition parsed for one byte holds for every byte the
 *   set cannot tell apart (earley_byte_peers); a subtree whose bytes all
 *   lead from the walk's memo state back to it is allowed whole, unvisited;
 *   where the root state allows many bytes and most lead into a run (a
 *   string's characters: looping, or counted as with maxLength), the run's
 *   tokens come from a run mask and their subtrees are skipped;
 * - per grammar and vocabulary: the masks of the states seen, shared by all
 *   sequences (tmshare.h, tmask_work_share; gcache_masks holds one per
 *   cached grammar).
 * The masks are exactly those of the plain walk (w NULL), which the tests
 * compare them with.
 *
 * Threading: tmask_compute uses the given state and work (one thread) and
 * returns the state as it was; the vocabulary and a tmshare may be shared.
 */
#ifndef KVANT_TOKMASK_H
#define KVANT_TOKMASK_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/earley.h"
#include "grammar/tmshare.h"
#include "grammar/tmvocab.h"
#include "util/err.h"

/* Per-sequence scratch and memo for tmask_compute (one thread at a time):
 * - within a call, Earley sets are memoized by their description (items
 *   that still matter; origins: the set itself, a committed set, or a set
 *   of the walk named by its memo state): a byte pushed from a set seen
 *   before is a table lookup that leaves the chart alone, so in a string or
 *   free text each of the 256 bytes is parsed about once per state; a set
 *   is rebuilt from its description only where a byte must be parsed;
 * - across calls, the masks of the last TMASK_CACHE_MASKS states are kept
 *   (keyed by the description, checked against the origin sets' serials), so
 *   successive steps inside one JSON string reuse one mask.
 * Its memory is bounded (TMASK_MEMO_STATES states) and counted by
 * tmask_work_mem_bytes.  Ownership: heap handle, tmask_work_destroy; it
 * borrows v, and is bound to one earley state at a time (reset it with
 * tmask_work_reset when switching states). */
#define TMASK_MEMO_STATES 2048
#define TMASK_MEMO_ITEMS 512     /* sets larger than this are not memoized */
#define TMASK_CACHE_MASKS 8
typedef struct tmask_work tmask_work;
tmask_work *tmask_work_create(const tmask_vocab *v, kvant_err *err);
void tmask_work_destroy(tmask_work *w);
void tmask_work_reset(tmask_work *w);
size_t tmask_work_mem_bytes(const tmask_work *w);
/* Binds w to a shared mask cache (tmshare.h; NULL unbinds; borrowed, must
 * outlive the binding): after a miss in its own cache, tmask_compute looks
 * the state up there, and stores the masks it walks.  The cache is used
 * only for states of its own grammar (others walk as before).  KV_EINVAL
 * if the cache's masks have another size or it serves another vocabulary
 * (tmshare_claim). */
#define TMASK_DESC_SETS 256      /* states reaching more sets are not shared */
int tmask_work_share(tmask_work *w, tmshare *s);

/* Writes the mask of the tokens e can consume (bit i of mask[i >> 5]) into
 * mask[tmask_n_words(v)].  w: the memo (NULL: the plain walk, which is the
 * reference the memoized one is tested against).  Returns the number of
 * allowed tokens, or a negative kvant_status (the state's item limit). */
int32_t tmask_compute(const tmask_vocab *v, earley *e, tmask_work *w, uint32_t *mask,
                      kvant_err *err);

/* Advances e by token id: 1 consumed (an end-of-sequence id is consumed,
 * leaving the state unchanged, iff e accepts), 0 refused (e unchanged),
 * negative on error (e unchanged). */
int tmask_advance(const tmask_vocab *v, earley *e, int32_t id);

#endif
