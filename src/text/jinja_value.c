/* jinja_value.c - Jinja values: arena, containers, Python semantics.
 *
 * The arena is a chain of malloc'd chunks; jv_alloc bumps a pointer and
 * counts every byte against the budget.  Containers grow by allocating a
 * larger array in the arena (the old one stays until the arena goes).
 */
#include "text/jinja_value.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JV_CHUNK (64 * 1024)

typedef struct jv_chunk {
    struct jv_chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char mem[];
} jv_chunk;

struct jv_arena {
    jv_chunk *head;
    size_t total, budget;
};

jv_arena *jv_arena_create(size_t budget)
{
    jv_arena *a = calloc(1, sizeof *a);
    if (a)
        a->budget = budget;
    return a;
}

void jv_arena_destroy(jv_arena *a)
{
    if (!a)
        return;
    for (jv_chunk *c = a->head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(a);
}

void *jv_alloc(jv_arena *a, size_t n)
{
    if (!a || n > a->budget)
        return NULL;
    n = (n + 15) & ~(size_t)15;
    if (!n)
        n = 16;
    jv_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > JV_CHUNK ? n : JV_CHUNK;
        if (a->total + cap > a->budget)
            cap = a->budget - a->total >= n ? a->budget - a->total : 0; /* the last, smaller chunk */
        if (!cap)
            return NULL;
        c = malloc(sizeof *c + cap);
        if (!c)
            return NULL;
        c->cap = cap;
        c->used = 0;
        c->next = a->head;
        a->head = c;
        a->total += cap;
    }
    void *p = c->mem + c->used;
    c->used += n;
    memset(p, 0, n);
    return p;
}

jv jv_undef_named(jv_arena *a, const char *name, const char *hint)
{
    static const jv_undef oom = {"", "out of memory"};
    jv v = {.t = JV_UNDEF};
    jv_undef *u = jv_alloc(a, sizeof *u);
    if (!u) {
        v.u.undef = &oom;
        return v;
    }
    u->name = name ? name : "";
    u->hint = hint;
    v.u.undef = u;
    return v;
}

jv jv_strn(jv_arena *a, const char *s, size_t n)
{
    jv_str *p = jv_alloc(a, sizeof *p + n + 1);
    if (!p)
        return jv_undef_named(a, "", "out of memory");
    p->n = n;
    if (n)
        memcpy(p->s, s, n);
    p->s[n] = '\0';
    jv v = {.t = JV_STR, .u.s = p};
    return v;
}

jv jv_cstr(jv_arena *a, const char *s) { return jv_strn(a, s, strlen(s)); }

jv jv_html_escape(jv_arena *a, jv v)
{
    if (v.t != JV_STR || v.u.s->safe)
        return v;
    jv_buf b;
    jv_buf_init(&b, a, v.u.s->n * 5 + 1);
    size_t run = 0;
    for (size_t i = 0; i < v.u.s->n; i++) {
        char c = v.u.s->s[i];
        const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '"' ? "&#34;"
                      : c == '\'' ? "&#39;" : NULL;
        if (!e) {
            run++;
            continue;
        }
        jv_buf_add(&b, v.u.s->s + i - run, run);
        run = 0;
        jv_buf_cstr(&b, e);
    }
    jv_buf_add(&b, v.u.s->s + v.u.s->n - run, run);
    jv r = jv_buf_take(&b);
    if (r.t == JV_STR)
        ((jv_str *)r.u.s)->safe = 1;
    return r;
}

jv jv_list_new(jv_arena *a, size_t cap)
{
    jv_list *l = jv_alloc(a, sizeof *l);
    if (!l)
        return jv_undef_named(a, "", "out of memory");
    if (cap && !(l->v = jv_alloc(a, cap * sizeof(jv))))
        return jv_undef_named(a, "", "out of memory");
    l->cap = cap;
    jv v = {.t = JV_LIST, .u.l = l};
    return v;
}

jv jv_dict_new(jv_arena *a, size_t cap)
{
    jv_dict *d = jv_alloc(a, sizeof *d);
    if (!d)
        return jv_undef_named(a, "", "out of memory");
    if (cap && (!(d->k = jv_alloc(a, cap * sizeof(jv))) || !(d->v = jv_alloc(a, cap * sizeof(jv)))))
        return jv_undef_named(a, "", "out of memory");
    d->cap = cap;
    jv v = {.t = JV_DICT, .u.d = d};
    return v;
}

