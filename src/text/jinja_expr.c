/* jinja_expr.c - Jinja expression evaluation (see jinja_expr.h). */
#include "text/jinja_expr.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "text/jinja_filt.h"
#include "text/jinja_meth.h"

#define JEXPR_MAX_RANGE 100000 /* jinja2's sandbox MAX_RANGE */

int jexpr_fail(jexpr_ctx *E, int line, const char *fmt, ...)
{
    char msg[KV_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kvant_err_set(E->err, KV_EINVAL, "chat template: %s (line %d)", msg, line);
}

static int oom(jexpr_ctx *E, int line) { return jexpr_fail(E, line, "out of memory"); }

static int undef_fail(jexpr_ctx *E, jv u, int line)
{
    if (u.u.undef->hint)
        return jexpr_fail(E, line, "%s", u.u.undef->hint);
    return jexpr_fail(E, line, "'%s' is undefined", u.u.undef->name);
}

static const struct {
    const char *name;
    int kind;
} BUILTINS[] = {{"namespace", JF_NAMESPACE}, {"range", JF_RANGE}, {"raise_exception", JF_RAISE},
                {"strftime_now", JF_STRFTIME}, {"dict", JF_DICT}};

static jv mk_func(jexpr_ctx *E, int kind, const char *name, jv self)
{
    jv_func *f = jv_alloc(E->a, sizeof *f);
    if (!f)
        return jv_undef_named(E->a, name, "out of memory");
    f->kind = kind;
    f->name = name;
    f->self = self;
    jv v = {.t = JV_FUNC, .u.fn = f};
    return v;
}

jv jexpr_lookup(jexpr_ctx *E, jscope *s, const char *name)
{
    jv v;
    for (; s; s = s->parent)
        if (jv_dict_get_str(s->vars, name, &v))
            return v;
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (!strcmp(BUILTINS[i].name, name))
            return mk_func(E, BUILTINS[i].kind, BUILTINS[i].name, jv_undef_named(E->a, "", NULL));
    return jv_undef_named(E->a, name, NULL);
}

static jv no_attr(jexpr_ctx *E, jv obj, const char *name)
{
    char *msg = jv_alloc(E->a, 200);
    if (msg)
        snprintf(msg, 200, "'%s object' has no attribute '%.100s'", jv_type_name(obj), name);
    return jv_undef_named(E->a, name, msg);
}

static jv method(jexpr_ctx *E, jv obj, const char *name, int kind)
{
    if (kind > 0)
        return mk_func(E, JF_METHOD, name, obj);
    char *msg = jv_alloc(E->a, 200);
    if (msg)
        snprintf(msg, 200, "access to attribute '%.80s' of '%s' object is unsafe.", name, jv_type_name(obj));
    return jv_undef_named(E->a, name, msg);
}

/* obj.name: the attribute (method) first, then the item. */
static int get_attr(jexpr_ctx *E, jv obj, const char *name, int line, jv *out)
{
    if (obj.t == JV_UNDEF)
        return undef_fail(E, obj, line);
    int kind = jmeth_kind(obj, name);
    if (kind)
        *out = method(E, obj, name, kind);
    else if (!(obj.t == JV_DICT && jv_dict_get_str(obj, name, out)))
        *out = no_attr(E, obj, name);
    return KV_OK;
}

static int index_of(jv key, size_t n, size_t *idx)
{
    if (key.t != JV_INT && key.t != JV_BOOL)
        return 0;
    int64_t i = key.t == JV_INT ? key.u.i : key.u.b;
    if (i < 0)
        i += (int64_t)n;
    if (i < 0 || (uint64_t)i >= n)
        return 0;
    *idx = (size_t)i;
    return 1;
}

/* obj[key]: the item first, then the attribute. */
static int get_item(jexpr_ctx *E, jv obj, jv key, int line, jv *out)
{
    size_t i;
    if (obj.t == JV_UNDEF)
        return undef_fail(E, obj, line);
    if (obj.t == JV_DICT && jv_dict_get(obj, key, out))
        return KV_OK;
    if (obj.t == JV_LIST && !obj.u.l->gen && index_of(key, obj.u.l->n, &i)) {
        *out = obj.u.l->v[i];
        return KV_OK;
    }
    if (obj.t == JV_STR && index_of(key, jv_utf8_len(obj.u.s->s, obj.u.s->n), &i)) {
        size_t off = jv_utf8_off(obj.u.s->s, obj.u.s->n, i), k;
        jv_utf8_dec((const unsigned char *)obj.u.s->s + off, obj.u.s->n - off, &k);
        *out = jv_strn(E->a, obj.u.s->s + off, k);
        return KV_OK;
    }
    if (key.t == JV_STR)
        return get_attr(E, obj, key.u.s->s, line, out);
    jv r = jv_repr(E->a, key);
    char *msg = jv_alloc(E->a, 200);
    if (msg)
        snprintf(msg, 200, "'%s object' has no element %.80s", jv_type_name(obj), r.t == JV_STR ? r.u.s->s : "?");
    *out = jv_undef_named(E->a, "", msg);
    return KV_OK;
}

/* Python's slice.indices(). */
static int slice_bounds(jexpr_ctx *E, const jv *sv, int64_t n, int64_t *start, int64_t *stop, int64_t *step, int line)
{
    for (int k = 0; k < 3; k++)
        if (sv[k].t != JV_NONE && sv[k].t != JV_INT && sv[k].t != JV_BOOL)
            return jexpr_fail(E, line, "slice indices must be integers or None");
    *step = sv[2].t == JV_NONE ? 1 : sv[2].t == JV_INT ? sv[2].u.i : sv[2].u.b;
    if (*step == 0)
        return jexpr_fail(E, line, "slice step cannot be zero");
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? n - 1 : n;
    for (int k = 0; k < 2; k++) {
        int64_t *dst = k ? stop : start;
        if (sv[k].t == JV_NONE) {
            *dst = (*step < 0) == (k == 0) ? hi : lo;
            continue;
        }
        int64_t v = sv[k].t == JV_INT ? sv[k].u.i : sv[k].u.b;
        if (v < 0) {
            v += n;
            if (v < lo)
                v = lo;
        } else if (v > hi) {
            v = hi;
        }
        *dst = v;
    }
    return KV_OK;
}

static int eval_slice(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv obj, sv[3] = {jv_none(), jv_none(), jv_none()};
    const jnode *parts[3] = {n->b, n->c, n->d};
    int rc = jexpr_eval(E, n->a, s, &obj);
    for (int k = 0; k < 3 && rc == KV_OK; k++)
        if (parts[k])
            rc = jexpr_eval(E, parts[k], s, &sv[k]);
    if (rc)
        return rc;
    if (obj.t == JV_UNDEF)
        return undef_fail(E, obj, n->line);
    if (obj.t != JV_LIST && obj.t != JV_STR)
        return jexpr_fail(E, n->line, "'%s' object is not subscriptable", jv_type_name(obj));
    int is_str = obj.t == JV_STR;
    int64_t len = is_str ? (int64_t)jv_utf8_len(obj.u.s->s, obj.u.s->n) : (int64_t)obj.u.l->n, a = 0, b = 0, st = 1;
    if ((rc = slice_bounds(E, sv, len, &a, &b, &st, n->line)))
        return rc;
    jv_buf buf;
    jv_buf_init(&buf, E->a, is_str ? obj.u.s->n + 1 : 0);
    jv l = is_str ? jv_none() : jv_list_new(E->a, 4);
    if (!is_str && l.t != JV_LIST)
        return oom(E, n->line);
    if (!is_str)
        l.u.l->tuple = obj.u.l->tuple;
    for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
        if (is_str) {
            size_t off = jv_utf8_off(obj.u.s->s, obj.u.s->n, (size_t)i), k;
            jv_utf8_dec((const unsigned char *)obj.u.s->s + off, obj.u.s->n - off, &k);
            jv_buf_add(&buf, obj.u.s->s + off, k);
        } else if (jv_list_push(E->a, l, obj.u.l->v[i])) {
            return oom(E, n->line);
        }
    }
    *out = is_str ? jv_buf_take(&buf) : l;
    return out->t == JV_UNDEF ? oom(E, n->line) : KV_OK;
}

