/* jinja_lex.c - the Jinja lexer (see jinja_lex.h for the rules it keeps).
 *
 * Two passes: the source is first normalised (newlines, trailing newline),
 * then scanned in data state (text up to the next {{ {% {#) and tag state
 * (expression tokens up to the matching end, brackets balanced as jinja2
 * balances them so "}}" inside a dict literal does not end the tag).
 */
#include "text/jinja_lex.h"

#include <stdlib.h>
#include <string.h>

#define JLEX_MAX_TOKENS (1u << 20)

typedef struct lexer {
    jv_arena *a;
    const char *s;
    size_t n, pos;
    int line;
    jtok *toks;
    size_t nt, cap;
    kvant_err *err;
} lexer;

/* Python str.splitlines() separators, as byte lengths at p (0 if none). */
static size_t line_sep(const unsigned char *p, size_t left)
{
    if (p[0] == '\r')
        return left > 1 && p[1] == '\n' ? 2 : 1;
    if (p[0] == '\n' || p[0] == '\v' || p[0] == '\f' || (p[0] >= 0x1C && p[0] <= 0x1E))
        return 1;
    if (left > 1 && p[0] == 0xC2 && p[1] == 0x85)
        return 2;
    if (left > 2 && p[0] == 0xE2 && p[1] == 0x80 && (p[2] == 0xA8 || p[2] == 0xA9))
        return 3;
    return 0;
}

static char *normalise(jv_arena *a, const char *src, size_t len, size_t *out_n)
{
    char *d = jv_alloc(a, len + 1);
    if (!d)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        size_t k = line_sep((const unsigned char *)src + i, len - i);
        if (k) {
            d[n++] = '\n';
            i += k;
        } else {
            d[n++] = src[i++];
        }
    }
    if (n && d[n - 1] == '\n')
        n--;
    d[n] = '\0';
    *out_n = n;
    return d;
}

static int push(lexer *L, jtok t)
{
    if (L->nt + 1 >= L->cap) {
        if (L->cap >= JLEX_MAX_TOKENS)
            return kvant_err_set(L->err, KV_ERANGE, "chat template: more than %u tokens", JLEX_MAX_TOKENS);
        size_t nc = L->cap ? L->cap * 2 : 256;
        jtok *p = jv_alloc(L->a, nc * sizeof *p);
        if (!p)
            return kvant_err_set(L->err, KV_ENOMEM, "chat template: out of memory");
        if (L->nt)
            memcpy(p, L->toks, L->nt * sizeof *p);
        L->toks = p;
        L->cap = nc;
    }
    t.line = t.line ? t.line : L->line;
    L->toks[L->nt++] = t;
    return KV_OK;
}

static int is_ws_at(const char *s, size_t n, size_t i, size_t *k)
{
    uint32_t cp = jv_utf8_dec((const unsigned char *)s + i, n - i, k);
    return jv_py_space(cp);
}

static void count_lines(lexer *L, size_t from, size_t to)
{
    for (size_t i = from; i < to; i++)
        L->line += L->s[i] == '\n';
}

/* Python str.rstrip(): the length of text without trailing whitespace. */
static size_t rstrip_len(const char *s, size_t n)
{
    size_t hi = n;
    while (hi > 0) {
        size_t st = hi - 1, k;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80 && hi - st < 4)
            st--;
        if (!is_ws_at(s, hi, st, &k) || st + k != hi)
            break;
        hi = st;
    }
    return hi;
}

/* Applies {%- / lstrip_blocks to the text before a tag and emits it. */
static int emit_text(lexer *L, size_t start, size_t end, char ctl, int is_var, int line_starting)
{
    const char *t = L->s + start;
    size_t n = end - start;
    if (ctl == '-') {
        n = rstrip_len(t, n);
    } else if (ctl != '+' && !is_var) {
        size_t lp = n;
        while (lp > 0 && t[lp - 1] != '\n')
            lp--;
        if (lp > 0 || line_starting) {
            size_t i = lp, k;
            while (i < n && t[i] != '\n' && is_ws_at(t, n, i, &k))
                i += k;
            if (i == n)
                n = lp;
        }
    }
    int line = L->line;
    count_lines(L, start, end);
    if (!n)
        return KV_OK;
    jtok tk = {.t = JT_TEXT, .s = t, .n = n, .line = line};
    return push(L, tk);
}

/* Skips whitespace after a "-" end marker; returns the new position. */
static size_t skip_ws(lexer *L, size_t p)
{
    size_t k;
    while (p < L->n && is_ws_at(L->s, L->n, p, &k))
        p += k;
    return p;
}