static int grow(jv_arena *a, jv **arr, size_t n, size_t *cap)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? *cap * 2 : 4;
    jv *p = jv_alloc(a, nc * sizeof(jv));
    if (!p)
        return -1;
    if (n)
        memcpy(p, *arr, n * sizeof(jv));
    *arr = p;
    *cap = nc;
    return 0;
}

int jv_list_push(jv_arena *a, jv list, jv item)
{
    if (list.t != JV_LIST)
        return -1;
    jv_list *l = list.u.l;
    if (grow(a, &l->v, l->n, &l->cap))
        return -1;
    l->v[l->n++] = item;
    return 0;
}

int jv_dict_set(jv_arena *a, jv dict, jv key, jv val)
{
    if (dict.t != JV_DICT)
        return -1;
    jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (jv_eq(d->k[i], key)) {
            d->v[i] = val;
            return 0;
        }
    }
    size_t kc = d->cap;
    if (grow(a, &d->k, d->n, &kc) || grow(a, &d->v, d->n, &d->cap))
        return -1;
    d->k[d->n] = key;
    d->v[d->n++] = val;
    return 0;
}

int jv_dict_set_str(jv_arena *a, jv dict, const char *key, jv val)
{
    jv k = jv_cstr(a, key);
    if (k.t != JV_STR)
        return -1;
    return jv_dict_set(a, dict, k, val);
}

int jv_dict_get(jv dict, jv key, jv *out)
{
    if (dict.t != JV_DICT)
        return 0;
    const jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (jv_eq(d->k[i], key)) {
            *out = d->v[i];
            return 1;
        }
    }
    return 0;
}

int jv_dict_get_str(jv dict, const char *key, jv *out)
{
    if (dict.t != JV_DICT)
        return 0;
    size_t n = strlen(key);
    const jv_dict *d = dict.u.d;
    for (size_t i = 0; i < d->n; i++) {
        if (d->k[i].t == JV_STR && d->k[i].u.s->n == n && memcmp(d->k[i].u.s->s, key, n) == 0) {
            *out = d->v[i];
            return 1;
        }
    }
    return 0;
}

/* ---- Python semantics ---- */

int jv_truthy(jv v)
{
    switch (v.t) {
    case JV_UNDEF:
    case JV_NONE: return 0;
    case JV_BOOL: return v.u.b;
    case JV_INT: return v.u.i != 0;
    case JV_FLOAT: return v.u.f != 0.0;
    case JV_STR: return v.u.s->n != 0;
    case JV_LIST: return v.u.l->gen || v.u.l->n != 0;
    case JV_DICT: return v.u.d->ns || v.u.d->n != 0;
    default: return 1;
    }
}

int jv_is_num(jv v) { return v.t == JV_INT || v.t == JV_FLOAT || v.t == JV_BOOL; }

double jv_num(jv v)
{
    return v.t == JV_INT ? (double)v.u.i : v.t == JV_FLOAT ? v.u.f : v.t == JV_BOOL ? (double)v.u.b : 0.0;
}

static int64_t as_int(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

#define JV_MAX_NEST 256 /* containers compared deeper than this are unequal / unordered */

static int eq_at(jv a, jv b, int depth);

int jv_eq(jv a, jv b) { return eq_at(a, b, 0); }

static int eq_at(jv a, jv b, int depth)
{
    if ((a.t == JV_LIST && b.t == JV_LIST && a.u.l == b.u.l) || (a.t == JV_DICT && b.t == JV_DICT && a.u.d == b.u.d))
        return 1; /* the same object, as Python's identity shortcut */
    if (depth > JV_MAX_NEST)
        return 0;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT)
            return as_int(a) == as_int(b);
        return jv_num(a) == jv_num(b);
    }
    if (a.t != b.t)
        return 0;
    switch (a.t) {
    case JV_UNDEF:
    case JV_NONE: return 1;
    case JV_STR: return a.u.s->n == b.u.s->n && memcmp(a.u.s->s, b.u.s->s, a.u.s->n) == 0;
    case JV_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1))
                return 0;
        return 1;
    case JV_DICT:
        if (a.u.d->ns || b.u.d->ns)
            return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n)
            return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            jv o;
            if (!jv_dict_get(b, a.u.d->k[i], &o) || !eq_at(a.u.d->v[i], o, depth + 1))
                return 0;
        }
        return 1;
    case JV_FUNC: return a.u.fn == b.u.fn;
    default: return 0;
    }
}

static int cmp_at(jv a, jv b, int *cmp, int depth);

int jv_cmp(jv a, jv b, int *cmp) { return cmp_at(a, b, cmp, 0); }

