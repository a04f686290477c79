/* jinja_filt.c - jinja2 3.1's builtin filters and tests (the subset chat
 * templates use), with jinja2's argument names and defaults. */
#include "text/jinja_filt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja_json.h"
#include "text/jinja_meth.h"

typedef int (*filter_fn)(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap);

static int ferr(char *emsg, size_t cap, const char *fmt, const char *x)
{
    snprintf(emsg, cap, fmt, x);
    return -1;
}

#define ARG(i, name) jmeth_arg(args, (i), (name))

static int arg_true(const jv_args *args, size_t i, const char *name)
{
    const jv *v = ARG(i, name);
    return v && jv_truthy(*v);
}

/* environment.getitem along "a.b.0": dict keys, list indices. */
static jv attr_path(jv_arena *a, jv v, const jv_str *path)
{
    const char *p = path->s, *e = p + path->n;
    while (p <= e) {
        const char *dot = memchr(p, '.', (size_t)(e - p));
        size_t n = dot ? (size_t)(dot - p) : (size_t)(e - p);
        char key[128];
        if (n >= sizeof key)
            return jv_undef_named(a, "", NULL);
        memcpy(key, p, n);
        key[n] = '\0';
        char *end;
        long idx = strtol(key, &end, 10);
        if (n && *end == '\0' && v.t == JV_LIST) {
            if (idx < 0 || (size_t)idx >= v.u.l->n)
                return jv_undef_named(a, "", NULL);
            v = v.u.l->v[idx];
        } else if (!jv_dict_get_str(v, key, &v)) {
            return jv_undef_named(a, "", NULL);
        }
        if (!dot)
            break;
        p = dot + 1;
    }
    return v;
}

/* Items of an iterable as Python's list(x) gives them. */
static int to_list(jv_arena *a, jv in, jv *out, char *emsg, size_t cap)
{
    if (in.t == JV_LIST && in.u.l->gen) {
        jv c = jv_list_new(a, in.u.l->n);
        for (size_t i = 0; c.t == JV_LIST && i < in.u.l->n; i++)
            jv_list_push(a, c, in.u.l->v[i]);
        *out = c;
        return c.t == JV_LIST ? 0 : ferr(emsg, cap, "%s", "out of memory");
    }
    if (in.t == JV_LIST) {
        *out = in;
        return 0;
    }
    jv l = jv_list_new(a, 4);
    if (in.t == JV_UNDEF) {
        *out = l;
        return 0;
    }
    if (in.t == JV_DICT && !in.u.d->ns) {
        for (size_t i = 0; i < in.u.d->n; i++)
            jv_list_push(a, l, in.u.d->k[i]);
    } else if (in.t == JV_STR) {
        size_t k;
        for (size_t i = 0; i < in.u.s->n; i += k) {
            jv_utf8_dec((const unsigned char *)in.u.s->s + i, in.u.s->n - i, &k);
            jv_list_push(a, l, jv_strn(a, in.u.s->s + i, k));
        }
    } else {
        return ferr(emsg, cap, "'%s' object is not iterable", jv_type_name(in));
    }
    *out = l;
    return 0;
}

static int f_length(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    switch (in.t) {
    case JV_STR: *out = jv_int((int64_t)jv_utf8_len(in.u.s->s, in.u.s->n)); return 0;
    case JV_LIST:
        if (in.u.l->gen)
            return ferr(emsg, cap, "object of type '%s' has no len()", "generator");
        *out = jv_int((int64_t)in.u.l->n);
        return 0;
    case JV_DICT: *out = jv_int((int64_t)in.u.d->n); return 0;
    case JV_UNDEF: *out = jv_int(0); return 0;
    default: return ferr(emsg, cap, "object of type '%s' has no len()", jv_type_name(in));
    }
}

