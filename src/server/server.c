/* server.c - the HTTP daemon of `kvant serve`: libmicrohttpd set-up,
 * request body collection with a size cap, routing, authentication, and
 * the small routes (/health, /ready, /metrics, /v1/models, /v1/memory,
 * /v1/memory/blocks, /dashboard, /tokenize, /detokenize, /apply-template).  Generation routes live in server_gen.c.
 * With several models (s->reg) the routes take their engine from the
 * registry (registry/registry.h) and POST /v1/models/{id}/{action} drives its
 * life cycle (server_modelapi.c).
 *
 * Threading: MHD runs one thread per connection (so a streaming reader may
 * block on its request's channel) plus an internal listening thread.
 * /health reads only the atomic state, so it answers while the engine is
 * busy.  Invariants: every error is an OpenAI-shaped JSON body; the
 * request body is parsed only once complete and only if within max_body.
 */
#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "server/server.h"
#include "text/tokenizer.h"
#include "server/server_dash.h"
#include "server/server_internal.h"
#include "server/server_memview.h"
#include "server/server_parallel.h"
#include "server/server_reply.h"
#include "server/server_modelapi.h"
#include "server/server_offload.h"
#include "server/server_template.h"
#include "server/server_tier.h"

#define SRV_MAX_DETOKENIZE (1 << 20)
#define SRV_HEALTH_STALL_S 60.0 /* --health-stall-timeout default */
#define SRV_HEADER_TIMEOUT_S 15.0
#define SRV_BODY_TIMEOUT_S 30.0
#define SRV_STREAM_BACKLOG 4096
#define SRV_SEND_BUFFER (256 * 1024)

typedef struct srv_conn {
    srv_buf body;
    int too_large;
    int over;               /* the connection is past --max-connections: 503 */
    double t_arrival;
    srv_guard_slot *slot;   /* the connection's guard slot (borrowed), or NULL */
} srv_conn;

/* The guard slot of c (in MHD's socket context, a srv_sock), or NULL. */
static srv_guard_slot *conn_slot(struct MHD_Connection *c)
{
    srv_sock *k = srv_sock_of(c);
    return k ? k->slot : NULL;
}

/* MHD's connection notifications: each connection gets a srv_sock (the
 * replies' headers) and a guard slot. */
static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    srv *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        srv_sock *k = calloc(1, sizeof *k);
        if (k && ci)
            k->slot = srv_guard_open(s->guard, ci->connect_fd, &k->over);
        *socket_context = k;
        if (ci && s->cfg.send_buffer > 0) { /* Linux doubles the value it is given */
            int sz = s->cfg.send_buffer / 2;
            setsockopt(ci->connect_fd, SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
        }
    } else {
        srv_sock *k = *socket_context;
        if (k)
            srv_guard_close(s->guard, k->slot);
        free(k);
        *socket_context = NULL;
    }
}

static enum MHD_Result on_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    srv *s = cls;
    return srv_guard_accept(s->guard) ? MHD_YES : MHD_NO;
}

srv_config srv_config_default(void)
{
    srv_config c = {0};
    c.host = "127.0.0.1";
    c.port = 8080;
    c.max_body = 4u << 20;
    c.conn_timeout_s = 30;
    c.max_connections = 1024;
    c.health_stall_s = SRV_HEALTH_STALL_S;
    c.header_timeout_s = SRV_HEADER_TIMEOUT_S;
    c.body_timeout_s = SRV_BODY_TIMEOUT_S;
    c.stream_backlog = SRV_STREAM_BACKLOG;
    c.send_buffer = SRV_SEND_BUFFER;
    c.embedding_pooling = 1; /* ENGINE_EMBED_MEAN */
    c.grammar_max_bytes = SRV_GRAMMAR_MAX_BYTES_DEFAULT;
    c.grammar_cache = SRV_GRAMMAR_CACHE_DEFAULT;
    return c;
}

static enum MHD_Result send_text(struct MHD_Connection *c, int status, const char *ctype,
                                 char *body)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body,
                                                             MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    enum MHD_Result res = srv_queue(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return res;
}

static enum MHD_Result send_obj(struct MHD_Connection *c, int status, json_t *o)
{
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) {
        srv_error e;
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    return srv_send_json(c, status, s);
}

/* ---- small routes ------------------------------------------------------ */

/* The engine's liveness: 0 when serving is possible, else a reason for
 * 503 written to why/msg.  A wedged engine (requests in flight, no step
 * completed for health_stall_s) or a dead engine thread is unhealthy. */
