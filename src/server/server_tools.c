/* server_tools.c - tools, tool_choice and tool calls (server_tools.h). */
#include "server/server_tools.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_MAX 128            /* functions in one request */

static const char OPEN_TAG[] = "<tool_call>", CLOSE_TAG[] = "</tool_call>";
static const char MISTRAL_TAG[] = "[TOOL_CALLS]", MISTRAL_ARGS[] = "[ARGS]";
static const char MISTRAL_ID[] = "[CALL_ID]", PYTHON_TAG[] = "<|python_tag|>";

/* The control tokens of the tool-call syntaxes: kept in the text of a
 * reply that is parsed for calls (other control tokens render as ""). */
static const char *const MARKERS[] = {OPEN_TAG, CLOSE_TAG, MISTRAL_TAG, MISTRAL_ARGS, MISTRAL_ID,
                                      PYTHON_TAG};

int srv_tools_marker(const char *piece, size_t n)
{
    for (size_t k = 0; k < sizeof MARKERS / sizeof MARKERS[0]; k++)
        if (n == strlen(MARKERS[k]) && !memcmp(piece, MARKERS[k], n))
            return 1;
    return 0;
}

/* One tools[k]: {"type": "function", "function": {"name", "description"?,
 * "parameters"?, "strict"?}}. */
static int check_tool(json_t *t, size_t k, srv_error *e)
{
    json_t *ty = json_object_get(t, "type"), *f = json_object_get(t, "function");
    if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
        !json_is_object(f))
        return srv_error_set(e, 400, "tools", "tools[%zu] must be {\"type\": \"function\", "
                             "\"function\": {...}}", k);
    json_t *name = json_object_get(f, "name"), *p = json_object_get(f, "parameters");
    if (!json_is_string(name) || json_string_length(name) == 0 || json_string_length(name) > 64)
        return srv_error_set(e, 400, "tools", "tools[%zu].function.name must be a string of "
                             "1-64 characters", k);
    if (p && !json_is_null(p) && !json_is_object(p))
        return srv_error_set(e, 400, "tools", "tools[%zu].function.parameters must be a JSON "
                             "Schema object", k);
    const char *key;
    json_t *v;
    json_object_foreach(f, key, v) {
        if (strcmp(key, "name") && strcmp(key, "description") && strcmp(key, "parameters") &&
            strcmp(key, "strict"))
            return srv_error_set(e, 400, "tools", "tools[%zu].function.%.40s is not a field of "
                                 "a function (name, description, parameters, strict)", k, key);
    }
    return 0;
}

static json_t *params_of(json_t *tool)
{
    json_t *p = json_object_get(json_object_get(tool, "function"), "parameters");
    return json_is_object(p) ? json_incref(p) : json_pack("{s:s}", "type", "object");
}

static json_t *find_tool(json_t *tools, const char *name)
{
    size_t k;
    json_t *t;
    json_array_foreach(tools, k, t) {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        if (!strcmp(json_string_value(n), name))
            return t;
    }
    return NULL;
}

/* The schema of the output for tool_choice required: [{name, arguments}]. */
static json_t *required_schema(json_t *tools, int parallel)
{
    json_t *alts = json_array();
    size_t k;
    json_t *t;
    json_array_foreach(tools, k, t) {
        json_t *n = json_object_get(json_object_get(t, "function"), "name");
        json_array_append_new(alts, json_pack("{s:s, s:{s:{s:O}, s:o}, s:[s,s], s:b}", "type",
                                              "object", "properties", "name", "const", n,
                                              "arguments", params_of(t), "required", "name",
                                              "arguments", "additionalProperties", 0));
    }
    json_t *s = json_pack("{s:s, s:{s:o}, s:i}", "type", "array", "items", "anyOf", alts,
                          "minItems", 1);
    if (s && !parallel)
        json_object_set_new(s, "maxItems", json_integer(1));
    return s;
}

