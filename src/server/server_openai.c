/* server_openai.c - validation of OpenAI completion/chat request bodies.
 *
 * Invariants: on success every engine_request field is in range
 * (sampler_params_check passes, 1 <= n <= ENGINE_MAX_N, 1 <= max_tokens,
 * n_prompt + max_tokens <= max_model_len, token ids in [0, n_vocab)).
 * Unknown fields are ignored (clients send many); known fields with the
 * wrong JSON type are a 400 naming the field.
 */
#include "server/server_openai.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/chat.h"
#include "text/sampler.h"
#include "text/tokenizer.h"

#define SRV_MAX_MESSAGES 4096
#define SRV_MAX_PROMPT_IDS (1 << 22)

int srv_error_set(srv_error *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    e->code = NULL;
    switch (status) {
    case 401: e->type = "authentication_error"; e->code = "invalid_api_key"; break;
    case 404: e->type = "invalid_request_error"; break;
    case 429: e->type = "rate_limit_error"; e->code = "rate_limit_exceeded"; break;
    case 503: e->type = "service_unavailable"; break;
    default: e->type = status >= 500 ? "internal_error" : "invalid_request_error"; break;
    }
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -status;
}

char *srv_error_json(const srv_error *e)
{
    json_t *o = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", e->msg, "type",
                          e->type ? e->type : "invalid_request_error", "param",
                          e->param[0] ? json_string(e->param) : json_null(), "code",
                          e->code ? json_string(e->code) : json_null());
    if (!o)
        return NULL;
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

json_t *srv_oai_load_object(const char *body, size_t len, srv_error *e)
{
    if (len == 0) {
        srv_error_set(e, 400, NULL, "empty request body: expected a JSON object");
        return NULL;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        srv_error_set(e, 400, NULL, "malformed JSON at byte %d: %s", je.position, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        srv_error_set(e, 400, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

/* Field readers: return 0 = absent/null (out untouched), 1 = read,
 * negative = error (e filled). */
static int get_num(json_t *o, const char *k, double lo, double hi, int lo_open, double *out,
                   srv_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v))
        return srv_error_set(e, 400, k, "'%s' must be a number", k);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo))
        return srv_error_set(e, 400, k, "'%s' = %g is out of range %c%g, %g]", k, d,
                             lo_open ? '(' : '[', lo, hi);
    *out = d;
    return 1;
}

static int get_int(json_t *o, const char *k, int64_t lo, int64_t hi, int64_t *out, srv_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_integer(v))
        return srv_error_set(e, 400, k, "'%s' must be an integer", k);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return srv_error_set(e, 400, k, "'%s' = %lld is out of range [%lld, %lld]", k,
                             (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return 1;
}

static int get_bool(json_t *o, const char *k, int *out, srv_error *e)
{
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return srv_error_set(e, 400, k, "'%s' must be a boolean", k);
    *out = json_is_true(v);
    return 1;
}

static int parse_sampling(json_t *o, sampler_params *sp, srv_error *e)
{
    double d;
    int64_t x;
    int rc;
    if ((rc = get_num(o, "temperature", 0, 100, 0, &d, e)) < 0)
        return rc;
    if (rc)
        sp->temperature = (float)d;
    if ((rc = get_num(o, "top_p", 0, 1, 1, &d, e)) < 0)
        return rc;
    if (rc)
        sp->top_p = (float)d;
    if ((rc = get_num(o, "min_p", 0, 1, 0, &d, e)) < 0)
        return rc;
    if (rc)
        sp->min_p = (float)d;
    if ((rc = get_int(o, "top_k", -1, 1 << 24, &x, e)) < 0)
        return rc;
    if (rc)
        sp->top_k = (int32_t)(x < 0 ? 0 : x);
    if ((rc = get_num(o, "presence_penalty", -2, 2, 0, &d, e)) < 0)
        return rc;
    if (rc)
        sp->presence_penalty = (float)d;
    if ((rc = get_num(o, "frequency_penalty", -2, 2, 0, &d, e)) < 0)
        return rc;
    if (rc)
        sp->frequency_penalty = (float)d;
    if ((rc = get_num(o, "repetition_penalty", 0, 100, 1, &d, e)) < 0)
        return rc;
    if (rc)
        sp->repetition_penalty = (float)d;
    if ((rc = get_int(o, "seed", INT64_MIN, INT64_MAX, &x, e)) < 0)
        return rc;
    if (rc)
        sp->seed = (uint64_t)x;
    kvant_err ke = {0};
    if (sampler_params_check(sp, &ke))
        return srv_error_set(e, 400, NULL, "%s", ke.msg);
    return 0;
}

static int parse_stop(json_t *o, srv_stops *st, srv_error *e)
{
    json_t *v = json_object_get(o, "stop");
    st->n = 0;
    if (!v || json_is_null(v))
        return 0;
    json_t *one[1] = {v};
    size_t n = 1;
    if (json_is_array(v)) {
        n = json_array_size(v);
        if (n > SRV_MAX_STOP)
            return srv_error_set(e, 400, "stop", "at most %d stop strings are allowed",
                                 SRV_MAX_STOP);
    } else if (!json_is_string(v)) {
        return srv_error_set(e, 400, "stop", "'stop' must be a string or an array of strings");
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(s))
            return srv_error_set(e, 400, "stop", "'stop' entries must be strings");
        size_t L = json_string_length(s);
        if (L > SRV_MAX_STOP_LEN)
            return srv_error_set(e, 400, "stop", "stop strings are limited to %d bytes",
                                 SRV_MAX_STOP_LEN);
        if (L == 0)
            continue;
        memcpy(st->s[st->n], json_string_value(s), L);
        st->s[st->n][L] = '\0';
        st->len[st->n++] = L;
    }
    return 0;
}