static int f_tojson(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    /* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
    const jv *ea = ARG(0, "ensure_ascii"), *ind = ARG(1, "indent"), *sep = ARG(2, "separators");
    const jv *sk = ARG(3, "sort_keys");
    jjson_opts o = {.indent = -1, .sort_keys = sk && jv_truthy(*sk), .ensure_ascii = ea && jv_truthy(*ea)};
    if (ind && ind->t == JV_INT)
        o.indent = (int)(ind->u.i < 0 ? 0 : ind->u.i > 64 ? 64 : ind->u.i);
    if (sep && sep->t == JV_LIST && sep->u.l->n == 2 && sep->u.l->v[0].t == JV_STR && sep->u.l->v[1].t == JV_STR) {
        o.item_sep = sep->u.l->v[0].u.s->s;
        o.key_sep = sep->u.l->v[1].u.s->s;
    }
    return jjson_dumps(a, in, &o, out, emsg, cap);
}

static int f_trim(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *chars = ARG(0, "chars");
    jv s = jv_to_str(a, in);
    *out = jmeth_strip(a, s, chars && chars->t == JV_STR ? chars->u.s : NULL, 1, 1);
    return 0;
}

static int f_case(jv_arena *a, jv in, jmeth_case_mode m, jv *out)
{
    *out = jmeth_case(a, jv_to_str(a, in), m);
    return 0;
}
static int f_upper(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_case(a, in, JCASE_UPPER, out); }
static int f_lower(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_case(a, in, JCASE_LOWER, out); }
static int f_capitalize(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_case(a, in, JCASE_CAPITALIZE, out); }

/* jinja2's title: words start after runs of [-\s({[<]. */
static int f_title(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv s = jv_to_str(a, in);
    if (s.t != JV_STR)
        return ferr(emsg, cap, "%s", "out of memory");
    jv_buf b;
    jv_buf_init(&b, a, s.u.s->n * 2 + 16);
    const char *p = s.u.s->s;
    size_t n = s.u.s->n, i = 0, k;
    while (i < n) {
        size_t st = i;
        while (i < n) {
            uint32_t c = jv_utf8_dec((const unsigned char *)p + i, n - i, &k);
            if (!(c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jv_py_space(c)))
                break;
            i += k;
        }
        jv_buf_add(&b, p + st, i - st);
        st = i;
        while (i < n) {
            uint32_t c = jv_utf8_dec((const unsigned char *)p + i, n - i, &k);
            if (c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || jv_py_space(c))
                break;
            i += k;
        }
        if (i > st) {
            jv w = jmeth_case(a, jv_strn(a, p + st, i - st), JCASE_CAPITALIZE);
            if (w.t == JV_STR)
                jv_buf_add(&b, w.u.s->s, w.u.s->n);
        }
    }
    *out = jv_buf_take(&b);
    return 0;
}

static int f_first_last(jv_arena *a, jv in, int last, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    if (!l.u.l->n) {
        *out = jv_undef_named(a, "", "No first item, sequence was empty.");
        return 0;
    }
    *out = l.u.l->v[last ? l.u.l->n - 1 : 0];
    return 0;
}
static int f_first(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_first_last(a, in, 0, out, e, c); }
static int f_last(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_first_last(a, in, 1, out, e, c); }

static int f_join(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *d = ARG(0, "d"), *attr = ARG(1, "attribute");
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 28);
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i && d && d->t == JV_STR)
            jv_buf_add(&b, d->u.s->s, d->u.s->n);
        jv x = l.u.l->v[i];
        if (attr && attr->t == JV_STR)
            x = attr_path(a, x, attr->u.s);
        jv s = jv_to_str(a, x);
        if (s.t == JV_STR)
            jv_buf_add(&b, s.u.s->s, s.u.s->n);
    }
    *out = jv_buf_take(&b);
    return 0;
}

static int f_replace(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *o = ARG(0, "old"), *n = ARG(1, "new"), *c = ARG(2, "count");
    jv s = jv_to_str(a, in);
    jv os = o ? jv_to_str(a, *o) : jv_none(), ns = n ? jv_to_str(a, *n) : jv_none();
    if (s.t != JV_STR || os.t != JV_STR || ns.t != JV_STR)
        return ferr(emsg, cap, "%s", "replace() needs old and new");
    *out = jmeth_replace(a, s, os.u.s, ns.u.s, c && c->t == JV_INT ? c->u.i : -1);
    return 0;
}

static int f_list(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    if (l.u.l == in.u.l || l.u.l->tuple) { /* a fresh list, never the same object */
        jv c = jv_list_new(a, l.u.l->n);
        for (size_t i = 0; i < l.u.l->n; i++)
            jv_list_push(a, c, l.u.l->v[i]);
        l = c;
    }
    *out = l;
    return 0;
}