/* Evaluates positional and keyword arguments of a call / filter / test. */
static int eval_args(jexpr_ctx *E, const jnode *n, jscope *s, jv_args *args)
{
    memset(args, 0, sizeof *args);
    jv *pos = n->n_items ? jv_alloc(E->a, n->n_items * sizeof *pos) : NULL;
    jv *kw = n->n_items2 ? jv_alloc(E->a, n->n_items2 * sizeof *kw) : NULL;
    if ((n->n_items && !pos) || (n->n_items2 && !kw))
        return oom(E, n->line);
    for (size_t i = 0; i < n->n_items; i++)
        if (jexpr_eval(E, n->items[i], s, &pos[i]))
            return KV_EINVAL;
    for (size_t i = 0; i < n->n_items2; i++)
        if (jexpr_eval(E, n->items2[i], s, &kw[i]))
            return KV_EINVAL;
    args->pos = pos;
    args->n_pos = n->n_items;
    args->kwn = n->names;
    args->kwv = kw;
    args->n_kw = n->n_items2;
    return KV_OK;
}

static int call_range(jexpr_ctx *E, const jv_args *args, int line, jv *out)
{
    int64_t v[3] = {0, 0, 1};
    if (args->n_pos < 1 || args->n_pos > 3)
        return jexpr_fail(E, line, "range expected 1 to 3 arguments, got %zu", args->n_pos);
    for (size_t i = 0; i < args->n_pos; i++) {
        if (args->pos[i].t != JV_INT && args->pos[i].t != JV_BOOL)
            return jexpr_fail(E, line, "'%s' object cannot be interpreted as an integer", jv_type_name(args->pos[i]));
        v[args->n_pos == 1 ? 1 : i] = args->pos[i].t == JV_INT ? args->pos[i].u.i : args->pos[i].u.b;
    }
    if (v[2] == 0)
        return jexpr_fail(E, line, "range() arg 3 must not be zero");
    double cnt = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
    if (cnt > JEXPR_MAX_RANGE)
        return jexpr_fail(E, line, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).",
                          JEXPR_MAX_RANGE);
    jv l = jv_list_new(E->a, cnt > 0 ? (size_t)cnt : 0);
    for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1]; i += v[2])
        if (jv_list_push(E->a, l, jv_int(i)))
            return oom(E, line);
    *out = l;
    return KV_OK;
}

