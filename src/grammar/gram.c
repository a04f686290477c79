/* gram.c - building and sealing byte-level context-free grammars (gram.h).
 *
 * Invariants: rule elements are either nonterminal ids below n_nt or
 * terminals below n_terms; terminal byte classes are deduplicated, so two
 * classes with the same bits are the same terminal.  After gram_finish the
 * tables in `t` are immutable.
 */
#include "grammar/gram.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gram_rule_rec {
    int32_t lhs, off, len;   /* elems[off .. off + len) */
} gram_rule_rec;

/* How a nonterminal was made by gram_opt / gram_star / gram_plus (its body in
 * nt_body): a repetition of a repetition is folded into one ((x*)* = x*,
 * (x?)+ = x*, ...), so a star never repeats a nullable repetition, whose
 * derivations of the empty string would multiply with each nesting. */
enum { NK_PLAIN = 0, NK_OPT, NK_STAR, NK_PLUS };

struct gram {
    gram_limits lim;
    int32_t n_nt, cap_nt;
    uint8_t *nt_kind;                          /* [cap_nt] NK_* */
    int32_t *nt_body;                          /* [cap_nt] */
    int32_t n_rules, cap_rules;
    gram_rule_rec *rules;                      /* [n_rules] */
    int32_t n_elems, cap_elems;
    int32_t *elems;                            /* [n_elems] */
    int32_t n_terms, cap_terms;
    uint32_t *terms;                           /* [n_terms][8] */
    int32_t *term_hash;                        /* open addressing, -1 = empty */
    int32_t term_hash_cap;
    int failed;
    kvant_err err;
    int finished;
    /* sealed tables (owned) */
    int32_t *pos_elem, *pos_lhs, *clo_off, *clo_pos, *clon_off, *clo_nt;
    uint8_t *nullable;
    gram_tables t;
};

gram_limits gram_limits_default(void)
{
    return (gram_limits){
        .max_rules = 200000,
        .max_elems = 1000000,
        .max_closure = 4000000,
        .max_state_items = 16000000,
        .max_repeat = 2000,
    };
}

gram *gram_create(gram_limits lim)
{
    gram *g = calloc(1, sizeof *g);
    if (g)
        g->lim = lim;
    return g;
}

void gram_destroy(gram *g)
{
    if (!g)
        return;
    free(g->rules);
    free(g->elems);
    free(g->terms);
    free(g->term_hash);
    free(g->pos_elem);
    free(g->pos_lhs);
    free(g->clo_off);
    free(g->clo_pos);
    free(g->clon_off);
    free(g->clo_nt);
    free(g->nullable);
    free(g->nt_kind);
    free(g->nt_body);
    free(g);
}

int32_t gram_fail(gram *g, int code, const char *fmt, ...)
{
    if (!g->failed) {
        va_list ap;
        va_start(ap, fmt);
        g->err.code = code;
        vsnprintf(g->err.msg, sizeof g->err.msg, fmt, ap);
        va_end(ap);
        g->failed = 1;
    }
    return GRAM_BAD;
}

int gram_failed(const gram *g)
{
    return g->failed;
}

/* Grows *p (elements of size sz) to hold need; 0 or -1. */
static int grow(void **p, int32_t *cap, int32_t need, size_t sz)
{
    if (need <= *cap)
        return 0;
    int64_t nc = *cap ? (int64_t)*cap * 2 : 64;
    while (nc < need)
        nc *= 2;
    if (nc > INT32_MAX)
        nc = INT32_MAX;
    void *q = realloc(*p, (size_t)nc * sz);
    if (!q)
        return -1;
    *p = q;
    *cap = (int32_t)nc;
    return 0;
}

int32_t gram_nt(gram *g)
{
    if (g->failed)
        return GRAM_BAD;
    if (g->n_nt >= g->lim.max_rules)
        return gram_fail(g, KV_ERANGE, "grammar too large: more than %d nonterminals",
                         g->lim.max_rules);
    if (g->n_nt >= g->cap_nt) {
        const int32_t cap = g->cap_nt ? 2 * g->cap_nt : 256;
        uint8_t *k = realloc(g->nt_kind, (size_t)cap);
        if (k)
            g->nt_kind = k;
        int32_t *b = k ? realloc(g->nt_body, (size_t)cap * sizeof *b) : NULL;
        if (!b)
            return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
        g->nt_body = b;
        memset(g->nt_kind + g->cap_nt, 0, (size_t)(cap - g->cap_nt));
        g->cap_nt = cap;
    }
    return g->n_nt++;
}