static int f_default(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *d = ARG(0, "default_value");
    int boolean = arg_true(args, 1, "boolean");
    if (in.t == JV_UNDEF || (boolean && !jv_truthy(in)))
        *out = d ? *d : jv_strn(a, "", 0);
    else
        *out = in;
    return 0;
}

static jv pair(jv_arena *a, jv k, jv v)
{
    jv t = jv_list_new(a, 2);
    if (t.t == JV_LIST) {
        t.u.l->tuple = 1;
        jv_list_push(a, t, k);
        jv_list_push(a, t, v);
    }
    return t;
}

static int f_items(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l = jv_list_new(a, 4);
    if (in.t == JV_UNDEF) {
        *out = l;
        return 0;
    }
    if (in.t != JV_DICT || in.u.d->ns)
        return ferr(emsg, cap, "Can only get item pairs from a mapping.%s", "");
    for (size_t i = 0; i < in.u.d->n; i++)
        jv_list_push(a, l, pair(a, in.u.d->k[i], in.u.d->v[i]));
    *out = l;
    return 0;
}

/* Sort key comparison with jinja2's case_sensitive=False lowering. */
static int key_cmp(jv_arena *a, jv x, jv y, int cs, int *c)
{
    if (!cs && x.t == JV_STR && y.t == JV_STR) {
        x = jmeth_case(a, x, JCASE_LOWER);
        y = jmeth_case(a, y, JCASE_LOWER);
    }
    return jv_cmp(x, y, c);
}

/* Stable merge sort of v[0..n) by keys[]. */
static int msort(jv_arena *a, jv *v, jv *keys, size_t n, int cs, int rev, char *emsg, size_t cap)
{
    if (n < 2)
        return 0;
    size_t h = n / 2;
    if (msort(a, v, keys, h, cs, rev, emsg, cap) || msort(a, v + h, keys + h, n - h, cs, rev, emsg, cap))
        return -1;
    jv *tv = jv_alloc(a, n * sizeof *tv), *tk = jv_alloc(a, n * sizeof *tk);
    if (!tv || !tk)
        return ferr(emsg, cap, "%s", "out of memory");
    size_t i = 0, j = h, o = 0;
    while (i < h || j < n) {
        int c = 0, take_right = 0;
        if (i < h && j < n) {
            if (key_cmp(a, keys[j], keys[i], cs, &c)) {
                snprintf(emsg, cap, "'<' not supported between instances of '%s' and '%s'", jv_type_name(keys[j]),
                         jv_type_name(keys[i]));
                return -1;
            }
            take_right = rev ? c > 0 : c < 0;
        } else {
            take_right = i >= h;
        }
        size_t s = take_right ? j++ : i++;
        tv[o] = v[s];
        tk[o++] = keys[s];
    }
    memcpy(v, tv, n * sizeof *v);
    memcpy(keys, tk, n * sizeof *keys);
    return 0;
}

static int sort_list(jv_arena *a, jv l, jv *keys, int cs, int rev, jv *out, char *emsg, size_t cap)
{
    jv c = jv_list_new(a, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++)
        jv_list_push(a, c, l.u.l->v[i]);
    if (c.t != JV_LIST || msort(a, c.u.l->v, keys, c.u.l->n, cs, rev, emsg, cap))
        return -1;
    *out = c;
    return 0;
}

static int f_dictsort(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv items;
    if (f_items(a, in, NULL, &items, emsg, cap))
        return -1;
    const jv *by = ARG(1, "by");
    int by_value = by && by->t == JV_STR && !strcmp(by->u.s->s, "value");
    jv *keys = jv_alloc(a, (items.u.l->n + 1) * sizeof *keys);
    if (!keys)
        return ferr(emsg, cap, "%s", "out of memory");
    for (size_t i = 0; i < items.u.l->n; i++)
        keys[i] = items.u.l->v[i].u.l->v[by_value];
    return sort_list(a, items, keys, arg_true(args, 0, "case_sensitive"), arg_true(args, 2, "reverse"), out, emsg, cap);
}