static int call_builtin(jexpr_ctx *E, const jv_func *f, const jv_args *args, int line, jv *out)
{
    char emsg[KV_ERR_MSG_MAX];
    switch (f->kind) {
    case JF_METHOD:
        if (jmeth_call(E->a, f->self, f->name, args, out, emsg, sizeof emsg))
            return jexpr_fail(E, line, "%s", emsg);
        return KV_OK;
    case JF_RANGE: return call_range(E, args, line, out);
    case JF_RAISE: {
        jv m = args->n_pos ? jv_to_str(E->a, args->pos[0]) : jv_cstr(E->a, "");
        return kvant_err_set(E->err, KV_EINVAL, "chat template raised: %s", m.t == JV_STR ? m.u.s->s : "");
    }
    case JF_STRFTIME: {
        if (args->n_pos < 1 || args->pos[0].t != JV_STR)
            return jexpr_fail(E, line, "strftime_now() needs a format string");
        time_t t = (time_t)E->now;
        struct tm tm;
        char buf[512];
        localtime_r(&t, &tm);
        size_t k = strftime(buf, sizeof buf, args->pos[0].u.s->s, &tm);
        *out = jv_strn(E->a, buf, k);
        return KV_OK;
    }
    case JF_CYCLE: {
        if (!args->n_pos)
            return jexpr_fail(E, line, "no items for cycling given");
        *out = args->pos[(size_t)f->self.u.i % args->n_pos];
        return KV_OK;
    }
    default: break;
    }
    /* namespace(...) / dict(...): a positional mapping, then keywords */
    jv d = jv_dict_new(E->a, args->n_kw + 4);
    if (d.t != JV_DICT)
        return oom(E, line);
    d.u.d->ns = f->kind == JF_NAMESPACE;
    if (args->n_pos && args->pos[0].t == JV_DICT)
        for (size_t i = 0; i < args->pos[0].u.d->n; i++)
            jv_dict_set(E->a, d, args->pos[0].u.d->k[i], args->pos[0].u.d->v[i]);
    for (size_t i = 0; i < args->n_kw; i++)
        if (jv_dict_set_str(E->a, d, args->kwn[i], args->kwv[i]))
            return oom(E, line);
    *out = d;
    return KV_OK;
}

