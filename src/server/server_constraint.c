/* server_constraint.c - the structured-output fields and their compilation
 * (server_constraint.h).
 *
 * Sources are normalised before they are hashed by the cache: a schema
 * given as an object (or as a JSON string, as vLLM accepts) is dumped
 * compactly with its keys in the order sent (properties come out in that
 * order); a choice list is dumped compactly.  So the same schema sent with
 * other whitespace hits the same compiled grammar.
 */
#include "server/server_constraint.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CANDS 8

/* One field that constrains the output, before normalisation. */
typedef struct cand {
    char field[64];
    int kind;
    json_t *v;         /* borrowed from the body (NULL for json_object) */
} cand;

typedef struct cands {
    cand c[MAX_CANDS];
    int n;
} cands;

static void add(cands *cs, const char *field, int kind, json_t *v)
{
    if (cs->n < MAX_CANDS) {
        cand *c = &cs->c[cs->n++];
        snprintf(c->field, sizeof c->field, "%s", field);
        c->kind = kind;
        c->v = v;
    }
}

static int present(json_t *v)
{
    return v && !json_is_null(v);
}

/* response_format.json_schema: {name, schema, strict, description}. */
static int rf_json_schema(json_t *js, cands *cs, srv_error *e)
{
    const char *P = "response_format";
    if (!json_is_object(js))
        return srv_error_set(e, 400, P, "'response_format.json_schema' must be an object "
                             "{\"name\", \"schema\", \"strict\"}");
    const char *k;
    json_t *v;
    json_object_foreach(js, k, v) {
        if (json_is_null(v))
            continue;
        if (!strcmp(k, "name") || !strcmp(k, "description")) {
            if (!json_is_string(v))
                return srv_error_set(e, 400, P, "'response_format.json_schema.%s' must be a "
                                     "string", k);
        } else if (!strcmp(k, "strict")) {
            if (!json_is_boolean(v))
                return srv_error_set(e, 400, P, "'response_format.json_schema.strict' must be "
                                     "a boolean");
        } else if (strcmp(k, "schema")) {
            return srv_error_set(e, 400, P, "unknown field 'response_format.json_schema.%.40s' "
                                 "(name, description, schema, strict)", k);
        }
    }
    json_t *s = json_object_get(js, "schema");
    if (!present(s))
        return srv_error_set(e, 400, P, "'response_format.json_schema.schema' is required");
    add(cs, "response_format.json_schema.schema", GRAM_KIND_JSON_SCHEMA, s);
    return 0;
}

/* response_format: {"type": "text" | "json_object" | "json_schema"}; a
 * json_object with "schema" is llama.cpp's way of sending a schema. */
static int parse_rf(json_t *rf, cands *cs, srv_error *e)
{
    const char *P = "response_format";
    json_t *t = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    if (!json_is_string(t))
        return srv_error_set(e, 400, P, "'response_format' must be an object with a 'type' "
                             "(text, json_object or json_schema)");
    const char *ty = json_string_value(t), *k;
    json_t *v;
    json_object_foreach(rf, k, v) {
        int ok = !strcmp(k, "type") || json_is_null(v) ||
                 (!strcmp(ty, "json_schema") && !strcmp(k, "json_schema")) ||
                 (!strcmp(ty, "json_object") && !strcmp(k, "schema"));
        if (!ok)
            return srv_error_set(e, 400, P, "'response_format.%.40s' is not a field of "
                                 "response_format {\"type\": \"%.20s\"}", k, ty);
    }
    if (!strcmp(ty, "text"))
        return 0;
    if (!strcmp(ty, "json_schema"))
        return rf_json_schema(json_object_get(rf, "json_schema"), cs, e);
    if (!strcmp(ty, "json_object")) {
        json_t *s = json_object_get(rf, "schema");
        if (present(s))
            add(cs, "response_format.schema", GRAM_KIND_JSON_SCHEMA, s);
        else
            add(cs, "response_format", GRAM_KIND_JSON_OBJECT, NULL);
        return 0;
    }
    return srv_error_set(e, 400, P, "'response_format.type' '%.40s' is not text, json_object "
                         "or json_schema", ty);
}

/* vLLM's structured_outputs {json, regex, choice, grammar, json_object}. */
static int parse_so(json_t *so, cands *cs, srv_error *e)
{
    static const struct { const char *k; int kind; } keys[] = {
        {"json", GRAM_KIND_JSON_SCHEMA}, {"regex", GRAM_KIND_REGEX},
        {"choice", GRAM_KIND_CHOICE}, {"grammar", GRAM_KIND_GBNF},
        {"json_object", GRAM_KIND_JSON_OBJECT},
    };
    const char *P = "structured_outputs";
    if (!json_is_object(so))
        return srv_error_set(e, 400, P, "'structured_outputs' must be an object (json, regex, "
                             "choice, grammar or json_object)");
    const char *k;
    json_t *v;
    json_object_foreach(so, k, v) {
        if (json_is_null(v))
            continue;
        int kind = -1;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strcmp(k, keys[i].k))
                kind = keys[i].kind;
        char f[64];
        snprintf(f, sizeof f, "structured_outputs.%.40s", k);
        if (kind == GRAM_KIND_JSON_OBJECT) {
            if (!json_is_boolean(v))
                return srv_error_set(e, 400, P, "'%s' must be a boolean", f);
            if (json_is_true(v))
                add(cs, f, kind, NULL);
        } else if (kind >= 0) {
            add(cs, f, kind, v);
        } else if (!strcmp(k, "disable_any_whitespace") || !strcmp(k, "disable_fallback")) {
            /* kvant's JSON has no whitespace and there is no fallback backend */
            if (!json_is_boolean(v))
                return srv_error_set(e, 400, P, "'%s' must be a boolean", f);
        } else {
            return srv_error_set(e, 400, P, "'%s' is not supported (json, regex, choice, "
                                 "grammar and json_object are)", f);
        }
    }
    return 0;
}