static int engine_unhealthy(srv *s, engine_health *h, char *msg, size_t cap)
{
    if (s->reg)
        reg_health(s->reg, h);
    else
        engine_get_health(s->e, h);
    if (!h->thread_alive) {
        snprintf(msg, cap, "the engine thread has stopped");
        return 1;
    }
    if (h->weights_failed) {
        snprintf(msg, cap, "weight offload failed: %.*s", (int)(cap > 40 ? cap - 40 : 0),
                 h->weights_error);
        return 1;
    }
    if (h->group_failed) {
        snprintf(msg, cap, "tensor-parallel group failed: %.*s", (int)(cap > 40 ? cap - 40 : 0),
                 h->group_error);
        return 1;
    }
    if (h->busy && h->stalled_s > s->cfg.health_stall_s) {
        snprintf(msg, cap, "the engine made no progress for %.1f s with %d requests in flight "
                 "(limit %.1f s, --health-stall-timeout)", h->stalled_s, (int)h->in_flight,
                 s->cfg.health_stall_s);
        return 1;
    }
    return 0;
}

/* Liveness (Kubernetes): 200 while the engine makes progress; 503 while
 * loading, draining, or when the engine is stalled (docs/SERVER.md). */
static enum MHD_Result route_health(srv *s, struct MHD_Connection *c)
{
    int st = atomic_load(&s->state);
    if (st == SRV_READY) {
        engine_health h;
        char msg[200];
        if (!engine_unhealthy(s, &h, msg, sizeof msg))
            return send_obj(c, 200, json_pack("{s:s}", "status", "ok"));
        srv_guard_count(s->guard, SRV_GUARD_HEALTH_STALLED);
        return send_obj(c, 503, json_pack("{s:s, s:{s:s, s:s, s:n, s:n}, s:{s:b, s:i, s:f, s:I}}",
                                          "status", "stalled", "error", "message", msg, "type",
                                          "service_unavailable", "param", "code", "engine",
                                          "thread_alive", h.thread_alive, "in_flight",
                                          (int)h.in_flight, "stalled_seconds", h.stalled_s,
                                          "steps", (json_int_t)h.steps));
    }
    const char *why = st == SRV_LOADING ? "loading" : "draining";
    return send_obj(c, 503, json_pack("{s:s, s:{s:s, s:s, s:n, s:n}}", "status", why, "error",
                                      "message", st == SRV_LOADING ? "the model is loading"
                                                                   : "the server is draining",
                                      "type", "service_unavailable", "param", "code"));
}

/* Readiness (Kubernetes): 200 only while serving; 503 while loading, from
 * the moment draining starts (SIGTERM), and while the engine is stalled. */
static enum MHD_Result route_ready(srv *s, struct MHD_Connection *c)
{
    int st = atomic_load(&s->state);
    engine_health h;
    char msg[200];
    if (st == SRV_READY && engine_unhealthy(s, &h, msg, sizeof msg))
        return send_obj(c, 503, json_pack("{s:s}", "status", "stalled"));
    return send_obj(c, st == SRV_READY ? 200 : 503,
                    json_pack("{s:s}", "status", st == SRV_READY ? "ready"
                                                 : st == SRV_LOADING ? "loading" : "draining"));
}

static enum MHD_Result route_dashboard(struct MHD_Connection *c)
{
    size_t n;
    const char *html = srv_dashboard_html(&n);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, (void *)html, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/html; charset=utf-8");
    MHD_add_response_header(r, "Content-Security-Policy",
                            "default-src 'none'; script-src 'unsafe-inline'; "
                            "style-src 'unsafe-inline'; connect-src 'self'");
    enum MHD_Result res = srv_queue(c, 200, r);
    MHD_destroy_response(r);
    return res;
}

/* The one model's object; created is when it was attached (stable). */
static json_t *model_obj(const srv *s)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:I}", "id", s->served_name, "object", "model",
                     "created", (json_int_t)s->created, "owned_by", "kvant", "max_model_len",
                     (json_int_t)s->oai.max_model_len);
}

static enum MHD_Result route_models(srv *s, struct MHD_Connection *c)
{
    if (s->reg) {
        char *js = srv_modelapi_list_json(s->reg);
        if (js)
            return srv_send_json(c, 200, js);
        srv_error e;
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    return send_obj(c, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_obj(s)));
}