static int eval_call(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv fn;
    jv_args args;
    int rc = jexpr_eval(E, n->a, s, &fn);
    if (rc == KV_OK)
        rc = eval_args(E, n, s, &args);
    if (rc)
        return rc;
    if (fn.t == JV_UNDEF)
        return undef_fail(E, fn, n->line);
    if (fn.t != JV_FUNC)
        return jexpr_fail(E, n->line, "'%s' object is not callable", jv_type_name(fn));
    if (fn.u.fn->kind == JF_MACRO)
        return E->call_macro(E, fn.u.fn, &args, n->line, out);
    return call_builtin(E, fn.u.fn, &args, n->line, out);
}

int jexpr_filter_chain(jexpr_ctx *E, const jnode *n, jscope *s, jv input, jv *out)
{
    jv in = input;
    int rc = KV_OK;
    if (n->a && n->a->kind == JN_FILTER)
        rc = jexpr_filter_chain(E, n->a, s, input, &in);
    else if (n->a)
        rc = jexpr_eval(E, n->a, s, &in);
    if (rc)
        return rc;
    jv_args args;
    char emsg[KV_ERR_MSG_MAX];
    if (eval_args(E, n, s, &args))
        return KV_EINVAL;
    if (jfilt_filter(E->a, n->name, in, &args, out, emsg, sizeof emsg))
        return jexpr_fail(E, n->line, "%s", emsg);
    return KV_OK;
}

static int eval_test(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv in;
    jv_args args;
    char emsg[KV_ERR_MSG_MAX];
    int r = 0;
    if (jexpr_eval(E, n->a, s, &in) || eval_args(E, n, s, &args))
        return KV_EINVAL;
    if (jfilt_test(E->a, n->name, in, &args, &r, emsg, sizeof emsg))
        return jexpr_fail(E, n->line, "%s", emsg);
    *out = jv_bool(n->op ? !r : r);
    return KV_OK;
}

/* ---- operators ---- */

static int type_error(jexpr_ctx *E, int line, const char *op, jv x, jv y)
{
    return jexpr_fail(E, line, "unsupported operand type(s) for %s: '%s' and '%s'", op, jv_type_name(x),
                      jv_type_name(y));
}

static int64_t ival(jv v) { return v.t == JV_INT ? v.u.i : v.u.b; }

static int concat_seq(jexpr_ctx *E, jv x, jv y, int line, jv *out)
{
    if (x.t == JV_STR) {
        jv_buf b;
        jv_buf_init(&b, E->a, E->max_output);
        jv_buf_add(&b, x.u.s->s, x.u.s->n);
        jv_buf_add(&b, y.u.s->s, y.u.s->n);
        *out = jv_buf_take(&b);
        return out->t == JV_STR ? KV_OK : jexpr_fail(E, line, "string longer than %zu bytes", E->max_output);
    }
    jv l = jv_list_new(E->a, x.u.l->n + y.u.l->n);
    if (l.t != JV_LIST)
        return oom(E, line);
    l.u.l->tuple = x.u.l->tuple;
    for (size_t i = 0; i < x.u.l->n; i++)
        jv_list_push(E->a, l, x.u.l->v[i]);
    for (size_t i = 0; i < y.u.l->n; i++)
        jv_list_push(E->a, l, y.u.l->v[i]);
    *out = l;
    return KV_OK;
}

/* str * int, list * int */
static int repeat_seq(jexpr_ctx *E, jv seq, int64_t k, int line, jv *out)
{
    size_t unit = seq.t == JV_STR ? seq.u.s->n : seq.u.l->n * sizeof(jv);
    if (k > 0 && unit && (uint64_t)k > E->max_output / unit)
        return jexpr_fail(E, line, "repetition larger than %zu bytes", E->max_output);
    if (seq.t == JV_STR) {
        jv_buf b;
        jv_buf_init(&b, E->a, E->max_output);
        for (int64_t i = 0; i < k; i++)
            jv_buf_add(&b, seq.u.s->s, seq.u.s->n);
        *out = jv_buf_take(&b);
        return out->t == JV_STR ? KV_OK : oom(E, line);
    }
    jv l = jv_list_new(E->a, 4);
    if (l.t != JV_LIST)
        return oom(E, line);
    l.u.l->tuple = seq.u.l->tuple;
    for (int64_t i = 0; i < k; i++)
        for (size_t j = 0; j < seq.u.l->n; j++)
            if (jv_list_push(E->a, l, seq.u.l->v[j]))
                return oom(E, line);
    *out = l;
    return KV_OK;
}

