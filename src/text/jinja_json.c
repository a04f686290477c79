/* jinja_json.c - json.dumps for Jinja values, and jansson -> jv. */
#include "text/jinja_json.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define JJSON_MAX_DEPTH 256

typedef struct dumper {
    jv_buf b;
    const jjson_opts *o;
    const char *isep, *ksep;
    char *emsg;
    size_t cap;
} dumper;

/* \uXXXX for the code point at s[*i] (ensure_ascii). */
static void ascii_escape(jv_buf *b, const char *s, size_t n, size_t *i)
{
    size_t k;
    uint32_t cp = jv_utf8_dec((const unsigned char *)s + *i, n - *i, &k);
    char u[16];
    if (cp >= 0x10000) {
        cp -= 0x10000;
        snprintf(u, sizeof u, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
    } else {
        snprintf(u, sizeof u, "\\u%04x", cp);
    }
    jv_buf_cstr(b, u);
    *i += k - 1;
}

static void dump_str(jv_buf *b, const char *s, size_t n, int ensure_ascii)
{
    jv_buf_add(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (ensure_ascii && c >= 0x80) {
            jv_buf_add(b, s + i - run, run);
            run = 0;
            ascii_escape(b, s, n, &i);
            continue;
        }
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        char u[8];
        if (!esc && c < 0x20) {
            snprintf(u, sizeof u, "\\u%04x", c);
            esc = u;
        }
        if (esc) {
            jv_buf_add(b, s + i - run, run);
            run = 0;
            jv_buf_cstr(b, esc);
        } else {
            run++;
        }
    }
    jv_buf_add(b, s + n - run, run);
    jv_buf_add(b, "\"", 1);
}

static void newline(dumper *d, int level)
{
    if (d->o->indent < 0)
        return;
    jv_buf_add(&d->b, "\n", 1);
    for (int i = 0; i < level * d->o->indent; i++)
        jv_buf_add(&d->b, " ", 1);
}

static int dump_key(dumper *d, jv k)
{
    char num[64];
    switch (k.t) {
    case JV_STR: dump_str(&d->b, k.u.s->s, k.u.s->n, d->o->ensure_ascii); return 0;
    case JV_INT: snprintf(num, sizeof num, "\"%lld\"", (long long)k.u.i); break;
    case JV_BOOL: snprintf(num, sizeof num, "\"%s\"", k.u.b ? "true" : "false"); break;
    case JV_NONE: snprintf(num, sizeof num, "\"null\""); break;
    case JV_FLOAT:
        num[0] = '"';
        jv_float_repr(k.u.f, num + 1, sizeof num - 2);
        strcat(num, "\"");
        break;
    default:
        snprintf(d->emsg, d->cap, "keys must be str, int, float, bool or None, not %s", jv_type_name(k));
        return -1;
    }
    jv_buf_cstr(&d->b, num);
    return 0;
}

static int dump(dumper *d, jv v, int level);

static int dump_dict(dumper *d, jv v, int level)
{
    const jv_dict *m = v.u.d;
    if (!m->n) {
        jv_buf_cstr(&d->b, "{}");
        return 0;
    }
    size_t *order = jv_alloc(d->b.a, m->n * sizeof *order);
    if (!order) {
        snprintf(d->emsg, d->cap, "out of memory in tojson");
        return -1;
    }
    for (size_t i = 0; i < m->n; i++)
        order[i] = i;
    if (d->o->sort_keys) {
        for (size_t i = 1; i < m->n; i++) { /* stable insertion sort */
            size_t x = order[i], j = i;
            int c = 0;
            while (j > 0) {
                if (jv_cmp(m->k[x], m->k[order[j - 1]], &c)) {
                    snprintf(d->emsg, d->cap, "'<' not supported between instances of '%s' and '%s'",
                             jv_type_name(m->k[x]), jv_type_name(m->k[order[j - 1]]));
                    return -1;
                }
                if (c >= 0)
                    break;
                order[j] = order[j - 1];
                j--;
            }
            order[j] = x;
        }
    }
    jv_buf_cstr(&d->b, "{");
    for (size_t i = 0; i < m->n; i++) {
        if (i)
            jv_buf_cstr(&d->b, d->isep);
        newline(d, level + 1);
        if (dump_key(d, m->k[order[i]]))
            return -1;
        jv_buf_cstr(&d->b, d->ksep);
        if (dump(d, m->v[order[i]], level + 1))
            return -1;
    }
    newline(d, level);
    jv_buf_cstr(&d->b, "}");
    return 0;
}

static int dump(dumper *d, jv v, int level)
{
    char num[64];
    if (level > JJSON_MAX_DEPTH) {
        snprintf(d->emsg, d->cap, "maximum recursion depth exceeded while encoding a JSON object");
        return -1;
    }
    switch (v.t) {
    case JV_NONE: jv_buf_cstr(&d->b, "null"); return 0;
    case JV_BOOL: jv_buf_cstr(&d->b, v.u.b ? "true" : "false"); return 0;
    case JV_INT:
        snprintf(num, sizeof num, "%lld", (long long)v.u.i);
        jv_buf_cstr(&d->b, num);
        return 0;
    case JV_FLOAT:
        if (isnan(v.u.f))
            snprintf(num, sizeof num, "NaN");
        else if (isinf(v.u.f))
            snprintf(num, sizeof num, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            jv_float_repr(v.u.f, num, sizeof num);
        jv_buf_cstr(&d->b, num);
        return 0;
    case JV_STR: dump_str(&d->b, v.u.s->s, v.u.s->n, d->o->ensure_ascii); return 0;
    case JV_LIST:
        if (v.u.l->gen)
            break;
        if (!v.u.l->n) {
            jv_buf_cstr(&d->b, "[]");
            return 0;
        }
        jv_buf_cstr(&d->b, "[");
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i)
                jv_buf_cstr(&d->b, d->isep);
            newline(d, level + 1);
            if (dump(d, v.u.l->v[i], level + 1))
                return -1;
        }
        newline(d, level);
        jv_buf_cstr(&d->b, "]");
        return 0;
    case JV_DICT:
        if (!v.u.d->ns)
            return dump_dict(d, v, level);
        break;
    default: break;
    }
    snprintf(d->emsg, d->cap, "Object of type %s is not JSON serializable", jv_type_name(v));
    return -1;
}

