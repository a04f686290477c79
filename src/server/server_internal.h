/* server_internal.h - the server context shared by server.c (daemon,
 * routing, small routes) and server_gen.c (generation requests).
 * Not part of the public API.
 */
#ifndef KVANT_SERVER_INTERNAL_H
#define KVANT_SERVER_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>

#include "server/server_config.h"
#include "server/server_guard.h"
#include "server/server_metrics.h"
#include "registry/registry.h"
#include "server/server_openai.h"
#include "server/server_reply.h"

enum { SRV_LOADING = 0, SRV_READY = 1, SRV_DRAINING = 2 };

typedef struct srv_gen srv_gen;

struct srv {
    srv_config cfg;
    char served_name[256];
    char model_path[1024];
    char api_key[256];
    int has_key;
    model *m;                 /* set once by srv_attach before state READY */
    engine *e;
    registry *reg;          /* several models (srv_attach_models): m and e stay NULL and
                               * every route takes its engine from the registry */
    srv_oai_ctx oai;
    long long created;        /* unix time of srv_attach: the model object's "created" */
    srv_cors cors;            /* --cors-origin (copied) */
    srv_unknown_log *unknown_log; /* --allow-unknown-fields: names logged once */
    uint64_t rid_nonce;       /* made-up X-Request-Id: this nonce and ... */
    _Atomic uint64_t rid_seq; /* ... a request counter */
    srv_metrics *metrics;
    gcache *gcache;           /* compiled grammars (structured outputs), all models: a
                               * grammar is over bytes, only its mask is per vocabulary */
    srv_guard *guard;         /* connection limits and their counters */
    struct MHD_Daemon *d;
    int port;
    _Atomic int state;
    pthread_mutex_t mu;       /* guards the active list */
    srv_gen *active;          /* in-flight generation requests */
    int n_active;
};

/* Handles POST /v1/completions and /v1/chat/completions. */
enum MHD_Result srv_gen_handle(srv *s, struct MHD_Connection *c, srv_api api, const char *body,
                               size_t len, double t_arrival);
/* Handles POST /v1/embeddings (server_embed.c). */
enum MHD_Result srv_embed_handle(srv *s, struct MHD_Connection *c, const char *body,
                                 size_t len);
/* engine_cancel for every active request (drain timeout). */
void srv_gen_cancel_all(srv *s);
int srv_gen_active(srv *s);

#endif
