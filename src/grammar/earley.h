/* earley.h - an Earley recognizer over bytes for a finished grammar.
 *
 * Why Earley: it runs any context-free grammar (ambiguous, left- or
 * right-recursive, with empty rules) without the grammar transformations a
 * pushdown automaton needs, and it is prefix-correct: after each byte the
 * state knows whether some continuation can still complete the grammar
 * (gram_finish drops rules that derive nothing, so no dead branch stays
 * "viable").  Empty rules follow Aycock and Horspool (a nullable
 * nonterminal is stepped over when predicted) and predictions copy the
 * closures gram_finish precomputed.  Repetition is left-recursive, so a
 * long string or list costs constant items per byte.
 *
 * The state is a stack of Earley sets, one per byte consumed, plus set 0.
 * earley_push_byte adds a set (or refuses the byte and leaves the state as
 * it was); earley_pop and earley_truncate remove sets: the token mask walks
 * the vocabulary trie by pushing and popping (tokmask.h), and a rejected or
 * rolled-back token truncates.  Memory grows with the bytes consumed (the
 * sets stay, later completions read them); earley_mem_bytes accounts it and
 * gram_limits.max_state_items bounds it (KV_ERANGE past the bound).
 *
 * Ownership: earley_create returns a heap handle freed by earley_destroy;
 * the grammar is borrowed and must outlive it.  Threading: one state is
 * used by one thread at a time; many states may share one grammar.
 */
#ifndef KVANT_EARLEY_H
#define KVANT_EARLEY_H

#include <stddef.h>
#include <stdint.h>

#include "grammar/gram.h"
#include "util/err.h"

typedef struct earley earley;

earley *earley_create(const gram *g, kvant_err *err);
void earley_destroy(earley *e);

/* Consumes one byte: 1 accepted (a set pushed), 0 refused (state
 * unchanged), or a negative kvant_status (the state limit; unchanged). */
int earley_push_byte(earley *e, uint8_t b);
/* Removes the newest set (no-op at set 0). */
void earley_pop(earley *e);
/* Number of sets (bytes consumed + 1); earley_truncate(e, n) goes back to
 * the state after n - 1 bytes. */
int32_t earley_depth(const earley *e);
void earley_truncate(earley *e, int32_t n_sets);
void earley_reset(earley *e);

/* Whether the bytes so far are a complete sentence of the grammar. */
int earley_accepting(const earley *e);
/* The bytes the newest set can consume (256 bits); all zero: nothing. */
void earley_allowed_bytes(const earley *e, uint32_t out[8]);
/* Consumes a byte string; on refusal restores the state and returns 0. */
int earley_push_bytes(earley *e, const uint8_t *s, size_t n);

/* ---- memoization support (tokmask.c) ----
 * The newest set, described for reuse: its items that still matter (not
 * completed ones), each (pos << 32 | origin code), sorted, where the code
 * of the set itself is EARLEY_SELF and other origins are set indices.
 * Fails (-1) if an origin lies at or above set index origin_limit (a set
 * that may change), or if more than cap items.  Returns the count. */
#define EARLEY_SELF 0xFFFFFFFFu
int32_t earley_top_items(const earley *e, int32_t origin_limit, uint64_t *out, int32_t cap);
/* A number naming set idx's contents: never reused, so while set j keeps
 * its serial, sets 0..j are unchanged (sets go only from the top). */
uint64_t earley_set_serial(const earley *e, int32_t idx);
/* The newest set's items that still matter, raw: (pos << 32 | origin set
 * index), unsorted; -1 if more than cap. */
int32_t earley_top_raw(const earley *e, uint64_t *out, int32_t cap);
/* Pushes a set from such a description (its origin sets must still be
 * there): 1, or a negative kvant_status (state unchanged). */
int earley_push_items(earley *e, const uint64_t *items, int32_t n);

/* A description of the newest set that names no set index, for masks
 * shared across sequences (tmshare.h): the sets reachable from the newest
 * through origins (of the newest set's items that still matter, then of
 * the reached sets' items before a nonterminal - the only ones a later
 * completion reads), ranked newest first, each as a header word
 * (EARLEY_DESC_SET << 32 | rank) then its items (pos << 32 | rank of the
 * origin), sorted.  Two states with equal descriptions (and equal
 * earley_accepting) accept the same continuations.  -1 if more than
 * max_sets sets or cap words; sets: scratch of max_sets entries. */
#define EARLEY_DESC_SET 0xFFFFFFFFu
int32_t earley_describe(const earley *e, uint64_t *out, int32_t cap, int32_t *sets,
                        int32_t max_sets);
/* The bytes set idx cannot tell from b (bit x of out[x >> 5]): those in
 * exactly the terminal classes of its items that b is in.  Pushing any of
 * them onto that set gives the same items as pushing b. */
void earley_byte_peers(const earley *e, int32_t idx, uint8_t b, uint32_t out[8]);
/* The tables of the grammar e runs (to check a shared memo is its own). */
const gram_tables *earley_tables(const earley *e);

/* Bytes the state holds (accounting), and its item count. */
size_t earley_mem_bytes(const earley *e);
int64_t earley_n_items(const earley *e);

#endif
