/* gram.h - context-free grammars over bytes: the representation every
 * front end (GBNF, regex, JSON Schema, choice lists) compiles to, and that
 * the Earley recognizer (earley.h) runs.
 *
 * A grammar is a set of nonterminals, each with rules; a rule is a
 * sequence of elements.  An element is a nonterminal (id >= 0) or a
 * terminal: one byte out of a 256-bit byte class (GRAM_TERM(t), < 0).
 * Lexemes are not a separate layer: regular-expression pieces (classes,
 * repetitions, UTF-8 code-point ranges) are expanded into rules by the
 * helpers below (repetition is left-recursive, which Earley runs in
 * constant items per byte).
 *
 * Building: gram_create, then the helpers; each returns an element, or
 * GRAM_BAD once a limit was hit or an allocation failed (the first such
 * error is kept and reported by gram_finish; helpers given GRAM_BAD pass it
 * on, so front ends need not check every call).  gram_finish(start) seals
 * the grammar: it drops rules that can derive no string, computes which
 * nonterminals derive the empty string and the prediction closures, and
 * refuses a grammar whose language is empty.
 *
 * Ownership: gram_create returns a heap handle freed by gram_destroy.
 * Threading: building is single-threaded; a finished grammar is immutable
 * and may be shared by any number of recognizers on any threads.
 */
#ifndef KVANT_GRAM_H
#define KVANT_GRAM_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define GRAM_BAD INT32_MIN
#define GRAM_TERM(t) (-(int32_t)(t) - 1)
#define GRAM_IS_TERM(e) ((e) < 0 && (e) != GRAM_BAD)
#define GRAM_TERM_ID(e) (-(e) - 1)
#define GRAM_MAX_CP 0x10FFFFu

/* Every limit of a grammar and of the recognizer's state, in one place. */
typedef struct gram_limits {
    int32_t max_rules;          /* rules in the grammar */
    int32_t max_elems;          /* rule elements in all (the grammar's size) */
    int32_t max_closure;        /* prediction-closure entries in all */
    int64_t max_state_items;    /* Earley items a recognizer may hold */
    int32_t max_repeat;         /* the largest finite bound of {m,n} */
} gram_limits;
gram_limits gram_limits_default(void);

typedef struct gram gram;

gram *gram_create(gram_limits lim);
void gram_destroy(gram *g);

/* A new nonterminal with no rules (yet). */
int32_t gram_nt(gram *g);
/* Adds lhs ::= rhs[0..n).  Returns 0, or GRAM_BAD (error kept). */
int gram_rule(gram *g, int32_t lhs, const int32_t *rhs, int32_t n);
/* Records a front end's error (first one wins) and returns GRAM_BAD. */
int32_t gram_fail(gram *g, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int gram_failed(const gram *g);

/* Elements.  set: 256 bits, bit b of set[b >> 5]. */
int32_t gram_class(gram *g, const uint32_t set[8]);
int32_t gram_byte(gram *g, uint8_t b);
int32_t gram_bytes(gram *g, const char *s, size_t n);     /* a literal */
int32_t gram_eps(gram *g);                                 /* the empty string */
int32_t gram_seq(gram *g, const int32_t *e, int32_t n);
int32_t gram_alt(gram *g, const int32_t *e, int32_t n);
int32_t gram_opt(gram *g, int32_t e);
int32_t gram_star(gram *g, int32_t e);
int32_t gram_plus(gram *g, int32_t e);
/* e{min,max}; max < 0: unbounded.  Bounds above max_repeat are refused. */
int32_t gram_repeat(gram *g, int32_t e, int32_t min, int32_t max);
/* The UTF-8 encodings of the code points in ranges[0..2n) (lo, hi pairs,
 * inclusive, any order); negate: of every other code point.  Surrogates
 * (U+D800..U+DFFF) are never matched. */
int32_t gram_cpset(gram *g, const uint32_t *ranges, int32_t n, int negate);

/* One code point, as its UTF-8 bytes. */
int32_t gram_cp(gram *g, uint32_t cp);
/* Decodes one UTF-8 code point from s (n > 0 bytes): the bytes it took,
 * or -1 for an invalid sequence (overlong, surrogate, truncated). */
int gram_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Seals the grammar with start symbol start.  Returns KV_OK or the first
 * error (a limit, out of memory, a front end's error, an empty language). */
int gram_finish(gram *g, int32_t start, kvant_err *err);

/* Size of the grammar's tables in bytes (accounting). */
size_t gram_mem_bytes(const gram *g);

/* ---- the finished tables, read by the recognizer (earley.c) ---------- */
#define GRAM_END INT32_MAX      /* pos_elem at the end of a rule */
typedef struct gram_tables {
    int32_t n_nt, n_terms, n_pos;
    const int32_t *pos_elem;     /* [n_pos] element at a dotted position, or GRAM_END */
    const int32_t *pos_lhs;      /* [n_pos] the rule's nonterminal */
    const uint8_t *nullable;     /* [n_nt] */
    const uint32_t *terms;       /* [n_terms][8] byte classes */
    const int32_t *clo_off;      /* [n_nt + 1] into clo_pos */
    const int32_t *clo_pos;      /* positions predicted (origin: here) by a nonterminal */
    const int32_t *clon_off;     /* [n_nt + 1] into clo_nt */
    const int32_t *clo_nt;       /* nonterminals predicted with it */
    int32_t start_pos;           /* the augmented rule S' ::= . start */
    int32_t start_nt;            /* S' */
    gram_limits lim;
} gram_tables;
/* The tables of a finished grammar (NULL before gram_finish succeeded). */
const gram_tables *gram_get_tables(const gram *g);

#endif