/* Encodes text into a malloc'd id array.  Text too long to fit the context
 * whatever its tokens (more bytes than max_model_len of the longest token
 * piece) is refused before tokenizing, so a body at --max-body costs a JSON
 * parse, not a tokenization (docs/SERVER.md "Limits"). */
static int encode(const srv_oai_ctx *ctx, const char *text, size_t len, int special,
                  srv_gen_req *r, srv_error *e)
{
    const model *m = ctx->m;
    if (ctx->max_piece_bytes > 0 &&
        len / (size_t)ctx->max_piece_bytes > (size_t)ctx->max_model_len)
        return srv_error_set(e, 400, "prompt", "the prompt has %zu bytes: more than %lld tokens "
                             "(the context) whatever its tokens", len,
                             (long long)ctx->max_model_len);
    kvant_err ke = {0};
    int add_bos = tok_add_bos(m->tok);
    int64_t n = tok_encode(m->tok, text, len, add_bos, special, NULL, 0, &ke);
    if (n < 0)
        return srv_error_set(e, 400, "prompt", "cannot tokenize the prompt: %s", ke.msg);
    if (n == 0)
        return srv_error_set(e, 400, "prompt", "the prompt is empty");
    r->tokens = malloc((size_t)n * sizeof *r->tokens);
    if (!r->tokens)
        return srv_error_set(e, 500, NULL, "out of memory tokenizing the prompt");
    n = tok_encode(m->tok, text, len, add_bos, special, r->tokens, n, &ke);
    if (n <= 0)
        return srv_error_set(e, 400, "prompt", "cannot tokenize the prompt: %s", ke.msg);
    r->er.n_prompt = n;
    return 0;
}

static int parse_prompt(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    json_t *p = json_object_get(o, "prompt");
    if (!p)
        return srv_error_set(e, 400, "prompt", "'prompt' is required");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_string(p))
        return encode(ctx, json_string_value(p), json_string_length(p), 0, r, e);
    if (!json_is_array(p))
        return srv_error_set(e, 400, "prompt",
                             "'prompt' must be a string or an array of token ids");
    size_t n = json_array_size(p);
    if (n == 0 || n > SRV_MAX_PROMPT_IDS)
        return srv_error_set(e, 400, "prompt", "'prompt' token array has %zu entries", n);
    r->tokens = malloc(n * sizeof *r->tokens);
    if (!r->tokens)
        return srv_error_set(e, 500, NULL, "out of memory");
    int32_t nv = tok_n_vocab(ctx->m->tok);
    for (size_t i = 0; i < n; i++) {
        json_t *t = json_array_get(p, i);
        if (!json_is_integer(t))
            return srv_error_set(e, 400, "prompt",
                                 "'prompt' must be a string or an array of token ids "
                                 "(entry %zu is not an integer)", i);
        json_int_t id = json_integer_value(t);
        if (id < 0 || id >= nv)
            return srv_error_set(e, 400, "prompt", "token id %lld at %zu is outside [0, %d)",
                                 (long long)id, i, nv);
        r->tokens[i] = (int32_t)id;
    }
    r->er.n_prompt = (int64_t)n;
    return 0;
}

