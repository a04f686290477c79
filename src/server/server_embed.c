/* server_embed.c - POST /v1/embeddings: every input one engine request with
 * `embed` set (the prompt's final hidden state after the output norm,
 * pooled by --embedding-pooling, L2-normalised on the engine thread), the
 * answer as OpenAI's embeddings list, floats or base64 of little-endian
 * float32.
 *
 * Invariants: every input is validated before any is submitted; once some
 * are submitted the HTTP thread waits for the final event of each (a
 * departed client cancels them first), so the waiters outlive every
 * callback.  The callback (engine thread) copies the vector and allocates
 * nothing.
 */
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"
#include "server/server_reply.h"
#include "text/tokenizer.h"

#define SRV_MAX_EMBED_INPUTS 2048 /* inputs in one request (OpenAI's bound) */
#define EMBED_WAIT_MS 100         /* wait slice; disconnect checks between */

typedef struct emb_batch emb_batch;

typedef struct emb_item {
    emb_batch *b;
    int32_t *ids;           /* owned */
    int64_t n_ids;
    int64_t rid;            /* > 0 once submitted */
    float *vec;             /* [n_embd], owned; filled by the EMBED event */
    int got, final, failed;
} emb_item;

struct emb_batch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int n_final;            /* items whose final event came (mu) */
    char err[256];
    emb_item *it;           /* [cap] (calloc'd: a failed parse leaves NULLs) */
    int n, cap;
    int32_t n_embd;
};

