/* regex.c - the regex front end (regex.h): recursive descent, building
 * gram elements directly (no NFA of its own: the Earley recognizer runs
 * the rules).  Classes are collected as code-point ranges and expanded to
 * UTF-8 by gram_cpset.
 */
#include "grammar/regex.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RX_MAX_DEPTH 200

typedef struct rx {
    const char *s;
    size_t n, i;
    gram *g;
    int json;
    int depth;
    const char *what;
    char msg[200];
    int failed;
} rx;

typedef struct ranges {
    uint32_t *v;   /* [n][2] */
    int32_t n, cap;
} ranges;

static int32_t rx_fail(rx *p, const char *m)
{
    if (!p->failed) {
        snprintf(p->msg, sizeof p->msg, "%s", m);
        p->failed = 1;
    }
    return GRAM_BAD;
}

static int pk(const rx *p, size_t k)
{
    return p->i + k < p->n ? (unsigned char)p->s[p->i + k] : -1;
}

static int rg_add(rx *p, ranges *r, uint32_t lo, uint32_t hi)
{
    if (r->n == r->cap) {
        int32_t nc = r->cap ? r->cap * 2 : 8;
        uint32_t *nv = realloc(r->v, (size_t)nc * 2 * sizeof *nv);
        if (!nv)
            return rx_fail(p, "out of memory");
        r->v = nv;
        r->cap = nc;
    }
    r->v[2 * r->n] = lo;
    r->v[2 * r->n + 1] = hi;
    r->n++;
    return 0;
}

/* \d \w \s (positive sets, ASCII) into r; 1 if c names one. */
static int class_escape(rx *p, int c, ranges *r)
{
    switch (c) {
    case 'd':
        rg_add(p, r, '0', '9');
        return 1;
    case 'w':
        rg_add(p, r, '0', '9');
        rg_add(p, r, 'A', 'Z');
        rg_add(p, r, 'a', 'z');
        rg_add(p, r, '_', '_');
        return 1;
    case 's':
        rg_add(p, r, '\t', '\r');
        rg_add(p, r, ' ', ' ');
        return 1;
    }
    return 0;
}

static int hexn(rx *p, int digits, uint32_t *out)
{
    uint32_t v = 0;
    int k = 0;
    int brace = digits < 0 && pk(p, 0) == '{';
    if (brace)
        p->i++;
    for (; digits < 0 ? k < 6 : k < digits; k++) {
        int c = pk(p, 0);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            break;
        v = v << 4 | (uint32_t)d;
        p->i++;
    }
    if (brace && pk(p, 0) == '}')
        p->i++;
    else if (brace || k == 0 || (digits > 0 && k != digits))
        return rx_fail(p, "bad hex escape");
    if (v > GRAM_MAX_CP)
        return rx_fail(p, "code point out of range");
    *out = v;
    return 0;
}

/* A single-character escape after '\' (p->i at the letter): 0 and *cp,
 * or GRAM_BAD. */
static int char_escape(rx *p, uint32_t *cp)
{
    int c = pk(p, 0);
    p->i++;
    switch (c) {
    case 'n': *cp = '\n'; return 0;
    case 't': *cp = '\t'; return 0;
    case 'r': *cp = '\r'; return 0;
    case 'f': *cp = '\f'; return 0;
    case 'v': *cp = '\v'; return 0;
    case '0': *cp = 0; return 0;
    case 'x': return hexn(p, 2, cp);
    case 'u': return pk(p, 0) == '{' ? hexn(p, -1, cp) : hexn(p, 4, cp);
    case 'b': case 'B': return rx_fail(p, "word boundaries (\\b, \\B) are not supported");
    case 'k': return rx_fail(p, "backreferences are not supported");
    case -1: return rx_fail(p, "a trailing backslash");
    }
    if (c >= '1' && c <= '9')
        return rx_fail(p, "backreferences are not supported");
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
        return rx_fail(p, "unknown escape");
    if (c >= 0x80) {
        p->i--;
        int l = gram_utf8_decode(p->s + p->i, p->n - p->i, cp);
        if (l < 0)
            return rx_fail(p, "invalid UTF-8");
        p->i += (size_t)l;
        return 0;
    }
    *cp = (uint32_t)c;
    return 0;
}

