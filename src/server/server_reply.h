/* server_reply.h - the replies every route sends: a JSON body, or an
 * OpenAI-shaped error (server_openai.h's srv_error). */
#ifndef KVANT_SERVER_REPLY_H
#define KVANT_SERVER_REPLY_H

#include <microhttpd.h>

#include "server/server_openai.h"

/* Queues a JSON response (takes ownership of the malloc'd body; NULL
 * sends an empty one). */
enum MHD_Result srv_send_json(struct MHD_Connection *c, int status, char *body);
/* Queues e as {"error": {...}} with e->status. */
enum MHD_Result srv_send_error(struct MHD_Connection *c, const srv_error *e);

#endif
