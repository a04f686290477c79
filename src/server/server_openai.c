/* server_openai.c - validation of OpenAI completion/chat request bodies.
 *
 * Invariants: on success every engine_request field is in range
 * (sampler_params_check passes, 1 <= n <= ENGINE_MAX_N, 1 <= max_tokens,
 * n_prompt + max_tokens <= max_model_len, token ids in [0, n_vocab)).
 * Every field is implemented here or listed in server_fields.c (accepted
 * without effect, or refused); unknown fields are a 400 naming them unless
 * --allow-unknown-fields.  Known fields with the wrong JSON type or out of
 * OpenAI's ranges are a 400 naming the field; null is the field's absence.
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
#define SRV_MAX_PROMPTS 128       /* prompts in one /v1/completions list (docs/SERVER.md) */
#define SRV_TEMPERATURE_MAX 2.0   /* OpenAI's range is [0, 2] */
#define SRV_LOGIT_BIAS_MAX 100.0  /* |bias|; -100 bans the token */

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
    if ((rc = get_num(o, "temperature", 0, SRV_TEMPERATURE_MAX, 0, &d, e)) < 0)
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

/* A token id as logit_bias writes it: canonical decimal ("0", "42"; no
 * sign, no leading zero); -1 otherwise. */
static int64_t bias_token(const char *k)
{
    size_t n = strlen(k);
    if (n == 0 || n > 10 || (n > 1 && k[0] == '0'))
        return -1;
    int64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (k[i] < '0' || k[i] > '9')
            return -1;
        x = x * 10 + (k[i] - '0');
    }
    return x;
}

/* logit_bias: {"token id": bias in [-100, 100]}, at most SAMPLER_MAX_LOGIT_BIAS. */
static int parse_logit_bias(const srv_oai_ctx *ctx, json_t *o, sampler_params *sp, srv_error *e)
{
    json_t *lb = json_object_get(o, "logit_bias"), *v;
    const char *k;
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb))
        return srv_error_set(e, 400, "logit_bias", "'logit_bias' must be an object mapping "
                             "token ids (strings) to numbers in [-100, 100]");
    if (json_object_size(lb) > SAMPLER_MAX_LOGIT_BIAS)
        return srv_error_set(e, 400, "logit_bias", "'logit_bias' has %zu entries (at most %d)",
                             json_object_size(lb), SAMPLER_MAX_LOGIT_BIAS);
    int32_t nv = tok_n_vocab(ctx->m->tok);
    json_object_foreach(lb, k, v) {
        int64_t id = bias_token(k);
        if (id < 0 || id >= nv)
            return srv_error_set(e, 400, "logit_bias", "'logit_bias' key '%.32s' is not a "
                                 "token id in [0, %d)", k, nv);
        double b = json_is_number(v) ? json_number_value(v) : NAN;
        if (!(b >= -SRV_LOGIT_BIAS_MAX && b <= SRV_LOGIT_BIAS_MAX))
            return srv_error_set(e, 400, "logit_bias", "'logit_bias' value for token %lld must "
                                 "be a number in [-100, 100]", (long long)id);
        sp->logit_bias[sp->n_logit_bias++] = (sampler_bias){(int32_t)id, (float)b};
    }
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

/* Appends one prompt's ids to r->tokens and its end to r->prompt_off. */
static int prompt_push(srv_gen_req *r, const int32_t *ids, int64_t n, srv_error *e)
{
    int64_t at = r->prompt_off ? r->prompt_off[r->n_prompts] : 0;
    int32_t *t = realloc(r->tokens, (size_t)(at + n) * sizeof *t);
    int64_t *off = realloc(r->prompt_off, (size_t)(r->n_prompts + 2) * sizeof *off);
    if (t)
        r->tokens = t;
    if (off)
        r->prompt_off = off;
    if (!t || !off)
        return srv_error_set(e, 500, NULL, "out of memory");
    if (r->n_prompts == 0)
        off[0] = 0;
    memcpy(t + at, ids, (size_t)n * sizeof *t);
    off[++r->n_prompts] = at + n;
    return 0;
}

/* Encodes text and appends it as a prompt (prompt_push).  Text too long to
 * fit the context whatever its tokens (more bytes than max_model_len of the
 * longest token piece) is refused before tokenizing, so a body at
 * --max-body costs a JSON parse, not a tokenization (docs/SERVER.md
 * "Limits"). */