/* GET /v1/models/{id}: the model's object, or 404 model_not_found. */
static enum MHD_Result route_model_get(srv *s, struct MHD_Connection *c, const char *url)
{
    const char *id = url + strlen(REG_PATH);
    srv_error e;
    if (s->reg) {
        char *js = NULL;
        int status = srv_modelapi_get_json(s->reg, id, &js);
        if (js)
            return srv_send_json(c, status, js);
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    if (!strcmp(id, s->served_name))
        return send_obj(c, 200, model_obj(s));
    srv_error_set(&e, 404, "model", "the model '%.200s' does not exist (serving '%.200s')", id,
                  s->served_name);
    e.code = "model_not_found";
    return srv_send_error(c, &e);
}

/* Routes of OpenAI's API that kvant does not implement yet: 501. */
static enum MHD_Result route_not_implemented(struct MHD_Connection *c, const char *url)
{
    srv_error e;
    srv_error_set(&e, 501, NULL, "%.64s is not implemented yet by kvant (it serves "
                  "/v1/completions and /v1/chat/completions)", url);
    return srv_send_error(c, &e);
}

static enum MHD_Result route_metrics(srv *s, struct MHD_Connection *c)
{
    engine_stats st;
    if (s->reg)
        reg_stats(s->reg, &st);
    else
        engine_get_stats(s->e, &st);
    mem_report *rep = malloc(sizeof *rep);
    if (rep) {
        mem_mgr *mm = s->reg ? reg_mem(s->reg) : engine_mem(s->e);
        mem_get_report(mm, rep);
        mem_resident_by_cat(mm, rep->resident); /* reserved is not resident */
        rep->has_resident = 1;
    }
    srv_build_info bi = {SRV_VERSION,
#ifdef KVANT_CUDA
                         "cuda",
#else
                         "cpu",
#endif
                         s->served_name, s->reg ? 0 : engine_kv_block_bytes(s->e),
                         atomic_load(&s->state) == SRV_READY, 0, 0};
    gcache_stats(s->gcache, &bi.grammar_cache_hits, &bi.grammar_cache_misses);
    char *text = srv_metrics_render(s->metrics, &bi, &st, rep);
    free(rep);
    engine_tier_stats ts = {0}; /* several models: no offload tiers */
    if (!s->reg)
        engine_get_tier_stats(s->e, &ts);
    char *tiers = text ? srv_tier_metrics(&ts) : NULL;
    char *guard = text ? srv_guard_metrics(s->guard) : NULL;
    char *models = text && s->reg ? srv_modelapi_metrics(s->reg) : NULL;
    char *offload = text ? srv_offload_metrics(s->e) : NULL;
    char *par = text && !s->reg ? srv_tp_metrics(s->e) : NULL;
    engine_health h;
    if (s->reg)
        reg_health(s->reg, &h);
    else
        engine_get_health(s->e, &h);
    char stall[256];
    snprintf(stall, sizeof stall,
             "# HELP kvant_engine_stalled_seconds Seconds the engine has made no progress with "
             "requests in flight (0 when idle or progressing).\n"
             "# TYPE kvant_engine_stalled_seconds gauge\nkvant_engine_stalled_seconds %.3f\n",
             h.stalled_s);
    char *all = tiers && guard && offload && (models || !s->reg) && (par || s->reg)
                    ? malloc(strlen(text) + strlen(tiers) + strlen(guard) + strlen(stall) +
                             strlen(offload) + (models ? strlen(models) : 0) +
                             (par ? strlen(par) : 0) + 1)
                    : NULL;
    if (all) {
        strcpy(all, text);
        strcat(all, tiers);
        strcat(all, guard);
        strcat(all, stall);
        if (models)
            strcat(all, models);
        strcat(all, offload);
        if (par)
            strcat(all, par);
    }
    free(par);
    free(text);
    free(tiers);
    free(guard);
    free(models);
    free(offload);
    text = all;
    if (!text) {
        srv_error e;
        srv_error_set(&e, 500, NULL, "out of memory rendering metrics");
        return srv_send_error(c, &e);
    }
    return send_text(c, 200, "text/plain; version=0.0.4; charset=utf-8", text);
}

/* GET /v1/memory (blocks = 0) or /v1/memory/blocks (blocks = 1) of one
 * engine, from one snapshot the engine thread makes between steps. */
static enum MHD_Result memory_view(srv *s, struct MHD_Connection *c, engine *eng, int blocks)
{
    srv_error e;
    kvant_err ke = {0};
    engine_kv_snapshot *sn = engine_kv_snapshot_new(eng);
    if (!sn) {
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    if (engine_kv_snapshot_take(eng, sn, &ke)) {
        engine_kv_snapshot_free(sn);
        srv_error_set(&e, 503, NULL, "%s", ke.msg);
        return srv_send_error(c, &e);
    }
    char *js = blocks ? srv_blockmap_json(sn) : srv_memview_json(eng, sn);
    engine_kv_snapshot_free(sn);
    if (js && !blocks) { /* the offload tiers under the device pool */
        json_t *o = json_loads(js, 0, NULL);
        engine_tier_stats ts;
        engine_get_tier_stats(eng, &ts);
        free(js);
        js = NULL;
        if (o && json_object_set_new(o, "kv_tiers", srv_tier_json(&ts)) == 0 &&
            json_object_set_new(o, "weights_offload", srv_offload_json(eng)) == 0 &&
            json_object_set_new(o, "tensor_parallel", srv_tp_json(eng)) == 0)
            js = json_dumps(o, JSON_COMPACT);
        json_decref(o);
    }
    if (!js) {
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    return srv_send_json(c, 200, js);
}

/* Several models: the view of ?model=NAME, else of the first loaded model
 * (it never loads one); the memory manager's numbers cover every model. */
static enum MHD_Result memory_view_models(srv *s, struct MHD_Connection *c, int blocks)
{
    srv_error e;
    kvant_err ke = {0};
    reg_ref ref = {0};
    const char *name = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "model");
    int rc = KV_EBUSY;
    if (name)
        rc = reg_peek(s->reg, name, &ref, &ke);
    for (int i = 0, n = reg_count(s->reg); !name && rc && i < n; i++) {
        reg_info *x = malloc(sizeof *x);
        if (x && reg_describe(s->reg, i, x) == KV_OK && x->state == REG_LOADED)
            rc = reg_peek(s->reg, x->name, &ref, &ke);
        free(x);
    }
    if (rc) {
        if (!name)
            kvant_err_set(&ke, KV_EBUSY, "no model is loaded (GET /v1/models lists them)");
        srv_modelapi_error(&e, rc, &ke);
        return srv_send_error(c, &e);
    }
    enum MHD_Result res = memory_view(s, c, ref.e, blocks);
    reg_release(s->reg, &ref);
    return res;
}

static enum MHD_Result route_memory(srv *s, struct MHD_Connection *c, int blocks)
{
    return s->reg ? memory_view_models(s, c, blocks) : memory_view(s, c, s->e, blocks);
}

static enum MHD_Result route_tokenize(const model *m, int64_t max_len, struct MHD_Connection *c,
                                      const char *body, size_t len)
{
    srv_error e;
    json_t *o = srv_oai_load_object(body, len, &e);
    if (!o)
        return srv_send_error(c, &e);
    json_t *p = json_object_get(o, "prompt"), *sp = json_object_get(o, "add_special_tokens");
    if (!json_is_string(p) || (sp && !json_is_boolean(sp))) {
        json_decref(o);
        srv_error_set(&e, 400, json_is_string(p) ? "add_special_tokens" : "prompt",
                      "expected {\"prompt\": string, \"add_special_tokens\": bool (optional)}");
        return srv_send_error(c, &e);
    }
    int add_bos = sp ? json_is_true(sp) && tok_add_bos(m->tok) : tok_add_bos(m->tok);
    kvant_err ke = {0};
    const char *text = json_string_value(p);
    size_t tl = json_string_length(p);
    int64_t n = tok_encode(m->tok, text, tl, add_bos, 0, NULL, 0, &ke);
    int32_t *ids = n > 0 ? malloc((size_t)n * sizeof *ids) : NULL;
    if (ids)
        n = tok_encode(m->tok, text, tl, add_bos, 0, ids, n, &ke);
    json_t *arr = json_array();
    for (int64_t i = 0; ids && i < n; i++)
        json_array_append_new(arr, json_integer(ids[i]));
    free(ids);
    json_decref(o);
    if (n < 0) {
        json_decref(arr);
        srv_error_set(&e, 400, "prompt", "cannot tokenize: %s", ke.msg);
        return srv_send_error(c, &e);
    }
    return send_obj(c, 200, json_pack("{s:o, s:I, s:I}", "tokens", arr, "count",
                                      (json_int_t)json_array_size(arr), "max_model_len",
                                      (json_int_t)max_len));
}

static enum MHD_Result route_detokenize(const model *m, struct MHD_Connection *c,
                                        const char *body, size_t len)
{
    srv_error e;
    json_t *o = srv_oai_load_object(body, len, &e);
    if (!o)
        return srv_send_error(c, &e);
    json_t *t = json_object_get(o, "tokens");
    size_t n = json_is_array(t) ? json_array_size(t) : 0;
    if (!json_is_array(t) || n > SRV_MAX_DETOKENIZE) {
        json_decref(o);
        srv_error_set(&e, 400, "tokens", "'tokens' must be an array of token ids");
        return srv_send_error(c, &e);
    }
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    int32_t nv = tok_n_vocab(m->tok);
    for (size_t i = 0; ids && i < n; i++) {
        json_t *v = json_array_get(t, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
            free(ids);
            json_decref(o);
            srv_error_set(&e, 400, "tokens", "tokens[%zu] is not a token id in [0, %d)", i, nv);
            return srv_send_error(c, &e);
        }
        ids[i] = (int32_t)json_integer_value(v);
    }
    json_decref(o);
    char *text = ids ? tok_decode(m->tok, ids, (int64_t)n, 0) : NULL;
    free(ids);
    if (!text) {
        srv_error_set(&e, 500, NULL, "cannot decode the tokens");
        return srv_send_error(c, &e);
    }
    json_t *js = json_stringn(text, strlen(text));
    free(text);
    if (!js)
        js = json_string("\xEF\xBF\xBD"); /* not valid UTF-8 on its own */
    return send_obj(c, 200, json_pack("{s:o}", "prompt", js));
}

static enum MHD_Result route_apply_template(const model *m, struct MHD_Connection *c, const char *body,
                                            size_t len)
{
    srv_error e;
    json_t *out = NULL;
    if (srv_template_apply(m, body, len, &out, &e))
        return srv_send_error(c, &e);
    return send_obj(c, 200, out);
}

/* /tokenize (0), /detokenize (1), /apply-template (2) on a model. */
static enum MHD_Result tok_call(int kind, const model *m, int64_t max_len, struct MHD_Connection *c,
                                const char *body, size_t len)
{
    if (kind == 2)
        return route_apply_template(m, c, body, len);
    return kind ? route_detokenize(m, c, body, len) : route_tokenize(m, max_len, c, body, len);
}

/* /tokenize, /detokenize, /apply-template: the server's model, or (several
 * models) the one the body names, loaded if needed and held for the call. */
static enum MHD_Result route_tok(srv *s, struct MHD_Connection *c, int detok, const char *body,
                                 size_t len)
{
    if (!s->reg)
        return tok_call(detok, s->m, s->oai.max_model_len, c, body, len);
    srv_error e;
    char name[REG_NAME_MAX];
    if (srv_modelapi_body_name(body, len, name, sizeof name, &e))
        return srv_send_error(c, &e);
    reg_ref ref = {0};
    kvant_err ke = {0};
    int rc = reg_acquire(s->reg, name, &ref, &ke);
    if (rc) {
        srv_modelapi_error(&e, rc, &ke);
        return srv_send_error(c, &e);
    }
    enum MHD_Result res = tok_call(detok, ref.m, ref.max_model_len, c, body, len);
    reg_release(s->reg, &ref);
    return res;
}

/* POST /v1/models/{id}/{load,unload,sleep,wake} (several models only). */
static enum MHD_Result route_model_action(srv *s, struct MHD_Connection *c, const char *url,
                                          const char *body, size_t len)
{
    srv_error e;
    if (!s->reg) {
        srv_error_set(&e, 404, NULL, "model life-cycle routes need several models (-m NAME=PATH "
                                     "more than once, --models-dir, --pin or --keep-alive)");
        return srv_send_error(c, &e);
    }
    char *js = NULL;
    int status = srv_modelapi_action(s->reg, url, body, len, &js);
    if (!js) {
        srv_error_set(&e, 500, NULL, "out of memory");
        return srv_send_error(c, &e);
    }
    return srv_send_json(c, status, js);
}

/* ---- routing ------------------------------------------------------------- */

typedef enum route_id {
    R_HEALTH, R_READY, R_METRICS, R_MODELS, R_MEMORY, R_MEMORY_BLOCKS, R_DASHBOARD,
    R_COMPLETIONS, R_CHAT, R_TOKENIZE, R_DETOKENIZE, R_EMBEDDINGS, R_RESPONSES, R_APPLY_TEMPLATE,
    R_MODEL_GET, R_MODEL_ACTION, R_NONE
} route_id;

static const struct {
    const char *path, *method;
    int auth;   /* needs the API key when one is set */
} routes[R_NONE] = {
    [R_HEALTH] = {"/health", "GET", 0},
    [R_READY] = {"/ready", "GET", 0},
    [R_DASHBOARD] = {"/dashboard", "GET", 0},
    [R_MEMORY_BLOCKS] = {"/v1/memory/blocks", "GET", 1},
    [R_METRICS] = {"/metrics", "GET", 0},
    [R_MODELS] = {"/v1/models", "GET", 1},
    [R_MEMORY] = {"/v1/memory", "GET", 1},
    [R_COMPLETIONS] = {"/v1/completions", "POST", 1},
    [R_CHAT] = {"/v1/chat/completions", "POST", 1},
    [R_TOKENIZE] = {"/tokenize", "POST", 1},
    [R_DETOKENIZE] = {"/detokenize", "POST", 1},
    [R_EMBEDDINGS] = {"/v1/embeddings", "POST", 1},
    [R_RESPONSES] = {"/v1/responses", "POST", 1},     /* 501: not implemented yet */
    [R_APPLY_TEMPLATE] = {"/apply-template", "POST", 1},
    [R_MODEL_GET] = {REG_PATH, "GET", 1},     /* a prefix: /v1/models/{id} */
    [R_MODEL_ACTION] = {REG_PATH, "POST", 1}, /* a prefix: /v1/models/{id}/{action} */
};

/* The route of url; under /v1/models/ a GET reads a model, anything else
 * is a life-cycle action. */
static route_id route_find(const char *url, const char *method)
{
    for (int i = 0; i < R_MODEL_GET; i++)
        if (!strcmp(url, routes[i].path))
            return (route_id)i;
    if (!strncmp(url, REG_PATH, strlen(REG_PATH)) && url[strlen(REG_PATH)])
        return !strcmp(method, "GET") ? R_MODEL_GET : R_MODEL_ACTION;
    return R_NONE;
}

/* Constant-time comparison of the bearer token with the key. */
static int auth_ok(const srv *s, struct MHD_Connection *c)
{
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7))
        return 0;
    h += 7;
    size_t hl = strlen(h), kl = strlen(s->api_key);
    unsigned diff = (unsigned)(hl ^ kl);
    for (size_t i = 0; i < kl; i++)
        diff |= (unsigned char)s->api_key[i] ^ (unsigned char)(i < hl ? h[i] : 0);
    return diff == 0;
}

