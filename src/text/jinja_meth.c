/* jinja_meth.c - str / dict / list methods with Python's results. */
#include "text/jinja_meth.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "replace", "upper", "lower", "title", "capitalize", "format", "find",
                                          "rfind", "count", "index", "join", "splitlines", "isdigit", "isalpha",
                                          "isspace", "isalnum", "isupper", "islower", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};
static const char *const LIST_UNSAFE[] = {"append", "clear", "pop", "reverse", "insert", "sort", "extend", "remove", NULL};

static int in_list(const char *const *l, const char *s)
{
    for (; *l; l++)
        if (!strcmp(*l, s))
            return 1;
    return 0;
}

int jmeth_kind(jv self, const char *name)
{
    if (self.t == JV_STR)
        return in_list(STR_METHODS, name);
    if (self.t == JV_DICT && !self.u.d->ns)
        return in_list(DICT_METHODS, name) ? 1 : in_list(DICT_UNSAFE, name) ? -1 : 0;
    if (self.t == JV_LIST)
        return in_list(LIST_METHODS, name) ? 1 : !self.u.l->tuple && in_list(LIST_UNSAFE, name) ? -1 : 0;
    return 0;
}

const jv *jmeth_arg(const jv_args *args, size_t i, const char *name)
{
    if (!args)
        return NULL;
    if (i < args->n_pos)
        return &args->pos[i];
    for (size_t k = 0; name && k < args->n_kw; k++)
        if (!strcmp(args->kwn[k], name))
            return &args->kwv[k];
    return NULL;
}

static int in_chars(const jv_str *chars, uint32_t cp)
{
    if (!chars)
        return jv_py_space(cp);
    size_t k;
    for (size_t i = 0; i < chars->n; i += k)
        if (jv_utf8_dec((const unsigned char *)chars->s + i, chars->n - i, &k) == cp)
            return 1;
    return 0;
}

jv jmeth_strip(jv_arena *a, jv s, const jv_str *chars, int left, int right)
{
    if (s.t != JV_STR)
        return s;
    const unsigned char *p = (const unsigned char *)s.u.s->s;
    size_t n = s.u.s->n, lo = 0, hi = n, k;
    while (left && lo < n && in_chars(chars, jv_utf8_dec(p + lo, n - lo, &k)))
        lo += k;
    while (right && hi > lo) {
        size_t st = hi - 1;
        while (st > lo && (p[st] & 0xC0) == 0x80 && hi - st < 4)
            st--;
        uint32_t cp = jv_utf8_dec(p + st, hi - st, &k);
        if (st + k != hi || !in_chars(chars, cp))
            break;
        hi = st;
    }
    if (lo == 0 && hi == n)
        return s;
    return jv_strn(a, s.u.s->s + lo, hi - lo);
}

static int is_alpha_cp(uint32_t c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0x24F && c != 0xD7 && c != 0xF7) ||
           (c >= 0x370 && c <= 0x52F) || (c >= 0x4E00 && c <= 0x9FFF);
}

static uint32_t to_upper(uint32_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 0xE0 && c <= 0xFE && c != 0xF7))
        return c - 32;
    return c;
}

static uint32_t to_lower(uint32_t c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 0xC0 && c <= 0xDE && c != 0xD7))
        return c + 32;
    return c;
}

static void put_cp(jv_buf *b, uint32_t cp, const char *orig, size_t k, uint32_t was)
{
    if (cp == was) {
        jv_buf_add(b, orig, k);
        return;
    }
    char d[4];
    if (cp < 0x80) {
        d[0] = (char)cp;
        jv_buf_add(b, d, 1);
    } else { /* Latin-1 only reaches here */
        d[0] = (char)(0xC0 | cp >> 6);
        d[1] = (char)(0x80 | (cp & 0x3F));
        jv_buf_add(b, d, 2);
    }
}