/* Message content: a string, or an array of {"type":"text","text":...}
 * parts (concatenated into *buf). */
static const char *msg_content(json_t *c, size_t i, srv_buf *buf, srv_error *e)
{
    if (json_is_string(c))
        return json_string_value(c);
    if (!json_is_array(c)) {
        srv_error_set(e, 400, "messages", "messages[%zu].content must be a string", i);
        return NULL;
    }
    srv_buf_append(buf, "", 0);
    for (size_t k = 0; k < json_array_size(c); k++) {
        json_t *part = json_array_get(c, k), *ty = json_object_get(part, "type"),
               *tx = json_object_get(part, "text");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "text") || !json_is_string(tx)) {
            srv_error_set(e, 400, "messages", "messages[%zu].content[%zu]: only text parts "
                          "are supported", i, k);
            return NULL;
        }
        if (srv_buf_append(buf, json_string_value(tx), json_string_length(tx))) {
            srv_error_set(e, 500, NULL, "out of memory");
            return NULL;
        }
    }
    return buf->s;
}

static int parse_messages(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    const model *m = ctx->m;
    if (!m->has_chat)
        return srv_error_set(e, 400, "messages", "the model has no usable chat template: %s",
                             m->chat_err);
    json_t *ms = json_object_get(o, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return srv_error_set(e, 400, "messages", "'messages' must be a non-empty array");
    size_t n = json_array_size(ms);
    if (n > SRV_MAX_MESSAGES)
        return srv_error_set(e, 400, "messages", "too many messages (%zu)", n);
    chat_msg *cm = calloc(n, sizeof *cm);
    srv_buf *parts = calloc(n, sizeof *parts);
    int rc = (!cm || !parts) ? srv_error_set(e, 500, NULL, "out of memory") : 0;
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *msg = json_array_get(ms, i), *role = json_object_get(msg, "role");
        if (!json_is_object(msg) || !json_is_string(role)) {
            rc = srv_error_set(e, 400, "messages", "messages[%zu] needs a string 'role'", i);
            break;
        }
        const char *rs = json_string_value(role);
        if (strcmp(rs, "system") && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            rc = srv_error_set(e, 400, "messages", "messages[%zu].role '%.32s' is not system, "
                               "user or assistant", i, rs);
            break;
        }
        cm[i].role = rs;
        if (!(cm[i].content = msg_content(json_object_get(msg, "content"), i, &parts[i], e)))
            rc = -e->status;
    }
    char *text = NULL;
    if (!rc) {
        kvant_err ke = {0};
        text = chat_render(&m->chat, cm, n, 1, &ke);
        if (!text)
            rc = srv_error_set(e, 400, "messages", "chat template: %s", ke.msg);
    }
    if (!rc)
        rc = encode(ctx, text, strlen(text), 1, r, e);
    free(text);
    for (size_t i = 0; parts && i < n; i++)
        srv_buf_free(&parts[i]);
    free(parts);
    free(cm);
    return rc;
}

static int parse_logprobs(srv_api api, json_t *o, srv_gen_req *r, srv_error *e)
{
    int64_t x = 0;
    int rc, b = 0;
    if (api == SRV_API_COMPLETIONS) {
        if ((rc = get_int(o, "logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &x, e)) < 0)
            return rc;
        r->logprobs = rc;
        r->top_logprobs = (int32_t)x;
    } else {
        if ((rc = get_bool(o, "logprobs", &b, e)) < 0)
            return rc;
        r->logprobs = b;
        if ((rc = get_int(o, "top_logprobs", 0, ENGINE_MAX_TOP_LOGPROBS, &x, e)) < 0)
            return rc;
        if (rc && x > 0 && !b)
            return srv_error_set(e, 400, "top_logprobs", "'top_logprobs' requires 'logprobs': true");
        r->top_logprobs = (int32_t)x;
    }
    if (r->logprobs)
        r->er.top_logprobs = r->top_logprobs > 0 ? r->top_logprobs : -1;
    return 0;
}

static int parse_stream(json_t *o, srv_gen_req *r, srv_error *e)
{
    int rc;
    if ((rc = get_bool(o, "stream", &r->stream, e)) < 0)
        return rc;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so))
            return srv_error_set(e, 400, "stream_options", "'stream_options' must be an object");
        if ((rc = get_bool(so, "include_usage", &r->include_usage, e)) < 0)
            return rc;
    }
    return 0;
}