static int f_sort(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    const jv *attr = ARG(2, "attribute");
    jv *keys = jv_alloc(a, (l.u.l->n + 1) * sizeof *keys);
    if (!keys)
        return ferr(emsg, cap, "%s", "out of memory");
    for (size_t i = 0; i < l.u.l->n; i++)
        keys[i] = attr && attr->t == JV_STR ? attr_path(a, l.u.l->v[i], attr->u.s) : l.u.l->v[i];
    return sort_list(a, l, keys, arg_true(args, 1, "case_sensitive"), arg_true(args, 0, "reverse"), out, emsg, cap);
}

static int f_string(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    *out = jv_to_str(a, in);
    return 0;
}

static int f_safe(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv s = jv_to_str(a, in);
    if (s.t != JV_STR)
        return ferr(emsg, cap, "%s", "out of memory");
    if (!s.u.s->safe) { /* a fresh copy: the input may be the template's own literal */
        s = jv_strn(a, s.u.s->s, s.u.s->n);
        if (s.t == JV_STR)
            ((jv_str *)s.u.s)->safe = 1;
    }
    *out = s;
    return 0;
}

static int f_int(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *d = ARG(0, "default");
    *out = d ? *d : jv_int(0);
    if (in.t == JV_INT || in.t == JV_BOOL)
        *out = jv_int(in.t == JV_INT ? in.u.i : in.u.b);
    else if (in.t == JV_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18)
        *out = jv_int((int64_t)in.u.f);
    else if (in.t == JV_STR) {
        jv s = jmeth_strip(a, in, NULL, 1, 1);
        char *end;
        long long v = strtoll(s.u.s->s, &end, 10);
        if (s.u.s->n && *end == '\0')
            *out = jv_int(v);
        else if (!strpbrk(s.u.s->s, "xXpP")) { /* Python's float() reads no hex */
            double f = strtod(s.u.s->s, &end);
            if (s.u.s->n && *end == '\0' && isfinite(f) && fabs(f) < 9.2e18)
                *out = jv_int((int64_t)f);
        }
    }
    return 0;
}

static int f_float(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *d = ARG(0, "default");
    *out = d ? *d : jv_float(0.0);
    if (jv_is_num(in))
        *out = jv_float(jv_num(in));
    else if (in.t == JV_STR) {
        jv s = jmeth_strip(a, in, NULL, 1, 1);
        char *end;
        double f = strtod(s.u.s->s, &end);
        if (s.u.s->n && *end == '\0' && !strpbrk(s.u.s->s, "xXpP"))
            *out = jv_float(f);
    }
    return 0;
}

/* jinja2 3.1 indent(width=4, first=False, blank=False). */
static int f_indent(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *w = ARG(0, "width");
    int first = arg_true(args, 1, "first"), blank = arg_true(args, 2, "blank");
    jv ind = w && w->t == JV_STR ? *w : jv_none();
    if (ind.t != JV_STR) {
        int64_t n = w && w->t == JV_INT ? w->u.i : 4;
        char sp[257];
        n = n < 0 ? 0 : n > 256 ? 256 : n;
        memset(sp, ' ', (size_t)n);
        ind = jv_strn(a, sp, (size_t)n);
    }
    jv s = jv_to_str(a, in), lines;
    if (s.t != JV_STR || ind.t != JV_STR)
        return ferr(emsg, cap, "%s", "out of memory");
    jv_buf tmp;
    jv_buf_init(&tmp, a, s.u.s->n + 2);
    jv_buf_add(&tmp, s.u.s->s, s.u.s->n);
    jv_buf_add(&tmp, "\n", 1);
    jv_args none = {0};
    if (jmeth_call(a, jv_buf_take(&tmp), "splitlines", &none, &lines, emsg, cap))
        return -1;
    jv_buf b;
    jv_buf_init(&b, a, (size_t)1 << 28);
    if (first)
        jv_buf_add(&b, ind.u.s->s, ind.u.s->n);
    for (size_t i = 0; i < lines.u.l->n; i++) {
        const jv_str *ln = lines.u.l->v[i].u.s;
        if (i) {
            jv_buf_add(&b, "\n", 1);
            if (blank || ln->n)
                jv_buf_add(&b, ind.u.s->s, ind.u.s->n);
        }
        jv_buf_add(&b, ln->s, ln->n);
    }
    *out = jv_buf_take(&b);
    return 0;
}