static int cmp_at(jv a, jv b, int *cmp, int depth)
{
    if (depth > JV_MAX_NEST)
        return -1;
    if (jv_is_num(a) && jv_is_num(b)) {
        if (a.t != JV_FLOAT && b.t != JV_FLOAT) {
            int64_t x = as_int(a), y = as_int(b);
            *cmp = x < y ? -1 : x > y;
        } else {
            double x = jv_num(a), y = jv_num(b);
            if (isnan(x) || isnan(y))
                *cmp = 2; /* unordered: every comparison false */
            else
                *cmp = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.t == JV_STR && b.t == JV_STR) {
        size_t n = a.u.s->n < b.u.s->n ? a.u.s->n : b.u.s->n;
        int c = memcmp(a.u.s->s, b.u.s->s, n); /* UTF-8 byte order = code point order */
        *cmp = c ? (c < 0 ? -1 : 1) : (a.u.s->n < b.u.s->n ? -1 : a.u.s->n > b.u.s->n);
        return 0;
    }
    if (a.t == JV_LIST && b.t == JV_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (eq_at(a.u.l->v[i], b.u.l->v[i], depth + 1))
                continue;
            return cmp_at(a.u.l->v[i], b.u.l->v[i], cmp, depth + 1);
        }
        *cmp = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return 0;
    }
    return -1;
}

const char *jv_type_name(jv v)
{
    switch (v.t) {
    case JV_UNDEF: return "Undefined";
    case JV_NONE: return "NoneType";
    case JV_BOOL: return "bool";
    case JV_INT: return "int";
    case JV_FLOAT: return "float";
    case JV_STR: return "str";
    case JV_LIST: return v.u.l->gen ? "generator" : v.u.l->tuple ? "tuple" : "list";
    case JV_DICT: return v.u.d->ns ? "Namespace" : "dict";
    default: return "function";
    }
}

/* ---- UTF-8 ---- */

uint32_t jv_utf8_dec(const unsigned char *s, size_t n, size_t *len)
{
    unsigned c = s[0];
    size_t k = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (k == 0 || k > n) {
        *len = 1;
        return c;
    }
    uint32_t cp = k == 1 ? c : c & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *len = 1;
            return c;
        }
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    *len = k;
    return cp;
}

size_t jv_utf8_len(const char *s, size_t n)
{
    size_t cnt = 0, k;
    for (size_t i = 0; i < n; i += k, cnt++)
        jv_utf8_dec((const unsigned char *)s + i, n - i, &k);
    return cnt;
}

size_t jv_utf8_off(const char *s, size_t n, size_t cp)
{
    size_t i = 0, k;
    while (cp-- && i < n) {
        jv_utf8_dec((const unsigned char *)s + i, n - i, &k);
        i += k;
    }
    return i;
}

int jv_py_space(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
           cp == 0x205F || cp == 0x3000;
}

/* ---- buffers ---- */

void jv_buf_init(jv_buf *b, jv_arena *a, size_t limit)
{
    memset(b, 0, sizeof *b);
    b->a = a;
    b->limit = limit;
}

void jv_buf_add(jv_buf *b, const char *s, size_t n)
{
    if (b->fail || !n)
        return;
    if (b->n + n > b->limit) {
        b->fail = 2;
        return;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->n + n + 1)
            nc *= 2;
        char *p = jv_alloc(b->a, nc);
        if (!p) {
            b->fail = 1;
            return;
        }
        if (b->n)
            memcpy(p, b->p, b->n);
        b->p = p;
        b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
}

void jv_buf_cstr(jv_buf *b, const char *s) { jv_buf_add(b, s, strlen(s)); }

jv jv_buf_take(jv_buf *b)
{
    if (b->fail)
        return jv_undef_named(b->a, "", b->fail == 2 ? "output too large" : "out of memory");
    return jv_strn(b->a, b->p ? b->p : "", b->n);
}

/* ---- str() and repr() ---- */