static int next_cp(rx *p, uint32_t *cp)
{
    int l = gram_utf8_decode(p->s + p->i, p->n - p->i, cp);
    if (l < 0)
        return rx_fail(p, "invalid UTF-8");
    p->i += (size_t)l;
    return 0;
}

/* The JSON escape of a code point that may not appear raw in a string. */
static int32_t json_escaped(gram *g, uint32_t c)
{
    char b[8];
    const char *named = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                      : c == '\t' ? "\\t" : c == '\r' ? "\\r" : c == '\b' ? "\\b"
                      : c == '\f' ? "\\f" : NULL;
    if (named)
        return gram_bytes(g, named, strlen(named));
    snprintf(b, sizeof b, "\\u%04x", c);
    return gram_bytes(g, b, 6);
}

/* The element for a set of code points (normalized by gram_cpset); in
 * JSON mode the characters needing escapes are split out as escapes. */
static int32_t set_elem(rx *p, ranges *r, int negate)
{
    if (!p->json)
        return gram_cpset(p->g, r->v, r->n, negate);
    /* membership of the 35 specials, computed on the raw ranges */
    int32_t alts[40], na = 0;
    uint32_t specials[35];
    int ns = 0;
    for (uint32_t c = 0; c < 0x20; c++)
        specials[ns++] = c;
    specials[ns++] = '"';
    specials[ns++] = '\\';
    specials[ns++] = 0x7F;
    for (int k = 0; k < ns; k++) {
        int in = 0;
        for (int32_t j = 0; j < r->n && !in; j++)
            in = specials[k] >= r->v[2 * j] && specials[k] <= r->v[2 * j + 1];
        if (in != negate)
            alts[na++] = json_escaped(p->g, specials[k]);
    }
    /* the rest: r minus the specials (negate: the complement of r, minus them) */
    int32_t n0 = r->n;
    rg_add(p, r, 0, 0x1F);
    rg_add(p, r, '"', '"');
    rg_add(p, r, '\\', '\\');
    rg_add(p, r, 0x7F, 0x7F);
    int32_t rest;
    if (negate) {
        rest = gram_cpset(p->g, r->v, r->n, 1);
    } else {   /* ranges of r with the specials cut out */
        ranges keep = {0};
        for (int32_t j = 0; j < n0; j++) {
            uint32_t lo = r->v[2 * j], hi = r->v[2 * j + 1];
            const uint32_t cuts[4][2] = {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}, {0x7F, 0x7F}};
            for (int k = 0; k < 4 && lo <= hi; k++) {
                if (cuts[k][1] < lo || cuts[k][0] > hi)
                    continue;
                if (cuts[k][0] > lo)
                    rg_add(p, &keep, lo, cuts[k][0] - 1);
                lo = cuts[k][1] + 1;
            }
            if (lo <= hi)
                rg_add(p, &keep, lo, hi);
        }
        rest = gram_cpset(p->g, keep.v, keep.n, 0);
        free(keep.v);
    }
    alts[na++] = rest;
    return gram_alt(p->g, alts, na);
}