static int put_utf8(char *d, uint32_t cp)
{
    if (cp < 0x80) {
        d[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        d[0] = (char)(0xC0 | cp >> 6);
        d[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        d[0] = (char)(0xE0 | cp >> 12);
        d[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        d[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    d[0] = (char)(0xF0 | cp >> 18);
    d[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    d[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    d[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One escape at s[*i] (just after the backslash); appends to d. */
static size_t unescape_one(const char *s, size_t n, size_t *i, char *d)
{
    char c = s[*i];
    static const char from[] = "\\'\"abfnrtv", to[] = "\\'\"\a\b\f\n\r\t\v";
    const char *f = c ? strchr(from, c) : NULL;
    if (f) {
        (*i)++;
        d[0] = to[f - from];
        return 1;
    }
    if (c == '\n') {
        (*i)++;
        return 0;
    }
    if (c >= '0' && c <= '7') {
        uint32_t v = 0;
        for (int k = 0; k < 3 && *i < n && s[*i] >= '0' && s[*i] <= '7'; k++)
            v = v * 8 + (uint32_t)(s[(*i)++] - '0');
        return (size_t)put_utf8(d, v);
    }
    int digits = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
    if (digits && *i + (size_t)digits < n + 0) {
        uint32_t v = 0;
        int ok = 1;
        for (int k = 1; k <= digits; k++) {
            int h = hexval(s[*i + (size_t)k]);
            if (h < 0)
                ok = 0;
            v = v * 16 + (uint32_t)(h < 0 ? 0 : h);
        }
        if (ok && v <= 0x10FFFF) {
            *i += (size_t)digits + 1;
            return (size_t)put_utf8(d, v);
        }
    }
    d[0] = '\\';
    return 1;
}

static int lex_string(lexer *L, size_t *p)
{
    char q = L->s[*p];
    size_t i = *p + 1, start = i;
    while (i < L->n && L->s[i] != q) {
        if (L->s[i] == '\\' && i + 1 < L->n)
            i++;
        i++;
    }
    if (i >= L->n)
        return kvant_err_set(L->err, KV_EINVAL, "chat template: unterminated string at line %d", L->line);
    size_t end = i;
    char *d = jv_alloc(L->a, (end - start) * 4 / 2 + 8);
    if (!d)
        return kvant_err_set(L->err, KV_ENOMEM, "chat template: out of memory");
    size_t dn = 0;
    for (size_t j = start; j < end;) {
        if (L->s[j] == '\\' && j + 1 < end) {
            j++;
            dn += unescape_one(L->s, end, &j, d + dn);
        } else {
            d[dn++] = L->s[j++];
        }
    }
    jtok t = {.t = JT_STRING, .s = d, .n = dn};
    int rc = push(L, t);
    count_lines(L, *p, end + 1);
    *p = end + 1;
    return rc;
}

static int lex_number(lexer *L, size_t *p)
{
    size_t i = *p;
    char buf[80];
    size_t bn = 0;
    int is_float = 0;
    while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
        if (L->s[i] != '_' && bn < sizeof buf - 1)
            buf[bn++] = L->s[i];
        i++;
    }
    if (i + 1 < L->n && L->s[i] == '.' && L->s[i + 1] >= '0' && L->s[i + 1] <= '9') {
        is_float = 1;
        if (bn < sizeof buf - 1)
            buf[bn++] = L->s[i];
        i++;
        while (i < L->n && ((L->s[i] >= '0' && L->s[i] <= '9') || L->s[i] == '_')) {
            if (L->s[i] != '_' && bn < sizeof buf - 1)
                buf[bn++] = L->s[i];
            i++;
        }
    }
    if (i < L->n && (L->s[i] == 'e' || L->s[i] == 'E')) {
        size_t j = i + 1;
        if (j < L->n && (L->s[j] == '+' || L->s[j] == '-'))
            j++;
        if (j < L->n && L->s[j] >= '0' && L->s[j] <= '9') {
            is_float = 1;
            for (; i < j; i++)
                if (bn < sizeof buf - 1)
                    buf[bn++] = L->s[i];
            for (; i < L->n && L->s[i] >= '0' && L->s[i] <= '9'; i++)
                if (bn < sizeof buf - 1)
                    buf[bn++] = L->s[i];
        }
    }
    buf[bn] = '\0';
    jtok t = {.t = is_float ? JT_FLOAT : JT_INT};
    if (is_float) {
        t.f = strtod(buf, NULL);
    } else {
        char *e;
        unsigned long long v = strtoull(buf, &e, 10);
        if (bn > 18 && (v > (unsigned long long)INT64_MAX || bn > 19))
            return kvant_err_set(L->err, KV_ERANGE, "chat template: integer literal too large at line %d", L->line);
        t.i = (int64_t)v;
    }
    *p = i;
    return push(L, t);
}

static const char *const OPS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]", "(",
                                  ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";"};

/* Scans tokens of one tag until its end; *line_starting tells the caller
 * whether the consumed end ended with a newline. */
static int lex_tag(lexer *L, size_t *pp, int is_var, int *line_starting)
{
    size_t p = *pp;
    int depth = 0;
    const char *endtag = is_var ? "}}" : "%}";
    for (;;) {
        size_t k;
        while (p < L->n && is_ws_at(L->s, L->n, p, &k)) {
            L->line += L->s[p] == '\n';
            p += k;
        }
        if (p >= L->n)
            return kvant_err_set(L->err, KV_EINVAL, "chat template: unterminated %s tag at line %d",
                                 is_var ? "{{" : "{%", L->line);
        const char *c = L->s + p;
        size_t left = L->n - p;
        if (depth == 0) {
            int strip = left >= 3 && c[0] == '-' && !memcmp(c + 1, endtag, 2);
            int plus = !is_var && left >= 3 && c[0] == '+' && !memcmp(c + 1, endtag, 2);
            if (strip || plus || (left >= 2 && !memcmp(c, endtag, 2))) {
                jtok t = {.t = is_var ? JT_VAR_END : JT_BLOCK_END};
                int rc = push(L, t);
                p += strip || plus ? 3 : 2;
                if (strip) {
                    size_t q = skip_ws(L, p);
                    count_lines(L, p, q);
                    p = q;
                } else if (!is_var && !plus && p < L->n && L->s[p] == '\n') {
                    p++;
                    L->line++;
                }
                *line_starting = p > 0 && L->s[p - 1] == '\n';
                *pp = p;
                return rc;
            }
        }
        int rc;
        if (*c == '\'' || *c == '"') {
            rc = lex_string(L, &p);
        } else if (*c >= '0' && *c <= '9') {
            rc = lex_number(L, &p);
        } else if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_') {
            size_t q = p;
            while (q < L->n && ((L->s[q] >= 'a' && L->s[q] <= 'z') || (L->s[q] >= 'A' && L->s[q] <= 'Z') ||
                                (L->s[q] >= '0' && L->s[q] <= '9') || L->s[q] == '_'))
                q++;
            jtok t = {.t = JT_NAME, .s = c, .n = q - p};
            rc = push(L, t);
            p = q;
        } else {
            size_t i = 0, nops = sizeof OPS / sizeof OPS[0];
            for (; i < nops; i++)
                if (left >= strlen(OPS[i]) && !memcmp(c, OPS[i], strlen(OPS[i])))
                    break;
            if (i == nops)
                return kvant_err_set(L->err, KV_EINVAL, "chat template: unexpected character '%c' at line %d",
                                     *c, L->line);
            if (*c == '(' || *c == '[' || *c == '{')
                depth++;
            else if ((*c == ')' || *c == ']' || *c == '}') && depth > 0)
                depth--;
            jtok t = {.t = JT_OP, .s = OPS[i], .n = strlen(OPS[i])};
            rc = push(L, t);
            p += strlen(OPS[i]);
        }
        if (rc)
            return rc;
    }
}

/* A comment: up to the first "#}", with "-#}" / trim_blocks after it. */
static int lex_comment(lexer *L, size_t *pp, int *line_starting)
{
    const char *e = memmem(L->s + *pp, L->n - *pp, "#}", 2);
    if (!e)
        return kvant_err_set(L->err, KV_EINVAL, "chat template: unterminated comment at line %d", L->line);
    size_t p = (size_t)(e - L->s);
    int strip = p > *pp && L->s[p - 1] == '-', plus = p > *pp && L->s[p - 1] == '+';
    count_lines(L, *pp, p + 2);
    p += 2;
    if (strip) {
        size_t q = skip_ws(L, p);
        count_lines(L, p, q);
        p = q;
    } else if (!plus && p < L->n && L->s[p] == '\n') {
        p++;
        L->line++;
    }
    *line_starting = p > 0 && L->s[p - 1] == '\n';
    *pp = p;
    return KV_OK;
}

int jlex_run(jv_arena *a, const char *src, size_t len, jtok **toks, size_t *n_toks, kvant_err *err)
{
    lexer L = {.a = a, .line = 1, .err = err};
    L.s = normalise(a, src ? src : "", src ? len : 0, &L.n);
    if (!L.s)
        return kvant_err_set(err, KV_ENOMEM, "chat template: out of memory");
    int line_starting = 1, rc = KV_OK;
    size_t p = 0;
    while (p < L.n && rc == KV_OK) {
        size_t q = p;
        const char *tag = NULL;
        while (q + 1 < L.n) {
            if (L.s[q] == '{' && (L.s[q + 1] == '{' || L.s[q + 1] == '%' || L.s[q + 1] == '#')) {
                tag = L.s + q;
                break;
            }
            q++;
        }
        if (!tag) {
            rc = emit_text(&L, p, L.n, 0, 1, 0);
            break;
        }
        char kind = tag[1], ctl = q + 2 < L.n ? L.s[q + 2] : 0;
        if (ctl != '-' && ctl != '+')
            ctl = 0;
        rc = emit_text(&L, p, q, ctl, kind == '{', line_starting);
        if (rc)
            break;
        p = q + 2 + (ctl ? 1 : 0);
        if (kind == '#') {
            rc = lex_comment(&L, &p, &line_starting);
            continue;
        }
        jtok t = {.t = kind == '{' ? JT_VAR_BEGIN : JT_BLOCK_BEGIN};
        rc = push(&L, t);
        if (rc == KV_OK)
            rc = lex_tag(&L, &p, kind == '{', &line_starting);
    }
    if (rc == KV_OK) {
        jtok t = {.t = JT_EOF};
        rc = push(&L, t);
    }
    if (rc)
        return rc;
    *toks = L.toks;
    *n_toks = L.nt;
    return KV_OK;
}
