/* jschema.c - JSON Schema -> gram (jschema.h).
 *
 * Each schema node compiles to one element; `ptr` is its JSON pointer for
 * messages.  $ref targets are compiled once into a nonterminal keyed by
 * the pointer (so recursive schemas terminate).  The shared pieces (any
 * JSON value, a string character, numbers) are built once per compile.
 */
#include "grammar/jschema.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gnames.h"
#include "grammar/regex.h"

#define JS_MAX_DEPTH 100
#define JS_PTR_MAX 400
#define JS_MAX_DIGITS 16 /* an unbounded number's integral part, fraction and exponent */

typedef struct js {
    gram *g;
    json_t *root;
    gnames *refs;       /* pointer -> nonterminal */
    int32_t value, object, str_char, string, integer, number;   /* built lazily */
    int depth;
    kvant_err err;
    int failed;
} js;

static int32_t js_fail(js *c, const char *ptr, const char *fmt, const char *arg)
{
    if (!c->failed) {
        char m[300];
        snprintf(m, sizeof m, fmt, arg ? arg : "");
        kvant_err_set(&c->err, KV_EUNSUP, "json schema: %s: %s", *ptr ? ptr : "/", m);
        c->failed = 1;
    }
    return GRAM_BAD;
}

static void child_ptr(char *out, const char *ptr, const char *key)
{
    size_t n = strlen(ptr);
    snprintf(out, JS_PTR_MAX, "%s/", ptr);
    n++;
    for (const char *k = key; *k && n + 3 < JS_PTR_MAX; k++) {
        if (*k == '~' || *k == '/') {
            out[n++] = '~';
            out[n++] = *k == '~' ? '0' : '1';
        } else {
            out[n++] = *k;
        }
    }
    out[n] = 0;
}

static int32_t lit(js *c, const char *s)
{
    return gram_bytes(c->g, s, strlen(s));
}

static int32_t seq2(js *c, int32_t a, int32_t b)
{
    return gram_seq(c->g, (int32_t[]){a, b}, 2);
}

static int32_t seq3(js *c, int32_t a, int32_t b, int32_t d)
{
    return gram_seq(c->g, (int32_t[]){a, b, d}, 3);
}

static int32_t ascii_class(js *c, const char *chars)
{
    uint32_t s[8] = {0};
    for (const unsigned char *p = (const unsigned char *)chars; *p; p++)
        s[*p >> 5] |= 1u << (*p & 31);
    return gram_class(c->g, s);
}

static int32_t digit_range(js *c, char lo, char hi)
{
    uint32_t s[8] = {0};
    for (int b = lo; b <= hi; b++)
        s[b >> 5] |= 1u << (b & 31);
    return gram_class(c->g, s);
}

/* One character of a JSON string: unescaped, or an escape sequence.
 * Unescaped: any code point but '"', '\\', controls below U+0020 and
 * U+007F (RFC 8259 admits DEL raw; llguidance does not, nor do we). */
static int32_t str_char(js *c)
{
    if (c->str_char != GRAM_BAD)
        return c->str_char;
    uint32_t r[8] = {0x20, 0x21, 0x23, 0x5B, 0x5D, 0x7E, 0x80, GRAM_MAX_CP};
    int32_t plain = gram_cpset(c->g, r, 4, 0);
    int32_t hex = ascii_class(c, "0123456789abcdefABCDEF");
    int32_t u = gram_seq(c->g, (int32_t[]){lit(c, "u"), hex, hex, hex, hex}, 5);
    int32_t esc = seq2(c, lit(c, "\\"), gram_alt(c->g, (int32_t[]){ascii_class(c, "\"\\/bfnrt"), u}, 2));
    return c->str_char = gram_alt(c->g, (int32_t[]){plain, esc}, 2);
}

static int32_t any_string(js *c)
{
    if (c->string == GRAM_BAD) {
        int32_t q = lit(c, "\"");
        c->string = seq3(c, q, gram_star(c->g, str_char(c)), q);
    }
    return c->string;
}

