/* jinja_json.h - JSON in and out of Jinja values.
 *
 * jjson_dumps is Python's json.dumps(v, ensure_ascii=..., indent=...,
 * separators=..., sort_keys=...) byte for byte (what transformers' tojson
 * filter returns); jjson_from is a jansson value as the json module would
 * load it (objects keep their order, integers stay integers).
 * Ownership: results live in the arena; the jansson value is borrowed.
 */
#ifndef KVANT_JINJA_JSON_H
#define KVANT_JINJA_JSON_H

#include <jansson.h>

#include "text/jinja_value.h"

typedef struct jjson_opts {
    int indent;           /* < 0: None (one line) */
    const char *item_sep; /* NULL: ", " without indent, "," with it */
    const char *key_sep;  /* NULL: ": " */
    int sort_keys;
    int ensure_ascii;     /* non-ASCII as \uXXXX (surrogate pairs above U+FFFF) */
} jjson_opts;

/* Returns 0 with *out a string, or -1 with a Python-like TypeError
 * message in emsg (Undefined, a namespace, a function). */
int jjson_dumps(jv_arena *a, jv v, const jjson_opts *o, jv *out, char *emsg, size_t cap);
/* Converts j (depth-bounded: deeper than 256 levels gives JV_UNDEF). */
jv jjson_from(jv_arena *a, const json_t *j);

#endif