static int json_ctype(struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    if (!ct)
        return 1; /* absent: accept (curl --data-binary, simple clients) */
    size_t n = strcspn(ct, "; \t");
    return n == 16 && !strncasecmp(ct, "application/json", 16);
}

/* Checks that apply before the body matters: route, method, auth, state. */
static int precheck(srv *s, struct MHD_Connection *c, const char *url, const char *method,
                    route_id r, srv_error *e)
{
    if (r == R_NONE)
        return srv_error_set(e, 404, NULL, "no route %.200s %.200s", method, url);
    if (strcmp(method, routes[r].method)) {
        srv_error_set(e, 405, NULL, "%s does not allow %.32s (use %s)", routes[r].path, method,
                      routes[r].method);
        return -405;
    }
    if (routes[r].auth && s->has_key && !auth_ok(s, c))
        return srv_error_set(e, 401, NULL, "missing or invalid API key (Authorization: Bearer)");
    int st = atomic_load(&s->state);
    if (r != R_HEALTH && r != R_READY && st != SRV_READY &&
        !(r == R_METRICS && st == SRV_DRAINING))
        return srv_error_set(e, 503, NULL, st == SRV_LOADING ? "the model is loading"
                                                             : "the server is draining");
    if (!strcmp(method, "POST") && !json_ctype(c))
        return srv_error_set(e, 415, NULL, "Content-Type must be application/json");
    return 0;
}

