/* gbnf.c - the GBNF parser (gbnf.h): recursive descent over the source,
 * building gram elements as it goes.  Rule names map to nonterminals on
 * first sight (use before definition is fine); at the end every name must
 * have been defined exactly once.  Errors carry the line and column.
 */
#include "grammar/gbnf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gnames.h"

#define GBNF_MAX_DEPTH 200   /* nested groups */

typedef struct gp {
    const char *s;
    size_t n, i;
    gram *g;
    gnames *names;      /* name -> nonterminal */
    uint8_t *defined;   /* [cap_def] by nonterminal id */
    int32_t cap_def;
    int32_t any;        /* `.`, built once */
    int depth;
    kvant_err err;
    int failed;
} gp;

typedef struct elist {
    int32_t *v;
    int32_t n, cap;
} elist;

static int gp_fail(gp *p, const char *what)
{
    if (!p->failed) {
        int line = 1, col = 1;
        for (size_t k = 0; k < p->i && k < p->n; k++, col++)
            if (p->s[k] == '\n') {
                line++;
                col = 0;
            }
        kvant_err_set(&p->err, KV_EINVAL, "gbnf: line %d col %d: %s", line, col, what);
        p->failed = 1;
    }
    return GRAM_BAD;
}

static int peek(const gp *p, size_t k)
{
    return p->i + k < p->n ? (unsigned char)p->s[p->i + k] : -1;
}