int gram_rule(gram *g, int32_t lhs, const int32_t *rhs, int32_t n)
{
    if (g->failed || lhs == GRAM_BAD)
        return GRAM_BAD;
    for (int32_t i = 0; i < n; i++)
        if (rhs[i] == GRAM_BAD)
            return GRAM_BAD;
    if (g->n_rules >= g->lim.max_rules)
        return gram_fail(g, KV_ERANGE, "grammar too large: more than %d rules", g->lim.max_rules);
    if ((int64_t)g->n_elems + n + 1 > g->lim.max_elems)
        return gram_fail(g, KV_ERANGE, "grammar too large: more than %d elements",
                         g->lim.max_elems);
    if (grow((void **)&g->rules, &g->cap_rules, g->n_rules + 1, sizeof(gram_rule_rec)) ||
        grow((void **)&g->elems, &g->cap_elems, g->n_elems + n + 1, sizeof(int32_t)))
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    g->rules[g->n_rules++] = (gram_rule_rec){lhs, g->n_elems, n};
    if (n)
        memcpy(g->elems + g->n_elems, rhs, (size_t)n * sizeof *rhs);
    g->n_elems += n;
    return 0;
}

static uint32_t set_hash(const uint32_t *s)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < 8; i++)
        h = (h ^ s[i]) * 16777619u;
    return h;
}

