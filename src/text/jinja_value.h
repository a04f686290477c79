/* jinja_value.h - the values of the Jinja interpreter (Python's types).
 *
 * A jv is a small tagged value passed by copy; strings, lists, dicts and
 * callables point into an arena (jv_arena) that owns every allocation of
 * one render (or of one compiled template, for its literals).  Freeing the
 * arena frees everything at once, so a failed render leaks nothing.  The
 * arena has a byte budget: exceeding it is an allocation failure that the
 * interpreter reports as an error.
 *
 * Semantics follow Python 3 as jinja2 exposes it: Python truthiness,
 * equality (1 == 1.0 == True), ordering, str() and repr() of values,
 * dicts keep insertion order.  Strings are UTF-8; lengths and indices of
 * strings are counted in code points as Python counts them.
 * Thread: one arena and its values belong to one thread at a time.
 */
#ifndef KVANT_JINJA_VALUE_H
#define KVANT_JINJA_VALUE_H

#include <stddef.h>
#include <stdint.h>

typedef struct jv_arena jv_arena;

typedef enum jv_type {
    JV_UNDEF = 0, /* jinja2's Undefined; u.undef names it */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STR,
    JV_LIST, /* list or tuple (u.l->tuple) */
    JV_DICT, /* dict, or a namespace() object (u.d->ns) */
    JV_FUNC, /* macro, builtin, bound method */
} jv_type;

typedef struct jv_str {
    size_t n;  /* bytes, excluding the NUL */
    int safe;  /* markupsafe.Markup (from |safe): str + Markup escapes the str */
    char s[];  /* UTF-8, NUL-terminated */
} jv_str;

typedef struct jv_undef {
    const char *name; /* the missing name / attribute ("" unknown) */
    const char *hint; /* when set: the error any use of it raises */
} jv_undef;

struct jv_list;
struct jv_dict;
struct jv_func;

typedef struct jv {
    jv_type t;
    union {
        int b;
        int64_t i;
        double f;
        const jv_str *s;
        struct jv_list *l;
        struct jv_dict *d;
        struct jv_func *fn;
        const jv_undef *undef;
    } u;
} jv;

typedef struct jv_list {
    size_t n, cap;
    jv *v;
    int tuple;
    int gen; /* a generator (what select, map, ... return in jinja2): no len(),
              * not JSON-serialisable, always true */
} jv_list;

typedef struct jv_dict {
    size_t n, cap;
    jv *k, *v;
    int ns; /* a namespace(): attributes may be assigned, repr differs */
} jv_dict;

typedef struct jv_func {
    int kind;         /* interpreter-defined (jinja_eval.c) */
    const char *name; /* method or macro name */
    jv self;          /* bound object, or JV_UNDEF */
    const void *node; /* macro definition (an AST node) or NULL */
} jv_func;

/* Arguments of a filter, test, method or macro call (all borrowed). */
typedef struct jv_args {
    const jv *pos;
    size_t n_pos;
    const char *const *kwn; /* keyword names */
    const jv *kwv;          /* keyword values */
    size_t n_kw;
} jv_args;

/* ---- arena ---- */
/* Creates an arena that refuses to hold more than budget bytes. */
jv_arena *jv_arena_create(size_t budget);
void jv_arena_destroy(jv_arena *a);
/* Zeroed memory or NULL (out of memory or over budget). */
void *jv_alloc(jv_arena *a, size_t n);

/* ---- constructors (NULL-free: a failed allocation gives JV_UNDEF with
 * the hint "out of memory", which any use reports) ---- */
jv jv_undef_named(jv_arena *a, const char *name, const char *hint);
static inline jv jv_none(void) { jv v = {.t = JV_NONE}; return v; }
static inline jv jv_bool(int b) { jv v = {.t = JV_BOOL, .u.b = !!b}; return v; }
static inline jv jv_int(int64_t i) { jv v = {.t = JV_INT, .u.i = i}; return v; }
static inline jv jv_float(double f) { jv v = {.t = JV_FLOAT, .u.f = f}; return v; }
jv jv_strn(jv_arena *a, const char *s, size_t n);
jv jv_cstr(jv_arena *a, const char *s);
/* markupsafe.escape(s) as a Markup string (s itself if already Markup). */
jv jv_html_escape(jv_arena *a, jv s);
jv jv_list_new(jv_arena *a, size_t cap);
jv jv_dict_new(jv_arena *a, size_t cap);
/* Appends (growing the list in the arena); 0 or -1 on out of memory. */
int jv_list_push(jv_arena *a, jv list, jv item);
/* Sets key (replacing an equal key); 0 or -1 on out of memory. */
int jv_dict_set(jv_arena *a, jv dict, jv key, jv val);
int jv_dict_set_str(jv_arena *a, jv dict, const char *key, jv val);
/* Looks up key; 1 found (*out set), 0 absent. */
int jv_dict_get(jv dict, jv key, jv *out);
int jv_dict_get_str(jv dict, const char *key, jv *out);

/* ---- Python semantics ---- */
int jv_truthy(jv v);
int jv_eq(jv a, jv b);
/* Ordering a < b etc.: returns 0 and sets *cmp to -1/0/1, or -1 when the
 * types cannot be ordered (Python's TypeError). */
int jv_cmp(jv a, jv b, int *cmp);
int jv_is_num(jv v); /* int, float or bool */
double jv_num(jv v);
const char *jv_type_name(jv v); /* Python's type name: 'str', 'dict', ... */

/* ---- strings ---- */
/* str(v) as Python prints it (Undefined renders ""). */
jv jv_to_str(jv_arena *a, jv v);
/* repr(v). */
jv jv_repr(jv_arena *a, jv v);
/* Python float repr (shortest round trip, "1.0", "1e+16", "inf"). */
void jv_float_repr(double f, char *buf, size_t cap);
size_t jv_utf8_len(const char *s, size_t n);            /* code points */
size_t jv_utf8_off(const char *s, size_t n, size_t cp); /* byte offset of code point cp */
/* Decodes one code point at s (n bytes left); *len gets its length;
 * invalid bytes decode as themselves with length 1. */
uint32_t jv_utf8_dec(const unsigned char *s, size_t n, size_t *len);
int jv_py_space(uint32_t cp); /* str.isspace() */

/* ---- growable output buffer in an arena ---- */
typedef struct jv_buf {
    jv_arena *a;
    char *p;
    size_t n, cap, limit; /* limit: most bytes it may hold */
    int fail;             /* 1 out of memory, 2 over limit */
} jv_buf;
void jv_buf_init(jv_buf *b, jv_arena *a, size_t limit);
void jv_buf_add(jv_buf *b, const char *s, size_t n);
void jv_buf_cstr(jv_buf *b, const char *s);
jv jv_buf_take(jv_buf *b); /* the content as a string value */

#endif