static enum MHD_Result dispatch(srv *s, struct MHD_Connection *c, route_id r, const char *url,
                                srv_conn *cn)
{
    const char *b = cn->body.s ? cn->body.s : "";
    size_t n = cn->body.len;
    switch (r) {
    case R_HEALTH: return route_health(s, c);
    case R_METRICS: return route_metrics(s, c);
    case R_MODELS: return route_models(s, c);
    case R_READY: return route_ready(s, c);
    case R_DASHBOARD: return route_dashboard(c);
    case R_MEMORY: return route_memory(s, c, 0);
    case R_MEMORY_BLOCKS: return route_memory(s, c, 1);
    case R_COMPLETIONS: return srv_gen_handle(s, c, SRV_API_COMPLETIONS, b, n, cn->t_arrival);
    case R_CHAT: return srv_gen_handle(s, c, SRV_API_CHAT, b, n, cn->t_arrival);
    case R_TOKENIZE: return route_tok(s, c, 0, b, n);
    case R_DETOKENIZE: return route_tok(s, c, 1, b, n);
    case R_APPLY_TEMPLATE: return route_tok(s, c, 2, b, n);
    case R_MODEL_ACTION: return route_model_action(s, c, url, b, n);
    case R_MODEL_GET: return route_model_get(s, c, url);
    case R_EMBEDDINGS: return srv_embed_handle(s, c, b, n);
    case R_RESPONSES: return route_not_implemented(c, url);
    default: return MHD_NO;
    }
}