static int int_arith(jexpr_ctx *E, int op, int64_t a, int64_t b, int line, jv *out)
{
    int64_t r = 0;
    int ovf = 0;
    switch (op) {
    case JOP_ADD: ovf = __builtin_add_overflow(a, b, &r); break;
    case JOP_SUB: ovf = __builtin_sub_overflow(a, b, &r); break;
    case JOP_MUL: ovf = __builtin_mul_overflow(a, b, &r); break;
    case JOP_FLOORDIV:
    case JOP_MOD:
        if (b == 0)
            return jexpr_fail(E, line, "integer division or modulo by zero");
        if (a == INT64_MIN && b == -1)
            return jexpr_fail(E, line, "integer overflow");
        r = op == JOP_FLOORDIV ? a / b - ((a % b != 0) && ((a < 0) != (b < 0))) : ((a % b) + b) % b;
        if (op == JOP_MOD && b < 0 && a % b == 0)
            r = 0;
        break;
    case JOP_POW:
        if (b < 0) {
            *out = jv_float(pow((double)a, (double)b));
            return KV_OK;
        }
        r = 1;
        for (int64_t i = 0; i < b && !ovf; i++)
            ovf = __builtin_mul_overflow(r, a, &r);
        break;
    default: return jexpr_fail(E, line, "bad integer operator");
    }
    if (ovf)
        return jexpr_fail(E, line, "integer overflow (kvant's integers are 64-bit)");
    *out = jv_int(r);
    return KV_OK;
}

static int float_arith(jexpr_ctx *E, int op, double a, double b, int line, jv *out)
{
    double r;
    if ((op == JOP_DIV || op == JOP_FLOORDIV || op == JOP_MOD) && b == 0.0)
        return jexpr_fail(E, line, "float division by zero");
    switch (op) {
    case JOP_ADD: r = a + b; break;
    case JOP_SUB: r = a - b; break;
    case JOP_MUL: r = a * b; break;
    case JOP_DIV: r = a / b; break;
    case JOP_FLOORDIV: r = floor(a / b); break;
    case JOP_MOD:
        r = fmod(a, b);
        if (r != 0.0 && ((r < 0) != (b < 0)))
            r += b;
        break;
    default: r = pow(a, b); break;
    }
    *out = jv_float(r);
    return KV_OK;
}

static int arith(jexpr_ctx *E, int op, jv x, jv y, int line, jv *out)
{
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    if (x.t == JV_UNDEF)
        return undef_fail(E, x, line);
    if (y.t == JV_UNDEF)
        return undef_fail(E, y, line);
    if (jv_is_num(x) && jv_is_num(y)) {
        if (x.t != JV_FLOAT && y.t != JV_FLOAT && op != JOP_DIV)
            return int_arith(E, op, ival(x), ival(y), line, out);
        return float_arith(E, op, jv_num(x), jv_num(y), line, out);
    }
    if (op == JOP_ADD && x.t == JV_STR && y.t == JV_STR && (x.u.s->safe || y.u.s->safe)) {
        /* Markup + str escapes the str, and the result is Markup */
        if (concat_seq(E, jv_html_escape(E->a, x), jv_html_escape(E->a, y), line, out))
            return KV_EINVAL;
        ((jv_str *)out->u.s)->safe = 1;
        return KV_OK;
    }
    if (op == JOP_ADD && x.t == y.t && (x.t == JV_STR || (x.t == JV_LIST && x.u.l->tuple == y.u.l->tuple)))
        return concat_seq(E, x, y, line, out);
    if (op == JOP_MUL && (x.t == JV_STR || x.t == JV_LIST) && (y.t == JV_INT || y.t == JV_BOOL))
        return repeat_seq(E, x, ival(y), line, out);
    if (op == JOP_MUL && (y.t == JV_STR || y.t == JV_LIST) && (x.t == JV_INT || x.t == JV_BOOL))
        return repeat_seq(E, y, ival(x), line, out);
    if (op == JOP_MOD && x.t == JV_STR)
        return jexpr_fail(E, line, "printf-style string formatting ('...' %% x) is not supported by kvant");
    if (op == JOP_ADD && x.t == JV_STR)
        return jexpr_fail(E, line, "can only concatenate str (not \"%s\") to str", jv_type_name(y));
    return type_error(E, line, names[op], x, y);
}