static int encode(const srv_oai_ctx *ctx, const char *param, const char *text, size_t len,
                  int special, srv_gen_req *r, srv_error *e)
{
    const model *m = ctx->m;
    if (ctx->max_piece_bytes > 0 &&
        len / (size_t)ctx->max_piece_bytes > (size_t)ctx->max_model_len)
        return srv_error_set(e, 400, param, "the %s has %zu bytes: more than %lld tokens "
                             "(the context) whatever its tokens", param, len,
                             (long long)ctx->max_model_len);
    kvant_err ke = {0};
    int add_bos = tok_add_bos(m->tok);
    int64_t n = tok_encode(m->tok, text, len, add_bos, special, NULL, 0, &ke);
    if (n < 0)
        return srv_error_set(e, 400, param, "cannot tokenize the %s: %s", param, ke.msg);
    if (n == 0)
        return srv_error_set(e, 400, param, "the %s is empty", param);
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    if (!ids)
        return srv_error_set(e, 500, NULL, "out of memory tokenizing the %s", param);
    n = tok_encode(m->tok, text, len, add_bos, special, ids, n, &ke);
    int rc = n <= 0 ? srv_error_set(e, 400, param, "cannot tokenize the %s: %s", param, ke.msg)
                    : prompt_push(r, ids, n, e);
    free(ids);
    return rc;
}

/* One prompt given as token ids (p: a JSON array), appended. */
static int prompt_ids(const srv_oai_ctx *ctx, const char *param, json_t *p, size_t k,
                      srv_gen_req *r, srv_error *e)
{
    size_t n = json_array_size(p);
    if (n == 0 || n > SRV_MAX_PROMPT_IDS)
        return srv_error_set(e, 400, param, "'%s' token array %zu has %zu entries", param, k,
                             n);
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids)
        return srv_error_set(e, 500, NULL, "out of memory");
    int32_t nv = tok_n_vocab(ctx->m->tok);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *t = json_array_get(p, i);
        json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
        if (!json_is_integer(t))
            rc = srv_error_set(e, 400, param, "'%s' must be a string, an array of token "
                               "ids, or a list of either (entry %zu is not an integer)", param,
                               i);
        else if (id < 0 || id >= nv)
            rc = srv_error_set(e, 400, param, "token id %lld at %zu is outside [0, %d)",
                               (long long)id, i, nv);
        else
            ids[i] = (int32_t)id;
    }
    if (!rc)
        rc = prompt_push(r, ids, (int64_t)n, e);
    free(ids);
    return rc;
}

int srv_oai_parse_prompts(const srv_oai_ctx *ctx, json_t *p, const char *param, int max_list,
                          srv_gen_req *r, srv_error *e)
{
    if (!p || json_is_null(p))
        return srv_error_set(e, 400, param, "'%s' is required", param);
    if (json_is_string(p))
        return encode(ctx, param, json_string_value(p), json_string_length(p), 0, r, e);
    if (!json_is_array(p) || json_array_size(p) == 0)
        return srv_error_set(e, 400, param, "'%s' must be a string, an array of token "
                             "ids, or a non-empty list of either", param);
    json_t *p0 = json_array_get(p, 0);
    if (!json_is_string(p0) && !json_is_array(p0))
        return prompt_ids(ctx, param, p, 0, r, e);
    size_t n = json_array_size(p);
    if (n > (size_t)max_list)
        return srv_error_set(e, 400, param, "'%s' lists %zu inputs: at most %d in one "
                             "request", param, n, max_list);
    for (size_t k = 0; k < n; k++) {
        json_t *pk = json_array_get(p, k);
        int rc = json_is_string(pk) && json_is_string(p0)
                     ? encode(ctx, param, json_string_value(pk), json_string_length(pk), 0, r,
                              e)
                 : json_is_array(pk) && json_is_array(p0)
                     ? prompt_ids(ctx, param, pk, k, r, e)
                     : srv_error_set(e, 400, param, "'%s' lists must hold only strings "
                                     "or only token-id arrays (entry %zu differs)", param, k);
        if (rc)
            return rc;
    }
    return 0;
}

/* "prompt": a string, an array of token ids, or a list of up to
 * SRV_MAX_PROMPTS strings or token-id arrays (one engine request each). */