static enum MHD_Result send_405(struct MHD_Connection *c, const srv_error *e, route_id r)
{
    char *body = srv_error_json(e);
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        body ? strlen(body) : 0, body ? body : (char *)"", MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    MHD_add_response_header(resp, "Allow", routes[r].method);
    enum MHD_Result res = srv_queue(c, 405, resp);
    MHD_destroy_response(resp);
    return res;
}

/* A connection accepted past --max-connections while every connection was
 * being served: 503 with Retry-After, then the connection closes. */
static enum MHD_Result send_overloaded(srv *s, struct MHD_Connection *c)
{
    srv_error e;
    srv_error_set(&e, 503, NULL, "the server is overloaded: all %d connections "
                  "(--max-connections) are being served; retry later", s->cfg.max_connections);
    e.code = "server_overloaded";
    srv_guard_count(s->guard, SRV_GUARD_CONN_OVERLOADED);
    return srv_send_error_retry(c, &e, "1", 1);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls)
{
    srv *s = cls;
    srv_conn *cn = *con_cls;
    if (!cn) { /* first call: headers only */
        if (!(cn = calloc(1, sizeof *cn)))
            return MHD_NO;
        cn->t_arrival = srv_now();
        cn->slot = conn_slot(c);
        srv_sock *k = srv_sock_of(c);
        srv_sock_begin(k, c, &s->cors, s->rid_nonce, atomic_fetch_add(&s->rid_seq, 1));
        cn->over = k && k->over;
        srv_guard_phase(s->guard, cn->slot, SRV_CONN_BODY);
        *con_cls = cn;
        return MHD_YES;
    }
    if (*upload_size) { /* body chunk */
        if (srv_guard_body_late(s->guard, cn->slot))
            return MHD_NO; /* closes the connection */
        if (cn->over) { /* answered 503 once complete: nothing to keep */
            *upload_size = 0;
            return MHD_YES;
        }
        if (!cn->too_large && cn->body.len + *upload_size > s->cfg.max_body) {
            cn->too_large = 1;
            srv_guard_count(s->guard, SRV_GUARD_BODY_TOO_LARGE);
        }
        if (!cn->too_large && srv_buf_append(&cn->body, upload, *upload_size))
            return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    srv_guard_phase(s->guard, cn->slot, SRV_CONN_BUSY);
    srv_error e;
    if (cn->over)
        return send_overloaded(s, c);
    route_id r = route_find(url, method);
    srv_sock *k = srv_sock_of(c);
    if (r != R_NONE && !strcmp(method, "OPTIONS") && k && k->allow_origin[0])
        return srv_send_preflight(c); /* CORS: before auth, as browsers send no key */
    if (precheck(s, c, url, method, r, &e))
        return e.status == 405 ? send_405(c, &e, r) : srv_send_error(c, &e);
    if (cn->too_large) {
        srv_error_set(&e, 413, NULL, "request body over the limit of %zu bytes",
                      s->cfg.max_body);
        return srv_send_error(c, &e);
    }
    return dispatch(s, c, r, url, cn);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    srv *s = cls;
    srv_conn *cn = *con_cls;
    if (!cn)
        return;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED &&
        srv_guard_phase_of(s->guard, cn->slot) == SRV_CONN_BUSY)
        srv_guard_count(s->guard, SRV_GUARD_WRITE_TIMEOUT); /* a client stopped reading */
    srv_guard_phase(s->guard, cn->slot, SRV_CONN_HEADERS); /* keep-alive: the next request */
    /* A streaming request's cancellation on disconnect happens in its
     * response free callback (server_gen.c), which MHD runs for every
     * termination code. */
    srv_buf_free(&cn->body);
    free(cn);
    *con_cls = NULL;
}