static int term_rehash(gram *g, int32_t cap)
{
    int32_t *h = malloc((size_t)cap * sizeof *h);
    if (!h)
        return -1;
    for (int32_t i = 0; i < cap; i++)
        h[i] = -1;
    for (int32_t t = 0; t < g->n_terms; t++) {
        uint32_t k = set_hash(g->terms + 8 * t) & (uint32_t)(cap - 1);
        while (h[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        h[k] = t;
    }
    free(g->term_hash);
    g->term_hash = h;
    g->term_hash_cap = cap;
    return 0;
}

int32_t gram_class(gram *g, const uint32_t set[8])
{
    if (g->failed)
        return GRAM_BAD;
    if (g->n_terms * 2 + 2 > g->term_hash_cap &&
        term_rehash(g, g->term_hash_cap ? g->term_hash_cap * 2 : 64))
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    uint32_t m = (uint32_t)(g->term_hash_cap - 1), k = set_hash(set) & m;
    for (; g->term_hash[k] >= 0; k = (k + 1) & m)
        if (!memcmp(g->terms + 8 * g->term_hash[k], set, 32))
            return GRAM_TERM(g->term_hash[k]);
    if (g->n_terms >= g->lim.max_rules)
        return gram_fail(g, KV_ERANGE, "grammar too large: more than %d byte classes",
                         g->lim.max_rules);
    if (grow((void **)&g->terms, &g->cap_terms, 8 * (g->n_terms + 1), sizeof(uint32_t)))
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    memcpy(g->terms + 8 * g->n_terms, set, 32);
    g->term_hash[k] = g->n_terms;
    return GRAM_TERM(g->n_terms++);
}

int32_t gram_byte(gram *g, uint8_t b)
{
    uint32_t s[8] = {0};
    s[b >> 5] |= 1u << (b & 31);
    return gram_class(g, s);
}

int32_t gram_eps(gram *g)
{
    int32_t n = gram_nt(g);
    gram_rule(g, n, NULL, 0);
    return g->failed ? GRAM_BAD : n;
}

int32_t gram_seq(gram *g, const int32_t *e, int32_t n)
{
    if (n == 1)
        return e[0];
    int32_t nt = gram_nt(g);
    gram_rule(g, nt, e, n);
    return g->failed ? GRAM_BAD : nt;
}

int32_t gram_bytes(gram *g, const char *s, size_t n)
{
    if (n == 1)
        return gram_byte(g, (uint8_t)s[0]);
    if (n > (size_t)g->lim.max_elems)
        return gram_fail(g, KV_ERANGE, "grammar too large: a literal of %zu bytes", n);
    int32_t *e = malloc((n ? n : 1) * sizeof *e);
    if (!e)
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    for (size_t i = 0; i < n; i++)
        e[i] = gram_byte(g, (uint8_t)s[i]);
    int32_t r = gram_seq(g, e, (int32_t)n);
    free(e);
    return r;
}

int32_t gram_alt(gram *g, const int32_t *e, int32_t n)
{
    if (n == 1)
        return e[0];
    int all_terms = n > 0;
    for (int32_t i = 0; i < n; i++) {
        if (e[i] == GRAM_BAD)
            return GRAM_BAD;
        all_terms &= GRAM_IS_TERM(e[i]);
    }
    if (all_terms && !g->failed) {   /* one class: fewer Earley items */
        uint32_t s[8] = {0};
        for (int32_t i = 0; i < n; i++)
            for (int w = 0; w < 8; w++)
                s[w] |= g->terms[8 * GRAM_TERM_ID(e[i]) + w];
        return gram_class(g, s);
    }
    int32_t nt = gram_nt(g);
    for (int32_t i = 0; i < n; i++)
        gram_rule(g, nt, &e[i], 1);
    return g->failed ? GRAM_BAD : nt;
}

/* NK_* of e (a terminal: NK_PLAIN). */
static int rep_kind(const gram *g, int32_t e)
{
    return e >= 0 && e < g->n_nt ? g->nt_kind[e] : NK_PLAIN;
}

/* A new repetition nonterminal of kind k over body e, its rules added:
 * opt ::= eps | e, star ::= eps | star e, plus ::= e | plus e. */
static int32_t rep_nt(gram *g, int k, int32_t e)
{
    int32_t nt = gram_nt(g);
    if (nt == GRAM_BAD)
        return GRAM_BAD;
    int32_t r[2] = {nt, e};
    if (k == NK_PLUS)
        gram_rule(g, nt, &e, 1);
    else
        gram_rule(g, nt, NULL, 0);
    if (k == NK_OPT)
        gram_rule(g, nt, &e, 1);
    else
        gram_rule(g, nt, r, 2);
    if (g->failed)
        return GRAM_BAD;
    g->nt_kind[nt] = (uint8_t)k;
    g->nt_body[nt] = e;
    return nt;
}

int32_t gram_opt(gram *g, int32_t e)
{
    if (e == GRAM_BAD)
        return GRAM_BAD;
    const int k = rep_kind(g, e);
    if (k == NK_OPT || k == NK_STAR) /* (x?)? = x?, (x*)? = x* */
        return e;
    return k == NK_PLUS ? rep_nt(g, NK_STAR, g->nt_body[e]) : rep_nt(g, NK_OPT, e);
}

int32_t gram_star(gram *g, int32_t e)
{
    if (e == GRAM_BAD)
        return GRAM_BAD;
    const int k = rep_kind(g, e);
    if (k == NK_STAR) /* (x*)* = x* */
        return e;
    return rep_nt(g, NK_STAR, k == NK_PLAIN ? e : g->nt_body[e]); /* (x?)* = (x+)* = x* */
}

int32_t gram_plus(gram *g, int32_t e)
{
    if (e == GRAM_BAD)
        return GRAM_BAD;
    const int k = rep_kind(g, e);
    if (k == NK_STAR || k == NK_PLUS) /* (x*)+ = x*, (x+)+ = x+ */
        return e;
    return k == NK_OPT ? rep_nt(g, NK_STAR, g->nt_body[e]) : rep_nt(g, NK_PLUS, e);
}

/* e{min,max} as left-recursive counts: A_0 = eps, A_k ::= A_(k-1) e, and
 * the result A_min | .. | A_max (or A_min e* when unbounded).  All A_k of
 * one repetition share its start as their origin, so a set inside it holds
 * one item per live count and never points at a set inside the
 * repetition (the token-mask memo can reuse it). */
int32_t gram_repeat(gram *g, int32_t e, int32_t min, int32_t max)
{
    if (e == GRAM_BAD || g->failed)
        return GRAM_BAD;
    if (min < 0 || (max >= 0 && max < min))
        return gram_fail(g, KV_EINVAL, "bad repetition bounds {%d,%d}", min, max);
    if (min > g->lim.max_repeat || max > g->lim.max_repeat)
        return gram_fail(g, KV_ERANGE, "repetition bound above the limit of %d",
                         g->lim.max_repeat);
    int32_t top = max < 0 ? min : max;
    int32_t *alts = malloc((size_t)(top - min + 1) * sizeof *alts);
    if (!alts)
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    int32_t a = gram_eps(g);
    for (int32_t k = 0; k <= top && !g->failed; k++) {
        if (k > 0) {
            int32_t nt = gram_nt(g), r[2] = {a, e};
            gram_rule(g, nt, r, 2);
            a = nt;
        }
        if (k >= min)
            alts[k - min] = a;
    }
    int32_t res = GRAM_BAD;
    if (!g->failed)
        res = max < 0 ? gram_seq(g, (int32_t[]){alts[0], gram_star(g, e)}, 2)
                      : gram_alt(g, alts, top - min + 1);
    free(alts);
    return g->failed ? GRAM_BAD : res;
}

/* ---- code-point ranges -> UTF-8 byte sequences ------------------------ */

typedef struct cp_sink {
    gram *g;
    int32_t *alts;
    int32_t n, cap;
} cp_sink;

static int utf8_enc(uint32_t c, uint8_t *o)
{
    if (c < 0x80) {
        o[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (uint8_t)(0xC0 | (c >> 6));
        o[1] = (uint8_t)(0x80 | (c & 63));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (c >> 12));
        o[1] = (uint8_t)(0x80 | ((c >> 6) & 63));
        o[2] = (uint8_t)(0x80 | (c & 63));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (c >> 18));
    o[1] = (uint8_t)(0x80 | ((c >> 12) & 63));
    o[2] = (uint8_t)(0x80 | ((c >> 6) & 63));
    o[3] = (uint8_t)(0x80 | (c & 63));
    return 4;
}

int32_t gram_cp(gram *g, uint32_t cp)
{
    uint8_t b[4];
    if (cp > GRAM_MAX_CP || (cp >= 0xD800 && cp <= 0xDFFF))
        return gram_fail(g, KV_EINVAL, "code point U+%04X is not a character", cp);
    int n = utf8_enc(cp, b);
    return gram_bytes(g, (const char *)b, (size_t)n);
}

int gram_utf8_decode(const char *s, size_t n, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s;
    int len = u[0] < 0x80 ? 1 : u[0] < 0xC2 ? 0 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : u[0] < 0xF5 ? 4 : 0;
    if (!len || (size_t)len > n)
        return -1;
    uint32_t c = len == 1 ? u[0] : (uint32_t)(u[0] & (0x7F >> len));
    for (int i = 1; i < len; i++) {
        if ((u[i] & 0xC0) != 0x80)
            return -1;
        c = c << 6 | (u[i] & 63);
    }
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min[len] || c > GRAM_MAX_CP || (c >= 0xD800 && c <= 0xDFFF))
        return -1;
    *cp = c;
    return len;
}

static int32_t byte_range(gram *g, uint8_t lo, uint8_t hi)
{
    uint32_t s[8] = {0};
    for (unsigned b = lo; b <= hi; b++)
        s[b >> 5] |= 1u << (b & 31);
    return gram_class(g, s);
}

static void sink_add(cp_sink *k, int32_t e)
{
    if (grow((void **)&k->alts, &k->cap, k->n + 1, sizeof(int32_t))) {
        gram_fail(k->g, KV_ENOMEM, "out of memory building a grammar");
        return;
    }
    k->alts[k->n++] = e;
}

/* Splits [lo, hi] until both ends encode to the same length and every
 * continuation byte spans its whole range below the first differing one
 * (the classic UTF-8 range split), then emits one byte-class sequence. */
static void cp_range(cp_sink *k, uint32_t lo, uint32_t hi)
{
    static const uint32_t bound[3] = {0x7F, 0x7FF, 0xFFFF};
    if (lo > hi || k->g->failed)
        return;
    for (int i = 0; i < 3; i++)
        if (lo <= bound[i] && hi > bound[i]) {
            cp_range(k, lo, bound[i]);
            cp_range(k, bound[i] + 1, hi);
            return;
        }
    uint8_t a[4], b[4];
    int n = utf8_enc(lo, a);
    utf8_enc(hi, b);
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) {
                cp_range(k, lo, lo | m);
                cp_range(k, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                cp_range(k, lo, (hi & ~m) - 1);
                cp_range(k, hi & ~m, hi);
                return;
            }
        }
    }
    int32_t seq[4];
    for (int i = 0; i < n; i++)
        seq[i] = byte_range(k->g, a[i], b[i]);
    sink_add(k, gram_seq(k->g, seq, n));
}