static int f_round(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const jv *p = ARG(0, "precision"), *m = ARG(1, "method");
    int prec = p && p->t == JV_INT ? (int)(p->u.i > 15 ? 15 : p->u.i < 0 ? 0 : p->u.i) : 0;
    if (!jv_is_num(in))
        return ferr(emsg, cap, "type %s doesn't define __round__ method", jv_type_name(in));
    double x = jv_num(in), mul = pow(10.0, prec);
    const char *meth = m && m->t == JV_STR ? m->u.s->s : "common";
    if (!strcmp(meth, "floor"))
        x = floor(x * mul) / mul;
    else if (!strcmp(meth, "ceil"))
        x = ceil(x * mul) / mul;
    else {
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", prec, x); /* correctly rounded, half to even: Python's round */
        x = strtod(buf, NULL);
    }
    *out = jv_float(x);
    return 0;
}

static int f_abs(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    if (in.t == JV_INT || in.t == JV_BOOL) {
        int64_t v = in.t == JV_INT ? in.u.i : in.u.b;
        *out = jv_int(v < 0 ? -v : v);
    } else if (in.t == JV_FLOAT) {
        *out = jv_float(fabs(in.u.f));
    } else {
        return ferr(emsg, cap, "bad operand type for abs(): '%s'", jv_type_name(in));
    }
    return 0;
}

static int f_unique(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    int cs = arg_true(args, 0, "case_sensitive");
    const jv *attr = ARG(1, "attribute");
    jv r = jv_list_new(a, l.u.l->n), seen = jv_list_new(a, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv k = attr && attr->t == JV_STR ? attr_path(a, l.u.l->v[i], attr->u.s) : l.u.l->v[i];
        if (!cs && k.t == JV_STR)
            k = jmeth_case(a, k, JCASE_LOWER);
        int dup = 0;
        for (size_t j = 0; j < seen.u.l->n && !dup; j++)
            dup = jv_eq(seen.u.l->v[j], k);
        if (!dup) {
            jv_list_push(a, seen, k);
            jv_list_push(a, r, l.u.l->v[i]);
        }
    }
    *out = r;
    return 0;
}

static int f_reverse(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    jv r = jv_list_new(a, l.u.l->n);
    for (size_t i = l.u.l->n; i-- > 0;)
        jv_list_push(a, r, l.u.l->v[i]);
    if (in.t == JV_STR) {
        jv_args none = {0};
        jv sep = jv_strn(a, "", 0);
        jv_args ja = {.pos = &r, .n_pos = 1};
        (void)none;
        return jmeth_call(a, sep, "join", &ja, out, emsg, cap);
    }
    *out = r;
    return 0;
}

static int f_minmax(jv_arena *a, jv in, const jv_args *args, int want_max, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    int cs = arg_true(args, 0, "case_sensitive");
    const jv *attr = ARG(1, "attribute");
    if (!l.u.l->n) {
        *out = jv_undef_named(a, "", "No aggregated item, sequence was empty.");
        return 0;
    }
    size_t best = 0;
    for (size_t i = 1; i < l.u.l->n; i++) {
        jv x = l.u.l->v[i], y = l.u.l->v[best];
        if (attr && attr->t == JV_STR) {
            x = attr_path(a, x, attr->u.s);
            y = attr_path(a, y, attr->u.s);
        }
        int c = 0;
        if (key_cmp(a, x, y, cs, &c))
            return ferr(emsg, cap, "'<' not supported between these values%s", "");
        if (want_max ? c > 0 : c < 0)
            best = i;
    }
    *out = l.u.l->v[best];
    return 0;
}
static int f_min(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_minmax(a, in, args, 0, out, e, c); }
static int f_max(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_minmax(a, in, args, 1, out, e, c); }