/* -?(0|[1-9][0-9]{0,15}): at most JS_MAX_DIGITS digits */
static int32_t any_integer(js *c, int allow_minus)
{
    int32_t nat = gram_alt(c->g, (int32_t[]){lit(c, "0"),
                                             seq2(c, digit_range(c, '1', '9'),
                                                  gram_repeat(c->g, digit_range(c, '0', '9'), 0,
                                                              JS_MAX_DIGITS - 1))}, 2);
    return allow_minus ? seq2(c, gram_opt(c->g, lit(c, "-")), nat) : nat;
}

static int32_t any_number(js *c, int allow_minus)
{
    int32_t d = digit_range(c, '0', '9');
    int32_t frac = gram_opt(c->g, seq2(c, lit(c, "."), gram_repeat(c->g, d, 1, JS_MAX_DIGITS)));
    int32_t exp = gram_opt(c->g, seq3(c, ascii_class(c, "eE"), gram_opt(c->g, ascii_class(c, "+-")),
                                      gram_repeat(c->g, d, 1, JS_MAX_DIGITS)));
    return seq3(c, any_integer(c, allow_minus), frac, exp);
}

/* list ::= item ("," item)*, wrapped in open .. close, possibly empty. */
static int32_t any_list(js *c, const char *open, int32_t item, const char *close)
{
    int32_t more = gram_star(c->g, seq2(c, lit(c, ","), item));
    return seq3(c, lit(c, open), gram_opt(c->g, seq2(c, item, more)), lit(c, close));
}

/* Any JSON value; c->object is any JSON object. */
static int32_t any_value(js *c)
{
    if (c->value != GRAM_BAD)
        return c->value;
    c->value = gram_nt(c->g);
    int32_t member = seq3(c, any_string(c), lit(c, ":"), c->value);
    c->object = any_list(c, "{", member, "}");
    int32_t arr = any_list(c, "[", c->value, "]");
    if (c->number == GRAM_BAD)
        c->number = any_number(c, 1);
    int32_t alts[7] = {c->object, arr, any_string(c), c->number, lit(c, "true"), lit(c, "false"),
                       lit(c, "null")};
    for (int i = 0; i < 7; i++)
        gram_rule(c->g, c->value, &alts[i], 1);
    return c->value;
}

static int32_t js_schema(js *c, json_t *s, const char *ptr);

/* ---- integers in a range ------------------------------------------------- */

/* Decimal strings of equal length from lo to hi (digit strings). */
static int32_t digits_range(js *c, const char *lo, const char *hi, int n)
{
    if (n == 0)
        return gram_eps(c->g);
    if (lo[0] == hi[0])
        return seq2(c, digit_range(c, lo[0], lo[0]), digits_range(c, lo + 1, hi + 1, n - 1));
    int rest_min = 1, rest_max = 1;
    for (int i = 1; i < n; i++) {
        rest_min &= lo[i] == '0';
        rest_max &= hi[i] == '9';
    }
    char nines[24], zeros[24];
    memset(nines, '9', sizeof nines);
    memset(zeros, '0', sizeof zeros);
    int32_t alts[3], na = 0;
    char a = lo[0], b = hi[0];
    if (!rest_min) {
        alts[na++] = seq2(c, digit_range(c, a, a), digits_range(c, lo + 1, nines, n - 1));
        a++;
    }
    if (!rest_max) {
        alts[na++] = seq2(c, digit_range(c, b, b), digits_range(c, zeros, hi + 1, n - 1));
        b--;
    }
    if (a <= b)
        alts[na++] = seq2(c, digit_range(c, a, b),
                          gram_repeat(c->g, digit_range(c, '0', '9'), n - 1, n - 1));
    return gram_alt(c->g, alts, na);
}

