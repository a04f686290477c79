/* server_config.h - the server's options and handle type, shared by its
 * public header (server.h) and its internal one (server_internal.h), so
 * the route files below server.c include no header of the module that
 * calls them.  Header only. */
#ifndef KVANT_SERVER_CONFIG_H
#define KVANT_SERVER_CONFIG_H

#include <stddef.h>

#define SRV_VERSION "0.1.0"
#define SRV_MAX_CORS_ORIGINS 16  /* --cors-origin given this many times at most */

typedef struct srv_config {
    const char *host;           /* default "127.0.0.1" (borrowed) */
    int port;                   /* default 8080; 0 = ephemeral */
    const char *api_key;        /* NULL = no authentication (borrowed) */
    const char *served_name;    /* model name in the API (borrowed); NULL = file stem */
    size_t max_body;            /* bytes, default 4 MiB */
    int conn_timeout_s;         /* no socket progress (a stream nobody reads), default 30 */
    int max_connections;        /* default 256; at the limit the longest-waiting
                                 * connection without a complete request is closed */
    double header_timeout_s;    /* connect / end of last response -> headers, default 15 */
    double body_timeout_s;      /* headers -> complete body, default 30 */
    int stream_backlog;         /* events a stream may fall behind before it is
                                 * cancelled, default 4096 */
    int send_buffer;            /* SO_SNDBUF of each connection in bytes (the kernel's
                                 * queue for a client that does not read), default
                                 * 256 KiB; 0 = the kernel's autotuning (up to
                                 * net.ipv4.tcp_wmem, often 4 MiB) */
    double health_stall_s;      /* /health 503 when requests are in flight and the engine
                                 * made no progress this long; default 60 */
    int allow_unknown_fields;   /* 1: accept request fields kvant does not know (logged
                                 * once each); default 0: a 400 naming the field */
    const char *const *cors_origins; /* --cors-origin values (borrowed; "*" = any), or NULL */
    int n_cors_origins;         /* at most SRV_MAX_CORS_ORIGINS */
    int embedding_pooling;      /* /v1/embeddings: 1 mean (default), 2 last token
                                 * (ENGINE_EMBED_MEAN / _LAST) */
    size_t grammar_max_bytes;   /* structured outputs: the largest schema / grammar /
                                 * regex source compiled (bytes), default 256 KiB */
    int grammar_cache;          /* compiled grammars kept (LRU), default 128 */
} srv_config;

typedef struct srv srv;

#endif