static int parse_prompt(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    return srv_oai_parse_prompts(ctx, json_object_get(o, "prompt"), "prompt", SRV_MAX_PROMPTS,
                                 r, e);
}

/* Message content: a string, or an array of {"type":"text","text":...}
 * parts (concatenated into *buf). */
static const char *msg_content(json_t *c, size_t i, const srv_fields_policy *pol, srv_buf *buf,
                               srv_error *e)
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
        if (srv_fields_check_part(part, i, k, pol, e))
            return NULL;
        if (srv_buf_append(buf, json_string_value(tx), json_string_length(tx))) {
            srv_error_set(e, 500, NULL, "out of memory");
            return NULL;
        }
    }
    return buf->s;
}

/* messages[i]'s role as the chat template knows it ("developer" is OpenAI's
 * newer name for "system"); NULL with e filled when kvant has no such role. */
static const char *msg_role(json_t *msg, size_t i, srv_error *e)
{
    json_t *role = json_object_get(msg, "role");
    if (!json_is_object(msg) || !json_is_string(role)) {
        srv_error_set(e, 400, "messages", "messages[%zu] needs a string 'role'", i);
        return NULL;
    }
    const char *rs = json_string_value(role);
    if (!strcmp(rs, "system") || !strcmp(rs, "user") || !strcmp(rs, "assistant") ||
        !strcmp(rs, "tool"))
        return rs;
    if (!strcmp(rs, "developer"))
        return "system";
    if (!strcmp(rs, "function"))
        srv_error_set(e, 400, "messages", "messages[%zu].role 'function' is the legacy "
                      "function-calling role: send 'tool' messages", i);
    else
        srv_error_set(e, 400, "messages", "messages[%zu].role '%.32s' is not system, developer, "
                      "user, assistant or tool", i, rs);
    return NULL;
}

/* messages[i] as the chat template sees it: role (developer as system),
 * content (parts concatenated; null: ""), and for tool calling the
 * assistant's tool_calls (arguments as objects) and a tool result's
 * tool_call_id.  A new reference, or NULL with e filled. */
static json_t *msg_json(json_t *msg, size_t i, const srv_fields_policy *pol, srv_error *e)
{
    const char *role = msg_role(msg, i, e), *content = "";
    if (!role || srv_fields_check_message(msg, i, pol, e))
        return NULL;
    json_t *c = json_object_get(msg, "content"), *calls = json_object_get(msg, "tool_calls");
    json_t *tid = json_object_get(msg, "tool_call_id");
    int has_calls = calls && !json_is_null(calls);
    if (has_calls && strcmp(role, "assistant")) {
        srv_error_set(e, 400, "messages", "messages[%zu].tool_calls: only assistant messages "
                      "make tool calls", i);
        return NULL;
    }
    if (tid && !json_is_null(tid) && (strcmp(role, "tool") || !json_is_string(tid))) {
        srv_error_set(e, 400, "messages", "messages[%zu].tool_call_id: a string, on tool "
                      "messages", i);
        return NULL;
    }
    srv_buf part = {0};
    if (c && !json_is_null(c))
        content = msg_content(c, i, pol, &part, e);
    else if (!has_calls) /* only an assistant's tool calls may come without content */
        content = msg_content(c, i, pol, &part, e);
    json_t *o = content ? json_pack("{s:s, s:s}", "role", role, "content", content) : NULL;
    srv_buf_free(&part);
    if (content && !o)
        srv_error_set(e, 400, "messages", "messages[%zu] is not valid UTF-8", i);
    if (o && has_calls) {
        json_t *tc = srv_tools_msg_calls(calls, i, e);
        if (!tc) {
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, "tool_calls", tc);
    }
    if (o && json_is_string(tid))
        json_object_set(o, "tool_call_id", tid);
    return o;
}

static int parse_messages(const srv_oai_ctx *ctx, const srv_fields_policy *pol, json_t *o,
                          srv_gen_req *r, srv_error *e)
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
    json_t *arr = json_array();
    int rc = !arr ? srv_error_set(e, 500, NULL, "out of memory") : 0;
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *mj = msg_json(json_array_get(ms, i), i, pol, e);
        if (!mj || json_array_append_new(arr, mj))
            rc = -e->status;
    }
    char *text = NULL;
    if (!rc) {
        kvant_err ke = {0};
        text = chat_render_json(&m->chat, arr, r->tools.tools, 1, &ke);
        if (!text)
            rc = srv_error_set(e, 400, "messages", "chat template: %s", ke.msg);
    }
    if (!rc)
        rc = encode(ctx, "messages", text, strlen(text), 1, r, e);
    free(text);
    json_decref(arr);
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