/* Natural numbers lo..hi without leading zeros; hi < 0: unbounded. */
static int32_t nat_range(js *c, long long lo, long long hi)
{
    char a[24], b[24];
    int la = snprintf(a, sizeof a, "%lld", lo);
    int32_t alts[24], na = 0;
    int lb = hi < 0 ? la : snprintf(b, sizeof b, "%lld", hi);
    for (int len = la; len <= lb; len++) {
        char from[24], to[24];
        if (len == la)
            memcpy(from, a, (size_t)la + 1);
        else
            snprintf(from, sizeof from, "1%0*d", len - 1, 0);
        if (hi >= 0 && len == lb)
            memcpy(to, b, (size_t)lb + 1);
        else
            memset(to, '9', (size_t)len);
        alts[na++] = digits_range(c, from, to, len);
    }
    if (hi < 0)   /* every longer number, up to JS_MAX_DIGITS digits */
        alts[na++] = seq2(c, digit_range(c, '1', '9'),
                          gram_repeat(c->g, digit_range(c, '0', '9'), la,
                                      la > JS_MAX_DIGITS - 1 ? la : JS_MAX_DIGITS - 1));
    return gram_alt(c->g, alts, na);
}

/* Integers in [lo, hi]; has_lo / has_hi say which bounds exist. */
static int32_t int_range(js *c, int has_lo, long long lo, int has_hi, long long hi)
{
    if (has_lo && has_hi && lo > hi)
        return gram_class(c->g, (uint32_t[8]){0});   /* empty: pruned */
    int32_t alts[2], na = 0;
    if (!has_hi || hi >= 0)   /* the non-negative part */
        alts[na++] = nat_range(c, has_lo && lo > 0 ? lo : 0, has_hi ? hi : -1);
    if (!has_lo || lo < 0)    /* "-" n, n in [-hi, -lo]; "-0" where 0 is in range, as JSON has it */
        alts[na++] = seq2(c, lit(c, "-"), nat_range(c, has_hi && hi < 0 ? -hi : 0, has_lo ? -lo : -1));
    return gram_alt(c->g, alts, na);
}

static int get_bound(js *c, json_t *s, const char *key, int excl, int is_upper, int *has,
                     long long *v, const char *ptr)
{
    json_t *b = json_object_get(s, key);
    if (!b)
        return 0;
    char p[JS_PTR_MAX];
    child_ptr(p, ptr, key);
    if (json_is_boolean(b))
        return js_fail(c, p, "boolean exclusive bounds (draft 4) are unsupported", NULL);
    if (!json_is_number(b))
        return js_fail(c, p, "not a number", NULL);
    double d = json_number_value(b);
    if (d > 9e15 || d < -9e15)
        return js_fail(c, p, "bound out of range", NULL);
    long long x = is_upper ? (long long)__builtin_floor(d) : (long long)__builtin_ceil(d);
    if (excl && (double)x == d)
        x += is_upper ? -1 : 1;
    if (*has)
        x = is_upper ? (x < *v ? x : *v) : (x > *v ? x : *v);
    *has = 1;
    *v = x;
    return 0;
}

static int32_t js_integer(js *c, json_t *s, const char *ptr)
{
    int has_lo = 0, has_hi = 0;
    long long lo = 0, hi = 0;
    if (get_bound(c, s, "minimum", 0, 0, &has_lo, &lo, ptr) ||
        get_bound(c, s, "exclusiveMinimum", 1, 0, &has_lo, &lo, ptr) ||
        get_bound(c, s, "maximum", 0, 1, &has_hi, &hi, ptr) ||
        get_bound(c, s, "exclusiveMaximum", 1, 1, &has_hi, &hi, ptr))
        return GRAM_BAD;
    if (!has_lo && !has_hi) {
        if (c->integer == GRAM_BAD)
            c->integer = any_integer(c, 1);
        return c->integer;
    }
    return int_range(c, has_lo, lo, has_hi, hi);
}