static int f_sum(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    const jv *attr = ARG(0, "attribute"), *start = ARG(1, "start");
    int64_t si = start && start->t == JV_INT ? start->u.i : 0;
    double sf = 0;
    int is_f = start && start->t == JV_FLOAT;
    if (is_f)
        sf = start->u.f;
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = attr && attr->t == JV_STR ? attr_path(a, l.u.l->v[i], attr->u.s) : l.u.l->v[i];
        if (!jv_is_num(x))
            return ferr(emsg, cap, "unsupported operand type(s) for +: 'int' and '%s'", jv_type_name(x));
        if (x.t == JV_FLOAT && !is_f) {
            is_f = 1;
            sf = (double)si;
        }
        if (is_f)
            sf += jv_num(x);
        else
            si += x.t == JV_INT ? x.u.i : x.u.b;
    }
    *out = is_f ? jv_float(sf) : jv_int(si);
    return 0;
}

static int f_batch(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l;
    if (to_list(a, in, &l, emsg, cap))
        return -1;
    const jv *cnt = ARG(0, "linecount"), *fill = ARG(1, "fill_with");
    if (!cnt || cnt->t != JV_INT || cnt->u.i <= 0)
        return ferr(emsg, cap, "%s", "batch() needs a positive line count");
    size_t k = (size_t)cnt->u.i;
    jv r = jv_list_new(a, 4), cur = jv_none();
    for (size_t i = 0; i < l.u.l->n; i++) {
        if (i % k == 0) {
            cur = jv_list_new(a, k);
            jv_list_push(a, r, cur);
        }
        jv_list_push(a, cur, l.u.l->v[i]);
    }
    if (fill && fill->t != JV_NONE && cur.t == JV_LIST)
        while (cur.u.l->n < k)
            jv_list_push(a, cur, *fill);
    *out = r;
    return 0;
}

/* select / reject / selectattr / rejectattr / map */
static int f_select_common(jv_arena *a, jv in, const jv_args *args, int attr_mode, int keep, jv *out, char *emsg,
                           size_t cap)
{
    jv l = jv_list_new(a, 0);
    if (jv_truthy(in) && to_list(a, in, &l, emsg, cap)) /* jinja2: `if seq:` first */
        return -1;
    size_t off = attr_mode ? 1 : 0;
    const jv *attr = attr_mode ? ARG(0, NULL) : NULL;
    if (attr_mode && (!attr || attr->t != JV_STR))
        return ferr(emsg, cap, "%s", "selectattr/rejectattr need an attribute name");
    const jv *test = args ? (off < args->n_pos ? &args->pos[off] : NULL) : NULL;
    if (test && test->t != JV_STR)
        return ferr(emsg, cap, "%s", "the test name must be a string");
    jv_args targs = {.pos = args && args->n_pos > off + 1 ? args->pos + off + 1 : NULL,
                     .n_pos = args && args->n_pos > off + 1 ? args->n_pos - off - 1 : 0};
    jv r = jv_list_new(a, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x = attr ? attr_path(a, l.u.l->v[i], attr->u.s) : l.u.l->v[i];
        int t;
        if (test) {
            if (jfilt_test(a, test->u.s->s, x, &targs, &t, emsg, cap))
                return -1;
        } else {
            t = jv_truthy(x);
        }
        if (t == keep)
            jv_list_push(a, r, l.u.l->v[i]);
    }
    if (r.t == JV_LIST)
        r.u.l->gen = 1;
    *out = r;
    return 0;
}
static int f_select(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_select_common(a, in, args, 0, 1, out, e, c); }
static int f_reject(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_select_common(a, in, args, 0, 0, out, e, c); }
static int f_selectattr(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_select_common(a, in, args, 1, 1, out, e, c); }
static int f_rejectattr(jv_arena *a, jv in, const jv_args *args, jv *out, char *e, size_t c) { return f_select_common(a, in, args, 1, 0, out, e, c); }