static int32_t parse_class(rx *p)
{
    ranges r = {0};
    p->i++;   /* '[' */
    int neg = pk(p, 0) == '^';
    if (neg)
        p->i++;
    int first = 1;
    while (!p->failed && (pk(p, 0) != ']' || first)) {
        first = 0;
        uint32_t lo, hi;
        if (pk(p, 0) < 0) {
            rx_fail(p, "unterminated character class");
            break;
        }
        if (pk(p, 0) == '[' && pk(p, 1) == ':') {
            rx_fail(p, "POSIX classes ([:alpha:]) are not supported");
            break;
        }
        if (pk(p, 0) == '\\') {
            p->i++;
            int c = pk(p, 0);
            if (c == 'D' || c == 'W' || c == 'S') {
                rx_fail(p, "negated escapes (\\D \\W \\S) inside a class are not supported");
                break;
            }
            if (class_escape(p, c, &r)) {
                p->i++;
                continue;
            }
            if (char_escape(p, &lo))
                break;
        } else if (next_cp(p, &lo)) {
            break;
        }
        hi = lo;
        if (pk(p, 0) == '-' && pk(p, 1) != ']' && pk(p, 1) >= 0) {
            p->i++;
            if (pk(p, 0) == '\\') {
                p->i++;
                if (char_escape(p, &hi))
                    break;
            } else if (next_cp(p, &hi)) {
                break;
            }
            if (hi < lo) {
                rx_fail(p, "a class range out of order");
                break;
            }
        }
        rg_add(p, &r, lo, hi);
    }
    int32_t e = GRAM_BAD;
    if (!p->failed) {
        p->i++;
        e = set_elem(p, &r, neg);
    }
    free(r.v);
    return e;
}

static int32_t single(rx *p, uint32_t lo, uint32_t hi, int negate)
{
    ranges r = {0};
    rg_add(p, &r, lo, hi);
    int32_t e = p->failed ? GRAM_BAD : set_elem(p, &r, negate);
    free(r.v);
    return e;
}

static int32_t parse_alt(rx *p);

static int32_t parse_atom(rx *p)
{
    int c = pk(p, 0);
    if (c == '(') {
        p->i++;
        if (pk(p, 0) == '?') {
            if (pk(p, 1) != ':')
                return rx_fail(p, pk(p, 1) == '=' || pk(p, 1) == '!' || pk(p, 1) == '<'
                                      ? "lookaround and named groups are not supported"
                                      : "inline flags are not supported");
            p->i += 2;
        }
        if (++p->depth > RX_MAX_DEPTH)
            return rx_fail(p, "groups nested too deep");
        int32_t e = parse_alt(p);
        p->depth--;
        if (p->failed)
            return GRAM_BAD;
        if (pk(p, 0) != ')')
            return rx_fail(p, "expecting ')'");
        p->i++;
        return e;
    }
    if (c == '[')
        return parse_class(p);
    if (c == '.') {
        p->i++;
        return single(p, '\n', '\n', 1);
    }
    uint32_t cp;
    if (c == '\\') {
        p->i++;
        int d = pk(p, 0);
        ranges r = {0};
        int neg = d == 'D' || d == 'W' || d == 'S';
        if (class_escape(p, neg ? d + 32 : d, &r)) {
            p->i++;
            int32_t e = p->failed ? GRAM_BAD : set_elem(p, &r, neg);
            free(r.v);
            return e;
        }
        if (char_escape(p, &cp))
            return GRAM_BAD;
    } else if (next_cp(p, &cp)) {
        return GRAM_BAD;
    }
    return single(p, cp, cp, 0);
}

static int parse_count(rx *p, int32_t *out)
{
    int64_t v = 0;
    if (pk(p, 0) < '0' || pk(p, 0) > '9')
        return rx_fail(p, "expecting a number in {m,n}");
    for (; pk(p, 0) >= '0' && pk(p, 0) <= '9'; p->i++)
        if ((v = v * 10 + pk(p, 0) - '0') > INT32_MAX)
            return rx_fail(p, "repetition bound too large");
    *out = (int32_t)v;
    return 0;
}

/* e followed by at most one quantifier (and a lazy '?'); a second one is
 * refused, as ECMAScript, Python and Rust do (a** would also nest stars). */
static int is_quant(const rx *p)
{
    const int c = pk(p, 0);
    return c == '*' || c == '+' || c == '?' || (c == '{' && pk(p, 1) >= '0' && pk(p, 1) <= '9');
}