static int32_t js_number(js *c, json_t *s, const char *ptr)
{
    static const char *const bad[] = {"maximum", "exclusiveMinimum", "exclusiveMaximum"};
    for (int i = 0; i < 3; i++)
        if (json_object_get(s, bad[i])) {
            char p[JS_PTR_MAX];
            child_ptr(p, ptr, bad[i]);
            return js_fail(c, p, "bounds on non-integer numbers are unsupported (only minimum: 0)",
                           NULL);
        }
    json_t *mn = json_object_get(s, "minimum");
    if (mn && !(json_is_number(mn) && json_number_value(mn) == 0)) {
        char p[JS_PTR_MAX];
        child_ptr(p, ptr, "minimum");
        return js_fail(c, p, "bounds on non-integer numbers are unsupported (only minimum: 0)", NULL);
    }
    return any_number(c, !mn);
}

/* ---- strings ------------------------------------------------------------- */

static const struct {
    const char *name, *re;
} js_formats[] = {
    {"date", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"},
    {"time", "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"date-time", "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])T([01][0-9]|2[0-3]):[0-5][0-9]:"
                  "[0-5][0-9](\\.[0-9]{1,9})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
};

/* JSON Schema's pattern matches anywhere in the string unless anchored
 * (a leading ^, a trailing $).  The regex's anchors are cut off here; the
 * unanchored sides become  T ::= T ch | P core,  P ::= ch*  - left
 * recursion with one origin, so the text after the first match costs one
 * item per byte however many matches end earlier. */
static int32_t pattern_body(js *c, const char *re, const char *ptr, kvant_err *e)
{
    size_t n = strlen(re), bs = 0;
    int lead = n && re[0] == '^';
    while (n >= 2 + bs && re[n - 2 - bs] == '\\')
        bs++;
    int trail = n > (size_t)lead && re[n - 1] == '$' && bs % 2 == 0;
    size_t len = n - (size_t)lead - (size_t)trail;
    char *inner = malloc(len + 8);
    if (!inner)
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    snprintf(inner, len + 8, "(?:%.*s)", (int)len, re + lead);
    int32_t core = rx_build(c->g, inner, strlen(inner), 1, ptr, e);
    free(inner);
    if (core == GRAM_BAD)
        return GRAM_BAD;
    if (!lead)
        core = seq2(c, gram_star(c->g, str_char(c)), core);
    if (trail)
        return core;
    int32_t t = gram_nt(c->g), ext[2] = {t, str_char(c)};
    gram_rule(c->g, t, &core, 1);
    gram_rule(c->g, t, ext, 2);
    return t;
}

static int32_t js_string(js *c, json_t *s, const char *ptr)
{
    json_t *pat = json_object_get(s, "pattern"), *fmt = json_object_get(s, "format");
    json_t *mn = json_object_get(s, "minLength"), *mx = json_object_get(s, "maxLength");
    char p[JS_PTR_MAX];
    const char *re = NULL;
    if (pat && !json_is_string(pat))
        return child_ptr(p, ptr, "pattern"), js_fail(c, p, "not a string", NULL);
    if (pat)
        re = json_string_value(pat), child_ptr(p, ptr, "pattern");
    if (fmt && !pat) {
        child_ptr(p, ptr, "format");
        for (size_t i = 0; i < sizeof js_formats / sizeof js_formats[0] && !re; i++)
            if (json_is_string(fmt) && !strcmp(json_string_value(fmt), js_formats[i].name))
                re = js_formats[i].re;
        if (!re)
            return js_fail(c, p, "unsupported format '%s'", json_is_string(fmt) ? json_string_value(fmt) : "?");
    }
    int32_t q = lit(c, "\"");
    if (re) {
        if (mn || mx)
            return child_ptr(p, ptr, mn ? "minLength" : "maxLength"),
                   js_fail(c, p, "length bounds together with a pattern or format are unsupported", NULL);
        kvant_err e = {0};
        int32_t body = pat ? pattern_body(c, re, p, &e) : rx_build(c->g, re, strlen(re), 1, p, &e);
        if (body == GRAM_BAD && !c->failed) {
            c->err = e;
            c->err.code = KV_EUNSUP;
            c->failed = 1;
        }
        return body == GRAM_BAD ? GRAM_BAD : seq3(c, q, body, q);
    }
    if (!mn && !mx)
        return any_string(c);
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return child_ptr(p, ptr, mn && !json_is_integer(mn) ? "minLength" : "maxLength"),
               js_fail(c, p, "not an integer", NULL);
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < lo) || lo > 100000 || hi > 100000)
        return child_ptr(p, ptr, "maxLength"), js_fail(c, p, "length bounds out of range", NULL);
    int32_t body = gram_repeat(c->g, str_char(c), (int32_t)lo, (int32_t)hi);
    if (body == GRAM_BAD)
        return js_fail(c, ptr, "length bounds above the grammar's repetition limit", NULL);
    return seq3(c, q, body, q);
}