static int cmp_u32pair(const void *a, const void *b)
{
    const uint32_t *x = a, *y = b;
    return x[0] < y[0] ? -1 : x[0] > y[0];
}

/* Sorted, merged, optionally complemented ranges in r (capacity n + 1
 * pairs); returns the count, or -1 out of memory.  Surrogates are cut
 * out later, in gram_cpset. */
static int32_t cp_normalize(uint32_t *r, int32_t n, int negate)
{
    for (int32_t i = 0; i < n; i++) {
        if (r[2 * i] > r[2 * i + 1]) {
            uint32_t t = r[2 * i];
            r[2 * i] = r[2 * i + 1];
            r[2 * i + 1] = t;
        }
        if (r[2 * i + 1] > GRAM_MAX_CP)
            r[2 * i + 1] = GRAM_MAX_CP;
    }
    qsort(r, (size_t)n, 2 * sizeof *r, cmp_u32pair);
    int32_t m = 0;
    for (int32_t i = 0; i < n; i++) {
        if (r[2 * i] > GRAM_MAX_CP)
            continue;
        if (m && r[2 * i] <= r[2 * m - 1] + 1) {
            if (r[2 * i + 1] > r[2 * m - 1])
                r[2 * m - 1] = r[2 * i + 1];
        } else {
            r[2 * m] = r[2 * i];
            r[2 * m + 1] = r[2 * i + 1];
            m++;
        }
    }
    if (!negate)
        return m;
    uint32_t *c = malloc((size_t)(m ? m : 1) * 2 * sizeof *c);
    if (!c)
        return -1;
    memcpy(c, r, (size_t)m * 2 * sizeof *c);
    int32_t o = 0;
    uint32_t next = 0;
    for (int32_t i = 0; i < m; i++) {
        if (c[2 * i] > next) {
            r[2 * o] = next;
            r[2 * o + 1] = c[2 * i] - 1;
            o++;
        }
        next = c[2 * i + 1] + 1;
    }
    if (next <= GRAM_MAX_CP) {
        r[2 * o] = next;
        r[2 * o + 1] = GRAM_MAX_CP;
        o++;
    }
    free(c);
    return o;
}