int jjson_dumps(jv_arena *a, jv v, const jjson_opts *o, jv *out, char *emsg, size_t cap)
{
    dumper d = {.o = o, .emsg = emsg, .cap = cap};
    d.isep = o->item_sep ? o->item_sep : o->indent >= 0 ? "," : ", ";
    d.ksep = o->key_sep ? o->key_sep : ": ";
    jv_buf_init(&d.b, a, (size_t)1 << 28);
    if (dump(&d, v, 0))
        return -1;
    *out = jv_buf_take(&d.b);
    if (out->t != JV_STR) {
        snprintf(emsg, cap, "out of memory in tojson");
        return -1;
    }
    return 0;
}

static jv from(jv_arena *a, const json_t *j, int depth)
{
    if (!j || depth > JJSON_MAX_DEPTH)
        return jv_undef_named(a, "", "JSON nested too deep");
    switch (json_typeof(j)) {
    case JSON_NULL: return jv_none();
    case JSON_TRUE: return jv_bool(1);
    case JSON_FALSE: return jv_bool(0);
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_STRING: return jv_strn(a, json_string_value(j), json_string_length(j));
    case JSON_ARRAY: {
        jv l = jv_list_new(a, json_array_size(j));
        for (size_t i = 0; l.t == JV_LIST && i < json_array_size(j); i++)
            if (jv_list_push(a, l, from(a, json_array_get(j, i), depth + 1)))
                return jv_undef_named(a, "", "out of memory");
        return l;
    }
    case JSON_OBJECT: {
        jv m = jv_dict_new(a, json_object_size(j));
        const char *k;
        const json_t *val;
        json_object_foreach((json_t *)j, k, val)
        {
            if (m.t != JV_DICT || jv_dict_set_str(a, m, k, from(a, val, depth + 1)))
                return jv_undef_named(a, "", "out of memory");
        }
        return m;
    }
    }
    return jv_undef_named(a, "", "bad JSON value");
}

jv jjson_from(jv_arena *a, const json_t *j) { return from(a, j, 0); }