/* ---- arrays, objects ---------------------------------------------------- */

static int32_t js_array(js *c, json_t *s, const char *ptr)
{
    char p[JS_PTR_MAX];
    json_t *items = json_object_get(s, "items");
    json_t *mn = json_object_get(s, "minItems"), *mx = json_object_get(s, "maxItems");
    if (json_object_get(s, "prefixItems"))
        return child_ptr(p, ptr, "prefixItems"), js_fail(c, p, "unsupported", NULL);
    if ((mn && !json_is_integer(mn)) || (mx && !json_is_integer(mx)))
        return child_ptr(p, ptr, "minItems"), js_fail(c, p, "not an integer", NULL);
    long long lo = mn ? json_integer_value(mn) : 0, hi = mx ? json_integer_value(mx) : -1;
    if (lo < 0 || (mx && hi < lo) || lo > 100000 || hi > 100000)
        return child_ptr(p, ptr, "maxItems"), js_fail(c, p, "item bounds out of range", NULL);
    child_ptr(p, ptr, "items");
    int32_t item = items ? js_schema(c, items, p) : any_value(c);
    if (hi == 0)
        return lit(c, "[]");
    int32_t more = gram_repeat(c->g, seq2(c, lit(c, ","), item), lo > 0 ? (int32_t)lo - 1 : 0,
                               hi < 0 ? -1 : (int32_t)hi - 1);
    if (more == GRAM_BAD)
        return js_fail(c, ptr, "item bounds above the grammar's repetition limit", NULL);
    int32_t list = seq2(c, item, more);
    return seq3(c, lit(c, "["), lo > 0 ? list : gram_opt(c->g, list), lit(c, "]"));
}

/* A member "key":value; the key is serialized as JSON. */
static int32_t member(js *c, const char *key, int32_t value)
{
    json_t *k = json_string(key);
    char *ks = k ? json_dumps(k, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    json_decref(k);
    if (!ks)
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    int32_t e = seq3(c, lit(c, ks), lit(c, ":"), value);
    free(ks);
    return e;
}

static int is_required(json_t *req, const char *key)
{
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
        if (json_is_string(v) && !strcmp(json_string_value(v), key))
            return 1;
    return 0;
}

/* Declared properties in order; each optional one may be left out.
 * R(i, comma) = the members from i on, comma: one came before. */
static int32_t fixed_members(js *c, json_t *props, json_t *req, const char *ptr)
{
    size_t n = json_object_size(props), i = n;
    int32_t *kv = calloc(n + 1, sizeof *kv);
    uint8_t *opt = calloc(n + 1, 1);
    if (!kv || !opt) {
        free(kv);
        free(opt);
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    }
    const char *key;
    json_t *sub;
    size_t k = 0;
    char pp[JS_PTR_MAX], p[JS_PTR_MAX];
    child_ptr(pp, ptr, "properties");
    json_object_foreach(props, key, sub) {
        child_ptr(p, pp, key);
        kv[k] = member(c, key, js_schema(c, sub, p));
        opt[k++] = !is_required(req, key);
    }
    int32_t r0 = gram_eps(c->g), r1 = r0, comma = lit(c, ",");
    while (i-- > 0) {
        int32_t a0[2] = {seq2(c, kv[i], r1), r0}, a1[2] = {seq3(c, comma, kv[i], r1), r1};
        r0 = gram_alt(c->g, a0, opt[i] ? 2 : 1);
        r1 = gram_alt(c->g, a1, opt[i] ? 2 : 1);
    }
    free(kv);
    free(opt);
    return r0;
}

static int32_t js_object(js *c, json_t *s, const char *ptr)
{
    char p[JS_PTR_MAX];
    json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required");
    json_t *add = json_object_get(s, "additionalProperties");
    if (props && !json_is_object(props))
        return child_ptr(p, ptr, "properties"), js_fail(c, p, "not an object", NULL);
    if (req && !json_is_array(req))
        return child_ptr(p, ptr, "required"), js_fail(c, p, "not an array", NULL);
    size_t i;
    json_t *v;
    json_array_foreach(req, i, v)
        if (!json_is_string(v) || !props || !json_object_get(props, json_string_value(v))) {
            child_ptr(p, ptr, "required");
            return js_fail(c, p, "required '%s' is not among the properties",
                           json_is_string(v) ? json_string_value(v) : "?");
        }
    if (props && json_object_size(props)) {
        if (add && !json_is_false(add))
            return child_ptr(p, ptr, "additionalProperties"),
                   js_fail(c, p, "additional properties together with properties are unsupported", NULL);
        return seq3(c, lit(c, "{"), fixed_members(c, props, req, ptr), lit(c, "}"));
    }
    if (json_is_false(add))
        return lit(c, "{}");
    child_ptr(p, ptr, "additionalProperties");
    int32_t val = add && !json_is_true(add) ? js_schema(c, add, p) : any_value(c);
    return any_list(c, "{", seq3(c, any_string(c), lit(c, ":"), val), "}");
}

/* ---- the dispatcher ------------------------------------------------------- */

static const char *const js_ignored[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "$defs",
    "definitions", "deprecated", "readOnly", "writeOnly", "$anchor", "contentMediaType",
    "contentEncoding", NULL,
};
static const char *const js_handled[] = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "items",
    "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "pattern", "format",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", NULL,
};