static void emb_on_event(void *ctx, const engine_event *ev)
{
    emb_item *it = ctx;
    emb_batch *b = it->b;
    pthread_mutex_lock(&b->mu);
    if (ev->type == ENGINE_EV_EMBED && ev->n_embd == b->n_embd) {
        memcpy(it->vec, ev->embedding, (size_t)b->n_embd * sizeof(float));
        it->got = 1;
    } else if (ev->type == ENGINE_EV_ERROR || ev->type == ENGINE_EV_DONE) {
        if (ev->type == ENGINE_EV_ERROR) {
            it->failed = 1;
            if (!b->err[0])
                snprintf(b->err, sizeof b->err, "%s", ev->error ? ev->error : "failed");
        }
        it->final = 1;
        b->n_final++;
        pthread_cond_broadcast(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
}

/* Appends input k (a string or an array of token ids) as an item. */
static int add_input(srv *s, emb_batch *b, json_t *v, size_t k, srv_error *e)
{
    emb_item *it = &b->it[b->n];
    int32_t nv = tok_n_vocab(s->m->tok);
    if (json_is_string(v)) {
        kvant_err ke = {0};
        const char *t = json_string_value(v);
        size_t len = json_string_length(v);
        int64_t n = tok_encode(s->m->tok, t, len, tok_add_bos(s->m->tok), 0, NULL, 0, &ke);
        if (n <= 0)
            return srv_error_set(e, 400, "input", "input %zu: %s", k,
                                 n < 0 ? ke.msg : "the input is empty");
        if (n >= s->oai.max_model_len)
            return srv_error_set(e, 400, "input", "input %zu has %lld tokens; the context is "
                                 "%lld", k, (long long)n, (long long)s->oai.max_model_len);
        if (!(it->ids = malloc((size_t)n * sizeof *it->ids)))
            return srv_error_set(e, 500, NULL, "out of memory");
        it->n_ids = tok_encode(s->m->tok, t, len, tok_add_bos(s->m->tok), 0, it->ids, n, &ke);
    } else {
        size_t n = json_array_size(v);
        if (n == 0 || (int64_t)n >= s->oai.max_model_len)
            return srv_error_set(e, 400, "input", "input %zu has %zu token ids (1 to %lld)", k,
                                 n, (long long)s->oai.max_model_len - 1);
        if (!(it->ids = malloc(n * sizeof *it->ids)))
            return srv_error_set(e, 500, NULL, "out of memory");
        for (size_t i = 0; i < n; i++) {
            json_t *t = json_array_get(v, i);
            json_int_t id = json_is_integer(t) ? json_integer_value(t) : -1;
            if (id < 0 || id >= nv)
                return srv_error_set(e, 400, "input", "input %zu: entry %zu is not a token id "
                                     "in [0, %d)", k, i, nv);
            it->ids[i] = (int32_t)id;
        }
        it->n_ids = (int64_t)n;
    }
    if (it->n_ids <= 0)
        return srv_error_set(e, 400, "input", "input %zu cannot be tokenized", k);
    if (!(it->vec = calloc((size_t)b->n_embd, sizeof *it->vec)))
        return srv_error_set(e, 500, NULL, "out of memory");
    it->b = b;
    b->n++;
    return 0;
}

/* "input": a string, a list of strings, an array of token ids, or a list
 * of those arrays; the other fields checked. *base64: encoding_format. */
static int parse_embed(srv *s, json_t *o, emb_batch *b, int *base64, srv_error *e)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (json_is_null(v) || !strcmp(key, "input") || !strcmp(key, "model") ||
            !strcmp(key, "encoding_format") || !strcmp(key, "user"))
            continue;
        if (!strcmp(key, "dimensions"))
            return srv_error_set(e, 400, "dimensions", "'dimensions' is not supported: the "
                                 "model's embeddings have %d dimensions", b->n_embd);
        if (!s->cfg.allow_unknown_fields)
            return srv_error_set(e, 400, key, "unknown field '%.64s'", key);
    }
    json_t *m = json_object_get(o, "model");
    if (m && !json_is_null(m) &&
        (!json_is_string(m) || strcmp(json_string_value(m), s->served_name))) {
        srv_error_set(e, 404, "model", "the model '%.200s' does not exist (serving '%.200s')",
                      json_is_string(m) ? json_string_value(m) : "?", s->served_name);
        e->code = "model_not_found";
        return -404;
    }
    json_t *u = json_object_get(o, "user");
    if (u && !json_is_null(u) && !json_is_string(u))
        return srv_error_set(e, 400, "user", "'user' must be a string");
    json_t *f = json_object_get(o, "encoding_format");
    *base64 = 0;
    if (f && !json_is_null(f)) {
        if (!json_is_string(f) || (strcmp(json_string_value(f), "float") &&
                                   strcmp(json_string_value(f), "base64")))
            return srv_error_set(e, 400, "encoding_format",
                                 "'encoding_format' must be \"float\" or \"base64\"");
        *base64 = !strcmp(json_string_value(f), "base64");
    }
    json_t *in = json_object_get(o, "input");
    if (!in || json_is_null(in))
        return srv_error_set(e, 400, "input", "'input' is required");
    json_t *one[1] = {in};
    int list = json_is_array(in) && json_array_size(in) > 0 &&
               (json_is_string(json_array_get(in, 0)) || json_is_array(json_array_get(in, 0)));
    size_t n = list ? json_array_size(in) : 1;
    if (!json_is_string(in) && !json_is_array(in))
        return srv_error_set(e, 400, "input", "'input' must be a string, an array of token "
                             "ids, or a list of either");
    if (n > SRV_MAX_EMBED_INPUTS)
        return srv_error_set(e, 400, "input", "'input' lists %zu inputs: at most %d", n,
                             SRV_MAX_EMBED_INPUTS);
    if (!(b->it = calloc(n, sizeof *b->it)))
        return srv_error_set(e, 500, NULL, "out of memory");
    b->cap = (int)n;
    for (size_t k = 0; k < n; k++) {
        json_t *x = list ? json_array_get(in, k) : one[0];
        if (list && !(json_is_string(x) ? json_is_string(json_array_get(in, 0))
                                        : json_is_array(x) && json_is_array(json_array_get(in, 0))))
            return srv_error_set(e, 400, "input", "'input' lists must hold only strings or "
                                 "only token-id arrays (entry %zu differs)", k);
        int rc = add_input(s, b, x, k, e);
        if (rc)
            return rc;
    }
    return 0;
}

static char *base64_f32(const float *v, int32_t n)
{
    static const char tab[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t len = (size_t)n * 4, olen = (len + 2) / 3 * 4;
    const unsigned char *p = (const unsigned char *)v; /* x86-64 and arm64: little-endian */
    char *o = malloc(olen + 1);
    if (!o)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < len ? (uint32_t)p[i + 1] << 8 : 0) |
                     (i + 2 < len ? p[i + 2] : 0);
        o[j++] = tab[w >> 18 & 63];
        o[j++] = tab[w >> 12 & 63];
        o[j++] = i + 1 < len ? tab[w >> 6 & 63] : '=';
        o[j++] = i + 2 < len ? tab[w & 63] : '=';
    }
    o[j] = '\0';
    return o;
}