static int is_word(int c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static void space(gp *p, int newline_ok)
{
    for (;;) {
        int c = peek(p, 0);
        if (c == ' ' || c == '\t' || (newline_ok && (c == '\r' || c == '\n'))) {
            p->i++;
        } else if (c == '#') {
            while (peek(p, 0) >= 0 && peek(p, 0) != '\r' && peek(p, 0) != '\n')
                p->i++;
        } else {
            return;
        }
    }
}

static int el_push(gp *p, elist *l, int32_t e)
{
    if (l->n == l->cap) {
        int32_t nc = l->cap ? l->cap * 2 : 8;
        int32_t *nv = realloc(l->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return gp_fail(p, "out of memory");
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = e;
    return 0;
}

static int hexval(gp *p, int digits, uint32_t *out)
{
    uint32_t v = 0;
    for (int k = 0; k < digits; k++) {
        int c = peek(p, 0);
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return gp_fail(p, "expecting hex digits in an escape");
        v = v << 4 | (uint32_t)d;
        p->i++;
    }
    *out = v;
    return 0;
}

/* One character of a literal or class: an escape or a UTF-8 code point. */
static int parse_char(gp *p, uint32_t *cp)
{
    int c = peek(p, 0);
    if (c < 0)
        return gp_fail(p, "unexpected end of input");
    if (c == '\\') {
        int e = peek(p, 1);
        p->i += 2;
        switch (e) {
        case 'x': return hexval(p, 2, cp);
        case 'u': return hexval(p, 4, cp);
        case 'U': return hexval(p, 8, cp);
        case 't': *cp = '\t'; return 0;
        case 'r': *cp = '\r'; return 0;
        case 'n': *cp = '\n'; return 0;
        case '\\': case '"': case '[': case ']': case '-':
            *cp = (uint32_t)e;
            return 0;
        default:
            p->i -= 2;
            return gp_fail(p, "unknown escape");
        }
    }
    int l = gram_utf8_decode(p->s + p->i, p->n - p->i, cp);
    if (l < 0)
        return gp_fail(p, "invalid UTF-8");
    p->i += (size_t)l;
    return 0;
}

static int32_t parse_literal(gp *p)
{
    elist l = {0};
    p->i++;   /* '"' */
    while (peek(p, 0) != '"') {
        uint32_t cp;
        if (parse_char(p, &cp) || el_push(p, &l, gram_cp(p->g, cp)))
            break;
    }
    int32_t r = GRAM_BAD;
    if (!p->failed) {
        p->i++;
        r = l.n ? gram_seq(p->g, l.v, l.n) : gram_eps(p->g);
    }
    free(l.v);
    return r;
}

static int32_t parse_class(gp *p)
{
    p->i++;   /* '[' */
    int neg = peek(p, 0) == '^';
    if (neg)
        p->i++;
    uint32_t *r = NULL;
    int32_t n = 0, cap = 0;
    while (!p->failed && peek(p, 0) != ']') {
        uint32_t lo, hi;
        if (parse_char(p, &lo))
            break;
        hi = lo;
        if (peek(p, 0) == '-' && peek(p, 1) != ']' && peek(p, 1) >= 0) {
            p->i++;
            if (parse_char(p, &hi))
                break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            uint32_t *nr = realloc(r, (size_t)cap * 2 * sizeof *nr);
            if (!nr) {
                gp_fail(p, "out of memory");
                break;
            }
            r = nr;
        }
        r[2 * n] = lo;
        r[2 * n + 1] = hi;
        n++;
    }
    int32_t e = GRAM_BAD;
    if (!p->failed) {
        p->i++;
        e = gram_cpset(p->g, r, n, neg);
    }
    free(r);
    return e;
}

static int32_t rule_ref(gp *p, const char *name, size_t len)
{
    int32_t nt = gnames_get(p->names, name, len);
    if (nt >= 0)
        return nt;
    nt = gram_nt(p->g);
    if (nt == GRAM_BAD)
        return GRAM_BAD;
    if (gnames_put(p->names, name, len, nt))
        return gp_fail(p, "out of memory");
    return nt;
}

static int parse_int(gp *p, int32_t *out)
{
    int64_t v = 0;
    if (peek(p, 0) < '0' || peek(p, 0) > '9')
        return gp_fail(p, "expecting an integer");
    while (peek(p, 0) >= '0' && peek(p, 0) <= '9') {
        v = v * 10 + (peek(p, 0) - '0');
        if (v > INT32_MAX)
            return gp_fail(p, "repetition bound too large");
        p->i++;
    }
    *out = (int32_t)v;
    return 0;
}

/* `{m}`, `{m,}`, `{m,n}` applied to e. */
static int32_t parse_braces(gp *p, int32_t e, int nested)
{
    int32_t lo, hi;
    space(p, nested);
    if (parse_int(p, &lo))
        return GRAM_BAD;
    space(p, nested);
    if (peek(p, 0) == '}') {
        hi = lo;
    } else if (peek(p, 0) == ',') {
        p->i++;
        space(p, nested);
        hi = -1;
        if (peek(p, 0) >= '0' && peek(p, 0) <= '9' && parse_int(p, &hi))
            return GRAM_BAD;
        space(p, nested);
        if (peek(p, 0) != '}')
            return gp_fail(p, "expecting '}'");
    } else {
        return gp_fail(p, "expecting ',' or '}'");
    }
    p->i++;
    if (hi >= 0 && hi < lo)
        return gp_fail(p, "repetition {m,n} with n < m");
    return gram_repeat(p->g, e, lo, hi);
}

static int32_t parse_alternates(gp *p, int nested);

/* One atom (or a repetition suffix applied to the last one); returns 1
 * when the sequence ends here. */
static int parse_item(gp *p, elist *l, int nested)
{
    int c = peek(p, 0);
    int32_t e = GRAM_BAD;
    if (c == '"') {
        e = parse_literal(p);
    } else if (c == '[') {
        e = parse_class(p);
    } else if (is_word(c)) {
        size_t s = p->i;
        while (is_word(peek(p, 0)))
            p->i++;
        e = rule_ref(p, p->s + s, p->i - s);
    } else if (c == '(') {
        if (++p->depth > GBNF_MAX_DEPTH)
            return gp_fail(p, "groups nested too deep");
        p->i++;
        space(p, 1);
        e = parse_alternates(p, 1);
        p->depth--;
        if (!p->failed && peek(p, 0) != ')')
            return gp_fail(p, "expecting ')'");
        p->i++;
    } else if (c == '.') {
        p->i++;
        if (p->any == GRAM_BAD)
            p->any = gram_cpset(p->g, (uint32_t[2]){0, GRAM_MAX_CP}, 1, 0);
        e = p->any;
    } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (l->n == 0)
            return gp_fail(p, "a repetition operator with nothing before it");
        p->i++;
        int32_t last = l->v[l->n - 1];
        e = c == '*' ? gram_star(p->g, last) : c == '+' ? gram_plus(p->g, last)
          : c == '?' ? gram_opt(p->g, last) : parse_braces(p, last, nested);
        l->n--;
    } else if (c == '<' || c == '!') {
        return gp_fail(p, "token references (<...>, !<...>) are not supported");
    } else {
        return 1;
    }
    if (p->failed || e == GRAM_BAD)
        return gp_fail(p, gram_failed(p->g) ? "grammar limit reached" : "bad element");
    space(p, nested);
    return el_push(p, l, e);
}

static int32_t parse_sequence(gp *p, int nested)
{
    elist l = {0};
    int r;
    while ((r = parse_item(p, &l, nested)) == 0)
        ;
    int32_t e = GRAM_BAD;
    if (!p->failed)
        e = l.n ? gram_seq(p->g, l.v, l.n) : gram_eps(p->g);
    free(l.v);
    return e;
}

static int32_t parse_alternates(gp *p, int nested)
{
    elist alts = {0};
    int32_t e = parse_sequence(p, nested);
    el_push(p, &alts, e);
    while (!p->failed && peek(p, 0) == '|') {
        p->i++;
        space(p, 1);
        el_push(p, &alts, parse_sequence(p, nested));
    }
    int32_t r = p->failed ? GRAM_BAD : gram_alt(p->g, alts.v, alts.n);
    free(alts.v);
    return r;
}

static int mark_defined(gp *p, int32_t nt)
{
    if (nt >= p->cap_def) {
        int32_t nc = nt * 2 + 16;
        uint8_t *nd = realloc(p->defined, (size_t)nc);
        if (!nd)
            return gp_fail(p, "out of memory");
        memset(nd + p->cap_def, 0, (size_t)(nc - p->cap_def));
        p->defined = nd;
        p->cap_def = nc;
    }
    if (p->defined[nt])
        return gp_fail(p, "rule defined twice");
    p->defined[nt] = 1;
    return 0;
}

static int parse_rule(gp *p)
{
    size_t s = p->i;
    while (is_word(peek(p, 0)))
        p->i++;
    if (p->i == s)
        return gp_fail(p, "expecting a rule name");
    int32_t nt = rule_ref(p, p->s + s, p->i - s);
    if (nt == GRAM_BAD || mark_defined(p, nt))
        return GRAM_BAD;
    space(p, 0);
    if (peek(p, 0) != ':' || peek(p, 1) != ':' || peek(p, 2) != '=')
        return gp_fail(p, "expecting ::=");
    p->i += 3;
    space(p, 1);
    int32_t body = parse_alternates(p, 0);
    if (p->failed || gram_rule(p->g, nt, &body, 1))
        return gp_fail(p, "grammar limit reached");
    if (peek(p, 0) == '\r')
        p->i += peek(p, 1) == '\n' ? 2 : 1;
    else if (peek(p, 0) == '\n')
        p->i++;
    else if (peek(p, 0) >= 0)
        return gp_fail(p, "expecting newline or end");
    space(p, 1);
    return 0;
}

static int check_defined(gp *p)
{
    for (int32_t i = 0; i < gnames_count(p->names); i++) {
        int32_t nt;
        const char *name = gnames_name(p->names, i, &nt);
        if (nt >= p->cap_def || !p->defined[nt]) {
            char m[160];
            snprintf(m, sizeof m, "undefined rule '%.100s'", name);
            p->i = p->n;
            return gp_fail(p, m);
        }
    }
    return 0;
}

gram *gbnf_compile(const char *src, size_t n, gram_limits lim, kvant_err *err)
{
    gp p = {.s = src, .n = n, .any = GRAM_BAD};
    p.g = gram_create(lim);
    p.names = gnames_create();
    if (!p.g || !p.names) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        goto fail;
    }
    space(&p, 1);
    while (!p.failed && peek(&p, 0) >= 0)
        parse_rule(&p);
    int32_t root = gnames_get(p.names, "root", 4);
    if (!p.failed)
        check_defined(&p);
    if (!p.failed && root < 0)
        gp_fail(&p, "no rule named root");
    if (p.failed) {
        if (gram_failed(p.g))   /* the grammar's own message is more precise */
            gram_finish(p.g, GRAM_BAD, &p.err);
        kvant_err_set(err, p.err.code ? p.err.code : KV_EINVAL, "%s", p.err.msg);
        goto fail;
    }
    if (gram_finish(p.g, root, err))
        goto fail;
    gnames_destroy(p.names);
    free(p.defined);
    return p.g;
fail:
    gnames_destroy(p.names);
    free(p.defined);
    gram_destroy(p.g);
    return NULL;
}