static int contains(jexpr_ctx *E, jv x, jv y, int line, int *r)
{
    jv tmp;
    switch (y.t) {
    case JV_STR:
        if (x.t != JV_STR)
            return jexpr_fail(E, line, "'in <string>' requires string as left operand, not %s", jv_type_name(x));
        *r = x.u.s->n == 0 || memmem(y.u.s->s, y.u.s->n, x.u.s->s, x.u.s->n) != NULL;
        return KV_OK;
    case JV_LIST:
        *r = 0;
        for (size_t i = 0; i < y.u.l->n && !*r; i++)
            *r = jv_eq(y.u.l->v[i], x);
        return KV_OK;
    case JV_DICT: *r = jv_dict_get(y, x, &tmp); return KV_OK;
    case JV_UNDEF: *r = 0; return KV_OK;
    default: return jexpr_fail(E, line, "argument of type '%s' is not iterable", jv_type_name(y));
    }
}

static int compare(jexpr_ctx *E, int op, jv x, jv y, int line, jv *out)
{
    static const char *const names[] = {"<", "<=", ">", ">="};
    int c = 0, r = 0;
    if (op == JOP_EQ || op == JOP_NE) {
        *out = jv_bool(jv_eq(x, y) == (op == JOP_EQ));
        return KV_OK;
    }
    if (op == JOP_IN || op == JOP_NOTIN) {
        if (contains(E, x, y, line, &r))
            return KV_EINVAL;
        *out = jv_bool(op == JOP_IN ? r : !r);
        return KV_OK;
    }
    if (x.t == JV_UNDEF)
        return undef_fail(E, x, line);
    if (y.t == JV_UNDEF)
        return undef_fail(E, y, line);
    if (jv_cmp(x, y, &c))
        return jexpr_fail(E, line, "'%s' not supported between instances of '%s' and '%s'", names[op - JOP_LT],
                          jv_type_name(x), jv_type_name(y));
    r = c == 2 ? 0 : op == JOP_LT ? c < 0 : op == JOP_LE ? c <= 0 : op == JOP_GT ? c > 0 : c >= 0;
    *out = jv_bool(r);
    return KV_OK;
}

static int eval_binop(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv x, y;
    if (jexpr_eval(E, n->a, s, &x))
        return KV_EINVAL;
    if (n->op == JOP_AND || n->op == JOP_OR) {
        if (jv_truthy(x) == (n->op == JOP_OR)) {
            *out = x;
            return KV_OK;
        }
        return jexpr_eval(E, n->b, s, out);
    }
    if (jexpr_eval(E, n->b, s, &y))
        return KV_EINVAL;
    if (n->op == JOP_CONCAT) {
        jv a = jv_to_str(E->a, x), b = jv_to_str(E->a, y);
        if (a.t != JV_STR || b.t != JV_STR)
            return oom(E, n->line);
        return concat_seq(E, a, b, n->line, out);
    }
    if (n->op >= JOP_EQ && n->op <= JOP_NOTIN)
        return compare(E, n->op, x, y, n->line, out);
    return arith(E, n->op, x, y, n->line, out);
}

static int eval_unary(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv x;
    if (jexpr_eval(E, n->a, s, &x))
        return KV_EINVAL;
    if (n->op == JOP_NOT) {
        *out = jv_bool(!jv_truthy(x));
        return KV_OK;
    }
    if (x.t == JV_UNDEF)
        return undef_fail(E, x, n->line);
    if (!jv_is_num(x))
        return jexpr_fail(E, n->line, "bad operand type for unary %s: '%s'", n->op == JOP_NEG ? "-" : "+",
                          jv_type_name(x));
    if (n->op == JOP_POS)
        *out = x.t == JV_BOOL ? jv_int(x.u.b) : x;
    else if (x.t == JV_FLOAT)
        *out = jv_float(-x.u.f);
    else if (ival(x) == INT64_MIN)
        return jexpr_fail(E, n->line, "integer overflow");
    else
        *out = jv_int(-ival(x));
    return KV_OK;
}