int32_t gram_cpset(gram *g, const uint32_t *ranges, int32_t n, int negate)
{
    if (g->failed)
        return GRAM_BAD;
    if (n < 0 || n > g->lim.max_elems)
        return gram_fail(g, KV_ERANGE, "grammar too large: a class of %d ranges", n);
    uint32_t *r = malloc((size_t)(n + 1) * 2 * sizeof *r);
    if (!r)
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    if (n)
        memcpy(r, ranges, (size_t)n * 2 * sizeof *r);
    int32_t m = cp_normalize(r, n, negate);
    if (m < 0) {
        free(r);
        return gram_fail(g, KV_ENOMEM, "out of memory building a grammar");
    }
    cp_sink k = {.g = g};
    uint32_t ascii[8] = {0};
    int any_ascii = 0;
    for (int32_t i = 0; i < m; i++) {
        uint32_t lo = r[2 * i], hi = r[2 * i + 1];
        for (; lo <= hi && lo < 0x80; lo++, any_ascii = 1)   /* one class for ASCII */
            ascii[lo >> 5] |= 1u << (lo & 31);
        if (lo > hi)
            continue;
        if (lo <= 0xDFFF && hi >= 0xD800) {
            cp_range(&k, lo, 0xD7FF < lo ? lo - 1 : 0xD7FF);
            cp_range(&k, 0xE000 > hi ? hi + 1 : 0xE000, hi);
        } else {
            cp_range(&k, lo, hi);
        }
    }
    free(r);
    if (any_ascii)
        sink_add(&k, gram_class(g, ascii));
    int32_t res;
    if (g->failed)
        res = GRAM_BAD;
    else if (k.n == 0)   /* no code point at all: a class no byte matches */
        res = gram_class(g, (uint32_t[8]){0});
    else
        res = gram_alt(g, k.alts, k.n);
    free(k.alts);
    return res;
}

/* ---- sealing ------------------------------------------------------------ */

/* Marks rules whose elements can all derive some string; returns the
 * nonterminal flags (caller frees) or NULL. */