static int set_cons(srv_constraint *cons, const char *field, json_t *schema, size_t max_bytes,
                    srv_error *e)
{
    char *src = schema ? json_dumps(schema, JSON_COMPACT) : NULL;
    json_decref(schema);
    if (!src)
        return srv_error_set(e, 500, NULL, "out of memory");
    if (max_bytes && strlen(src) > max_bytes) {
        free(src);
        return srv_error_set(e, 400, field, "the tools' parameters schema is over %zu bytes "
                             "(--grammar-max-bytes)", max_bytes);
    }
    cons->kind = GRAM_KIND_JSON_SCHEMA;
    cons->src = src;
    cons->n = strlen(src);
    snprintf(cons->field, sizeof cons->field, "%s", field);
    return 0;
}

/* tool_choice into t->mode (and t->named). */
static int parse_choice(json_t *tc, srv_tools *t, srv_error *e)
{
    const char *P = "tool_choice";
    if (!tc || json_is_null(tc)) {
        t->mode = SRV_TOOLS_AUTO;
        return 0;
    }
    if (json_is_string(tc)) {
        const char *c = json_string_value(tc);
        t->mode = !strcmp(c, "none") ? SRV_TOOLS_NONE : !strcmp(c, "auto") ? SRV_TOOLS_AUTO
                  : !strcmp(c, "required") ? SRV_TOOLS_REQUIRED : -1;
        if (t->mode < 0)
            return srv_error_set(e, 400, P, "'tool_choice' '%.40s' is not none, auto, required "
                                 "or {\"type\": \"function\", ...}", c);
        return 0;
    }
    json_t *f = json_object_get(tc, "function"), *ty = json_object_get(tc, "type");
    json_t *n = json_object_get(f, "name");
    if (!json_is_object(tc) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
        !json_is_string(n))
        return srv_error_set(e, 400, P, "'tool_choice' must be a string or {\"type\": "
                             "\"function\", \"function\": {\"name\": ...}}");
    if (!find_tool(t->tools, json_string_value(n)))
        return srv_error_set(e, 400, P, "'tool_choice' names '%.64s', which is not in 'tools'",
                             json_string_value(n));
    t->mode = SRV_TOOLS_NAMED;
    snprintf(t->named, sizeof t->named, "%s", json_string_value(n));
    return 0;
}

int srv_tools_parse(json_t *o, size_t max_bytes, srv_tools *t, srv_constraint *cons,
                    srv_error *e)
{
    memset(t, 0, sizeof *t);
    json_t *tools = json_object_get(o, "tools"), *tc = json_object_get(o, "tool_choice");
    json_t *ptc = json_object_get(o, "parallel_tool_calls");
    if (ptc && !json_is_null(ptc) && !json_is_boolean(ptc))
        return srv_error_set(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be a "
                             "boolean");
    if (!tools || json_is_null(tools)) {
        if (tc && !json_is_null(tc) && !(json_is_string(tc) &&
                                         !strcmp(json_string_value(tc), "none")))
            return srv_error_set(e, 400, "tool_choice", "'tool_choice' needs 'tools'");
        return 0;
    }
    if (!json_is_array(tools) || json_array_size(tools) == 0 ||
        json_array_size(tools) > TOOLS_MAX)
        return srv_error_set(e, 400, "tools", "'tools' must be an array of 1-%d functions",
                             TOOLS_MAX);
    size_t k;
    json_t *x;
    json_array_foreach(tools, k, x) {
        int rc = check_tool(x, k, e);
        if (rc)
            return rc;
        json_t *nk = json_object_get(json_object_get(x, "function"), "name");
        for (size_t j = 0; j < k; j++)
            if (!strcmp(json_string_value(nk), json_string_value(json_object_get(
                    json_object_get(json_array_get(tools, j), "function"), "name"))))
                return srv_error_set(e, 400, "tools", "tools[%zu]: the name '%.64s' is given "
                                     "twice", k, json_string_value(nk));
    }
    t->tools = json_incref(tools);
    int rc = parse_choice(tc, t, e);
    if (rc || (t->mode != SRV_TOOLS_REQUIRED && t->mode != SRV_TOOLS_NAMED)) {
        if (rc)
            srv_tools_free(t);
        return rc;
    }
    if (cons->kind >= 0) {
        rc = srv_error_set(e, 400, "tool_choice", "'tool_choice' %s constrains the output, and "
                           "so does '%s': send one of them",
                           t->mode == SRV_TOOLS_NAMED ? "naming a function" : "required",
                           cons->field);
    } else {
        json_t *schema = t->mode == SRV_TOOLS_NAMED ? params_of(find_tool(tools, t->named))
                                                    : required_schema(tools, !json_is_false(ptc));
        rc = set_cons(cons, "tool_choice", schema, max_bytes, e);
    }
    if (rc)
        srv_tools_free(t);
    return rc;
}