static int f_map(jv_arena *a, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    jv l = jv_list_new(a, 0);
    if (jv_truthy(in) && to_list(a, in, &l, emsg, cap)) /* jinja2: `if value:` first */
        return -1;
    const jv *attr = NULL, *def = NULL;
    for (size_t k = 0; args && k < args->n_kw; k++) {
        if (!strcmp(args->kwn[k], "attribute"))
            attr = &args->kwv[k];
        else if (!strcmp(args->kwn[k], "default"))
            def = &args->kwv[k];
    }
    const jv *fname = args && args->n_pos ? &args->pos[0] : NULL;
    if (!attr && (!fname || fname->t != JV_STR))
        return ferr(emsg, cap, "%s", "map() needs a filter name or attribute=");
    jv_args fargs = {.pos = args && args->n_pos > 1 ? args->pos + 1 : NULL, .n_pos = args && args->n_pos > 1 ? args->n_pos - 1 : 0};
    jv r = jv_list_new(a, l.u.l->n);
    for (size_t i = 0; i < l.u.l->n; i++) {
        jv x;
        if (attr) {
            if (attr->t != JV_STR)
                return ferr(emsg, cap, "%s", "map(attribute=) needs a string");
            x = attr_path(a, l.u.l->v[i], attr->u.s);
            if (x.t == JV_UNDEF && def)
                x = *def;
        } else if (jfilt_filter(a, fname->u.s->s, l.u.l->v[i], &fargs, &x, emsg, cap)) {
            return -1;
        }
        jv_list_push(a, r, x);
    }
    if (r.t == JV_LIST)
        r.u.l->gen = 1;
    *out = r;
    return 0;
}

typedef struct filter_row {
    const char *name;
    filter_fn fn;
} filter_row;

static const filter_row FILTERS[] = {
    {"abs", f_abs}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"count", f_length}, {"d", f_default},
    {"default", f_default}, {"dictsort", f_dictsort}, {"first", f_first}, {"float", f_float}, {"indent", f_indent},
    {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last}, {"length", f_length}, {"list", f_list},
    {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min}, {"reject", f_reject},
    {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse}, {"round", f_round},
    {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string},
    {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim}, {"unique", f_unique},
    {"upper", f_upper},
};

/* jinja2 3.1 builtins kvant does not implement. */
static const char *const FILTERS_MISSING[] = {"attr", "center", "e", "escape", "filesizeformat", "forceescape",
                                              "format", "groupby", "pprint", "random", "slice", "striptags",
                                              "truncate", "urlencode", "urlize", "wordcount", "wordwrap",
                                              "xmlattr", NULL};

static const filter_row *find_filter(const char *name)
{
    for (size_t i = 0; i < sizeof FILTERS / sizeof FILTERS[0]; i++)
        if (!strcmp(FILTERS[i].name, name))
            return &FILTERS[i];
    return NULL;
}

int jfilt_filter_status(const char *name)
{
    if (find_filter(name))
        return 1;
    for (int i = 0; FILTERS_MISSING[i]; i++)
        if (!strcmp(FILTERS_MISSING[i], name))
            return 0;
    return -1;
}

int jfilt_filter(jv_arena *a, const char *name, jv in, const jv_args *args, jv *out, char *emsg, size_t cap)
{
    const filter_row *f = find_filter(name);
    if (!f)
        return ferr(emsg, cap, "No filter named '%s'.", name);
    jv_args none = {0};
    return f->fn(a, in, args ? args : &none, out, emsg, cap);
}

/* ---- tests ---- */

static const char *const TESTS[] = {"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "even",
                                    "false", "float", "ge", "gt", "greaterthan", "in", "integer", "iterable",
                                    "le", "lessthan", "lower", "lt", "mapping", "ne", "none", "number", "odd",
                                    "sameas", "sequence", "string", "true", "undefined", "upper", "==", "!=",
                                    ">", ">=", "<", "<=", NULL};
static const char *const TESTS_MISSING[] = {"escaped", "filter", "test", NULL};

int jfilt_test_status(const char *name)
{
    for (int i = 0; TESTS[i]; i++)
        if (!strcmp(TESTS[i], name))
            return 1;
    for (int i = 0; TESTS_MISSING[i]; i++)
        if (!strcmp(TESTS_MISSING[i], name))
            return 0;
    return -1;
}