static int parse_lengths(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    int64_t mt = 0, x = 0;
    int rc = get_int(o, "max_tokens", 1, INT64_MAX, &mt, e);
    if (rc < 0)
        return rc;
    if (!rc && (rc = get_int(o, "max_completion_tokens", 1, INT64_MAX, &mt, e)) < 0)
        return rc;
    int64_t room = ctx->max_model_len - r->er.n_prompt;
    if (room < 1)
        return srv_error_set(e, 400, "prompt", "the prompt has %lld tokens; the context is %lld "
                             "tokens and needs room for at least one more",
                             (long long)r->er.n_prompt, (long long)ctx->max_model_len);
    if (rc && mt > room)
        return srv_error_set(e, 400, "max_tokens", "prompt (%lld tokens) + max_tokens (%lld) "
                             "exceeds the context of %lld tokens", (long long)r->er.n_prompt,
                             (long long)mt, (long long)ctx->max_model_len);
    if (!rc)
        mt = r->api == SRV_API_COMPLETIONS ? (room < 16 ? room : 16) : room;
    r->er.max_tokens = mt;
    if ((rc = get_int(o, "n", 1, ENGINE_MAX_N, &x, e)) < 0)
        return rc;
    r->er.n = rc ? (int32_t)x : 1;
    if ((rc = get_int(o, "priority", INT32_MIN, INT32_MAX, &x, e)) < 0)
        return rc;
    r->er.priority = rc ? (int32_t)x : 0;
    return get_bool(o, "ignore_eos", &r->er.ignore_eos, e) < 0 ? -e->status : 0;
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int parse_body(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    json_t *mdl = json_object_get(o, "model");
    if (mdl && !json_is_null(mdl)) {
        if (!json_is_string(mdl))
            return srv_error_set(e, 400, "model", "'model' must be a string");
        if (strcmp(json_string_value(mdl), ctx->served_name)) {
            srv_error_set(e, 404, "model", "the model '%.200s' does not exist (serving '%.200s')",
                          json_string_value(mdl), ctx->served_name);
            e->code = "model_not_found";
            return -404;
        }
    }
    int rc;
    for (const char *const *k = (const char *const[]){"echo", "suffix", "best_of", NULL}; *k; k++) {
        json_t *v = json_object_get(o, *k);
        if (v && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 1) &&
            !(json_is_string(v) && json_string_length(v) == 0))
            return srv_error_set(e, 400, *k, "'%s' is not supported", *k);
    }
    if ((rc = parse_stream(o, r, e)) || (rc = parse_stop(o, &r->stops, e)) ||
        (rc = parse_sampling(o, &r->er.sampling, e)) || (rc = parse_logprobs(r->api, o, r, e)))
        return rc;
    json_t *salt = json_object_get(o, "cache_salt");
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt))
            return srv_error_set(e, 400, "cache_salt", "'cache_salt' must be a string");
        r->er.cache_salt = fnv1a(json_string_value(salt), json_string_length(salt));
    }
    rc = r->api == SRV_API_CHAT ? parse_messages(ctx, o, r, e) : parse_prompt(ctx, o, r, e);
    if (rc)
        return rc;
    r->er.prompt = r->tokens;
    return parse_lengths(ctx, o, r, e);
}

int srv_oai_parse(const srv_oai_ctx *ctx, srv_api api, const char *body, size_t len,
                  srv_gen_req *out, srv_error *e)
{
    memset(out, 0, sizeof *out);
    out->api = api;
    out->er.sampling = sampler_params_default();
    out->er.n = 1;
    json_t *o = srv_oai_load_object(body, len, e);
    if (!o)
        return -e->status;
    int rc = parse_body(ctx, o, out, e);
    json_decref(o);
    if (rc) {
        srv_gen_req_free(out);
        return rc < 0 ? rc : -e->status;
    }
    return KV_OK;
}

void srv_gen_req_free(srv_gen_req *r)
{
    free(r->tokens);
    r->tokens = NULL;
    r->er.prompt = NULL;
}