static int32_t parse_quant(rx *p, int32_t e)
{
    if (!is_quant(p))
        return e;
    const int c = pk(p, 0);
    int32_t lo, hi;
    p->i++;
    if (c != '{') {
        lo = c == '+';
        hi = c == '?' ? 1 : -1;
    } else {
        if (parse_count(p, &lo))
            return GRAM_BAD;
        hi = lo;
        if (pk(p, 0) == ',') {
            p->i++;
            hi = -1;
            if (pk(p, 0) != '}' && parse_count(p, &hi))
                return GRAM_BAD;
        }
        if (pk(p, 0) != '}')
            return rx_fail(p, "expecting '}'");
        p->i++;
        if (hi >= 0 && hi < lo)
            return rx_fail(p, "repetition {m,n} with n < m");
    }
    if (pk(p, 0) == '+')
        return rx_fail(p, "possessive quantifiers are not supported");
    if (pk(p, 0) == '?')
        p->i++; /* lazy: same language */
    if (is_quant(p))
        return rx_fail(p, "a quantifier after a quantifier (multiple repeat)");
    e = lo == 0 && hi == 1 ? gram_opt(p->g, e) : lo == 0 && hi < 0 ? gram_star(p->g, e)
      : lo == 1 && hi < 0 ? gram_plus(p->g, e) : gram_repeat(p->g, e, lo, hi);
    return e == GRAM_BAD ? rx_fail(p, "grammar limit reached") : e;
}

static int32_t parse_concat(rx *p)
{
    int32_t *v = NULL, n = 0, cap = 0;
    int32_t r = GRAM_BAD;
    for (;;) {
        int c = pk(p, 0);
        if (c < 0 || c == '|' || c == ')')
            break;
        if (c == '^' && p->i == 0) {
            p->i++;
            continue;
        }
        if (c == '$' && p->i + 1 == p->n) {
            p->i++;
            continue;
        }
        if (c == '^' || c == '$') {
            rx_fail(p, "anchors (^, $) inside the pattern are not supported");
            goto out;
        }
        if (is_quant(p)) {
            rx_fail(p, "a quantifier with nothing before it");
            goto out;
        }
        int32_t e = parse_quant(p, parse_atom(p));
        if (e == GRAM_BAD || p->failed) {
            rx_fail(p, "grammar limit reached");
            goto out;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                rx_fail(p, "out of memory");
                goto out;
            }
            v = nv;
        }
        v[n++] = e;
    }
    r = n ? gram_seq(p->g, v, n) : gram_eps(p->g);
out:
    free(v);
    return p->failed ? GRAM_BAD : r;
}

static int32_t parse_alt(rx *p)
{
    int32_t *v = NULL, n = 0, cap = 0;
    for (;;) {
        int32_t e = parse_concat(p);
        if (p->failed)
            break;
        if (n == cap) {
            cap = cap ? cap * 2 : 4;
            int32_t *nv = realloc(v, (size_t)cap * sizeof *nv);
            if (!nv) {
                rx_fail(p, "out of memory");
                break;
            }
            v = nv;
        }
        v[n++] = e;
        if (pk(p, 0) != '|')
            break;
        p->i++;
    }
    int32_t r = p->failed ? GRAM_BAD : gram_alt(p->g, v, n);
    free(v);
    return r;
}

int32_t rx_build(gram *g, const char *re, size_t n, int json_string, const char *what,
                 kvant_err *err)
{
    rx p = {.s = re, .n = n, .g = g, .json = json_string, .what = what};
    int32_t e = parse_alt(&p);
    if (!p.failed && p.i < p.n)
        rx_fail(&p, "unbalanced ')'");
    if (p.failed || e == GRAM_BAD) {
        kvant_err_set(err, KV_EINVAL, "%s: at offset %zu: %s", what, p.i,
                      p.failed ? p.msg : "grammar limit reached");
        return GRAM_BAD;
    }
    return e;
}

gram *rx_compile(const char *re, size_t n, gram_limits lim, kvant_err *err)
{
    gram *g = gram_create(lim);
    if (!g) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    int32_t e = rx_build(g, re, n, 0, "regex", err);
    if (e == GRAM_BAD) {
        if (gram_failed(g))
            gram_finish(g, GRAM_BAD, err);
        gram_destroy(g);
        return NULL;
    }
    if (gram_finish(g, e, err)) {
        gram_destroy(g);
        return NULL;
    }
    return g;
}