/* ---- life cycle ------------------------------------------------------------ */

static void name_from_path(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%.255s", b);
    char *dot = strstr(out, ".gguf");
    if (dot && dot[5] == '\0')
        *dot = '\0';
}

/* Every connection slot needs a descriptor: the soft RLIMIT_NOFILE is
 * raised to cover them (and SRV_FD_RESERVE for model files and logs) as far
 * as the hard limit allows; short of that, a warning names the limit. */
#define SRV_FD_RESERVE 128
static void raise_fd_limit(int slots)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return;
    rlim_t need = (rlim_t)slots + SRV_FD_RESERVE;
    if (rl.rlim_cur >= need)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need ? need : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur < need)
        fprintf(stderr, "kvant serve: warning: open files limited to %llu (ulimit -n); "
                "--max-connections needs %llu: connections past it wait in the listen queue\n",
                (unsigned long long)rl.rlim_cur, (unsigned long long)need);
}

srv *srv_create(const srv_config *cfg, const char *model_path, kvant_err *err)
{
    srv *s = calloc(1, sizeof *s);
    if (!s) {
        kvant_err_set(err, KV_ENOMEM, "out of memory");
        return NULL;
    }
    s->cfg = *cfg;
    snprintf(s->model_path, sizeof s->model_path, "%s", model_path ? model_path : "");
    if (cfg->served_name && cfg->served_name[0])
        snprintf(s->served_name, sizeof s->served_name, "%s", cfg->served_name);
    else
        name_from_path(s->model_path, s->served_name, sizeof s->served_name);
    if (cfg->api_key && cfg->api_key[0]) {
        snprintf(s->api_key, sizeof s->api_key, "%s", cfg->api_key);
        s->has_key = 1;
    }
    s->cfg.host = s->cfg.api_key = s->cfg.served_name = NULL; /* borrowed: do not keep */
    s->cfg.cors_origins = NULL;
    for (int i = 0; i < cfg->n_cors_origins && i < SRV_MAX_CORS_ORIGINS; i++)
        snprintf(s->cors.origin[s->cors.n++], sizeof s->cors.origin[0], "%s",
                 cfg->cors_origins[i]);
    s->unknown_log = cfg->allow_unknown_fields ? srv_unknown_log_create() : NULL;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    s->rid_nonce = ((uint64_t)now.tv_sec << 32) ^ (uint64_t)now.tv_nsec ^
                   ((uint64_t)getpid() << 48);
    pthread_mutex_init(&s->mu, NULL);
    s->metrics = srv_metrics_create();
    s->gcache = gcache_create(cfg->grammar_cache > 0 ? cfg->grammar_cache : 1,
                              gram_limits_default());
    raise_fd_limit(srv_guard_slots(cfg->max_connections));
    srv_guard_config gc = {cfg->max_connections, cfg->header_timeout_s, cfg->body_timeout_s};
    s->guard = srv_guard_create(&gc);
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)cfg->port);
    if (!s->guard) {
        kvant_err_set(err, KV_ENOMEM, "cannot start the connection guard");
        srv_destroy(s);
        return NULL;
    }
    if (!s->metrics || !s->gcache || inet_pton(AF_INET, cfg->host ? cfg->host : "127.0.0.1", &sa.sin_addr) != 1) {
        kvant_err_set(err, KV_EINVAL, "--host '%s' is not an IPv4 address", cfg->host);
        srv_destroy(s);
        return NULL;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ITC | MHD_USE_POLL;
    s->d = MHD_start_daemon(flags, (uint16_t)cfg->port, on_accept, s, on_request, s,
                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
                            MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned)srv_guard_slots(cfg->max_connections),
                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                            MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                            MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
                            MHD_OPTION_END);
    if (!s->d) {
        kvant_err_set(err, KV_EIO, "cannot listen on %s:%d (in use, or no permission)",
                      cfg->host, cfg->port);
        srv_destroy(s);
        return NULL;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : cfg->port;
    return s;
}