/* Every constraint field of the body into cs. */
static int collect(json_t *o, cands *cs, srv_error *e)
{
    int rc;
    json_t *v = json_object_get(o, "response_format");
    if (present(v) && (rc = parse_rf(v, cs, e)))
        return rc;
    v = json_object_get(o, "structured_outputs");
    if (present(v) && (rc = parse_so(v, cs, e)))
        return rc;
    static const struct { const char *k; int kind; } top[] = {
        {"guided_json", GRAM_KIND_JSON_SCHEMA}, {"guided_regex", GRAM_KIND_REGEX},
        {"guided_choice", GRAM_KIND_CHOICE}, {"guided_grammar", GRAM_KIND_GBNF},
        {"grammar", GRAM_KIND_GBNF}, {"json_schema", GRAM_KIND_JSON_SCHEMA},
    };
    for (size_t i = 0; i < sizeof top / sizeof top[0]; i++)
        if (present(v = json_object_get(o, top[i].k)))
            add(cs, top[i].k, top[i].kind, v);
    return 0;
}

/* The source text of c into out (owned), checked for its JSON type. */
static int normalise(const cand *c, srv_constraint *out, srv_error *e)
{
    json_t *v = c->v, *parsed = NULL;
    const char *f = c->field;
    char *s = NULL;
    switch (c->kind) {
    case GRAM_KIND_JSON_OBJECT: s = strdup(""); break;
    case GRAM_KIND_REGEX:
    case GRAM_KIND_GBNF:
        if (!json_is_string(v))
            return srv_error_set(e, 400, f, "'%s' must be a string", f);
        s = strndup(json_string_value(v), json_string_length(v));
        break;
    case GRAM_KIND_CHOICE: {
        size_t i;
        json_t *x;
        int ok = json_is_array(v) && json_array_size(v) > 0;
        json_array_foreach(v, i, x) ok = ok && json_is_string(x);
        if (!ok)
            return srv_error_set(e, 400, f, "'%s' must be a non-empty array of strings", f);
        s = json_dumps(v, JSON_COMPACT);
        break;
    }
    default: /* a schema: an object, a boolean, or a JSON text holding one */
        if (json_is_string(v)) {
            json_error_t je;
            parsed = json_loadb(json_string_value(v), json_string_length(v),
                                JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
            if (!parsed)
                return srv_error_set(e, 400, f, "'%s': the schema text is not JSON (byte %d: "
                                     "%.200s)", f, je.position, je.text);
            v = parsed;
        }
        if (!json_is_object(v) && !json_is_boolean(v)) {
            json_decref(parsed);
            return srv_error_set(e, 400, f, "'%s' must be a JSON Schema (an object)", f);
        }
        s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
        json_decref(parsed);
        break;
    }
    if (!s)
        return srv_error_set(e, 500, NULL, "out of memory");
    out->kind = c->kind;
    out->src = s;
    out->n = strlen(s);
    snprintf(out->field, sizeof out->field, "%s", f);
    return 0;
}

int srv_constraint_parse(json_t *o, size_t max_bytes, srv_constraint *out, srv_error *e)
{
    memset(out, 0, sizeof *out);
    out->kind = -1;
    cands cs = {0};
    int rc = collect(o, &cs, e);
    if (rc)
        return rc;
    if (cs.n > 1)
        return srv_error_set(e, 400, cs.c[1].field, "'%s' and '%s' both constrain the output: "
                             "send one of them", cs.c[0].field, cs.c[1].field);
    if (cs.n == 0)
        return 0;
    if ((rc = normalise(&cs.c[0], out, e)))
        return rc;
    if (max_bytes && out->n > max_bytes) {
        srv_error_set(e, 400, out->field, "'%s' is %zu bytes; this server compiles grammars "
                      "of at most %zu bytes (--grammar-max-bytes)", out->field, out->n,
                      max_bytes);
        srv_constraint_free(out);
        return -400;
    }
    return 0;
}

void srv_constraint_free(srv_constraint *c)
{
    free(c->src);
    c->src = NULL;
    c->n = 0;
    c->kind = -1;
}

gcache_entry *srv_constraint_get(gcache *cache, const srv_constraint *c, srv_error *e)
{
    kvant_err ke = {0};
    gcache_entry *g = gcache_get(cache, (gram_kind)c->kind, c->src, c->n, &ke);
    if (!g)
        srv_error_set(e, ke.code == KV_ENOMEM ? 500 : 400, c->field, "'%s': %s", c->field,
                      ke.msg[0] ? ke.msg : "the grammar does not compile");
    return g;
}

struct srv_gref {
    gcache *cache;
    gcache_entry *entry;
};

srv_gref *srv_gref_create(gcache *cache, gcache_entry *entry)
{
    srv_gref *r = malloc(sizeof *r);
    if (!r) {
        gcache_release(cache, entry);
        return NULL;
    }
    r->cache = cache;
    r->entry = entry;
    return r;
}

void srv_gref_release(void *gref)
{
    srv_gref *r = gref;
    if (!r)
        return;
    gcache_release(r->cache, r->entry);
    free(r);
}
