/* server_reply.c - JSON responses, OpenAI-shaped errors and the headers
 * every response carries (see server_reply.h): the replies of server.c's
 * small routes and of server_gen.c's generation routes.
 * Threading: any MHD connection thread, each on its own connection. */
#include "server/server_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CORS_METHODS "GET, POST, OPTIONS"
#define CORS_DEFAULT_HEADERS "Authorization, Content-Type, X-Request-Id"
#define CORS_MAX_REQ_HEADERS 1024 /* longest Access-Control-Request-Headers echoed */

srv_sock *srv_sock_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

/* 1 when s is 1..max visible ASCII characters (no space or control). */
static int visible_ascii(const char *s, size_t max)
{
    size_t n = 0;
    for (; s[n]; n++)
        if (n >= max || (unsigned char)s[n] <= 0x20 || (unsigned char)s[n] >= 0x7F)
            return 0;
    return n > 0;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

static const char *cors_match(const srv_cors *cors, const char *origin)
{
    if (!cors || !origin)
        return NULL;
    for (int i = 0; i < cors->n; i++) {
        if (!strcmp(cors->origin[i], "*"))
            return "*";
        if (!strcmp(cors->origin[i], origin))
            return origin;
    }
    return NULL;
}

void srv_sock_begin(srv_sock *k, struct MHD_Connection *c, const srv_cors *cors, uint64_t nonce,
                    uint64_t seq)
{
    if (!k)
        return;
    const char *rid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Request-Id");
    if (rid && visible_ascii(rid, SRV_REQUEST_ID_MAX))
        snprintf(k->request_id, sizeof k->request_id, "%s", rid);
    else
        snprintf(k->request_id, sizeof k->request_id, "req_%016llx%016llx",
                 (unsigned long long)nonce, (unsigned long long)mix64(nonce ^ seq));
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *allow = cors_match(cors, origin);
    snprintf(k->allow_origin, sizeof k->allow_origin, "%s", allow ? allow : "");
}

const char *srv_request_id(struct MHD_Connection *c)
{
    srv_sock *k = srv_sock_of(c);
    return k ? k->request_id : "";
}

enum MHD_Result srv_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r)
{
    srv_sock *k = srv_sock_of(c);
    if (k && k->request_id[0])
        MHD_add_response_header(r, "X-Request-Id", k->request_id);
    if (k && k->allow_origin[0]) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", k->allow_origin);
        MHD_add_response_header(r, "Access-Control-Expose-Headers", "X-Request-Id, Retry-After");
        if (strcmp(k->allow_origin, "*"))
            MHD_add_response_header(r, "Vary", "Origin");
    }
    return MHD_queue_response(c, status, r);
}

enum MHD_Result srv_send_json(struct MHD_Connection *c, int status, char *body)
{
    struct MHD_Response *r =
        MHD_create_response_from_buffer(body ? strlen(body) : 0, body ? body : (char *)"",
                                        body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    enum MHD_Result res = srv_queue(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return res;
}

enum MHD_Result srv_send_error(struct MHD_Connection *c, const srv_error *e)
{
    return srv_send_json(c, e->status, srv_error_json(e));
}

enum MHD_Result srv_send_error_retry(struct MHD_Connection *c, const srv_error *e,
                                     const char *seconds, int close_conn)
{
    char *body = srv_error_json(e);
    struct MHD_Response *r = MHD_create_response_from_buffer(
        body ? strlen(body) : 0, body ? body : (char *)"",
        body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "application/json");
    MHD_add_response_header(r, "Retry-After", seconds);
    if (close_conn)
        MHD_add_response_header(r, "Connection", "close");
    enum MHD_Result res = srv_queue(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    return res;
}

/* 1 when h is a list of header names (token characters, commas, spaces). */
static int header_list(const char *h)
{
    size_t n = 0;
    for (; h[n]; n++) {
        unsigned char ch = (unsigned char)h[n];
        if (n >= CORS_MAX_REQ_HEADERS ||
            !(ch == ',' || ch == ' ' || ch == '-' || ch == '_' || ch == '.' ||
              (ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z')))
            return 0;
    }
    return n > 0;
}

enum MHD_Result srv_send_preflight(struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (char *)"",
                                                             MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    const char *want =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Access-Control-Request-Headers");
    MHD_add_response_header(r, "Access-Control-Allow-Methods", CORS_METHODS);
    MHD_add_response_header(r, "Access-Control-Allow-Headers",
                            want && header_list(want) ? want : CORS_DEFAULT_HEADERS);
    MHD_add_response_header(r, "Access-Control-Max-Age", SRV_CORS_MAX_AGE);
    enum MHD_Result res = srv_queue(c, 204, r);
    MHD_destroy_response(r);
    return res;
}
