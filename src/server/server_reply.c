/* server_reply.c - JSON responses and OpenAI-shaped errors, the replies
 * every route sends (server.c's small routes, server_gen.c's generation
 * routes).  Threading: any MHD connection thread. */
#include "server/server_reply.h"

#include <stdlib.h>
#include <string.h>

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
    enum MHD_Result res = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return res;
}

enum MHD_Result srv_send_error(struct MHD_Connection *c, const srv_error *e)
{
    return srv_send_json(c, e->status, srv_error_json(e));
}