void jv_float_repr(double f, char *buf, size_t cap)
{
    if (isnan(f)) {
        snprintf(buf, cap, "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(buf, cap, f < 0 ? "-inf" : "inf");
        return;
    }
    int prec = 1;
    for (; prec < 17; prec++) {
        snprintf(buf, cap, "%.*e", prec - 1, f);
        if (strtod(buf, NULL) == f)
            break;
    }
    /* prec significant digits; Python uses scientific notation when the
     * exponent is < -4 or >= 16, positional otherwise. */
    int e10 = f == 0.0 ? 0 : (int)floor(log10(fabs(f)));
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
    const char *ep = strchr(tmp, 'e');
    if (ep)
        e10 = atoi(ep + 1);
    if (e10 < -4 || e10 >= 16) {
        /* mantissa digits without trailing zeros, exponent with sign and at least 2 digits */
        char mant[40];
        size_t ml = (size_t)(ep - tmp);
        memcpy(mant, tmp, ml);
        mant[ml] = '\0';
        if (strchr(mant, '.')) {
            while (ml > 0 && mant[ml - 1] == '0')
                mant[--ml] = '\0';
            if (ml > 0 && mant[ml - 1] == '.')
                mant[--ml] = '\0';
        }
        snprintf(buf, cap, "%se%c%02d", mant, e10 < 0 ? '-' : '+', abs(e10));
        return;
    }
    int decimals = prec - 1 - e10;
    if (decimals < 0)
        decimals = 0;
    snprintf(buf, cap, "%.*f", decimals, f);
    if (!strchr(buf, '.'))
        snprintf(buf + strlen(buf), cap - strlen(buf), ".0");
}

static void repr_str(jv_buf *b, const jv_str *s)
{
    int has_sq = memchr(s->s, '\'', s->n) != NULL, has_dq = memchr(s->s, '"', s->n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    jv_buf_add(b, &q, 1);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->s[i];
        char esc[8];
        if (c == (unsigned char)q || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            jv_buf_add(b, esc, 2);
        } else if (c == '\n') {
            jv_buf_cstr(b, "\\n");
        } else if (c == '\r') {
            jv_buf_cstr(b, "\\r");
        } else if (c == '\t') {
            jv_buf_cstr(b, "\\t");
        } else if (c < 0x20 || c == 0x7F) {
            snprintf(esc, sizeof esc, "\\x%02x", c);
            jv_buf_cstr(b, esc);
        } else {
            jv_buf_add(b, (const char *)&c, 1);
        }
    }
    jv_buf_add(b, &q, 1);
}

static void write_val(jv_buf *b, jv v, int repr, int depth);

static void write_seq(jv_buf *b, jv v, int depth)
{
    const jv_list *l = v.u.l;
    jv_buf_cstr(b, l->tuple ? "(" : "[");
    for (size_t i = 0; i < l->n; i++) {
        if (i)
            jv_buf_cstr(b, ", ");
        write_val(b, l->v[i], 1, depth + 1);
    }
    if (l->tuple && l->n == 1)
        jv_buf_cstr(b, ",");
    jv_buf_cstr(b, l->tuple ? ")" : "]");
}

static void write_val(jv_buf *b, jv v, int repr, int depth)
{
    char num[64];
    if (depth > 100) {
        jv_buf_cstr(b, "...");
        return;
    }
    switch (v.t) {
    case JV_UNDEF: break;
    case JV_NONE: jv_buf_cstr(b, "None"); break;
    case JV_BOOL: jv_buf_cstr(b, v.u.b ? "True" : "False"); break;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jv_buf_cstr(b, num);
        break;
    case JV_FLOAT:
        jv_float_repr(v.u.f, num, sizeof num);
        jv_buf_cstr(b, num);
        break;
    case JV_STR:
        if (repr)
            repr_str(b, v.u.s);
        else
            jv_buf_add(b, v.u.s->s, v.u.s->n);
        break;
    case JV_LIST:
        if (v.u.l->gen)
            jv_buf_cstr(b, "<generator object>");
        else
            write_seq(b, v, depth);
        break;
    case JV_DICT:
        jv_buf_cstr(b, v.u.d->ns ? "<Namespace {" : "{");
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i)
                jv_buf_cstr(b, ", ");
            write_val(b, v.u.d->k[i], 1, depth + 1);
            jv_buf_cstr(b, ": ");
            write_val(b, v.u.d->v[i], 1, depth + 1);
        }
        jv_buf_cstr(b, v.u.d->ns ? "}>" : "}");
        break;
    default:
        jv_buf_cstr(b, "<function ");
        jv_buf_cstr(b, v.u.fn->name ? v.u.fn->name : "?");
        jv_buf_cstr(b, ">");
        break;
    }
}

jv jv_to_str(jv_arena *a, jv v)
{
    if (v.t == JV_STR)
        return v;
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 30);
    write_val(&b, v, 0, 0);
    return jv_buf_take(&b);
}

jv jv_repr(jv_arena *a, jv v)
{
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 30);
    write_val(&b, v, 1, 0);
    return jv_buf_take(&b);
}