int jexpr_iterable(jexpr_ctx *E, jv v, int line, jv *out)
{
    if (v.t == JV_LIST) {
        *out = v;
        return KV_OK;
    }
    jv l = jv_list_new(E->a, 4);
    if (l.t != JV_LIST)
        return oom(E, line);
    if (v.t == JV_DICT && !v.u.d->ns) {
        for (size_t i = 0; i < v.u.d->n; i++)
            if (jv_list_push(E->a, l, v.u.d->k[i]))
                return oom(E, line);
    } else if (v.t == JV_STR) {
        size_t k;
        for (size_t i = 0; i < v.u.s->n; i += k) {
            jv_utf8_dec((const unsigned char *)v.u.s->s + i, v.u.s->n - i, &k);
            if (jv_list_push(E->a, l, jv_strn(E->a, v.u.s->s + i, k)))
                return oom(E, line);
        }
    } else if (v.t == JV_UNDEF) {
        if (v.u.undef->hint)
            return undef_fail(E, v, line);
    } else {
        return jexpr_fail(E, line, "'%s' object is not iterable", jv_type_name(v));
    }
    *out = l;
    return KV_OK;
}

static int eval_container(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    if (n->kind == JN_DICT) {
        jv d = jv_dict_new(E->a, n->n_items);
        for (size_t i = 0; i < n->n_items; i++) {
            jv k, v;
            if (jexpr_eval(E, n->items[i], s, &k) || jexpr_eval(E, n->items2[i], s, &v))
                return KV_EINVAL;
            if (jv_dict_set(E->a, d, k, v))
                return oom(E, n->line);
        }
        *out = d;
        return KV_OK;
    }
    jv l = jv_list_new(E->a, n->n_items);
    if (l.t != JV_LIST)
        return oom(E, n->line);
    l.u.l->tuple = n->kind == JN_TUPLE;
    for (size_t i = 0; i < n->n_items; i++) {
        jv v;
        if (jexpr_eval(E, n->items[i], s, &v))
            return KV_EINVAL;
        if (jv_list_push(E->a, l, v))
            return oom(E, n->line);
    }
    *out = l;
    return KV_OK;
}

static int eval_node(jexpr_ctx *E, const jnode *n, jscope *s, jv *out);

int jexpr_eval(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    if (E->nest >= JEXPR_MAX_NEST)
        return jexpr_fail(E, n->line, "template nested deeper than %d levels at run time", JEXPR_MAX_NEST);
    E->nest++;
    int rc = eval_node(E, n, s, out);
    E->nest--;
    return rc;
}

static int eval_node(jexpr_ctx *E, const jnode *n, jscope *s, jv *out)
{
    jv x, y;
    int rc;
    switch (n->kind) {
    case JN_CONST: *out = n->val; return KV_OK;
    case JN_NAME: *out = jexpr_lookup(E, s, n->name); return KV_OK;
    case JN_ATTR:
        if ((rc = jexpr_eval(E, n->a, s, &x)))
            return rc;
        return get_attr(E, x, n->name, n->line, out);
    case JN_ITEM:
        if ((rc = jexpr_eval(E, n->a, s, &x)) || (rc = jexpr_eval(E, n->b, s, &y)))
            return rc;
        return get_item(E, x, y, n->line, out);
    case JN_SLICE: return eval_slice(E, n, s, out);
    case JN_CALL: return eval_call(E, n, s, out);
    case JN_FILTER: return jexpr_filter_chain(E, n, s, E->filter_input, out);
    case JN_TEST: return eval_test(E, n, s, out);
    case JN_BINOP: return eval_binop(E, n, s, out);
    case JN_UNARY: return eval_unary(E, n, s, out);
    case JN_COND:
        if ((rc = jexpr_eval(E, n->a, s, &x)))
            return rc;
        if (jv_truthy(x))
            return jexpr_eval(E, n->b, s, out);
        if (n->c)
            return jexpr_eval(E, n->c, s, out);
        *out = jv_undef_named(E->a, "", NULL);
        return KV_OK;
    case JN_LIST:
    case JN_TUPLE:
    case JN_DICT: return eval_container(E, n, s, out);
    default: return jexpr_fail(E, n->line, "node kind %d is not an expression", (int)n->kind);
    }
}