jv jmeth_case(jv_arena *a, jv s, jmeth_case_mode mode)
{
    if (s.t != JV_STR)
        return s;
    jv_buf b;
    jv_buf_init(&b, a, s.u.s->n * 2 + 16);
    const unsigned char *p = (const unsigned char *)s.u.s->s;
    size_t n = s.u.s->n, k;
    int prev_alpha = 0;
    for (size_t i = 0; i < n; i += k) {
        uint32_t c = jv_utf8_dec(p + i, n - i, &k), r = c;
        switch (mode) {
        case JCASE_LOWER: r = to_lower(c); break;
        case JCASE_UPPER: r = to_upper(c); break;
        case JCASE_CAPITALIZE: r = i == 0 ? to_upper(c) : to_lower(c); break;
        case JCASE_PYTITLE: r = prev_alpha ? to_lower(c) : to_upper(c); break;
        }
        prev_alpha = is_alpha_cp(c);
        put_cp(&b, r, (const char *)p + i, k, c);
    }
    return jv_buf_take(&b);
}

jv jmeth_replace(jv_arena *a, jv s, const jv_str *old, const jv_str *rep, int64_t count)
{
    const char *p = s.u.s->s;
    size_t n = s.u.s->n;
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 28);
    if (old->n == 0) { /* Python inserts rep before every character and at the end */
        size_t k, i = 0;
        for (; i < n && count != 0; i += k, count--) {
            jv_buf_add(&b, rep->s, rep->n);
            jv_utf8_dec((const unsigned char *)p + i, n - i, &k);
            jv_buf_add(&b, p + i, k);
        }
        if (count != 0)
            jv_buf_add(&b, rep->s, rep->n);
        jv_buf_add(&b, p + i, n - i);
        return jv_buf_take(&b);
    }
    size_t i = 0;
    while (count != 0) {
        const char *f = memmem(p + i, n - i, old->s, old->n);
        if (!f)
            break;
        jv_buf_add(&b, p + i, (size_t)(f - (p + i)));
        jv_buf_add(&b, rep->s, rep->n);
        i = (size_t)(f - p) + old->n;
        count--;
    }
    jv_buf_add(&b, p + i, n - i);
    return jv_buf_take(&b);
}

static int err(char *emsg, size_t cap, const char *msg)
{
    snprintf(emsg, cap, "%s", msg);
    return -1;
}

static const jv_str *str_arg(const jv_args *args, size_t i, const char *name, int *bad)
{
    const jv *v = jmeth_arg(args, i, name);
    if (!v || v->t == JV_NONE)
        return NULL;
    if (v->t != JV_STR)
        *bad = 1;
    return v->t == JV_STR ? v->u.s : NULL;
}

/* str.split / rsplit (sep NULL: runs of whitespace, no empty items). */
static int str_split(jv_arena *a, jv s, const jv_args *args, int from_right, jv *out, char *emsg, size_t cap)
{
    int bad = 0;
    const jv_str *sep = str_arg(args, 0, "sep", &bad);
    const jv *mx = jmeth_arg(args, 1, "maxsplit");
    int64_t maxsplit = mx && mx->t == JV_INT ? mx->u.i : -1;
    if (bad)
        return err(emsg, cap, "must be str or None");
    if (sep && sep->n == 0)
        return err(emsg, cap, "empty separator");
    jv l = jv_list_new(a, 4);
    const char *p = s.u.s->s;
    size_t n = s.u.s->n;
    if (from_right && maxsplit >= 0 && sep) {
        /* collect from the right, then reverse */
        size_t hi = n;
        while (maxsplit-- > 0) {
            const char *f = NULL;
            for (size_t i = hi; i >= sep->n && !f; i--)
                if (!memcmp(p + i - sep->n, sep->s, sep->n))
                    f = p + i - sep->n;
            if (!f)
                break;
            jv_list_push(a, l, jv_strn(a, f + sep->n, (size_t)(p + hi - f - (ptrdiff_t)sep->n)));
            hi = (size_t)(f - p);
        }
        jv_list_push(a, l, jv_strn(a, p, hi));
        for (size_t i = 0; i < l.u.l->n / 2; i++) {
            jv t = l.u.l->v[i];
            l.u.l->v[i] = l.u.l->v[l.u.l->n - 1 - i];
            l.u.l->v[l.u.l->n - 1 - i] = t;
        }
        *out = l;
        return 0;
    }
    size_t i = 0, k;
    if (!sep) {
        for (;;) {
            while (i < n && jv_py_space(jv_utf8_dec((const unsigned char *)p + i, n - i, &k)))
                i += k;
            if (i >= n)
                break;
            size_t st = i;
            if (maxsplit == 0) {
                jv l2 = jmeth_strip(a, jv_strn(a, p + st, n - st), NULL, 0, 1);
                jv_list_push(a, l, l2);
                break;
            }
            while (i < n && !jv_py_space(jv_utf8_dec((const unsigned char *)p + i, n - i, &k)))
                i += k;
            jv_list_push(a, l, jv_strn(a, p + st, i - st));
            maxsplit--;
        }
    } else {
        for (;;) {
            const char *f = maxsplit != 0 ? memmem(p + i, n - i, sep->s, sep->n) : NULL;
            if (!f) {
                jv_list_push(a, l, jv_strn(a, p + i, n - i));
                break;
            }
            jv_list_push(a, l, jv_strn(a, p + i, (size_t)(f - (p + i))));
            i = (size_t)(f - p) + sep->n;
            maxsplit--;
        }
    }
    *out = l;
    return 0;
}