static int test_compare(const char *name, jv in, const jv *y, int *out, char *emsg, size_t cap)
{
    if (!y)
        return ferr(emsg, cap, "test '%s' needs an argument", name);
    if (!strcmp(name, "eq") || !strcmp(name, "equalto") || !strcmp(name, "==")) {
        *out = jv_eq(in, *y);
        return 0;
    }
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) {
        *out = !jv_eq(in, *y);
        return 0;
    }
    if (!strcmp(name, "sameas")) {
        *out = in.t == y->t && jv_eq(in, *y) &&
               (in.t <= JV_BOOL || (in.t == JV_LIST && in.u.l == y->u.l) || (in.t == JV_DICT && in.u.d == y->u.d));
        return 0;
    }
    int c;
    if (jv_cmp(in, *y, &c)) {
        snprintf(emsg, cap, "comparison not supported between instances of '%s' and '%s'", jv_type_name(in),
                 jv_type_name(*y));
        return -1;
    }
    int lt = c == -1, gt = c == 1, eq = c == 0;
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan") || !strcmp(name, "<"))
        *out = lt;
    else if (!strcmp(name, "le") || !strcmp(name, "<="))
        *out = lt || eq;
    else if (!strcmp(name, "gt") || !strcmp(name, "greaterthan") || !strcmp(name, ">"))
        *out = gt;
    else
        *out = gt || eq;
    return 0;
}

int jfilt_test(jv_arena *a, const char *name, jv in, const jv_args *args, int *out, char *emsg, size_t cap)
{
    const jv *y = args ? jmeth_arg(args, 0, NULL) : NULL;
    jv_type t = in.t;
    if (!strcmp(name, "defined")) *out = t != JV_UNDEF;
    else if (!strcmp(name, "undefined")) *out = t == JV_UNDEF;
    else if (!strcmp(name, "none")) *out = t == JV_NONE;
    else if (!strcmp(name, "boolean")) *out = t == JV_BOOL;
    else if (!strcmp(name, "true")) *out = t == JV_BOOL && in.u.b;
    else if (!strcmp(name, "false")) *out = t == JV_BOOL && !in.u.b;
    else if (!strcmp(name, "integer")) *out = t == JV_INT;
    else if (!strcmp(name, "float")) *out = t == JV_FLOAT;
    else if (!strcmp(name, "number")) *out = jv_is_num(in);
    else if (!strcmp(name, "string")) *out = t == JV_STR;
    else if (!strcmp(name, "mapping")) *out = t == JV_DICT && !in.u.d->ns;
    else if (!strcmp(name, "iterable")) *out = t == JV_STR || t == JV_LIST || (t == JV_DICT && !in.u.d->ns) || t == JV_UNDEF;
    else if (!strcmp(name, "sequence")) *out = t == JV_STR || t == JV_LIST || (t == JV_DICT && !in.u.d->ns);
    else if (!strcmp(name, "callable")) *out = t == JV_FUNC;
    else if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        jv r;
        jv_args none = {0};
        if (t != JV_STR)
            return ferr(emsg, cap, "'%s' object has no attribute 'islower'", jv_type_name(in));
        if (jmeth_call(a, in, name[0] == 'l' ? "islower" : "isupper", &none, &r, emsg, cap))
            return -1;
        *out = r.u.b;
    } else if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        int64_t d = 2;
        if (name[0] == 'd') {
            if (!y || y->t != JV_INT || y->u.i == 0)
                return ferr(emsg, cap, "%s", "divisibleby needs a non-zero integer");
            d = y->u.i;
        }
        if (t != JV_INT && t != JV_BOOL)
            return ferr(emsg, cap, "test '%s' needs an integer", name);
        int64_t v = t == JV_INT ? in.u.i : in.u.b, m = ((v % d) + d) % d;
        *out = name[0] == 'o' ? m == 1 : m == 0;
    } else if (!strcmp(name, "in")) {
        if (!y)
            return ferr(emsg, cap, "%s", "test 'in' needs an argument");
        if (y->t == JV_STR && t == JV_STR)
            *out = memmem(y->u.s->s, y->u.s->n, in.u.s->s, in.u.s->n) != NULL || in.u.s->n == 0;
        else if (y->t == JV_LIST) {
            *out = 0;
            for (size_t i = 0; i < y->u.l->n && !*out; i++)
                *out = jv_eq(y->u.l->v[i], in);
        } else if (y->t == JV_DICT) {
            jv tmp;
            *out = jv_dict_get(*y, in, &tmp);
        } else
            return ferr(emsg, cap, "argument of type '%s' is not iterable", jv_type_name(*y));
    } else if (jfilt_test_status(name) == 1) {
        return test_compare(name, in, y, out, emsg, cap);
    } else {
        return ferr(emsg, cap, "No test named '%s'.", name);
    }
    return 0;
}
