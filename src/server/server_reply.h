/* server_reply.h - the replies every route sends: a JSON body, or an
 * OpenAI-shaped error (server_error.h), and the headers every response
 * carries: X-Request-Id (the client's, or one made up) and, when the
 * request's Origin is allowed (--cors-origin), Access-Control-Allow-Origin.
 *
 * Every response goes through srv_queue, which adds those headers from the
 * connection's srv_sock: MHD's socket context of every connection is a
 * srv_sock (server.c creates it when the connection starts, or leaves it
 * NULL when out of memory: the headers are then left out).  A srv_sock is
 * touched only by its connection's thread.
 */
#ifndef KVANT_SERVER_REPLY_H
#define KVANT_SERVER_REPLY_H

#include <microhttpd.h>
#include <stdint.h>

#include "server/server_config.h"
#include "server/server_error.h"
#include "server/server_guard.h"

#define SRV_REQUEST_ID_MAX 128   /* longest X-Request-Id echoed; longer ones are replaced */
#define SRV_CORS_ORIGIN_MAX 255
#define SRV_CORS_MAX_AGE "600"   /* seconds a browser may cache a preflight answer */

/* The origins --cors-origin allows ("*": any). */
typedef struct srv_cors {
    int n;
    char origin[SRV_MAX_CORS_ORIGINS][SRV_CORS_ORIGIN_MAX + 1];
} srv_cors;

/* One connection's state for the replies of its current request. */
typedef struct srv_sock {
    srv_guard_slot *slot;       /* the guard's slot (borrowed) or NULL */
    int over;                   /* accepted past --max-connections: every request gets 503 */
    char request_id[SRV_REQUEST_ID_MAX + 1];
    char allow_origin[SRV_CORS_ORIGIN_MAX + 1]; /* Access-Control-Allow-Origin, "" = none */
} srv_sock;

/* The srv_sock of c, or NULL. */
srv_sock *srv_sock_of(struct MHD_Connection *c);
/* A request's headers arrived on c: takes its X-Request-Id if it is 1 to
 * SRV_REQUEST_ID_MAX visible ASCII characters, else makes one ("req_" and 32
 * hex digits from nonce and seq), and decides CORS from its Origin. */
void srv_sock_begin(srv_sock *k, struct MHD_Connection *c, const srv_cors *cors, uint64_t nonce,
                    uint64_t seq);
/* The current request's id on c ("" when c has no srv_sock). */
const char *srv_request_id(struct MHD_Connection *c);

/* Adds X-Request-Id and the CORS headers to r and queues it (r stays the
 * caller's to destroy). */
enum MHD_Result srv_queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r);
/* Queues a JSON response (takes ownership of the malloc'd body; NULL
 * sends an empty one). */
enum MHD_Result srv_send_json(struct MHD_Connection *c, int status, char *body);
/* Queues e as {"error": {...}} with e->status. */
enum MHD_Result srv_send_error(struct MHD_Connection *c, const srv_error *e);
/* As srv_send_error, with Retry-After: seconds (503 / 429), and
 * Connection: close when close_conn. */
enum MHD_Result srv_send_error_retry(struct MHD_Connection *c, const srv_error *e,
                                     const char *seconds, int close_conn);
/* The answer to a CORS preflight (OPTIONS with an allowed Origin): 204 with
 * Allow-Methods, Allow-Headers (the requested ones), Max-Age. */
enum MHD_Result srv_send_preflight(struct MHD_Connection *c);

#endif