static int affix(jv s, const jv *arg, int end, jv *out, char *emsg, size_t cap)
{
    if (!arg)
        return err(emsg, cap, "startswith/endswith takes at least 1 argument");
    const jv *opts = arg;
    size_t nopts = 1;
    if (arg->t == JV_LIST && arg->u.l->tuple) {
        opts = arg->u.l->v;
        nopts = arg->u.l->n;
    }
    for (size_t i = 0; i < nopts; i++) {
        if (opts[i].t != JV_STR)
            return err(emsg, cap, "startswith/endswith first arg must be str or a tuple of str");
        size_t m = opts[i].u.s->n;
        if (m <= s.u.s->n && !memcmp(s.u.s->s + (end ? s.u.s->n - m : 0), opts[i].u.s->s, m)) {
            *out = jv_bool(1);
            return 0;
        }
    }
    *out = jv_bool(0);
    return 0;
}

const char *jmeth_format_unsupported(const char *fmt, size_t *len)
{
    for (const char *p = strchr(fmt, '{'); p; p = strchr(p + 1, '{')) {
        if (p[1] == '{') {
            p++;
            continue;
        }
        size_t n = strcspn(p, "}");
        if (memchr(p, ':', n) || memchr(p, '.', n) || memchr(p, '[', n)) {
            *len = n + (p[n] == '}');
            return p;
        }
    }
    return NULL;
}

/* '{} {0} {name}'.format(...) with !s / !r conversions, no format specs. */
static int str_format(jv_arena *a, jv s, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 28);
    const char *p = s.u.s->s, *e = p + s.u.s->n;
    size_t auto_idx = 0;
    while (p < e) {
        if ((*p == '{' || *p == '}') && p + 1 < e && p[1] == *p) {
            jv_buf_add(&b, p, 1);
            p += 2;
            continue;
        }
        if (*p == '}')
            return err(emsg, cap, "Single '}' encountered in format string");
        if (*p != '{') {
            jv_buf_add(&b, p++, 1);
            continue;
        }
        const char *q = memchr(p, '}', (size_t)(e - p));
        if (!q)
            return err(emsg, cap, "Single '{' encountered in format string");
        char field[64];
        size_t fl = (size_t)(q - p - 1);
        if (fl >= sizeof field)
            return err(emsg, cap, "format field too long");
        memcpy(field, p + 1, fl);
        field[fl] = '\0';
        char conv = 0, *bang = strchr(field, '!');
        if (strchr(field, ':') || strchr(field, '.') || strchr(field, '['))
            return err(emsg, cap, "format specs and field attributes are not supported by kvant");
        if (bang) {
            conv = bang[1];
            *bang = '\0';
        }
        const jv *v = NULL;
        if (!field[0])
            v = jmeth_arg(args, auto_idx++, NULL);
        else if (field[0] >= '0' && field[0] <= '9')
            v = jmeth_arg(args, (size_t)atoi(field), NULL);
        else
            v = jmeth_arg(args, (size_t)-1, field);
        if (!v)
            return err(emsg, cap, "Replacement index out of range for positional args tuple");
        jv sv = conv == 'r' ? jv_repr(a, *v) : jv_to_str(a, *v);
        if (sv.t == JV_STR)
            jv_buf_add(&b, sv.u.s->s, sv.u.s->n);
        p = q + 1;
    }
    *out = jv_buf_take(&b);
    return 0;
}