void srv_tools_free(srv_tools *t)
{
    json_decref(t->tools);
    t->tools = NULL;
    t->mode = SRV_TOOLS_OFF;
}

static json_t *call_json(const char *id, int choice, int k, const char *name, const char *args,
                         size_t n)
{
    char cid[96];
    snprintf(cid, sizeof cid, "call_%.48s_%d_%d", id, choice, k);
    return json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", cid, "type", "function", "function",
                     "name", name, "arguments", args, n);
}

/* {"name": tool, "arguments": {...}} (Llama 3: "parameters") -> a call
 * appended to calls (0), or -1. */
static int add_parsed(const srv_tools *t, json_t *obj, const char *id, int choice, json_t *calls)
{
    json_t *n = json_object_get(obj, "name"), *a = json_object_get(obj, "arguments");
    if (!a)
        a = json_object_get(obj, "parameters");
    if (!json_is_string(n) || !find_tool(t->tools, json_string_value(n)) || !json_is_object(a))
        return -1;
    char *args = json_dumps(a, JSON_COMPACT);
    if (!args)
        return -1;
    json_t *c = call_json(id, choice, (int)json_array_size(calls), json_string_value(n), args,
                          strlen(args));
    free(args);
    return c ? json_array_append_new(calls, c) : -1;
}

/* Hermes / Qwen: <tool_call>JSON</tool_call> blocks; the rest into content. */
static void parse_hermes(const srv_tools *t, const char *text, size_t n, const char *id,
                         int choice, json_t *calls, char *content, size_t *clen)
{
    size_t i = 0;
    *clen = 0;
    while (i < n) {
        const char *o = memmem(text + i, n - i, OPEN_TAG, sizeof OPEN_TAG - 1);
        const char *c = o ? memmem(o, n - (size_t)(o - text), CLOSE_TAG, sizeof CLOSE_TAG - 1)
                          : NULL;
        size_t upto = c ? (size_t)(o - text) : n;
        memcpy(content + *clen, text + i, upto - i);
        *clen += upto - i;
        if (!c)
            break;
        const char *body = o + sizeof OPEN_TAG - 1;
        json_t *obj = json_loadb(body, (size_t)(c - body), 0, NULL);
        if (!obj || add_parsed(t, obj, id, choice, calls)) { /* not a call: keep the text */
            size_t blen = (size_t)(c + sizeof CLOSE_TAG - 1 - o);
            memcpy(content + *clen, o, blen);
            *clen += blen;
        }
        json_decref(obj);
        i = (size_t)(c - text) + sizeof CLOSE_TAG - 1;
    }
}

static int all_space(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strchr(" \t\r\n", s[i]))
            return 0;
    return 1;
}

static const char *skip_space(const char *s, const char *end)
{
    while (s < end && strchr(" \t\r\n", *s))
        s++;
    return s;
}

/* One JSON value at the start of [s, end) (after spaces): the value, *next
 * past it; NULL when none parses. */
static json_t *json_at(const char *s, const char *end, const char **next)
{
    json_error_t je;
    s = skip_space(s, end);
    json_t *v = json_loadb(s, (size_t)(end - s), JSON_DISABLE_EOF_CHECK, &je);
    if (v)
        *next = s + je.position;
    return v;
}

/* Mistral, after [TOOL_CALLS]: a JSON array of {"name", "arguments"} (v3),
 * or name[ARGS]{...} / name[CALL_ID]id[ARGS]{...} (v11+), each call after
 * its own [TOOL_CALLS].  0 when every call parsed, -1 otherwise. */