static uint8_t *productive_nts(const gram *g, uint8_t *rule_live)
{
    uint8_t *prod = calloc((size_t)g->n_nt + 1, 1);
    if (!prod)
        return NULL;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (rule_live[r])
                continue;
            int ok = 1;
            for (int32_t i = 0; i < g->rules[r].len && ok; i++) {
                int32_t e = g->elems[g->rules[r].off + i];
                if (GRAM_IS_TERM(e)) {
                    const uint32_t *s = g->terms + 8 * GRAM_TERM_ID(e);
                    ok = (s[0] | s[1] | s[2] | s[3] | s[4] | s[5] | s[6] | s[7]) != 0;
                } else {
                    ok = prod[e];
                }
            }
            if (ok) {
                rule_live[r] = 1;
                if (!prod[g->rules[r].lhs])
                    prod[g->rules[r].lhs] = changed = 1;
            }
        }
    }
    return prod;
}

static void compute_nullable(gram *g, const uint8_t *rule_live)
{
    for (int changed = 1; changed;) {
        changed = 0;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (!rule_live[r] || g->nullable[g->rules[r].lhs])
                continue;
            int ok = 1;
            for (int32_t i = 0; i < g->rules[r].len && ok; i++) {
                int32_t e = g->elems[g->rules[r].off + i];
                ok = !GRAM_IS_TERM(e) && g->nullable[e];
            }
            if (ok)
                g->nullable[g->rules[r].lhs] = changed = 1;
        }
    }
}

/* Positions of live rules, END-terminated; nt_off/nt_pos list each
 * nonterminal's rule starts. */
static int layout_positions(gram *g, const uint8_t *rule_live, int32_t **nt_off, int32_t **nt_pos)
{
    int32_t np = 0;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (rule_live[r])
            np += g->rules[r].len + 1;
    g->pos_elem = malloc((size_t)(np ? np : 1) * sizeof(int32_t));
    g->pos_lhs = malloc((size_t)(np ? np : 1) * sizeof(int32_t));
    *nt_off = calloc((size_t)g->n_nt + 1, sizeof(int32_t));
    *nt_pos = malloc(((size_t)(uint32_t)g->n_rules + 1) * sizeof(int32_t));
    if (!g->pos_elem || !g->pos_lhs || !*nt_off || !*nt_pos)
        return -1;
    for (int32_t r = 0; r < g->n_rules; r++)
        if (rule_live[r])
            (*nt_off)[g->rules[r].lhs + 1]++;
    for (int32_t i = 0; i < g->n_nt; i++)
        (*nt_off)[i + 1] += (*nt_off)[i];
    int32_t *fill = calloc((size_t)g->n_nt, sizeof(int32_t));
    if (!fill)
        return -1;
    np = 0;
    for (int32_t r = 0; r < g->n_rules; r++) {
        if (!rule_live[r])
            continue;
        int32_t lhs = g->rules[r].lhs;
        (*nt_pos)[(*nt_off)[lhs] + fill[lhs]++] = np;
        for (int32_t i = 0; i < g->rules[r].len; i++) {
            g->pos_elem[np] = g->elems[g->rules[r].off + i];
            g->pos_lhs[np++] = lhs;
        }
        g->pos_elem[np] = GRAM_END;
        g->pos_lhs[np++] = lhs;
    }
    free(fill);
    g->t.n_pos = np;
    return 0;
}

typedef struct clo_buf {
    int32_t *v;
    int32_t n, cap;
} clo_buf;

static int clo_push(clo_buf *b, int32_t x)
{
    if (grow((void **)&b->v, &b->cap, b->n + 1, sizeof(int32_t)))
        return -1;
    b->v[b->n++] = x;
    return 0;
}

/* For each nonterminal A: the positions (and nonterminals) a prediction
 * of A adds with origin "here", nullable prefixes skipped (Aycock and
 * Horspool), so the recognizer predicts with one copy. */