/* stream, and stream_options {include_usage, continuous_usage_stats (vLLM's:
 * the usage so far in every chunk)} (only with stream: true, as OpenAI and
 * vLLM answer). */
static int parse_stream(json_t *o, const srv_fields_policy *pol, srv_gen_req *r, srv_error *e)
{
    int rc;
    if ((rc = get_bool(o, "stream", &r->stream, e)) < 0)
        return rc;
    json_t *so = json_object_get(o, "stream_options"), *v;
    if (!so || json_is_null(so))
        return 0;
    if (!json_is_object(so))
        return srv_error_set(e, 400, "stream_options", "'stream_options' must be an object");
    if (!r->stream)
        return srv_error_set(e, 400, "stream_options", "'stream_options' is only allowed with "
                             "'stream': true");
    const char *k;
    json_object_foreach(so, k, v) {
        char param[64];
        snprintf(param, sizeof param, "stream_options.%.40s", k);
        if (strcmp(k, "include_usage") && strcmp(k, "continuous_usage_stats") &&
            !json_is_null(v) &&
            (rc = srv_fields_unknown(pol, param, e))) {
            snprintf(e->param, sizeof e->param, "stream_options");
            return rc;
        }
    }
    if ((rc = get_bool(so, "include_usage", &r->include_usage, e)) < 0)
        return srv_error_set(e, 400, "stream_options", "'stream_options.include_usage' must be "
                             "a boolean");
    if ((rc = get_bool(so, "continuous_usage_stats", &r->continuous_usage, e)) < 0)
        return srv_error_set(e, 400, "stream_options", "'stream_options.continuous_usage_stats' "
                             "must be a boolean");
    return 0;
}

static int parse_lengths(const srv_oai_ctx *ctx, json_t *o, srv_gen_req *r, srv_error *e)
{
    int64_t mt = 0, mct = 0, x = 0, lo = r->echo ? 0 : 1; /* echo: 0 = the prompt alone */
    int rc = get_int(o, "max_tokens", lo, INT64_MAX, &mt, e);
    if (rc < 0)
        return rc;
    int rc2 = get_int(o, "max_completion_tokens", lo, INT64_MAX, &mct, e);
    if (rc2 < 0)
        return rc2;
    if (rc && rc2 && mt != mct)
        return srv_error_set(e, 400, "max_completion_tokens", "'max_tokens' (%lld) and "
                             "'max_completion_tokens' (%lld) differ: send one of them",
                             (long long)mt, (long long)mct);
    if (rc2 && !rc) {
        mt = mct;
        rc = rc2;
    }
    int64_t room = ctx->max_model_len - r->er.n_prompt; /* n_prompt: the longest prompt */
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
    r->max_tokens_zero = mt == 0;
    r->er.max_tokens = mt == 0 ? 1 : mt; /* the engine samples one token: dropped */
    r->er.prompt_logprobs = r->echo && r->logprobs;
    if ((rc = get_int(o, "n", 1, ENGINE_MAX_N, &x, e)) < 0)
        return rc;
    r->er.n = rc ? (int32_t)x : 1;
    if ((rc = get_int(o, "priority", INT32_MIN, INT32_MAX, &x, e)) < 0)
        return rc;
    r->er.priority = rc ? (int32_t)x : 0;
    int spec = 1;
    if (get_bool(o, "speculative", &spec, e) < 0)
        return -e->status;
    r->er.no_spec = !spec;
    return get_bool(o, "ignore_eos", &r->er.ignore_eos, e) < 0 ? -e->status : 0;
}

/* kv_budget (tokens, or a fraction of the context in (0, 1)), kv_policy
 * ("sinks", "snapkv", "h2o", or "full": none, whatever --kv-budget says), kv_sinks. */