static int parse_mistral_calls(const srv_tools *t, const char *s, const char *end,
                               const char *id, int choice, json_t *calls)
{
    const size_t lt = sizeof MISTRAL_TAG - 1, la = sizeof MISTRAL_ARGS - 1;
    while ((s = skip_space(s, end)) < end) {
        if ((size_t)(end - s) >= lt && !memcmp(s, MISTRAL_TAG, lt)) {
            s += lt;
            continue;
        }
        const char *next;
        if (*s == '[') { /* v3: an array of calls */
            json_t *arr = json_at(s, end, &next);
            size_t k;
            json_t *x;
            int bad = !json_is_array(arr) || json_array_size(arr) == 0;
            json_array_foreach(arr, k, x) bad |= add_parsed(t, x, id, choice, calls) != 0;
            json_decref(arr);
            if (bad)
                return -1;
            s = next;
            continue;
        }
        const char *a = memmem(s, (size_t)(end - s), MISTRAL_ARGS, la);
        if (!a)
            return -1;
        const char *name_end = memmem(s, (size_t)(a - s), MISTRAL_ID, sizeof MISTRAL_ID - 1);
        name_end = name_end ? name_end : a;
        while (name_end > s && strchr(" \t\r\n", name_end[-1]))
            name_end--;
        json_t *args = json_at(a + la, end, &next);
        json_t *obj = json_pack("{s:s%, s:o}", "name", s, (size_t)(name_end - s), "arguments",
                                args ? args : json_null());
        const int rc = obj && args ? add_parsed(t, obj, id, choice, calls) : -1;
        json_decref(obj);
        if (rc)
            return -1;
        s = next;
    }
    return 0;
}

/* Llama 3.x: the whole reply (after an optional <|python_tag|>) is one
 * call {"name": tool, "parameters": {...}}, or several separated by ';'.
 * 0 when it parsed into calls, -1 (nothing added) otherwise. */
static int parse_llama3(const srv_tools *t, const char *text, size_t n, const char *id,
                        int choice, json_t *calls)
{
    const char *s = skip_space(text, text + n), *end = text + n;
    const size_t lp = sizeof PYTHON_TAG - 1;
    if ((size_t)(end - s) >= lp && !memcmp(s, PYTHON_TAG, lp))
        s += lp;
    json_t *got = json_array();
    while (got && (s = skip_space(s, end)) < end) {
        const char *next;
        json_t *obj = *s == '{' ? json_at(s, end, &next) : NULL;
        const int rc = obj ? add_parsed(t, obj, id, choice, got) : -1;
        json_decref(obj);
        s = rc ? NULL : skip_space(next, end);
        if (!s)
            break;
        if (s < end && *s == ';')
            s++;
    }
    const int ok = s && json_array_size(got) > 0;
    if (ok)
        json_array_extend(calls, got);
    json_decref(got);
    return ok ? 0 : -1;
}

/* tool_choice auto: Hermes / Qwen blocks, else Mistral [TOOL_CALLS] (the
 * text before it is the content), else a reply that is exactly Llama 3
 * JSON calls; anything else is content, as the model wrote it (markers
 * included). */
static void parse_auto(const srv_tools *t, const char *text, size_t n, const char *id,
                       int choice, json_t *calls, char *content, size_t *clen)
{
    if (memmem(text, n, OPEN_TAG, sizeof OPEN_TAG - 1)) {
        parse_hermes(t, text, n, id, choice, calls, content, clen);
        return;
    }
    const char *m = memmem(text, n, MISTRAL_TAG, sizeof MISTRAL_TAG - 1);
    json_t *got = json_array();
    if (m && got && !parse_mistral_calls(t, m, text + n, id, choice, got)) {
        json_array_extend(calls, got);
        *clen = (size_t)(m - text);
        memcpy(content, text, *clen);
    } else if (!m && !parse_llama3(t, text, n, id, choice, calls)) {
        *clen = 0;
    } else {
        memcpy(content, text, n);
        *clen = n;
    }
    json_decref(got);
}