static int build_closures(gram *g, const int32_t *nt_off, const int32_t *nt_pos)
{
    int32_t n_nt = g->n_nt, n_pos = g->t.n_pos;
    uint32_t *seen_pos = calloc((size_t)n_pos + 1, sizeof(uint32_t));
    uint32_t *seen_nt = calloc((size_t)n_nt + 1, sizeof(uint32_t));
    clo_buf pos = {0}, nts = {0};
    g->clo_off = calloc((size_t)n_nt + 1, sizeof(int32_t));
    g->clon_off = calloc((size_t)n_nt + 1, sizeof(int32_t));
    int rc = (!seen_pos || !seen_nt || !g->clo_off || !g->clon_off) ? -1 : 0;
    for (int32_t a = 0; a < n_nt && !rc; a++) {
        uint32_t stamp = (uint32_t)a + 1;
        int32_t first_nt = nts.n;
        seen_nt[a] = stamp;
        rc |= clo_push(&nts, a);
        for (int32_t k = first_nt; k < nts.n && !rc; k++) {
            int32_t b = nts.v[k];
            for (int32_t j = nt_off[b]; j < nt_off[b + 1] && !rc; j++) {
                for (int32_t p = nt_pos[j];; p++) {
                    if (seen_pos[p] != stamp) {
                        seen_pos[p] = stamp;
                        rc |= clo_push(&pos, p);
                    }
                    int32_t e = g->pos_elem[p];
                    if (e == GRAM_END || GRAM_IS_TERM(e))
                        break;
                    if (seen_nt[e] != stamp) {
                        seen_nt[e] = stamp;
                        rc |= clo_push(&nts, e);
                    }
                    if (!g->nullable[e])
                        break;
                }
            }
        }
        if (pos.n > g->lim.max_closure) {
            rc = 1;
            break;
        }
        g->clo_off[a + 1] = pos.n;
        g->clon_off[a + 1] = nts.n;
    }
    free(seen_pos);
    free(seen_nt);
    g->clo_pos = pos.v;
    g->clo_nt = nts.v;
    return rc;
}

int gram_finish(gram *g, int32_t start, kvant_err *err)
{
    if (g->finished)
        return kvant_err_set(err, KV_EINVAL, "grammar already finished");
    int32_t s = gram_nt(g);
    if (start == GRAM_BAD)
        s = GRAM_BAD;
    gram_rule(g, s, &start, 1);
    if (g->failed)
        return kvant_err_set(err, g->err.code, "%s", g->err.msg);
    uint8_t *live = calloc((size_t)g->n_rules + 1, 1);
    uint8_t *prod = live ? productive_nts(g, live) : NULL;
    g->nullable = calloc((size_t)g->n_nt + 1, 1);
    int32_t *nt_off = NULL, *nt_pos = NULL;
    int rc = KV_OK;
    if (!prod || !g->nullable) {
        rc = kvant_err_set(err, KV_ENOMEM, "out of memory sealing a grammar");
    } else if (!prod[s]) {
        rc = kvant_err_set(err, KV_EINVAL, "the grammar can accept nothing");
    } else {
        compute_nullable(g, live);
        if (layout_positions(g, live, &nt_off, &nt_pos))
            rc = kvant_err_set(err, KV_ENOMEM, "out of memory sealing a grammar");
        else if ((rc = build_closures(g, nt_off, nt_pos)) != 0)
            rc = kvant_err_set(err, rc < 0 ? KV_ENOMEM : KV_ERANGE,
                               rc < 0 ? "out of memory sealing a grammar"
                                      : "grammar too large: prediction closures above %d",
                               g->lim.max_closure);
    }
    if (rc == KV_OK) {
        g->t = (gram_tables){
            .n_nt = g->n_nt, .n_terms = g->n_terms, .n_pos = g->t.n_pos,
            .pos_elem = g->pos_elem, .pos_lhs = g->pos_lhs, .nullable = g->nullable,
            .terms = g->terms, .clo_off = g->clo_off, .clo_pos = g->clo_pos,
            .clon_off = g->clon_off, .clo_nt = g->clo_nt,
            .start_pos = nt_pos[nt_off[s]], .start_nt = s, .lim = g->lim,
        };
        g->finished = 1;
    }
    free(nt_off);
    free(nt_pos);
    free(live);
    free(prod);
    return rc;
}

const gram_tables *gram_get_tables(const gram *g)
{
    return g->finished ? &g->t : NULL;
}

size_t gram_mem_bytes(const gram *g)
{
    size_t b = sizeof *g;
    b += (size_t)g->cap_rules * sizeof(gram_rule_rec) + (size_t)g->cap_elems * sizeof(int32_t);
    b += (size_t)g->cap_terms * sizeof(uint32_t) + (size_t)g->term_hash_cap * sizeof(int32_t);
    if (g->finished) {
        b += (size_t)g->t.n_pos * 2 * sizeof(int32_t) + (size_t)g->n_nt * (1 + 2 * sizeof(int32_t));
        b += (size_t)(g->clo_off[g->n_nt] + g->clon_off[g->n_nt]) * sizeof(int32_t);
    }
    return b;
}