static int str_find(jv s, const jv_args *args, const char *name, jv *out, char *emsg, size_t cap)
{
    int bad = 0;
    const jv_str *sub = str_arg(args, 0, NULL, &bad);
    if (!sub || bad)
        return err(emsg, cap, "must be str");
    const char *p = s.u.s->s;
    size_t n = s.u.s->n;
    if (!strcmp(name, "count")) {
        int64_t c = 0;
        if (!sub->n) {
            *out = jv_int((int64_t)jv_utf8_len(p, n) + 1);
            return 0;
        }
        for (const char *f = p; (f = memmem(f, (size_t)(p + n - f), sub->s, sub->n)); f += sub->n)
            c++;
        *out = jv_int(c);
        return 0;
    }
    const char *f = NULL;
    if (!strcmp(name, "rfind")) {
        for (size_t i = n + 1; i-- > 0 && !f;)
            if (i + sub->n <= n && !memcmp(p + i, sub->s, sub->n))
                f = p + i;
    } else {
        f = memmem(p, n, sub->s, sub->n);
    }
    if (!f && !strcmp(name, "index"))
        return err(emsg, cap, "substring not found");
    *out = jv_int(f ? (int64_t)jv_utf8_len(p, (size_t)(f - p)) : -1);
    return 0;
}

static int str_pred(jv s, const char *name, jv *out)
{
    const unsigned char *p = (const unsigned char *)s.u.s->s;
    size_t n = s.u.s->n, k;
    int ok = n > 0, cased = 0;
    for (size_t i = 0; i < n; i += k) {
        uint32_t c = jv_utf8_dec(p + i, n - i, &k);
        int alpha = is_alpha_cp(c), digit = c >= '0' && c <= '9';
        if (!strcmp(name, "isdigit"))
            ok &= digit;
        else if (!strcmp(name, "isalpha"))
            ok &= alpha;
        else if (!strcmp(name, "isalnum"))
            ok &= alpha || digit;
        else if (!strcmp(name, "isspace"))
            ok &= jv_py_space(c);
        else if (!strcmp(name, "isupper") || !strcmp(name, "islower")) {
            int up = to_lower(c) != c, low = to_upper(c) != c;
            cased |= up || low;
            ok &= name[2] == 'u' ? !low : !up;
        }
    }
    if (!strcmp(name, "isupper") || !strcmp(name, "islower"))
        ok = ok && cased;
    *out = jv_bool(ok);
    return 0;
}

static int str_join(jv_arena *a, jv s, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *it = jmeth_arg(args, 0, NULL);
    if (!it || it->t != JV_LIST)
        return err(emsg, cap, "can only join a list or tuple (kvant)");
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 28);
    for (size_t i = 0; i < it->u.l->n; i++) {
        jv x = it->u.l->v[i];
        if (x.t != JV_STR) {
            snprintf(emsg, cap, "sequence item %zu: expected str instance, %s found", i, jv_type_name(x));
            return -1;
        }
        if (i)
            jv_buf_add(&b, s.u.s->s, s.u.s->n);
        jv_buf_add(&b, x.u.s->s, x.u.s->n);
    }
    *out = jv_buf_take(&b);
    return 0;
}

static int str_splitlines(jv_arena *a, jv s, jv *out)
{
    jv l = jv_list_new(a, 4);
    const char *p = s.u.s->s;
    size_t n = s.u.s->n, st = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)p[i];
        size_t k = c == '\r' && i + 1 < n && p[i + 1] == '\n' ? 2
                 : (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= 0x1C && c <= 0x1E)) ? 1 : 0;
        if (k) {
            jv_list_push(a, l, jv_strn(a, p + st, i - st));
            i += k;
            st = i;
        } else {
            i++;
        }
    }
    if (st < n)
        jv_list_push(a, l, jv_strn(a, p + st, n - st));
    *out = l;
    return 0;
}