static enum MHD_Result send_embeddings(srv *s, struct MHD_Connection *c, emb_batch *b,
                                       int base64)
{
    json_t *data = json_array();
    int64_t tokens = 0;
    for (int k = 0; k < b->n; k++) {
        emb_item *it = &b->it[k];
        tokens += it->n_ids;
        json_t *vec;
        if (base64) {
            char *s64 = base64_f32(it->vec, b->n_embd);
            vec = s64 ? json_string(s64) : NULL;
            free(s64);
        } else {
            vec = json_array();
            for (int32_t i = 0; vec && i < b->n_embd; i++)
                json_array_append_new(vec, json_real(it->vec[i]));
        }
        json_array_append_new(data, json_pack("{s:s, s:i, s:o*}", "object", "embedding",
                                              "index", k, "embedding", vec));
    }
    json_t *o = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data,
                          "model", s->served_name, "usage", "prompt_tokens",
                          (json_int_t)tokens, "total_tokens", (json_int_t)tokens);
    char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!body) {
        srv_error er;
        srv_error_set(&er, 500, NULL, "out of memory building the response");
        return srv_send_error(c, &er);
    }
    return srv_send_json(c, 200, body);
}

/* Submits every item, then waits for all their final events; a departed
 * client (fd) cancels them first.  Returns 0, or the first submit status. */
static int run_batch(srv *s, emb_batch *b, int fd, kvant_err *ke, int *gone)
{
    int rc = 0, submitted = 0;
    for (int k = 0; k < b->n && !rc; k++) {
        engine_request er = {.prompt = b->it[k].ids, .n_prompt = b->it[k].n_ids,
                             .sampling = sampler_params_default(), .max_tokens = 1, .n = 1,
                             .embed = s->cfg.embedding_pooling, .ignore_eos = 1};
        int64_t rid = engine_submit(s->e, &er, emb_on_event, &b->it[k], ke);
        if (rid <= 0)
            rc = (int)rid;
        else {
            b->it[k].rid = rid;
            submitted++;
        }
    }
    *gone = 0;
    int cancelled = 0;
    pthread_mutex_lock(&b->mu);
    while (b->n_final < submitted) {
        if (rc || *gone) { /* stop the rest of the work, once */
            if (!cancelled)
                for (int k = 0; k < b->n; k++)
                    if (b->it[k].rid > 0 && !b->it[k].final)
                        engine_cancel(s->e, b->it[k].rid);
            cancelled = 1;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += EMBED_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
        struct pollfd p = {.fd = fd, .events = POLLRDHUP};
        if (fd >= 0 && poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
            *gone = 1;
    }
    pthread_mutex_unlock(&b->mu);
    return rc;
}

static void batch_free(emb_batch *b)
{
    for (int k = 0; b->it && k < b->cap; k++) {
        free(b->it[k].ids);
        free(b->it[k].vec);
    }
    free(b->it);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
}

enum MHD_Result srv_embed_handle(srv *s, struct MHD_Connection *c, const char *body, size_t len)
{
    srv_error er;
    if (s->reg) {
        srv_error_set(&er, 501, NULL, "/v1/embeddings is not implemented with several models "
                      "yet (serve one model)");
        return srv_send_error(c, &er);
    }
    json_t *o = srv_oai_load_object(body, len, &er);
    if (!o)
        return srv_send_error(c, &er);
    emb_batch b = {.n_embd = s->m->hp.n_embd};
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    int base64 = 0;
    int rc = parse_embed(s, o, &b, &base64, &er);
    json_decref(o);
    if (rc) {
        batch_free(&b);
        return srv_send_error(c, &er);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    kvant_err ke = {0};
    int gone = 0;
    rc = run_batch(s, &b, ci ? ci->connect_fd : -1, &ke, &gone);
    enum MHD_Result res;
    int failed = 0;
    for (int k = 0; k < b.n; k++)
        failed |= b.it[k].failed || !b.it[k].got;
    if (gone) {
        res = MHD_NO; /* closes the connection */
    } else if (rc) {
        int busy = rc == KV_EBUSY;
        srv_error_set(&er, busy ? 503 : rc == KV_EINVAL || rc == KV_ERANGE ? 400 : 500,
                      busy ? NULL : "input", "%s", ke.msg[0] ? ke.msg : kvant_status_str(rc));
        if (busy)
            er.code = "server_overloaded";
        res = busy ? srv_send_error_retry(c, &er, "1", 0) : srv_send_error(c, &er);
    } else if (failed) {
        srv_error_set(&er, 500, NULL, "%s", b.err[0] ? b.err : "embedding failed");
        res = srv_send_error(c, &er);
    } else {
        res = send_embeddings(s, c, &b, base64);
    }
    batch_free(&b);
    return res;
}