static int in_list(const char *const *l, const char *k)
{
    for (; *l; l++)
        if (!strcmp(*l, k))
            return 1;
    return 0;
}

/* Refuses keywords it does not know; returns how many constraining
 * keywords other than `except` are present. */
static int check_keywords(js *c, json_t *s, const char *ptr, const char *except)
{
    const char *k;
    json_t *v;
    int others = 0;
    json_object_foreach(s, k, v) {
        if (in_list(js_ignored, k))
            continue;
        if (!in_list(js_handled, k)) {
            char p[JS_PTR_MAX];
            child_ptr(p, ptr, k);
            js_fail(c, p, "unsupported", NULL);
            return -1;
        }
        if (!except || strcmp(k, except))
            others++;
    }
    return others;
}

static int32_t js_ref(js *c, json_t *s, const char *ptr)
{
    json_t *r = json_object_get(s, "$ref");
    char p[JS_PTR_MAX];
    child_ptr(p, ptr, "$ref");
    if (!json_is_string(r) || json_string_value(r)[0] != '#')
        return js_fail(c, p, "only local references (\"#...\") are supported", NULL);
    const char *ref = json_string_value(r) + 1;
    int32_t nt = gnames_get(c->refs, ref, strlen(ref));
    if (nt >= 0)
        return nt;
    json_t *t = c->root;   /* walk the JSON pointer */
    char tok[JS_PTR_MAX];
    for (const char *q = ref; *q && t;) {
        if (*q++ != '/')
            return js_fail(c, p, "bad JSON pointer '%s'", ref);
        size_t n = 0;
        for (; *q && *q != '/' && n + 1 < sizeof tok; q++)
            tok[n++] = *q == '~' && q[1] == '1' ? (q++, '/') : *q == '~' && q[1] == '0' ? (q++, '~') : *q;
        tok[n] = 0;
        t = json_is_array(t) ? json_array_get(t, (size_t)strtoul(tok, NULL, 10)) : json_object_get(t, tok);
    }
    if (!t)
        return js_fail(c, p, "reference '%s' not found", json_string_value(r));
    if ((nt = gram_nt(c->g)) == GRAM_BAD || gnames_put(c->refs, ref, strlen(ref), nt))
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    char tp[JS_PTR_MAX];
    snprintf(tp, sizeof tp, "%s", *ref ? ref : "");
    int32_t body = js_schema(c, t, tp);
    gram_rule(c->g, nt, &body, 1);
    return nt;
}