static int parse_kv_budget(json_t *o, engine_request *er, srv_error *e)
{
    json_t *p = json_object_get(o, "kv_policy");
    if (p && !json_is_null(p)) {
        const char *v = json_is_string(p) ? json_string_value(p) : "";
        const int32_t pol = engine_kv_policy_parse(v);
        if (pol < 0)
            return srv_error_set(e, 400, "kv_policy", "'kv_policy' must be 'sinks', 'snapkv', "
                                 "'h2o' or 'full'");
        er->kv_policy = pol;
    }
    double b = 0.0;
    int rc = get_num(o, "kv_budget", 0.0, 1e12, 1, &b, e);
    if (rc < 0)
        return rc;
    if (rc && b >= 1.0 && b != floor(b))
        return srv_error_set(e, 400, "kv_budget", "'kv_budget' must be a whole number of tokens "
                             "or a fraction of the context in (0, 1)");
    er->kv_budget = b;
    int64_t x = 0;
    if ((rc = get_int(o, "kv_sinks", 1, 1 << 20, &x, e)) < 0)
        return rc;
    er->kv_sinks = (int32_t)x;
    return 0;
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static int parse_body(const srv_oai_ctx *ctx, const srv_fields_policy *pol, json_t *o,
                      srv_gen_req *r, srv_error *e)
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
    if ((rc = srv_fields_check(o, r->api == SRV_API_CHAT, pol, e)))
        return rc;
    for (const char *const *k = (const char *const[]){"suffix", "best_of", NULL}; *k; k++) {
        json_t *v = json_object_get(o, *k);
        if (v && !json_is_null(v) && !json_is_false(v) &&
            !(json_is_integer(v) && json_integer_value(v) == 1) &&
            !(json_is_string(v) && json_string_length(v) == 0))
            return srv_error_set(e, 400, *k, "'%s' is not supported", *k);
    }
    if (r->api == SRV_API_COMPLETIONS && get_bool(o, "echo", &r->echo, e) < 0)
        return -e->status;
    if ((rc = parse_stream(o, pol, r, e)) || (rc = parse_stop(o, &r->stops, e)) ||
        (rc = parse_logit_bias(ctx, o, &r->er.sampling, e)) ||
        (rc = parse_sampling(o, &r->er.sampling, e)) || (rc = parse_logprobs(r->api, o, r, e)))
        return rc;
    json_t *salt = json_object_get(o, "cache_salt");
    if (salt && !json_is_null(salt)) {
        if (!json_is_string(salt))
            return srv_error_set(e, 400, "cache_salt", "'cache_salt' must be a string");
        r->er.cache_salt = fnv1a(json_string_value(salt), json_string_length(salt));
    }
    if ((rc = parse_kv_budget(o, &r->er, e)) ||
        (rc = srv_constraint_parse(o, ctx->grammar_max_bytes, &r->cons, e)))
        return rc;
    if (r->api == SRV_API_CHAT &&
        (rc = srv_tools_parse(o, ctx->grammar_max_bytes, &r->tools, &r->cons, e)))
        return rc;
    rc = r->api == SRV_API_CHAT ? parse_messages(ctx, pol, o, r, e) : parse_prompt(ctx, o, r, e);
    if (rc)
        return rc;
    r->er.prompt = r->tokens;
    r->er.n_prompt = 0;
    for (int32_t k = 0; k < r->n_prompts; k++) {
        int64_t nk = r->prompt_off[k + 1] - r->prompt_off[k];
        r->er.n_prompt = nk > r->er.n_prompt ? nk : r->er.n_prompt;
    }
    return parse_lengths(ctx, o, r, e);
}

int srv_oai_parse(const srv_oai_ctx *ctx, srv_api api, const char *body, size_t len,
                  const char *request_id, srv_gen_req *out, srv_error *e)
{
    srv_fields_policy pol = {ctx->allow_unknown, ctx->unknown_log, request_id};
    memset(out, 0, sizeof *out);
    out->cons.kind = -1;
    out->api = api;
    out->er.sampling = sampler_params_default();
    out->er.n = 1;
    json_t *o = srv_oai_load_object(body, len, e);
    if (!o)
        return -e->status;
    int rc = parse_body(ctx, &pol, o, out, e);
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
    free(r->prompt_off);
    srv_constraint_free(&r->cons);
    srv_tools_free(&r->tools);
    r->tokens = NULL;
    r->prompt_off = NULL;
    r->n_prompts = 0;
    r->er.prompt = NULL;
}

engine_request srv_gen_req_prompt(const srv_gen_req *r, int32_t k)
{
    engine_request er = r->er;
    er.prompt = r->tokens + r->prompt_off[k];
    er.n_prompt = r->prompt_off[k + 1] - r->prompt_off[k];
    return er;
}