static int str_call(jv_arena *a, jv s, const char *name, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    int bad = 0;
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        const jv_str *chars = str_arg(args, 0, NULL, &bad);
        if (bad)
            return err(emsg, cap, "strip arg must be None or str");
        *out = jmeth_strip(a, s, chars, name[0] != 'r', name[0] != 'l');
        return 0;
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit"))
        return str_split(a, s, args, name[0] == 'r', out, emsg, cap);
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith"))
        return affix(s, jmeth_arg(args, 0, NULL), name[0] == 'e', out, emsg, cap);
    if (!strcmp(name, "replace")) {
        const jv_str *o = str_arg(args, 0, NULL, &bad), *r = str_arg(args, 1, NULL, &bad);
        const jv *c = jmeth_arg(args, 2, "count");
        if (!o || !r || bad)
            return err(emsg, cap, "replace expected 2 str arguments");
        *out = jmeth_replace(a, s, o, r, c && c->t == JV_INT ? c->u.i : -1);
        return 0;
    }
    static const char *const cases[] = {"lower", "upper", "capitalize", "title"};
    for (int i = 0; i < 4; i++) {
        if (!strcmp(name, cases[i])) {
            *out = jmeth_case(a, s, (jmeth_case_mode)i);
            return 0;
        }
    }
    if (!strcmp(name, "format"))
        return str_format(a, s, args, out, emsg, cap);
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count") || !strcmp(name, "index"))
        return str_find(s, args, name, out, emsg, cap);
    if (!strcmp(name, "join"))
        return str_join(a, s, args, out, emsg, cap);
    if (!strcmp(name, "splitlines"))
        return str_splitlines(a, s, out);
    return str_pred(s, name, out);
}

static int dict_call(jv_arena *a, jv d, const char *name, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv_dict *m = d.u.d;
    if (!strcmp(name, "get")) {
        const jv *k = jmeth_arg(args, 0, NULL), *def = jmeth_arg(args, 1, NULL);
        if (!k)
            return err(emsg, cap, "get expected at least 1 argument, got 0");
        if (!jv_dict_get(d, *k, out))
            *out = def ? *def : jv_none();
        return 0;
    }
    if (!strcmp(name, "copy")) {
        jv c = jv_dict_new(a, m->n);
        for (size_t i = 0; i < m->n; i++)
            jv_dict_set(a, c, m->k[i], m->v[i]);
        *out = c;
        return 0;
    }
    jv l = jv_list_new(a, m->n);
    for (size_t i = 0; i < m->n && l.t == JV_LIST; i++) {
        jv item = m->k[i];
        if (name[0] == 'v') {
            item = m->v[i];
        } else if (name[0] == 'i') {
            item = jv_list_new(a, 2);
            if (item.t != JV_LIST)
                return err(emsg, cap, "out of memory");
            item.u.l->tuple = 1;
            jv_list_push(a, item, m->k[i]);
            jv_list_push(a, item, m->v[i]);
        }
        if (jv_list_push(a, l, item))
            return err(emsg, cap, "out of memory");
    }
    *out = l;
    return 0;
}

int jmeth_call(jv_arena *a, jv self, const char *name, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    int kind = jmeth_kind(self, name);
    if (kind < 0) {
        snprintf(emsg, cap, "access to attribute '%s' of '%s' object is unsafe.", name, jv_type_name(self));
        return -1;
    }
    if (kind == 0) {
        snprintf(emsg, cap, "'%s' object has no attribute '%s'", jv_type_name(self), name);
        return -1;
    }
    if (self.t == JV_STR)
        return str_call(a, self, name, args, out, emsg, cap);
    if (self.t == JV_DICT)
        return dict_call(a, self, name, args, out, emsg, cap);
    const jv *x = jmeth_arg(args, 0, NULL);
    if (!strcmp(name, "copy")) {
        jv c = jv_list_new(a, self.u.l->n);
        for (size_t i = 0; i < self.u.l->n; i++)
            jv_list_push(a, c, self.u.l->v[i]);
        *out = c;
        return 0;
    }
    if (!x)
        return err(emsg, cap, "list method takes exactly one argument");
    int64_t c = 0, idx = -1;
    for (size_t i = 0; i < self.u.l->n; i++) {
        if (jv_eq(self.u.l->v[i], *x)) {
            c++;
            if (idx < 0)
                idx = (int64_t)i;
        }
    }
    if (!strcmp(name, "index") && idx < 0)
        return err(emsg, cap, "x not in list");
    *out = jv_int(name[0] == 'i' ? idx : c);
    return 0;
}
