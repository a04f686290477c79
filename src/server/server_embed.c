/* server_embed.c - POST /v1/embeddings: every input one engine request with
 * `embed` set (the prompt's final hidden state after the output norm,
 * pooled by --embedding-pooling, L2-normalised on the engine thread), the
 * answer as OpenAI's embeddings list, floats or base64 of little-endian
 * float32.
 *
 * Invariants: every input is validated before any is submitted; once some
 * are submitted the HTTP thread waits for the final event of each (a
 * departed client cancels them first), so the waiters outlive every
 * callback.  The callback (engine thread) copies the vector, allocates
 * nothing, and posts an eventfd on each final event; the HTTP thread polls
 * that eventfd together with its client socket, so a departed client is
 * seen at once (as the completions' channel does, server_stream.c).
 */
#include <jansson.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "server/server_internal.h"
#include "server/server_reply.h"
#include "text/tokenizer.h"

#define SRV_MAX_EMBED_INPUTS 2048 /* inputs in one request (OpenAI's bound) */

typedef struct emb_batch emb_batch;

typedef struct emb_item {
    emb_batch *b;
    const int32_t *ids;     /* borrowed from the batch's parsed inputs */
    int64_t n_ids;
    int64_t rid;            /* > 0 once submitted */
    float *vec;             /* [n_embd], owned; filled by the EMBED event */
    int got, final, failed;
} emb_item;

struct emb_batch {
    pthread_mutex_t mu;
    int efd;                /* eventfd, posted on every final event */
    int n_final;            /* items whose final event came (mu) */
    char err[256];
    srv_gen_req in;         /* the parsed inputs (tokens, prompt_off), owned */
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
        uint64_t one = 1; /* cannot overflow: one post per item, cleared by the waiter */
        ssize_t w = write(b->efd, &one, sizeof one);
        (void)w;
    }
    pthread_mutex_unlock(&b->mu);
}

/* Input k of b->in (parsed by srv_oai_parse_prompts) as an item. */
static int add_input(srv *s, emb_batch *b, int32_t k, srv_error *e)
{
    emb_item *it = &b->it[b->n];
    int64_t at = b->in.prompt_off[k], n = b->in.prompt_off[k + 1] - at;
    if (n >= s->oai.max_model_len)
        return srv_error_set(e, 400, "input", "input %d has %lld tokens; the context is %lld",
                             k, (long long)n, (long long)s->oai.max_model_len);
    if (!(it->vec = calloc((size_t)b->n_embd, sizeof *it->vec)))
        return srv_error_set(e, 500, NULL, "out of memory");
    it->ids = b->in.tokens + at;
    it->n_ids = n;
    it->b = b;
    b->n++;
    return 0;
}

/* "input": a string, a list of strings, an array of token ids, or a list
 * of those arrays; the other fields checked. *base64: encoding_format. */
static int parse_embed(srv *s, json_t *o, emb_batch *b, int *base64, const char *rid,
                       srv_error *e)
{
    const char *key;
    json_t *v;
    srv_fields_policy pol = {s->oai.allow_unknown, s->oai.unknown_log, rid};
    json_object_foreach(o, key, v) {
        if (json_is_null(v) || !strcmp(key, "input") || !strcmp(key, "model") ||
            !strcmp(key, "encoding_format") || !strcmp(key, "user"))
            continue;
        if (!strcmp(key, "dimensions"))
            return srv_error_set(e, 400, "dimensions", "'dimensions' is not supported: the "
                                 "model's embeddings have %d dimensions", b->n_embd);
        int rc = srv_fields_unknown(&pol, key, e); /* the completions' rule and log */
        if (rc)
            return rc;
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
    int rc = srv_oai_parse_prompts(&s->oai, in, "input", SRV_MAX_EMBED_INPUTS, &b->in, e);
    if (rc)
        return rc;
    if (!(b->it = calloc((size_t)b->in.n_prompts, sizeof *b->it)))
        return srv_error_set(e, 500, NULL, "out of memory");
    b->cap = b->in.n_prompts;
    for (int32_t k = 0; k < b->in.n_prompts; k++)
        if ((rc = add_input(s, b, k, e)))
            return rc;
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
        engine_request er = {.prompt = (int32_t *)b->it[k].ids, .n_prompt = b->it[k].n_ids,
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
    for (;;) {
        uint64_t v; /* cleared before the look, so a post after it wakes the poll */
        ssize_t r = read(b->efd, &v, sizeof v);
        (void)r;
        pthread_mutex_lock(&b->mu);
        int done = b->n_final >= submitted;
        pthread_mutex_unlock(&b->mu);
        if (done)
            break;
        if ((rc || *gone) && !cancelled) { /* stop the rest of the work, once */
            for (int k = 0; k < b->n; k++)
                if (b->it[k].rid > 0)
                    engine_cancel(s->e, b->it[k].rid);
            cancelled = 1;
        }
        struct pollfd p[2] = {{.fd = b->efd, .events = POLLIN},
                              {.fd = fd, .events = POLLRDHUP}};
        int watch = fd >= 0 && !*gone; /* once gone, only the final events matter */
        int n = poll(p, watch ? 2 : 1, -1);
        if (n < 0 && errno != EINTR)
            break; /* cannot happen with valid fds; do not spin */
        if (n > 0 && watch && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)))
            *gone = 1;
    }
    return rc;
}

static void batch_free(emb_batch *b)
{
    for (int k = 0; b->it && k < b->cap; k++)
        free(b->it[k].vec);
    srv_gen_req_free(&b->in);
    free(b->it);
    if (b->efd >= 0)
        close(b->efd);
    pthread_mutex_destroy(&b->mu);
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
    emb_batch b = {.n_embd = s->m->hp.n_embd, .efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)};
    pthread_mutex_init(&b.mu, NULL);
    int base64 = 0;
    int rc = b.efd < 0 ? srv_error_set(&er, 500, NULL, "cannot create an eventfd")
                       : parse_embed(s, o, &b, &base64, srv_request_id(c), &er);
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