json_t *srv_tools_message(const srv_tools *t, const char *text, size_t n, const char *id,
                          int choice, int *n_calls)
{
    json_t *calls = json_array();
    char *content = malloc(n + 1);
    size_t clen = 0;
    *n_calls = 0;
    if (!calls || !content) {
        json_decref(calls);
        free(content);
        return NULL;
    }
    if (t->mode == SRV_TOOLS_NAMED) {
        json_array_append_new(calls, call_json(id, choice, 0, t->named, text, n));
    } else if (t->mode == SRV_TOOLS_REQUIRED) {
        json_t *arr = json_loadb(text, n, 0, NULL);
        size_t k;
        json_t *x;
        json_array_foreach(arr, k, x) add_parsed(t, x, id, choice, calls);
        if (!json_array_size(calls)) { /* cut before the array closed: the text as it is */
            memcpy(content, text, n);
            clen = n;
        }
        json_decref(arr);
    } else if (t->mode == SRV_TOOLS_AUTO) {
        parse_auto(t, text, n, id, choice, calls, content, &clen);
    } else {
        memcpy(content, text, n);
        clen = n;
    }
    *n_calls = (int)json_array_size(calls);
    json_t *c = *n_calls && all_space(content, clen) ? json_null() : json_stringn(content, clen);
    free(content);
    json_t *m = json_pack("{s:s, s:o}", "role", "assistant", "content", c ? c : json_string(""));
    if (m && *n_calls)
        json_object_set(m, "tool_calls", calls);
    json_decref(calls);
    return m;
}

json_t *srv_tools_msg_calls(json_t *calls, size_t i, srv_error *e)
{
    if (!json_is_array(calls)) {
        srv_error_set(e, 400, "messages", "messages[%zu].tool_calls must be an array", i);
        return NULL;
    }
    json_t *out = json_array();
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
        json_t *f = json_object_get(c, "function"), *id = json_object_get(c, "id");
        json_t *n = json_object_get(f, "name"), *a = json_object_get(f, "arguments");
        json_t *args = json_is_string(a) ? json_loadb(json_string_value(a), json_string_length(a),
                                                      0, NULL)
                                         : json_is_object(a) ? json_incref(a) : NULL;
        if (!json_is_string(n) || !json_is_object(args)) {
            json_decref(args);
            json_decref(out);
            srv_error_set(e, 400, "messages", "messages[%zu].tool_calls[%zu] needs function.name "
                          "and function.arguments (a JSON object, or its text)", i, k);
            return NULL;
        }
        json_array_append_new(out, json_pack("{s:O?, s:s, s:{s:O, s:o}}", "id", id, "type",
                                             "function", "function", "name", n, "arguments",
                                             args));
    }
    return out;
}

/* The length of the longest proper suffix of text[0..n) that begins tag. */
static size_t partial_tag(const char *text, size_t n, const char *tag)
{
    const size_t lt = strlen(tag);
    for (size_t k = lt - 1 < n ? lt - 1 : n; k > 0; k--)
        if (!memcmp(text + n - k, tag, k))
            return k;
    return 0;
}

size_t srv_tools_stream_safe(const char *text, size_t n, int *hold)
{
    const char *f = skip_space(text, text + n);
    if (f == text + n)
        return 0; /* only space so far: it may be all the content a call leaves */
    const size_t lp = sizeof PYTHON_TAG - 1, rest = (size_t)(text + n - f);
    if (*f == '{' || !memcmp(f, PYTHON_TAG, rest < lp ? rest : lp)) {
        *hold = *f == '{' || rest >= lp; /* a Llama 3 call is the whole reply */
        return 0;
    }
    const char *o = memmem(text, n, OPEN_TAG, sizeof OPEN_TAG - 1);
    const char *m = memmem(text, n, MISTRAL_TAG, sizeof MISTRAL_TAG - 1);
    const char *first = o && m ? (o < m ? o : m) : o ? o : m;
    size_t safe;
    if (first) {
        *hold = 1;
        safe = (size_t)(first - text);
    } else {
        const size_t a = partial_tag(text, n, OPEN_TAG), b = partial_tag(text, n, MISTRAL_TAG);
        safe = n - (a > b ? a : b);
    }
    return all_space(text, safe) ? 0 : safe;
}