static int32_t js_literal_values(js *c, json_t *vals, int is_const, const char *ptr)
{
    char p[JS_PTR_MAX];
    child_ptr(p, ptr, is_const ? "const" : "enum");
    if (!is_const && (!json_is_array(vals) || json_array_size(vals) == 0))
        return js_fail(c, p, "not a non-empty array", NULL);
    size_t n = is_const ? 1 : json_array_size(vals);
    int32_t *alts = calloc(n, sizeof *alts);
    if (!alts)
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char *txt = json_dumps(is_const ? vals : json_array_get(vals, i), JSON_ENCODE_ANY | JSON_COMPACT);
        alts[i] = txt ? gram_bytes(c->g, txt, strlen(txt)) : gram_fail(c->g, KV_ENOMEM, "out of memory");
        free(txt);
    }
    int32_t e = gram_alt(c->g, alts, (int32_t)n);
    free(alts);
    return e;
}

static int32_t js_anyof(js *c, json_t *s, const char *key, const char *ptr)
{
    char p[JS_PTR_MAX], q[JS_PTR_MAX];
    json_t *l = json_object_get(s, key);
    child_ptr(p, ptr, key);
    if (!json_is_array(l) || json_array_size(l) == 0)
        return js_fail(c, p, "not a non-empty array", NULL);
    if (!strcmp(key, "allOf") && json_array_size(l) != 1)
        return js_fail(c, p, "allOf with more than one schema is unsupported", NULL);
    size_t n = json_array_size(l);
    int32_t *alts = calloc(n, sizeof *alts);
    if (!alts)
        return gram_fail(c->g, KV_ENOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        char idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        child_ptr(q, p, idx);
        alts[i] = js_schema(c, json_array_get(l, i), q);
    }
    int32_t e = gram_alt(c->g, alts, (int32_t)n);
    free(alts);
    return e;
}

static int32_t js_typed(js *c, json_t *s, const char *type, const char *ptr)
{
    if (!strcmp(type, "string"))
        return js_string(c, s, ptr);
    if (!strcmp(type, "integer"))
        return js_integer(c, s, ptr);
    if (!strcmp(type, "number"))
        return js_number(c, s, ptr);
    if (!strcmp(type, "boolean"))
        return gram_alt(c->g, (int32_t[]){lit(c, "true"), lit(c, "false")}, 2);
    if (!strcmp(type, "null"))
        return lit(c, "null");
    if (!strcmp(type, "object"))
        return js_object(c, s, ptr);
    if (!strcmp(type, "array"))
        return js_array(c, s, ptr);
    char p[JS_PTR_MAX];
    child_ptr(p, ptr, "type");
    return js_fail(c, p, "unknown type '%s'", type);
}