void srv_attach(srv *s, model *m, engine *e)
{
    s->m = m;
    s->e = e;
    s->oai.m = m;
    s->oai.served_name = s->served_name;
    s->oai.max_model_len = engine_max_model_len(e);
    s->oai.max_piece_bytes = tok_max_piece_bytes(m->tok);
    s->oai.allow_unknown = s->cfg.allow_unknown_fields;
    s->oai.unknown_log = s->unknown_log;
    s->oai.grammar_max_bytes = s->cfg.grammar_max_bytes;
    s->created = (long long)time(NULL);
    atomic_store(&s->state, SRV_READY);
}

void srv_attach_models(srv *s, registry *r)
{
    s->reg = r;
    reg_info *x = malloc(sizeof *x);
    if (x && reg_describe(r, 0, x) == KV_OK) /* the default model: the first */
        snprintf(s->served_name, sizeof s->served_name, "%s", x->name);
    free(x);
    s->oai.allow_unknown = s->cfg.allow_unknown_fields; /* the routed contexts copy these */
    s->oai.unknown_log = s->unknown_log;
    s->oai.grammar_max_bytes = s->cfg.grammar_max_bytes;
    s->created = (long long)time(NULL);
    atomic_store(&s->state, SRV_READY);
}

int srv_port(const srv *s)
{
    return s->port;
}

const char *srv_served_name(const srv *s)
{
    return s->served_name;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int srv_drain(srv *s, double timeout_s)
{
    atomic_store(&s->state, SRV_DRAINING);
    if (s->d) {
        MHD_socket ls = MHD_quiesce_daemon(s->d);
        if (ls != MHD_INVALID_SOCKET)
            close(ls);
    }
    if (s->reg)
        reg_drain(s->reg);
    else if (s->e)
        engine_drain(s->e);
    else
        return 0;
    double t0 = srv_now();
    while (srv_gen_active(s) > 0 && srv_now() - t0 < timeout_s)
        sleep_ms(20);
    int left = srv_gen_active(s);
    if (left > 0) {
        srv_gen_cancel_all(s);
        for (int i = 0; i < 250 && srv_gen_active(s) > 0; i++)
            sleep_ms(20);
    }
    return left;
}

void srv_stop(srv *s)
{
    if (s && s->d) {
        MHD_stop_daemon(s->d);
        s->d = NULL;
    }
}

void srv_destroy(srv *s)
{
    if (!s)
        return;
    srv_stop(s);
    srv_guard_destroy(s->guard);
    srv_metrics_destroy(s->metrics);
    gcache_destroy(s->gcache); /* after the engines: they held references until destroyed */
    srv_unknown_log_destroy(s->unknown_log);
    pthread_mutex_destroy(&s->mu);
    free(s);
}