/* The type a schema without "type" implies from its keywords, or NULL. */
static const char *implied_type(json_t *s)
{
    if (json_object_get(s, "properties") || json_object_get(s, "required") ||
        json_object_get(s, "additionalProperties"))
        return "object";
    if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems"))
        return "array";
    if (json_object_get(s, "pattern") || json_object_get(s, "format") ||
        json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
        return "string";
    if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
        json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum"))
        return "number";
    return NULL;
}

static int32_t js_types(js *c, json_t *s, json_t *type, const char *ptr)
{
    char p[JS_PTR_MAX];
    child_ptr(p, ptr, "type");
    if (json_is_string(type))
        return js_typed(c, s, json_string_value(type), ptr);
    if (!json_is_array(type) || json_array_size(type) == 0 || json_array_size(type) > 7)
        return js_fail(c, p, "not a type name or a list of them", NULL);
    int32_t alts[7];
    size_t i;
    json_t *t;
    json_array_foreach(type, i, t) {
        if (!json_is_string(t))
            return js_fail(c, p, "not a type name or a list of them", NULL);
        alts[i] = js_typed(c, s, json_string_value(t), ptr);
    }
    return gram_alt(c->g, alts, (int32_t)json_array_size(type));
}

static int32_t js_schema(js *c, json_t *s, const char *ptr)
{
    if (c->failed)
        return GRAM_BAD;
    if (json_is_true(s))
        return any_value(c);
    if (json_is_false(s))
        return gram_class(c->g, (uint32_t[8]){0});   /* matches nothing: pruned */
    if (!json_is_object(s))
        return js_fail(c, ptr, "a schema must be an object or a boolean", NULL);
    if (++c->depth > JS_MAX_DEPTH)
        return js_fail(c, ptr, "schema nested too deep", NULL);
    int32_t e = GRAM_BAD;
    static const char *const combos[] = {"$ref", "anyOf", "oneOf", "allOf", "enum", "const"};
    for (int i = 0; i < 6 && e == GRAM_BAD && !c->failed; i++) {
        if (!json_object_get(s, combos[i]))
            continue;
        int others = check_keywords(c, s, ptr, combos[i]);
        if (others < 0)
            break;
        if (others > 0 && strcmp(combos[i], "enum") && strcmp(combos[i], "const")) {
            char p[JS_PTR_MAX];
            child_ptr(p, ptr, combos[i]);
            js_fail(c, p, "other constraints beside it are unsupported", NULL);
            break;
        }
        e = i == 0 ? js_ref(c, s, ptr) : i < 4 ? js_anyof(c, s, combos[i], ptr)
          : js_literal_values(c, json_object_get(s, combos[i]), i == 5, ptr);
    }
    if (e == GRAM_BAD && !c->failed && check_keywords(c, s, ptr, NULL) >= 0) {
        json_t *type = json_object_get(s, "type");
        const char *it = type ? NULL : implied_type(s);
        e = type ? js_types(c, s, type, ptr) : it ? js_typed(c, s, it, ptr) : any_value(c);
    }
    c->depth--;
    return c->failed ? GRAM_BAD : e;
}

static gram *js_finish(js *c, int32_t start, kvant_err *err)
{
    if (c->failed || gram_failed(c->g) || start == GRAM_BAD) {
        if (c->failed)
            kvant_err_set(err, c->err.code, "%s", c->err.msg);
        else
            gram_finish(c->g, GRAM_BAD, err);
        gram_destroy(c->g);
        c->g = NULL;
    } else if (gram_finish(c->g, start, err)) {
        gram_destroy(c->g);
        c->g = NULL;
    }
    gnames_destroy(c->refs);
    return c->g;
}

static int js_init(js *c, gram_limits lim, kvant_err *err)
{
    *c = (js){.value = GRAM_BAD, .object = GRAM_BAD, .str_char = GRAM_BAD, .string = GRAM_BAD,
              .integer = GRAM_BAD, .number = GRAM_BAD};
    c->g = gram_create(lim);
    c->refs = gnames_create();
    if (!c->g || !c->refs) {
        gram_destroy(c->g);
        gnames_destroy(c->refs);
        return kvant_err_set(err, KV_ENOMEM, "out of memory");
    }
    return 0;
}

gram *jschema_compile(const char *schema, size_t n, gram_limits lim, kvant_err *err)
{
    json_error_t je;
    json_t *root = json_loadb(schema, n, JSON_DECODE_ANY, &je);
    if (!root) {
        kvant_err_set(err, KV_EINVAL, "json schema: invalid JSON at line %d column %d: %s", je.line,
                      je.column, je.text);
        return NULL;
    }
    js c;
    if (js_init(&c, lim, err)) {
        json_decref(root);
        return NULL;
    }
    c.root = root;
    int32_t start = js_schema(&c, root, "");
    gram *g = js_finish(&c, start, err);
    json_decref(root);
    return g;
}

gram *jschema_any_object(gram_limits lim, kvant_err *err)
{
    js c;
    if (js_init(&c, lim, err))
        return NULL;
    any_value(&c);
    return js_finish(&c, c.object, err);
}
